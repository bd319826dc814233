//! Micro-benchmark of the database work of a pool claim (docs/benchmarks.md, "Other
//! harnesses"): the two commits a claim used to make (admission as `creating`, then
//! [`Store::mark_running`]) against one admission as `running`.
//!
//! ```sh
//! cargo run --release -p sandlot-server --example store_claims -- /tmp/store-claims
//! ```
//!
//! The directory is created (and emptied first); the database is a file there, in
//! WAL mode with the daemon's settings, so commits write the log as they do in the
//! daemon.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use sandlot_server::store::{now_ms, EndReason, SandboxRecord, SandboxState, Store, UsageRecord};

const ROUNDS: usize = 21;
const CLAIMS: usize = 100;

fn record(id: &str) -> SandboxRecord {
    SandboxRecord {
        id: id.into(),
        tenant: "operator".into(),
        name: None,
        // About the size of a default create's recorded spec.
        spec: serde_json::json!({"image": "host", "resources": {"cpus": 1.0,
            "memory": 536870912, "pids": 256, "disk": 1073741824},
            "network": {"mode": "none"}, "env": {}, "mounts": [], "user": null,
            "workdir": null, "layers": [], "secrets": [], "volumes": [], "ports": [],
            "hostname": null}),
        tags: BTreeMap::new(),
        metadata: BTreeMap::new(),
        state: SandboxState::Creating,
        end_reason: None,
        exit_code: None,
        exit_signal: None,
        error: None,
        pid: None,
        memory_bytes: 512 << 20,
        created_at: now_ms(),
        started_at: None,
        ended_at: None,
        expires_at: now_ms() + 600_000,
        idle_timeout_ms: None,
        usage: UsageRecord::default(),
        lifecycle: Default::default(),
        timeout_ms: 600_000,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .ok_or("usage: store_claims DIR (created, and emptied first)")?,
    );
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let store = Store::open(&dir.join("sandlot.db"))?;
    let (mut two_commits, mut one_commit) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        // Alternate which way goes first.
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for admitted_running in order {
            let ids: Vec<String> = (0..CLAIMS)
                .map(|i| format!("sb-{round}-{admitted_running}-{i}"))
                .collect();
            let t = Instant::now();
            for id in &ids {
                let mut rec = record(id);
                if admitted_running {
                    rec.state = SandboxState::Running;
                    rec.pid = Some(4242);
                    rec.started_at = Some(rec.created_at);
                    store.admit_sandbox(&rec, u32::MAX, u64::MAX)?;
                } else {
                    store.admit_sandbox(&rec, u32::MAX, u64::MAX)?;
                    store.mark_running(id, 4242, now_ms())?;
                }
            }
            let per_claim = t.elapsed().as_secs_f64() * 1e6 / CLAIMS as f64;
            if admitted_running {
                one_commit.push(per_claim);
            } else {
                two_commits.push(per_claim);
            }
            // Stopped records stay, as in the daemon; live ones would count in
            // every later admission's quota query.
            for id in &ids {
                store.mark_stopped(id, EndReason::Deleted, (None, None), None, now_ms())?;
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "database work per claim, median of {ROUNDS} rounds of {CLAIMS}: \
         admission then mark_running {:.1} µs; admitted running {:.1} µs",
        median(&mut two_commits),
        median(&mut one_commit)
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
