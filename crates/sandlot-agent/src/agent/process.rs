//! Processes: planning an exec (user, environment, working directory, program),
//! spawning it (fork/exec with a pre-exec setup), streaming its output through
//! retention rings with per-subscriber credit, feeding its stdin, reaping it.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;
use rustix::io::Errno;
use sandlot_proto::guest::{
    stream, ConfigureRequest, ErrorBody, ErrorCode, ExecRequest, ExitStatus, ProcessId,
    ProcessInfo, PtySize, Reply, StreamInfo, DATA_CHUNK,
};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::reap::kill_tree;
use super::ring::OutputRing;
use super::stdin::{stdin_task, StdinPipe};
use super::users::{User, UserDb};
use super::{
    set_nonblocking, spawn_task, Afd, Agent, Chan, Shared, LINGER, MAX_FINISHED,
    MAX_FINISHED_BYTES, MAX_PROCESSES,
};

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Bytes read from one pipe before yielding to other tasks.
const READ_BUDGET: usize = 256 * 1024;

/// One output stream (stdout or stderr) of a process.
pub(crate) struct OutStream {
    pub ring: OutputRing,
    pub fd: Option<Afd>,
    /// No process holds the write end anymore (or there never was one).
    pub eof: bool,
    /// Wakes the pipe task when subscribers made room.
    pub room: Rc<Notify>,
    /// Stream offset when the process exited (after draining what it wrote).
    pub end_at_exit: Option<u64>,
    pub task: Option<JoinHandle<()>>,
    /// Terminal output: readiness after exit does not prove the buffer is drained.
    pub tty: bool,
}

impl OutStream {
    fn closed(limit: usize) -> OutStream {
        OutStream {
            ring: OutputRing::new(limit),
            fd: None,
            eof: true,
            room: Rc::new(Notify::new()),
            end_at_exit: None,
            task: None,
            tty: false,
        }
    }
}

pub(crate) struct Proc {
    pub id: u64,
    pub pid: i32,
    pub argv: Vec<String>,
    pub tag: Option<String>,
    pub uid: u32,
    pub gid: u32,
    pub started_at_ms: u64,
    /// stdout, stderr.
    pub streams: [OutStream; 2],
    pub stdin: Option<StdinPipe>,
    pub master: Option<Afd>,
    pub status: Option<ExitStatus>,
    pub timed_out: bool,
    pub linger_expired: bool,
    /// (connection, channel) of every subscriber.
    pub subs: Vec<(u64, u32)>,
    /// Its exit status reached a client.
    pub delivered: bool,
    pub timeout_task: Option<JoinHandle<()>>,
    /// The agent's first command, not attached to yet: its output is kept from
    /// offset 0 as if a subscriber stood there
    /// ([`FIRST_PROCESS`](sandlot_proto::guest::FIRST_PROCESS)).
    pub held: bool,
}

impl Proc {
    fn running(&self) -> bool {
        self.status.is_none()
    }

    pub fn info(&self) -> ProcessInfo {
        let si = |s: &OutStream| StreamInfo {
            retained_from: s.ring.start(),
            produced: s.ring.end(),
            eof: s.eof,
        };
        ProcessInfo {
            id: ProcessId(self.id),
            pid: self.pid,
            argv: self.argv.clone(),
            tag: self.tag.clone(),
            uid: self.uid,
            gid: self.gid,
            pty: self.master.is_some(),
            started_at_ms: self.started_at_ms,
            exit: self.status,
            stdout: si(&self.streams[0]),
            stderr: si(&self.streams[1]),
            stdin_open: self.stdin.as_ref().is_some_and(|s| !s.eof_requested),
            attached: self.subs.len() as u32,
        }
    }

    fn retained(&self) -> usize {
        self.streams[0].ring.retained() + self.streams[1].ring.retained()
    }
}

/// A channel streaming a process's output.
pub(crate) struct ProcSub {
    pub proc: u64,
    /// Credit granted by the client for stdout, stderr.
    pub credit: [u64; 2],
    /// Next offset to send, per stream.
    pub cursor: [u64; 2],
    pub eof_sent: [bool; 2],
    pub exit_sent: bool,
    /// Stdin credit granted to the client and not yet used.
    pub stdin_credit: u64,
    pub stdin_eof: bool,
}

/// Everything decided before forking.
#[derive(Debug)]
pub(crate) struct ExecPlan {
    pub program: PathBuf,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub user: User,
    pub cwd: String,
    pub pty: Option<PtySize>,
    pub stdin: bool,
}

