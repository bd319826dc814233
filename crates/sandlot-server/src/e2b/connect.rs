//! The Connect protocol (connectrpc.com) as envd speaks it, JSON codec only:
//! unary calls are `application/json` bodies; streams are enveloped frames
//! (`application/connect+json`: 1 flag byte, 4 bytes big-endian length, the
//! message), ended by an end-of-stream frame (flag `0x02`) carrying `{}` or
//! `{"error": {"code", "message"}}`. Also the proto3 JSON conventions the
//! messages use: `bytes` as base64, 64-bit integers as strings, enums by name.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::{Buf, Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::error::{ApiError, ErrorCode};

/// Frame flag: the payload is compressed (never used here: compression is refused).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Frame flag: the end-of-stream message.
pub const FLAG_END_STREAM: u8 = 0x02;
/// Frame flag of gRPC-Web's trailers frame, its end of stream: such a frame is an
/// end of stream here too, never a message.
pub const FLAG_TRAILERS: u8 = 0x80;
/// Largest frame accepted from a client (envd requests are small JSON).
pub const MAX_FRAME: usize = 16 << 20;

pub const CT_UNARY: &str = "application/json";
pub const CT_STREAM: &str = "application/connect+json";

/// Connect error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error response with this code (Connect spec).
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).expect("valid status"),
            Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
                StatusCode::BAD_REQUEST
            }
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// A Connect error: a code and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectError {
    pub code: Code,
    pub message: String,
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> ConnectError {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> ConnectError {
        ConnectError::new(Code::InvalidArgument, message)
    }

    pub fn not_found(message: impl Into<String>) -> ConnectError {
        ConnectError::new(Code::NotFound, message)
    }

    pub fn json(&self) -> Value {
        json!({"code": self.code.as_str(), "message": self.message})
    }

    /// The mapping of a Sandlot API error (from the shared handlers and the guest)
    /// to the Connect code envd would answer with.
    pub fn from_api(e: &ApiError) -> ConnectError {
        let code = match (e.status.as_u16(), e.code) {
            (_, ErrorCode::AlreadyExists) => Code::AlreadyExists,
            (_, ErrorCode::NotADirectory | ErrorCode::IsADirectory) => Code::InvalidArgument,
            (_, ErrorCode::DirectoryNotEmpty) => Code::FailedPrecondition,
            (_, ErrorCode::ProcessExited) | (410, _) | (404, _) => Code::NotFound,
            (_, ErrorCode::NoSpace) | (413, _) | (429, _) | (507, _) => Code::ResourceExhausted,
            (400, _) => Code::InvalidArgument,
            (401, _) => Code::Unauthenticated,
            (403, _) => Code::PermissionDenied,
            (409, _) => Code::FailedPrecondition,
            (503, _) => Code::Unavailable,
            _ => Code::Internal,
        };
        ConnectError::new(code, e.message.clone())
    }
}

impl From<ApiError> for ConnectError {
    fn from(e: ApiError) -> ConnectError {
        if e.status.is_server_error() {
            tracing::error!(
                code = e.code.as_str(),
                detail = %crate::routes::one_line(e.internal.as_deref().unwrap_or("")),
                "envd call failed: {}",
                crate::routes::one_line(&e.message)
            );
        }
        ConnectError::from_api(&e)
    }
}

impl IntoResponse for ConnectError {
    /// The unary error response.
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.json()).expect("error JSON serializes");
        (
            self.code.http_status(),
            [(header::CONTENT_TYPE, CT_UNARY)],
            body,
        )
            .into_response()
    }
}

/// One enveloped frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub flags: u8,
    pub payload: Bytes,
}

impl Frame {
    /// Whether this frame ends the stream (Connect's end-of-stream flag, or
    /// gRPC-Web's trailers flag) rather than carrying a message: its payload is
    /// never a request.
    pub fn ends_stream(&self) -> bool {
        self.flags & (FLAG_END_STREAM | FLAG_TRAILERS) != 0
    }
}

/// Encodes one frame.
pub fn encode_frame(flags: u8, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + payload.len());
    b.extend_from_slice(&[flags]);
    b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    b.extend_from_slice(payload);
    b.freeze()
}

