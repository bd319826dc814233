//! The driver of a code context: a Python program the daemon supplies
//! (`driver.py`, embedded in the binary), started in the sandbox through the agent
//! with `python3 -c BOOTSTRAP` and its source on the first line of its stdin. It
//! starts the Jupyter kernel and relays JSON lines. Everything it writes comes from
//! inside the sandbox: lines are bounded, parsed into [`DriverLine`] and dropped
//! when they are anything else.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use sandlot_guest::client::{
    ExecRequest, GuestClient, Process, ProcessEvent, ProcessId, ProcessStdin,
};
use sandlot_proto::guest::ExitStatus;
use serde::Deserialize;
use tokio::sync::Mutex as AsyncMutex;

use super::output::{Held, OutputPool, RawBundle};

/// The driver's source.
const DRIVER_SOURCE: &str = include_str!("driver.py");

/// Reads the driver from the first stdin line and runs it. The script's directory
/// is not on `sys.path` (`-c` puts the working directory first: a `json.py` there
/// would be imported instead of the standard library's).
const BOOTSTRAP: &str = "import sys\nif sys.path[:1] == ['']: del sys.path[0]\n\
import json\nexec(compile(json.loads(sys.stdin.buffer.readline()), 'sandlot-code-driver', 'exec'))";

/// The longest line taken from a driver (a result with a large image); a longer
/// one is dropped whole.
pub const MAX_LINE: usize = 16 << 20;

/// The longest line taken from a driver outside a run (its start-up lines):
/// no run's pool counts it then.
pub const IDLE_LINE: usize = 1 << 20;

/// What a line may take before the pool counts it: a run's small lines (its
/// `done` above all) are read even when its sandbox's pool is full.
pub const UNCOUNTED_LINE: usize = 64 << 10;

/// Driver stderr kept for error messages (its last bytes).
const STDERR_TAIL: usize = 1024;

/// What a driver's process is tagged with in its sandbox's agent (then the
/// context's id).
pub const TAG_PREFIX: &str = "code context ";

/// How long sweeping a sandbox's stale drivers may take.
const SWEEP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a driver may take to have its kernel ready.
pub const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A line from the driver. Anything else is dropped.
#[derive(Debug, PartialEq)]
pub enum DriverLine {
    Ready,
    /// It cannot start a kernel (a missing package or kernel).
    Fatal {
        name: String,
        message: String,
    },
    Stdout {
        text: String,
    },
    Stderr {
        text: String,
    },
    Result {
        main: bool,
        data: RawBundle,
    },
    Exception {
        name: String,
        value: String,
        traceback: String,
    },
    Done {
        count: Option<u64>,
        status: String,
        truncated: bool,
    },
    /// The kernel ended; the driver exits after this.
    Died {
        code: Option<i32>,
        signal: Option<i32>,
    },
}

/// The kinds of line (`"t"`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Kind {
    Ready,
    Fatal,
    Stdout,
    Stderr,
    Result,
    Exception,
    Done,
    Died,
}

/// Every field any line has, read in one pass with nothing buffered (an
/// internally tagged enum would first copy the whole line into a tree of
/// values, and a result's bundle is never parsed: see [`RawBundle`]).
#[derive(Deserialize)]
struct Wire {
    t: Kind,
    text: Option<String>,
    name: Option<String>,
    message: Option<String>,
    main: Option<bool>,
    data: Option<RawBundle>,
    value: Option<String>,
    traceback: Option<String>,
    count: Option<u64>,
    status: Option<String>,
    truncated: Option<bool>,
    code: Option<i32>,
    signal: Option<i32>,
}

impl Wire {
    fn line(self) -> Option<DriverLine> {
        Some(match self.t {
            Kind::Ready => DriverLine::Ready,
            Kind::Fatal => DriverLine::Fatal {
                name: self.name?,
                message: self.message?,
            },
            Kind::Stdout => DriverLine::Stdout { text: self.text? },
            Kind::Stderr => DriverLine::Stderr { text: self.text? },
            Kind::Result => DriverLine::Result {
                main: self.main?,
                data: self.data?,
            },
            Kind::Exception => DriverLine::Exception {
                name: self.name?,
                value: self.value?,
                traceback: self.traceback.unwrap_or_default(),
            },
            Kind::Done => DriverLine::Done {
                count: self.count,
                status: self.status?,
                truncated: self.truncated.unwrap_or(false),
            },
            Kind::Died => DriverLine::Died {
                code: self.code,
                signal: self.signal,
            },
        })
    }
}

