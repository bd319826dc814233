//! Code contexts: long-lived interpreters inside a sandbox (a Jupyter kernel behind
//! a driver process, see `driver.rs`) that keep variables, imports and the working
//! directory between runs. A run streams [`CodeEvent`]s; the daemon bounds what a
//! run may produce, times it out, interrupts it, and starts the interpreter again
//! after it died, saying so (`restarted`) on the next run.

pub mod driver;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use sandlot_guest::client::{GuestClient, ProcessId, ProcessStdin};
use sandlot_proto::api::code::{
    CodeError, CodeEvent, CodeResult, ContextView, Execution, RunStatus, DEFAULT_CONTEXT, LANGUAGES,
};
use tokio::sync::{mpsc, Mutex as AsyncMutex};

use crate::error::{ApiError, ApiResult};
use crate::store::now_ms;
use crate::timefmt::rfc3339;
use driver::{describe_end, Driver, DriverLine, DriverSpec, Next, StartError};

/// Contexts one sandbox may have at a time (each holds an interpreter's memory).
pub const MAX_CONTEXTS: usize = 16;
/// Stream text (stdout and stderr together) one run may produce; past it a marker.
pub const MAX_STREAM: usize = 8 << 20;
/// Results one run may produce, in count and in bytes of their bundles.
pub const MAX_RESULTS: usize = 256;
pub const MAX_RESULT_BYTES: usize = 32 << 20;
/// A run's timeout when the request names none, and the longest one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// How long a cell has to stop after an interrupt before the interpreter is ended.
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);
/// The marker ending a run's stream text past [`MAX_STREAM`].
const TRUNCATED: &str = "\n[output truncated: the cell wrote more than 8 MiB]\n";

/// A language a context speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    Python,
    Bash,
    Javascript,
}

