//! The agent: one single-threaded event loop serving every connection, process and
//! file operation of a sandbox.
//!
//! All state lives in [`Agent`], shared by the loop's tasks as `Rc<RefCell<_>>` and
//! never borrowed across an `.await`. Tasks exist only to wait for I/O (a socket, a
//! pipe, inotify, a timer, SIGCHLD); everything they learn is handed to synchronous
//! `Agent` methods that update state and queue frames ("pump").

mod conn;
mod files;
mod keyed_poll;
mod own_proc;
mod process;
mod reap;
mod relieve;
mod ring;
mod spawn;
mod stdin;
mod users;
mod watch;
mod workdir;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use sandlot_proto::guest::{ErrorBody, FrameKind, Reply, FIRST_PROCESS, HEADER_LEN};
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;
use tokio::task::{JoinHandle, LocalSet};

use crate::AgentConfig;
use sandlot_guest::wire;

pub(crate) use files::FsCreds;
pub(crate) use process::Proc;

/// Credit the agent grants a channel for a process's stdin.
pub(crate) const STDIN_WINDOW: u32 = 256 * 1024;
/// Credit the agent grants a write_file channel.
pub(crate) const WRITE_WINDOW: u32 = 512 * 1024;
/// Queued outgoing bytes per connection above which no more DATA is queued and no
/// more frames are read from the peer until the writer catches up.
pub(crate) const OUT_HIGH: usize = 512 * 1024;
pub(crate) const MAX_CHANNELS_PER_CONN: usize = 4096;
pub(crate) const MAX_PROCESSES: usize = 16_384;
/// Finished processes whose exit nobody has collected yet are kept (with their
/// retained output) up to these limits, oldest dropped first.
pub(crate) const MAX_FINISHED: usize = 1024;
pub(crate) const MAX_FINISHED_BYTES: usize = 64 << 20;
/// After a process exits, how long output still in flight (a terminal's buffer, a
/// descendant holding the pipe) may delay its exit report.
pub(crate) const LINGER: Duration = Duration::from_millis(100);
/// Readiness events the agent's event loop takes from the kernel at a time; more
/// wait for the next turn of the loop (a smaller buffer per sandbox).
const EVENTS_PER_TICK: usize = 64;
/// Smallest accepted output retention: below one chunk, a slow client could stall.
pub(crate) const MIN_RETENTION: usize = 64 * 1024;

/// A queued-output buffer of one connection.
pub(crate) struct OutBuf {
    pub buf: BytesMut,
    /// Bytes handed to the writer and not yet written.
    pub inflight: usize,
    pub writer: Rc<Notify>,
    /// Channels that had DATA to send while the buffer was full, in order.
    pub blocked: VecDeque<u32>,
    /// GOAWAY is queued: nothing may follow it.
    pub sealed: bool,
}

impl OutBuf {
    fn new() -> Self {
        OutBuf {
            buf: BytesMut::with_capacity(4096),
            inflight: 0,
            writer: Rc::new(Notify::new()),
            blocked: VecDeque::new(),
            sealed: false,
        }
    }

    pub fn full(&self) -> bool {
        self.buf.len() + self.inflight >= OUT_HIGH
    }

    pub fn block(&mut self, chan: u32) {
        if !self.blocked.contains(&chan) {
            self.blocked.push_back(chan);
        }
    }

    pub fn reply(&mut self, chan: u32, r: &Reply) {
        if self.sealed {
            return;
        }
        if let Err(e) = wire::put_json(&mut self.buf, FrameKind::Reply, chan, "reply", r) {
            let body = ErrorBody::new(sandlot_proto::guest::ErrorCode::Io, e.to_string());
            wire::put_json(
                &mut self.buf,
                FrameKind::Reply,
                chan,
                "reply",
                &Reply::Error(body),
            )
            .expect("small error reply encodes");
        }
        self.writer.notify_one();
    }

    pub fn error(&mut self, chan: u32, body: ErrorBody) {
        self.reply(chan, &Reply::Error(body));
        self.end(chan);
    }

    pub fn end(&mut self, chan: u32) {
        if self.sealed {
            return;
        }
        wire::put_frame(&mut self.buf, FrameKind::End, chan, &[]);
        self.writer.notify_one();
    }

    pub fn data(&mut self, chan: u32, stream: u8, data: &[u8]) {
        if self.sealed {
            return;
        }
        wire::put_data(&mut self.buf, chan, stream, data);
        self.writer.notify_one();
    }

