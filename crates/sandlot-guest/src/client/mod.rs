//! Host-side client of the guest protocol: async (tokio), generic over the byte
//! stream (a Unix socket via [`GuestClient::connect`], anything else via
//! [`GuestClient::from_stream`]).
//!
//! One connection multiplexes any number of concurrent operations. Every stream
//! is flow-controlled: the client grants the agent credit only as the caller
//! consumes output, so a caller that stops reading a process's output makes that
//! process block (and nothing else), and memory stays bounded on both sides.

mod files;
mod process;

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Notify};
use tokio::task::AbortHandle;

pub use files::{DirListing, FileDownload, FileUpload, Watch};
pub use process::{EventObserver, Output, Process, ProcessEvent, ProcessStdin};
pub use sandlot_proto::guest::{
    AttachRequest, DirEntry, ErrorBody, ErrorCode, ExecRequest, ExitStatus, FileKind, FileStat,
    Hello, ListDirRequest, MkdirRequest, ProcessId, ProcessInfo, PtySize, ReadFileRequest,
    RemoveRequest, RenameRequest, StatRequest, StreamInfo, WatchEvent, WatchEventKind,
    WatchRequest, WriteFileRequest,
};

use sandlot_proto::guest::{
    parse_data, parse_eof, parse_window, stream, ConfigureRequest, FrameKind, MemoryVictim, Reply,
    Request, ResizeRequest, SignalRequest,
};

use crate::wire::{self, Frame, FrameReader};

/// Credit granted per output stream (stdout, stderr, file content).
pub(crate) const OUTPUT_WINDOW: u32 = 256 * 1024;

/// How long the agent has to answer the client's hello. A legitimate agent sends
/// its own hello as soon as the connection is accepted.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Channels open at once on one connection, counting those cancelled by the client
/// whose END the agent has not sent yet (the agent has the same limit).
pub const MAX_CHANNELS: usize = 4096;

/// Processes one `list_processes` may report: as many as an agent tracks (running
/// ones, and finished ones whose exit status is not collected yet).
pub const MAX_LISTED_PROCESSES: usize = 16_384 + 1_024;

/// JSON bytes of the replies of one `list_processes`, all batches together.
pub const MAX_PROCESS_LIST_BYTES: usize = 16 << 20;

/// Bytes of client-to-agent frames queued for the connection (or being written)
/// beyond which stdin and upload writers wait: an agent that grants credit but does
/// not read its socket cannot make the client buffer without bound.
pub(crate) const OUT_HIGH_WATER: usize = 1 << 20;

/// Longest hello field the client accepts (the software string, each capability),
/// and how many capabilities.
const MAX_HELLO_STRING: usize = 256;
const MAX_HELLO_CAPABILITIES: usize = 64;

/// Errors of the guest client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connecting to the guest agent at {path}: {source}")]
    Connect {
        path: std::path::PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("guest connection: {0}")]
    Io(#[from] io::Error),
    #[error("guest protocol violation: {0}")]
    Protocol(String),
    #[error("guest agent protocol version mismatch: {0}")]
    UnsupportedVersion(String),
    /// The agent refused or failed the operation.
    #[error("{message}")]
    Remote {
        op: &'static str,
        code: ErrorCode,
        message: String,
    },
    #[error("guest connection closed: {0}")]
    Closed(Arc<str>),
    #[error("the guest agent did not answer the handshake within {0:?}")]
    HandshakeTimeout(std::time::Duration),
    /// A detached process has no output or status on its exec channel: attach to it.
    #[error("process {0} was started detached: attach to it to stream output or wait")]
    Detached(ProcessId),
}

impl ClientError {
    /// The agent's error code, for errors the agent reported.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Remote { code, .. } => Some(*code),
            ClientError::UnsupportedVersion(_) => Some(ErrorCode::UnsupportedVersion),
            _ => None,
        }
    }

    fn remote(op: &'static str, e: ErrorBody) -> ClientError {
        ClientError::Remote {
            op,
            code: e.code,
            message: e.message,
        }
    }
}

