//! The memory watch on this host's cgroups (root only): armed with the kernel's
//! notification (v1 a usage threshold through `cgroup.event_control`, v2
//! `memory.events`), it sees a process in the cgroup pass the line and the use
//! fall back once the process is gone.

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sandlot_runtime::cgroup::{Cgroup, CgroupLayout, CgroupParent};
use sandlot_runtime::gvisor::memory;
use sandlot_runtime::memory_watch::MemoryWatch;

const MIB: u64 = 1 << 20;

/// Kills the child and removes the cgroup however the test ends.
struct Cleanup {
    child: Option<Child>,
    cg: Option<Cgroup>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(cg) = &self.cg {
            let _ = cg.remove(Duration::from_secs(5));
            cg.remove_parent_if_empty();
        }
    }
}

fn until(what: &str, w: &MemoryWatch, mut ok: impl FnMut(&MemoryWatch) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ok(w) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {:?}",
            w.reading()
        );
        w.wait(Duration::from_millis(200));
    }
}

#[test]
fn the_watch_sees_a_process_pass_the_line_and_the_use_fall_after_it_ends() {
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
    assert!(
        root,
        "privileged test: run as root (it creates and removes cgroups)"
    );
    let layout = CgroupLayout::detect().unwrap();
    let parent = CgroupParent::named(&format!("sandlot-watchtest-{}", std::process::id()));
    // A 32 MiB declared limit: the hard limit leaves the headroom above it.
    let limits = memory::limits(32 * MIB, 64, None);
    let cg = Cgroup::create(&layout, &parent, "watched", &limits).unwrap();
    let mut guard = Cleanup {
        child: None,
        cg: Some(cg.clone()),
    };
    let (w, why_poll) = MemoryWatch::open(&cg, 32 * MIB).unwrap();
    assert_eq!(
        why_poll, None,
        "the kernel's notification could not be armed"
    );
    assert!(w.notified());
    assert!(!w.over(), "{:?}", w.reading());
    // A process that allocates 48 MiB (touching it; under the 64 MiB hard limit)
    // once told to, in the cgroup.
    let mut child = Command::new("python3")
        .args([
            "-c",
            "import sys, time\nsys.stdin.readline()\nx = bytearray(48 << 20)\n\
             for i in range(0, len(x), 4096): x[i] = 1\nprint('held', flush=True)\ntime.sleep(600)",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("python3");
    cg.attach(child.id() as i32).unwrap();
    let mut stdin = child.stdin.take().unwrap();
    guard.child = Some(child);
    stdin.write_all(b"go\n").unwrap();
    until("the use to pass the line", &w, |w| w.over());
    let r = w.reading().unwrap();
    assert!(
        r.counted > 32 * MIB && r.counted <= limits.memory_bytes,
        "{r:?}"
    );
    // Its memory comes back once it is killed.
    let mut child = guard.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    until("the use to fall under the line", &w, |w| !w.over());
}
