//! Request bodies as every front door reads them (the native routes, E2B, MCP,
//! the memory tool): whole within a limit (413 past it), streamed into a file
//! within a limit, and parsed as strict JSON whose errors name the offending
//! field (`resources.memory`, `argv`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use bytes::Bytes;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// A strict JSON body: size-limited (413), parsed with the path of the offending
/// field in errors (400).
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<AppState>> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        let bytes =
            read_limited(req.into_body(), state.cfg.limits.max_request_body.bytes()).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// Reads a whole body, failing with 413 past `limit` bytes.
pub async fn read_limited(body: Body, limit: u64) -> ApiResult<Bytes> {
    let limited = http_body_util::Limited::new(body, limit as usize);
    match http_body_util::BodyExt::collect(limited).await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::too_large(format!(
            "request body larger than {} (limits.max_request_body)",
            sandlot_proto::units::ByteSize(limit)
        ))),
        Err(e) => Err(ApiError::bad_request(format!(
            "reading the request body: {e}"
        ))),
    }
}

/// Parses JSON strictly; errors name the field (`resources.memory`, `argv`).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> ApiResult<T> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(de_error)
}

/// Deserializes a JSON value strictly, naming the field on errors.
pub fn from_value<T: DeserializeOwned>(v: serde_json::Value) -> ApiResult<T> {
    serde_path_to_error::deserialize(v).map_err(de_error)
}

fn de_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    let msg = inner.to_string();
    // Strip serde's " at line 1 column 12" suffix; keep the message.
    let msg = match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg,
    };
    if inner.is_syntax() || inner.is_eof() {
        return ApiError::bad_request(format!("invalid JSON: {msg}"));
    }
    let named = named_field(&msg);
    let field = match named {
        Some((f, _)) if path == "." => f.to_string(),
        Some((f, _)) if path == f || path.ends_with(&format!(".{f}")) => path,
        Some((f, _)) => format!("{path}.{f}"),
        None if path == "." => "body".to_string(),
        None => path,
    };
    match named {
        Some((_, true)) => ApiError::invalid(field, "required but missing"),
        _ => ApiError::invalid(field, msg),
    }
}

/// The field a serde message names, and whether it says the field is missing:
/// "unknown field `x`, expected ..." or "missing field `x`".
fn named_field(msg: &str) -> Option<(&str, bool)> {
    let (rest, missing) = match msg.strip_prefix("unknown field `") {
        Some(r) => (r, false),
        None => (msg.strip_prefix("missing field `")?, true),
    };
    Some((rest.split('`').next()?, missing))
}

/// Streams a request body into the file `tmp` (removed again on failure), at
/// most `limit` bytes when `limit` > 0, named `limit_name` in the error (`what`
/// names the body: `upload`, `context`).
pub async fn stage_within(
    body: Body,
    tmp: &std::path::Path,
    limit: u64,
    limit_name: &str,
    what: &str,
) -> ApiResult<()> {
    let mut f = tokio::fs::File::create(tmp)
        .await
        .map_err(|e| ApiError::internal(format!("stage {what}: {e}")))?;
    let mut stream = body.into_data_stream();
    let mut n = 0u64;
    let mut failed = None;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(c) => {
                n += c.len() as u64;
                if limit > 0 && n > limit {
                    failed = Some(ApiError::invalid(
                        what,
                        format!("larger than {limit_name} ({limit} bytes)"),
                    ));
                    break;
                }
                if let Err(e) = tokio::io::AsyncWriteExt::write_all(&mut f, &c).await {
                    failed = Some(ApiError::internal(format!("stage {what}: {e}")));
                    break;
                }
            }
            Err(e) => {
                failed = Some(ApiError::bad_request(format!("reading the {what}: {e}")));
                break;
            }
        }
    }
    // tokio's File hands writes to a blocking thread: without a flush the last
    // chunk may not have reached the file when it is read back.
    if failed.is_none() {
        if let Err(e) = tokio::io::AsyncWriteExt::flush(&mut f).await {
            failed = Some(ApiError::internal(format!("stage {what}: {e}")));
        }
    }
    drop(f);
    match failed {
        Some(e) => {
            let _ = tokio::fs::remove_file(tmp).await;
            Err(e)
        }
        None => Ok(()),
    }
}
