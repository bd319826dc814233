//! Connections: Unix socket or TCP, HTTP/1.1 with keep-alive. A client keeps the
//! connections of its finished requests and sends its next requests on them
//! (connecting and the daemon's accept cost about as much as a small request).
//!
//! A request is only ever sent on a kept connection that is idle (its previous
//! answer was read to the end). If that connection turns out to be closed before
//! the request was written, the request goes on a new connection; once written,
//! it is never sent twice (a POST may not be repeated). Connections are kept only
//! under multi-thread runtimes (see `Conns::keep`).
//!
//! A connection turns idle when its task, on some worker thread, has seen the end
//! of the answer. A request made in the instant after the caller read that end may
//! find no idle connection and open a new one; that one is kept too (at most
//! `MAX_KEPT` in all). Waiting for the busy one instead could wait on a stream.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;

use crate::Error;

/// Where the daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Unix(PathBuf),
    /// `host:port`.
    Tcp(String),
    /// The daemon's own router, in the same process ([`crate::Client::in_process`]).
    InProcess,
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
            Target::Unix(_) | Target::InProcess => "localhost",
            Target::Tcp(hp) => hp,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Unix(p) => write!(f, "unix://{}", p.display()),
            Target::Tcp(hp) => write!(f, "http://{hp}"),
            Target::InProcess => f.write_str("in-process"),
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
        Target::InProcess => {
            return Err(Error::Connect {
                target: t.to_string(),
                message: "an in-process client has no connection (WebSockets are not available)"
                    .into(),
            })
        }
    })
}

pub type ReqBody = BoxBody<Bytes, std::io::Error>;

/// An error of a response body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of an answer, from a connection or from an in-process [`Dispatch`].
pub type RespBody = UnsyncBoxBody<Bytes, BoxError>;

/// Where an in-process client's requests go: the daemon's own router, called with
/// each request as it would arrive on a connection (headers, the bearer token
/// included), so every check of the API applies to it.
pub trait Dispatch: Send + Sync + 'static {
    fn dispatch(
        &self,
        req: Request<ReqBody>,
    ) -> Pin<Box<dyn Future<Output = http::Response<RespBody>> + Send>>;
}

fn boxed_incoming(resp: http::Response<hyper::body::Incoming>) -> http::Response<RespBody> {
    resp.map(|b| b.map_err(|e| Box::new(e) as BoxError).boxed_unsync())
}

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

type Sender = hyper::client::conn::http1::SendRequest<ReqBody>;

/// Connections kept per client (beyond them the oldest is closed).
const MAX_KEPT: usize = 16;
/// A connection unused for this long is closed rather than reused (servers close
/// idle connections after a while: the daemon's TCP listeners after
/// `connections.idle_timeout`, 60 s by default; proxies may sooner).
const KEEP_FOR: Duration = Duration::from_secs(15);

/// A daemon and the connections to it that a client keeps. Clones share them.
#[derive(Clone)]
pub struct Conns {
    target: Target,
    kept: Arc<Mutex<Vec<(Sender, Instant)>>>,
    /// For [`Target::InProcess`]: where the requests go.
    dispatch: Option<Arc<dyn Dispatch>>,
}

impl std::fmt::Debug for Conns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conns")
            .field("target", &self.target)
            .field("kept", &self.kept().len())
            .finish()
    }
}

impl Conns {
    pub fn new(target: Target) -> Conns {
        Conns {
            target,
            kept: Arc::default(),
            dispatch: None,
        }
    }

    /// Requests go to `dispatch`, in this process.
    pub fn in_process(dispatch: Arc<dyn Dispatch>) -> Conns {
        Conns {
            target: Target::InProcess,
            kept: Arc::default(),
            dispatch: Some(dispatch),
        }
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Vec<(Sender, Instant)>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Open connections kept now.
    pub fn kept_count(&self) -> usize {
        let mut kept = self.kept();
        kept.retain(|(s, _)| !s.is_closed());
        kept.len()
    }

    /// The most recently used kept connection that is idle now. Closed and stale
    /// ones are dropped; busy ones (an answer still streaming) stay.
    fn take_idle(&self) -> Option<Sender> {
        let mut kept = self.kept();
        kept.retain(|(s, at)| !s.is_closed() && at.elapsed() < KEEP_FOR);
        let i = kept.iter().rposition(|(s, _)| s.is_ready())?;
        Some(kept.remove(i).0)
    }

    fn keep(&self, s: Sender) {
        // A connection is driven by a task of the runtime that opened it. A
        // current-thread runtime runs that task only inside its `block_on`, so a
        // connection kept from one could hang a request made from another runtime:
        // only multi-thread runtimes (which drive their tasks while they live, and
        // close them when dropped) keep connections.
        let drives_tasks = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() != tokio::runtime::RuntimeFlavor::CurrentThread);
        if !drives_tasks {
            return;
        }
        let mut kept = self.kept();
        kept.push((s, Instant::now()));
        if kept.len() > MAX_KEPT {
            kept.remove(0);
        }
    }

