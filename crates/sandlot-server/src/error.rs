//! The one error shape of the API: `{"error": {"code", "message", "request_id"}}`
//! (plus `field` for validation errors), rendered by the request middleware so
//! that every error, including the router's own, carries the request id.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sandlot_guest::client::{ClientError, ErrorCode as GuestCode};

/// An API error. `internal` holds details that are logged under the request id and
/// never sent: every 5xx's, and a 4xx's whose full account names host paths.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: ErrorCode,
    pub message: String,
    pub field: Option<String>,
    pub internal: Option<String>,
}

pub use sandlot_proto::api::{ApiErrorBody, ErrorCode, ErrorEnvelope};

impl ApiError {
    pub fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            field: None,
            internal: None,
        }
    }

    /// An error of `code`, with the status the code has.
    pub fn of(code: ErrorCode, message: impl Into<String>) -> ApiError {
        let status =
            StatusCode::from_u16(code.status()).expect("every error code has a valid status");
        ApiError::new(status, code, message)
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::of(ErrorCode::BadRequest, message)
    }

    /// A validation error naming `field`; the message starts with the field.
    pub fn invalid(field: impl Into<String>, problem: impl std::fmt::Display) -> ApiError {
        let field = field.into();
        let mut e = ApiError::bad_request(format!("{field}: {problem}"));
        e.field = Some(field);
        e
    }

    pub fn not_found(what: impl Into<String>) -> ApiError {
        ApiError::of(ErrorCode::NotFound, what)
    }

    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::of(ErrorCode::Conflict, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::of(ErrorCode::Unauthorized, message)
    }

    pub fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::of(ErrorCode::PayloadTooLarge, message)
    }

    pub fn quota(message: impl Into<String>) -> ApiError {
        ApiError::of(ErrorCode::QuotaExceeded, message)
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::of(ErrorCode::Unavailable, message)
    }

    /// 503 `host_exhausted`: the host ran out of `what` (descriptors, memory, disk)
    /// while serving the request; nothing of it was kept, and a retry may succeed.
    pub fn host_exhausted(what: Exhausted) -> ApiError {
        ApiError::of(
            ErrorCode::HostExhausted,
            format!("the host is out of {}; try again later", what.noun()),
        )
    }

    /// This error, or 503 `host_exhausted` if it is an opaque 500 whose detail
    /// says the host ran out of a resource (the detail is still logged).
    pub fn or_exhausted(self) -> ApiError {
        if self.status != StatusCode::INTERNAL_SERVER_ERROR {
            return self;
        }
        match self.internal.as_deref().and_then(Exhausted::in_text) {
            Some(what) => {
                let mut e = ApiError::host_exhausted(what);
                e.internal = self.internal;
                e
            }
            None => self,
        }
    }

    /// An opaque 500: `detail` goes to the log only.
    pub fn internal(detail: impl std::fmt::Display) -> ApiError {
        let mut e = ApiError::of(ErrorCode::Internal, "internal error");
        e.internal = Some(detail.to_string());
        e
    }

    /// Keeps `detail` (e.g. the error chain with the host paths the message leaves
    /// out) for the daemon's log.
    pub fn with_detail(mut self, detail: impl std::fmt::Display) -> ApiError {
        self.internal = Some(detail.to_string());
        self
    }

    pub fn body(&self, request_id: &str) -> ErrorEnvelope {
        ErrorEnvelope {
            error: ApiErrorBody {
                code: self.code.as_str().to_string(),
                message: self.message.clone(),
                request_id: request_id.to_string(),
                field: self.field.clone(),
            },
        }
    }

    /// The error of a guest operation on `what` (a path, a process).
    pub fn from_guest(e: ClientError, what: &str) -> ApiError {
        let code = e.code();
        let msg = e.to_string();
        let full = if msg.starts_with(what) {
            msg.clone()
        } else {
            format!("{what}: {msg}")
        };
        let s = |c| ApiError::of(c, full.clone());
        match code {
            Some(GuestCode::NotFound) => s(ErrorCode::NotFound),
            Some(GuestCode::NoSuchProcess) => s(ErrorCode::NotFound),
            Some(GuestCode::PermissionDenied) => s(ErrorCode::PermissionDenied),
            Some(GuestCode::AlreadyExists) => s(ErrorCode::AlreadyExists),
            Some(GuestCode::NotADirectory) => s(ErrorCode::NotADirectory),
            Some(GuestCode::IsADirectory) => s(ErrorCode::IsADirectory),
            Some(GuestCode::DirectoryNotEmpty) => s(ErrorCode::DirectoryNotEmpty),
            Some(GuestCode::ProcessExited) => s(ErrorCode::ProcessExited),
            Some(GuestCode::BadRequest) => s(ErrorCode::BadRequest),
            Some(GuestCode::InvalidUser) => s(ErrorCode::InvalidUser),
            Some(GuestCode::SpawnFailed) => s(ErrorCode::SpawnFailed),
            Some(GuestCode::Limit) => s(ErrorCode::Limit),
            Some(GuestCode::ShuttingDown) => s(ErrorCode::Conflict),
            Some(GuestCode::Io) if msg.contains("No space left") || msg.contains("ENOSPC") => {
                ApiError::of(
                    ErrorCode::NoSpace,
                    format!("{what}: the sandbox's disk is full"),
                )
            }
            Some(GuestCode::Io) => s(ErrorCode::Io),
            _ => match e {
                ClientError::Closed(_) | ClientError::Connect { .. } => ApiError::conflict(
                    format!("{what}: the sandbox is not reachable (it is stopping or has stopped)"),
                ),
                other => ApiError::internal(format!("{what}: {other}")),
            },
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

/// Marker put in the response extensions; the middleware renders the body.
#[derive(Debug, Clone)]
pub struct PendingError(pub Arc<ApiError>);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = self.status.into_response();
        r.extensions_mut().insert(PendingError(Arc::new(self)));
        r
    }
}