impl Language {
    pub fn parse(s: &str) -> ApiResult<Language> {
        match s.to_ascii_lowercase().as_str() {
            "python" | "python3" => Ok(Language::Python),
            "bash" | "sh" => Ok(Language::Bash),
            "javascript" | "js" => Ok(Language::Javascript),
            _ => Err(ApiError::invalid(
                "language",
                format!(
                    "{s:?} is not a supported language ({})",
                    LANGUAGES.join(", ")
                ),
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Bash => "bash",
            Language::Javascript => "javascript",
        }
    }
}

/// What a context is asked to be.
#[derive(Debug, Clone)]
pub struct ContextParams {
    pub language: Language,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
}

/// The contexts of one sandbox.
#[derive(Default)]
pub struct Contexts {
    map: Mutex<BTreeMap<String, Arc<Context>>>,
}

impl Contexts {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Context>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, id: &str) -> Option<Arc<Context>> {
        self.map().get(id).cloned()
    }

    pub fn all(&self) -> Vec<Arc<Context>> {
        self.map().values().cloned().collect()
    }

    /// Creates a context and starts its interpreter.
    pub async fn create(
        &self,
        guest: &GuestClient,
        id: Option<&str>,
        params: ContextParams,
    ) -> ApiResult<Arc<Context>> {
        let ctx = {
            let mut m = self.map();
            if m.len() >= MAX_CONTEXTS {
                return Err(ApiError::quota(format!(
                    "a sandbox has at most {MAX_CONTEXTS} code contexts: delete one first"
                )));
            }
            let id = match id {
                Some(id) => id.to_string(),
                None => format!("ctx_{}", crate::auth::random_hex(6)),
            };
            if m.contains_key(&id) {
                return Err(ApiError::conflict(format!("context {id} exists")));
            }
            let ctx = Arc::new(Context::new(id.clone(), params));
            m.insert(id, ctx.clone());
            ctx
        };
        let started = {
            let mut r = ctx.runner.lock().await;
            ctx.ensure_started(guest, &mut r).await
        };
        if let Err(e) = started {
            self.map().remove(&ctx.id);
            return Err(e);
        }
        Ok(ctx)
    }

    /// The context `id`. The default ones are created on first use: `default`
    /// (Python) and `default-LANGUAGE` (`default-bash`, `default-javascript`).
    pub async fn get_or_default(&self, guest: &GuestClient, id: &str) -> ApiResult<Arc<Context>> {
        if let Some(c) = self.get(id) {
            return Ok(c);
        }
        let not_found = || ApiError::not_found(format!("no code context {id}"));
        let language = match default_language(id) {
            Some(l) => l,
            None => return Err(not_found()),
        };
        let params = ContextParams {
            language,
            cwd: None,
            env: BTreeMap::new(),
        };
        match self.create(guest, Some(id), params).await {
            // Created meanwhile by another request.
            Err(e) if e.status == StatusCode::CONFLICT => self.get(id).ok_or_else(not_found),
            r => r,
        }
    }

    /// Starts the default (Python) context of a sandbox that has no handle yet (a
    /// warm pool's), to be [`Contexts::adopt`]ed at its claim.
    pub async fn prestart(guest: &GuestClient) -> ApiResult<Arc<Context>> {
        let ctx = Arc::new(Context::new(
            DEFAULT_CONTEXT.to_string(),
            ContextParams {
                language: Language::Python,
                cwd: None,
                env: BTreeMap::new(),
            },
        ));
        {
            let mut r = ctx.runner.lock().await;
            ctx.ensure_started(guest, &mut r).await?;
        }
        Ok(ctx)
    }

    /// Takes a context started ahead ([`Contexts::prestart`]); one that was ended
    /// meanwhile is dropped (its id is created again on first use).
    pub fn adopt(&self, ctx: Arc<Context>) {
        if ctx.deleted.load(Ordering::SeqCst) {
            return;
        }
        self.map().entry(ctx.id.clone()).or_insert(ctx);
    }

    /// Ends a context's interpreter and forgets it.
    pub async fn remove(&self, guest: &GuestClient, id: &str) -> ApiResult<()> {
        let ctx = self
            .map()
            .remove(id)
            .ok_or_else(|| ApiError::not_found(format!("no code context {id}")))?;
        ctx.deleted.store(true, Ordering::SeqCst);
        ctx.kill(guest).await;
        Ok(())
    }
}

/// The language of a default context's id (`default`, `default-bash`, ...).
pub fn default_language(id: &str) -> Option<Language> {
    if id == DEFAULT_CONTEXT {
        return Some(Language::Python);
    }
    let l = Language::parse(id.strip_prefix("default-")?).ok()?;
    (id == default_context(l)).then_some(l)
}

/// The id of the default context of a language.
pub fn default_context(l: Language) -> String {
    match l {
        Language::Python => DEFAULT_CONTEXT.to_string(),
        other => format!("{DEFAULT_CONTEXT}-{}", other.as_str()),
    }
}

/// The driver a context runs now, as seen outside its runner lock.
#[derive(Default)]
struct Control {
    process: Option<ProcessId>,
    stdin: Option<Arc<AsyncMutex<ProcessStdin>>>,
}

/// Held by the run in progress (runs of one context take turns).
#[derive(Default)]
struct Runner {
    driver: Option<Driver>,
    /// An interpreter ran before and ended without being asked to: the next
    /// run says its state was lost.
    lost: bool,
    started_once: bool,
}

/// One context.
pub struct Context {
    pub id: String,
    pub params: ContextParams,
    created_at_ms: i64,
    runner: AsyncMutex<Runner>,
    control: Mutex<Control>,
    restarts: AtomicU64,
    busy: AtomicBool,
    running: AtomicBool,
    deleted: AtomicBool,
}

/// What a run was asked.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub code: String,
    pub env: BTreeMap<String, String>,
    pub timeout: Duration,
}

/// The sandbox's out-of-memory kill count (its memory cgroup's, written by the
/// kernel, read through its instance), to tell a kernel killed for memory from one
/// killed otherwise.
pub type OomProbe = Option<Arc<dyn Fn() -> Option<u64> + Send + Sync>>;

fn oom_kills(p: &OomProbe) -> Option<u64> {
    p.as_ref().and_then(|f| f())
}

/// The [`OomProbe`] of sandbox `h`.
pub fn oom_probe(h: &Arc<crate::sandbox::SandboxHandle>) -> OomProbe {
    let h = h.clone();
    Some(Arc::new(move || h.inst.usage().map(|u| u.oom_kills)))
}

