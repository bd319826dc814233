//! Code contexts: long-lived interpreters inside a sandbox (a Jupyter kernel behind
//! a driver process, see `driver.rs`) that keep variables, imports and the working
//! directory between runs. A run streams [`CodeEvent`]s; the daemon bounds what a
//! run may produce, times it out, interrupts it, and starts the interpreter again
//! after it died, saying so (`restarted`) on the next run.

pub mod driver;
pub mod output;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use sandlot_guest::client::{GuestClient, ProcessId, ProcessStdin};
use sandlot_proto::api::code::{
    CodeError, CodeEvent, ContextView, RunStatus, DEFAULT_CONTEXT, LANGUAGES,
};
use tokio::sync::{mpsc, Mutex as AsyncMutex, Notify};

use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::store::now_ms;
use crate::timefmt::rfc3339;
use driver::{describe_end, Driver, DriverLine, DriverSpec, Next, StartError, WriteError};
use output::{Budget, Held, OutputPool, RunEvent, RunOutput, RunResult, Stream};

/// Contexts one sandbox may have at a time (each holds an interpreter's memory).
pub const MAX_CONTEXTS: usize = 16;
/// Runs that may wait for a busy context, and for all contexts of a sandbox
/// (each holds its request's code); past either a run is refused.
pub const MAX_WAITING: usize = 8;
pub const MAX_SANDBOX_WAITING: usize = 32;
/// A run's timeout when the request names none, and the longest one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// The MIME type of the chart data extracted from a matplotlib figure shown by
/// a cell (E2B's `chart`).
pub const CHART_MIME: &str = "application/vnd.sandlot.chart+json";
/// How long a cell has to stop after an interrupt before the interpreter is ended.
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);
/// How long an interrupt asked through the API may wait for the driver to read
/// it; a driver that reads nothing for this long is ended.
const INTERRUPT_WRITE: Duration = Duration::from_secs(10);
/// How long deleting or restarting a context waits to see its driver end.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// Stream text gathered from lines already read before it is sent as one chunk.
const COALESCE: usize = 64 << 10;

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
    /// Whom its interpreter runs as: the sandbox's user when `None`.
    pub user: Option<String>,
    /// A Python context shows an image saved to a path (`PIL`'s `Image.save`) as a
    /// result of the cell, as E2B's code interpreter does.
    pub show_saved_images: bool,
}

impl ContextParams {
    /// A context of `language` with everything else the sandbox's own.
    pub fn of(language: Language) -> ContextParams {
        ContextParams {
            language,
            cwd: None,
            env: BTreeMap::new(),
            user: None,
            show_saved_images: false,
        }
    }
}

/// The contexts of one sandbox.
pub struct Contexts {
    map: Mutex<BTreeMap<String, Arc<Context>>>,
    /// What its runs hold of the daemon's memory at once (within its tenant's).
    output: Arc<OutputPool>,
    /// Runs waiting for a context of it.
    waiting: Arc<AtomicUsize>,
    /// Held for writing while the drivers an earlier daemon left are ended: no
    /// context is created before (see [`Contexts::end_stale`]).
    sweep: Arc<tokio::sync::RwLock<()>>,
}

impl Contexts {
    /// No contexts yet; what their runs hold counts against `tenant`'s pool
    /// too (`AppState::code_output`).
    pub fn new(tenant: Arc<OutputPool>) -> Contexts {
        Contexts {
            map: Mutex::default(),
            output: OutputPool::sandbox(tenant),
            waiting: Arc::default(),
            sweep: Arc::default(),
        }
    }

    /// No contexts, under the same tenant's pool as `self` (a sandbox's next
    /// handle after a pause: its contexts ended with its kernels).
    pub fn afresh(&self) -> Contexts {
        let tenant = self
            .output
            .within()
            .cloned()
            .unwrap_or_else(OutputPool::tenant);
        Contexts::new(tenant)
    }

    /// Ends the drivers (and kernels) an earlier daemon left in the sandbox
    /// ([`driver::end_stale`]) on a task of its own, so that a slow agent holds
    /// neither the daemon's start nor other sandboxes. Contexts are created
    /// only once it is done: the default ids come again, and a late sweep would
    /// end their new drivers.
    pub fn end_stale(&self, guest: GuestClient, span: tracing::Span) {
        let gate = self.hold_for_sweep();
        tokio::spawn(async move {
            let ended = driver::end_stale(&guest).await;
            drop(gate);
            if ended > 0 {
                span.in_scope(|| {
                    tracing::info!(ended, "ended the drivers of code contexts it had")
                });
            }
        });
    }