/// Runs `work` to its end on a task of its own: a caller that goes away (a client
/// cut off, its request future dropped) cannot stop it half-way.
pub async fn to_completion<T: Send + 'static>(
    work: impl std::future::Future<Output = ApiResult<T>> + Send + 'static,
) -> ApiResult<T> {
    tokio::spawn(work).await.map_err(ApiError::internal)?
}

/// The default error for a status produced outside the handlers (unknown route,
/// wrong method, body limits of the framework).
pub fn for_status(status: StatusCode) -> ApiError {
    match status {
        StatusCode::NOT_FOUND => ApiError::not_found("no such route"),
        StatusCode::METHOD_NOT_ALLOWED => ApiError::of(
            ErrorCode::MethodNotAllowed,
            "method not allowed on this route",
        ),
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::too_large("request body too large"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::of(
            ErrorCode::UnsupportedMediaType,
            "expected Content-Type: application/json",
        ),
        s if s.is_server_error() => ApiError::internal(format!("status {s} without details")),
        s => ApiError::new(
            s,
            ErrorCode::BadRequest,
            s.canonical_reason().unwrap_or("bad request"),
        ),
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// A host resource whose exhaustion fails a request through no fault of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exhausted {
    /// `EMFILE` (the daemon's open-file limit), `ENFILE` (the system's).
    Descriptors,
    /// `ENOMEM`.
    Memory,
    /// `ENOSPC` (on the host, not in a sandbox's own disk).
    Disk,
}

impl Exhausted {
    pub fn of_errno(errno: i32) -> Option<Exhausted> {
        match errno {
            libc::EMFILE | libc::ENFILE => Some(Exhausted::Descriptors),
            libc::ENOMEM => Some(Exhausted::Memory),
            libc::ENOSPC => Some(Exhausted::Disk),
            _ => None,
        }
    }

    /// The first exhausted resource named by an I/O error in `e` or its sources.
    pub fn in_error(e: &(dyn std::error::Error + 'static)) -> Option<Exhausted> {
        let mut cur = Some(e);
        while let Some(e) = cur {
            if let Some(n) = e
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::raw_os_error)
            {
                if let Some(x) = Exhausted::of_errno(n) {
                    return Some(x);
                }
            }
            cur = e.source();
        }
        Exhausted::in_text(&e.to_string())
    }

    /// The same from an error's text (a helper process reports its errors as
    /// text): the C library's words for the error numbers.
    pub fn in_text(s: &str) -> Option<Exhausted> {
        if s.contains("Too many open files") {
            Some(Exhausted::Descriptors)
        } else if s.contains("Cannot allocate memory") || s.contains("Out of memory") {
            Some(Exhausted::Memory)
        } else if s.contains("No space left on device") {
            Some(Exhausted::Disk)
        } else {
            None
        }
    }

    /// What the host is out of, for the message.
    pub fn noun(self) -> &'static str {
        match self {
            Exhausted::Descriptors => "file descriptors",
            Exhausted::Memory => "memory",
            Exhausted::Disk => "disk space",
        }
    }
}

#[cfg(test)]
mod tests {
    /// The Python SDK's exception map and the API reference's table of codes
    /// hold every code the daemon answers, and no other.
    #[test]
    fn the_sdks_error_map_and_the_api_reference_name_every_error_code() {
        let sdk = include_str!("../../../sdk/python/src/sandlot/errors.py");
        let map = &sdk[sdk.find("_BY_CODE").expect("the SDK's map")..];
        let map = &map[..map.find('}').expect("its end")];
        let sdk_codes: std::collections::BTreeSet<&str> = map
            .lines()
            .filter_map(|l| l.trim().strip_prefix('"')?.split_once('"'))
            .map(|(code, _)| code)
            .collect();
        let ours: std::collections::BTreeSet<&str> =
            ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(sdk_codes, ours, "sdk/python/src/sandlot/errors.py _BY_CODE");
        let doc = include_str!("../../../docs/api.md");
        let table = &doc[doc.find("| status | code | when |").expect("the table")..];
        let table = &table[..table.find("\n\n").expect("its end")];
        for c in ErrorCode::ALL {
            let row = table
                .lines()
                .find(|l| l.contains(&format!("`{}`", c.as_str())))
                .unwrap_or_else(|| panic!("docs/api.md: no row for `{c}`"));
            assert!(
                row.starts_with(&format!("| {} |", c.status())),
                "docs/api.md: `{c}` is {}: {row}",
                c.status()
            );
        }
    }

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("create alive lock: {source}")]
    struct Wrapped {
        source: std::io::Error,
    }

    #[test]
    fn exhausted_host_resources_are_found_in_errors_and_their_sources() {
        let io = |n| std::io::Error::from_raw_os_error(n);
        assert_eq!(
            Exhausted::in_error(&io(libc::EMFILE)),
            Some(Exhausted::Descriptors)
        );
        assert_eq!(
            Exhausted::in_error(&Wrapped {
                source: io(libc::ENFILE)
            }),
            Some(Exhausted::Descriptors)
        );
        assert_eq!(
            Exhausted::in_error(&Wrapped {
                source: io(libc::ENOMEM)
            }),
            Some(Exhausted::Memory)
        );
        assert_eq!(
            Exhausted::in_error(&io(libc::ENOSPC)),
            Some(Exhausted::Disk)
        );
        // Other errors are not the host's exhaustion.
        assert_eq!(Exhausted::in_error(&io(libc::EACCES)), None);
        assert_eq!(Exhausted::in_error(&io(libc::ENOENT)), None);
        // Text of a helper's report.
        assert_eq!(
            Exhausted::in_text("sandbox init failed: clone: Cannot allocate memory (os error 12)"),
            Some(Exhausted::Memory)
        );
        assert_eq!(Exhausted::in_text("sandbox init failed: EPERM"), None);
    }

    #[test]
    fn an_opaque_500_of_an_exhausted_host_becomes_503_host_exhausted() {
        let e = ApiError::internal("create alive lock: Too many open files (os error 24)")
            .or_exhausted();
        assert_eq!(
            (e.status.as_u16(), e.code.as_str()),
            (503, "host_exhausted")
        );
        assert_eq!(
            e.message,
            "the host is out of file descriptors; try again later"
        );
        assert!(
            e.internal.unwrap().contains("alive lock"),
            "the detail is kept for the log"
        );
        let e = ApiError::internal("database is locked").or_exhausted();
        assert_eq!(e.code.as_str(), "internal");
        let e = ApiError::bad_request("No space left on device").or_exhausted();
        assert_eq!(e.code.as_str(), "bad_request", "only 500s are reclassified");
    }
}
