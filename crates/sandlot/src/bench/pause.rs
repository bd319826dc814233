//! `sandlot bench pause`: pausing and resuming a sandbox with an idle shell in it,
//! through a private daemon and its API, against the peer in the same run: a
//! fresh sandbox of the same isolation to its first exec (what a resume saves a
//! caller who would otherwise start over).
//!
//! * pause: `POST .../pause` to its answer (gVisor: checkpoint of the kernel,
//!   memory image summed; namespace: the files committed to an image);
//! * resume to first exec: `POST .../resume`, then `/bin/true` run in it.
//!
//! With `--hold-mib N` the sandbox runs a process holding N MiB of random bytes
//! in its memory (a Python `bytearray`; nothing compresses) instead of the idle
//! shell: what a pause of a working process costs.

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
    /// A process holding this many MiB of written memory instead of an idle shell.
    #[arg(long, default_value_t = 0)]
    pub hold_mib: u32,
}

/// What runs in the paused sandbox: an idle shell, or a process holding
/// `hold_mib` MiB of written memory.
fn workload(hold_mib: u32) -> Vec<String> {
    if hold_mib == 0 {
        return ["/bin/sh", "-c", "while :; do sleep 3600; done"]
            .map(String::from)
            .to_vec();
    }
    // Random bytes: nothing a checkpoint's compression could shrink.
    let py = format!(
        "import os, time\nb = bytearray(os.urandom({hold_mib} << 20))\n\
         open('/tmp/held', 'w').write('ok')\nwhile True: time.sleep(3600)"
    );
    vec!["python3".into(), "-c".into(), py]
}

fn label(hold_mib: u32) -> String {
    if hold_mib == 0 {
        "idle shell".into()
    } else {
        format!("{hold_mib} MiB process")
    }
}

/// A sandbox of `isolation` (the default resources; with room for `hold_mib` MiB
/// beside its own needs when it holds some).
fn body(isolation: &str, hold_mib: u32) -> CreateSandbox {
    let mut spec = serde_json::json!({"isolation": isolation});
    if hold_mib > 0 {
        spec["resources"] =
            serde_json::json!({"memory": format!("{}M", 512 + u64::from(hold_mib) * 2)});
    }
    let serde_json::Value::Object(spec) = spec else {
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
    hold_mib: u32,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut pause, mut resume) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let sb = c.create_sandbox(&body(isolation, hold_mib)).await?;
        let r = cycle(c, &sb.id, hold_mib).await;
        // Paused or not, it goes (a paused one's kept files too).
        c.delete_sandbox(&sb.id).await?;
        let (p, r) = r?;
        pause.push(p);
        resume.push(r);
    }
    Ok((pause, resume))
}

async fn cycle(c: &Client, id: &str, hold_mib: u32) -> anyhow::Result<(Duration, Duration)> {
    let work = ExecBody {
        argv: workload(hold_mib),
        background: true,
        ..Default::default()
    };
    c.exec(id, &work).await?;
    if hold_mib > 0 {
        // Until the memory is written.
        let t = Instant::now();
        while c.run(id, &["/bin/cat", "/tmp/held"]).await?.stdout != b"ok" {
            if t.elapsed() > Duration::from_secs(60) {
                bail!("the {hold_mib} MiB process did not write its memory within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
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
        let sb = c.create_sandbox(&body(isolation, 0)).await?;
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let stop = super::platform::StopSignals::catch(&rt)?;
    let (_daemon, c) = super::platform::start_daemon_with(true, "")?;
    let rows: Vec<Summary> = rt.block_on(stop.until_stopped(async {
        let mut rows = Vec::new();
        for iso in isolations {
            // One cycle first: page caches and the image store warm.
            cycles(&c, iso, 1, a.hold_mib).await?;
            let (pause, resume) = cycles(&c, iso, a.n, a.hold_mib).await?;
            rows.push(summarize(
                &format!("{iso}: pause ({})", label(a.hold_mib)),
                pause,
            ));
            rows.push(summarize(&format!("{iso}: resume to first exec"), resume));
            rows.push(summarize(
                &format!("{iso}: fresh sandbox to first exec"),
                fresh(&c, iso, a.n).await?,
            ));
        }
        anyhow::Ok(rows)
    }))?;
    let peer = rows
        .iter()
        .find(|r| r.name.ends_with("fresh sandbox to first exec"))
        .map(|r| r.name.clone())
        .unwrap_or_default();
    print_table(&rows, &peer);
    Ok(0)
}