impl Context {
    fn new(id: String, params: ContextParams) -> Context {
        Context {
            id,
            params,
            created_at_ms: now_ms(),
            runner: AsyncMutex::new(Runner::default()),
            control: Mutex::new(Control::default()),
            restarts: AtomicU64::new(0),
            busy: AtomicBool::new(false),
            running: AtomicBool::new(false),
            deleted: AtomicBool::new(false),
        }
    }

    fn control(&self) -> std::sync::MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn view(&self) -> ContextView {
        let state = if self.busy.load(Ordering::Relaxed) {
            "busy"
        } else if self.running.load(Ordering::Relaxed) {
            "idle"
        } else {
            "stopped"
        };
        ContextView {
            id: self.id.clone(),
            language: self.params.language.as_str().into(),
            cwd: self.params.cwd.clone(),
            state: state.into(),
            restarts: self.restarts.load(Ordering::Relaxed),
            created_at: rfc3339(self.created_at_ms),
        }
    }

    fn spec(&self) -> DriverSpec {
        DriverSpec {
            language: self.params.language.as_str().into(),
            cwd: self.params.cwd.clone(),
            env: self.params.env.clone(),
            tag: format!("code context {}", self.id),
        }
    }

    /// Starts the interpreter if none runs; returns whether this started a new one
    /// after an earlier one.
    async fn ensure_started(&self, guest: &GuestClient, r: &mut Runner) -> ApiResult<bool> {
        if r.driver.is_some() {
            return Ok(false);
        }
        if self.deleted.load(Ordering::SeqCst) {
            return Err(ApiError::not_found(format!("no code context {}", self.id)));
        }
        let d = Driver::start(guest, &self.spec())
            .await
            .map_err(|e| start_error(e, self.params.language))?;
        {
            let mut c = self.control();
            c.process = Some(d.process_id());
            c.stdin = Some(d.stdin());
        }
        // Deleted while it started: end it.
        if self.deleted.load(Ordering::SeqCst) {
            d.kill(guest).await;
            return Err(ApiError::not_found(format!("no code context {}", self.id)));
        }
        r.driver = Some(d);
        self.running.store(true, Ordering::Relaxed);
        let again = r.started_once;
        if again {
            self.restarts.fetch_add(1, Ordering::Relaxed);
        }
        r.started_once = true;
        Ok(again)
    }

    /// Ends the context for good (its interpreter too); it is not adopted.
    pub async fn end(&self, guest: &GuestClient) {
        self.deleted.store(true, Ordering::SeqCst);
        self.kill(guest).await;
    }

    /// Ends the interpreter now (a run in progress ends as crashed).
    async fn kill(&self, guest: &GuestClient) {
        let id = self.control().process;
        if let Some(id) = id {
            driver::kill(guest, id).await;
        }
    }

    fn forget_driver(&self, r: &mut Runner) {
        r.driver = None;
        *self.control() = Control::default();
        self.running.store(false, Ordering::Relaxed);
    }

    /// Ends the interpreter and starts a new one (state is lost, as asked).
    pub async fn restart(&self, guest: &GuestClient) -> ApiResult<()> {
        self.kill(guest).await;
        let mut r = self.runner.lock().await;
        if let Some(d) = r.driver.take() {
            d.kill(guest).await;
        }
        self.forget_driver(&mut r);
        r.lost = false;
        self.ensure_started(guest, &mut r).await.map(|_| ())
    }

