//! Response streams: raw bytes (files, tar), NDJSON output and watch events, and
//! WebSocket sessions.

use std::collections::VecDeque;

use base64::Engine;
use bytes::{Buf, Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use http_body_util::BodyExt;
use tokio_tungstenite::tungstenite::{self, Message};

use crate::api::{ApiErrorBody, ErrorEnvelope, ProcessExit, StreamEvent, WatchEvent};
use crate::conn::{dial, RespBody, Target};
use crate::{Error, RunOutput};

/// Largest stdin message a stream sends.
const STDIN_MESSAGE: usize = 64 * 1024;

/// The error of a non-2xx response.
pub async fn error_of(resp: http::Response<RespBody>) -> Error {
    let status = resp.status();
    let body = collect(resp).await.unwrap_or_default();
    match serde_json::from_slice::<ErrorEnvelope>(&body) {
        Ok(e) => Error::Api {
            status,
            body: e.error,
        },
        Err(_) => Error::Api {
            status,
            body: ApiErrorBody {
                code: "http".into(),
                message: format!("HTTP {status}: {}", String::from_utf8_lossy(&body).trim()),
                request_id: String::new(),
                field: None,
            },
        },
    }
}

pub async fn collect(resp: http::Response<RespBody>) -> Result<Bytes, Error> {
    resp.into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| Error::Transport(e.to_string()))
}

/// A streamed response body.
pub struct ByteStream {
    body: RespBody,
    /// `x-sandlot-file-size`, when the daemon sent it.
    pub size_hint: Option<u64>,
}

impl ByteStream {
    pub fn new(resp: http::Response<RespBody>) -> ByteStream {
        let size_hint = resp
            .headers()
            .get("x-sandlot-file-size")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        ByteStream {
            body: resp.into_body(),
            size_hint,
        }
    }

    /// The next chunk; None at the end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, Error> {
        loop {
            match self.body.frame().await {
                None => return Ok(None),
                Some(Err(e)) => return Err(Error::Transport(e.to_string())),
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        if !d.is_empty() {
                            return Ok(Some(d));
                        }
                    }
                }
            }
        }
    }

    pub async fn to_vec(mut self) -> Result<Vec<u8>, Error> {
        let mut v = Vec::new();
        while let Some(c) = self.chunk().await? {
            v.extend_from_slice(&c);
        }
        Ok(v)
    }
}

/// NDJSON lines of a body.
pub(crate) struct Lines {
    body: ByteStream,
    buf: BytesMut,
}

impl Lines {
    pub(crate) fn new(resp: http::Response<RespBody>) -> Lines {
        Lines {
            body: ByteStream::new(resp),
            buf: BytesMut::new(),
        }
    }

    pub(crate) async fn next_line(&mut self) -> Result<Option<Bytes>, Error> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let l = self.buf.split_to(i + 1).freeze();
                return Ok(Some(l.slice(..i)));
            }
            match self.body.chunk().await? {
                Some(c) => self.buf.extend_from_slice(&c),
                None if self.buf.is_empty() => return Ok(None),
                None => return Err(Error::Decode("stream ended in the middle of a line".into())),
            }
        }
    }
}

/// Decoded output of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Stdout(u64, Vec<u8>),
    Stderr(u64, Vec<u8>),
    Exit(ProcessExit),
}

/// A process's NDJSON output stream.
pub struct OutputStream {
    lines: Lines,
}

impl OutputStream {
    pub fn new(resp: http::Response<RespBody>) -> OutputStream {
        OutputStream {
            lines: Lines {
                body: ByteStream::new(resp),
                buf: BytesMut::new(),
            },
        }
    }

    /// The next raw event (an `error` line becomes `Err`).
    pub async fn next_event(&mut self) -> Result<Option<StreamEvent>, Error> {
        let Some(l) = self.lines.next_line().await? else {
            return Ok(None);
        };
        let ev: StreamEvent =
            serde_json::from_slice(&l).map_err(|e| Error::Decode(format!("output line: {e}")))?;
        if let StreamEvent::Error { error } = ev {
            return Err(Error::Api {
                status: http::StatusCode::INTERNAL_SERVER_ERROR,
                body: error,
            });
        }
        Ok(Some(ev))
    }