/// Splits a byte stream into lines of at most `max` bytes; longer lines are
/// dropped (counted) up to their newline. While a run reads it, the line being
/// gathered is counted against that run's sandbox pool past its first
/// [`UNCOUNTED_LINE`] bytes (a line the pool has no room for is dropped); otherwise lines are at most [`IDLE_LINE`]. The buffer
/// never has more capacity than its limit.
#[derive(Debug)]
pub struct LineSplitter {
    max: usize,
    buf: Vec<u8>,
    overlong: bool,
    ready: VecDeque<Vec<u8>>,
    pub dropped: u64,
    pool: Option<Arc<OutputPool>>,
    /// What `buf`'s capacity holds of `pool`.
    held: Held,
}

impl LineSplitter {
    pub fn new(max: usize) -> LineSplitter {
        LineSplitter {
            max,
            buf: Vec::new(),
            overlong: false,
            ready: VecDeque::new(),
            dropped: 0,
            pool: None,
            held: Held::default(),
        }
    }

    /// Counts the lines gathered from now on against `pool` (`None`: no pool,
    /// at most [`IDLE_LINE`]). A line half gathered is dropped: it belongs to
    /// no run.
    pub fn charge_to(&mut self, pool: Option<Arc<OutputPool>>) {
        if !self.buf.is_empty() {
            self.drop_line();
        }
        self.buf = Vec::new();
        self.held = Held::default();
        self.pool = pool;
    }

    fn limit(&self) -> usize {
        match self.pool {
            Some(_) => self.max,
            None => self.max.min(IDLE_LINE),
        }
    }

    fn drop_line(&mut self) {
        self.buf = Vec::new();
        self.held = Held::default();
        self.overlong = true;
        self.dropped += 1;
    }

    /// Makes room for `n` more bytes within the limit (and the pool).
    fn reserve(&mut self, n: usize) -> bool {
        let need = self.buf.len() + n;
        let limit = self.limit();
        if need > limit {
            return false;
        }
        let had = self.buf.capacity();
        if need <= had {
            return true;
        }
        let cap = need.max(had.saturating_mul(2)).min(limit);
        if let Some(pool) = &self.pool {
            let counted = |c: usize| c.saturating_sub(UNCOUNTED_LINE);
            let more = counted(cap) - counted(had);
            if more > 0 && !self.held.grow(pool, more) {
                return false;
            }
        }
        self.buf.reserve_exact(cap - self.buf.len());
        true
    }

    pub fn push(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let (part, rest, end) = match data.iter().position(|&b| b == b'\n') {
                Some(i) => (&data[..i], &data[i + 1..], true),
                None => (data, &data[data.len()..], false),
            };
            data = rest;
            if !self.overlong {
                if self.reserve(part.len()) {
                    self.buf.extend_from_slice(part);
                } else {
                    self.drop_line();
                }
            }
            if end {
                if !self.overlong {
                    self.ready.push_back(std::mem::take(&mut self.buf));
                    self.held = Held::default();
                }
                self.overlong = false;
            }
        }
    }

    pub fn pop(&mut self) -> Option<Vec<u8>> {
        self.ready.pop_front()
    }

    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }
}

/// Parses one driver line; `None` for anything that is not a known line.
pub fn parse_line(line: &[u8]) -> Option<DriverLine> {
    serde_json::from_slice::<Wire>(line).ok()?.line()
}

/// What [`Driver::next`] found.
#[derive(Debug)]
pub enum Next {
    Line(DriverLine),
    /// The driver process ended (its exit status).
    Exited(ExitStatus),
}

/// Why a driver did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("starting the driver: {0}")]
    Exec(#[source] sandlot_guest::client::ClientError),
    /// The driver said why (a missing package or kernel).
    #[error("{message}")]
    Unavailable { message: String },
    #[error("the interpreter ended before it was ready ({status}){tail}")]
    Ended { status: String, tail: String },
    #[error("the interpreter was not ready within {0:?}")]
    Timeout(Duration),
    #[error("talking to the driver: {0}")]
    Io(String),
}

/// A running driver.
pub struct Driver {
    proc: Process,
    lines: LineSplitter,
    stdin: Arc<AsyncMutex<ProcessStdin>>,
    stderr_tail: Vec<u8>,
}