/// The end-of-stream frame: `{}` on success, `{"error": ...}` otherwise.
pub fn end_stream_frame(err: Option<&ConnectError>) -> Bytes {
    let v = match err {
        None => json!({}),
        Some(e) => json!({ "error": e.json() }),
    };
    encode_frame(
        FLAG_END_STREAM,
        &serde_json::to_vec(&v).expect("JSON serializes"),
    )
}

/// Splits a byte stream into frames as it arrives.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: BytesMut,
}

impl FrameDecoder {
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next complete frame, if one is buffered.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, ConnectError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_FRAME {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("message of {len} bytes is larger than the limit of {MAX_FRAME}"),
            ));
        }
        if flags & FLAG_COMPRESSED != 0 {
            return Err(ConnectError::new(
                Code::Unimplemented,
                "compressed messages are not supported (send them uncompressed)",
            ));
        }
        let unknown = flags & !(FLAG_COMPRESSED | FLAG_END_STREAM | FLAG_TRAILERS);
        if unknown != 0 {
            return Err(ConnectError::invalid(format!(
                "frame flags {flags:#04x}: {unknown:#04x} is not a Connect flag"
            )));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        self.buf.advance(5);
        let payload = self.buf.split_to(len).freeze();
        Ok(Some(Frame { flags, payload }))
    }

    /// Fails if a partial frame is left over at the end of the body.
    pub fn finish(&self) -> Result<(), ConnectError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(ConnectError::invalid(format!(
                "the request body ends inside a frame ({} bytes left over)",
                self.buf.len()
            )))
        }
    }
}

/// Whether a request is a unary call or a stream, by its content type; other
/// codecs (binary protobuf) and compression are refused.
pub fn check_request(headers: &HeaderMap, streaming: bool) -> Result<(), ConnectError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let ct = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let want = if streaming { CT_STREAM } else { CT_UNARY };
    if ct != want {
        return Err(ConnectError::new(
            Code::Unimplemented,
            format!("content type {ct:?} is not supported here: use {want} (the JSON codec)"),
        ));
    }
    for h in ["content-encoding", "connect-content-encoding"] {
        if let Some(v) = headers.get(h).and_then(|v| v.to_str().ok()) {
            if !v.eq_ignore_ascii_case("identity") {
                return Err(ConnectError::new(
                    Code::Unimplemented,
                    format!("{h} {v:?} is not supported (send requests uncompressed)"),
                ));
            }
        }
    }
    Ok(())
}

/// Parses a message (tolerant: unknown fields are ignored, as newer clients may
/// send fields this server does not know).
pub fn parse_message<T: DeserializeOwned>(payload: &[u8]) -> Result<T, ConnectError> {
    let payload = if payload.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        payload
    };
    serde_json::from_slice(payload)
        .map_err(|e| ConnectError::invalid(format!("invalid request message: {e}")))
}

/// The one message of a server-streaming request body.
pub fn single_frame(body: &[u8]) -> Result<Bytes, ConnectError> {
    let mut d = FrameDecoder::default();
    d.push(body);
    let f = d
        .next_frame()?
        .ok_or_else(|| ConnectError::invalid("the request stream has no message"))?;
    d.finish()?;
    if f.ends_stream() {
        return Err(ConnectError::invalid(
            "the request stream starts with an end-of-stream frame",
        ));
    }
    Ok(f.payload)
}

/// A unary success response.
pub fn unary_ok<T: Serialize>(msg: &T) -> Response {
    let body = serde_json::to_vec(msg).expect("messages serialize");
    (StatusCode::OK, [(header::CONTENT_TYPE, CT_UNARY)], body).into_response()
}

/// Sends the messages of a streaming response.
pub struct StreamSender {
    tx: mpsc::Sender<Bytes>,
}

impl StreamSender {
    /// Sends one message; false when the client went away.
    pub async fn send<T: Serialize>(&self, msg: &T) -> bool {
        let payload = serde_json::to_vec(msg).expect("messages serialize");
        self.tx.send(encode_frame(0, &payload)).await.is_ok()
    }

    /// Ends the stream, with an error or without.
    pub async fn end(self, err: Option<ConnectError>) {
        let _ = self.tx.send(end_stream_frame(err.as_ref())).await;
    }

