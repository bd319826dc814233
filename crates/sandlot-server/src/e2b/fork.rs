//! E2B's fork (`POST /sandboxes/{id}/fork` `{timeout, count}`, `sb.fork()`) over
//! the native fork: `count` new sandboxes of the caller's tenant continuing from
//! a fresh checkpoint of the sandbox, each with the lifetime `timeout`.
//!
//! E2B answers one entry per fork, a sandbox or an error; Sandlot's fork is all
//! or none, so the answer is either every fork (201) or one error for the request.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use sandlot_proto::api::checkpoint::ForkRequest;
use serde_json::{json, Value};

use super::lifecycle::known_record;
use super::rest::{
    apply_timeout, created_json, json_body, principal, timeout_secs, RestError, RestResult,
};
use super::E2b;

/// E2B's default lifetime of a fork, in seconds.
const FORK_TIMEOUT_SECS: u64 = 15;

pub fn routes() -> Router<Arc<E2b>> {
    Router::new().route("/sandboxes/{id}/fork", post(fork))
}

/// The fork count E2B's body asks for (1 when absent).
fn fork_count(b: &Value) -> RestResult<u32> {
    match b.get("count") {
        None | Some(Value::Null) => Ok(1),
        Some(v) => v
            .as_u64()
            .filter(|n| *n >= 1)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                RestError::bad(format!("count: expected a whole number from 1, got {v}"))
            }),
    }
}

async fn fork(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> RestResult<Response> {
    let p = principal(&e2b, &headers)?;
    // E2B: a killed sandbox (or another tenant's) is "not found".
    known_record(&e2b, &p, &id)?;
    let b = json_body(&e2b, body).await?;
    let count = fork_count(&b)?;
    let secs = timeout_secs(&b, "timeout")?.unwrap_or(FORK_TIMEOUT_SECS);
    let max = e2b.app.cfg.limits.max_timeout.0.as_secs();
    if secs == 0 || secs > max {
        return Err(RestError::bad(format!(
            "timeout: use 1 to {max} seconds (limits.max_timeout)"
        )));
    }
    let req = ForkRequest {
        count,
        checkpoint: None,
    };
    let forked = crate::fork::fork(&e2b.app, &p, &id, &req).await?;
    let mut out = Vec::with_capacity(forked.sandboxes.len());
    for sb in &forked.sandboxes {
        apply_timeout(&e2b, &p, &sb.id, secs).await?;
        let rec = known_record(&e2b, &p, &sb.id)?;
        out.push(json!({ "sandbox": created_json(&e2b, &rec) }));
    }
    Ok((StatusCode::CREATED, Json(Value::Array(out))).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_count_is_a_whole_number_from_one() {
        assert_eq!(fork_count(&json!({})).unwrap(), 1);
        assert_eq!(fork_count(&json!({"count": 3})).unwrap(), 3);
        for bad in [
            json!({"count": 0}),
            json!({"count": -1}),
            json!({"count": 1.5}),
            json!({"count": "2"}),
        ] {
            assert!(fork_count(&bad).is_err(), "{bad}");
        }
    }
}