    fn hold_for_sweep(&self) -> Option<tokio::sync::OwnedRwLockWriteGuard<()>> {
        self.sweep.clone().try_write_owned().ok()
    }

    /// Waits until no sweep of an earlier daemon's drivers runs.
    async fn swept(&self) {
        drop(self.sweep.read().await);
    }

    /// Starts `req` in `ctx` on a task of its own (a client that leaves does not
    /// cut the run short) and returns its events and a ticket to interrupt or
    /// abandon it. Refused (429) when too many runs wait already.
    pub fn spawn_run(
        &self,
        ctx: Arc<Context>,
        guest: GuestClient,
        req: RunRequest,
        oom: OomProbe,
    ) -> ApiResult<(mpsc::Receiver<RunItem>, RunTicket)> {
        let turn = Turn::take(&self.waiting, &ctx.waiting, &ctx.id)?;
        let control = Arc::new(RunControl::default());
        let (tx, rx) = mpsc::channel(16);
        let sink = Sink::new(tx, self.output.clone());
        tokio::spawn(ctx.run(guest, req, oom, sink, turn, control.clone()));
        Ok((rx, RunTicket { control }))
    }

    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Context>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, id: &str) -> Option<Arc<Context>> {
        self.map().get(id).cloned()
    }

    /// The contexts, oldest first.
    pub fn all(&self) -> Vec<Arc<Context>> {
        let mut all: Vec<_> = self.map().values().cloned().collect();
        all.sort_by_key(|c| c.seq);
        all
    }

    /// Creates a context and starts its interpreter.
    pub async fn create(
        &self,
        guest: &GuestClient,
        id: Option<&str>,
        params: ContextParams,
    ) -> ApiResult<Arc<Context>> {
        self.swept().await;
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
        match default_language(id) {
            Some(l) => self.get_or_make(guest, id, ContextParams::of(l)).await,
            None => self
                .get(id)
                .ok_or_else(|| ApiError::not_found(format!("no code context {id}"))),
        }
    }

    /// The context `id`, made with `params` if there is none (by this call or,
    /// meanwhile, another).
    pub async fn get_or_make(
        &self,
        guest: &GuestClient,
        id: &str,
        params: ContextParams,
    ) -> ApiResult<Arc<Context>> {
        if let Some(c) = self.get(id) {
            return Ok(c);
        }
        match self.create(guest, Some(id), params).await {
            // Created meanwhile by another request.
            Err(e) if e.status == StatusCode::CONFLICT => self
                .get(id)
                .ok_or_else(|| ApiError::not_found(format!("no code context {id}"))),
            r => r,
        }
    }

    /// Starts the default (Python) context of a sandbox that has no handle yet (a
    /// warm pool's), to be [`Contexts::adopt`]ed at its claim.
    pub async fn prestart(guest: &GuestClient) -> ApiResult<Arc<Context>> {
        let ctx = Arc::new(Context::new(
            DEFAULT_CONTEXT.to_string(),
            ContextParams::of(Language::Python),
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

    /// Ends a context's interpreter and forgets it; answers once the driver's
    /// end is seen (a run in progress ends as crashed first).
    pub async fn remove(&self, guest: &GuestClient, id: &str) -> ApiResult<()> {
        let ctx = self
            .map()
            .remove(id)
            .ok_or_else(|| ApiError::not_found(format!("no code context {id}")))?;
        ctx.deleted.store(true, Ordering::SeqCst);
        ctx.kill(guest).await;
        let ended = async {
            let mut r = ctx.runner.lock().await;
            if let Some(d) = r.driver.take() {
                d.kill(guest).await;
                d.wait_exit().await;
            }
            ctx.forget_driver(&mut r);
        };
        if tokio::time::timeout(KILL_WAIT, ended).await.is_err() {
            tracing::warn!(context = %ctx.id, "a deleted code context's driver did not end in time");
        }
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

/// Where a JavaScript context finds Node (the driver looks on the sandbox's
/// `PATH`; these are where images put it).
const NODE_PATHS: [&str; 2] = ["/usr/local/bin/node", "/usr/bin/node"];

/// Whether a sandbox can run a JavaScript context: it has Node. Only decides
/// whether a listing names the default JavaScript context before its first run;
/// a run finds out for itself.
pub async fn runs_javascript(guest: &GuestClient) -> bool {
    for path in NODE_PATHS {
        let mut req = sandlot_proto::guest::StatRequest::new(path);
        req.follow = true;
        if guest.stat(req).await.is_ok() {
            return true;
        }
    }
    false
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

/// A run's place among those waiting for a context (given back when it starts
/// or is dropped).
pub struct Turn {
    sandbox: Arc<AtomicUsize>,
    context: Arc<AtomicUsize>,
}

impl Turn {
    fn take(sandbox: &Arc<AtomicUsize>, context: &Arc<AtomicUsize>, id: &str) -> ApiResult<Turn> {
        let up = |n: &AtomicUsize, max: usize| {
            n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                (v < max).then_some(v + 1)
            })
            .is_ok()
        };
        if !up(context, MAX_WAITING) {
            return Err(ApiError::quota(format!(
                "code context {id} has {MAX_WAITING} runs waiting for it already (at most \
                 {MAX_WAITING} wait for a busy context): try again when one has run"
            )));
        }
        if !up(sandbox, MAX_SANDBOX_WAITING) {
            context.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::quota(format!(
                "this sandbox has {MAX_SANDBOX_WAITING} runs waiting for its code contexts \
                 already (at most {MAX_SANDBOX_WAITING}): try again when one has run"
            )));
        }
        Ok(Turn {
            sandbox: sandbox.clone(),
            context: context.clone(),
        })
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.context.fetch_sub(1, Ordering::SeqCst);
        self.sandbox.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Between a run's task and whoever started it: an interrupt of this run only.
#[derive(Default)]
struct RunControl {
    /// The client left: a run that has not started never does.
    abandoned: AtomicBool,
    interrupt: Notify,
}

/// What started a run holds to interrupt that run (and no other).
pub struct RunTicket {
    control: Arc<RunControl>,
}

impl RunTicket {
    /// Interrupts the run's cell once it runs (never another run's).
    pub fn interrupt(&self) {
        self.control.interrupt.notify_one();
    }

    /// The client left: the run is interrupted if it runs, dropped if it waits.
    pub fn abandon(&self) {
        self.control.abandoned.store(true, Ordering::SeqCst);
        self.control.interrupt.notify_one();
    }
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

/// The order contexts are made in, across sandboxes.
static NEXT_SEQ: AtomicU64 = AtomicU64::new(0);

/// One context.
pub struct Context {
    pub id: String,
    pub params: ContextParams,
    created_at_ms: i64,
    /// Its place in the order contexts were made in (listings are in it).
    seq: u64,
    runner: AsyncMutex<Runner>,
    control: Mutex<Control>,
    restarts: AtomicU64,
    busy: AtomicBool,
    running: AtomicBool,
    deleted: AtomicBool,
    /// Runs waiting for its runner.
    waiting: Arc<AtomicUsize>,
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
            seq: NEXT_SEQ.fetch_add(1, Ordering::Relaxed),
            runner: AsyncMutex::new(Runner::default()),
            control: Mutex::new(Control::default()),
            restarts: AtomicU64::new(0),
            busy: AtomicBool::new(false),
            running: AtomicBool::new(false),
            deleted: AtomicBool::new(false),
            waiting: Arc::default(),
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
            user: self.params.user.clone(),
            show_saved_images: self.params.show_saved_images,
            tag: format!("{}{}", driver::TAG_PREFIX, self.id),
            context: self.id.clone(),
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
            if tokio::time::timeout(KILL_WAIT, d.wait_exit())
                .await
                .is_err()
            {
                tracing::warn!(context = %self.id, "a restarted code context's driver did not end in time");
            }
        }
        self.forget_driver(&mut r);
        r.lost = false;
        self.ensure_started(guest, &mut r).await.map(|_| ())
    }

    /// Asks the kernel to interrupt the cell running now (nothing if idle). A
    /// driver that does not read the request within [`INTERRUPT_WRITE`] is
    /// ended (the run in progress ends as crashed).
    pub async fn interrupt(&self, guest: &GuestClient) -> bool {
        let (stdin, process) = {
            let c = self.control();
            (c.stdin.clone(), c.process)
        };
        let Some(s) = stdin else { return false };
        match driver::write_line(&s, r#"{"op":"interrupt"}"#, INTERRUPT_WRITE).await {
            Ok(()) => true,
            Err(WriteError::Stalled(_)) => {
                tracing::warn!(context = %self.id, "a code context's driver reads no input: ending it");
                if let Some(id) = process {
                    driver::kill(guest, id).await;
                }
                false
            }
            Err(WriteError::Io(_)) => false,
        }
    }

    /// Runs `req`, sending events to `out` (a closed `out` does not stop the run:
    /// its output is still read, so that the next run starts in step). The last
    /// event is `end`, or `error` if the interpreter could not be started.
    async fn run(
        self: Arc<Self>,
        guest: GuestClient,
        req: RunRequest,
        oom: OomProbe,
        out: Sink,
        turn: Turn,
        control: Arc<RunControl>,
    ) {
        let mut r = self.runner.lock().await;
        drop(turn);
        if control.abandoned.load(Ordering::SeqCst) {
            return;
        }
        let restarted = match self.ensure_started(&guest, &mut r).await {
            Ok(again) => again && std::mem::take(&mut r.lost),
            Err(e) => {
                out.fail(e).await;
                return;
            }
        };
        self.busy.store(true, Ordering::Relaxed);
        out.send(
            CodeEvent::Started {
                context: self.view(),
                restarted,
            }
            .into(),
            Held::default(),
        )
        .await;
        let ooms = oom_kills(&oom);
        // A line read during the run counts against its sandbox's pool.
        if let Some(d) = r.driver.as_mut() {
            d.charge_lines_to(Some(out.pool.clone()));
        }
        let mut end = self.run_cell(&guest, &mut r, &req, &out, &control).await;
        if let Some(d) = r.driver.as_mut() {
            d.charge_lines_to(None);
        }
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
        out.send(
            CodeEvent::End {
                status: end.status,
                execution_count: end.count,
                error: end.error,
                restarted,
                truncated: end.truncated,
            }
            .into(),
            end.held,
        )
        .await;
    }

    async fn run_cell(
        &self,
        guest: &GuestClient,
        r: &mut Runner,
        req: &RunRequest,
        out: &Sink,
        control: &RunControl,
    ) -> CellEnd {
        let d = r.driver.as_mut().expect("started above");
        let mut end = CellEnd::default();
        let deadline = tokio::time::Instant::now() + req.timeout;
        let line = serde_json::json!({"op": "run", "code": req.code, "env": req.env}).to_string();
        let within = deadline.saturating_duration_since(tokio::time::Instant::now());
        match d.send_line(&line, within).await {
            Ok(()) => {}
            Err(WriteError::Stalled(_)) => {
                d.kill(guest).await;
                end.status = RunStatus::TimedOut;
                end.lost = true;
                end.error = Some(CodeError {
                    name: "TimeoutError".into(),
                    value: format!(
                        "the interpreter did not read the cell within the run's timeout of {:?} \
                         (it stopped reading its input), so it was ended and its state is lost",
                        req.timeout
                    ),
                    traceback: String::new(),
                });
                return end;
            }
            Err(e) => return end.died(format!("the interpreter is gone ({e})")),
        }
        let mut budget = Budget::new(out.pool.clone());
        let mut pending: Option<(Stream, String)> = None;
        let mut timed_out = false;
        let mut grace = None;
        loop {
            // Stream text of lines already read goes out as one chunk; nothing
            // waits while text is pending.
            let full = pending.as_ref().is_some_and(|(_, t)| t.len() >= COALESCE);
            if full || (pending.is_some() && !d.has_buffered()) {
                flush(&mut pending, &mut budget, out).await;
            }
            let wait_until = grace.unwrap_or(deadline);
            let next = tokio::select! {
                n = d.next() => n,
                _ = control.interrupt.notified() => {
                    if d.send_line(r#"{"op":"interrupt"}"#, INTERRUPT_WRITE).await.is_err() {
                        d.kill(guest).await;
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(wait_until) => {
                    flush(&mut pending, &mut budget, out).await;
                    end.truncated |= budget.truncated;
                    if grace.is_some() {
                        // The cell did not stop: end the interpreter.
                        d.kill(guest).await;
                        end.status = RunStatus::TimedOut;
                        end.error = Some(timeout_error(req.timeout, true));
                        end.lost = true;
                        return end;
                    }
                    timed_out = true;
                    grace = Some(tokio::time::Instant::now() + INTERRUPT_GRACE);
                    if d.send_line(r#"{"op":"interrupt"}"#, INTERRUPT_GRACE).await.is_err() {
                        // It does not read: the grace is over.
                        grace = Some(tokio::time::Instant::now());
                    }
                    continue;
                }
            };
            let stream = match &next {
                Ok(Next::Line(DriverLine::Stdout { .. })) => Some(Stream::Stdout),
                Ok(Next::Line(DriverLine::Stderr { .. })) => Some(Stream::Stderr),
                _ => None,
            };
            let joins = matches!((stream, &pending), (Some(on), Some((p, _))) if *p == on);
            if pending.is_some() && !joins {
                flush(&mut pending, &mut budget, out).await;
            }
            end.truncated |= budget.truncated;
            match next {
                Ok(Next::Line(l)) => match l {
                    DriverLine::Stdout { text } | DriverLine::Stderr { text } => {
                        let on = stream.expect("a stream line");
                        match &mut pending {
                            Some((_, t)) => t.push_str(&text),
                            None => pending = Some((on, text)),
                        }
                    }
                    DriverLine::Result { main, data } => {
                        if let Some(held) = budget.result(&data) {
                            let result = RunResult {
                                is_main_result: main,
                                data,
                            };
                            out.send(RunEvent::Result(result), held).await;
                        }
                        end.truncated |= budget.truncated;
                    }
                    DriverLine::Exception {
                        name,
                        value,
                        traceback,
                    } => {
                        let mut e = CodeError {
                            name: driver::bounded(&name, 1000),
                            value: driver::bounded(&value, 64 << 10),
                            traceback: driver::bounded(&traceback, 1 << 20),
                        };
                        if let Some((held, kept)) = budget.exception(&mut e) {
                            out.send(CodeEvent::Exception { error: e.clone() }.into(), held)
                                .await;
                            end.error = Some(e);
                            end.held = kept;
                        }
                        end.truncated |= budget.truncated;
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

/// Sends the pending stream text as one chunk, within the run's budget.
async fn flush(pending: &mut Option<(Stream, String)>, budget: &mut Budget, out: &Sink) {
    if let Some((on, text)) = pending.take() {
        if let Some((t, held)) = budget.stream(on, &text) {
            out.send(on.event(t).into(), held).await;
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
                Some(C::NotFound | C::SpawnFailed | C::PermissionDenied) => ApiError::of(
                    ErrorCode::KernelUnavailable,
                    format!(
                        "{} contexts need python3 in the sandbox (with ipykernel for Python): {e}",
                        lang.as_str()
                    ),
                ),
                _ => ApiError::from_guest(e, "starting the code context"),
            }
        }
        StartError::Unavailable { .. } | StartError::Ended { .. } => ApiError::of(
            ErrorCode::KernelUnavailable,
            driver::bounded(&e.to_string(), 2000),
        ),
        StartError::Timeout(_) => ApiError::of(
            ErrorCode::Timeout,
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
    /// What the exception kept in `error` holds of the sandbox's pool.
    held: Held,
}

impl Default for CellEnd {
    fn default() -> Self {
        CellEnd {
            status: RunStatus::Ok,
            count: None,
            error: None,
            truncated: false,
            lost: false,
            held: Held::default(),
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

/// One item of a run's event channel: an event (or the error that ended the run
/// before it started), with what it holds of its sandbox's output pool until
/// it is dropped.
pub struct RunItem {
    pub event: Result<RunEvent, ApiError>,
    pub held: Held,
}

/// Where a run's events go. Once the receiver is gone, events are dropped.
pub struct Sink {
    tx: mpsc::Sender<RunItem>,
    closed: AtomicBool,
    pool: Arc<OutputPool>,
}

impl Sink {
    fn new(tx: mpsc::Sender<RunItem>, pool: Arc<OutputPool>) -> Sink {
        Sink {
            tx,
            closed: AtomicBool::new(false),
            pool,
        }
    }

    async fn send(&self, ev: RunEvent, held: Held) {
        self.put(Ok(ev), held).await
    }

    async fn fail(&self, e: ApiError) {
        self.put(Err(e), Held::default()).await
    }

    async fn put(&self, event: Result<RunEvent, ApiError>, held: Held) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        if self.tx.send(RunItem { event, held }).await.is_err() {
            self.closed.store(true, Ordering::Relaxed);
        }
    }
}

/// Collects a run's events into its outcome; an `error` event is the error.
/// Chunks of one stream in a row are merged.
pub async fn collect(mut rx: mpsc::Receiver<RunItem>) -> ApiResult<RunOutput> {
    let mut x = RunOutput {
        results: Vec::new(),
        stdout: Vec::new(),
        stderr: Vec::new(),
        error: None,
        execution_count: None,
        status: RunStatus::Ok,
        restarted: false,
        truncated: false,
        held: Held::default(),
    };
    let mut last = None;
    while let Some(item) = rx.recv().await {
        x.held.absorb(item.held);
        let ev = match item.event? {
            RunEvent::Result(r) => {
                x.results.push(r);
                last = None;
                continue;
            }
            RunEvent::Code(ev) => ev,
        };
        let (on, text) = match ev {
            CodeEvent::Stdout { text } => (Stream::Stdout, text),
            CodeEvent::Stderr { text } => (Stream::Stderr, text),
            CodeEvent::Started { restarted, .. } => {
                x.restarted = restarted;
                continue;
            }
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
                // Merged text holds no spare capacity past what it counts for.
                for t in x.stdout.iter_mut().chain(x.stderr.iter_mut()) {
                    t.shrink_to_fit();
                }
                return Ok(x);
            }
            // Only made by the HTTP layer; results come raw.
            CodeEvent::Exception { .. } | CodeEvent::Error { .. } | CodeEvent::Result { .. } => {
                last = None;
                continue;
            }
        };
        let chunks = match on {
            Stream::Stdout => &mut x.stdout,
            Stream::Stderr => &mut x.stderr,
        };
        match chunks.last_mut() {
            Some(t) if last == Some(on) => t.push_str(&text),
            _ => chunks.push(text),
        }
        last = Some(on);
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
    fn contexts_are_listed_in_the_order_they_were_made_whatever_their_ids() {
        let c = Contexts::new(OutputPool::tenant());
        for id in ["zeta", "default", "ctx_00", "alpha"] {
            c.adopt(Arc::new(Context::new(
                id.into(),
                ContextParams::of(Language::Python),
            )));
        }
        let ids: Vec<_> = c.all().iter().map(|x| x.id.clone()).collect();
        assert_eq!(ids, ["zeta", "default", "ctx_00", "alpha"]);
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

    #[tokio::test]
    async fn collected_stream_text_holds_no_spare_capacity() {
        let (tx, rx) = mpsc::channel(64);
        for _ in 0..33 {
            let ev = CodeEvent::Stdout {
                text: "x".repeat(1000),
            };
            tx.send(RunItem {
                event: Ok(ev.into()),
                held: Held::default(),
            })
            .await
            .unwrap();
        }
        let end = CodeEvent::End {
            status: RunStatus::Ok,
            execution_count: None,
            error: None,
            restarted: false,
            truncated: false,
        };
        tx.send(RunItem {
            event: Ok(end.into()),
            held: Held::default(),
        })
        .await
        .unwrap();
        let x = collect(rx).await.unwrap();
        assert_eq!(x.stdout.len(), 1);
        assert_eq!(x.stdout[0].capacity(), x.stdout[0].len());
    }

    #[tokio::test]
    async fn contexts_are_created_only_once_the_sweep_of_an_earlier_daemons_drivers_is_done() {
        use futures_util::FutureExt;
        let c = Contexts::new(OutputPool::tenant());
        assert_eq!(c.swept().now_or_never(), Some(()));
        let gate = c.hold_for_sweep().unwrap();
        assert_eq!(c.swept().now_or_never(), None);
        drop(gate);
        assert_eq!(c.swept().now_or_never(), Some(()));
    }

    #[test]
    fn waiting_runs_are_capped_per_context_and_per_sandbox() {
        let sandbox = Arc::new(AtomicUsize::new(0));
        let a = Arc::new(AtomicUsize::new(0));
        let turns: Vec<_> = (0..MAX_WAITING)
            .map(|_| Turn::take(&sandbox, &a, "ctx_a").unwrap())
            .collect();
        let e = Turn::take(&sandbox, &a, "ctx_a").err().unwrap();
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            e.message.contains("ctx_a has 8 runs waiting"),
            "{}",
            e.message
        );
        // Other contexts fill the sandbox's cap.
        let others: Vec<_> = (0..MAX_SANDBOX_WAITING - MAX_WAITING)
            .map(|i| {
                let c = Arc::new(AtomicUsize::new(0));
                Turn::take(&sandbox, &c, &format!("c{i}")).unwrap()
            })
            .collect();
        let fresh = Arc::new(AtomicUsize::new(0));
        let e = Turn::take(&sandbox, &fresh, "ctx_b").err().unwrap();
        assert!(
            e.message.contains("this sandbox has 32 runs"),
            "{}",
            e.message
        );
        assert_eq!(fresh.load(Ordering::SeqCst), 0);
        drop(turns);
        drop(others);
        assert_eq!(
            (sandbox.load(Ordering::SeqCst), a.load(Ordering::SeqCst)),
            (0, 0)
        );
    }
}
