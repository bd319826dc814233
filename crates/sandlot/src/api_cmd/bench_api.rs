//! `sandlot bench-api`: create, exec `/bin/true`, read the exit, delete, through the
//! HTTP API; n sequential and a concurrent burst; with the same work done directly
//! on the runtime (no daemon) in the same run as the peer.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use sandlot_client::{Client, CreateSandbox, ExecBody};

#[derive(Debug, clap::Args)]
pub struct BenchApiArgs {
    /// Sequential iterations.
    #[arg(long, default_value_t = 200)]
    pub n: usize,
    /// Size of the concurrent burst.
    #[arg(long, default_value_t = 100)]
    pub burst: usize,
    /// Use a running daemon instead of starting a private one.
    #[arg(long, env = "SANDLOT_BENCH_HOST")]
    pub host: Option<String>,
    /// Skip the in-process peer run (direct runtime calls).
    #[arg(long)]
    pub no_peer: bool,
    /// Append the results as Markdown to this file.
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
}

/// A private daemon on a temporary socket and data directory.
struct Daemon {
    child: Child,
    dir: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(self.child.id() as i32).expect("child pid"),
            rustix::process::Signal::TERM,
        );
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_daemon() -> anyhow::Result<(Daemon, String)> {
    let dir = std::env::temp_dir().join(format!("sandlot-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let sock = dir.join("api.sock");
    let child = Command::new(std::env::current_exe()?)
        .args(["serve", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--socket")
        .arg(&sock)
        .args(["--id-prefix", &format!("bench{}-", std::process::id())])
        .env("SANDLOT_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .context("start sandlot serve")?;
    let d = Daemon { child, dir };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sock.exists() {
        if Instant::now() > deadline {
            bail!("the daemon did not start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((d, format!("unix://{}", sock.display())))
}

async fn one(c: &Client) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let sb = c.create_sandbox(&CreateSandbox::default()).await?;
    let body = ExecBody {
        argv: vec!["/bin/true".into()],
        ..Default::default()
    };
    let (_, mut s) = c.exec_stream(&sb.id, &body).await?;
    let out = s.collect().await?;
    c.delete_sandbox(&sb.id).await?;
    let d = t.elapsed();
    if out.exit.code != Some(0) {
        bail!("/bin/true exited with {:?}", out.exit);
    }
    Ok(d)
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1e3
}

fn line(name: &str, v: &mut [Duration]) -> String {
    format!(
        "| {name} | {} | {:.2} | {:.2} | {:.2} |",
        v.len(),
        pct(v, 0.5),
        pct(v, 0.95),
        pct(v, 0.99)
    )
}

pub fn run(a: BenchApiArgs) -> anyhow::Result<i32> {
    let (_daemon, host) = match &a.host {
        Some(h) => (None, h.clone()),
        None => {
            let (d, h) = start_daemon()?;
            (Some(d), h)
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let c = Client::new(&host, std::env::var("SANDLOT_TOKEN").ok())?;
    let (mut seq, mut burst, burst_wall) = rt.block_on(async {
        // Warm-up (page cache, first connection).
        for _ in 0..5 {
            one(&c).await?;
        }
        let mut seq = Vec::with_capacity(a.n);
        for _ in 0..a.n {
            seq.push(one(&c).await?);
        }
        let t = Instant::now();
        let tasks: Vec<_> = (0..a.burst)
            .map(|_| {
                let c = c.clone();
                tokio::spawn(async move { one(&c).await })
            })
            .collect();
        let mut burst = Vec::with_capacity(a.burst);
        for t in tasks {
            burst.push(t.await??);
        }
        Ok::<_, anyhow::Error>((seq, burst, t.elapsed()))
    })?;
    let mut rows = vec![
        "| run | n | p50 ms | p95 ms | p99 ms |".to_string(),
        "|---|---|---|---|---|".to_string(),
        line(
            "API sequential (create, exec /bin/true, exit, delete)",
            &mut seq,
        ),
        line(&format!("API burst of {} concurrent", a.burst), &mut burst),
    ];
    let mut peer_p50 = None;
    if !a.no_peer {
        drop(_daemon);
        let mut peer = crate::run::bench_in_process(a.n)?;
        peer_p50 = Some(pct(&mut peer, 0.5));
        rows.push(line(
            "peer: same work on the runtime directly (no daemon)",
            &mut peer,
        ));
    }
    let mut text = rows.join("\n");
    text.push_str(&format!(
        "\n\nburst wall time: {:.1} ms\n",
        burst_wall.as_secs_f64() * 1e3
    ));
    if let Some(p) = peer_p50 {
        text.push_str(&format!(
            "API overhead: sequential p50 is {:.2}x the direct runtime p50\n",
            pct(&mut seq, 0.5) / p
        ));
    }
    println!("{text}");
    if let Some(f) = &a.markdown {
        use std::io::Write;
        let mut o = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(f)?;
        writeln!(o, "{text}")?;
    }
    Ok(0)
}