/// What a channel receives.
pub(crate) enum Event {
    Reply(Reply),
    Data(u8, Bytes),
    Eof,
    End,
}

/// Credit the agent granted for client-to-agent data on one channel.
pub(crate) struct InputCredit {
    st: Mutex<InputState>,
}

struct InputState {
    credit: u64,
    waker: Option<Waker>,
    closed: Option<Arc<str>>,
}

impl InputCredit {
    fn new() -> Arc<InputCredit> {
        Arc::new(InputCredit {
            st: Mutex::new(InputState {
                credit: 0,
                waker: None,
                closed: None,
            }),
        })
    }

    fn add(&self, n: u64) {
        let mut st = lock(&self.st);
        st.credit = st.credit.saturating_add(n);
        if let Some(w) = st.waker.take() {
            w.wake();
        }
    }

    fn close(&self, why: Arc<str>) {
        let mut st = lock(&self.st);
        if st.closed.is_none() {
            st.closed = Some(why);
        }
        if let Some(w) = st.waker.take() {
            w.wake();
        }
    }

    /// Takes up to `max` bytes of credit, waiting for some.
    pub(crate) fn poll_take(
        &self,
        cx: &mut Context<'_>,
        max: usize,
    ) -> Poll<Result<usize, Arc<str>>> {
        let mut st = lock(&self.st);
        if let Some(why) = &st.closed {
            return Poll::Ready(Err(why.clone()));
        }
        if st.credit == 0 {
            st.waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = (st.credit as usize).min(max);
        st.credit -= n as u64;
        Poll::Ready(Ok(n))
    }
}

struct Slot {
    /// None once the caller dropped the channel (frames are discarded until END).
    tx: Option<mpsc::UnboundedSender<Event>>,
    input: Option<Arc<InputCredit>>,
    /// Output credit granted and not yet used, for streams 1 and 2.
    credit: [u64; 2],
    /// EOF seen on streams 1 and 2 (no DATA and no second EOF may follow).
    eof: [bool; 2],
    /// Replies the agent may still send on this channel, and their JSON bytes:
    /// replies are not flow-controlled, so an agent that sent more than its
    /// operation has could fill the channel's queue without bound.
    replies_left: usize,
    reply_bytes_left: usize,
}

/// How many replies, and how many bytes of them, the operation of `req` may get.
fn reply_budget(req: &Request) -> (usize, usize) {
    use sandlot_proto::guest::MAX_PAYLOAD;
    let n = match req {
        Request::ListProcesses {} => {
            return (MAX_LISTED_PROCESSES + 1, MAX_PROCESS_LIST_BYTES);
        }
        // The first reply, the exit (or write result), and an error.
        Request::Exec(_) | Request::Attach(_) | Request::WriteFile(_) => 3,
        // The first reply and an error cutting the stream.
        Request::ReadFile(_) | Request::ListDir(_) | Request::Watch(_) => 2,
        _ => 1,
    };
    (n, n * MAX_PAYLOAD)
}

struct ConnState {
    out: BytesMut,
    chans: HashMap<u32, Slot>,
    next_id: u32,
    closed: Option<Arc<str>>,
    /// Bytes the writer took from `out` and is writing.
    in_flight: usize,
    /// Input writers waiting for `out` to drain below [`OUT_HIGH_WATER`].
    out_waiters: Vec<Waker>,
}

impl ConnState {
    fn wake_out_waiters(&mut self) {
        for w in self.out_waiters.drain(..) {
            w.wake();
        }
    }
}

/// State shared by the connection's tasks and handles.
pub(crate) struct Conn {
    st: Mutex<ConnState>,
    writer_wake: Notify,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Conn {
    fn close(&self, why: Arc<str>) {
        let mut st = lock(&self.st);
        if st.closed.is_none() {
            st.closed = Some(why.clone());
        }
        for (_, slot) in st.chans.drain() {
            if let Some(i) = &slot.input {
                i.close(why.clone());
            }
            // Dropping the sender wakes the receiver, which reports the closure.
        }
        st.wake_out_waiters();
        drop(st);
        self.writer_wake.notify_one();
    }

    fn closed_err(&self) -> ClientError {
        let st = lock(&self.st);
        ClientError::Closed(
            st.closed
                .clone()
                .unwrap_or_else(|| Arc::from("the connection was dropped")),
        )
    }

    /// Queues frames built by `f` unless the connection is closed.
    fn send(&self, f: impl FnOnce(&mut BytesMut)) -> Result<(), ClientError> {
        let mut st = lock(&self.st);
        if let Some(why) = &st.closed {
            return Err(ClientError::Closed(why.clone()));
        }
        f(&mut st.out);
        drop(st);
        self.writer_wake.notify_one();
        Ok(())
    }

    fn dispatch(&self, f: Frame) -> Result<(), String> {
        let mut st = lock(&self.st);
        let chan = f.channel;
        let slot = match f.kind {
            FrameKind::GoAway => {
                let body: ErrorBody = serde_json::from_slice(&f.payload)
                    .map_err(|e| format!("invalid GOAWAY: {e}"))?;
                return Err(format!(
                    "the agent closed the connection: {} ({})",
                    body.message, body.code
                ));
            }
            FrameKind::Reply
            | FrameKind::Data
            | FrameKind::Eof
            | FrameKind::Window
            | FrameKind::End => match st.chans.get_mut(&chan) {
                Some(s) => s,
                None => return Err(format!("{:?} frame on unknown channel {chan}", f.kind)),
            },
            other => return Err(format!("{other:?} frames are sent by clients only")),
        };
        let ev = match f.kind {
            FrameKind::Reply => {
                if slot.replies_left == 0 || f.payload.len() > slot.reply_bytes_left {
                    return Err(format!(
                        "more replies on channel {chan} than its operation has"
                    ));
                }
                slot.replies_left -= 1;
                slot.reply_bytes_left -= f.payload.len();
                Event::Reply(
                    serde_json::from_slice(&f.payload)
                        .map_err(|e| format!("invalid reply on channel {chan}: {e}"))?,
                )
            }
            FrameKind::Data => {
                let (s, data) = parse_data(chan, &f.payload).map_err(|e| e.to_string())?;
                if s == stream::INPUT {
                    return Err(format!("DATA on stream 0 of channel {chan} from the agent"));
                }
                if slot.eof[s as usize - 1] {
                    return Err(format!("DATA after EOF on stream {s} of channel {chan}"));
                }
                let c = &mut slot.credit[s as usize - 1];
                if data.len() as u64 > *c {
                    return Err(format!(
                        "{} bytes on stream {s} of channel {chan} exceed the granted credit of {c}",
                        data.len()
                    ));
                }
                *c -= data.len() as u64;
                Event::Data(s, f.payload.slice(1..))
            }
            FrameKind::Eof => {
                let s = parse_eof(chan, &f.payload).map_err(|e| e.to_string())?;
                if s == stream::INPUT {
                    return Err(format!("EOF on stream 0 of channel {chan} from the agent"));
                }
                let seen = &mut slot.eof[s as usize - 1];
                if *seen {
                    return Err(format!("a second EOF on stream {s} of channel {chan}"));
                }
                *seen = true;
                Event::Eof
            }
            FrameKind::Window => {
                let (s, n) = parse_window(chan, &f.payload).map_err(|e| e.to_string())?;
                match (&slot.input, s) {
                    (Some(i), stream::INPUT) => i.add(u64::from(n)),
                    _ => {
                        return Err(format!(
                            "WINDOW for stream {s} of channel {chan}, which sends nothing there"
                        ))
                    }
                }
                return Ok(());
            }
            FrameKind::End => {
                let slot = st.chans.remove(&chan).expect("looked up above");
                if let Some(i) = slot.input {
                    i.close(Arc::from("the operation has ended"));
                }
                if let Some(tx) = slot.tx {
                    let _ = tx.send(Event::End);
                }
                return Ok(());
            }
            _ => unreachable!("filtered above"),
        };
        if let Some(tx) = &slot.tx {
            let _ = tx.send(ev);
        }
        Ok(())
    }
}

/// Owns the connection's tasks; dropped with the last client or stream handle.
pub(crate) struct Handle {
    conn: Arc<Conn>,
    tasks: Vec<AbortHandle>,
    peer: Hello,
    version: u32,
}

impl Drop for Handle {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A channel as seen by one operation.
pub(crate) struct Channel {
    h: Arc<Handle>,
    id: u32,
    rx: mpsc::UnboundedReceiver<Event>,
    done: bool,
}

impl Channel {
    /// Next event; `Event::End` once (then always End).
    pub(crate) async fn recv(&mut self) -> Result<Event, ClientError> {
        if self.done {
            return Ok(Event::End);
        }
        match self.rx.recv().await {
            Some(Event::End) => {
                self.done = true;
                Ok(Event::End)
            }
            Some(e) => Ok(e),
            None => {
                self.done = true;
                Err(self.h.conn.closed_err())
            }
        }
    }