fn err(code: ErrorCode, msg: impl Into<String>) -> ErrorBody {
    ErrorBody::new(code, msg)
}

/// Resolves user, environment, working directory and program of `req`.
pub(crate) fn plan_exec(
    req: &ExecRequest,
    base_env: &[(String, String)],
    default_user: &str,
    default_cwd: Option<&str>,
    users: &mut UserDb,
) -> Result<ExecPlan, ErrorBody> {
    req.validate()
        .map_err(|m| err(ErrorCode::BadRequest, format!("exec: {m}")))?;
    let user_spec = req.user.as_deref().unwrap_or(default_user);
    let user = users
        .resolve(user_spec)
        .map_err(|m| err(ErrorCode::InvalidUser, m))?;

    let mut env = BTreeMap::new();
    env.insert("PATH".to_string(), DEFAULT_PATH.to_string());
    env.insert(
        "HOME".to_string(),
        user.home.clone().unwrap_or_else(|| "/".to_string()),
    );
    env.insert("USER".to_string(), user.login_name());
    env.insert("LOGNAME".to_string(), user.login_name());
    if req.pty.is_some() {
        env.insert("TERM".to_string(), "xterm-256color".to_string());
    }
    for (k, v) in base_env {
        env.insert(k.clone(), v.clone());
    }
    for (k, v) in &req.env {
        env.insert(k.clone(), v.clone());
    }

    let cwd = match req.cwd.as_deref().or(default_cwd) {
        Some(c) => {
            match std::fs::metadata(c) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(err(
                        ErrorCode::NotADirectory,
                        format!("exec: cwd {c}: not a directory"),
                    ))
                }
                Err(e) => {
                    return Err(err(
                        super::files::code_of(&e),
                        format!("exec: cwd {c}: {e}"),
                    ))
                }
            }
            c.to_string()
        }
        None => match &user.home {
            Some(h) if Path::new(h).is_dir() => h.clone(),
            _ => "/".to_string(),
        },
    };

    let path = env.get("PATH").map(String::as_str).unwrap_or(DEFAULT_PATH);
    // The sandbox's environment may hold secrets (a secret can be bound to any
    // variable, `PATH` included): an error shows `PATH` only when it is the
    // default or the caller passed it in this request.
    let shown = (path == DEFAULT_PATH || req.env.get("PATH").map(String::as_str) == Some(path))
        .then_some(path);
    let program = resolve_program(&req.argv[0], path, shown, &cwd)?;
    Ok(ExecPlan {
        program,
        argv: req.argv.clone(),
        env,
        user,
        cwd,
        pty: req.pty,
        stdin: req.stdin,
    })
}

/// Finds `name` in `path` the way execvp would, so that "not found" is reported with
/// the name instead of a bare errno. `shown` is the `PATH` an error may name (`None`:
/// it says only that the command is not in `PATH`).
fn resolve_program(
    name: &str,
    path: &str,
    shown: Option<&str>,
    cwd: &str,
) -> Result<PathBuf, ErrorBody> {
    if name.contains('/') {
        return Ok(PathBuf::from(name));
    }
    let mut denied = false;
    for dir in path.split(':') {
        let dir = if dir.is_empty() { "." } else { dir };
        let mut cand = PathBuf::from(dir);
        if cand.is_relative() {
            cand = Path::new(cwd).join(cand);
        }
        cand.push(name);
        if let Ok(m) = std::fs::metadata(&cand) {
            if m.is_file() {
                if m.permissions().mode() & 0o111 != 0 {
                    return Ok(cand);
                }
                denied = true;
            }
        }
    }
    if denied {
        Err(err(
            ErrorCode::PermissionDenied,
            format!("exec: {name}: found in PATH but not executable"),
        ))
    } else {
        Err(err(
            ErrorCode::NotFound,
            match shown {
                Some(path) => format!("exec: {name}: command not found (PATH={path})"),
                None => format!(
                    "exec: {name}: command not found in the sandbox's PATH (its value is not shown)"
                ),
            },
        ))
    }
}

pub(crate) fn set_winsize(master: &impl AsFd, size: PtySize) -> io::Result<()> {
    let ws = rustix::termios::Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    Ok(rustix::termios::tcsetwinsize(master, ws)?)
}

