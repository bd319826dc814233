//! Cgroups on this host (root only): the cgroup v2 code on a real v2 hierarchy, and
//! the cgroup stock (v1 hosts).
//!
//! ## cgroup v2
//!
//! This host is hybrid: its controllers are bound to v1 hierarchies and the v2 one
//! (`/sys/fs/cgroup/unified`) offers none of memory, pids or cpu, so sandboxes here
//! run on v1. What v2 gives every cgroup without controllers still runs for real
//! here: `cgroup.procs`, `cgroup.freeze` with `cgroup.events`, `cgroup.kill`,
//! `cpu.stat` and removal; and a create on a hierarchy that lacks the memory
//! controller must fail with a clear error and leave nothing behind. Limits on a
//! v2 host with controllers are covered by the unit tests of `limit_writes`.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sandlot_runtime::cgroup::{Cgroup, CgroupError, CgroupLayout, CgroupLimits, CgroupParent};
use sandlot_runtime::cgroup_stock::{sweep_dead, CgroupStock};

/// The first cgroup2 mount point, if any.
fn v2_mount() -> Option<PathBuf> {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mi.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        if post.split(' ').next()? != "cgroup2" {
            return None;
        }
        pre.split(' ').nth(4).map(PathBuf::from)
    })
}

/// Kills the child and removes the test's cgroups however the test ends.
struct Cleanup {
    child: Option<Child>,
    dirs: Vec<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for d in &self.dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}

fn output_len(p: &std::path::Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

#[test]
fn cgroup_v2_files_work_on_a_real_v2_hierarchy() {
    require_root();
    let Some(root) = v2_mount() else {
        eprintln!(
            "SKIPPED cgroup_v2_files_work_on_a_real_v2_hierarchy: \
             no cgroup2 hierarchy is mounted on this host"
        );
        return;
    };
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap();
    let layout = CgroupLayout::V2 { root: root.clone() };
    let parent = format!("sandlot-v2test-{}", std::process::id());
    let parent_dir = root.join(&parent);
    let mut guard = Cleanup {
        child: None,
        dirs: vec![root.join(&parent).join("cg"), parent_dir.clone()],
    };

    // 1. Without the memory controller a create fails, naming the file, and leaves
    //    no cgroup of its own behind.
    if !controllers.split_whitespace().any(|c| c == "memory") {
        let limits = CgroupLimits {
            memory_bytes: 64 << 20,
            memory_high: None,
            pids: 64,
            cpus: None,
        };
        let e =
            Cgroup::create(&layout, &CgroupParent::named(&parent), "refused", &limits).unwrap_err();
        let CgroupError::Write { path, .. } = &e else {
            panic!("expected a write error, got {e}")
        };
        assert!(path.ends_with("refused/memory.max"), "{e}");
        assert!(e.to_string().contains("memory.max"), "{e}");
        assert!(!parent_dir.join("refused").exists());
    }

    // 2. The controller-free files, through the same code the runtime uses.
    let cg = Cgroup::plan(&layout, &parent, "cg");
    std::fs::create_dir_all(parent_dir.join("cg")).unwrap();
    assert!(cg.exists());
    let out = std::env::temp_dir().join(format!("sandlot-v2test-{}.out", std::process::id()));
    let out_file = std::fs::File::create(&out).unwrap();
    let child = Command::new("/bin/sh")
        .args(["-c", "while :; do echo tick; done"])
        .stdout(Stdio::from(out_file))
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    guard.child = Some(child);
    cg.attach(pid).unwrap();
    assert_eq!(cg.pids(), vec![pid]);
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(
        own.lines()
            .any(|l| l.starts_with("0::") && l.ends_with(&format!("/{parent}/cg"))),
        "{own}"
    );

    // Frozen: the loop makes no progress; thawed: it does again.
    cg.freeze(true, Duration::from_secs(5)).unwrap();
    let events = std::fs::read_to_string(parent_dir.join("cg/cgroup.events")).unwrap();
    assert!(events.lines().any(|l| l == "frozen 1"), "{events}");
    let before = output_len(&out);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        output_len(&out),
        before,
        "a frozen cgroup's process kept writing"
    );
    cg.freeze(false, Duration::from_secs(5)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while output_len(&out) == before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        output_len(&out) > before,
        "the thawed process did not run again"
    );

    // cpu.stat exists in every v2 cgroup: the busy loop has used CPU.
    assert!(cg.usage().cpu_usec > 0, "{:?}", cg.usage());

    // cgroup.kill ends everything in it.
    assert!(cg.kill_all(Duration::from_secs(5)));
    let mut child = guard.child.take().unwrap();
    let st = child.wait().unwrap();
    assert_eq!(st.signal(), Some(libc::SIGKILL), "{st:?}");
    assert!(cg.pids().is_empty());

    cg.remove(Duration::from_secs(5)).unwrap();
    assert!(!cg.exists());
    cg.remove_parent_if_empty();
    assert!(!parent_dir.exists());
    let mut s = String::new();
    let _ = std::fs::File::open(&out).and_then(|mut f| f.read_to_string(&mut s));
    assert!(s.starts_with("tick\n"));
    let _ = std::fs::remove_file(&out);
}