    /// Grants the agent `n` more bytes of credit on `stream`.
    pub(crate) fn grant(&self, s: u8, n: u32) {
        if n == 0 || self.done {
            return;
        }
        let mut st = lock(&self.h.conn.st);
        if st.closed.is_some() {
            return;
        }
        if let Some(slot) = st.chans.get_mut(&self.id) {
            slot.credit[s as usize - 1] += u64::from(n);
            wire::put_window(&mut st.out, self.id, s, n);
            drop(st);
            self.h.conn.writer_wake.notify_one();
        }
    }

    pub(crate) fn id(&self) -> u32 {
        self.id
    }

    pub(crate) fn handle(&self) -> &Arc<Handle> {
        &self.h
    }

    /// Waits for END, discarding anything else (used after a final reply).
    pub(crate) async fn finish(&mut self) -> Result<(), ClientError> {
        loop {
            if let Event::End = self.recv().await? {
                return Ok(());
            }
        }
    }

    /// Expects one reply (an error reply becomes `Err`).
    pub(crate) async fn reply(&mut self, op: &'static str) -> Result<Reply, ClientError> {
        match self.recv().await? {
            Event::Reply(Reply::Error(e)) => {
                let _ = self.finish().await;
                Err(ClientError::remote(op, e))
            }
            Event::Reply(r) => Ok(r),
            Event::End => Err(ClientError::Protocol(format!(
                "{op}: the agent ended the operation without a reply"
            ))),
            Event::Data(..) | Event::Eof => Err(ClientError::Protocol(format!(
                "{op}: data before the first reply"
            ))),
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut st = lock(&self.h.conn.st);
        if st.closed.is_some() {
            return;
        }
        if let Some(slot) = st.chans.get_mut(&self.id) {
            slot.tx = None;
            wire::put_frame(&mut st.out, FrameKind::Cancel, self.id, &[]);
            drop(st);
            self.h.conn.writer_wake.notify_one();
        }
    }
}

/// Sends client-to-agent data on a channel within the agent's credit.
pub(crate) struct InputSink {
    h: Arc<Handle>,
    chan: u32,
    credit: Arc<InputCredit>,
    closed: bool,
}

impl InputSink {
    pub(crate) fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if self.closed {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "input already closed",
            )));
        }
        {
            let mut st = lock(&self.h.conn.st);
            if st.closed.is_none() && st.out.len() + st.in_flight >= OUT_HIGH_WATER {
                if !st.out_waiters.iter().any(|w| w.will_wake(cx.waker())) {
                    st.out_waiters.push(cx.waker().clone());
                }
                return Poll::Pending;
            }
        }
        let max = buf.len().min(sandlot_proto::guest::DATA_CHUNK);
        match self.credit.poll_take(cx, max) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(why)) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                why.to_string(),
            ))),
            Poll::Ready(Ok(n)) => {
                let chan = self.chan;
                match self
                    .h
                    .conn
                    .send(|out| wire::put_data(out, chan, stream::INPUT, &buf[..n]))
                {
                    Ok(()) => Poll::Ready(Ok(n)),
                    Err(e) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        e.to_string(),
                    ))),
                }
            }
        }
    }

    pub(crate) fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            let chan = self.chan;
            let _ = self
                .h
                .conn
                .send(|out| wire::put_eof(out, chan, stream::INPUT));
        }
    }

    /// Stops sending without closing the input (the channel is being cancelled).
    pub(crate) fn forget(&mut self) {
        self.closed = true;
    }

    pub(crate) async fn write_all(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let n = std::future::poll_fn(|cx| self.poll_write(cx, data)).await?;
            data = &data[n..];
        }
        Ok(())
    }
}