pub(crate) fn watch_lifeline(agent: Shared, fd: OwnedFd) -> io::Result<JoinHandle<()>> {
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC)?;
    set_nonblocking(&fd)?;
    let afd = super::register(fd, tokio::io::Interest::READABLE)?;
    Ok(spawn_task(async move {
        let mut buf = [0u8; 64];
        loop {
            let Ok(mut g) = afd.readable().await else {
                break;
            };
            match g.try_io(|f| rustix::io::read(f.get_ref(), &mut buf).map_err(io::Error::from)) {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(_)) | Err(_) => continue,
            }
        }
        agent.borrow_mut().begin_shutdown();
    }))
}

fn now_ms() -> u64 {
    sandlot_proto::clock::now_ms() as u64
}

/// Outcome of reading a pipe as far as allowed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReadOutcome {
    Eof,
    NoRoom,
    /// Read the per-wakeup budget; yield before continuing.
    Budget,
}

impl Agent {
    /// Replaces the defaults of processes started from now on. The user must
    /// resolve (in the sandbox's `/etc/passwd` or as `UID[:GID]`) and the working
    /// directory, if given, must be an absolute path; nothing changes otherwise.
    pub fn configure(&mut self, c: ConfigureRequest) -> Result<(), ErrorBody> {
        self.users
            .resolve(&c.default_user)
            .map_err(|m| err(ErrorCode::InvalidUser, format!("configure: {m}")))?;
        if let Some(cwd) = &c.default_cwd {
            if !cwd.starts_with('/') {
                return Err(err(
                    ErrorCode::BadRequest,
                    format!("configure: default_cwd {cwd:?} is not an absolute path"),
                ));
            }
        }
        if let Some((k, _)) = c
            .env
            .iter()
            .find(|(k, _)| k.is_empty() || k.contains('=') || k.contains('\0'))
        {
            return Err(err(
                ErrorCode::BadRequest,
                format!("configure: invalid environment variable name {k:?}"),
            ));
        }
        self.settings.env = c.env;
        self.settings.default_user = c.default_user;
        self.settings.default_cwd = c.default_cwd;
        self.ensure_default_cwd();
        Ok(())
    }

    /// Creates the default working directory if it is missing, owned by the
    /// default user ([`super::workdir`]). A failure is logged: a process started
    /// there then fails naming the directory.
    pub fn ensure_default_cwd(&mut self) {
        let Some(cwd) = self.settings.default_cwd.clone() else {
            return;
        };
        if Path::new(&cwd).is_dir() {
            return;
        }
        let user = match self.users.resolve(&self.settings.default_user) {
            Ok(u) => u,
            Err(e) => {
                super::log!("create the working directory {cwd}: {e}");
                return;
            }
        };
        if let Err(e) = super::workdir::ensure(&cwd, user.uid, user.gid) {
            super::log!("create the working directory {cwd}: {e}");
        }
    }