    /// The next output chunk or exit, with base64 decoded; skips `started`/`attached`.
    pub async fn next(&mut self) -> Result<Option<Output>, Error> {
        let dec = |s: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(|e| Error::Decode(format!("output data: {e}")))
        };
        loop {
            return Ok(Some(match self.next_event().await? {
                None => return Ok(None),
                Some(StreamEvent::Stdout { offset, data }) => Output::Stdout(offset, dec(&data)?),
                Some(StreamEvent::Stderr { offset, data }) => Output::Stderr(offset, dec(&data)?),
                Some(StreamEvent::Exit { exit }) => Output::Exit(exit),
                Some(_) => continue,
            }));
        }
    }

    /// Collects everything up to the end of the stream.
    pub async fn collect(&mut self) -> Result<RunOutput, Error> {
        let (mut o, mut e, mut x) = (Vec::new(), Vec::new(), None);
        while let Some(ev) = self.next().await? {
            match ev {
                Output::Stdout(_, b) => o.extend(b),
                Output::Stderr(_, b) => e.extend(b),
                Output::Exit(s) => x = Some(s),
            }
        }
        let exit = x.ok_or_else(|| {
            Error::Decode("the output stream ended without an exit status".into())
        })?;
        Ok(RunOutput {
            exit,
            stdout: o,
            stderr: e,
        })
    }
}

/// A watch stream.
pub struct WatchStream {
    lines: Lines,
}

impl WatchStream {
    pub fn new(resp: http::Response<RespBody>) -> WatchStream {
        WatchStream {
            lines: Lines {
                body: ByteStream::new(resp),
                buf: BytesMut::new(),
            },
        }
    }

    pub async fn next(&mut self) -> Result<Option<WatchEvent>, Error> {
        let Some(l) = self.lines.next_line().await? else {
            return Ok(None);
        };
        serde_json::from_slice(&l)
            .map(Some)
            .map_err(|e| Error::Decode(format!("watch line: {e}")))
    }
}

type Ws = tokio_tungstenite::WebSocketStream<std::pin::Pin<Box<dyn crate::conn::Io>>>;

/// A process WebSocket: output frames in, stdin and control out.
pub struct WsSession {
    ws: Ws,
    pending: VecDeque<Output>,
}