    async fn connect(&self) -> Result<Sender, Error> {
        let io = dial(&self.target).await?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| Error::Transport(e.to_string()))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(send)
    }

    /// Sends a request on a kept idle connection or a new one; the connection is
    /// kept for later requests once the answer's head arrived.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        headers: &[(&'static str, String)],
        ctype: Option<&str>,
        body: ReqBody,
    ) -> Result<http::Response<RespBody>, Error> {
        let mut b = Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.target.authority());
        for (k, v) in headers {
            b = b.header(*k, v);
        }
        if let Some(c) = ctype {
            b = b.header("content-type", c);
        }
        let mut req = b.body(body).map_err(|e| Error::Transport(e.to_string()))?;
        if let Some(d) = &self.dispatch {
            return Ok(d.dispatch(req).await);
        }
        while let Some(mut s) = self.take_idle() {
            match s.try_send_request(req).await {
                Ok(resp) => {
                    self.keep(s);
                    return Ok(boxed_incoming(resp));
                }
                Err(mut e) => match e.take_message() {
                    // Closed before the request was written: try another.
                    Some(r) => req = r,
                    None => return Err(Error::Transport(e.into_error().to_string())),
                },
            }
        }
        let mut s = self.connect().await?;
        let resp = s
            .send_request(req)
            .await
            .map_err(|e| Error::Transport(e.to_string()))?;
        self.keep(s);
        Ok(boxed_incoming(resp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// How the test server answers: `Full` sends whole answers and keeps the
    /// connection; `CloseAfterOne` closes it after the first answer (no
    /// `Connection: close`); `HoldFirst` leaves the first answer's body unfinished.
    #[derive(Clone, Copy, PartialEq)]
    enum Serve {
        Full,
        CloseAfterOne,
        HoldFirst,
    }

    /// A small HTTP/1.1 server on a Unix socket that counts its connections.
    async fn server(mode: Serve) -> (Conns, Arc<AtomicUsize>, tempdir::Dir) {
        let dir = tempdir::Dir::new();
        let path = dir.0.join("s.sock");
        let l = tokio::net::UnixListener::bind(&path).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let n = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut c, _) = l.accept().await.unwrap();
                let first_conn = n.fetch_add(1, Ordering::SeqCst) == 0;
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut answered = 0;
                    loop {
                        let mut b = [0u8; 1024];
                        let k = c.read(&mut b).await.unwrap_or(0);
                        if k == 0 {
                            return;
                        }
                        buf.extend_from_slice(&b[..k]);
                        while let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..i + 4);
                            answered += 1;
                            if mode == Serve::HoldFirst && first_conn && answered == 1 {
                                let _ = c
                                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nok")
                                    .await;
                                tokio::time::sleep(Duration::from_secs(60)).await;
                                return;
                            }
                            let _ = c
                                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                                .await;
                            if mode == Serve::CloseAfterOne {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (Conns::new(Target::Unix(path)), accepted, dir)
    }

    async fn get(c: &Conns) -> Vec<u8> {
        let r = c
            .request(Method::GET, "/x", &[], None, empty())
            .await
            .unwrap();
        r.into_body().collect().await.unwrap().to_bytes().to_vec()
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                let p = std::env::temp_dir().join(format!(
                    "sandlot-conn-test-{}-{:?}",
                    std::process::id(),
                    std::thread::current().id()
                ));
                let _ = std::fs::remove_dir_all(&p);
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn current_thread_runtimes_keep_no_connections() {
        // The server runs on its own runtime throughout.
        let srv = rt();
        let (c, accepted, _d) = srv.block_on(server(Serve::Full));
        let current = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        current.block_on(async {
            for _ in 0..2 {
                assert_eq!(get(&c).await, b"ok");
            }
        });
        assert_eq!(c.kept_count(), 0);
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        // `current` is alive but idle: a request from another runtime must not
        // wait for it to drive a connection.
        rt().block_on(async {
            let r = tokio::time::timeout(Duration::from_secs(5), get(&c)).await;
            assert_eq!(r.expect("the request did not hang"), b"ok");
        });
        drop(current);
    }

    /// Waits until a kept connection is idle. The caller has read its answer to the
    /// end, but the connection's task, on another worker, may not have seen that
    /// end yet; a request sent in that instant opens a new connection (CI under
    /// load showed it). Waiting makes the reuse check deterministic.
    async fn until_idle(c: &Conns) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !c.kept().iter().any(|(s, _)| s.is_ready()) {
            assert!(Instant::now() < deadline, "no kept connection became idle");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[test]
    fn sequential_requests_share_one_connection() {
        rt().block_on(async {
            let (c, accepted, _d) = server(Serve::Full).await;
            for _ in 0..5 {
                assert_eq!(get(&c).await, b"ok");
                until_idle(&c).await;
            }
            assert_eq!(accepted.load(Ordering::SeqCst), 1);
            assert_eq!(c.kept_count(), 1);
            // Clones share the kept connection.
            assert_eq!(get(&c.clone()).await, b"ok");
            assert_eq!(accepted.load(Ordering::SeqCst), 1);
        });
    }

    #[test]
    fn a_connection_the_server_closed_is_not_reused() {
        rt().block_on(async {
            let (c, accepted, _d) = server(Serve::CloseAfterOne).await;
            for i in 1..=3 {
                assert_eq!(get(&c).await, b"ok");
                // The server's close reaches the kept connection.
                tokio::time::sleep(Duration::from_millis(50)).await;
                assert_eq!(accepted.load(Ordering::SeqCst), i);
            }
            assert_eq!(c.kept_count(), 0, "closed connections are dropped");
        });
    }

    #[test]
    fn a_connection_still_streaming_an_answer_is_not_reused() {
        rt().block_on(async {
            let (c, accepted, _d) = server(Serve::HoldFirst).await;
            let held = c
                .request(Method::GET, "/slow", &[], None, empty())
                .await
                .unwrap();
            // The first answer's body is unfinished: the next request must not queue
            // behind it.
            let next = tokio::time::timeout(Duration::from_secs(5), get(&c))
                .await
                .expect("the second request did not wait for the first answer");
            assert_eq!(next, b"ok");
            assert_eq!(accepted.load(Ordering::SeqCst), 2);
            drop(held);
        });
    }

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
