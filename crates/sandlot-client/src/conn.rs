//! Connections: Unix socket or TCP, one HTTP/1.1 connection per request.

use std::path::PathBuf;
use std::pin::Pin;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;

use crate::Error;

/// Where the daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Unix(PathBuf),
    /// `host:port`.
    Tcp(String),
}

impl Target {
    /// `unix:///run/sandlot/sandlot.sock`, `/path.sock`, `http://127.0.0.1:7070`
    /// or `127.0.0.1:7070`.
    pub fn parse(s: &str) -> Result<Target, Error> {
        let s = s.trim();
        if let Some(p) = s.strip_prefix("unix://") {
            if p.starts_with('/') {
                return Ok(Target::Unix(PathBuf::from(p)));
            }
            return Err(Error::BadHost(s.to_string()));
        }
        if s.starts_with('/') {
            return Ok(Target::Unix(PathBuf::from(s)));
        }
        let hp = s.strip_prefix("http://").unwrap_or(s).trim_end_matches('/');
        if s.starts_with("https://") || hp.is_empty() || hp.contains('/') {
            return Err(Error::BadHost(s.to_string()));
        }
        let hp = if hp
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            hp.to_string()
        } else {
            format!("{hp}:7070")
        };
        Ok(Target::Tcp(hp))
    }

    pub fn authority(&self) -> &str {
        match self {
            Target::Unix(_) => "localhost",
            Target::Tcp(hp) => hp,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Unix(p) => write!(f, "unix://{}", p.display()),
            Target::Tcp(hp) => write!(f, "http://{hp}"),
        }
    }
}

pub trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}

pub async fn dial(t: &Target) -> Result<Pin<Box<dyn Io>>, Error> {
    let err = |e: std::io::Error| Error::Connect {
        target: t.to_string(),
        message: e.to_string(),
    };
    Ok(match t {
        Target::Unix(p) => Box::pin(tokio::net::UnixStream::connect(p).await.map_err(err)?),
        Target::Tcp(hp) => {
            let s = tokio::net::TcpStream::connect(hp.as_str())
                .await
                .map_err(err)?;
            let _ = s.set_nodelay(true);
            Box::pin(s)
        }
    })
}

pub type ReqBody = BoxBody<Bytes, std::io::Error>;

pub fn empty() -> ReqBody {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}

pub fn full(b: Vec<u8>) -> ReqBody {
    Full::new(Bytes::from(b))
        .map_err(|never| match never {})
        .boxed()
}

pub fn streaming<S>(s: S) -> ReqBody
where
    S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + Sync + 'static,
{
    use futures_util::StreamExt;
    BodyExt::boxed(StreamBody::new(s.map(|r| r.map(Frame::data))))
}

pub async fn request(
    t: &Target,
    method: Method,
    path: &str,
    headers: &[(&'static str, String)],
    ctype: Option<&str>,
    body: ReqBody,
) -> Result<http::Response<hyper::body::Incoming>, Error> {
    let io = dial(t).await?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| Error::Transport(e.to_string()))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header("host", t.authority());
    for (k, v) in headers {
        b = b.header(*k, v);
    }
    if let Some(c) = ctype {
        b = b.header("content-type", c);
    }
    let req = b.body(body).map_err(|e| Error::Transport(e.to_string()))?;
    send.send_request(req)
        .await
        .map_err(|e| Error::Transport(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_parse() {
        assert_eq!(
            Target::parse("unix:///a/b.sock").unwrap(),
            Target::Unix("/a/b.sock".into())
        );
        assert_eq!(
            Target::parse("/a.sock").unwrap(),
            Target::Unix("/a.sock".into())
        );
        assert_eq!(
            Target::parse("http://127.0.0.1:7070/").unwrap(),
            Target::Tcp("127.0.0.1:7070".into())
        );
        assert_eq!(
            Target::parse("localhost").unwrap(),
            Target::Tcp("localhost:7070".into())
        );
        assert!(Target::parse("https://x").is_err());
        assert!(Target::parse("unix://rel").is_err());
        assert!(Target::parse("http://a/b").is_err());
    }
}