/// How to start a driver.
#[derive(Debug, Clone)]
pub struct DriverSpec {
    pub language: String,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    /// Whom the driver and its kernel run as (the sandbox's user when `None`).
    pub user: Option<String>,
    /// Whether a Python kernel shows images saved to a path (E2B's convention).
    pub show_saved_images: bool,
    pub tag: String,
    /// The context's id: the processes its kernels start carry it, and a new
    /// driver ends those an earlier one left.
    pub context: String,
}

impl Driver {
    /// Starts a driver and waits until its kernel is ready.
    pub async fn start(guest: &GuestClient, spec: &DriverSpec) -> Result<Driver, StartError> {
        let req = ExecRequest {
            env: spec.env.clone(),
            cwd: spec.cwd.clone(),
            user: spec.user.clone(),
            stdin: true,
            tag: Some(spec.tag.clone()),
            ..ExecRequest::new(["python3", "-c", BOOTSTRAP])
        };
        let mut proc = guest.exec(req).await.map_err(StartError::Exec)?;
        let stdin = proc
            .take_stdin()
            .ok_or_else(|| StartError::Io("the driver has no stdin".into()))?;
        let mut d = Driver {
            proc,
            lines: LineSplitter::new(MAX_LINE),
            stdin: Arc::new(AsyncMutex::new(stdin)),
            stderr_tail: Vec::new(),
        };
        let source = serde_json::to_string(DRIVER_SOURCE).expect("a string serializes");
        let conf = serde_json::json!({
            "language": spec.language,
            "context": spec.context,
            "show_saved_images": spec.show_saved_images,
        });
        let started = async {
            d.send_line(&source, START_TIMEOUT).await?;
            d.send_line(&conf.to_string(), START_TIMEOUT).await?;
            d.wait_ready().await
        };
        match tokio::time::timeout(START_TIMEOUT, started).await {
            Ok(Ok(())) => Ok(d),
            Ok(Err(e)) => {
                d.kill(guest).await;
                Err(e)
            }
            Err(_) => {
                d.kill(guest).await;
                Err(StartError::Timeout(START_TIMEOUT))
            }
        }
    }

    async fn wait_ready(&mut self) -> Result<(), StartError> {
        loop {
            match self.next().await {
                Ok(Next::Line(DriverLine::Ready)) => return Ok(()),
                Ok(Next::Line(DriverLine::Fatal { name, message })) => {
                    return Err(StartError::Unavailable {
                        message: bounded(&format!("{name}: {message}"), 1000),
                    })
                }
                Ok(Next::Line(DriverLine::Died { code, signal })) => {
                    return Err(StartError::Ended {
                        status: describe_end(code, signal),
                        tail: String::new(),
                    })
                }
                Ok(Next::Line(_)) => {}
                Ok(Next::Exited(s)) => {
                    return Err(StartError::Ended {
                        status: describe_end(s.code, s.signal),
                        tail: self.stderr_tail(),
                    })
                }
                Err(e) => return Err(StartError::Io(e)),
            }
        }
    }

    /// The driver's last stderr bytes, as `": TEXT"` (empty if none).
    pub fn stderr_tail(&self) -> String {
        let t = String::from_utf8_lossy(&self.stderr_tail);
        let t = t.trim();
        if t.is_empty() {
            String::new()
        } else {
            format!(": {t}")
        }
    }

    /// The agent's id of the driver process.
    pub fn process_id(&self) -> ProcessId {
        self.proc.id()
    }

    /// Its stdin, shared with interrupts.
    pub fn stdin(&self) -> Arc<AsyncMutex<ProcessStdin>> {
        self.stdin.clone()
    }

    /// Writes one line, giving up after `within` (the driver stopped reading).
    pub async fn send_line(&self, json: &str, within: Duration) -> Result<(), WriteError> {
        write_line(&self.stdin, json, within).await
    }

    /// Counts the lines it gathers against `pool` (see [`LineSplitter::charge_to`]).
    pub fn charge_lines_to(&mut self, pool: Option<Arc<OutputPool>>) {
        self.lines.charge_to(pool);
    }

    /// Whether a whole line is already read (the next [`Driver::next`] may
    /// answer without waiting).
    pub fn has_buffered(&self) -> bool {
        self.lines.has_ready()
    }