    /// Asks the kernel to interrupt the cell running now (nothing if idle).
    pub async fn interrupt(&self) -> bool {
        let stdin = self.control().stdin.clone();
        match stdin {
            Some(s) => driver::write_line(&s, r#"{"op":"interrupt"}"#)
                .await
                .is_ok(),
            None => false,
        }
    }

    /// Runs `req`, sending events to `out` (a closed `out` does not stop the run:
    /// its output is still read, so that the next run starts in step). The last
    /// event is `end`, or `error` if the interpreter could not be started.
    pub async fn run(
        self: Arc<Self>,
        guest: GuestClient,
        req: RunRequest,
        oom: OomProbe,
        out: Sink,
    ) {
        let mut r = self.runner.lock().await;
        let restarted = match self.ensure_started(&guest, &mut r).await {
            Ok(again) => again && std::mem::take(&mut r.lost),
            Err(e) => {
                out.fail(e).await;
                return;
            }
        };
        self.busy.store(true, Ordering::Relaxed);
        out.send(CodeEvent::Started {
            context: self.view(),
            restarted,
        })
        .await;
        let ooms = oom_kills(&oom);
        let mut end = self.run_cell(&guest, &mut r, &req, &out).await;
        if end.status == RunStatus::Crashed && ooms.is_some() && oom_kills(&oom) > ooms {
            if let Some(e) = &mut end.error {
                e.value = "the interpreter was killed for running out of memory (the sandbox's \
                           memory limit); the next run starts a new interpreter, without this \
                           one's state"
                    .into();
            }
        }
        if end.lost {
            if let Some(d) = r.driver.take() {
                d.kill(&guest).await;
            }
            self.forget_driver(&mut r);
            r.lost = !self.deleted.load(Ordering::SeqCst);
        }
        self.busy.store(false, Ordering::Relaxed);
        out.send(CodeEvent::End {
            status: end.status,
            execution_count: end.count,
            error: end.error,
            restarted,
            truncated: end.truncated,
        })
        .await;
    }

    async fn run_cell(
        &self,
        guest: &GuestClient,
        r: &mut Runner,
        req: &RunRequest,
        out: &Sink,
    ) -> CellEnd {
        let d = r.driver.as_mut().expect("started above");
        let mut end = CellEnd::default();
        let line = serde_json::json!({"op": "run", "code": req.code, "env": req.env}).to_string();
        if let Err(e) = d.send_line(&line).await {
            return end.died(format!("the interpreter is gone ({e})"));
        }
        let mut budget = Budget::default();
        let deadline = tokio::time::Instant::now() + req.timeout;
        let mut timed_out = false;
        let mut grace = None;
        loop {
            let wait_until = grace.unwrap_or(deadline);
            let next = tokio::select! {
                n = d.next() => n,
                _ = tokio::time::sleep_until(wait_until) => {
                    if grace.is_some() {
                        // The cell did not stop: end the interpreter.
                        d.kill(guest).await;
                        end.status = RunStatus::TimedOut;
                        end.error = Some(timeout_error(req.timeout, true));
                        end.lost = true;
                        return end;
                    }
                    timed_out = true;
                    let _ = d.send_line(r#"{"op":"interrupt"}"#).await;
                    grace = Some(tokio::time::Instant::now() + INTERRUPT_GRACE);
                    continue;
                }
            };
            match next {
                Ok(Next::Line(l)) => match l {
                    DriverLine::Stdout { text } => {
                        if let Some(t) = budget.stream(&text, &mut end) {
                            out.send(CodeEvent::Stdout { text: t }).await;
                        }
                    }
                    DriverLine::Stderr { text } => {
                        if let Some(t) = budget.stream(&text, &mut end) {
                            out.send(CodeEvent::Stderr { text: t }).await;
                        }
                    }
                    DriverLine::Result { main, data } => {
                        if budget.result(&data, &mut end) {
                            out.send(CodeEvent::Result {
                                result: CodeResult {
                                    is_main_result: main,
                                    data,
                                },
                            })
                            .await;
                        }
                    }
                    DriverLine::Exception {
                        name,
                        value,
                        traceback,
                    } => {
                        let e = CodeError {
                            name: driver::bounded(&name, 1000),
                            value: driver::bounded(&value, 64 << 10),
                            traceback: driver::bounded(&traceback, 1 << 20),
                        };
                        out.send(CodeEvent::Exception { error: e.clone() }).await;
                        end.error = Some(e);
                    }
                    DriverLine::Done {
                        count,
                        status,
                        truncated,
                    } => {
                        end.count = count;
                        end.truncated |= truncated;
                        end.status = if timed_out {
                            end.error = Some(timeout_error(req.timeout, false));
                            RunStatus::TimedOut
                        } else if status == "ok" {
                            RunStatus::Ok
                        } else {
                            RunStatus::Error
                        };
                        return end;
                    }
                    DriverLine::Died { code, signal } => {
                        return end.died(format!(
                            "the interpreter died ({})",
                            describe_end(code, signal)
                        ));
                    }
                    // Only meaningful while starting.
                    DriverLine::Ready | DriverLine::Fatal { .. } => {}
                },
                Ok(Next::Exited(s)) => {
                    let why = if self.deleted.load(Ordering::SeqCst) {
                        "the context was deleted".to_string()
                    } else {
                        format!("the interpreter died ({})", describe_end(s.code, s.signal))
                    };
                    return end.died(why);
                }
                Err(e) => return end.died(format!("the interpreter is gone ({e})")),
            }
        }
    }
}

fn timeout_error(t: Duration, ended: bool) -> CodeError {
    let mut value = format!("the cell ran longer than its timeout of {t:?} and was interrupted");
    if ended {
        value.push_str("; it did not stop, so the interpreter was ended and its state is lost");
    }
    CodeError {
        name: "TimeoutError".into(),
        value,
        traceback: String::new(),
    }
}

fn start_error(e: StartError, lang: Language) -> ApiError {
    match e {
        StartError::Exec(e) => {
            use sandlot_guest::client::ErrorCode as C;
            match e.code() {
                Some(C::NotFound | C::SpawnFailed | C::PermissionDenied) => ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "kernel_unavailable",
                    format!(
                        "{} contexts need python3 in the sandbox (with ipykernel for Python): {e}",
                        lang.as_str()
                    ),
                ),
                _ => ApiError::from_guest(e, "starting the code context"),
            }
        }
        StartError::Unavailable { .. } | StartError::Ended { .. } => ApiError::new(
            StatusCode::BAD_REQUEST,
            "kernel_unavailable",
            driver::bounded(&e.to_string(), 2000),
        ),
        StartError::Timeout(_) => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            format!("starting the code context: {e}"),
        ),
        StartError::Io(_) => ApiError::internal(format!("starting the code context: {e}")),
    }
}