    /// Resolves when the client has gone away.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

/// A streaming response (HTTP 200, `application/connect+json`) fed by the
/// returned sender; errors travel in the end-of-stream frame.
pub fn stream_response() -> (StreamSender, Response) {
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    let mut resp = Body::from_stream(stream).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CT_STREAM));
    (StreamSender { tx }, resp)
}

/// A streaming response that is only an error.
pub fn stream_error(err: ConnectError) -> Response {
    let mut resp = Body::from(end_stream_frame(Some(&err))).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CT_STREAM));
    resp
}

/// proto3 JSON `bytes`: standard base64 with padding on output.
pub fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// proto3 JSON `bytes` on input: standard or URL-safe alphabet, padded or not.
pub fn unb64(s: &str) -> Result<Vec<u8>, ConnectError> {
    use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
    let t = s.trim_end_matches('=');
    STANDARD_NO_PAD
        .decode(t)
        .or_else(|_| URL_SAFE_NO_PAD.decode(t))
        .map_err(|e| ConnectError::invalid(format!("invalid base64 in a bytes field: {e}")))
}

/// proto3 JSON 64-bit and 32-bit integers: a number or a decimal string.
pub fn int_value(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// The keepalive interval a client asks for (`Keepalive-Ping-Interval`, seconds).
pub fn keepalive_interval(headers: &HeaderMap) -> Option<std::time::Duration> {
    let s: u64 = headers
        .get("keepalive-ping-interval")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (s > 0).then(|| std::time::Duration::from_secs(s.min(3600)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_split_anywhere() {
        let a = encode_frame(0, br#"{"a":1}"#);
        let b = end_stream_frame(None);
        assert_eq!(&a[..5], &[0, 0, 0, 0, 7]);
        let all = [a.clone(), b.clone()].concat();
        // Fed one byte at a time, the decoder yields exactly the two frames.
        let mut d = FrameDecoder::default();
        let mut got = Vec::new();
        for byte in &all {
            d.push(&[*byte]);
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f);
            }
        }
        d.finish().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(&got[0].payload[..], br#"{"a":1}"#);
        assert_eq!(got[0].flags, 0);
        assert_eq!(got[1].flags, FLAG_END_STREAM);
        assert_eq!(&got[1].payload[..], b"{}");
    }

    #[test]
    fn partial_frames_and_compression_are_errors() {
        let mut d = FrameDecoder::default();
        d.push(&[0, 0, 0, 0, 9, b'{']);
        assert_eq!(d.next_frame().unwrap(), None);
        assert!(d.finish().is_err());
        let mut d = FrameDecoder::default();
        d.push(&encode_frame(FLAG_COMPRESSED, b"xx"));
        assert_eq!(d.next_frame().unwrap_err().code, Code::Unimplemented);
        // Reserved flag bits are refused, not read past.
        let mut d = FrameDecoder::default();
        d.push(&encode_frame(0x04, b"{}"));
        assert_eq!(d.next_frame().unwrap_err().code, Code::InvalidArgument);
        let mut d = FrameDecoder::default();
        d.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(d.next_frame().unwrap_err().code, Code::ResourceExhausted);
    }

    #[test]
    fn end_of_stream_frames_are_never_messages() {
        for flags in [
            FLAG_END_STREAM,
            FLAG_TRAILERS,
            FLAG_END_STREAM | FLAG_TRAILERS,
        ] {
            let mut d = FrameDecoder::default();
            d.push(&encode_frame(flags, br#"{"x":true}"#));
            let f = d.next_frame().unwrap().unwrap();
            assert!(f.ends_stream(), "flags {flags:#04x}");
            // The one message of a server stream cannot be one either.
            assert!(single_frame(&encode_frame(flags, br#"{"x":true}"#)).is_err());
        }
        assert!(!Frame {
            flags: 0,
            payload: Bytes::new()
        }
        .ends_stream());
    }

    #[test]
    fn end_stream_carries_the_error() {
        let e = ConnectError::not_found("process 7 not found");
        let f = end_stream_frame(Some(&e));
        assert_eq!(f[0], FLAG_END_STREAM);
        let v: Value = serde_json::from_slice(&f[5..]).unwrap();
        assert_eq!(
            v,
            json!({"error": {"code": "not_found", "message": "process 7 not found"}})
        );
    }

    #[test]
    fn single_frame_wants_exactly_one_message() {
        let body = encode_frame(0, br#"{"x":true}"#);
        assert_eq!(&single_frame(&body).unwrap()[..], br#"{"x":true}"#);
        assert!(single_frame(b"").is_err());
        assert!(single_frame(&end_stream_frame(None)).is_err());
        let two = [body.clone(), body].concat();
        // A second message is left over: refused rather than ignored.
        assert!(single_frame(&two).is_err());
    }

    #[test]
    fn codes_map_to_connect_http_statuses() {
        assert_eq!(Code::NotFound.http_status(), StatusCode::NOT_FOUND);
        assert_eq!(Code::AlreadyExists.http_status(), StatusCode::CONFLICT);
        assert_eq!(
            Code::Unimplemented.http_status(),
            StatusCode::NOT_IMPLEMENTED
        );
        assert_eq!(Code::Canceled.http_status().as_u16(), 499);
        assert_eq!(
            Code::Unauthenticated.http_status(),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(Code::ResourceExhausted.as_str(), "resource_exhausted");
    }

    #[test]
    fn api_errors_map_to_connect_codes() {
        let m = |e: ApiError| ConnectError::from_api(&e).code;
        assert_eq!(m(ApiError::not_found("x")), Code::NotFound);
        assert_eq!(
            m(ApiError::of(ErrorCode::AlreadyExists, "x")),
            Code::AlreadyExists
        );
        assert_eq!(
            m(ApiError::of(ErrorCode::IsADirectory, "x")),
            Code::InvalidArgument
        );
        assert_eq!(
            m(ApiError::of(ErrorCode::ProcessExited, "x")),
            Code::NotFound
        );
        assert_eq!(
            m(ApiError::of(ErrorCode::PermissionDenied, "x")),
            Code::PermissionDenied
        );
        assert_eq!(m(ApiError::bad_request("x")), Code::InvalidArgument);
        assert_eq!(
            m(ApiError::of(ErrorCode::NoSpace, "x")),
            Code::ResourceExhausted
        );
        assert_eq!(m(ApiError::internal("boom")), Code::Internal);
    }

    #[test]
    fn request_content_types_are_checked() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        assert!(check_request(&h, false).is_ok());
        assert_eq!(
            check_request(&h, true).unwrap_err().code,
            Code::Unimplemented
        );
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/proto"),
        );
        assert!(check_request(&h, false).is_err());
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/connect+json"),
        );
        assert!(check_request(&h, true).is_ok());
        h.insert("connect-content-encoding", HeaderValue::from_static("gzip"));
        assert!(check_request(&h, true).is_err());
    }

    #[test]
    fn proto_json_scalars() {
        assert_eq!(b64(b"hi\n"), "aGkK");
        assert_eq!(unb64("aGkK").unwrap(), b"hi\n");
        assert_eq!(unb64("aGk=").unwrap(), b"hi");
        assert_eq!(unb64("aGk").unwrap(), b"hi");
        assert_eq!(unb64("-_8").unwrap(), vec![0xfb, 0xff]);
        assert!(unb64("***").is_err());
        assert_eq!(int_value(&json!("123")), Some(123));
        assert_eq!(int_value(&json!(-4)), Some(-4));
        assert_eq!(int_value(&json!(5.0)), Some(5));
        assert_eq!(int_value(&json!("x")), None);
        let mut h = HeaderMap::new();
        assert_eq!(keepalive_interval(&h), None);
        h.insert("keepalive-ping-interval", HeaderValue::from_static("50"));
        assert_eq!(
            keepalive_interval(&h),
            Some(std::time::Duration::from_secs(50))
        );
    }

    #[test]
    fn messages_parse_tolerantly() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct M {
            #[serde(default)]
            path: String,
        }
        let m: M = parse_message(br#"{"path":"/a","futureField":1}"#).unwrap();
        assert_eq!(m.path, "/a");
        let m: M = parse_message(b"").unwrap();
        assert_eq!(m.path, "");
        assert_eq!(
            parse_message::<M>(b"{nope").unwrap_err().code,
            Code::InvalidArgument
        );
    }
}