impl Drop for InputSink {
    fn drop(&mut self) {
        self.close();
    }
}

/// A connection to a guest agent. Cheap to clone; all clones share the connection,
/// which closes when the last clone and the last stream handle are dropped.
#[derive(Clone)]
pub struct GuestClient {
    h: Arc<Handle>,
}

impl std::fmt::Debug for GuestClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestClient")
            .field("agent", &self.h.peer.software)
            .field("version", &self.h.version)
            .finish()
    }
}

impl GuestClient {
    /// Connects to an agent's Unix socket and performs the handshake. The socket
    /// itself is opened first without following a link, and connected to through
    /// that descriptor: a gVisor sandbox can write the directory its agent's socket
    /// is in, and a link it put there in the socket's place (to another sandbox's
    /// agent) is refused instead of followed. Connecting and the handshake together
    /// take at most [`HANDSHAKE_TIMEOUT`].
    pub async fn connect(path: &Path) -> Result<GuestClient, ClientError> {
        let connect = async {
            let err = |source| ClientError::Connect {
                path: path.to_path_buf(),
                source,
            };
            let pinned = open_socket_nofollow(path).map_err(err)?;
            let s =
                tokio::net::UnixStream::connect(format!("/proc/self/fd/{}", pinned.as_raw_fd()))
                    .await
                    .map_err(err)?;
            drop(pinned);
            GuestClient::handshake(s).await
        };
        tokio::time::timeout(HANDSHAKE_TIMEOUT, connect)
            .await
            .unwrap_or(Err(ClientError::HandshakeTimeout(HANDSHAKE_TIMEOUT)))
    }

