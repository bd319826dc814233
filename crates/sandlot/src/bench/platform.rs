//! `sandlot bench platform`: the platform benchmark. Everything goes through a real
//! daemon and its HTTP API (Unix socket), with bubblewrap and crun doing the
//! closest equivalent work in the same run:
//!
//! * time to interactive (create, then the first byte of `echo`'s output), n
//!   sequential and bursts of concurrent creates, with network `none` and `allow`;
//! * exec round trip on a live sandbox (next to the host spawning the same command,
//!   the floor) and exec throughput;
//! * density: idle sandboxes up to a count, host memory each, start and teardown time;
//! * churn: create/exec/delete cycles for a while, then a leak check.
//!
//! Prints Markdown tables, writes `results.json` (summaries and raw samples) and,
//! when matplotlib is available, `latency.png` (scripts/bench_plot.py).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use sandlot_client::stream::Output;
use sandlot_client::{Client, CreateSandbox, ExecBody};
use serde::Serialize;
use serde_json::json;

use super::peers::{bwrap_echo, host_echo, host_spawn, peer_burst, peer_seq, CrunBundle};
use super::{percentile, summarize, Summary};

#[derive(Debug, clap::Args)]
pub struct PlatformArgs {
    /// Sequential time-to-interactive iterations (per network mode).
    #[arg(long, default_value_t = 200)]
    pub n: usize,
    /// Burst sizes (concurrent creates), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10,100")]
    pub bursts: Vec<usize>,
    /// Warm pool size of the private daemon, per network mode (`none` and `allow`;
    /// 0: no pools, every create is cold).
    #[arg(long, default_value_t = 16)]
    pub pool: usize,
    /// Sequential execs on one live sandbox.
    #[arg(long, default_value_t = 1000)]
    pub exec_n: usize,
    /// Idle sandboxes for the density run (0 skips it).
    #[arg(long, default_value_t = 1000)]
    pub density: usize,
    /// Seconds of create/exec/delete churn (0 skips it).
    #[arg(long, default_value_t = 60)]
    pub churn_secs: u64,
    /// Concurrent workers in the churn and density runs.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Adaptive pools: grow each pool up to this many on misses (`max_size`;
    /// default: `--pool`, fixed pools).
    #[arg(long)]
    pub pool_max: Option<usize>,
    /// The private daemon forks sandbox init helpers from its fork server
    /// (`runtime.fork_server`); `false` measures the exec path.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub fork_server: bool,
    /// The isolation of every sandbox and pool of the private daemon: namespace
    /// or gvisor (`[isolation] default`).
    #[arg(long, default_value = "namespace", value_parser = ["namespace", "gvisor"])]
    pub isolation: String,
    /// Sections to run (default all): tti, cycle, burst, exec, density, churn, peers.
    /// `cycle` is create + exec `/bin/true` + delete, all timed (run it with
    /// `--pool 0` for the cold figure).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Directory for results.json and latency.png.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

/// One measured row: a summary, the raw samples (ms) and optional extras.
#[derive(Debug, Serialize)]
struct Row {
    section: &'static str,
    #[serde(flatten)]
    summary: Summary,
    samples_ms: Vec<f64>,
}

#[derive(Debug, Default, Serialize)]
struct Results {
    machine: String,
    /// Share of the run's CPU time the hypervisor gave to other work (`/proc/stat`).
    steal_share: Option<f64>,
    rows: Vec<Row>,
    exec_per_sec: Option<f64>,
    density: Option<Density>,
    churn: Option<Churn>,
    notes: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Density {
    sandboxes: usize,
    network: String,
    start_secs: f64,
    teardown_secs: f64,
    host_mib_per_sandbox: f64,
    /// The kernel's own accounts, KiB per sandbox (see [`MemBreakdown`]).
    accounted_kib: MemBreakdown,
    /// Mean proportional set size of the sandboxes' PID 1s (the guest agent), KiB.
    pid1_pss_kib: Option<f64>,
}

/// Growth of `/proc/meminfo` accounts per sandbox, KiB. Unlike MemTotal -
/// MemAvailable, which moves with the page cache and reclaimable memory of the
/// whole host (0.32 to 1.10 MiB per sandbox for the same code in one day), their
/// sum counts what the sandboxes hold. Slab objects that earlier sections freed and
/// these sandboxes reuse are not counted as growth, so a run right after others
/// reads lower than one on a quiet host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
struct MemBreakdown {
    anon: f64,
    slab: f64,
    page_tables: f64,
    kernel_stack: f64,
    /// Per-CPU allocations (`Percpu`): memory cgroups' statistics, counters of
    /// superblocks and network devices.
    percpu: f64,
}

impl MemBreakdown {
    fn total(&self) -> f64 {
        self.anon + self.slab + self.page_tables + self.kernel_stack + self.percpu
    }
}

#[derive(Debug, Serialize)]
struct Churn {
    secs: f64,
    cycles: u64,
    cycles_per_sec: f64,
    errors: u64,
    leaked: Vec<String>,
}

/// The private daemon: temporary data dir and socket, its own id prefix, a warm
/// pool of the benchmark's shape, quotas out of the way.
pub(super) struct Daemon {
    child: Child,
    dir: PathBuf,
    prefix: String,
    client: Client,
}

impl Drop for Daemon {
    /// Deletes the sandboxes a benchmark that failed or was interrupted left
    /// (a daemon that stops keeps them running for the next start, which never
    /// comes for a private one), then stops the daemon (SIGKILL after
    /// [`DAEMON_STOP_WAIT`]) and removes its files. A daemon that exited already
    /// (it failed to start) is neither asked nor signalled.
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            let _ = std::fs::remove_dir_all(&self.dir);
            return;
        }
        let c = self.client.clone();
        let deleted = std::thread::spawn(move || -> Result<(), String> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(delete_leftovers(&c))
        });
        match deleted.join() {
            Ok(Ok(())) => {}
            Ok(Err(why)) => eprintln!(
                "sandlot: the private daemon's sandboxes may outlive it ({why}); a daemon started with --id-prefix {} removes them",
                self.prefix
            ),
            Err(_) => eprintln!("sandlot: deleting the private daemon's sandboxes failed"),
        }
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + DAEMON_STOP_WAIT;
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            eprintln!(
                "sandlot: the private daemon did not stop within {DAEMON_STOP_WAIT:?}: killed"
            );
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How long a private daemon may take to stop once its sandboxes are deleted.
const DAEMON_STOP_WAIT: Duration = Duration::from_secs(30);

/// Deletes every live sandbox of a private daemon, listing again until none is
/// left (tasks of a run that ended may still have been creating some), at most
/// [`LEFTOVER_WAIT`].
async fn delete_leftovers(c: &Client) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + LEFTOVER_WAIT;
    // A create the daemon was still admitting when the run stopped shows up only
    // once admitted: done after two empty lists a little apart.
    let mut empty = 0;
    while empty < 2 {
        let left = tokio::time::timeout_at(
            deadline,
            c.list_sandboxes(&sandlot_client::ListFilter::default()),
        )
        .await
        .map_err(|_| format!("listing them took over {LEFTOVER_WAIT:?}"))?
        .map_err(|e| format!("list them: {e}"))?;
        if left.is_empty() {
            empty += 1;
        } else {
            empty = 0;
            let ids = left.into_iter().map(|s| s.id).collect::<Vec<_>>();
            tokio::time::timeout_at(deadline, delete_all(c, ids))
                .await
                .map_err(|_| format!("deleting them took over {LEFTOVER_WAIT:?}"))?;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// How long a private daemon's leftovers may take to list, and to delete.
const LEFTOVER_WAIT: Duration = Duration::from_secs(30);

/// Set once a stop signal ends a benchmark's work: loops on blocking threads
/// (the host's own spawns) end early instead of running past the runtime's
/// shutdown.
pub(super) static STOP_REQUESTED: AtomicBool = AtomicBool::new(false);

/// SIGINT, SIGTERM and SIGHUP (those not ignored, as `nohup` leaves SIGHUP),
/// caught from the moment this is made (before the private daemon starts) until
/// it is dropped, which gives them their default action back.
pub(super) struct StopSignals([Option<CaughtSignal>; 3]);

/// One signal [`StopSignals`] catches.
struct CaughtSignal {
    name: &'static str,
    number: i32,
    stream: tokio::signal::unix::Signal,
}

impl CaughtSignal {
    /// Its next arrival; never, for a signal not caught.
    async fn next(s: &mut Option<CaughtSignal>) -> &'static str {
        match s {
            Some(c) => {
                c.stream.recv().await;
                c.name
            }
            None => std::future::pending().await,
        }
    }
}

impl StopSignals {
    /// Installs the handlers (in `rt`'s context); from here on those signals no
    /// longer end the process: they end the work under [`Self::until_stopped`].
    pub(super) fn catch(rt: &tokio::runtime::Runtime) -> anyhow::Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        let _in_rt = rt.enter();
        let catch = |name: &'static str, kind: SignalKind| -> anyhow::Result<_> {
            let number = kind.as_raw_value();
            if sandlot_runtime::signal_ignored(number)
                .with_context(|| format!("read the action of {name}"))?
            {
                return Ok(None);
            }
            let stream = signal(kind).with_context(|| format!("handle {name}"))?;
            Ok(Some(CaughtSignal {
                name,
                number,
                stream,
            }))
        };
        Ok(StopSignals([
            catch("SIGINT", SignalKind::interrupt())?,
            catch("SIGTERM", SignalKind::terminate())?,
            catch("SIGHUP", SignalKind::hangup())?,
        ]))
    }

