//! The daemon's fork server (issue 6, density): sandbox PID 1s forked from
//! `sandlot __zygote` share the binary's relocated pages instead of each holding a
//! private copy, and the fork server goes away with the daemon.

mod api_support;

use api_support::{rt, Daemon};
use sandlot_client::{CreateSandbox, ExecBody};

/// Children of `parent` (host pids), with their command lines.
fn children(parent: i32) -> Vec<(i32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let ppid = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse::<i32>().ok());
        if ppid == Some(parent) {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            out.push((pid, String::from_utf8_lossy(&cmd).replace('\0', " ")));
        }
    }
    out
}

/// The host pid of sandbox `id`'s PID 1 (a child of the daemon in its cgroup).
fn pid1(daemon: i32, id: &str) -> i32 {
    children(daemon)
        .into_iter()
        .map(|(p, _)| p)
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cgroup"))
                .is_ok_and(|c| c.contains(&format!("/{id}")))
        })
        .unwrap_or_else(|| panic!("no PID 1 of {id} under the daemon"))
}

/// `Private_Dirty` of a process, in KiB.
fn private_dirty_kib(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("Private_Dirty:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Creates a sandbox, checks it runs code, returns its PID 1's private memory.
fn sandbox_private_kib(d: &Daemon) -> (u64, String) {
    let c = d.client();
    rt().block_on(async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let body = ExecBody {
            argv: vec!["echo".into(), "ok".into()],
            ..Default::default()
        };
        let p = c.exec(&sb.id, &body).await.unwrap();
        let out = c
            .output(&sb.id, p.id, 0, 0)
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert_eq!(out.stdout, b"ok\n");
        let pid = pid1(d.pid(), &sb.id);
        let cmd = children(d.pid())
            .into_iter()
            .find(|(p, _)| *p == pid)
            .map(|(_, c)| c)
            .unwrap();
        (private_dirty_kib(pid), cmd)
    })
}

#[test]
fn issue6_forked_pid1_shares_the_binarys_relocated_pages() {
    let mut forked = Daemon::start(None);
    let (forked_kib, cmd) = sandbox_private_kib(&forked);
    assert!(cmd.contains("__zygote"), "PID 1 was not forked: {cmd}");
    let zygotes: Vec<i32> = children(forked.pid())
        .into_iter()
        .filter(|(_, c)| c.contains("__zygote"))
        .map(|(p, _)| p)
        .collect();

    let exec = Daemon::start(Some("[runtime]\nfork_server = false\n"));
    let (exec_kib, cmd) = sandbox_private_kib(&exec);
    assert!(cmd.contains("__init"), "PID 1 was not exec'd: {cmd}");
    // The exec'd PID 1 holds its own relocated copy of the binary's data (0.7 MiB
    // in a release build, more in a debug build); the forked one shares it.
    assert!(
        forked_kib + 256 < exec_kib,
        "forked PID 1: {forked_kib} KiB private, exec'd: {exec_kib} KiB"
    );
    drop(exec);

    // The fork server exits with the daemon.
    forked.shutdown();
    std::thread::sleep(std::time::Duration::from_millis(500));
    for z in zygotes {
        let alive = std::fs::read_to_string(format!("/proc/{z}/cmdline"))
            .is_ok_and(|c| c.contains("__zygote"));
        let stat = std::fs::read_to_string(format!("/proc/{z}/stat")).unwrap_or_default();
        assert!(
            !alive || stat.contains(") Z "),
            "process {z} outlived the daemon"
        );
    }
}