    /// Performs the handshake over any byte stream (vsock, stdio, a test duplex).
    ///
    /// The agent has [`HANDSHAKE_TIMEOUT`] to answer: a silent one fails the
    /// handshake instead of holding the caller forever.
    pub async fn from_stream<S>(s: S) -> Result<GuestClient, ClientError>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        tokio::time::timeout(HANDSHAKE_TIMEOUT, GuestClient::handshake(s))
            .await
            .unwrap_or(Err(ClientError::HandshakeTimeout(HANDSHAKE_TIMEOUT)))
    }

    async fn handshake<S>(s: S) -> Result<GuestClient, ClientError>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (rd, mut wr) = tokio::io::split(s);
        let ours = Hello::current(crate::software(), &[]);
        let mut buf = BytesMut::new();
        wire::put_json(&mut buf, FrameKind::Hello, 0, "hello", &ours)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        wr.write_all(&buf).await?;
        let mut fr = FrameReader::new(rd);
        let first = fr
            .next()
            .await
            .map_err(|e| ClientError::Protocol(e.to_string()))?
            .ok_or_else(|| {
                ClientError::Closed(Arc::from(
                    "the agent closed the connection during the handshake",
                ))
            })?;
        let peer: Hello = match first.kind {
            FrameKind::Hello => serde_json::from_slice(&first.payload)
                .map_err(|e| ClientError::Protocol(format!("invalid HELLO from the agent: {e}")))?,
            FrameKind::GoAway => {
                let body: ErrorBody = serde_json::from_slice(&first.payload)
                    .map_err(|e| ClientError::Protocol(format!("invalid GOAWAY: {e}")))?;
                return Err(match body.code {
                    ErrorCode::UnsupportedVersion => ClientError::UnsupportedVersion(body.message),
                    _ => ClientError::Closed(Arc::from(body.message.as_str())),
                });
            }
            other => {
                return Err(ClientError::Protocol(format!(
                    "expected HELLO from the agent, got {other:?}"
                )))
            }
        };
        check_hello(&peer)?;
        let version = ours
            .negotiate(&peer)
            .map_err(ClientError::UnsupportedVersion)?;
        let conn = Arc::new(Conn {
            st: Mutex::new(ConnState {
                out: BytesMut::new(),
                chans: HashMap::new(),
                next_id: 1,
                closed: None,
                in_flight: 0,
                out_waiters: Vec::new(),
            }),
            writer_wake: Notify::new(),
        });
        let reader = tokio::spawn(read_loop(conn.clone(), fr));
        let writer = tokio::spawn(write_loop(conn.clone(), wr));
        Ok(GuestClient {
            h: Arc::new(Handle {
                conn,
                tasks: vec![reader.abort_handle(), writer.abort_handle()],
                peer,
                version,
            }),
        })
    }

    /// The agent's hello.
    pub fn agent_hello(&self) -> &Hello {
        &self.h.peer
    }

    /// The negotiated protocol version.
    pub fn protocol_version(&self) -> u32 {
        self.h.version
    }

    /// Opens a channel with `req`, granting `windows` up front.
    pub(crate) fn open(
        &self,
        req: &Request,
        windows: &[u8],
        input: bool,
    ) -> Result<(Channel, Option<Arc<InputCredit>>), ClientError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let credit = input.then(InputCredit::new);
        let mut st = lock(&self.h.conn.st);
        if let Some(why) = &st.closed {
            return Err(ClientError::Closed(why.clone()));
        }
        if st.chans.len() >= MAX_CHANNELS {
            return Err(ClientError::Remote {
                op: req.op(),
                code: ErrorCode::Limit,
                message: format!(
                    "{}: at most {MAX_CHANNELS} operations at once on a sandbox's agent",
                    req.op()
                ),
            });
        }
        let (replies_left, reply_bytes_left) = reply_budget(req);
        let mut id = st.next_id;
        while id == 0 || st.chans.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        st.next_id = id.wrapping_add(1);
        let mut buf = std::mem::take(&mut st.out);
        let res = wire::put_json(&mut buf, FrameKind::Request, id, "request", req);
        if let Err(e) = res {
            st.out = buf;
            return Err(ClientError::Protocol(e.to_string()));
        }
        let mut granted = [0u64; 2];
        for &s in windows {
            wire::put_window(&mut buf, id, s, OUTPUT_WINDOW);
            granted[s as usize - 1] += u64::from(OUTPUT_WINDOW);
        }
        st.out = buf;
        st.chans.insert(
            id,
            Slot {
                tx: Some(tx),
                input: credit.clone(),
                credit: granted,
                eof: [false; 2],
                replies_left,
                reply_bytes_left,
            },
        );
        drop(st);
        self.h.conn.writer_wake.notify_one();
        Ok((
            Channel {
                h: self.h.clone(),
                id,
                rx,
                done: false,
            },
            credit,
        ))
    }

    pub(crate) fn sink(&self, chan: &Channel, credit: Arc<InputCredit>) -> InputSink {
        InputSink {
            h: chan.handle().clone(),
            chan: chan.id(),
            credit,
            closed: false,
        }
    }

    /// A request answered by exactly one reply.
    async fn call(&self, req: Request) -> Result<Reply, ClientError> {
        let op = req.op();
        let (mut ch, _) = self.open(&req, &[], false)?;
        let r = ch.reply(op).await?;
        ch.finish().await?;
        Ok(r)
    }

    async fn call_ok(&self, req: Request) -> Result<(), ClientError> {
        let op = req.op();
        match self.call(req).await? {
            Reply::Ok => Ok(()),
            other => Err(unexpected(op, &other)),
        }
    }

    /// Replaces the defaults (environment, user, working directory) of processes
    /// started from now on.
    pub async fn configure(&self, c: ConfigureRequest) -> Result<(), ClientError> {
        self.call_ok(Request::Configure(c)).await
    }

    /// Checks that the agent answers.
    pub async fn ping(&self) -> Result<(), ClientError> {
        self.call_ok(Request::Ping {}).await
    }

    /// Asks the agent to close every connection (this one too) and its listening
    /// socket until it gets `SIGUSR1`. Returns once acknowledged.
    pub async fn quiesce(&self) -> Result<(), ClientError> {
        self.call_ok(Request::Quiesce {}).await
    }

    /// Asks the agent to kill the sandbox's largest process, its memory being past
    /// the declared limit ([`Request::RelieveMemory`]); the one it killed.
    pub async fn relieve_memory(&self) -> Result<Option<MemoryVictim>, ClientError> {
        match self.call(Request::RelieveMemory {}).await? {
            Reply::Relieved { victim } => Ok(victim),
            other => Err(unexpected("relieve_memory", &other)),
        }
    }

    /// Asks the agent to kill every process and stop. Returns once acknowledged.
    pub async fn shutdown(&self) -> Result<(), ClientError> {
        self.call_ok(Request::Shutdown {}).await
    }

    /// Sends `sig` to the process group of process `id`.
    pub async fn signal(&self, id: ProcessId, sig: i32) -> Result<(), ClientError> {
        self.call_ok(Request::Signal(SignalRequest { id, signal: sig }))
            .await
    }

    /// Changes the terminal size of a process started with a pty.
    pub async fn resize(&self, id: ProcessId, rows: u16, cols: u16) -> Result<(), ClientError> {
        self.call_ok(Request::Resize(ResizeRequest { id, rows, cols }))
            .await
    }

    /// Every process the agent still tracks: running ones, and finished ones whose
    /// exit status no client has received yet.
    pub async fn list_processes(&self) -> Result<Vec<ProcessInfo>, ClientError> {
        let (mut ch, _) = self.open(&Request::ListProcesses {}, &[], false)?;
        let mut all = Vec::new();
        loop {
            match ch.recv().await? {
                Event::Reply(Reply::Processes { processes }) => {
                    if all.len() + processes.len() > MAX_LISTED_PROCESSES {
                        return Err(ClientError::Protocol(format!(
                            "list_processes: more than {MAX_LISTED_PROCESSES} processes"
                        )));
                    }
                    all.extend(processes)
                }
                Event::Reply(Reply::Error(e)) => {
                    return Err(ClientError::remote("list_processes", e))
                }
                Event::End => return Ok(all),
                Event::Reply(other) => return Err(unexpected("list_processes", &other)),
                Event::Data(..) | Event::Eof => {
                    return Err(ClientError::Protocol(
                        "list_processes: unexpected data".into(),
                    ))
                }
            }
        }
    }

    /// Starts a process. Unless `req.detached`, the returned [`Process`] streams its
    /// output and exit status.
    pub async fn exec(&self, req: ExecRequest) -> Result<Process, ClientError> {
        let windows: &[u8] = if req.detached {
            &[]
        } else {
            &[stream::OUTPUT, stream::STDERR]
        };
        let detached = req.detached;
        let (mut ch, credit) = self.open(&Request::Exec(req), windows, !detached)?;
        match ch.reply("exec").await? {
            Reply::Started {
                id,
                pid,
                pty,
                stdin,
            } => {
                if detached {
                    ch.finish().await?;
                    return Ok(Process::detached(self.clone(), id, pid, pty));
                }
                let sink = match (stdin, credit) {
                    (true, Some(c)) => Some(self.sink(&ch, c)),
                    _ => None,
                };
                Ok(Process::streaming(
                    self.clone(),
                    ch,
                    id,
                    pid,
                    pty,
                    sink,
                    [0, 0],
                ))
            }
            other => Err(unexpected("exec", &other)),
        }
    }

    /// Re-attaches to a process: `from_offset` None streams only new output;
    /// `Some(n)` replays both stdout and stderr from byte offset `n` of each stream
    /// (`Some(0)`: from the start), within what is retained.
    pub async fn attach(
        &self,
        id: ProcessId,
        from_offset: Option<u64>,
    ) -> Result<Process, ClientError> {
        self.attach_with(AttachRequest {
            id,
            stdout_from: from_offset,
            stderr_from: from_offset,
        })
        .await
    }

    /// Like [`GuestClient::attach`] with separate offsets per stream.
    pub async fn attach_with(&self, req: AttachRequest) -> Result<Process, ClientError> {
        let (mut ch, credit) = self.open(
            &Request::Attach(req),
            &[stream::OUTPUT, stream::STDERR],
            true,
        )?;
        match ch.reply("attach").await? {
            Reply::Attached {
                id,
                pid,
                pty,
                stdin,
                stdout_from,
                stderr_from,
            } => {
                let sink = match (stdin, credit) {
                    (true, Some(c)) => Some(self.sink(&ch, c)),
                    _ => None,
                };
                Ok(Process::streaming(
                    self.clone(),
                    ch,
                    id,
                    pid,
                    pty,
                    sink,
                    [stdout_from, stderr_from],
                ))
            }
            other => Err(unexpected("attach", &other)),
        }
    }
}

