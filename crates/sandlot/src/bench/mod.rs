//! `sandlot bench`: latency benchmarks against peers, run in the same command so that
//! ratios are meaningful on noisy shared machines. See docs/benchmarks.md.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

pub mod code;
pub mod fork;
mod matched;
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
    /// `sandlot run -- /bin/true`, bubblewrap, and bubblewrap doing the sandbox's
    /// isolation work (its mounts, seccomp filter, dropped capabilities and
    /// cgroups) in turn, n rounds: latency, CPU and pairwise ratios; then the
    /// runtime's create, exec and teardown in process.
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

/// One run of a command: its wall time, start to reaped exit, and the CPU time
/// (user and system) of it, of every process it waited for, and of this
/// process meanwhile (starting it, waiting for it).
#[derive(Debug, Clone, Copy)]
struct Timed {
    wall: Duration,
    cpu: Duration,
}

/// The CPU time of this process and of the children it has reaped, so far.
fn cpu_so_far() -> anyhow::Result<Duration> {
    Ok(sandlot_runtime::own_cpu().context("getrusage")?
        + sandlot_runtime::reaped_children_cpu().context("getrusage")?)
}

/// Runs `c` once to its exit; fails if it did not succeed.
fn time_once(c: &mut Command) -> anyhow::Result<Timed> {
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let cpu0 = cpu_so_far()?;
    let t = Instant::now();
    let out = c
        .output()
        .with_context(|| format!("run {:?}", c.get_program()))?;
    let wall = t.elapsed();
    let cpu = cpu_so_far()?.saturating_sub(cpu0);
    if !out.status.success() {
        bail!(
            "{:?} failed: {}",
            c.get_program(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(Timed { wall, cpu })
}

/// The median of the pairwise ratios `a[i] / b[i]`: runs taken in turn share the
/// machine's drift, so their ratio is steadier than a ratio of two medians.
fn pairwise_median_ratio(a: &[Duration], b: &[Duration]) -> Option<f64> {
    let mut r: Vec<f64> = a
        .iter()
        .zip(b)
        .filter(|(_, y)| !y.is_zero())
        .map(|(x, y)| x.as_secs_f64() / y.as_secs_f64())
        .collect();
    if r.is_empty() {
        return None;
    }
    r.sort_by(f64::total_cmp);
    Some(r[(r.len() - 1) / 2])
}

/// The runs of one contender of the runtime benchmark.
#[derive(Default)]
struct Runs(Vec<Timed>);

impl Runs {
    fn wall(&self) -> Vec<Duration> {
        self.0.iter().map(|t| t.wall).collect()
    }

    fn cpu(&self) -> Vec<Duration> {
        self.0.iter().map(|t| t.cpu).collect()
    }
}

/// The CLI, bubblewrap and bubblewrap doing the sandbox's work in turn, `n`
/// rounds; which goes first rotates.
fn alternate(
    n: usize,
    exe: &std::path::Path,
    matched: &mut matched::MatchedBwrap,
) -> anyhow::Result<(Runs, Runs, Runs)> {
    let (mut cli, mut bw, mut mb) = (Runs::default(), Runs::default(), Runs::default());
    for i in 0..n {
        for k in 0..3 {
            match (i + k) % 3 {
                0 => cli.0.push(time_once(&mut sandlot_run(exe))?),
                1 => bw.0.push(time_once(&mut bwrap_command(&["/bin/true"]))?),
                _ => mb.0.push(matched.run(&["/bin/true"])?),
            }
        }
    }
    Ok((cli, bw, mb))
}

fn runtime(n: usize, json: Option<PathBuf>) -> anyhow::Result<i32> {
    if n == 0 {
        bail!("-n must be at least 1");
    }
    let exe = std::env::current_exe().context("find the sandlot binary")?;
    which("bwrap").context(
        "bubblewrap (Debian package bubblewrap) is the benchmark's peer; run scripts/setup.sh",
    )?;
    let mut matched = matched::MatchedBwrap::new()?;
    // Warm up page caches for every contender.
    alternate(5, &exe, &mut matched)?;
    drop(crate::run::bench_in_process(5, false)?);
    drop(crate::run::bench_in_process(5, true)?);

    eprintln!(
        "measuring {n} rounds (the CLI, bubblewrap, bubblewrap doing the sandbox's work, in turn) ..."
    );
    let (cli, bw, mb) = alternate(n, &exe, &mut matched)?;
    let ratios = Ratios {
        cli_over_bwrap_wall: pairwise_median_ratio(&cli.wall(), &bw.wall()),
        cli_over_bwrap_cpu: pairwise_median_ratio(&cli.cpu(), &bw.cpu()),
        matched_over_bwrap_wall: pairwise_median_ratio(&mb.wall(), &bw.wall()),
        matched_over_bwrap_cpu: pairwise_median_ratio(&mb.cpu(), &bw.cpu()),
        cli_over_matched_wall: pairwise_median_ratio(&cli.wall(), &mb.wall()),
        cli_over_matched_cpu: pairwise_median_ratio(&cli.cpu(), &mb.cpu()),
    };
    const MATCHED: &str = "bwrap, the sandbox's work";
    let rows = vec![
        summarize("bwrap /bin/true", bw.wall()),
        summarize(MATCHED, mb.wall()),
        summarize("sandlot run /bin/true (CLI)", cli.wall()),
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
    let cpu_rows = [
        summarize("bwrap /bin/true, CPU", bw.cpu()),
        summarize(&format!("{MATCHED}, CPU"), mb.cpu()),
        summarize("sandlot run /bin/true (CLI), CPU", cli.cpu()),
    ];
    println!();
    print_table(&cpu_rows, "bwrap /bin/true, CPU");
    let show = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.2}x"));
    println!("\nmedians of the {n} pairwise ratios (wall, CPU):");
    for (what, w, c) in [
        (
            "CLI / bubblewrap",
            ratios.cli_over_bwrap_wall,
            ratios.cli_over_bwrap_cpu,
        ),
        (
            "bubblewrap doing the sandbox's work / bubblewrap",
            ratios.matched_over_bwrap_wall,
            ratios.matched_over_bwrap_cpu,
        ),
        (
            "CLI / bubblewrap doing the sandbox's work",
            ratios.cli_over_matched_wall,
            ratios.cli_over_matched_cpu,
        ),
    ] {
        println!("  {what:<50} {:>7} {:>7}", show(w), show(c));
    }
    if let Some(p) = json {
        #[derive(Serialize)]
        struct Out<'a> {
            wall: &'a [Summary],
            cpu: &'a [Summary],
            #[serde(flatten)]
            ratios: &'a Ratios,
        }
        let out = Out {
            wall: &rows,
            cpu: &cpu_rows,
            ratios: &ratios,
        };
        std::fs::write(&p, serde_json::to_vec_pretty(&out)?)
            .with_context(|| format!("write {}", p.display()))?;
    }
    Ok(0)
}

/// The medians of the pairwise ratios of the runtime benchmark.
#[derive(Serialize)]
struct Ratios {
    cli_over_bwrap_wall: Option<f64>,
    cli_over_bwrap_cpu: Option<f64>,
    matched_over_bwrap_wall: Option<f64>,
    matched_over_bwrap_cpu: Option<f64>,
    cli_over_matched_wall: Option<f64>,
    cli_over_matched_cpu: Option<f64>,
}

fn sandlot_run(exe: &std::path::Path) -> Command {
    let mut c = Command::new(exe);
    c.args(["run", "--image", "host", "--", "/bin/true"]);
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
    fn pairwise_ratios_take_the_middle_pair() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|m| Duration::from_millis(*m))
                .collect::<Vec<_>>()
        };
        // Ratios 2, 1, 3: the median is 2, not 6/2 (the ratio of the medians).
        let r = pairwise_median_ratio(&ms(&[4, 6, 30]), &ms(&[2, 6, 10])).unwrap();
        assert_eq!(r, 2.0);
        // An even count takes the lower middle; a zero baseline is left out.
        let r = pairwise_median_ratio(&ms(&[1, 3, 5]), &ms(&[1, 1, 0])).unwrap();
        assert_eq!(r, 1.0);
        assert_eq!(pairwise_median_ratio(&[], &[]), None);
    }

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