    /// Plans, spawns and registers a process. Returns its id.
    pub fn exec(&mut self, req: &ExecRequest) -> Result<u64, ErrorBody> {
        if self.shutting_down {
            return Err(err(
                ErrorCode::ShuttingDown,
                "exec: the agent is shutting down",
            ));
        }
        if self.procs.len() >= MAX_PROCESSES {
            return Err(err(
                ErrorCode::Limit,
                format!("exec: {MAX_PROCESSES} processes are tracked already"),
            ));
        }
        let plan = plan_exec(
            req,
            &self.settings.env,
            &self.settings.default_user,
            self.settings.default_cwd.as_deref(),
            &mut self.users,
        )?;
        let poll = self.keyed_poll().map_err(|e| {
            err(
                ErrorCode::SpawnFailed,
                format!("exec {:?}: starting the agent's epoll: {e}", plan.argv[0]),
            )
        })?;
        let sp = super::spawn::spawn(&plan, &mut self.stack, &self.oom)?;
        let reg = |fd: OwnedFd| -> io::Result<Afd> {
            set_nonblocking(&fd)?;
            Ok(Rc::new(poll.register(fd)?))
        };
        let id = self.next_proc;
        self.next_proc += 1;
        let limit = self.settings.retention;
        let registered = (|| -> io::Result<_> {
            let out = reg(sp.stdout)?;
            let errfd = sp.stderr.map(reg).transpose()?;
            let inp = if sp.tty {
                // A terminal always has an input side.
                Some(out.clone())
            } else {
                sp.stdin.map(reg).transpose()?
            };
            Ok((out, errfd, inp))
        })();
        let (out, errfd, inp) = match registered {
            Ok(v) => v,
            Err(e) => {
                // The child runs but cannot be served: do not leave it behind.
                kill_tree(sp.pid);
                self.by_pid.insert(sp.pid, 0);
                return Err(err(
                    ErrorCode::SpawnFailed,
                    format!("exec {:?}: registering its pipes: {e}", plan.argv[0]),
                ));
            }
        };
        let mk_stream = |fd: Option<Afd>, tty: bool| match fd {
            Some(fd) => OutStream {
                ring: OutputRing::new(limit),
                fd: Some(fd),
                eof: false,
                room: Rc::new(Notify::new()),
                end_at_exit: None,
                task: None,
                tty,
            },
            None => OutStream::closed(limit),
        };
        let mut p = Proc {
            id,
            pid: sp.pid,
            argv: plan.argv.clone(),
            tag: req.tag.clone(),
            uid: plan.user.uid,
            gid: plan.user.gid,
            started_at_ms: now_ms(),
            streams: [
                mk_stream(Some(out.clone()), sp.tty),
                mk_stream(errfd, false),
            ],
            stdin: inp.map(|fd| StdinPipe {
                fd,
                queue: VecDeque::new(),
                eof_requested: false,
                wake: Rc::new(Notify::new()),
                task: None,
                tty: sp.tty,
            }),
            master: sp.tty.then(|| out.clone()),
            status: None,
            timed_out: false,
            linger_expired: false,
            subs: Vec::new(),
            delivered: false,
            timeout_task: None,
            held: false,
        };
        let shared = self.shared();
        for i in 0..2 {
            if let Some(fd) = p.streams[i].fd.clone() {
                let room = p.streams[i].room.clone();
                let tty = p.streams[i].tty;
                p.streams[i].task =
                    Some(spawn_task(pipe_task(shared.clone(), id, i, fd, room, tty)));
            }
        }
        if let Some(si) = &mut p.stdin {
            si.task = Some(spawn_task(stdin_task(
                shared.clone(),
                id,
                si.fd.clone(),
                si.wake.clone(),
            )));
        }
        if let Some(t) = req.timeout {
            let a = shared.clone();
            p.timeout_task = Some(spawn_task(async move {
                tokio::time::sleep(t.0).await;
                a.borrow_mut().on_timeout(id);
            }));
        }
        self.by_pid.insert(sp.pid, id);
        if !self.pid1 && self.sessions.insert(sp.pid) {
            self.session_order.push_back(sp.pid);
            while self.session_order.len() > 4096 {
                if let Some(old) = self.session_order.pop_front() {
                    if !self.by_pid.contains_key(&old) {
                        self.sessions.remove(&old);
                    } else {
                        self.session_order.push_back(old);
                        break;
                    }
                }
            }
        }
        self.procs.insert(id, p);
        Ok(id)
    }

    /// Subscribes channel `chan` of `conn` to process `id` from the given offsets
    /// (None: from the current end). Returns the actual start offsets.
    pub fn subscribe(
        &mut self,
        conn: u64,
        chan: u32,
        id: u64,
        from: [Option<u64>; 2],
    ) -> Option<([u64; 2], bool)> {
        let p = self.procs.get_mut(&id)?;
        let mut cursor = [0u64; 2];
        for i in 0..2 {
            let r = &p.streams[i].ring;
            cursor[i] = from[i].unwrap_or(r.end()).clamp(r.start(), r.end());
        }
        p.subs.push((conn, chan));
        // From here its subscribers' cursors bound what is kept: a reader that
        // waited on the held bound (full) may read again whatever this one's cursor.
        if std::mem::take(&mut p.held) {
            p.streams.iter().for_each(|s| s.room.notify_one());
        }
        let stdin_open = p.stdin.as_ref().is_some_and(|s| !s.eof_requested);
        let c = self.conns.get_mut(&conn)?;
        c.chans.insert(
            chan,
            Chan::Proc(ProcSub {
                proc: id,
                credit: [0; 2],
                cursor,
                eof_sent: [false; 2],
                exit_sent: false,
                stdin_credit: 0,
                stdin_eof: false,
            }),
        );
        Some((cursor, stdin_open))
    }

    /// Grants the initial stdin credit to a freshly subscribed channel.
    pub fn grant_stdin(&mut self, conn: u64, chan: u32, n: u32) {
        if let Some(c) = self.conns.get_mut(&conn) {
            if let Some(Chan::Proc(sub)) = c.chans.get_mut(&chan) {
                sub.stdin_credit += u64::from(n);
                c.out.window(chan, stream::INPUT, n);
            }
        }
    }

