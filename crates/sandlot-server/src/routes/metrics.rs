//! `GET /v1/sandboxes/{id}/metrics`: a sandbox's CPU and memory over time (the
//! history the owner keeps, `usage_history.rs`).

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::Json;
use sandlot_proto::api::metrics::MetricsHistory;

use super::lookup;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// `start`/`end` of a metrics query: Unix times in seconds (as E2B's), or in
/// milliseconds with `start_ms`/`end_ms`.
pub fn time_range(q: Option<&str>) -> ApiResult<(Option<i64>, Option<i64>)> {
    let (mut start, mut end) = (None, None);
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        let n = |unit: i64| {
            v.parse::<i64>()
                .ok()
                .and_then(|n| n.checked_mul(unit))
                .ok_or_else(|| ApiError::invalid(k.as_ref(), "not a Unix time (an integer)"))
        };
        match k.as_ref() {
            "start" => start = Some(n(1000)?),
            "end" => end = Some(n(1000)?),
            "start_ms" => start = Some(n(1)?),
            "end_ms" => end = Some(n(1)?),
            other => {
                return Err(ApiError::invalid(
                    other,
                    "unknown query parameter, expected start, end, start_ms or end_ms",
                ))
            }
        }
    }
    if let (Some(s), Some(e)) = (start, end) {
        if s > e {
            return Err(ApiError::invalid("start", "after end"));
        }
    }
    Ok((start, end))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/metrics", tag = "sandboxes",
    params(("id" = String, Path),
        ("start" = Option<i64>, Query, description = "Only samples from this Unix time (seconds) on"),
        ("end" = Option<i64>, Query, description = "Only samples up to this Unix time (seconds)"),
        ("start_ms" = Option<i64>, Query, description = "`start` in milliseconds"),
        ("end_ms" = Option<i64>, Query, description = "`end` in milliseconds")),
    responses((status = 200, body = MetricsHistory,
        description = "Samples of a running sandbox, oldest first, ending with one taken now when the range reaches the present; none for a sandbox that does not run (paused, stopped)"),
        (status = 400, body = crate::error::ErrorEnvelope), (status = 404, body = crate::error::ErrorEnvelope)))]
pub async fn get(
    State(state): State<Arc<AppState>>,
    p: Principal,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<MetricsHistory>> {
    let (start, end) = time_range(q.as_deref())?;
    let rec = lookup(&state, &p, &id)?;
    Ok(Json(match state.handle(&rec.id) {
        Some(h) => h.metrics(start, end),
        None => MetricsHistory {
            interval_seconds: 5,
            samples: Vec::new(),
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metrics_range_is_in_seconds_or_milliseconds_and_checked() {
        assert_eq!(time_range(None).unwrap(), (None, None));
        assert_eq!(
            time_range(Some("start=10&end=20")).unwrap(),
            (Some(10_000), Some(20_000))
        );
        assert_eq!(time_range(Some("start_ms=10")).unwrap(), (Some(10), None));
        for bad in [
            "start=x",
            "end=20&start=30",
            "since=1",
            "start=9223372036854775807",
        ] {
            assert!(time_range(Some(bad)).is_err(), "{bad}");
        }
    }
}