/// Fails the test loudly unless it runs as root (CI does).
fn require_root() {
    let euid_is_root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        .unwrap_or(false);
    assert!(
        euid_is_root,
        "privileged test: run as root (it creates and removes cgroups); CI runs as root"
    );
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
fn cgroup_stock_hands_out_fresh_renamed_cgroups_and_leaves_nothing() {
    require_root();
    let layout = CgroupLayout::detect().unwrap();
    if layout.version() != 1 {
        eprintln!("SKIPPED cgroup_stock_...: the stock is for cgroup v1 hosts; this one is v2");
        assert!(CgroupStock::start(&layout, &CgroupParent::named("x"), 2).is_none());
        return;
    }
    let parent = format!("sandlot-stocktest-{}", std::process::id());
    // The parent the stock makes gets its CPU weight (v1: 25 -> 256 shares).
    let weighted = CgroupParent {
        name: parent.clone(),
        cpu_weight: Some(25),
    };
    let stock = CgroupStock::start(&layout, &weighted, 2).unwrap();
    wait_for("two stocked cgroups", || stock.ready() == 2);
    let dirs = Cgroup::plan(&layout, &parent, "").dirs;
    let (_, cpu) = dirs
        .iter()
        .find(|(c, _)| c == "cpu")
        .expect("a cpu hierarchy");
    let shares = std::fs::read_to_string(cpu.join("cpu.shares")).unwrap();
    assert_eq!(shares.trim(), "256");
    let stocked = children(&layout, &parent);
    // Five hierarchies (or however many this host has) x two cgroups.
    let hierarchies = Cgroup::plan(&layout, &parent, "x").dirs.len();
    assert_eq!(stocked.len(), 2 * hierarchies, "{stocked:?}");

    let limits = CgroupLimits {
        memory_bytes: 96 << 20,
        memory_high: None,
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

    // Stopping the stock removes what it still holds; the claimed one stays, and so
    // does the parent it is in.
    drop(stock);
    let left = children(&layout, &parent);
    assert_eq!(left.len(), hierarchies, "{left:?}");
    assert!(left.iter().all(|p| p.ends_with("sb-stocktest")), "{left:?}");
    cg.remove(Duration::from_secs(2)).unwrap();

    // With no sandbox left, stopping a stock also removes the parent.
    let stock = CgroupStock::start(&layout, &CgroupParent::named(&parent), 1).unwrap();
    wait_for("one stocked cgroup", || stock.ready() == 1);
    drop(stock);
    assert!(!Cgroup::plan(&layout, &parent, "").exists());

    // Debris of a dead owner is swept; a live owner's is not.
    let dead = {
        let mut c = std::process::Command::new("/bin/true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    };
    let named = CgroupParent::named(&parent);
    let debris = Cgroup::make_dirs(&layout, &named, &format!(".stock-{dead}-1")).unwrap();
    let live =
        Cgroup::make_dirs(&layout, &named, &format!(".stock-{}-1", std::process::id())).unwrap();
    // A live pid with another start time: the owner died and its pid was reused.
    let reused = Cgroup::make_dirs(
        &layout,
        &named,
        &format!(".stock-{}-1-1", std::process::id()),
    )
    .unwrap();
    let swept = sweep_dead(&layout, &parent);
    assert_eq!(swept.len(), 2 * hierarchies, "{swept:?}");
    assert!(!debris.exists());
    assert!(!reused.exists());
    assert!(live.exists());
    live.remove(Duration::from_secs(2)).unwrap();
    live.remove_parent_if_empty();
    assert!(children(&layout, &parent).is_empty());
    assert!(!Cgroup::plan(&layout, &parent, "").exists());
}
