//! The orphan reaper: a child subreaper reaps the orphans it adopts, and never a child it
//! waits for itself. Needs no root (becoming a child subreaper is unprivileged).

use std::process::Command;
use std::time::{Duration, Instant};

fn zombie_children() -> Vec<i32> {
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let s = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        for pid in s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next())
                == Some("Z")
            {
                out.push(pid);
            }
        }
    }
    out
}

#[test]
fn adopted_orphans_are_reaped_and_protected_children_are_not() {
    // SAFETY: prctl with integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(r, 0, "become a child subreaper");
    sandlot_runtime::orphans::start().unwrap();

    // A child we wait for ourselves, already dead: protected, it must stay for our wait.
    let mut mine = Command::new("/bin/true").spawn().unwrap();
    sandlot_runtime::orphans::protect(mine.id() as i32);

    // Twenty orphans: each shell leaves a background child behind and exits at once.
    for _ in 0..20 {
        let st = Command::new("/bin/sh")
            .args(["-c", "sleep 0.2 & exit 0"])
            .status()
            .unwrap();
        assert!(st.success());
    }
    // Each orphan outlives its shell, is re-parented to us, exits, and must be reaped.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let z: Vec<i32> = zombie_children()
            .into_iter()
            .filter(|p| *p != mine.id() as i32)
            .collect();
        if z.is_empty() && sandlot_runtime::orphans::reaped() >= 20 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "adopted orphans not reaped: zombies {z:?}, {} reaped",
            sandlot_runtime::orphans::reaped()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Ours is still there to wait for, with its real status.
    let st = mine
        .wait()
        .expect("the protected child was not reaped by the reaper");
    assert!(st.success());
    sandlot_runtime::orphans::unprotect(mine.id() as i32);
}
