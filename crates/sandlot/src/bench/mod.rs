//! `sandlot bench`: latency benchmarks against peers, run in the same command so that
//! ratios are meaningful on noisy shared machines. See docs/benchmarks.md.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

pub mod code;
pub mod fork;
pub mod pause;
mod peers;
pub mod platform;

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchWhat,
}

#[derive(Debug, clap::Subcommand)]
pub enum BenchWhat {
    /// The platform benchmark through a real daemon and its API: time to
    /// interactive (sequential, bursts), exec round trip and throughput, density,
    /// churn with a leak check; bubblewrap and crun in the same run. See
    /// docs/benchmarks.md.
    Platform(platform::PlatformArgs),
    /// Running code in code contexts: the first run after a create from a pool
    /// whose kernels run already, following cells, against a fresh sandbox running
    /// `python3 -c` per call and a bare ipykernel on the host. See docs/benchmarks.md.
    Code(code::CodeArgs),
    /// Pausing and resuming a sandbox with an idle shell (pause; resume to its
    /// first exec) on gVisor and the namespace backend, against a fresh sandbox to
    /// its first exec. See docs/benchmarks.md.
    Pause(pause::PauseArgs),
    /// Forking a sandbox with an idle shell into N sandboxes until each answers an
    /// exec (from the live sandbox; from a checkpoint), on gVisor and the
    /// namespace backend, against N fresh sandboxes to their first exec. See
    /// docs/benchmarks.md.
    Fork(fork::ForkArgs),
    /// Create a sandbox, run /bin/true in it, tear it down; n times, against bubblewrap.
    Runtime {
        /// Iterations per contender.
        #[arg(short, long, default_value_t = 200)]
        n: usize,
        /// Write the results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

/// Latency distribution of one contender.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub name: String,
    pub n: usize,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn summarize(name: &str, mut samples: Vec<Duration>) -> Summary {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mean = samples.iter().map(|d| ms(*d)).sum::<f64>() / samples.len().max(1) as f64;
    Summary {
        name: name.to_string(),
        n: samples.len(),
        p50_ms: ms(percentile(&samples, 50.0)),
        p95_ms: ms(percentile(&samples, 95.0)),
        p99_ms: ms(percentile(&samples, 99.0)),
        max_ms: ms(*samples.last().unwrap_or(&Duration::ZERO)),
        mean_ms: mean,
    }
}

pub fn print_table(rows: &[Summary], baseline: &str) {
    let base = rows.iter().find(|r| r.name == baseline).map(|r| r.p50_ms);
    println!(
        "{:<34} {:>5} {:>9} {:>9} {:>9} {:>9} {:>12}",
        "contender", "n", "p50 ms", "p95 ms", "p99 ms", "max ms", "p50 ratio"
    );
    for r in rows {
        let ratio = base.map_or(String::from("-"), |b| format!("{:.2}x", r.p50_ms / b));
        println!(
            "{:<34} {:>5} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>12}",
            r.name, r.n, r.p50_ms, r.p95_ms, r.p99_ms, r.max_ms, ratio
        );
    }
}

/// Times `n` runs of a command, failing on the first unsuccessful one.
fn time_command(n: usize, mut make: impl FnMut() -> Command) -> anyhow::Result<Vec<Duration>> {
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let mut c = make();
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let t = Instant::now();
        let out = c
            .output()
            .with_context(|| format!("run {:?}", c.get_program()))?;
        let d = t.elapsed();
        if !out.status.success() {
            bail!(
                "iteration {i} of {:?} failed: {}",
                c.get_program(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        v.push(d);
    }
    Ok(v)
}

/// The bubblewrap command doing the closest equivalent work: new namespaces (user,
/// pid, net, ipc, uts, cgroup), read-only /usr, fresh /proc, /dev and /tmp.
pub fn bwrap_command(argv: &[&str]) -> Command {
    let mut c = Command::new("bwrap");
    c.args([
        "--unshare-all",
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
    ]);
    for (l, t) in [
        ("/bin", "usr/bin"),
        ("/lib", "usr/lib"),
        ("/lib64", "usr/lib64"),
        ("/sbin", "usr/sbin"),
    ] {
        if std::path::Path::new(l).is_symlink() {
            c.args(["--symlink", t, l]);
        }
    }
    c.args(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]);
    c.args(argv);
    c
}

pub fn run(args: BenchArgs) -> anyhow::Result<i32> {
    match args.what {
        BenchWhat::Runtime { n, json } => runtime(n, json),
        BenchWhat::Platform(a) => platform::run(a),
        BenchWhat::Code(a) => code::run(a),
        BenchWhat::Pause(a) => pause::run(a),
        BenchWhat::Fork(a) => fork::run(a),
    }
}

fn runtime(n: usize, json: Option<PathBuf>) -> anyhow::Result<i32> {
    if n == 0 {
        bail!("-n must be at least 1");
    }
    let exe = std::env::current_exe().context("find the sandlot binary")?;
    which("bwrap").context(
        "bubblewrap (Debian package bubblewrap) is the benchmark's peer; run scripts/setup.sh",
    )?;
    // Warm up page caches for every contender.
    time_command(5, || bwrap_command(&["/bin/true"]))?;
    time_command(5, || sandlot_run(&exe))?;
    drop(crate::run::bench_in_process(5, false)?);
    drop(crate::run::bench_in_process(5, true)?);

    eprintln!("measuring {n} iterations each ...");
    let rows = vec![
        summarize(
            "bwrap /bin/true",
            time_command(n, || bwrap_command(&["/bin/true"]))?,
        ),
        summarize(
            "sandlot run /bin/true (CLI)",
            time_command(n, || sandlot_run(&exe))?,
        ),
        summarize(
            "sandlot runtime, in-process",
            crate::run::bench_in_process(n, false)?,
        ),
        summarize(
            "sandlot runtime, fork server",
            crate::run::bench_in_process(n, true)?,
        ),
    ];
    print_table(&rows, "bwrap /bin/true");
    if let Some(p) = json {
        std::fs::write(&p, serde_json::to_vec_pretty(&rows)?)
            .with_context(|| format!("write {}", p.display()))?;
    }
    Ok(0)
}

fn sandlot_run(exe: &std::path::Path) -> Command {
    let mut c = Command::new(exe);
    c.args(["run", "--", "/bin/true"]);
    c
}

fn which(prog: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
        .with_context(|| format!("{prog} not found in PATH"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let s: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&s, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&s, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&s, 100.0), Duration::from_millis(100));
        assert_eq!(percentile(&s[..1], 95.0), Duration::from_millis(1));
        let sum = summarize(
            "x",
            vec![
                Duration::from_millis(3),
                Duration::from_millis(1),
                Duration::from_millis(2),
            ],
        );
        assert_eq!(sum.p50_ms, 2.0);
        assert_eq!(sum.max_ms, 3.0);
    }
}
