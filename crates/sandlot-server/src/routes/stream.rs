//! Streaming bodies: NDJSON lines of process output (with offsets, base64 data)
//! and of file watches, with back-pressure from the HTTP connection to the agent.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::Bytes;
use sandlot_proto::api::StreamEvent;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::code::output::Held;
use crate::process::OutEvent;
use crate::sandbox::ActiveGuard;
use crate::services::process::Source;

/// The NDJSON (and WebSocket text) form of an output event.
pub fn event_json(ev: &OutEvent) -> StreamEvent {
    let b64 = |b: &Bytes| base64::engine::general_purpose::STANDARD.encode(b);
    match ev {
        OutEvent::Stdout(o, b) => StreamEvent::Stdout {
            offset: *o,
            data: b64(b),
        },
        OutEvent::Stderr(o, b) => StreamEvent::Stderr {
            offset: *o,
            data: b64(b),
        },
        OutEvent::Exit(x) => StreamEvent::Exit { exit: *x },
    }
}

pub fn line<T: Serialize>(v: &T) -> Bytes {
    let mut s = serde_json::to_vec(v).expect("stream events serialize");
    s.push(b'\n');
    // No spare capacity: a line holds what it counts for.
    s.shrink_to_fit();
    Bytes::from(s)
}

/// A streaming response fed by a channel (capacity bounds what is buffered).
pub fn channel_body(content_type: &'static str) -> (mpsc::Sender<Bytes>, Response) {
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    let resp = (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(stream),
    )
        .into_response();
    (tx, resp)
}

/// A chunk of a [`held_channel_body`] with its share of the pool, or the error
/// that cuts the body short (the client sees a transfer that did not complete).
pub type HeldChunk = Result<(Bytes, Held), std::io::Error>;

/// [`channel_body`] whose chunks each come with what they hold of their
/// sandbox's output pool: a chunk stays counted until the body asks for the
/// chunk after it (the connection has taken it), not only until it is queued.
pub fn held_channel_body(content_type: &'static str) -> (mpsc::Sender<HeldChunk>, Response) {
    let (tx, rx) = mpsc::channel::<HeldChunk>(4);
    let stream = futures_util::stream::unfold((rx, Held::default()), |(mut rx, sent)| async move {
        drop(sent);
        match rx.recv().await? {
            Ok((b, held)) => Some((Ok(b), (rx, held))),
            Err(e) => Some((Err(e), (rx, Held::default()))),
        }
    });
    let resp = (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(stream),
    )
        .into_response();
    (tx, resp)
}

/// A whole answer as one chunk that holds `held` until the connection has
/// taken it.
pub fn held_body(status: StatusCode, content_type: &'static str, b: Bytes, held: Held) -> Response {
    let len = b.len();
    let once = Some((b, held));
    let stream = futures_util::stream::unfold((once, Held::default()), |(once, sent)| async move {
        drop(sent);
        let (b, held) = once?;
        Some((Ok::<_, Infallible>(b), (None, held)))
    });
    (
        status,
        [
            (header::CONTENT_TYPE, content_type.to_string()),
            (header::CACHE_CONTROL, "no-store".to_string()),
            (header::CONTENT_LENGTH, len.to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// [`channel_body`] whose sender can end the body with an error: the client then
/// sees a transfer cut short, never one that looks complete.
pub fn fallible_channel_body(
    content_type: &'static str,
) -> (mpsc::Sender<Result<Bytes, std::io::Error>>, Response) {
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let stream =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
    let resp = (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(stream),
    )
        .into_response();
    (tx, resp)
}

/// Streams a process's output as NDJSON: `first`, then output and exit lines; a
/// failure mid-stream becomes an `error` line with the request id.
pub fn ndjson_output(
    first: StreamEvent,
    mut src: Source,
    guard: ActiveGuard,
    request_id: String,
) -> Response {
    let (tx, resp) = channel_body("application/x-ndjson");
    tokio::spawn(async move {
        let _guard = guard;
        if tx.send(line(&first)).await.is_err() {
            return;
        }
        loop {
            match src.next().await {
                Ok(Some(ev)) => {
                    if tx.send(line(&event_json(&ev))).await.is_err() {
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    if e.status.is_server_error() {
                        tracing::error!(
                            request_id,
                            detail = e.internal.as_deref().unwrap_or(""),
                            "output stream failed"
                        );
                    }
                    let _ = tx
                        .send(line(&StreamEvent::Error {
                            error: e.body(&request_id).error,
                        }))
                        .await;
                    return;
                }
            }
        }
    });
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::code::output::OutputPool;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_chunk_stays_counted_until_the_body_asks_for_the_next() {
        let pool = OutputPool::new(1000);
        let (tx, resp) = held_channel_body("application/x-ndjson");
        tx.send(Ok((Bytes::from_static(b"a\n"), pool.take(100).unwrap())))
            .await
            .unwrap();
        tx.send(Ok((Bytes::from_static(b"b\n"), pool.take(10).unwrap())))
            .await
            .unwrap();
        drop(tx);
        let mut body = resp.into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"a\n");
        assert_eq!(pool.held(), 110);
        body.frame().await.unwrap().unwrap();
        assert_eq!(pool.held(), 10);
        assert!(body.frame().await.is_none());
        assert_eq!(pool.held(), 0);
    }

    #[tokio::test]
    async fn a_whole_answer_stays_counted_until_it_is_taken() {
        let pool = OutputPool::new(1000);
        let resp = held_body(
            StatusCode::OK,
            "application/json",
            Bytes::from_static(b"{}"),
            pool.take(100).unwrap(),
        );
        assert_eq!(pool.held(), 100);
        assert_eq!(resp.headers()[header::CONTENT_LENGTH], "2");
        let mut body = resp.into_body();
        body.frame().await.unwrap().unwrap();
        assert_eq!(pool.held(), 100);
        assert!(body.frame().await.is_none());
        assert_eq!(pool.held(), 0);
    }
}