    /// Runs a benchmark's work until it ends or one of the signals comes (also
    /// one that came while the daemon started), then gives the signals their
    /// default action back, so that a second one during the clean-up ends the
    /// benchmark at once. Either way the caller goes on to drop its private
    /// daemon, which deletes what the work left; the caller shuts its runtime
    /// down first, so that no task of the work creates more.
    pub(super) async fn until_stopped<T>(
        mut self,
        work: impl std::future::Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<T> {
        let [a, b, c] = &mut self.0;
        let stopped_by = tokio::select! {
            r = work => return r,
            name = CaughtSignal::next(a) => name,
            name = CaughtSignal::next(b) => name,
            name = CaughtSignal::next(c) => name,
        };
        STOP_REQUESTED.store(true, Ordering::SeqCst);
        bail!("stopped by {stopped_by}: the private daemon's sandboxes are deleted")
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        for c in self.0.iter().flatten() {
            if let Err(e) = sandlot_runtime::default_signal_action(c.number) {
                eprintln!("sandlot: give {} its default action back: {e}", c.name);
            }
        }
    }
}

fn start_daemon(
    pool: usize,
    pool_max: usize,
    fork_server: bool,
    isolation: &str,
) -> anyhow::Result<(Daemon, Client)> {
    let pools = format!(
        "[isolation]\ndefault = \"{isolation}\"\n\n\
         [[pools]]\nname = \"bench\"\nsize = {pool}\nmax_size = {pool_max}\n\
         spec = {{ isolation = \"{isolation}\" }}\n\n\
         [[pools]]\nname = \"bench-allow\"\nsize = {pool}\nmax_size = {pool_max}\n\
         spec = {{ network = {{ mode = \"allow\" }}, isolation = \"{isolation}\" }}\n"
    );
    start_daemon_with(fork_server, &pools)
}

/// A private daemon whose configuration ends with `pools` (TOML).
pub(super) fn start_daemon_with(
    fork_server: bool,
    pools: &str,
) -> anyhow::Result<(Daemon, Client)> {
    let dir = std::env::temp_dir().join(format!("sandlot-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let sock = dir.join("api.sock");
    let prefix = format!("bp{}-", std::process::id());
    let cfg = dir.join("sandlot.toml");
    std::fs::write(
        &cfg,
        format!(
            "[runtime]\nfork_server = {fork_server}\n\n\
             [quotas]\nmax_sandboxes = 100000\nmax_memory = {}\n\n{pools}",
            1u64 << 50
        ),
    )?;
    let log = std::fs::File::create(dir.join("daemon.log"))?;
    let child = Command::new(std::env::current_exe()?)
        .args(["serve", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--socket")
        .arg(&sock)
        .arg("--config")
        .arg(&cfg)
        .args(["--id-prefix", &prefix])
        .env("SANDLOT_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        // Its own process group: a terminal's Ctrl-C reaches the benchmark, which
        // deletes the daemon's sandboxes and then stops it, not the daemon first.
        .process_group(0)
        .spawn()
        .context("start sandlot serve")?;
    let c = Client::new(&format!("unix://{}", sock.display()), None)?;
    let mut d = Daemon {
        child,
        dir,
        prefix,
        client: c.clone(),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        if let Some(st) = d.child.try_wait()? {
            bail!(
                "the daemon exited with {st}: {}",
                std::fs::read_to_string(d.dir.join("daemon.log")).unwrap_or_default()
            );
        }
        if Instant::now() > deadline {
            bail!("the daemon did not start within 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((d, c))
}

/// The network part of a create body: `none`, or an `allow` policy naming one
/// domain of the test world (nothing is contacted; only the set-up cost counts).
fn network(mode: &str) -> serde_json::Value {
    match mode {
        "allow" => json!({"mode": "allow", "allow": [{"domain": "bench.test", "ports": [443]}]}),
        _ => json!({"mode": "none"}),
    }
}

fn create_body(mode: &str) -> CreateSandbox {
    let serde_json::Value::Object(spec) = json!({"network": network(mode), "timeout": "30m"})
    else {
        unreachable!("a JSON object")
    };
    CreateSandbox {
        spec,
        ..Default::default()
    }
}

fn argv(a: &[&str]) -> ExecBody {
    ExecBody {
        argv: a.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// One time to interactive: create, exec `echo hi`, first output byte.
struct Tti {
    total: Duration,
    /// Of which the create call.
    create: Duration,
    /// Off the clock, when asked for: a second `echo hi` in the same sandbox, to
    /// its first byte (not in bursts, where it would load the machine).
    second_exec: Option<Duration>,
    /// The sandbox (deleted by the caller, off the clock).
    id: String,
}

async fn tti(c: &Client, mode: &str, second: bool) -> anyhow::Result<Tti> {
    let t = Instant::now();
    let sb = c.create_sandbox(&create_body(mode)).await?;
    let create = t.elapsed();
    let (_, mut s) = c.exec_stream(&sb.id, &argv(&["echo", "hi"])).await?;
    first_output(&mut s).await?;
    let total = t.elapsed();
    drain(&mut s).await?;
    // The same again in the now warm sandbox: what the first exec pays extra.
    let mut second_exec = None;
    if second {
        let t = Instant::now();
        let (_, mut s) = c.exec_stream(&sb.id, &argv(&["echo", "hi"])).await?;
        first_output(&mut s).await?;
        second_exec = Some(t.elapsed());
        drain(&mut s).await?;
    }
    Ok(Tti {
        total,
        create,
        second_exec,
        id: sb.id,
    })
}

async fn first_output(s: &mut sandlot_client::stream::OutputStream) -> anyhow::Result<()> {
    loop {
        match s.next().await? {
            Some(Output::Stdout(_, d)) if !d.is_empty() => return Ok(()),
            Some(Output::Exit(e)) => bail!("echo exited with {e:?} before any output"),
            Some(_) => continue,
            None => bail!("the output stream ended before any output"),
        }
    }
}

/// Reads to the exit, so the process is finished before the delete.
async fn drain(s: &mut sandlot_client::stream::OutputStream) -> anyhow::Result<()> {
    while let Some(o) = s.next().await? {
        if matches!(o, Output::Exit(_)) {
            break;
        }
    }
    Ok(())
}

/// Percentile `q` of unsorted samples, in milliseconds.
fn pct_ms(v: &[Duration], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort();
    percentile(&v, q).as_secs_f64() * 1e3
}

fn ms(v: &[Duration]) -> Vec<f64> {
    v.iter().map(|d| d.as_secs_f64() * 1e3).collect()
}

fn row(section: &'static str, name: &str, v: Vec<Duration>) -> Row {
    Row {
        section,
        samples_ms: ms(&v),
        summary: summarize(name, v),
    }
}

/// A pool's value of a metric in a `/metrics` text.
fn pool_metric(text: &str, name: &str, pool: &str) -> Option<usize> {
    metric_value(text, &format!("{name}{{pool=\"{pool}\"}}"))
}

/// The hits and misses so far of the pool serving network `mode`.
async fn pool_hits_misses(c: &Client, mode: &str) -> anyhow::Result<(usize, usize)> {
    let t = c.metrics().await?;
    let pool = if mode == "none" {
        "bench"
    } else {
        "bench-allow"
    };
    Ok((
        pool_metric(&t, "sandlot_pool_hits_total", pool).unwrap_or(0),
        pool_metric(&t, "sandlot_pool_misses_total", pool).unwrap_or(0),
    ))
}

/// Waits until the daemon and the machine have settled, so that runs start alike:
/// the pools full, no teardown of an earlier run's sandboxes still pending (they
/// run off the request path), and the CPUs quiet (stock refills, deferred network
/// clean-up in the kernel). Warns and goes on after a deadline.
async fn wait_settled(c: &Client, size: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut settled = false;
    while Instant::now() < deadline {
        if let Ok(t) = c.metrics().await {
            let metric = |name: &str, pool: &str| pool_metric(&t, name, pool);
            // Full at its current target (an adaptive pool may have grown).
            let full = |pool: &str| {
                let ready = metric("sandlot_pool_ready", pool);
                ready.is_some_and(|r| r >= size) && ready >= metric("sandlot_pool_target", pool)
            };
            let pools = size == 0 || (full("bench") && full("bench-allow"));
            let teardowns = metric_value(&t, "sandlot_teardowns_pending") == Some(0);
            if pools && teardowns {
                settled = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !settled {
        eprintln!("warning: the warm pools did not refill to {size}, or teardowns were still pending, after 120 s");
        return;
    }
    let quiet_by = Instant::now() + Duration::from_secs(10);
    loop {
        let busy = cpu_busy(Duration::from_millis(100)).await;
        if busy.is_none_or(|b| b < QUIET_CPU) {
            return;
        }
        if Instant::now() > quiet_by {
            eprintln!(
                "warning: the CPUs stayed busy ({:.0} % over 100 ms) for 10 s before a run",
                busy.unwrap_or(0.0) * 100.0
            );
            return;
        }
    }
}

/// A run starts once the CPUs are busy less than this share of a 100 ms window.
const QUIET_CPU: f64 = 0.10;

/// The value of one series (a name, with its labels if it has any) in a
/// `/metrics` text.
fn metric_value(text: &str, name: &str) -> Option<usize> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse::<usize>().ok())
}

/// The machine's CPUs' busy share over `window` (from `/proc/stat`; `None` if it
/// cannot be read).
async fn cpu_busy(window: Duration) -> Option<f64> {
    let a = cpu_ticks()?;
    tokio::time::sleep(window).await;
    let b = cpu_ticks()?;
    busy_share(a, b)
}

/// Jiffies of all CPUs, from the aggregate `cpu` line of `/proc/stat`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct CpuTicks {
    /// Everything but idle and iowait (steal included: the CPU was not ours to idle).
    busy: u64,
    total: u64,
    /// Time the hypervisor gave this virtual machine's CPUs to other work.
    steal: u64,
}

fn cpu_ticks() -> Option<CpuTicks> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    parse_cpu_ticks(&text)
}

/// Idle and iowait (fields 4 and 5) are not busy; guest time is already counted
/// in user; steal is field 8 (0 on kernels too old to report it).
fn parse_cpu_ticks(text: &str) -> Option<CpuTicks> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    if v.len() < 5 {
        return None;
    }
    let total: u64 = v.iter().sum();
    Some(CpuTicks {
        busy: total - v[3] - v[4],
        total,
        steal: v.get(7).copied().unwrap_or(0),
    })
}

/// The part of the CPUs' time between `a` and `b` that `part` counts (`None` if
/// no time passed or the counters went back).
fn share(a: CpuTicks, b: CpuTicks, part: fn(&CpuTicks) -> u64) -> Option<f64> {
    let total = b.total.checked_sub(a.total).filter(|t| *t > 0)?;
    Some(part(&b).saturating_sub(part(&a)) as f64 / total as f64)
}

/// The part of the CPUs' time between `a` and `b` that was busy.
fn busy_share(a: CpuTicks, b: CpuTicks) -> Option<f64> {
    share(a, b, |t| t.busy)
}

/// The part of the CPUs' time between `a` and `b` that the hypervisor gave to
/// other work: on a shared host, how contended it was while this ran.
fn steal_share(a: CpuTicks, b: CpuTicks) -> Option<f64> {
    share(a, b, |t| t.steal)
}

/// Steal above this share of a run's CPU time makes its absolute times suspect
/// (a contended host has doubled bubblewrap's time to first output).
const STEAL_WARN: f64 = 0.02;

/// Times to interactive, their create calls, the second execs, and the pool's
/// (hits, misses) meanwhile.
type Sequential = (Vec<Duration>, Vec<Duration>, Vec<Duration>, (usize, usize));

/// `n` times to interactive back to back, and the create calls' share of each.
async fn sequential(c: &Client, mode: &str, n: usize, pool: usize) -> anyhow::Result<Sequential> {
    let (mut v, mut creates, mut seconds) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    wait_settled(c, pool).await;
    let (h0, m0) = pool_hits_misses(c, mode).await?;
    for _ in 0..n {
        // Back to back; the pool refills while the previous sandbox is deleted.
        let t = tti(c, mode, true).await?;
        v.push(t.total);
        creates.push(t.create);
        seconds.extend(t.second_exec);
        c.delete_sandbox(&t.id).await?;
    }
    let (h1, m1) = pool_hits_misses(c, mode).await?;
    Ok((v, creates, seconds, (h1 - h0, m1 - m0)))
}

/// The API cycle, all on the clock: create, exec `/bin/true`, read its exit,
/// delete; back to back.
async fn cycles(c: &Client, mode: &str, n: usize, pool: usize) -> anyhow::Result<Vec<Duration>> {
    let mut v = Vec::with_capacity(n);
    wait_settled(c, pool).await;
    for _ in 0..n {
        let t = Instant::now();
        let sb = c.create_sandbox(&create_body(mode)).await?;
        let out = c.run(&sb.id, &["/bin/true"]).await?;
        c.delete_sandbox(&sb.id).await?;
        v.push(t.elapsed());
        if out.exit.code != Some(0) {
            bail!("/bin/true exited with {:?}", out.exit);
        }
    }
    Ok(v)
}

/// CPU time the machine spent between `a` and `b`, steal left out (it was not
/// ours), in ms; `None` if the counters went back.
fn cpu_ms_spent(a: CpuTicks, b: CpuTicks, ticks_per_second: u64) -> Option<f64> {
    let busy = b.busy.checked_sub(a.busy)?;
    let steal = b.steal.saturating_sub(a.steal);
    Some(busy.saturating_sub(steal) as f64 * 1e3 / ticks_per_second.max(1) as f64)
}

/// CPU time (ns) that the threads of process `pid` (or `"self"`) have run so far,
/// from `/proc/PID/task/*/schedstat`; threads that ended are not counted.
fn process_cpu_ns(pid: &str) -> Option<u64> {
    let rd = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    Some(
        rd.flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .sum(),
    )
}

/// Where a burst's CPU time went, ms: the whole machine (steal left out), the
/// daemon's threads (pool refills included), and the benchmark's own client.
#[derive(Debug, Clone, Copy)]
struct BurstCpu {
    total: f64,
    daemon: Option<f64>,
    client: Option<f64>,
}

/// Counters at the start of a burst, for [`BurstCpu`].
struct BurstCpuStart {
    ticks: Option<CpuTicks>,
    daemon: Option<u64>,
    client: Option<u64>,
}

impl BurstCpuStart {
    fn now(daemon_pid: &str) -> Self {
        BurstCpuStart {
            ticks: cpu_ticks(),
            daemon: process_cpu_ns(daemon_pid),
            client: process_cpu_ns("self"),
        }
    }

    fn spent(&self, daemon_pid: &str) -> Option<BurstCpu> {
        let ms = |a: Option<u64>, b: Option<u64>| {
            a.zip(b)
                .and_then(|(a, b)| b.checked_sub(a))
                .map(|ns| ns as f64 / 1e6)
        };
        Some(BurstCpu {
            total: cpu_ms_spent(
                self.ticks?,
                cpu_ticks()?,
                rustix::param::clock_ticks_per_second(),
            )?,
            daemon: ms(self.daemon, process_cpu_ns(daemon_pid)),
            client: ms(self.client, process_cpu_ns("self")),
        })
    }
}

/// The note's account of a burst's CPU time: in all and per sandbox, its parts,
/// and the p50 that serving the sandboxes one after another would give.
fn burst_cpu_note(cpu: &BurstCpu, k: usize, cpus: usize) -> String {
    let per = |ms: f64| ms / k.max(1) as f64;
    let mut parts: Vec<String> = [("daemon", cpu.daemon), ("benchmark client", cpu.client)]
        .into_iter()
        .filter_map(|(name, ms)| Some(format!("{name} {:.2}", per(ms?))))
        .collect();
    let known = cpu.daemon.unwrap_or(0.0) + cpu.client.unwrap_or(0.0);
    parts.push(format!(
        "sandboxes and the rest {:.2}",
        per((cpu.total - known).max(0.0))
    ));
    format!(
        "the CPUs worked {:.0} ms meanwhile, {:.2} ms per sandbox ({}); served strictly one after another, the p50 would be {:.1} ms",
        cpu.total,
        per(cpu.total),
        parts.join(", "),
        in_turn_p50_ms(per(cpu.total), k, cpus)
    )
}

/// The p50 time to interactive of `k` sandboxes that each cost `cpu_ms_each` of CPU
/// and are served to the end one after another on `cpus` CPUs: the floor under a
/// burst's p50 that ordering alone can reach (fair sharing lands near its end).
fn in_turn_p50_ms(cpu_ms_each: f64, k: usize, cpus: usize) -> f64 {
    // The j-th finishes after ceil(j / cpus) turns; the p50 is the middle one's.
    cpu_ms_each * k.div_ceil(2).div_ceil(cpus.max(1)) as f64
}

/// `k` concurrent times to interactive: (each one, its create call, the wall time,
/// where the CPU time went meanwhile).
async fn burst(
    c: &Client,
    daemon_pid: &str,
    mode: &str,
    k: usize,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>, Duration, Option<BurstCpu>)> {
    let cpu_start = BurstCpuStart::now(daemon_pid);
    let t = Instant::now();
    let tasks: Vec<_> = (0..k)
        .map(|_| {
            let c = c.clone();
            let mode = mode.to_string();
            tokio::spawn(async move { tti(&c, &mode, false).await })
        })
        .collect();
    let mut lat = Vec::with_capacity(k);
    let mut creates = Vec::with_capacity(k);
    let mut ids = Vec::with_capacity(k);
    let mut first_err = None;
    for t in tasks {
        match t.await? {
            Ok(t) => {
                lat.push(t.total);
                creates.push(t.create);
                ids.push(t.id);
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    let wall = t.elapsed();
    let cpu = cpu_start.spent(daemon_pid);
    delete_all(c, ids).await;
    if let Some(e) = first_err {
        return Err(e.context("a burst create failed"));
    }
    Ok((lat, creates, wall, cpu))
}

async fn delete_all(c: &Client, ids: Vec<String>) {
    let tasks: Vec<_> = ids
        .into_iter()
        .map(|id| {
            let c = c.clone();
            tokio::spawn(async move {
                if let Err(e) = c.delete_sandbox(&id).await {
                    eprintln!("warning: delete {id}: {e}");
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
}

/// The `/proc/meminfo` fields the density section reports, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct MemSnapshot {
    /// MemTotal - MemAvailable.
    used: u64,
    anon: u64,
    slab: u64,
    page_tables: u64,
    kernel_stack: u64,
    percpu: u64,
}

/// Reads [`MemSnapshot`] from `/proc/meminfo` text (missing fields read as 0).
fn parse_meminfo(text: &str) -> MemSnapshot {
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    MemSnapshot {
        used: field("MemTotal:").saturating_sub(field("MemAvailable:")),
        anon: field("AnonPages:"),
        slab: field("Slab:"),
        page_tables: field("PageTables:"),
        kernel_stack: field("KernelStack:"),
        percpu: field("Percpu:"),
    }
}

fn host_mem() -> MemSnapshot {
    parse_meminfo(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default())
}

/// Per-sandbox KiB of what the kernel itself accounts (process memory, slab, page
/// tables, kernel stacks) between two snapshots, `n` sandboxes apart.
fn accounted_kib_per_sandbox(before: &MemSnapshot, after: &MemSnapshot, n: usize) -> MemBreakdown {
    let per = |a: u64, b: u64| (b as f64 - a as f64) / n.max(1) as f64 / 1024.0;
    MemBreakdown {
        anon: per(before.anon, after.anon),
        slab: per(before.slab, after.slab),
        page_tables: per(before.page_tables, after.page_tables),
        kernel_stack: per(before.kernel_stack, after.kernel_stack),
        percpu: per(before.percpu, after.percpu),
    }
}

/// Starts `n` idle sandboxes with `conc` workers, measures, tears all down.
async fn density(
    c: &Client,
    d: &Daemon,
    n: usize,
    conc: usize,
    mode: &str,
) -> anyhow::Result<Density> {
    // Let the page cache and the pool settle before the baseline.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = host_mem();
    let t = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..conc.max(1))
        .map(|_| {
            let c = c.clone();
            let next = next.clone();
            let mode = mode.to_string();
            tokio::spawn(async move {
                let mut ids = Vec::new();
                while (next.fetch_add(1, Ordering::Relaxed) as usize) < n {
                    match c.create_sandbox(&create_body(&mode)).await {
                        Ok(sb) => ids.push(sb.id),
                        Err(e) => return (ids, Some(e)),
                    }
                }
                (ids, None)
            })
        })
        .collect();
    let mut ids = Vec::with_capacity(n);
    let mut err = None;
    for w in workers {
        let (mut v, e) = w.await?;
        ids.append(&mut v);
        if let Some(e) = e {
            err.get_or_insert(e);
        }
    }
    let start_secs = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = host_mem();
    let pid1_pss_kib = pid1_pss_kib(d);
    let started = ids.len();
    let t = Instant::now();
    delete_all(c, ids).await;
    let teardown_secs = t.elapsed().as_secs_f64();
    if let Some(e) = err {
        bail!("density: {started} of {n} sandboxes started, then: {e}");
    }
    Ok(Density {
        sandboxes: n,
        network: mode.to_string(),
        start_secs,
        teardown_secs,
        host_mib_per_sandbox: after.used.saturating_sub(before.used) as f64
            / n as f64
            / (1 << 20) as f64,
        accounted_kib: accounted_kib_per_sandbox(&before, &after, n),
        pid1_pss_kib,
    })
}

/// Mean `Pss` of the daemon's sandbox PID 1s (its children in its sandboxes'
/// cgroups), KiB: the agent's share of memory, which the fork server shrinks.
fn pid1_pss_kib(d: &Daemon) -> Option<f64> {
    let daemon = d.child.id().to_string();
    let mut total = 0u64;
    let mut n = 0u64;
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let ppid = status.lines().find_map(|l| l.strip_prefix("PPid:"));
        if ppid.map(str::trim) != Some(daemon.as_str()) {
            continue;
        }
        let in_sandbox = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .is_ok_and(|c| c.contains(&format!("/{}", d.prefix)));
        let pss = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Pss:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            });
        if let (true, Some(kib)) = (in_sandbox, pss) {
            total += kib;
            n += 1;
        }
    }
    (n > 0).then(|| total as f64 / n as f64)
}

/// Host objects a sandbox can leave behind, by this daemon's id prefix: run
/// directories and cgroups; plus the host's network namespaces and interfaces,
/// compared by count before and after.
fn host_objects(prefix: &str) -> (Vec<String>, usize, usize) {
    // The private daemon runs with the runtime's default run dir and cgroup parent.
    let defaults = sandlot_runtime::RuntimeConfig::new(PathBuf::new());
    let left =
        sandlot_runtime::namespace::host_traces(&defaults.run_dir, &defaults.cgroup_parent, prefix)
            .into_iter()
            .map(|p| p.display().to_string())
            .collect();
    let count = |p: &str| std::fs::read_dir(p).map(|r| r.count()).unwrap_or(0);
    (left, count("/run/netns"), count("/sys/class/net"))
}

async fn churn(c: &Client, secs: u64, conc: usize) -> anyhow::Result<(u64, u64, f64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let workers: Vec<_> = (0..conc.max(1))
        .map(|_| {
            let (c, stop, cycles, errors) =
                (c.clone(), stop.clone(), cycles.clone(), errors.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let r = async {
                        let id = tti(&c, "none", false).await?.id;
                        c.delete_sandbox(&id).await?;
                        anyhow::Ok(())
                    }
                    .await;
                    match r {
                        Ok(()) => cycles.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            if errors.fetch_add(1, Ordering::Relaxed) < 3 {
                                eprintln!("churn error: {e:#}");
                            }
                            0
                        }
                    };
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.await;
    }
    Ok((
        cycles.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
        t.elapsed().as_secs_f64(),
    ))
}

// ---- driver ----

fn wants(only: &[String], s: &str) -> bool {
    only.is_empty() || only.iter().any(|o| o == s)
}

pub fn run(a: PlatformArgs) -> anyhow::Result<i32> {
    if !rustix::process::geteuid().is_root() {
        bail!("sandlot bench platform needs root (it runs a daemon that creates namespaces)");
    }
    for s in &a.only {
        if !["tti", "cycle", "burst", "exec", "density", "churn", "peers"].contains(&s.as_str()) {
            bail!("--only: unknown section {s:?} (tti, cycle, burst, exec, density, churn, peers)");
        }
    }
    if a.n == 0 {
        bail!("--n must be at least 1");
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("create {}", a.out.display()))?;
    let mut res = Results {
        machine: format!("{}, isolation {}", machine(), a.isolation),
        ..Default::default()
    };
    let ticks_at_start = cpu_ticks();
    let pool_max = a.pool_max.unwrap_or(a.pool).max(a.pool);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let stop = StopSignals::catch(&rt)?;
    let (daemon, c) = start_daemon(a.pool, pool_max, a.fork_server, &a.isolation)?;
    let (before_left, netns0, links0) = host_objects(&daemon.prefix);
    let _ = before_left;
    let outcome = rt.block_on(stop.until_stopped(async {
        // Warm up: page cache, the daemon's first connections.
        wait_settled(&c, a.pool).await;
        for _ in 0..5 {
            let id = tti(&c, "none", false).await?.id;
            c.delete_sandbox(&id).await?;
        }
        let mut modes = vec!["none"];
        match tti(&c, "allow", false).await {
            Ok(t) => {
                c.delete_sandbox(&t.id).await?;
                modes.push("allow");
            }
            Err(e) => res.notes.push(format!(
                "network allow policy not measured: the daemon refused it ({e:#})"
            )),
        }
        if wants(&a.only, "tti") {
            for m in &modes {
                eprintln!("time to interactive, {} sequential, network {m} ...", a.n);
                let (v, creates, seconds, (hits, misses)) =
                    sequential(&c, m, a.n, a.pool).await?;
                let rest: Vec<Duration> = v.iter().zip(&creates).map(|(t, c)| *t - *c).collect();
                res.notes.push(format!(
                    "time to interactive ({m}): the create call p50 {:.2} ms (p99 {:.2}), exec to first output byte p50 {:.2} ms (p99 {:.2}); a second exec in the same sandbox (off the clock) {:.2} ms; pool hits {hits}, misses {misses}",
                    pct_ms(&creates, 50.0),
                    pct_ms(&creates, 99.0),
                    pct_ms(&rest, 50.0),
                    pct_ms(&rest, 99.0),
                    pct_ms(&seconds, 50.0)
                ));
                res.rows
                    .push(row("tti", &format!("sandlot sequential ({m})"), v));
            }
        }
        if wants(&a.only, "cycle") {
            for m in &modes {
                eprintln!(
                    "create + exec /bin/true + delete, {} sequential, network {m} ...",
                    a.n
                );
                let v = cycles(&c, m, a.n, a.pool).await?;
                res.rows.push(row(
                    "cycle",
                    &format!("sandlot create+exec+delete ({m})"),
                    v,
                ));
            }
        }
        if wants(&a.only, "burst") {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            let daemon_pid = daemon.child.id().to_string();
            for m in &modes {
                for &k in &a.bursts {
                    wait_settled(&c, a.pool).await;
                    eprintln!("burst of {k}, network {m} ...");
                    let (v, creates, wall, cpu) = burst(&c, &daemon_pid, m, k).await?;
                    let cpu = cpu.map_or(String::new(), |cpu| {
                        format!("; {}", burst_cpu_note(&cpu, k, cpus))
                    });
                    res.notes.push(format!(
                        "burst of {k} ({m}): all interactive after {:.0} ms; create calls answered after {:.1} ms (first), {:.1} ms (p50), {:.1} ms (last){cpu}",
                        wall.as_secs_f64() * 1e3,
                        pct_ms(&creates, 0.0),
                        pct_ms(&creates, 50.0),
                        pct_ms(&creates, 100.0),
                    ));
                    res.rows
                        .push(row("burst", &format!("sandlot burst {k} ({m})"), v));
                }
            }
        }
        if wants(&a.only, "exec") {
            // Not while the pools refill after the bursts (that showed as a p90 of
            // 2.3-3.1 ms for `/bin/true` against a p50 of 0.7-1.0 ms).
            wait_settled(&c, a.pool).await;
            eprintln!("exec round trip, {} each ...", a.exec_n);
            let sb = c.create_sandbox(&create_body("none")).await?;
            for (name, cmd) in [
                ("exec /bin/true", ["/bin/true", ""]),
                ("exec echo", ["echo", "hi"]),
            ] {
                let args: Vec<&str> = cmd.iter().copied().filter(|s| !s.is_empty()).collect();
                // The host's own cost of the process, measured just before: the
                // floor the sandbox's round trip is compared with.
                let (argv, n) = (args.clone(), a.exec_n);
                let host = tokio::task::spawn_blocking(move || host_spawn(&argv, n)).await??;
                let what = name.trim_start_matches("exec ");
                res.rows.push(row("exec", &format!("host spawn {what}"), host));
                let mut v = Vec::with_capacity(a.exec_n);
                for _ in 0..a.exec_n {
                    let t = Instant::now();
                    let out = c.run(&sb.id, &args).await?;
                    v.push(t.elapsed());
                    if out.exit.code != Some(0) {
                        bail!("{name} exited with {:?}", out.exit);
                    }
                }
                res.rows.push(row("exec", &format!("sandlot {name}"), v));
            }
            // Throughput: 8 clients running /bin/true for 3 s.
            let stop = Instant::now() + Duration::from_secs(3);
            let done = Arc::new(AtomicU64::new(0));
            let t = Instant::now();
            let ws: Vec<_> = (0..8)
                .map(|_| {
                    let (c, id, done) = (c.clone(), sb.id.clone(), done.clone());
                    tokio::spawn(async move {
                        while Instant::now() < stop {
                            if c.run(&id, &["/bin/true"]).await.is_ok() {
                                done.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })
                })
                .collect();
            for w in ws {
                let _ = w.await;
            }
            res.exec_per_sec =
                Some(done.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64());
            c.delete_sandbox(&sb.id).await?;
        }
        if wants(&a.only, "density") && a.density > 0 {
            wait_settled(&c, a.pool).await;
            let m = modes.last().copied().unwrap_or("none");
            eprintln!("density: {} idle sandboxes, network {m} ...", a.density);
            res.density = Some(density(&c, &daemon, a.density, a.concurrency, m).await?);
        }
        if wants(&a.only, "churn") && a.churn_secs > 0 {
            wait_settled(&c, a.pool).await;
            eprintln!(
                "churn: {} s with {} workers ...",
                a.churn_secs, a.concurrency
            );
            let (cycles, errors, secs) = churn(&c, a.churn_secs, a.concurrency).await?;
            res.churn = Some(Churn {
                secs,
                cycles,
                cycles_per_sec: cycles as f64 / secs,
                errors,
                leaked: Vec::new(),
            });
        }
        anyhow::Ok(())
    }));
    // No task of the work goes on creating sandboxes (the churn's and density's
    // workers of a run that stopped midway); then stop the daemon (it tears its
    // pool down, and deletes whatever else is left), then look for leftovers.
    rt.shutdown_timeout(Duration::from_secs(10));
    let prefix = daemon.prefix.clone();
    drop(daemon);
    outcome?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut left, mut netns1, mut links1) = host_objects(&prefix);
    while (!left.is_empty() || netns1 > netns0 || links1 > links0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        (left, netns1, links1) = host_objects(&prefix);
    }
    if netns1 > netns0 {
        left.push(format!(
            "{} network namespaces more than before",
            netns1 - netns0
        ));
    }
    if links1 > links0 {
        left.push(format!(
            "{} network interfaces more than before",
            links1 - links0
        ));
    }
    if let Some(ch) = &mut res.churn {
        ch.leaked = left.clone();
    }

    if wants(&a.only, "peers") {
        eprintln!(
            "peers: bubblewrap and crun, {} sequential and bursts ...",
            a.n
        );
        peers(&a, &mut res)?;
    }
    res.steal_share = ticks_at_start
        .zip(cpu_ticks())
        .and_then(|(a, b)| steal_share(a, b));
    print_report(&res);
    let json_path = a.out.join("results.json");
    std::fs::write(&json_path, serde_json::to_vec_pretty(&res)?)?;
    eprintln!("wrote {}", json_path.display());
    plot(&json_path, &a.out.join("latency.png"));
    if !left.is_empty() {
        eprintln!("LEAK: left behind after the run: {left:?}");
        return Ok(1);
    }
    Ok(0)
}

fn peers(a: &PlatformArgs, res: &mut Results) -> anyhow::Result<()> {
    // Warm the page cache.
    peer_seq(5, |_| bwrap_echo())?;
    res.rows.push(row(
        "tti",
        "bwrap sequential",
        peer_seq(a.n, |_| bwrap_echo())?,
    ));
    res.rows.push(row(
        "tti",
        "host echo sequential (no isolation)",
        peer_seq(a.n, |_| host_echo())?,
    ));
    let crun = match CrunBundle::new() {
        Ok(b) => {
            peer_seq(5, |i| b.command(i))?;
            Some(b)
        }
        Err(e) => {
            res.notes.push(format!("crun not measured: {e:#}"));
            None
        }
    };
    if let Some(b) = &crun {
        res.rows.push(row(
            "tti",
            "crun sequential",
            peer_seq(a.n, |i| b.command(i))?,
        ));
        res.rows.push(row(
            "tti",
            "crun's unshare wrapper alone",
            peer_seq(a.n, |_| CrunBundle::wrapper_only())?,
        ));
    }
    if wants(&a.only, "burst") || a.only.is_empty() || wants(&a.only, "peers") {
        for &k in &a.bursts {
            res.rows.push(row(
                "burst",
                &format!("bwrap burst {k}"),
                peer_burst(k, |_| bwrap_echo())?,
            ));
            res.rows.push(row(
                "burst",
                &format!("host burst {k} (echo, no isolation)"),
                peer_burst(k, |_| host_echo())?,
            ));
            if let Some(b) = &crun {
                let base = 1_000_000 + k * 1000;
                res.rows.push(row(
                    "burst",
                    &format!("crun burst {k}"),
                    peer_burst(k, |i| b.command(base + i))?,
                ));
            }
        }
    }
    Ok(())
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cpus} cpus, kernel {}, load average at start {}",
        kernel.trim(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}

/// The p50 a row of `section` named `name` is compared with: bubblewrap doing the
/// same work (its burst of the same size for a burst, its whole run for a cycle),
/// or for an exec round trip the host spawning the same command.
fn baseline_p50(rows: &[Row], section: &str, name: &str) -> Option<f64> {
    let p50 = |section: &str, is_base: &dyn Fn(&str) -> bool| {
        rows.iter()
            .find(|x| x.section == section && is_base(&x.summary.name))
            .map(|x| x.summary.p50_ms)
    };
    match section {
        "burst" => {
            let want = format!("bwrap burst {}", name.split_whitespace().nth(2)?);
            p50(section, &|n| n == want)
        }
        // Bubblewrap's whole run (start, echo, exit) is its cycle.
        "cycle" => p50("tti", &|n| n == "bwrap sequential"),
        "exec" => {
            let cmd = name
                .strip_prefix("sandlot exec ")
                .or_else(|| name.strip_prefix("host spawn "))?;
            let want = format!("host spawn {cmd}");
            p50(section, &|n| n == want)
        }
        _ => p50(section, &|n| n.starts_with("bwrap")),
    }
}

fn print_report(res: &Results) {
    println!("machine: {}\n", res.machine);
    if let Some(st) = res.steal_share {
        println!(
            "steal: the hypervisor gave {:.1} % of this machine's CPU time to other work during the run{}\n",
            st * 100.0,
            if st > STEAL_WARN {
                " (a contended host: absolute times are not comparable with a quiet run; \
                 ratios against the peers measured in the same run still are)"
            } else {
                ""
            }
        );
    }
    for section in ["tti", "cycle", "burst", "exec"] {
        let rows: Vec<&Row> = res.rows.iter().filter(|r| r.section == section).collect();
        if rows.is_empty() {
            continue;
        }
        let against = if section == "exec" {
            "host spawn"
        } else {
            "bwrap"
        };
        println!("| {section} | n | p50 ms | p95 ms | p99 ms | max ms | p50 / {against} |");
        println!("|---|---|---|---|---|---|---|");
        for r in rows {
            let s = &r.summary;
            let ratio = baseline_p50(&res.rows, section, &s.name)
                .map_or("-".to_string(), |b| format!("{:.2}", s.p50_ms / b));
            println!(
                "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {ratio} |",
                s.name, s.n, s.p50_ms, s.p95_ms, s.p99_ms, s.max_ms
            );
        }
        println!();
    }
    if let Some(x) = res.exec_per_sec {
        println!("exec throughput on one sandbox (8 clients, /bin/true): {x:.0} per second\n");
    }
    if let Some(d) = &res.density {
        println!(
            "density: {} idle sandboxes (network {}) started in {:.2} s, torn down in {:.2} s, {:.2} MiB of host memory each (MemTotal - MemAvailable); \
             accounted {:.0} KiB each (anon {:.0}, slab {:.0}, page tables {:.0}, kernel stacks {:.0}, per-CPU {:.0}); PID 1 (agent) Pss {}\n",
            d.sandboxes,
            d.network,
            d.start_secs,
            d.teardown_secs,
            d.host_mib_per_sandbox,
            d.accounted_kib.total(),
            d.accounted_kib.anon,
            d.accounted_kib.slab,
            d.accounted_kib.page_tables,
            d.accounted_kib.kernel_stack,
            d.accounted_kib.percpu,
            d.pid1_pss_kib
                .map_or("unknown".to_string(), |k| format!("{k:.0} KiB"))
        );
    }
    if let Some(c) = &res.churn {
        println!(
            "churn: {} create/exec/delete cycles in {:.1} s = {:.1} per second, {} errors, leftovers: {}\n",
            c.cycles,
            c.secs,
            c.cycles_per_sec,
            c.errors,
            if c.leaked.is_empty() { "none".to_string() } else { format!("{:?}", c.leaked) }
        );
    }
    for n in &res.notes {
        println!("note: {n}");
    }
}

/// Draws the latency distributions with matplotlib, if present.
fn plot(json: &Path, png: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/bench_plot.py");
    // Debian's interpreter has python3-matplotlib; a `python3` earlier in PATH (a
    // virtualenv, pyenv) may not.
    let Some(py) = ["/usr/bin/python3", "python3"].into_iter().find(|p| {
        Command::new(p)
            .args(["-c", "import matplotlib"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }) else {
        eprintln!(
            "note: no plot: no python3 here imports matplotlib; `apt-get install python3-matplotlib`, then `python3 scripts/bench_plot.py {} {}`",
            json.display(),
            png.display()
        );
        return;
    };
    let st = Command::new(py).arg(&script).arg(json).arg(png).status();
    match st {
        Ok(s) if s.success() => eprintln!("wrote {}", png.display()),
        Ok(s) => eprintln!(
            "warning: no plot ({} exited with {s}); `apt-get install python3-matplotlib` or run scripts/bench.sh",
            script.display()
        ),
        Err(e) => eprintln!("warning: no plot: python3: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_leave_out_idle_and_iowait() {
        let text = "cpu  100 5 50 1000 20 3 2 7 0 0\ncpu0 50 2 25 500 10 1 1 3 0 0\nintr 1\n";
        // busy: user 100 + nice 5 + system 50 + irq 3 + softirq 2 + steal 7.
        assert_eq!(
            parse_cpu_ticks(text),
            Some(CpuTicks {
                busy: 167,
                total: 1187,
                steal: 7
            })
        );
        // A kernel that reports no steal field.
        assert_eq!(
            parse_cpu_ticks("cpu  1 2 3 4 5\n"),
            Some(CpuTicks {
                busy: 6,
                total: 15,
                steal: 0
            })
        );
        assert_eq!(parse_cpu_ticks("intr 1\n"), None);
        assert_eq!(parse_cpu_ticks("cpu  1 2 x 4 5\n"), None);
    }

    fn ticks(busy: u64, total: u64, steal: u64) -> CpuTicks {
        CpuTicks { busy, total, steal }
    }

    #[test]
    fn busy_share_is_the_busy_part_of_the_window() {
        assert_eq!(
            busy_share(ticks(100, 1000, 0), ticks(150, 1200, 0)),
            Some(0.25)
        );
        // No time passed (or the counters went back): no share.
        assert_eq!(busy_share(ticks(100, 1000, 0), ticks(100, 1000, 0)), None);
        assert_eq!(busy_share(ticks(100, 1000, 0), ticks(90, 900, 0)), None);
    }

    #[test]
    fn a_bursts_cpu_time_gives_the_in_turn_floor_of_its_p50() {
        // 30 jiffies busy, 4 of them stolen, at 100 per second: 260 ms of our CPU.
        let spent = cpu_ms_spent(ticks(100, 1000, 6), ticks(130, 1100, 10), 100).unwrap();
        assert!((spent - 260.0).abs() < 1e-9, "{spent}");
        assert_eq!(
            cpu_ms_spent(ticks(100, 1000, 0), ticks(90, 1100, 0), 100),
            None
        );
        // 100 sandboxes of 2 ms each on 2 CPUs: the 50th is done after 25 turns.
        assert!((in_turn_p50_ms(2.0, 100, 2) - 50.0).abs() < 1e-9);
        // 10 on 2: the 5th after 3 turns; on 1 CPU after 5.
        assert!((in_turn_p50_ms(1.0, 10, 2) - 3.0).abs() < 1e-9);
        assert!((in_turn_p50_ms(1.0, 10, 1) - 5.0).abs() < 1e-9);
        let note = burst_cpu_note(
            &BurstCpu {
                total: 220.0,
                daemon: Some(60.0),
                client: Some(20.0),
            },
            100,
            2,
        );
        assert_eq!(
            note,
            "the CPUs worked 220 ms meanwhile, 2.20 ms per sandbox (daemon 0.60, benchmark \
             client 0.20, sandboxes and the rest 1.40); served strictly one after another, \
             the p50 would be 55.0 ms"
        );
        // The process counters of this test's own threads move forward.
        let a = process_cpu_ns("self").unwrap();
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(20) {
            std::hint::black_box(0u64);
        }
        assert!(process_cpu_ns("self").unwrap() > a);
    }

    #[test]
    fn steal_share_flags_a_contended_host() {
        // 10 of 400 ticks stolen: 2.5 %, above the warning line.
        let s = steal_share(ticks(100, 1000, 40), ticks(300, 1400, 50)).unwrap();
        assert!((s - 0.025).abs() < 1e-9, "{s}");
        assert!(s > STEAL_WARN);
        // A quiet host: 1 of 400.
        let q = steal_share(ticks(100, 1000, 40), ticks(300, 1400, 41)).unwrap();
        assert!(q < STEAL_WARN, "{q}");
        assert_eq!(steal_share(ticks(1, 10, 0), ticks(1, 10, 0)), None);
    }

    #[test]
    fn density_counts_the_kernels_accounts_per_sandbox() {
        let before = parse_meminfo(
            "MemTotal:       24000000 kB\nMemFree:  1 kB\nMemAvailable:   20000000 kB\n\
             AnonPages:        100000 kB\nSlab:             200000 kB\n\
             SReclaimable:      50000 kB\nKernelStack:       10000 kB\nPageTables:        20000 kB\n\
             Percpu:             3000 kB\n",
        );
        assert_eq!(before.used, 4_000_000 * 1024);
        assert_eq!(before.anon, 100_000 * 1024);
        // SReclaimable is not read as Slab, nor KernelStack as anything else.
        assert_eq!(before.slab, 200_000 * 1024);
        assert_eq!(before.kernel_stack, 10_000 * 1024);
        assert_eq!(before.percpu, 3_000 * 1024);
        let after = MemSnapshot {
            used: before.used + 500 * (1 << 20),
            anon: before.anon + 1000 * 200 * 1024,
            slab: before.slab + 1000 * 600 * 1024,
            page_tables: before.page_tables + 1000 * 80 * 1024,
            kernel_stack: before.kernel_stack + 1000 * 16 * 1024,
            percpu: before.percpu + 1000 * 24 * 1024,
        };
        let b = accounted_kib_per_sandbox(&before, &after, 1000);
        assert_eq!(
            (b.anon, b.slab, b.page_tables, b.kernel_stack, b.percpu),
            (200.0, 600.0, 80.0, 16.0, 24.0)
        );
        assert_eq!(b.total(), 920.0);
        // Memory freed elsewhere meanwhile shows as negative growth, not a wrap.
        let shrunk = MemSnapshot {
            slab: before.slab - 1024 * 1000,
            ..before
        };
        assert_eq!(accounted_kib_per_sandbox(&before, &shrunk, 1000).slab, -1.0);
        assert_eq!(parse_meminfo(""), MemSnapshot::default());
    }

    /// Each table's ratio column compares a row with the peer doing the
    /// same work in the same run; an exec round trip with the host spawning the
    /// same command.
    #[test]
    fn ratios_compare_with_the_peer_doing_the_same_work() {
        let r = |section, name: &str, ms: u64| row(section, name, vec![Duration::from_millis(ms)]);
        let rows = vec![
            r("tti", "sandlot sequential (none)", 3),
            r("tti", "bwrap sequential", 5),
            r("cycle", "sandlot create+exec+delete (none)", 6),
            r("burst", "sandlot burst 100 (none)", 100),
            r("burst", "bwrap burst 10", 20),
            r("burst", "bwrap burst 100", 200),
            r("exec", "host spawn /bin/true", 1),
            r("exec", "sandlot exec /bin/true", 2),
            r("exec", "host spawn echo", 4),
            r("exec", "sandlot exec echo", 8),
        ];
        let base = |section, name| baseline_p50(&rows, section, name);
        assert_eq!(base("tti", "sandlot sequential (none)"), Some(5.0));
        assert_eq!(
            base("cycle", "sandlot create+exec+delete (none)"),
            Some(5.0)
        );
        assert_eq!(base("burst", "sandlot burst 100 (none)"), Some(200.0));
        assert_eq!(base("burst", "sandlot burst 10 (allow)"), Some(20.0));
        assert_eq!(base("exec", "sandlot exec /bin/true"), Some(1.0));
        assert_eq!(base("exec", "sandlot exec echo"), Some(4.0));
        assert_eq!(base("exec", "host spawn echo"), Some(4.0));
        assert_eq!(base("exec", "sandlot exec ls"), None, "no host row for it");
        assert_eq!(
            base("burst", "sandlot burst 50 (none)"),
            None,
            "no peer burst of 50"
        );
        assert_eq!(
            base("burst", "host burst 100 (echo, no isolation)"),
            Some(200.0)
        );
        assert_eq!(
            base("tti", "host echo sequential (no isolation)"),
            Some(5.0)
        );
    }

    #[test]
    fn metric_series_are_read_by_their_exact_name() {
        let t = "sandlot_teardowns_pending 3\nsandlot_teardowns_pending_x 9\nsandlot_pool_ready{pool=\"bench\"} 4\n";
        assert_eq!(metric_value(t, "sandlot_teardowns_pending"), Some(3));
        assert_eq!(metric_value(t, "sandlot_pool_ready"), None);
        assert_eq!(pool_metric(t, "sandlot_pool_ready", "bench"), Some(4));
    }
}
