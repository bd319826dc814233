//! Reading the rest of a request body a handler left unread.
//!
//! A handler may answer before it reads the body it was sent: an upload refused
//! up front (no such sandbox, a path the user may not write, a hostile archive
//! named in the query). If the daemon then closed the connection while the client
//! was still sending, the client would see a broken write instead of the answer.
//! So the body is handed back when the handler drops it unfinished, and the rest
//! is read and thrown away, within a bound in bytes and time, before the answer
//! goes out; the connection then stays usable. Past the bound, and for a caller
//! that did not authenticate (401), the answer says `Connection: close` and nothing
//! more of the body is read.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Body as HttpBody, Frame, SizeHint};

/// At most this much of an unread body is read and discarded.
const DISCARD_LIMIT: u64 = 8 << 20;
/// And for at most this long.
const DISCARD_DEADLINE: Duration = Duration::from_secs(10);

/// Middleware: reads what a handler left of the request body (see the module).
pub async fn finish_unread(req: Request, next: Next) -> Response {
    let has_body = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .is_some_and(|v| v.as_bytes() != b"0")
        || req.headers().contains_key(header::TRANSFER_ENCODING);
    if !has_body {
        return next.run(req).await;
    }
    let returned = Arc::new(Mutex::new(None));
    let (parts, body) = req.into_parts();
    let body = Body::new(Returning {
        inner: Some(body),
        ended: false,
        returned: returned.clone(),
    });
    let mut resp = next.run(Request::from_parts(parts, body)).await;
    let unread = returned.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(unread) = unread {
        // A caller that did not authenticate gets nothing read for it.
        let unauthenticated = resp.status() == StatusCode::UNAUTHORIZED;
        if unauthenticated || !discard(unread, DISCARD_LIMIT, DISCARD_DEADLINE).await {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
    }
    resp
}

/// Reads `body` to its end and drops it; false when it is longer than `limit`,
/// slower than `deadline` or broken.
async fn discard(body: Body, limit: u64, deadline: Duration) -> bool {
    let read = async {
        let mut body = body;
        let mut seen = 0u64;
        loop {
            match http_body_util::BodyExt::frame(&mut body).await {
                None => return true,
                Some(Ok(f)) => {
                    if let Some(d) = f.data_ref() {
                        seen += d.len() as u64;
                        if seen > limit {
                            return false;
                        }
                    }
                }
                Some(Err(_)) => return false,
            }
        }
    };
    tokio::time::timeout(deadline, read).await.unwrap_or(false)
}

/// A request body that puts itself back into `returned` when dropped before its end.
struct Returning {
    inner: Option<Body>,
    ended: bool,
    returned: Arc<Mutex<Option<Body>>>,
}

impl HttpBody for Returning {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            this.ended = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.as_ref().is_none_or(HttpBody::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), HttpBody::size_hint)
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            if !self.ended && !inner.is_end_stream() {
                *self.returned.lock().unwrap_or_else(|e| e.into_inner()) = Some(inner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_body_within_the_bound_is_read_to_its_end() {
        let body = Body::from(vec![7u8; 1000]);
        assert!(discard(body, 1000, Duration::from_secs(5)).await);
    }

    #[tokio::test]
    async fn a_body_past_the_bound_is_given_up() {
        let body = Body::from(vec![7u8; 1001]);
        assert!(!discard(body, 1000, Duration::from_secs(5)).await);
    }

    #[tokio::test]
    async fn a_body_dropped_unread_is_handed_back_and_a_read_one_is_not() {
        let returned = Arc::new(Mutex::new(None));
        drop(Returning {
            inner: Some(Body::from("abc")),
            ended: false,
            returned: returned.clone(),
        });
        assert!(returned.lock().unwrap().is_some());

        let returned = Arc::new(Mutex::new(None));
        let mut body = Body::new(Returning {
            inner: Some(Body::from("abc")),
            ended: false,
            returned: returned.clone(),
        });
        let bytes = http_body_util::BodyExt::collect(&mut body).await.unwrap();
        assert_eq!(bytes.to_bytes(), "abc");
        drop(body);
        assert!(returned.lock().unwrap().is_none());
    }

    /// Sends a request with `body_len` bytes of body on `sock` and reads the answer's
    /// status line and headers (the answers here have no body); whether the whole body
    /// could be sent.
    async fn ask(sock: &mut tokio::net::TcpStream, path: &str, body_len: usize) -> (bool, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let head = format!("PUT {path} HTTP/1.1\r\nhost: t\r\ncontent-length: {body_len}\r\n\r\n");
        sock.write_all(head.as_bytes()).await.unwrap();
        let (mut rd, mut wr) = sock.split();
        let send = async {
            let chunk = vec![b'x'; 64 << 10];
            let mut left = body_len;
            while left > 0 {
                let n = left.min(chunk.len());
                if wr.write_all(&chunk[..n]).await.is_err() {
                    return false;
                }
                left -= n;
            }
            true
        };
        let read = async {
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = rd.read(&mut buf).await.unwrap();
                assert!(n > 0, "the connection ended before an answer");
                got.extend_from_slice(&buf[..n]);
            }
            String::from_utf8(got).unwrap()
        };
        let (sent, answer) = tokio::join!(send, read);
        (sent, answer.to_ascii_lowercase())
    }

    #[tokio::test]
    async fn a_request_refused_before_its_body_was_read_leaves_the_connection_usable() {
        let app = axum::Router::new()
            .route(
                "/refuse",
                axum::routing::put(|| async { axum::http::StatusCode::FORBIDDEN }),
            )
            .route(
                "/unauthenticated",
                axum::routing::put(|| async { axum::http::StatusCode::UNAUTHORIZED }),
            )
            .layer(axum::middleware::from_fn(finish_unread));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
        // Twice on one connection: the first body (2 MiB, never read by the
        // handler) was read and thrown away, so the second request is answered.
        for _ in 0..2 {
            let (sent, answer) = ask(&mut sock, "/refuse", 2 << 20).await;
            assert!(sent, "the body could not be sent whole");
            assert!(answer.starts_with("http/1.1 403"), "{answer}");
            assert!(!answer.contains("connection: close"), "{answer}");
        }
        // Past the bound the answer says the connection closes.
        let (_, answer) = ask(&mut sock, "/refuse", (DISCARD_LIMIT as usize) + (1 << 20)).await;
        assert!(answer.contains("connection: close"), "{answer}");
        // Nothing is read for a caller that did not authenticate.
        let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (_, answer) = ask(&mut sock, "/unauthenticated", 1 << 20).await;
        assert!(answer.starts_with("http/1.1 401"), "{answer}");
        assert!(answer.contains("connection: close"), "{answer}");
        server.abort();
    }
}