    pub fn eof(&mut self, chan: u32, stream: u8) {
        if self.sealed {
            return;
        }
        wire::put_eof(&mut self.buf, chan, stream);
        self.writer.notify_one();
    }

    pub fn window(&mut self, chan: u32, stream: u8, n: u32) {
        if self.sealed {
            return;
        }
        wire::put_window(&mut self.buf, chan, stream, n);
        self.writer.notify_one();
    }

    pub fn goaway(&mut self, body: &ErrorBody) {
        if self.sealed {
            return;
        }
        let _ = wire::put_json(&mut self.buf, FrameKind::GoAway, 0, "goaway", body);
        self.sealed = true;
        self.writer.notify_one();
    }

    /// Free space for DATA payload before the buffer counts as full (at least a header).
    pub fn room(&self) -> usize {
        OUT_HIGH.saturating_sub(self.buf.len() + self.inflight + HEADER_LEN + 1)
    }
}

/// One connection.
pub(crate) struct Conn {
    pub out: OutBuf,
    pub chans: HashMap<u32, Chan>,
    /// Wakes the reader when the connection may read again or must close.
    pub reader: Rc<Notify>,
    /// GOAWAY queued or the peer is gone: read nothing more, close after flushing.
    pub closing: bool,
    /// Hello exchanged.
    pub ready: bool,
}

/// What a channel is doing.
pub(crate) enum Chan {
    Proc(process::ProcSub),
    Read(files::ReadStream),
    Write(files::WriteStream),
    List(files::ListStream),
    Watch(watch::WatchStream),
}

pub(crate) struct Settings {
    pub env: Vec<(String, String)>,
    pub default_user: String,
    pub default_cwd: Option<String>,
    pub retention: usize,
}

/// The buffer process output and file contents are read through, allocated at the
/// first read. An idle sandbox (a pooled one, or one that never ran anything) then
/// does not hold its 64 KiB: zeroed at the agent's start, they were about a quarter
/// of the agent's private memory (docs/benchmarks.md, density).
#[derive(Debug, Default)]
pub(crate) struct Scratch(Vec<u8>);

impl Scratch {
    /// The buffer, [`sandlot_proto::guest::DATA_CHUNK`] bytes long.
    pub fn get(&mut self) -> &mut [u8] {
        if self.0.is_empty() {
            self.0 = vec![0u8; sandlot_proto::guest::DATA_CHUNK];
        }
        &mut self.0
    }
}

pub(crate) struct Agent {
    pub settings: Settings,
    /// The agent is PID 1 of its pid namespace (reaps everything).
    pub pid1: bool,
    pub procs: BTreeMap<u64, Proc>,
    pub by_pid: HashMap<i32, u64>,
    /// Sessions of processes started (for orphan reaping when not PID 1).
    pub sessions: HashSet<i32>,
    pub session_order: VecDeque<i32>,
    pub conns: HashMap<u64, Conn>,
    pub next_conn: u64,
    pub next_proc: u64,
    /// Why the first command ([`crate::AgentConfig::first_exec`]) did not start: the
    /// answer to attaching to it.
    pub first_failed: Option<ErrorBody>,
    pub finished: VecDeque<u64>,
    pub scratch: Scratch,
    /// Stack of the child between clone and exec.
    pub stack: Box<[u8]>,
    pub users: users::UserDb,
    /// How children start at an OOM score of 0 (the agent's is protective).
    pub oom: spawn::ChildOomScore,
    pub fs: FsCreds,
    pub shutdown: Rc<Notify>,
    pub shutting_down: bool,
    /// A [`Request::Quiesce`](sandlot_proto::guest::Request) arrived.
    pub quiesce: Rc<Notify>,
    /// Something the agent cannot serve without failed: the main loop ends the
    /// agent.
    pub fatal: Rc<Fatal>,
    /// Weak self-reference for spawning tasks from synchronous methods.
    pub me: std::rc::Weak<RefCell<Agent>>,
    /// Where processes' pipes and terminals and file watches are waited on
    /// (made at the first use).
    keyed_poll: Option<Rc<keyed_poll::KeyedPoll>>,
}

pub(crate) type Shared = Rc<RefCell<Agent>>;