    /// Removes a subscriber (cancel, connection gone, channel finished).
    pub fn unsubscribe(&mut self, conn: u64, chan: u32, proc: u64) {
        if let Some(p) = self.procs.get_mut(&proc) {
            p.subs.retain(|&s| s != (conn, chan));
            for s in &p.streams {
                s.room.notify_one();
            }
        }
        self.maybe_collect(proc);
    }

    /// Bytes the pipe task of stream `i` may read now; None when it should stop.
    pub fn room(&self, id: u64, i: usize) -> Option<usize> {
        let p = self.procs.get(&id)?;
        let st = &p.streams[i];
        if st.eof || st.fd.is_none() {
            return None;
        }
        // A held process keeps everything from its first byte, as a reader at 0.
        let mut min: Option<u64> = p.held.then_some(0);
        for (conn, chan) in &p.subs {
            if let Some(Chan::Proc(sub)) = self.conns.get(conn).and_then(|c| c.chans.get(chan)) {
                min = Some(min.map_or(sub.cursor[i], |m| m.min(sub.cursor[i])));
            }
        }
        Some(match min {
            // Nobody is streaming: keep the most recent output, never block.
            None => DATA_CHUNK,
            Some(m) => (st.ring.limit() as u64).saturating_sub(st.ring.end() - m) as usize,
        })
    }