    /// The next line from the driver, or its end.
    pub async fn next(&mut self) -> Result<Next, String> {
        loop {
            if let Some(l) = self.lines.pop() {
                match parse_line(&l) {
                    Some(line) => return Ok(Next::Line(line)),
                    None => {
                        tracing::debug!(len = l.len(), "dropping an unknown line from a driver");
                        continue;
                    }
                }
            }
            match self.proc.next_event().await {
                Ok(Some(ProcessEvent::Stdout(b))) => self.lines.push(&b),
                Ok(Some(ProcessEvent::Stderr(b))) => {
                    self.stderr_tail.extend_from_slice(&b);
                    if self.stderr_tail.len() > STDERR_TAIL {
                        let cut = self.stderr_tail.len() - STDERR_TAIL;
                        self.stderr_tail.drain(..cut);
                    }
                }
                Ok(Some(ProcessEvent::Exit(s))) => return Ok(Next::Exited(s)),
                Ok(None) => return Err("the driver's output ended without an exit status".into()),
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// Reads the driver's output until it has ended (its exit, or its stream
    /// gone).
    pub async fn wait_exit(mut self) {
        while let Ok(Next::Line(_)) = self.next().await {}
    }

    /// Ends the driver and its kernel (one process group).
    pub async fn kill(&self, guest: &GuestClient) {
        kill(guest, self.proc.id()).await;
    }
}

/// Ends every driver still running in a sandbox (and its kernel): after a
/// daemon restart none of them belongs to a context any more. Returns how
/// many it ended.
pub async fn end_stale(guest: &GuestClient) -> usize {
    let sweep = async {
        let procs = match guest.list_processes().await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("listing a re-adopted sandbox's processes: {e}");
                return 0;
            }
        };
        let mut ended = 0;
        for p in procs {
            let stale =
                p.exit.is_none() && p.tag.as_deref().is_some_and(|t| t.starts_with(TAG_PREFIX));
            if stale {
                kill(guest, p.id).await;
                ended += 1;
            }
        }
        ended
    };
    tokio::time::timeout(SWEEP_TIMEOUT, sweep)
        .await
        .unwrap_or(0)
}

/// SIGKILL to a driver's process group (the kernel is in it).
pub async fn kill(guest: &GuestClient, id: ProcessId) {
    if let Err(e) = guest.signal(id, 9).await {
        tracing::debug!("ending a code context's driver: {e}");
    }
}

/// Why a line did not reach a driver.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("writing to the driver: {0}")]
    Io(String),
    /// It stopped reading its input (its pipe and the agent's window are full):
    /// it is to be ended, a part of the line may have been sent.
    #[error("the driver did not read its input within {0:?}")]
    Stalled(Duration),
}

impl From<WriteError> for StartError {
    fn from(e: WriteError) -> StartError {
        StartError::Io(e.to_string())
    }
}

/// Writes one JSON line to a driver's stdin, within `within` (waiting for the
/// stdin's turn included).
pub async fn write_line(
    stdin: &AsyncMutex<ProcessStdin>,
    json: &str,
    within: Duration,
) -> Result<(), WriteError> {
    let write = async {
        let mut s = stdin.lock().await;
        let mut b = Vec::with_capacity(json.len() + 1);
        b.extend_from_slice(json.as_bytes());
        b.push(b'\n');
        s.write(&b).await.map_err(|e| WriteError::Io(e.to_string()))
    };
    tokio::time::timeout(within, write)
        .await
        .unwrap_or(Err(WriteError::Stalled(within)))
}

/// "exit code 3", "killed by signal 11 (SIGSEGV)".
pub fn describe_end(code: Option<i32>, signal: Option<i32>) -> String {
    match (code, signal) {
        (_, Some(s)) => {
            let name = match s {
                6 => " (SIGABRT)",
                9 => " (SIGKILL: out of memory, or killed)",
                11 => " (SIGSEGV: a segmentation fault)",
                7 => " (SIGBUS)",
                4 => " (SIGILL)",
                8 => " (SIGFPE)",
                15 => " (SIGTERM)",
                _ => "",
            };
            format!("killed by signal {s}{name}")
        }
        (Some(c), None) => format!("exit code {c}"),
        (None, None) => "it ended".into(),
    }
}

