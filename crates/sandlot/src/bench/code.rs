//! `sandlot bench code`: latency of running code, through a private daemon and its
//! API, against its peers in the same run:
//!
//! * the first `run_code("1+1")` after a create from a warm pool whose sandboxes'
//!   kernels are already started (create + run, and the run alone);
//! * a following cell on a warm context;
//! * peers: `python3 -c 'print(1+1)'` per call in a fresh sandbox (create + exec),
//!   and a bare ipykernel on the host driven by `jupyter_client` (the kernel's own
//!   round trip, the floor for a following cell).

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use sandlot_client::code::{RunCodeBody, RunStatus, DEFAULT_CONTEXT};
use sandlot_client::{Client, CreateSandbox, ExecBody};

use super::{print_table, summarize, Summary};

#[derive(Debug, clap::Args)]
pub struct CodeArgs {
    /// Creates with a first run (and peer creates), each.
    #[arg(long, default_value_t = 30)]
    pub n: usize,
    /// Following cells on one warm context (and host kernel round trips).
    #[arg(long, default_value_t = 300)]
    pub cells: usize,
    /// Ready sandboxes in the code pool.
    #[arg(long, default_value_t = 4)]
    pub pool: usize,
}

/// Times `n` executions of `1+1` on a kernel started on the host; prints one
/// duration in milliseconds per line.
const HOST_KERNEL: &str = r#"
import sys, time
from jupyter_client.manager import start_new_kernel
km, kc = start_new_kernel(kernel_name="python3")
try:
    for _ in range(3):
        kc.execute_interactive("1+1", timeout=30)
    for _ in range(int(sys.argv[1])):
        t = time.perf_counter()
        kc.execute_interactive("1+1", timeout=30, output_hook=lambda m: None)
        print((time.perf_counter() - t) * 1000.0, flush=True)
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=True)
"#;

fn one_plus_one() -> RunCodeBody {
    RunCodeBody {
        code: "1+1".into(),
        ..Default::default()
    }
}

async fn pool_ready(c: &Client) -> usize {
    let t = c.metrics().await.unwrap_or_default();
    t.lines()
        .find_map(|l| l.strip_prefix("sandlot_pool_ready{pool=\"code\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

async fn wait_pool(c: &Client, want: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while pool_ready(c).await < want {
        if Instant::now() > deadline {
            bail!("the code pool did not refill within 120 s (is ipykernel installed for /usr/bin/python3?)");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Create from the pool, then the first run: (create + run, run alone).
async fn first_runs(
    c: &Client,
    n: usize,
    pool: usize,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut total, mut run) = (Vec::new(), Vec::new());
    for _ in 0..n {
        // The shape measured is a full pool: refills are not on the clock.
        wait_pool(c, pool).await?;
        let t0 = Instant::now();
        let sb = c.create_sandbox(&CreateSandbox::default()).await?;
        let t1 = Instant::now();
        let x = c.run_code(&sb.id, DEFAULT_CONTEXT, &one_plus_one()).await?;
        let t2 = Instant::now();
        if x.status != RunStatus::Ok || x.restarted {
            bail!("first run: {x:?}");
        }
        total.push(t2 - t0);
        run.push(t2 - t1);
        c.delete_sandbox(&sb.id).await?;
    }
    Ok((total, run))
}

async fn following_cells(c: &Client, cells: usize) -> anyhow::Result<Vec<Duration>> {
    let sb = c.create_sandbox(&CreateSandbox::default()).await?;
    for _ in 0..5 {
        c.run_code(&sb.id, DEFAULT_CONTEXT, &one_plus_one()).await?;
    }
    let mut out = Vec::with_capacity(cells);
    for _ in 0..cells {
        let t = Instant::now();
        let x = c.run_code(&sb.id, DEFAULT_CONTEXT, &one_plus_one()).await?;
        out.push(t.elapsed());
        if x.status != RunStatus::Ok {
            bail!("cell: {x:?}");
        }
    }
    c.delete_sandbox(&sb.id).await?;
    Ok(out)
}

/// The peer without a kernel: a fresh sandbox per call running `python3 -c`.
async fn python_per_call(c: &Client, n: usize) -> anyhow::Result<Vec<Duration>> {
    let mut out = Vec::with_capacity(n);
    let argv = ExecBody {
        argv: ["python3", "-c", "print(1+1)"].map(String::from).to_vec(),
        ..Default::default()
    };
    // A pool-less shape (another memory size): every create is cold, as a fresh
    // sandbox per call is.
    let serde_json::Value::Object(spec) = serde_json::json!({"resources": {"memory": "500M"}})
    else {
        unreachable!("a JSON object")
    };
    let body = CreateSandbox {
        spec,
        ..Default::default()
    };
    for _ in 0..n {
        let t = Instant::now();
        let sb = c.create_sandbox(&body).await?;
        let (_, mut s) = c.exec_stream(&sb.id, &argv).await?;
        let o = s.collect().await?;
        out.push(t.elapsed());
        if o.stdout != b"2\n" {
            bail!(
                "python3 -c printed {:?}",
                String::from_utf8_lossy(&o.stdout)
            );
        }
        c.delete_sandbox(&sb.id).await?;
    }
    Ok(out)
}

fn host_kernel(cells: usize) -> anyhow::Result<Vec<Duration>> {
    let out = Command::new("/usr/bin/python3")
        .args(["-c", HOST_KERNEL, &cells.to_string()])
        .output()
        .context("run the host kernel peer (/usr/bin/python3 with jupyter_client and ipykernel)")?;
    if !out.status.success() {
        bail!(
            "the host kernel peer failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            l.trim()
                .parse::<f64>()
                .map(|ms| Duration::from_secs_f64(ms / 1000.0))
                .context("a host kernel sample")
        })
        .collect()
}

pub fn run(a: CodeArgs) -> anyhow::Result<i32> {
    let pools = format!(
        "[[pools]]\nname = \"code\"\nsize = {}\ncode_context = true\n",
        a.pool.max(1)
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let stop = super::platform::StopSignals::catch(&rt)?;
    let (_daemon, c) = super::platform::start_daemon_with(true, &pools)?;
    let rows: Vec<Summary> = rt.block_on(stop.until_stopped(async {
        let (total, first) = first_runs(&c, a.n, a.pool.max(1)).await?;
        let cells = following_cells(&c, a.cells).await?;
        let per_call = python_per_call(&c, a.n).await?;
        anyhow::Ok(vec![
            summarize("create + first run_code (pool)", total),
            summarize("first run_code after create", first),
            summarize("following run_code", cells),
            summarize("fresh sandbox + python3 -c", per_call),
        ])
    }))?;
    let mut rows = rows;
    rows.push(summarize(
        "host ipykernel round trip",
        host_kernel(a.cells)?,
    ));
    print_table(&rows, "host ipykernel round trip");
    Ok(0)
}
