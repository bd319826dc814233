//! envd's `process.Process` service over the daemon's processes: Start runs
//! through the native exec path (the process is supervised, counted and listed
//! like any other), the output stream is the supervisor's lossless stream.
//! E2B names processes by their pid in the sandbox (or a tag); the daemon's
//! process ids stay internal.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;
use futures_util::StreamExt;
use sandlot_guest::client::{ProcessId, ProcessInfo};
use sandlot_proto::api::{ExecBody, ProcessExit, PtySize};
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect::{self, b64, unb64, Code, ConnectError, FrameDecoder, StreamSender};
use super::envd::{request_message, Ctx};
use crate::error::ApiError;
use crate::process::{OutEvent, ProcEntry};
use crate::services::process;
use crate::services::process::Source;

/// After the exit, output descendants still write is forwarded for this long
/// before the end event closes the stream.
const AFTER_EXIT: Duration = Duration::from_millis(200);
/// Output events buffered between the supervisor and the stream.
const READER_CAPACITY: usize = 16;

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProcessConfig {
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: BTreeMap<String, String>,
    pub cwd: Option<String>,
}

#[derive(Debug, Default, Deserialize, Clone, Copy)]
#[serde(default)]
pub struct Size {
    pub cols: u32,
    pub rows: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Pty {
    pub size: Option<Size>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct StartRequest {
    pub process: Option<ProcessConfig>,
    pub pty: Option<Pty>,
    pub tag: Option<String>,
    pub stdin: Option<bool>,
}

/// `ProcessSelector`: a pid (uint32) or a tag.
#[derive(Debug, Default, Deserialize, Clone)]
#[serde(default)]
pub struct Selector {
    pub pid: Option<Value>,
    pub tag: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ProcessRequest {
    pub process: Option<Selector>,
    pub input: Option<Input>,
    pub signal: Option<Value>,
    pub pty: Option<Pty>,
}

/// `ProcessInput`: base64 bytes for stdin or the PTY.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Input {
    pub stdin: Option<String>,
    pub pty: Option<String>,
}

impl Input {
    pub fn bytes(&self) -> Result<Vec<u8>, ConnectError> {
        match (&self.stdin, &self.pty) {
            (Some(s), _) | (None, Some(s)) => unb64(s),
            (None, None) => Ok(Vec::new()),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StreamInputRequest {
    start: Option<ProcessRequest>,
    data: Option<ProcessRequest>,
}

/// What E2B shows of a process that the daemon does not keep: its environment
/// and working directory, by sandbox and daemon process id. `List` shows running
/// processes only, so an entry lives while its process runs; a sandbox's entries
/// hold at most [`META_BYTES_PER_SANDBOX`] (each counting 128 bytes besides its
/// text; a process started past that lists with no environment), and the entries
/// of sandboxes that are gone are dropped when another sandbox starts its first.
#[derive(Default)]
pub struct ProcMeta {
    m: Mutex<HashMap<String, SandboxMeta>>,
}

/// Bytes of environment and working directory kept per sandbox.
pub const META_BYTES_PER_SANDBOX: usize = 1 << 20;
/// What one entry counts besides its text.
const ENTRY_OVERHEAD: usize = 128;

type EnvAndCwd = (BTreeMap<String, String>, Option<String>);

#[derive(Default)]
struct SandboxMeta {
    procs: BTreeMap<u64, (EnvAndCwd, usize)>,
    bytes: usize,
}

impl ProcMeta {
    /// Keeps `envs` and `cwd` of process `id` of `sandbox`. `running` says which
    /// of the sandbox's processes still run, `live` which sandboxes still are.
    fn insert(
        &self,
        sandbox: &str,
        id: u64,
        envs: BTreeMap<String, String>,
        cwd: Option<String>,
        running: impl Fn(u64) -> bool,
        live: impl Fn(&str) -> bool,
    ) {
        // Each entry counts its keeping too, so that empty ones are bounded.
        let size = ENTRY_OVERHEAD
            + envs.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
            + cwd.as_ref().map_or(0, String::len);
        let mut m = self.m.lock().unwrap_or_else(|e| e.into_inner());
        if !m.contains_key(sandbox) {
            // A sandbox's first process: those of sandboxes that are gone go.
            m.retain(|sb, _| live(sb));
        }
        let sb = m.entry(sandbox.to_string()).or_default();
        if sb.bytes + size > META_BYTES_PER_SANDBOX {
            sb.procs.retain(|p, _| running(*p));
            sb.bytes = sb.procs.values().map(|(_, n)| n).sum();
        }
        if sb.bytes + size <= META_BYTES_PER_SANDBOX {
            sb.bytes += size;
            sb.procs.insert(id, ((envs, cwd), size));
        }
    }

    fn get(&self, sandbox: &str, id: u64) -> EnvAndCwd {
        self.m
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(sandbox)
            .and_then(|sb| sb.procs.get(&id))
            .map(|(meta, _)| meta.clone())
            .unwrap_or_default()
    }

    /// Bytes kept for `sandbox`.
    #[cfg(test)]
    fn bytes_of(&self, sandbox: &str) -> usize {
        self.m
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(sandbox)
            .map_or(0, |sb| sb.bytes)
    }
}

/// A signal of the `process.Signal` enum (by name or number) as a number.
pub fn signal_number(v: &Value) -> Result<i32, ConnectError> {
    let n = match v {
        Value::String(s) => match s.as_str() {
            "SIGNAL_SIGKILL" | "SIGKILL" => 9,
            "SIGNAL_SIGTERM" | "SIGTERM" => 15,
            other => other.parse().unwrap_or(0),
        },
        other => connect::int_value(other).unwrap_or(0) as i32,
    };
    if !(1..=64).contains(&n) {
        return Err(ConnectError::invalid(format!(
            "signal {v} is not supported (SIGNAL_SIGKILL or SIGNAL_SIGTERM)"
        )));
    }
    Ok(n)
}

/// Go's name of a signal in `ProcessState.String()` ("signal: killed").
fn signal_text(sig: i32) -> String {
    match sig {
        1 => "hangup".into(),
        2 => "interrupt".into(),
        3 => "quit".into(),
        6 => "aborted".into(),
        9 => "killed".into(),
        11 => "segmentation fault".into(),
        13 => "broken pipe".into(),
        15 => "terminated".into(),
        n => format!("signal {n}"),
    }
}

/// The `EndEvent` of an exit, as envd reports it: `exitCode` -1 and `exited`
/// false when a signal ended it; `error` is the status text when not 0.
pub fn end_event(x: &ProcessExit) -> Value {
    let (code, exited, status) = match (x.code, x.signal) {
        (Some(c), _) => (c, true, format!("exit status {c}")),
        (None, Some(s)) => (-1, false, format!("signal: {}", signal_text(s))),
        (None, None) => (-1, false, "unknown".to_string()),
    };
    let mut end = json!({"exitCode": code, "exited": exited, "status": status});
    if code != 0 {
        end["error"] = json!(status);
    }
    json!({"event": {"end": end}})
}

fn data_event(stream: &str, b: &[u8]) -> Value {
    json!({"event": {"data": {stream: b64(b)}}})
}

fn start_event(pid: i32) -> Value {
    json!({"event": {"start": {"pid": pid}}})
}

/// The process a selector names: running ones only (an exited process is gone
/// for E2B). The daemon's record when it has one, else the agent's.
enum Found {
    Entry(Arc<ProcEntry>),
    Agent(ProcessInfo),
}

impl Found {
    fn id(&self) -> u64 {
        match self {
            Found::Entry(e) => e.id,
            Found::Agent(i) => i.id.0,
        }
    }
    fn pid(&self) -> i32 {
        match self {
            Found::Entry(e) => e.pid,
            Found::Agent(i) => i.pid,
        }
    }
    fn pty(&self) -> bool {
        match self {
            Found::Entry(e) => e.pty,
            Found::Agent(i) => i.pty,
        }
    }
}

async fn find(ctx: &Ctx, sel: Option<&Selector>) -> Result<Found, ConnectError> {
    let sel = sel.ok_or_else(|| ConnectError::invalid("process: a pid or tag is required"))?;
    let pid = match &sel.pid {
        Some(v) => Some(
            connect::int_value(v)
                .ok_or_else(|| ConnectError::invalid(format!("process.pid: {v} is not a pid")))?
                as i32,
        ),
        None => None,
    };
    let tag = sel.tag.clone();
    if pid.is_none() && tag.is_none() {
        return Err(ConnectError::invalid("process: a pid or tag is required"));
    }
    let matches = |p: i32, t: &Option<String>| match pid {
        Some(want) => p == want,
        None => t == &tag,
    };
    let known = ctx.h.procs.lock().unwrap_or_else(|e| e.into_inner()).all();
    if let Some(e) = known
        .iter()
        .rev()
        .find(|e| e.exit().is_none() && matches(e.pid, &e.tag))
    {
        return Ok(Found::Entry(e.clone()));
    }
    let agent = ctx
        .h
        .guest
        .list_processes()
        .await
        .map_err(|e| ConnectError::from(ApiError::from_guest(e, "list processes")))?;
    if let Some(i) = agent.into_iter().find(|i| {
        i.exit.is_none()
            && matches(i.pid, &i.tag)
            && !known.iter().any(|e| e.id == i.id.0 && e.exit().is_some())
    }) {
        return Ok(Found::Agent(i));
    }
    Err(ConnectError::not_found(match pid {
        Some(p) => format!("process with pid {p} not found"),
        None => format!("process with tag {:?} not found", tag.unwrap_or_default()),
    }))
}

/// Unary methods and the server streams of `process.Process`.
pub async fn call(
    ctx: Ctx,
    method: &str,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ConnectError> {
    let streaming = matches!(method, "Start" | "Connect");
    let msg = request_message(&ctx, body, streaming).await?;
    match method {
        "Start" => start(ctx, connect::parse_message(&msg)?, headers).await,
        "Connect" => attach(ctx, connect::parse_message(&msg)?, headers).await,
        "List" => list(&ctx).await,
        "SendInput" => {
            let r: ProcessRequest = connect::parse_message(&msg)?;
            let f = find(&ctx, r.process.as_ref()).await?;
            let data = r.input.unwrap_or_default().bytes()?;
            write_input(&ctx, &f, &data).await?;
            Ok(connect::unary_ok(&json!({})))
        }
        "SendSignal" => {
            let r: ProcessRequest = connect::parse_message(&msg)?;
            let sig = signal_number(r.signal.as_ref().unwrap_or(&Value::Null))?;
            let f = find(&ctx, r.process.as_ref()).await?;
            process::signal(&ctx.h, f.id(), f.pid(), sig).await?;
            if sig == libc::SIGKILL {
                gone(&ctx, ProcessId(f.id())).await;
            }
            Ok(connect::unary_ok(&json!({})))
        }
        "Update" => {
            let r: ProcessRequest = connect::parse_message(&msg)?;
            let f = find(&ctx, r.process.as_ref()).await?;
            if let Some(size) = r.pty.and_then(|p| p.size) {
                let (rows, cols) = pty_size(size)?;
                process::resize(&ctx.h, f.id(), f.pid(), rows, cols).await?;
            }
            Ok(connect::unary_ok(&json!({})))
        }
        "CloseStdin" => {
            let r: ProcessRequest = connect::parse_message(&msg)?;
            match find(&ctx, r.process.as_ref()).await? {
                Found::Entry(e) => {
                    process::close_stdin(&ctx.h, &e).await;
                    Ok(connect::unary_ok(&json!({})))
                }
                Found::Agent(i) => Err(process::stdin_unreachable(i.pid).into()),
            }
        }
        other => Err(ConnectError::new(
            Code::Unimplemented,
            format!("process.Process/{other} is not a method of envd"),
        )),
    }
}

fn pty_size(s: Size) -> Result<(u16, u16), ConnectError> {
    let ok = |n: u32| (1..=u32::from(u16::MAX)).contains(&n);
    if !ok(s.rows) || !ok(s.cols) {
        return Err(ConnectError::invalid(format!(
            "pty.size: rows {} and cols {} must be between 1 and 65535",
            s.rows, s.cols
        )));
    }
    Ok((s.rows as u16, s.cols as u16))
}

async fn write_input(ctx: &Ctx, f: &Found, data: &[u8]) -> Result<(), ConnectError> {
    match f {
        Found::Entry(e) => Ok(process::write_stdin(&ctx.h, e, data).await?),
        Found::Agent(i) => Err(process::stdin_unreachable(i.pid).into()),
    }
}

async fn start(ctx: Ctx, req: StartRequest, headers: &HeaderMap) -> Result<Response, ConnectError> {
    let cfg = req
        .process
        .ok_or_else(|| ConnectError::invalid("process: the command to start is required"))?;
    if cfg.cmd.is_empty() {
        return Err(ConnectError::invalid("process.cmd must not be empty"));
    }
    let cwd = cfg
        .cwd
        .as_deref()
        .filter(|c| !c.is_empty())
        .map(|c| ctx.path(c))
        .transpose()?;
    let pty = match &req.pty {
        Some(p) => {
            let (rows, cols) = match p.size {
                Some(s) => pty_size(s)?,
                None => (24, 80),
            };
            Some(PtySize { rows, cols })
        }
        None => None,
    };
    let mut argv = vec![cfg.cmd.clone()];
    argv.extend(cfg.args.iter().cloned());
    let body = ExecBody {
        argv,
        env: cfg.envs.clone(),
        cwd: cwd.clone(),
        user: ctx.user.clone(),
        pty,
        timeout: None,
        // envd keeps stdin open unless asked not to (older clients never say).
        stdin: req.stdin.unwrap_or(true) || pty.is_some(),
        tag: req.tag.clone(),
        background: false,
    };
    let entry = process::start(&ctx.e2b.app, &ctx.h, &body).await?;
    let app = ctx.e2b.app.clone();
    // Asked only when the sandbox's share is full (the process table's lock is
    // never held while the metadata's is taken elsewhere).
    let running = |id: u64| {
        ctx.h
            .procs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .is_some_and(|e| e.exit().is_none())
    };
    ctx.e2b
        .procs
        .insert(&ctx.h.id, entry.id, cfg.envs, cwd, running, |sb| {
            app.handle(sb).is_some()
        });
    let rx = entry
        .subscribe_from_start(READER_CAPACITY)
        .await
        .ok_or_else(|| {
            ConnectError::new(Code::Internal, "a fresh process refused its first reader")
        })?;
    let (tx, resp) = connect::stream_response();
    let keepalive = connect::keepalive_interval(headers);
    let h = ctx.h.clone();
    let (pid, is_pty) = (entry.pid, entry.pty);
    let stop = ctx.e2b.stopping();
    tokio::spawn(async move {
        let _guard = h.active();
        if !tx.send(&start_event(pid)).await {
            return;
        }
        pump(tx, Source::Sup(rx), is_pty, keepalive, &h.id, stop).await;
    });
    Ok(resp)
}

async fn attach(
    ctx: Ctx,
    req: ProcessRequest,
    headers: &HeaderMap,
) -> Result<Response, ConnectError> {
    let f = find(&ctx, req.process.as_ref()).await?;
    let (_, src) = crate::services::process::open_output(&ctx.h, f.id(), (0, 0)).await?;
    let (tx, resp) = connect::stream_response();
    let keepalive = connect::keepalive_interval(headers);
    let h = ctx.h.clone();
    let (pid, is_pty) = (f.pid(), f.pty());
    let stop = ctx.e2b.stopping();
    tokio::spawn(async move {
        let _guard = h.active();
        if !tx.send(&start_event(pid)).await {
            return;
        }
        pump(tx, src, is_pty, keepalive, &h.id, stop).await;
    });
    Ok(resp)
}

/// Forwards output as `data` events, then the `end` event; keepalives while idle.
async fn pump(
    tx: StreamSender,
    mut src: Source,
    pty: bool,
    keepalive: Option<Duration>,
    sandbox: &str,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut end: Option<Value> = None;
    let mut drain_until = tokio::time::Instant::now();
    let period = keepalive.unwrap_or(Duration::from_secs(3600));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            ev = src.next() => match ev {
                Ok(Some(OutEvent::Stdout(_, b))) => {
                    if !tx.send(&data_event(if pty { "pty" } else { "stdout" }, &b)).await {
                        return;
                    }
                }
                Ok(Some(OutEvent::Stderr(_, b))) => {
                    if !tx.send(&data_event(if pty { "pty" } else { "stderr" }, &b)).await {
                        return;
                    }
                }
                Ok(Some(OutEvent::Exit(x))) => {
                    end = Some(end_event(&x));
                    drain_until = tokio::time::Instant::now() + AFTER_EXIT;
                }
                Ok(None) => break,
                Err(e) => {
                    tx.end(Some(ConnectError::from(e))).await;
                    return;
                }
            },
            _ = tokio::time::sleep_until(drain_until), if end.is_some() => break,
            _ = tick.tick(), if keepalive.is_some() => {
                if !tx.send(&json!({"event": {"keepalive": {}}})).await {
                    return;
                }
            }
            _ = tx.closed() => return,
            _ = &mut stop => {
                tx.end(Some(super::E2b::shutdown_error())).await;
                return;
            }
        }
    }
    match end {
        Some(end) => {
            if tx.send(&end).await {
                tx.end(None).await;
            }
        }
        None => {
            tx.end(Some(ConnectError::new(
                Code::Unavailable,
                // envd's words: the SDK then asks `/health` whether the sandbox is
                // gone and says so (`SandboxNotRunningException`).
                format!("the connection to sandbox {sandbox} ended before the stream completed"),
            )))
            .await
        }
    }
}

async fn list(ctx: &Ctx) -> Result<Response, ConnectError> {
    let l = process::list(&ctx.h).await?;
    let info = |pid: i32, argv: &[String], tag: &Option<String>, id: u64| {
        let (envs, cwd) = ctx.e2b.procs.get(&ctx.h.id, id);
        let mut config = json!({
            "cmd": argv.first().cloned().unwrap_or_default(),
            "args": argv.get(1..).unwrap_or(&[]),
            "envs": envs,
        });
        if let Some(c) = cwd {
            config["cwd"] = json!(c);
        }
        let mut p = json!({"config": config, "pid": pid});
        if let Some(t) = tag {
            p["tag"] = json!(t);
        }
        p
    };
    let mut out = Vec::new();
    for e in l.known.iter().filter(|e| l.running(e)) {
        out.push(info(e.pid, &e.argv, &e.tag, e.id));
    }
    for i in l.others().filter(|i| i.exit.is_none()) {
        out.push(info(i.pid, &i.argv, &i.tag, i.id.0));
    }
    Ok(connect::unary_ok(&json!({ "processes": out })))
}

/// `StreamInput`: a client stream of `start` (the process) then `data` messages.
pub async fn stream_input(ctx: Ctx, body: Body) -> Result<Response, ConnectError> {
    let mut d = FrameDecoder::default();
    let mut s = body.into_data_stream();
    let mut target: Option<Found> = None;
    let mut ended = false;
    let _guard = ctx.h.active();
    while let Some(chunk) = s.next().await {
        let chunk =
            chunk.map_err(|e| ConnectError::invalid(format!("reading the request stream: {e}")))?;
        d.push(&chunk);
        while let Some(f) = d.next_frame()? {
            // An end-of-stream frame (whatever its payload) is the last: nothing in
            // it or after it is input.
            if ended {
                return Err(ConnectError::invalid(
                    "the request stream goes on after its end-of-stream frame",
                ));
            }
            if f.ends_stream() {
                ended = true;
                continue;
            }
            let m: StreamInputRequest = connect::parse_message(&f.payload)?;
            if let Some(start) = m.start {
                target = Some(find(&ctx, start.process.as_ref()).await?);
            } else if let Some(data) = m.data {
                let t = target.as_ref().ok_or_else(|| {
                    ConnectError::invalid("the input stream must start with a start message")
                })?;
                let bytes = data.input.unwrap_or_default().bytes()?;
                write_input(&ctx, t, &bytes).await?;
            }
        }
    }
    d.finish()?;
    let (tx, resp) = connect::stream_response();
    tokio::spawn(async move {
        if tx.send(&json!({})).await {
            tx.end(None).await;
        }
    });
    Ok(resp)
}

/// Waits (at most 2 s) until the agent has reaped process `id`: E2B's `kill`
/// answers once the process is gone, so a `kill -0 PID` right after fails
/// rather than finding it not yet reaped.
async fn gone(ctx: &Ctx, id: ProcessId) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
    while tokio::time::Instant::now() < deadline {
        match ctx.h.guest.list_processes().await {
            Ok(ps) if ps.iter().any(|p| p.id == id && p.exit.is_none()) => {}
            _ => return,
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(code: Option<i32>, signal: Option<i32>) -> ProcessExit {
        ProcessExit {
            code,
            signal,
            core_dumped: false,
            timed_out: false,
            stdout_end: 0,
            stderr_end: 0,
        }
    }

    #[test]
    fn process_metadata_is_bounded_per_sandbox_and_kept_only_while_it_runs() {
        let meta = ProcMeta::default();
        let big = |i: u64| {
            let mut env = BTreeMap::new();
            env.insert(format!("V{i}"), "x".repeat(60 * 1024));
            env
        };
        // A tenant starting processes that keep running: the sandbox's share
        // stops at the bound; later processes list without an environment.
        for id in 0..100 {
            meta.insert("sb-a", id, big(id), Some("/w".into()), |_| true, |_| true);
        }
        assert!(meta.bytes_of("sb-a") <= META_BYTES_PER_SANDBOX);
        assert_eq!(meta.get("sb-a", 0).1.as_deref(), Some("/w"));
        assert!(meta.get("sb-a", 99).0.is_empty());
        // Once those processes have ended, their entries make room.
        for id in 100..200 {
            meta.insert("sb-a", id, big(id), None, |p| p >= 100, |_| true);
        }
        assert!(meta.bytes_of("sb-a") <= META_BYTES_PER_SANDBOX);
        assert!(meta.get("sb-a", 0).0.is_empty());
        assert!(!meta.get("sb-a", 100).0.is_empty());
        // Another sandbox has its own share.
        meta.insert("sb-b", 1, big(1), None, |_| true, |_| true);
        assert!(!meta.get("sb-b", 1).0.is_empty());
        // Empty entries count too: a sandbox cannot keep unbounded many.
        for id in 0..9_000 {
            meta.insert("sb-c", id, BTreeMap::new(), None, |_| true, |_| true);
        }
        assert!(meta.bytes_of("sb-c") <= META_BYTES_PER_SANDBOX);
        assert!(meta.m.lock().unwrap()["sb-c"].procs.len() <= META_BYTES_PER_SANDBOX / 128);
        // Gone sandboxes are forgotten when another starts its first process.
        meta.insert(
            "sb-d",
            1,
            big(1),
            None,
            |_| true,
            |sb| sb == "sb-b" || sb == "sb-d",
        );
        assert_eq!(meta.bytes_of("sb-a"), 0);
        assert_eq!(meta.bytes_of("sb-c"), 0);
        assert!(!meta.get("sb-b", 1).0.is_empty());
    }

    #[test]
    fn end_events_match_envd() {
        assert_eq!(
            end_event(&exit(Some(0), None)),
            json!({"event": {"end": {"exitCode": 0, "exited": true, "status": "exit status 0"}}})
        );
        assert_eq!(
            end_event(&exit(Some(3), None)),
            json!({"event": {"end": {"exitCode": 3, "exited": true, "status": "exit status 3", "error": "exit status 3"}}})
        );
        assert_eq!(
            end_event(&exit(None, Some(9))),
            json!({"event": {"end": {"exitCode": -1, "exited": false, "status": "signal: killed", "error": "signal: killed"}}})
        );
    }

    #[test]
    fn events_are_proto_json() {
        assert_eq!(
            data_event("stdout", b"hi\n"),
            json!({"event": {"data": {"stdout": "aGkK"}}})
        );
        assert_eq!(start_event(42), json!({"event": {"start": {"pid": 42}}}));
    }

    #[test]
    fn requests_parse_from_sdk_json() {
        let r: StartRequest = connect::parse_message(
            br#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"},"cwd":"/tmp"},"stdin":false,"tag":"t"}"#,
        )
        .unwrap();
        let p = r.process.unwrap();
        assert_eq!(p.cmd, "/bin/bash");
        assert_eq!(p.args, ["-l", "-c", "echo hi"]);
        assert_eq!(p.envs["A"], "1");
        assert_eq!(p.cwd.as_deref(), Some("/tmp"));
        assert_eq!(r.stdin, Some(false));
        let r: StartRequest = connect::parse_message(
            br#"{"process":{"cmd":"/bin/bash"},"pty":{"size":{"cols":80,"rows":24}}}"#,
        )
        .unwrap();
        let s = r.pty.unwrap().size.unwrap();
        assert_eq!((s.rows, s.cols), (24, 80));
        let r: ProcessRequest =
            connect::parse_message(br#"{"process":{"pid":7},"input":{"stdin":"aGkK"}}"#).unwrap();
        assert_eq!(r.process.unwrap().pid, Some(json!(7)));
        assert_eq!(r.input.unwrap().bytes().unwrap(), b"hi\n");
        let r: ProcessRequest =
            connect::parse_message(br#"{"process":{"tag":"x"},"signal":"SIGNAL_SIGKILL"}"#)
                .unwrap();
        assert_eq!(signal_number(r.signal.as_ref().unwrap()).unwrap(), 9);
    }

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(signal_number(&json!("SIGNAL_SIGTERM")).unwrap(), 15);
        assert_eq!(signal_number(&json!(9)).unwrap(), 9);
        assert_eq!(signal_number(&json!("15")).unwrap(), 15);
        assert!(signal_number(&json!("SIGNAL_UNSPECIFIED")).is_err());
        assert!(signal_number(&Value::Null).is_err());
    }

    #[test]
    fn pty_sizes_are_checked() {
        assert_eq!(pty_size(Size { cols: 80, rows: 24 }).unwrap(), (24, 80));
        assert!(pty_size(Size { cols: 0, rows: 24 }).is_err());
        assert!(pty_size(Size {
            cols: 70000,
            rows: 24
        })
        .is_err());
    }
}