    /// Reads stream `i` of process `id` while there is room, up to a budget.
    /// `Err(WouldBlock)` when the pipe is empty (so readiness gets cleared).
    pub fn read_output(&mut self, id: u64, i: usize) -> io::Result<ReadOutcome> {
        let mut total = 0usize;
        let mut would_block = false;
        let mut outcome = loop {
            let room = match self.room(id, i) {
                None => break ReadOutcome::Eof,
                Some(0) => break ReadOutcome::NoRoom,
                Some(r) => r,
            };
            let Some(p) = self.procs.get_mut(&id) else {
                break ReadOutcome::Eof;
            };
            let st = &mut p.streams[i];
            let fd = st.fd.clone().expect("room() checked the fd");
            let buf = self.scratch.get();
            let n = room.min(buf.len());
            match rustix::io::read(fd.get_ref(), &mut buf[..n]) {
                Ok(0) => {
                    st.eof = true;
                    break ReadOutcome::Eof;
                }
                Ok(n) => {
                    st.ring.push(Bytes::copy_from_slice(&buf[..n]));
                    total += n;
                    self.pump_subs(id);
                    if total >= READ_BUDGET {
                        break ReadOutcome::Budget;
                    }
                }
                Err(Errno::AGAIN) => {
                    would_block = true;
                    break ReadOutcome::NoRoom;
                }
                Err(Errno::INTR) => continue,
                Err(e) => {
                    // EIO: the terminal's last slave closed. Anything else: the stream
                    // is unusable; either way it has ended.
                    if e != Errno::IO {
                        super::log!("reading output of process {id}: {e}");
                    }
                    st.eof = true;
                    break ReadOutcome::Eof;
                }
            }
        };
        if let Some(p) = self.procs.get_mut(&id) {
            let st = &mut p.streams[i];
            // A terminal whose process has exited and whose buffer is empty once
            // the linger is over has ended: Linux reports the hang-up (EIO) when
            // the last slave closes, gVisor's kernel never does, and a descendant
            // still holding the slave has lost its terminal's reader anyway.
            if would_block && st.tty && p.status.is_some() && p.linger_expired {
                outcome = ReadOutcome::Eof;
                would_block = false;
            }
            if outcome == ReadOutcome::Eof {
                st.eof = true;
                st.fd = None;
            }
            if p.status.is_some() && st.end_at_exit.is_none() {
                let drained = outcome == ReadOutcome::Eof
                    || (would_block && !st.tty)
                    || (p.linger_expired && outcome != ReadOutcome::NoRoom)
                    || (p.linger_expired && would_block);
                if drained {
                    st.end_at_exit = Some(st.ring.end());
                }
            }
        }
        self.pump_subs(id);
        if outcome == ReadOutcome::Eof {
            self.maybe_collect(id);
        }
        if would_block {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(outcome)
    }

    pub fn pump_subs(&mut self, id: u64) {
        let subs = match self.procs.get(&id) {
            Some(p) => p.subs.clone(),
            None => return,
        };
        for (conn, chan) in subs {
            self.pump_sub(conn, chan);
        }
    }

    /// Sends a subscriber what it may receive: output within credit, then the exit
    /// report, EOFs and END.
    pub fn pump_sub(&mut self, conn_id: u64, chan: u32) {
        let Agent { conns, procs, .. } = self;
        let Some(conn) = conns.get_mut(&conn_id) else {
            return;
        };
        let Some(Chan::Proc(sub)) = conn.chans.get_mut(&chan) else {
            return;
        };
        let pid = sub.proc;
        let Some(p) = procs.get_mut(&pid) else {
            conn.chans.remove(&chan);
            conn.out.error(
                chan,
                err(
                    ErrorCode::NoSuchProcess,
                    format!("process {pid} was dropped (too many finished processes retained)"),
                ),
            );
            return;
        };
        let mut advanced = false;
        for i in 0..2 {
            let ring = &p.streams[i].ring;
            while sub.cursor[i] < ring.end() && sub.credit[i] > 0 {
                let room = conn.out.room();
                if room == 0 {
                    conn.out.block(chan);
                    if advanced {
                        p.streams.iter().for_each(|s| s.room.notify_one());
                    }
                    return;
                }
                let max = (sub.credit[i] as usize).min(DATA_CHUNK).min(room);
                let chunk = ring.slice_from(sub.cursor[i], max);
                conn.out.data(chan, i as u8 + 1, &chunk);
                sub.credit[i] -= chunk.len() as u64;
                sub.cursor[i] += chunk.len() as u64;
                advanced = true;
            }
        }
        if advanced {
            p.streams.iter().for_each(|s| s.room.notify_one());
        }
        if !sub.exit_sent {
            if let (Some(status), Some(e0), Some(e1)) =
                (p.status, p.streams[0].end_at_exit, p.streams[1].end_at_exit)
            {
                if sub.cursor[0] >= e0 && sub.cursor[1] >= e1 {
                    conn.out.reply(
                        chan,
                        &Reply::Exit {
                            status,
                            stdout_end: e0,
                            stderr_end: e1,
                        },
                    );
                    sub.exit_sent = true;
                    p.delivered = true;
                }
            }
        }
        for i in 0..2 {
            let st = &p.streams[i];
            if !sub.eof_sent[i] && st.eof && sub.cursor[i] == st.ring.end() {
                conn.out.eof(chan, i as u8 + 1);
                sub.eof_sent[i] = true;
            }
        }
        if sub.exit_sent && sub.eof_sent == [true, true] {
            conn.out.end(chan);
            conn.chans.remove(&chan);
            self.unsubscribe(conn_id, chan, pid);
        }
    }

    /// Called for each reaped child.
    pub(super) fn on_reaped(&mut self, pid: i32, mut status: ExitStatus) {
        let Some(id) = self.by_pid.remove(&pid) else {
            return;
        };
        let Some(p) = self.procs.get_mut(&id) else {
            return;
        };
        status.timed_out = p.timed_out;
        p.status = Some(status);
        if let Some(t) = p.timeout_task.take() {
            t.abort();
        }
        let mut pending = false;
        for st in &mut p.streams {
            if st.eof {
                st.end_at_exit = Some(st.ring.end());
            } else {
                pending = true;
            }
        }
        if pending {
            // Take what the process wrote before exiting; the rest of the wait is
            // bounded by LINGER.
            for i in 0..2 {
                let pending = self
                    .procs
                    .get(&id)
                    .is_some_and(|p| p.streams[i].end_at_exit.is_none());
                if pending {
                    let _ = self.read_output(id, i);
                }
            }
            let shared = self.shared();
            spawn_task(async move {
                tokio::time::sleep(LINGER).await;
                shared.borrow_mut().on_linger(id);
            });
        }
        self.finished.push_back(id);
        self.evict_finished();
        self.pump_subs(id);
        self.maybe_collect(id);
    }

    fn on_linger(&mut self, id: u64) {
        let mut fix = [false; 2];
        let ttys: Vec<usize> = match self.procs.get_mut(&id) {
            Some(p) => {
                p.linger_expired = true;
                (0..2)
                    .filter(|&i| p.streams[i].tty && !p.streams[i].eof)
                    .collect()
            }
            None => return,
        };
        // A terminal's end may come with no readiness event: read it now, and wake
        // its task so that it sees the stream ended.
        for i in ttys {
            let _ = self.read_output(id, i);
            if let Some(p) = self.procs.get(&id) {
                p.streams[i].room.notify_one();
            }
        }
        for (i, f) in fix.iter_mut().enumerate() {
            *f = self.room(id, i) != Some(0);
        }
        if let Some(p) = self.procs.get_mut(&id) {
            for (i, st) in p.streams.iter_mut().enumerate() {
                if st.end_at_exit.is_none() && fix[i] {
                    st.end_at_exit = Some(st.ring.end());
                }
            }
        }
        self.pump_subs(id);
    }

    fn on_timeout(&mut self, id: u64) {
        if let Some(p) = self.procs.get_mut(&id) {
            if p.running() {
                p.timed_out = true;
                kill_tree(p.pid);
            }
        }
    }

    /// Drops finished processes nobody collected, oldest first, beyond the limits.
    fn evict_finished(&mut self) {
        let mut bytes: usize = self
            .finished
            .iter()
            .filter_map(|id| self.procs.get(id))
            .map(Proc::retained)
            .sum();
        let mut n = self.finished.len();
        let mut kept = VecDeque::new();
        while n > MAX_FINISHED || bytes > MAX_FINISHED_BYTES {
            let Some(id) = self.finished.pop_front() else {
                break;
            };
            n -= 1;
            match self.procs.get(&id) {
                Some(p) if p.subs.is_empty() => {
                    bytes -= p.retained();
                    self.remove_proc(id);
                }
                Some(_) => kept.push_back(id),
                None => {}
            }
        }
        while let Some(id) = kept.pop_back() {
            self.finished.push_front(id);
        }
    }

    /// Forgets a process once everything about it has been delivered.
    pub fn maybe_collect(&mut self, id: u64) {
        let done = match self.procs.get(&id) {
            Some(p) => {
                p.status.is_some()
                    && p.delivered
                    && p.subs.is_empty()
                    && p.streams.iter().all(|s| s.eof)
            }
            None => false,
        };
        if done {
            self.remove_proc(id);
        }
    }

    pub(super) fn remove_proc(&mut self, id: u64) {
        if let Some(mut p) = self.procs.remove(&id) {
            for st in &mut p.streams {
                if let Some(t) = st.task.take() {
                    t.abort();
                }
            }
            if let Some(si) = &mut p.stdin {
                if let Some(t) = si.task.take() {
                    t.abort();
                }
            }
            if let Some(t) = p.timeout_task.take() {
                t.abort();
            }
            if p.status.is_none() {
                self.by_pid.remove(&p.pid);
            }
            self.finished.retain(|&f| f != id);
        }
    }

    pub fn signal(&mut self, id: u64, sig: i32) -> Result<(), ErrorBody> {
        let p = self.procs.get(&id).ok_or_else(|| no_such(id))?;
        if !(1..=64).contains(&sig) {
            return Err(err(
                ErrorCode::BadRequest,
                format!("signal: {sig} is not a signal number (1..=64)"),
            ));
        }
        if !p.running() {
            return Err(err(
                ErrorCode::ProcessExited,
                format!("signal: process {id} has exited"),
            ));
        }
        // SAFETY: kill(2) with a negative pid signals a process group; no memory is
        // involved. (rustix's Signal cannot name real-time signals safely, and the
        // client may send any of 1..=64.)
        let r = unsafe { libc::kill(-p.pid, sig) };
        if r != 0 {
            let e = io::Error::last_os_error();
            return Err(err(
                ErrorCode::Io,
                format!("signal {sig} to process group {}: {e}", p.pid),
            ));
        }
        Ok(())
    }

    pub fn resize(&mut self, id: u64, size: PtySize) -> Result<(), ErrorBody> {
        let p = self.procs.get(&id).ok_or_else(|| no_such(id))?;
        if size.rows == 0 || size.cols == 0 {
            return Err(err(
                ErrorCode::BadRequest,
                "resize: rows and cols must be positive",
            ));
        }
        let Some(m) = &p.master else {
            return Err(err(
                ErrorCode::BadRequest,
                format!("resize: process {id} has no terminal"),
            ));
        };
        if !p.running() {
            return Err(err(
                ErrorCode::ProcessExited,
                format!("resize: process {id} has exited"),
            ));
        }
        set_winsize(m.get_ref(), size)
            .map_err(|e| err(ErrorCode::Io, format!("resize process {id}: {e}")))
    }

    pub fn list_processes(&self) -> Vec<ProcessInfo> {
        self.procs.values().map(Proc::info).collect()
    }
}

pub(crate) fn no_such(id: u64) -> ErrorBody {
    err(
        ErrorCode::NoSuchProcess,
        format!("no process {id} (never started, or already collected)"),
    )
}

/// Reads one output stream of a process while its subscribers have room. A
/// terminal's task also wakes on `room` while it waits for output: the stream can
/// end without a readiness event (see [`Agent::read_output`]).
async fn pipe_task(agent: Shared, id: u64, i: usize, fd: Afd, room: Rc<Notify>, tty: bool) {
    loop {
        loop {
            match agent.borrow().room(id, i) {
                None => return,
                Some(0) => {}
                Some(_) => break,
            }
            room.notified().await;
        }
        let ready = if tty {
            tokio::select! {
                g = fd.readable() => Some(g),
                _ = room.notified() => None,
            }
        } else {
            Some(fd.readable().await)
        };
        let Some(mut g) = ready else {
            // Room again: a terminal whose process has exited may have ended
            // with nothing left to make it readable (see `read_output`).
            let _ = agent.borrow_mut().read_output(id, i);
            continue;
        };
        match g.try_io(|_| agent.borrow_mut().read_output(id, i)) {
            Ok(Ok(ReadOutcome::Eof)) => return,
            Ok(Ok(ReadOutcome::Budget)) => tokio::task::yield_now().await,
            Ok(Ok(ReadOutcome::NoRoom)) | Err(_) => {}
            Ok(Err(_)) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(req: &ExecRequest, base: &[(&str, &str)]) -> Result<ExecPlan, ErrorBody> {
        let base: Vec<(String, String)> = base
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        plan_exec(req, &base, "root", None, &mut UserDb::default())
    }

    #[test]
    fn environment_precedence_and_defaults() {
        let mut req = ExecRequest::new(["sh", "-c", "true"]);
        req.env.insert("B".into(), "request".into());
        req.env.insert("HOME".into(), "/elsewhere".into());
        req.pty = Some(PtySize::default());
        req.cwd = Some("/".into());
        let p = plan(
            &req,
            &[("A", "base"), ("B", "base"), ("PATH", "/bin:/usr/bin")],
        )
        .unwrap();
        assert_eq!(p.env["A"], "base");
        assert_eq!(p.env["B"], "request");
        assert_eq!(p.env["HOME"], "/elsewhere");
        assert_eq!(p.env["PATH"], "/bin:/usr/bin");
        assert_eq!(p.env["USER"], "root");
        assert_eq!(p.env["LOGNAME"], "root");
        assert_eq!(p.env["TERM"], "xterm-256color");
        assert!(p.program.ends_with("sh") && p.program.is_absolute());
        assert_eq!(p.argv[0], "sh", "argv[0] stays as given");
        assert_eq!(p.cwd, "/");
        let no_pty = plan(&ExecRequest::new(["/bin/true"]), &[]).unwrap();
        assert!(!no_pty.env.contains_key("TERM"));
        assert!(no_pty.env["PATH"].contains("/usr/bin"));
    }

    #[test]
    fn command_not_found_never_shows_a_path_from_the_sandbox_environment() {
        // A secret bound to PATH is in the agent's base environment.
        let secret = "/s3cr3t-value-of-a-secret";
        let e = plan(&ExecRequest::new(["sh"]), &[("PATH", secret)]).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert!(!e.message.contains(secret), "{}", e.message);
        assert!(e.message.contains("sh: command not found"), "{}", e.message);
        // What the caller passed in plain, and the default, may be named.
        let mut req = ExecRequest::new(["surely-not-a-program"]);
        req.env.insert("PATH".into(), "/mine".into());
        let e = plan(&req, &[("PATH", secret)]).unwrap_err();
        assert!(e.message.contains("PATH=/mine"), "{}", e.message);
        let e = plan(&ExecRequest::new(["surely-not-a-program"]), &[]).unwrap_err();
        assert!(e.message.contains(DEFAULT_PATH), "{}", e.message);
    }

    #[test]
    fn program_and_cwd_errors_name_what_is_wrong() {
        let e = plan(&ExecRequest::new(["surely-not-a-program"]), &[]).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert!(
            e.message
                .contains("surely-not-a-program: command not found"),
            "{}",
            e.message
        );
        let mut req = ExecRequest::new(["true"]);
        req.cwd = Some("/surely/not/here".into());
        let e = plan(&req, &[]).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert!(e.message.contains("cwd /surely/not/here"), "{}", e.message);
        req.cwd = Some("/etc/passwd".into());
        assert_eq!(plan(&req, &[]).unwrap_err().code, ErrorCode::NotADirectory);
        let mut req = ExecRequest::new(["true"]);
        req.user = Some("surely-not-a-user".into());
        assert_eq!(plan(&req, &[]).unwrap_err().code, ErrorCode::InvalidUser);
        let e = plan(&ExecRequest::new(Vec::<String>::new()), &[]).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadRequest);
    }
}