pub async fn ws_connect(
    t: &Target,
    path: &str,
    headers: &[(&'static str, String)],
) -> Result<WsSession, Error> {
    let io = dial(t).await?;
    let mut req = tungstenite::client::IntoClientRequest::into_client_request(format!(
        "ws://{}{}",
        t.authority(),
        path
    ))
    .map_err(|e| Error::Transport(e.to_string()))?;
    for (k, v) in headers {
        req.headers_mut().insert(
            *k,
            v.parse()
                .map_err(|_| Error::Transport("bad header".into()))?,
        );
    }
    let (ws, resp) = match tokio_tungstenite::client_async(req, io).await {
        Ok(v) => v,
        Err(tungstenite::Error::Http(resp)) => {
            let status = resp.status();
            let body = resp.body().clone().unwrap_or_default();
            return Err(match serde_json::from_slice::<ErrorEnvelope>(&body) {
                Ok(e) => Error::Api {
                    status,
                    body: e.error,
                },
                Err(_) => Error::Transport(format!("WebSocket refused: HTTP {status}")),
            });
        }
        Err(e) => return Err(Error::Transport(e.to_string())),
    };
    let _ = resp;
    Ok(WsSession {
        ws,
        pending: VecDeque::new(),
    })
}

impl WsSession {
    /// The next text frame (`None` once the server closed).
    pub(crate) async fn next_text(&mut self) -> Result<Option<String>, Error> {
        while let Some(m) = self.ws.next().await {
            match m.map_err(|e| Error::Transport(e.to_string()))? {
                Message::Text(t) => return Ok(Some(t.to_string())),
                Message::Close(_) => return Ok(None),
                _ => {}
            }
        }
        Ok(None)
    }

    pub(crate) async fn send_json<T: serde::Serialize>(&mut self, v: &T) -> Result<(), Error> {
        let s = serde_json::to_string(v).map_err(|e| Error::Decode(e.to_string()))?;
        self.ws
            .send(Message::Text(s.into()))
            .await
            .map_err(|e| Error::Transport(e.to_string()))
    }

    /// Sends `data` to the process's stdin, in messages of at most 64 KiB (the
    /// daemon takes no message larger than a request body, 1 MiB by default).
    pub async fn write_stdin(&mut self, data: &[u8]) -> Result<(), Error> {
        for chunk in data.chunks(STDIN_MESSAGE) {
            self.ws
                .send(Message::Binary(Bytes::copy_from_slice(chunk)))
                .await
                .map_err(|e| Error::Transport(e.to_string()))?;
        }
        Ok(())
    }

    pub async fn close_stdin(&mut self) -> Result<(), Error> {
        self.send_json(&serde_json::json!({"type": "stdin_close"}))
            .await
    }

    pub async fn resize(&mut self, rows: u16, cols: u16) -> Result<(), Error> {
        self.send_json(&serde_json::json!({"type": "resize", "rows": rows, "cols": cols}))
            .await
    }

    pub async fn signal(&mut self, sig: &str) -> Result<(), Error> {
        self.send_json(&serde_json::json!({"type": "signal", "signal": sig}))
            .await
    }

    /// The first control message (`started` or `attached`) or output; None at the end.
    pub async fn next_event(&mut self) -> Result<Option<StreamEvent>, Error> {
        loop {
            match self.ws.next().await {
                None => return Ok(None),
                Some(Err(tungstenite::Error::ConnectionClosed)) => return Ok(None),
                Some(Err(e)) => return Err(Error::Transport(e.to_string())),
                Some(Ok(Message::Text(t))) => {
                    let ev: StreamEvent = serde_json::from_str(t.as_str())
                        .map_err(|e| Error::Decode(e.to_string()))?;
                    if let StreamEvent::Error { error } = ev {
                        return Err(Error::Api {
                            status: http::StatusCode::INTERNAL_SERVER_ERROR,
                            body: error,
                        });
                    }
                    return Ok(Some(ev));
                }
                Some(Ok(Message::Binary(mut b))) => {
                    if b.is_empty() {
                        continue;
                    }
                    let s = b[0];
                    b.advance(1);
                    let data = base64::engine::general_purpose::STANDARD.encode(&b);
                    return Ok(Some(match s {
                        1 => StreamEvent::Stdout { offset: 0, data },
                        _ => StreamEvent::Stderr { offset: 0, data },
                    }));
                }
                Some(Ok(Message::Close(_))) => return Ok(None),
                Some(Ok(_)) => continue,
            }
        }
    }

    /// The next output (raw bytes) or exit; skips control messages.
    pub async fn next(&mut self) -> Result<Option<Output>, Error> {
        if let Some(o) = self.pending.pop_front() {
            return Ok(Some(o));
        }
        loop {
            match self.ws.next().await {
                None | Some(Err(tungstenite::Error::ConnectionClosed)) => return Ok(None),
                Some(Err(e)) => return Err(Error::Transport(e.to_string())),
                Some(Ok(Message::Binary(mut b))) => {
                    if b.is_empty() {
                        continue;
                    }
                    let s = b[0];
                    b.advance(1);
                    return Ok(Some(if s == 1 {
                        Output::Stdout(0, b.to_vec())
                    } else {
                        Output::Stderr(0, b.to_vec())
                    }));
                }
                Some(Ok(Message::Text(t))) => {
                    match serde_json::from_str::<StreamEvent>(t.as_str())
                        .map_err(|e| Error::Decode(e.to_string()))?
                    {
                        StreamEvent::Exit { exit } => return Ok(Some(Output::Exit(exit))),
                        StreamEvent::Error { error } => {
                            return Err(Error::Api {
                                status: http::StatusCode::INTERNAL_SERVER_ERROR,
                                body: error,
                            })
                        }
                        _ => continue,
                    }
                }
                Some(Ok(Message::Close(_))) => return Ok(None),
                Some(Ok(_)) => continue,
            }
        }
    }
}