/// `s` cut to at most `max` bytes (on a character boundary).
pub fn bounded(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitter_yields_lines_across_chunks() {
        let mut s = LineSplitter::new(100);
        s.push(b"{\"a\":1}\n{\"b\"");
        s.push(b":2}\n");
        assert_eq!(s.pop().as_deref(), Some(&b"{\"a\":1}"[..]));
        assert_eq!(s.pop().as_deref(), Some(&b"{\"b\":2}"[..]));
        assert_eq!(s.pop(), None);
    }

    #[test]
    fn splitter_drops_an_overlong_line_whole_and_keeps_the_next() {
        let mut s = LineSplitter::new(8);
        s.push(b"0123456");
        s.push(b"789abc");
        s.push(b"def\nok\n");
        assert_eq!(s.pop().as_deref(), Some(&b"ok"[..]));
        assert_eq!(s.pop(), None);
        assert_eq!(s.dropped, 1);
    }

    #[test]
    fn outside_a_run_a_line_past_the_idle_limit_is_dropped() {
        let mut s = LineSplitter::new(MAX_LINE);
        s.push(&vec![b'x'; IDLE_LINE + 1]);
        s.push(b"\nok\n");
        assert_eq!(s.pop().as_deref(), Some(&b"ok"[..]));
        assert_eq!(s.pop(), None);
        assert_eq!(s.dropped, 1);
    }

    #[test]
    fn during_a_run_a_half_gathered_line_is_counted_and_dropped_when_the_run_ends() {
        let pool = OutputPool::new(32 << 10);
        let mut s = LineSplitter::new(1 << 20);
        s.charge_to(Some(pool.clone()));
        s.push(&vec![b'x'; UNCOUNTED_LINE + (16 << 10)]);
        assert!(pool.held() >= 16 << 10);
        assert!(s.buf.capacity() <= UNCOUNTED_LINE + pool.held());
        // Past the pool: dropped whole, its bytes given back.
        s.push(&vec![b'x'; 32 << 10]);
        assert_eq!((pool.held(), s.dropped), (0, 1));
        // A full pool still lets small lines through.
        let full = pool.take(32 << 10).unwrap();
        s.push(b"\n{\"t\":\"done\"}\npart");
        assert_eq!(s.pop().as_deref(), Some(&br#"{"t":"done"}"#[..]));
        drop(full);
        s.charge_to(None);
        assert_eq!((pool.held(), s.dropped), (0, 2));
        s.push(b"ial\nnext\n");
        assert_eq!(s.pop().as_deref(), Some(&b"next"[..]));
    }

    #[test]
    fn the_line_buffer_grows_no_larger_than_its_limit() {
        let mut s = LineSplitter::new(MAX_LINE);
        s.charge_to(Some(OutputPool::new(usize::MAX)));
        let chunk = vec![b'x'; 64 << 10];
        while s.buf.len() + chunk.len() <= MAX_LINE {
            s.push(&chunk);
        }
        assert!(s.buf.capacity() <= MAX_LINE, "{}", s.buf.capacity());
    }

    #[test]
    fn unknown_and_malformed_lines_are_not_parsed() {
        assert_eq!(parse_line(br#"{"t":"launch_missiles"}"#), None);
        assert_eq!(parse_line(br#"{"t":"stdout"}"#), None);
        assert_eq!(parse_line(b"not json"), None);
        assert_eq!(
            parse_line(br#"{"t":"stdout","text":"hi","extra":1}"#),
            Some(DriverLine::Stdout { text: "hi".into() })
        );
    }

    #[test]
    fn a_result_line_keeps_its_bundle_as_text() {
        let l = parse_line(
            br#"{"t":"result","main":true,"data":{"text/plain":"1","application/json":[{"a":0}]}}"#,
        )
        .unwrap();
        let DriverLine::Result { main, data } = l else {
            panic!("{l:?}")
        };
        assert!(main);
        assert_eq!(data.get("application/json").unwrap().get(), r#"[{"a":0}]"#);
        // Fields in any order; a result without its bundle is no line.
        assert!(matches!(
            parse_line(br#"{"data":{},"main":false,"t":"result"}"#),
            Some(DriverLine::Result { main: false, .. })
        ));
        assert_eq!(parse_line(br#"{"t":"result","main":true}"#), None);
    }

    #[test]
    fn bounded_cuts_on_a_character_boundary() {
        assert_eq!(bounded("héllo", 2), "h...");
        assert_eq!(bounded("abc", 5), "abc");
    }

    #[test]
    fn ends_name_the_signal() {
        assert_eq!(
            describe_end(None, Some(11)),
            "killed by signal 11 (SIGSEGV: a segmentation fault)"
        );
        assert_eq!(describe_end(Some(3), None), "exit code 3");
    }
}
