//! `sandlot bench pause`: pausing and resuming a sandbox with an idle shell in it,
//! through a private daemon and its API, against the peer in the same run: a
//! fresh sandbox of the same isolation to its first exec (what a resume saves a
//! caller who would otherwise start over).
//!
//! * pause: `POST .../pause` to its answer (gVisor: checkpoint of the kernel,
//!   memory image summed; namespace: the files committed to an image);
//! * resume to first exec: `POST .../resume`, then `/bin/true` run in it.

use std::time::{Duration, Instant};

use anyhow::bail;
use sandlot_client::{Client, CreateSandbox, ExecBody};

use super::{print_table, summarize, Summary};

#[derive(Debug, clap::Args)]
pub struct PauseArgs {
    /// Sandboxes paused and resumed once each (and fresh creates).
    #[arg(long, default_value_t = 20)]
    pub n: usize,
    /// `gvisor`, `namespace` or `both`.
    #[arg(long, default_value = "both")]
    pub isolation: String,
}

fn body(isolation: &str) -> CreateSandbox {
    let serde_json::Value::Object(spec) = serde_json::json!({"isolation": isolation}) else {
        unreachable!("a JSON object")
    };
    CreateSandbox {
        spec,
        ..Default::default()
    }
}

async fn run_true(c: &Client, id: &str) -> anyhow::Result<()> {
    let o = c.run(id, &["/bin/true"]).await?;
    if o.exit.code != Some(0) {
        bail!("/bin/true exited with {:?}", o.exit);
    }
    Ok(())
}

/// (pause, resume to first exec) of `n` sandboxes with an idle shell, one pause
/// and resume each (the create is not on the clock).
async fn cycles(
    c: &Client,
    isolation: &str,
    n: usize,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut pause, mut resume) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let sb = c.create_sandbox(&body(isolation)).await?;
        let r = cycle(c, &sb.id).await;
        // Paused or not, it goes (a paused one's kept files too).
        c.delete_sandbox(&sb.id).await?;
        let (p, r) = r?;
        pause.push(p);
        resume.push(r);
    }
    Ok((pause, resume))
}

async fn cycle(c: &Client, id: &str) -> anyhow::Result<(Duration, Duration)> {
    let shell = ExecBody {
        argv: ["/bin/sh", "-c", "while :; do sleep 3600; done"]
            .map(String::from)
            .to_vec(),
        background: true,
        ..Default::default()
    };
    c.exec(id, &shell).await?;
    run_true(c, id).await?;
    let t = Instant::now();
    c.pause_sandbox(id).await?;
    let pause = t.elapsed();
    let t = Instant::now();
    c.resume_sandbox(id).await?;
    run_true(c, id).await?;
    Ok((pause, t.elapsed()))
}

/// The peer: a fresh sandbox to its first exec.
async fn fresh(c: &Client, isolation: &str, n: usize) -> anyhow::Result<Vec<Duration>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let sb = c.create_sandbox(&body(isolation)).await?;
        run_true(c, &sb.id).await?;
        out.push(t.elapsed());
        c.delete_sandbox(&sb.id).await?;
    }
    Ok(out)
}

pub fn run(a: PauseArgs) -> anyhow::Result<i32> {
    let isolations: Vec<&str> = match a.isolation.as_str() {
        "both" => vec!["gvisor", "namespace"],
        "gvisor" => vec!["gvisor"],
        "namespace" => vec!["namespace"],
        other => bail!("--isolation {other:?}: use gvisor, namespace or both"),
    };
    if a.n == 0 {
        bail!("--n must be at least 1");
    }
    let (_daemon, c) = super::platform::start_daemon_with(true, "")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let rows: Vec<Summary> = rt.block_on(async {
        let mut rows = Vec::new();
        for iso in isolations {
            // One cycle first: page caches and the image store warm.
            cycles(&c, iso, 1).await?;
            let (pause, resume) = cycles(&c, iso, a.n).await?;
            rows.push(summarize(&format!("{iso}: pause (idle shell)"), pause));
            rows.push(summarize(&format!("{iso}: resume to first exec"), resume));
            rows.push(summarize(
                &format!("{iso}: fresh sandbox to first exec"),
                fresh(&c, iso, a.n).await?,
            ));
        }
        anyhow::Ok(rows)
    })?;
    let peer = rows
        .iter()
        .find(|r| r.name.ends_with("fresh sandbox to first exec"))
        .map(|r| r.name.clone())
        .unwrap_or_default();
    print_table(&rows, &peer);
    Ok(0)
}
