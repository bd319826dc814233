//! `sandlot bench fork`: forking a sandbox with an idle shell into N sandboxes,
//! through a private daemon and its API, until every fork has answered an exec,
//! against the peer in the same run: N fresh sandboxes of the same isolation
//! created at once, to their first exec each.
//!
//! * fork from live: `POST .../fork {count: N}` (a fresh checkpoint of the
//!   running sandbox, which runs on), then `/bin/true` in each fork;
//! * fork from a checkpoint: the same from a checkpoint taken before (the
//!   sandbox left paused: not on the clock).
//!
//! * checkpoint left running: `POST .../checkpoints {leave_running: true}` of the
//!   sandbox to its answer, with the disk the checkpoint holds (its `size`:
//!   gVisor's memory image and copied files; a namespace checkpoint's files are
//!   an image of the store, counted there).
//!
//! Each round uses a new sandbox (a gVisor sandbox is restored once at most).

use std::time::{Duration, Instant};

use anyhow::bail;
use sandlot_client::checkpoint::{CreateCheckpoint, ForkRequest};
use sandlot_client::{Client, CreateSandbox, ExecBody};

use super::{print_table, summarize, Summary};

#[derive(Debug, clap::Args)]
pub struct ForkArgs {
    /// Rounds (each forks a new sandbox).
    #[arg(long, default_value_t = 5)]
    pub n: usize,
    /// Sandboxes per fork.
    #[arg(long, default_value_t = 3)]
    pub count: u32,
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

/// `/bin/true` in each of `ids`, at once.
async fn all_answer(c: &Client, ids: &[String]) -> anyhow::Result<()> {
    let runs = ids.iter().map(|id| run_true(c, id));
    for r in futures_util::future::join_all(runs).await {
        r?;
    }
    Ok(())
}

async fn delete_all(c: &Client, ids: &[String]) {
    for id in ids {
        let _ = c.delete_sandbox(id).await;
    }
}

/// A sandbox with an idle shell in it.
async fn parent(c: &Client, isolation: &str) -> anyhow::Result<String> {
    let sb = c.create_sandbox(&body(isolation)).await?;
    let shell = ExecBody {
        argv: ["/bin/sh", "-c", "while :; do sleep 3600; done"]
            .map(String::from)
            .to_vec(),
        background: true,
        ..Default::default()
    };
    c.exec(&sb.id, &shell).await?;
    run_true(c, &sb.id).await?;
    Ok(sb.id)
}

/// One fork of a new sandbox into `count`, to every fork's first exec; from a
/// checkpoint taken first when `from_checkpoint`.
async fn fork_round(
    c: &Client,
    isolation: &str,
    count: u32,
    from_checkpoint: bool,
) -> anyhow::Result<Duration> {
    let id = parent(c, isolation).await?;
    let r = async {
        let checkpoint = if from_checkpoint {
            let req = CreateCheckpoint {
                name: None,
                leave_running: false,
            };
            Some(c.create_checkpoint(&id, &req).await?.id)
        } else {
            None
        };
        let t = Instant::now();
        let f = c
            .fork_sandbox(&id, &ForkRequest { count, checkpoint })
            .await?;
        let ids: Vec<String> = f.sandboxes.into_iter().map(|s| s.id).collect();
        let answered = all_answer(c, &ids).await;
        let took = t.elapsed();
        delete_all(c, &ids).await;
        answered.map(|()| took)
    }
    .await;
    let _ = c.delete_sandbox(&id).await;
    r
}

/// A checkpoint of a new sandbox with an idle shell, left running: how long it
/// took and the bytes it holds.
async fn checkpoint_round(c: &Client, isolation: &str) -> anyhow::Result<(Duration, u64)> {
    let id = parent(c, isolation).await?;
    let r = async {
        let t = Instant::now();
        let cp = c
            .create_checkpoint(&id, &CreateCheckpoint::default())
            .await?;
        let took = t.elapsed();
        // It ran on: the sandbox answers at once.
        run_true(c, &id).await?;
        anyhow::Ok((took, cp.size))
    }
    .await;
    let _ = c.delete_sandbox(&id).await;
    r
}

/// The peer: `count` fresh sandboxes created at once, to the first exec of each.
async fn fresh_round(c: &Client, isolation: &str, count: u32) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let b = body(isolation);
    let creates = (0..count).map(|_| c.create_sandbox(&b));
    let mut ids = Vec::new();
    let mut failed = None;
    for r in futures_util::future::join_all(creates).await {
        match r {
            Ok(s) => ids.push(s.id),
            Err(e) => failed = Some(e),
        }
    }
    let answered = match failed {
        Some(e) => Err(e.into()),
        None => all_answer(c, &ids).await,
    };
    let took = t.elapsed();
    delete_all(c, &ids).await;
    answered.map(|()| took)
}

pub fn run(a: ForkArgs) -> anyhow::Result<i32> {
    let isolations: Vec<&str> = match a.isolation.as_str() {
        "both" => vec!["gvisor", "namespace"],
        "gvisor" => vec!["gvisor"],
        "namespace" => vec!["namespace"],
        other => bail!("--isolation {other:?}: use gvisor, namespace or both"),
    };
    if a.n == 0 || a.count == 0 {
        bail!("--n and --count must be at least 1");
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let stop = super::platform::StopSignals::catch(&rt)?;
    let (_daemon, c) = super::platform::start_daemon_with(true, "")?;
    let n = a.count;
    let mut disk = Vec::new();
    let rows: Vec<Summary> = rt.block_on(stop.until_stopped(async {
        let mut rows = Vec::new();
        for iso in isolations {
            // One round first: page caches and the image store warm.
            fork_round(&c, iso, n, false).await?;
            let (mut live, mut saved, mut fresh) = (Vec::new(), Vec::new(), Vec::new());
            let (mut kept, mut sizes) = (Vec::new(), Vec::new());
            for _ in 0..a.n {
                live.push(fork_round(&c, iso, n, false).await?);
                saved.push(fork_round(&c, iso, n, true).await?);
                fresh.push(fresh_round(&c, iso, n).await?);
                let (t, size) = checkpoint_round(&c, iso).await?;
                kept.push(t);
                sizes.push(size);
            }
            sizes.sort_unstable();
            disk.push((iso, sizes[sizes.len() / 2]));
            rows.push(summarize(
                &format!("{iso}: fork {n} from live, all answer exec"),
                live,
            ));
            rows.push(summarize(
                &format!("{iso}: fork {n} from a checkpoint, all answer exec"),
                saved,
            ));
            rows.push(summarize(
                &format!("{iso}: {n} fresh sandboxes to first exec"),
                fresh,
            ));
            rows.push(summarize(
                &format!("{iso}: checkpoint left running (idle shell)"),
                kept,
            ));
        }
        anyhow::Ok(rows)
    }))?;
    let peer = rows
        .iter()
        .find(|r| r.name.contains("fresh sandboxes"))
        .map(|r| r.name.clone())
        .unwrap_or_default();
    print_table(&rows, &peer);
    for (iso, bytes) in disk {
        println!(
            "{iso}: disk per checkpoint (idle shell), median: {:.1} MiB",
            bytes as f64 / f64::from(1 << 20)
        );
    }
    Ok(0)
}