/// A failure after which the agent cannot go on serving (the task reading its
/// keyed epoll ended): the main loop kills every process and returns it as an
/// error, so that PID 1 exits with status 1 and the sandbox ends, its daemon
/// recording the exit, instead of hanging with processes nobody can reach.
#[derive(Debug, Default)]
pub(crate) struct Fatal {
    why: RefCell<Option<String>>,
    raised: Notify,
}

impl Fatal {
    /// Records `why` (the first reason raised is kept) and wakes the main loop.
    pub fn raise(&self, why: String) {
        self.why.borrow_mut().get_or_insert(why);
        // A permit stays stored while the main loop is busy elsewhere.
        self.raised.notify_one();
    }

    /// Waits until raised; the reason.
    async fn raised(&self) -> String {
        self.raised.notified().await;
        self.why.borrow().clone().unwrap_or_default()
    }
}

impl Agent {
    fn new(config: &mut AgentConfig, pid1: bool) -> Agent {
        Agent {
            settings: Settings {
                env: config.env.clone(),
                default_user: config.default_user.clone(),
                default_cwd: config.default_cwd.clone(),
                retention: config.output_retention.max(MIN_RETENTION),
            },
            pid1,
            procs: BTreeMap::new(),
            by_pid: HashMap::new(),
            sessions: HashSet::new(),
            session_order: VecDeque::new(),
            conns: HashMap::new(),
            next_conn: 1,
            next_proc: 1,
            first_failed: None,
            finished: VecDeque::new(),
            scratch: Scratch::default(),
            stack: vec![0u8; spawn::CHILD_STACK].into_boxed_slice(),
            users: users::UserDb::default(),
            oom: match config.oom_score_adj.take() {
                Some(fd) => spawn::ChildOomScore::Agent(std::fs::File::from(fd)),
                None => spawn::ChildOomScore::Child,
            },
            fs: FsCreds::new(),
            shutdown: Rc::new(Notify::new()),
            shutting_down: false,
            quiesce: Rc::new(Notify::new()),
            fatal: Rc::new(Fatal::default()),
            me: std::rc::Weak::new(),
            keyed_poll: None,
        }
    }

    /// The agent's keyed epoll (see [`keyed_poll`]), started at the first call.
    pub fn keyed_poll(&mut self) -> io::Result<Rc<keyed_poll::KeyedPoll>> {
        if let Some(p) = &self.keyed_poll {
            return Ok(p.clone());
        }
        let p = keyed_poll::KeyedPoll::start(self.fatal.clone())?;
        self.keyed_poll = Some(p.clone());
        Ok(p)
    }

    pub fn shared(&self) -> Shared {
        self.me
            .upgrade()
            .expect("agent alive while its methods run")
    }

    /// Starts the shutdown sequence (the main loop kills everything and returns).
    pub fn begin_shutdown(&mut self) {
        if !self.shutting_down {
            self.shutting_down = true;
            self.shutdown.notify_one();
        }
    }

    /// Runs `f` for each channel blocked on `conn`'s full buffer, in order, until the
    /// buffer fills again.
    pub fn pump_blocked(&mut self, conn: u64) {
        loop {
            let chan = match self.conns.get_mut(&conn) {
                Some(c) if !c.out.full() => match c.out.blocked.pop_front() {
                    Some(ch) => ch,
                    None => return,
                },
                _ => return,
            };
            self.pump(conn, chan);
        }
    }

    /// Sends whatever a channel can send now.
    pub fn pump(&mut self, conn: u64, chan: u32) {
        let kind = match self.conns.get(&conn).and_then(|c| c.chans.get(&chan)) {
            Some(Chan::Proc(_)) => 0,
            Some(Chan::Read(_)) => 1,
            Some(Chan::List(_)) => 2,
            Some(Chan::Watch(_)) => 3,
            Some(Chan::Write(_)) | None => return,
        };
        match kind {
            0 => self.pump_sub(conn, chan),
            1 => self.pump_read(conn, chan),
            2 => self.pump_list(conn, chan),
            _ => self.pump_watch(conn, chan),
        }
    }
}

/// Writes a diagnostic line to stderr, ignoring failures: the agent is PID 1 and
/// must not die because its stderr is closed or broken (`eprintln!` would panic).
macro_rules! log {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "sandlot-guest: {}", format_args!($($arg)*));
    }};
}
pub(crate) use log;

/// A process's pipe or terminal, registered with the agent's keyed epoll.
pub(crate) type Afd = Rc<keyed_poll::Polled<OwnedFd>>;

