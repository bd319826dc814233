//! The machine-readable codes of the API's errors: one list for the daemon (which
//! answers them), the Rust client (`Error::error_code`), the OpenAPI document and
//! the Python SDK's exception map (a test holds the SDK's map and the API
//! reference's table to this list).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

macro_rules! error_codes {
    ($($(#[doc = $doc:literal])* $variant:ident = $text:literal, $status:literal;)*) => {
        /// The `code` of an error answer. Answers may gain codes: a client meets an
        /// unknown one as text (`ApiErrorBody::code`) and falls back on the status.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        #[serde(rename_all = "snake_case")]
        pub enum ErrorCode {
            $($(#[doc = $doc])* $variant,)*
        }

        impl ErrorCode {
            /// Every code, in the API reference's order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The code as it appears in an answer.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $text,)*
                }
            }

            /// The HTTP status an answer of this code has.
            pub fn status(self) -> u16 {
                match self {
                    $(ErrorCode::$variant => $status,)*
                }
            }
        }
    };
}

error_codes! {
    /// Malformed JSON, an unknown field, failed validation (`field` names it).
    BadRequest = "bad_request", 400;
    /// The command could not be started (not found, not executable).
    SpawnFailed = "spawn_failed", 400;
    /// No such user in the sandbox.
    InvalidUser = "invalid_user", 400;
    /// A code context's interpreter cannot start (no python3, no ipykernel).
    KernelUnavailable = "kernel_unavailable", 400;
    /// No, bad or revoked token over TCP.
    Unauthorized = "unauthorized", 401;
    /// A file operation the sandbox user may not do; `/metrics` for a tenant.
    PermissionDenied = "permission_denied", 403;
    /// What only the operator may do, or a source the operator does not allow.
    Forbidden = "forbidden", 403;
    /// No such sandbox (for this caller), process, file or route.
    NotFound = "not_found", 404;
    MethodNotAllowed = "method_not_allowed", 405;
    /// Wrong state: the sandbox is stopped or stopping, a name is taken, stdin
    /// is closed.
    Conflict = "conflict", 409;
    /// The sandbox's state does not allow it (the message names the state).
    InvalidState = "invalid_state", 409;
    /// gVisor cannot save the sandbox as it is; it runs on.
    PauseRefused = "pause_refused", 409;
    /// A saved memory image or checkpoint copy is not what was saved.
    CheckpointDamaged = "checkpoint_damaged", 409;
    /// A paused sandbox past the operator's maximum lifetime: it is not resumed.
    LifetimeExceeded = "lifetime_exceeded", 409;
    /// An automatic pause backed out: the sandbox was in use again.
    Busy = "busy", 409;
    AlreadyExists = "already_exists", 409;
    NotADirectory = "not_a_directory", 409;
    IsADirectory = "is_a_directory", 409;
    DirectoryNotEmpty = "directory_not_empty", 409;
    /// The process has exited.
    ProcessExited = "process_exited", 409;
    /// The process exited and its output is no longer retained.
    Gone = "gone", 410;
    /// A request body or upload over the operator's limit.
    PayloadTooLarge = "payload_too_large", 413;
    /// A copy, snapshot, download, export or diff past a disk or size limit.
    TooLarge = "too_large", 413;
    /// A request body of a type the route does not take.
    UnsupportedMediaType = "unsupported_media_type", 415;
    /// Reading a collection's source failed; the collection is unchanged.
    IngestFailed = "ingest_failed", 422;
    /// An image build failed (a step, or the operator's time limit).
    BuildFailed = "build_failed", 422;
    /// An `Idempotency-Key` already used for a create with another body.
    IdempotencyMismatch = "idempotency_mismatch", 422;
    /// A file operation inside the sandbox failed (an I/O error).
    Io = "io", 422;
    /// A tenant quota.
    QuotaExceeded = "quota_exceeded", 429;
    /// A bound of the sandbox's agent (processes, watches, open streams).
    Limit = "limit", 429;
    /// Opaque; the daemon's log has the details under the request id.
    Internal = "internal", 500;
    /// A feature this daemon was built without.
    NotImplemented = "not_implemented", 501;
    /// A sandbox port refused the connection or did not answer HTTP.
    BadGateway = "bad_gateway", 502;
    /// No capacity, or the daemon is shutting down.
    Unavailable = "unavailable", 503;
    /// The host ran out of file descriptors, memory or disk space.
    HostExhausted = "host_exhausted", 503;
    /// Dialling a sandbox port took too long.
    GatewayTimeout = "gateway_timeout", 504;
    /// A code context's interpreter did not start in time.
    Timeout = "timeout", 504;
    /// The sandbox's disk (writable layer) is full.
    NoSpace = "no_space", 507;
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Text that is no error code of this API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown error code {0:?}")]
pub struct UnknownErrorCode(pub String);

impl FromStr for ErrorCode {
    type Err = UnknownErrorCode;

    fn from_str(s: &str) -> Result<ErrorCode, UnknownErrorCode> {
        ErrorCode::ALL
            .iter()
            .copied()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownErrorCode(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_serializes_as_its_text_and_parses_back() {
        for &c in ErrorCode::ALL {
            assert_eq!(
                serde_json::to_value(c).unwrap(),
                serde_json::json!(c.as_str())
            );
            assert_eq!(c.as_str().parse::<ErrorCode>().unwrap(), c);
            assert!((400..600).contains(&c.status()), "{c}");
        }
        assert!("nope".parse::<ErrorCode>().is_err());
    }
}