/// How a cell ended.
#[derive(Debug)]
struct CellEnd {
    status: RunStatus,
    count: Option<u64>,
    error: Option<CodeError>,
    truncated: bool,
    /// The interpreter is gone (or was ended): its state is lost.
    lost: bool,
}

impl Default for CellEnd {
    fn default() -> Self {
        CellEnd {
            status: RunStatus::Ok,
            count: None,
            error: None,
            truncated: false,
            lost: false,
        }
    }
}

impl CellEnd {
    fn died(mut self, why: String) -> CellEnd {
        self.status = RunStatus::Crashed;
        self.lost = true;
        self.error = Some(CodeError {
            name: "KernelDied".into(),
            value: format!(
                "{why}; the next run starts a new interpreter, without this one's state"
            ),
            traceback: String::new(),
        });
        self
    }
}

/// What a run may still produce.
#[derive(Default)]
struct Budget {
    stream: usize,
    results: usize,
    result_bytes: usize,
    stream_cut: bool,
}

impl Budget {
    /// The part of `text` within the run's stream cap (the marker once past it).
    fn stream(&mut self, text: &str, end: &mut CellEnd) -> Option<String> {
        if self.stream_cut {
            return None;
        }
        let room = MAX_STREAM - self.stream;
        if text.len() <= room {
            self.stream += text.len();
            return Some(text.to_string());
        }
        self.stream_cut = true;
        end.truncated = true;
        let mut cut = room;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        self.stream = MAX_STREAM;
        Some(format!("{}{TRUNCATED}", &text[..cut]))
    }

    fn result(&mut self, data: &BTreeMap<String, serde_json::Value>, end: &mut CellEnd) -> bool {
        let size: usize = data
            .iter()
            .map(|(k, v)| {
                k.len()
                    + match v {
                        serde_json::Value::String(s) => s.len(),
                        other => other.to_string().len(),
                    }
            })
            .sum();
        if self.results >= MAX_RESULTS || self.result_bytes + size > MAX_RESULT_BYTES {
            end.truncated = true;
            return false;
        }
        self.results += 1;
        self.result_bytes += size;
        true
    }
}

