//! The cgroup stock on this host's hierarchies (root only; cgroup v1 hosts).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sandlot_runtime::cgroup::{Cgroup, CgroupLayout, CgroupLimits};
use sandlot_runtime::cgroup_stock::{sweep_dead, CgroupStock};

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        .unwrap_or(false)
}

/// Every directory under the test's parent cgroup, in every hierarchy.
fn children(layout: &CgroupLayout, parent: &str) -> Vec<PathBuf> {
    Cgroup::plan(layout, parent, "")
        .dirs
        .iter()
        .flat_map(|(_, d)| std::fs::read_dir(d).into_iter().flatten().flatten())
        .filter(|e| e.path().is_dir())
        .map(|e| e.path())
        .collect()
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn issue2_cgroup_stock_hands_out_fresh_renamed_cgroups_and_leaves_nothing() {
    if !is_root() {
        eprintln!("SKIPPED issue2_cgroup_stock_...: needs root");
        return;
    }
    let layout = CgroupLayout::detect().unwrap();
    if layout.version() != 1 {
        eprintln!(
            "SKIPPED issue2_cgroup_stock_...: the stock is for cgroup v1 hosts; this one is v2"
        );
        assert!(CgroupStock::start(&layout, "x", 2).is_none());
        return;
    }
    let parent = format!("sandlot-stocktest-{}", std::process::id());
    let stock = CgroupStock::start(&layout, &parent, 2).unwrap();
    wait_for("two stocked cgroups", || stock.ready() == 2);
    let stocked = children(&layout, &parent);
    // Five hierarchies (or however many this host has) x two cgroups.
    let hierarchies = Cgroup::plan(&layout, &parent, "x").dirs.len();
    assert_eq!(stocked.len(), 2 * hierarchies, "{stocked:?}");

    let limits = CgroupLimits {
        memory_bytes: 96 << 20,
        pids: 77,
        cpus: None,
    };
    let cg = stock.take("sb-stocktest", &limits).unwrap().unwrap();
    for (ctrl, d) in &cg.dirs {
        assert!(d.ends_with("sb-stocktest"), "{d:?}");
        assert!(d.is_dir(), "{ctrl}: {d:?}");
    }
    let dir_of = |c: &str| cg.dirs.iter().find(|(n, _)| n == c).unwrap().1.clone();
    let mem = std::fs::read_to_string(dir_of("memory").join("memory.limit_in_bytes")).unwrap();
    assert_eq!(mem.trim(), (96u64 << 20).to_string());
    let pids = std::fs::read_to_string(dir_of("pids").join("pids.max")).unwrap();
    assert_eq!(pids.trim(), "77");
    // Never used before: no process, no memory charged.
    assert!(cg.pids().is_empty());
    // The stock refills behind the claim.
    wait_for("the stock to refill", || stock.ready() == 2);

    // Stopping the stock removes what it still holds; the claimed one stays.
    drop(stock);
    let left = children(&layout, &parent);
    assert_eq!(left.len(), hierarchies, "{left:?}");
    assert!(left.iter().all(|p| p.ends_with("sb-stocktest")), "{left:?}");
    cg.remove(Duration::from_secs(2)).unwrap();

    // Debris of a dead owner is swept; a live owner's is not.
    let dead = {
        let mut c = std::process::Command::new("/bin/true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    };
    let debris = Cgroup::make_dirs(&layout, &parent, &format!(".stock-{dead}-1")).unwrap();
    let live = Cgroup::make_dirs(
        &layout,
        &parent,
        &format!(".stock-{}-1", std::process::id()),
    )
    .unwrap();
    let swept = sweep_dead(&layout, &parent);
    assert_eq!(swept.len(), hierarchies, "{swept:?}");
    assert!(!debris.exists());
    assert!(live.exists());
    live.remove(Duration::from_secs(2)).unwrap();
    live.remove_parent_if_empty();
    assert!(children(&layout, &parent).is_empty());
    assert!(!Cgroup::plan(&layout, &parent, "").exists());
}