/// Refuses a hello whose fields are larger than any agent sends: the client keeps
/// it for the connection's lifetime and its software string appears in messages.
fn check_hello(h: &Hello) -> Result<(), ClientError> {
    if h.software.len() > MAX_HELLO_STRING
        || h.capabilities.len() > MAX_HELLO_CAPABILITIES
        || h.capabilities.iter().any(|c| c.len() > MAX_HELLO_STRING)
    {
        return Err(ClientError::Protocol(format!(
            "the agent's HELLO is larger than allowed (software and capabilities at most \
             {MAX_HELLO_STRING} bytes each, at most {MAX_HELLO_CAPABILITIES} capabilities)"
        )));
    }
    Ok(())
}

pub(crate) fn unexpected(op: &str, r: &Reply) -> ClientError {
    ClientError::Protocol(format!("{op}: unexpected reply {r:?}"))
}

async fn read_loop<R: AsyncRead + Unpin>(conn: Arc<Conn>, mut fr: FrameReader<R>) {
    let why: String = loop {
        match fr.next().await {
            Ok(Some(f)) => {
                if let Err(e) = conn.dispatch(f) {
                    break e;
                }
            }
            Ok(None) => break "the agent closed the connection".into(),
            Err(e) => break e.to_string(),
        }
    };
    conn.close(Arc::from(why.as_str()));
}