/// One item of a run's event channel: an event, or the error that ended the run
/// before it started.
pub type RunItem = Result<CodeEvent, ApiError>;

/// Where a run's events go. Once the receiver is gone, events are dropped.
pub struct Sink {
    tx: mpsc::Sender<RunItem>,
    closed: AtomicBool,
}

impl Sink {
    pub fn new(tx: mpsc::Sender<RunItem>) -> Sink {
        Sink {
            tx,
            closed: AtomicBool::new(false),
        }
    }

    async fn send(&self, ev: CodeEvent) {
        self.put(Ok(ev)).await
    }

    async fn fail(&self, e: ApiError) {
        self.put(Err(e)).await
    }

    async fn put(&self, item: RunItem) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        if self.tx.send(item).await.is_err() {
            self.closed.store(true, Ordering::Relaxed);
        }
    }
}

/// Runs `req` in `ctx` on a task of its own (a client that leaves does not cut
/// the run short) and returns its events.
pub fn spawn_run(
    ctx: Arc<Context>,
    guest: GuestClient,
    req: RunRequest,
    oom: OomProbe,
) -> mpsc::Receiver<RunItem> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(ctx.run(guest, req, oom, Sink::new(tx)));
    rx
}

/// Collects a run's events into its [`Execution`]; an `error` event is the error.
pub async fn collect(mut rx: mpsc::Receiver<RunItem>) -> ApiResult<Execution> {
    let mut x = Execution {
        results: Vec::new(),
        stdout: Vec::new(),
        stderr: Vec::new(),
        error: None,
        execution_count: None,
        status: RunStatus::Ok,
        restarted: false,
        truncated: false,
    };
    while let Some(ev) = rx.recv().await {
        match ev? {
            CodeEvent::Started { restarted, .. } => x.restarted = restarted,
            CodeEvent::Stdout { text } => x.stdout.push(text),
            CodeEvent::Stderr { text } => x.stderr.push(text),
            CodeEvent::Result { result } => x.results.push(result),
            CodeEvent::Exception { .. } => {}
            CodeEvent::End {
                status,
                execution_count,
                error,
                restarted,
                truncated,
            } => {
                x.status = status;
                x.execution_count = execution_count;
                x.error = error;
                x.restarted = restarted;
                x.truncated = truncated;
                return Ok(x);
            }
            // Only made by the HTTP layer.
            CodeEvent::Error { .. } => {}
        }
    }
    Err(ApiError::internal(
        "a code run ended without its last event",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn languages_parse_and_unknown_ones_are_named() {
        assert_eq!(Language::parse("Python").unwrap(), Language::Python);
        assert_eq!(Language::parse("js").unwrap(), Language::Javascript);
        let e = Language::parse("cobol").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("\"cobol\""), "{}", e.message);
    }

    #[test]
    fn default_contexts_are_named_by_language() {
        assert_eq!(default_language("default"), Some(Language::Python));
        assert_eq!(default_language("default-bash"), Some(Language::Bash));
        assert_eq!(default_language("default-python"), None);
        assert_eq!(default_language("default-js"), None);
        assert_eq!(default_language("ctx_1"), None);
        assert_eq!(default_context(Language::Javascript), "default-javascript");
    }

    #[test]
    fn stream_budget_cuts_once_with_a_marker() {
        let mut b = Budget::default();
        let mut end = CellEnd::default();
        let big = "x".repeat(MAX_STREAM - 3);
        assert_eq!(b.stream(&big, &mut end).unwrap().len(), MAX_STREAM - 3);
        let t = b.stream("abcdef", &mut end).unwrap();
        assert!(t.starts_with("abc") && t.ends_with(TRUNCATED), "{t}");
        assert!(end.truncated);
        assert_eq!(b.stream("more", &mut end), None);
    }

    #[test]
    fn result_budget_counts_results() {
        let mut b = Budget::default();
        let mut end = CellEnd::default();
        let data: BTreeMap<_, _> = [("text/plain".to_string(), serde_json::json!("1"))].into();
        for _ in 0..MAX_RESULTS {
            assert!(b.result(&data, &mut end));
        }
        assert!(!b.result(&data, &mut end));
        assert!(end.truncated);
    }
}