/// Types that own the descriptor they expose, so registering them is sound.
pub(crate) trait OwnsFd: AsFd + AsRawFd {}
impl OwnsFd for OwnedFd {}
impl OwnsFd for watch::InotifyFd {}

/// Registers an owned descriptor with the reactor.
pub(crate) fn register<T: OwnsFd>(t: T, interest: tokio::io::Interest) -> io::Result<AsyncFd<T>> {
    // SAFETY: `T` owns its descriptor: it stays open, refers to the same file and is
    // returned unchanged by as_raw_fd for as long as the AsyncFd holds it.
    unsafe { AsyncFd::register_with_interest(t, interest) }.map_err(io::Error::from)
}

pub(crate) fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(fd)?;
    rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK)?;
    Ok(())
}

pub(crate) fn spawn_task<F: std::future::Future<Output = ()> + 'static>(f: F) -> JoinHandle<()> {
    tokio::task::spawn_local(f)
}

/// Binds the agent's socket at `path` again, retrying (and saying why) until it
/// can, since something of the sandbox may be in the way; `None` on a shutdown.
async fn listen_again(
    path: &std::path::Path,
    shutdown: &Notify,
) -> Option<tokio::net::UnixListener> {
    loop {
        let _ = std::fs::remove_file(path);
        let bound = std::os::unix::net::UnixListener::bind(path).and_then(|l| {
            l.set_nonblocking(true)?;
            tokio::net::UnixListener::from_std(l)
        });
        match bound {
            Ok(l) => return Some(l),
            Err(e) => log!("listen again at {}: {e}; retrying", path.display()),
        }
        tokio::select! {
            _ = shutdown.notified() => return None,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// Closes every connection (each flushes what it has queued first) and waits,
/// briefly, until they are gone.
async fn close_connections(agent: &Shared) {
    for c in agent.borrow_mut().conns.values_mut() {
        c.closing = true;
        c.reader.notify_one();
        c.out.writer.notify_one();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while !agent.borrow().conns.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Ends the agent on a [`Fatal`]: logs why, kills every process; the error to
/// return.
fn fail(agent: &Shared, why: String) -> io::Error {
    log!("fatal: {why}; ending");
    agent.borrow_mut().kill_everything();
    io::Error::other(why)
}

/// Entry point behind [`crate::run_agent`].
pub(crate) fn run(
    listener: std::os::unix::net::UnixListener,
    config: AgentConfig,
) -> io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        // Readiness events taken per epoll_wait: the agent watches a handful of
        // descriptors; tokio's default (1,024) is a 12 KiB buffer in every sandbox.
        .max_io_events_per_tick(EVENTS_PER_TICK)
        .build()?;
    let local = LocalSet::new();
    local.block_on(&rt, main_loop(listener, config))
}

/// Starts the agent's first command ([`crate::AgentConfig::first_exec`]) as
/// [`FIRST_PROCESS`]: held until attached, or its failure kept for the attach.
fn start_first(agent: &mut Agent, req: &sandlot_proto::guest::ExecRequest) {
    match agent.exec(req) {
        Ok(id) => {
            if let Some(p) = agent.procs.get_mut(&id) {
                p.held = true;
            }
            if id != FIRST_PROCESS.0 {
                log!("the first command got process id {id}, not {FIRST_PROCESS}");
            }
        }
        Err(mut e) => {
            // As an exec request's error reads; and its id stays its own, so that
            // no later process answers for it.
            if !e.message.starts_with("exec") {
                e.message = format!("exec: {}", e.message);
            }
            agent.first_failed = Some(e);
            agent.next_proc = agent.next_proc.max(FIRST_PROCESS.0 + 1);
        }
    }
}

/// Sets SIGPIPE's disposition to ignored. (rustix has no signal dispositions.)
fn ignore_sigpipe() -> io::Result<()> {
    // SAFETY: setting a signal's disposition to SIG_IGN installs no handler code.
    if unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) } == libc::SIG_ERR {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

async fn main_loop(
    listener: std::os::unix::net::UnixListener,
    mut config: AgentConfig,
) -> io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};

    // A peer that vanishes must not kill the agent with SIGPIPE.
    ignore_sigpipe()?;
    let pid1 = rustix::process::getpid().is_init();
    if !pid1 {
        // Orphans of our processes come back to us instead of the host's init. (The
        // kernel reads the argument as a flag; rustix passes the pid given, 1 here.)
        rustix::process::set_child_subreaper(Some(rustix::process::Pid::INIT))?;
    }
    let mut sigchld = signal(SignalKind::child())?;
    // Where to listen again after a quiesce (the bound path).
    let listen_path = listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(std::path::Path::to_path_buf));
    // Installs the handler now, so that a SIGUSR1 never ends the agent; only a
    // receiver made at a quiesce (below) wakes it.
    drop(signal(SignalKind::user_defined1())?);
    listener.set_nonblocking(true)?;
    let mut listener = tokio::net::UnixListener::from_std(listener)?;

    let agent: Shared = Rc::new(RefCell::new(Agent::new(&mut config, pid1)));
    agent.borrow_mut().me = Rc::downgrade(&agent);
    agent.borrow_mut().ensure_default_cwd();
    if let Some(req) = config.first_exec.take() {
        start_first(&mut agent.borrow_mut(), &req);
    }
    let shutdown = agent.borrow().shutdown.clone();
    let quiesce = agent.borrow().quiesce.clone();
    let fatal = agent.borrow().fatal.clone();

    let lifeline = match config.lifeline {
        Some(fd) => Some(process::watch_lifeline(agent.clone(), fd)?),
        None => None,
    };
    // Children that exited before the signal stream existed (none normally).
    agent.borrow_mut().reap();

    loop {
        tokio::select! {
            biased;
            _ = shutdown.notified() => break,
            why = fatal.raised() => return Err(fail(&agent, why)),
            Some(()) = sigchld.recv() => agent.borrow_mut().reap(),
            _ = quiesce.notified() => {
                let Some(path) = &listen_path else {
                    log!("quiesce: the listening socket has no path; ignored");
                    continue;
                };
                drop(listener);
                close_connections(&agent).await;
                // A signal sent before this point is no answer.
                let mut wake = signal(SignalKind::user_defined1())?;
                // Processes run on; their exits are reaped meanwhile.
                let mut stop = false;
                loop {
                    tokio::select! {
                        biased;
                        _ = shutdown.notified() => { stop = true; break }
                        why = fatal.raised() => return Err(fail(&agent, why)),
                        Some(()) = sigchld.recv() => agent.borrow_mut().reap(),
                        _ = wake.recv() => break,
                    }
                }
                match if stop { None } else { listen_again(path, &shutdown).await } {
                    Some(l) => listener = l,
                    None => break,
                }
            }
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    let (rd, wr) = stream.into_split();
                    spawn_task(conn::serve(agent.clone(), rd, wr));
                }
                Err(e) => match e.raw_os_error() {
                    Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOBUFS)
                    | Some(libc::ENOMEM) => {
                        log!("accept: {e}; retrying");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Some(libc::EBADF) | Some(libc::EINVAL) | Some(libc::ENOTSOCK) => {
                        agent.borrow_mut().kill_everything();
                        return Err(io::Error::new(e.kind(), format!("accepting connections: {e}")));
                    }
                    _ => {}
                },
            },
        }
    }
    if let Some(l) = lifeline {
        l.abort();
    }
    agent.borrow_mut().kill_everything();
    // Let connections flush their last replies (the shutdown acknowledgement), briefly.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    loop {
        {
            let mut a = agent.borrow_mut();
            let mut pending = false;
            let ids: Vec<u64> = a.conns.keys().copied().collect();
            for id in ids {
                a.close_conn(
                    id,
                    &ErrorBody::new(
                        sandlot_proto::guest::ErrorCode::ShuttingDown,
                        "the agent is shutting down",
                    ),
                );
            }
            for c in a.conns.values() {
                pending |= !c.out.buf.is_empty() || c.out.inflight > 0;
            }
            if !pending || tokio::time::Instant::now() >= deadline {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

impl AsRawFd for watch::InotifyFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

impl AsFd for watch::InotifyFd {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::Scratch;
    use sandlot_proto::guest::DATA_CHUNK;

    #[test]
    fn the_read_buffer_is_allocated_at_the_first_read() {
        let mut s = Scratch::default();
        // Nothing held before a read needs it.
        assert_eq!(s.0.capacity(), 0);
        let first = {
            let b = s.get();
            assert_eq!(b.len(), DATA_CHUNK);
            b[DATA_CHUNK - 1] = 7;
            b.as_ptr()
        };
        // Later reads reuse it.
        let b = s.get();
        assert_eq!(
            (b.as_ptr(), b.len(), b[DATA_CHUNK - 1]),
            (first, DATA_CHUNK, 7)
        );
    }
}