async fn write_loop<W: AsyncWrite + Unpin>(conn: Arc<Conn>, mut wr: W) {
    loop {
        let next = {
            let mut st = lock(&conn.st);
            if st.out.is_empty() {
                if st.closed.is_some() {
                    break;
                }
                None
            } else {
                let b = st.out.split().freeze();
                st.in_flight = b.len();
                Some(b)
            }
        };
        match next {
            None => conn.writer_wake.notified().await,
            Some(b) => {
                if let Err(e) = wr.write_all(&b).await {
                    conn.close(Arc::from(format!("writing to the agent: {e}").as_str()));
                    break;
                }
                let mut st = lock(&conn.st);
                st.in_flight = 0;
                st.wake_out_waiters();
            }
        }
    }
    let _ = wr.shutdown().await;
}

/// `path` opened as a path only (`O_PATH | O_NOFOLLOW`), if it is a socket: a
/// link, or anything else, is refused.
fn open_socket_nofollow(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
        .open(path)?;
    if !f.metadata()?.file_type().is_socket() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a socket (a link is not followed)",
        ));
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sandbox that can write its agent socket's directory puts a link to
    /// another sandbox's agent there: the client refuses it rather than follow it.
    #[tokio::test]
    async fn a_link_in_place_of_the_agent_socket_is_never_followed() {
        let dir = std::env::temp_dir().join(format!("sandlot-guest-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let real = dir.join("victim.sock");
        let listener = tokio::net::UnixListener::bind(&real).unwrap();
        let link = dir.join("agent.sock");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = GuestClient::connect(&link).await.unwrap_err();
        assert!(matches!(e, ClientError::Connect { .. }), "{e}");
        // The socket itself is reached: the listener sees the connection (and
        // the handshake then fails, nobody answering it).
        let accept = tokio::spawn(async move { listener.accept().await.map(drop) });
        let e = GuestClient::connect(&real).await.unwrap_err();
        assert!(!matches!(e, ClientError::Connect { .. }), "{e}");
        accept.await.unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
