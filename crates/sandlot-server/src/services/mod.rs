//! The operations on a sandbox that more than one front door offers, each
//! written once: the native routes (`routes/`) and the E2B front door (`e2b/`)
//! parse their requests and shape their answers, and call these for the work
//! itself. A service reaches the sandbox through its `GuestClient` and applies
//! what every caller owes: the tenant's view (another tenant's sandbox is not
//! found) and resume on demand when the caller is a tenant, the sandbox's
//! activity (idle timeout), its byte counters, and the daemon's bounds (a read
//! within the sandbox's disk limit, an upload within `limits.max_upload`).
//!
//! * `create.rs`: a create body checked into what `sandbox::create` takes (the
//!   native create and E2B's).
//! * `files.rs`: stat, list, read and write (streamed), mkdir, remove, rename,
//!   watch.
//! * `process.rs`: starting a supervised process (exec, E2B's
//!   `process.Process/Start`, image builds, template start commands), listing
//!   processes, signals, terminal resizes, stdin.
//! * `sandboxes.rs`: the tenant's view of sandboxes (`lookup`, `live`), which
//!   resume on demand (`autopause::live`) and the other services build on.
//! * `tenants.rs`: the operator's view of tenants, their quotas and usage.

pub mod create;
pub mod files;
pub mod process;
pub mod sandboxes;
pub mod tenants;

use std::time::Duration;

use serde_json::Value;

use crate::error::{ApiError, ApiResult};

/// A duration given as seconds (number) or a string with a unit (`"10m"`).
pub fn parse_duration(field: &str, v: &Value) -> ApiResult<Duration> {
    let d = match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.is_finite() && (0.0..1e12).contains(&f) => Duration::from_secs_f64(f),
            _ => {
                return Err(ApiError::invalid(
                    field,
                    format!("{n} is not a valid number of seconds"),
                ))
            }
        },
        Value::String(s) => s
            .parse::<sandlot_proto::units::Seconds>()
            .map_err(|e| ApiError::invalid(field, e))?
            .duration(),
        other => {
            return Err(ApiError::invalid(
                field,
                format!("expected seconds or a duration string like \"5m\", got {other}"),
            ))
        }
    };
    if d.is_zero() {
        return Err(ApiError::invalid(field, "must be positive"));
    }
    Ok(d)
}
