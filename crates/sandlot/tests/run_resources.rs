//! Privileged end-to-end tests of `sandlot run`: resource limits, lifetime, streams,
//! exit codes, signals and the PTY.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

#[test]
fn memory_bomb_is_contained() {
    let id = unique_id("membomb");
    let t = Instant::now();
    let (code, _out, err) = sh(
        &id,
        &["--memory", "64M"],
        "python3 -c 'x = []\nwhile True: x.append(bytearray(16 << 20))'",
    );
    // Killed by the OOM killer (SIGKILL) inside the sandbox: 128 + 9.
    assert_eq!(code, 137, "{err}");
    assert!(t.elapsed() < Duration::from_secs(60));
    // The host is fine: we are still here, and a new sandbox works.
    let (code, out, _) = sh(&unique_id("after"), &[], "echo alive");
    assert_eq!((code, out.as_str()), (0, "alive\n"));
}

#[test]
fn fork_bomb_stops_at_pids_limit() {
    let id = unique_id("forkbomb");
    // Fork until the kernel refuses, report how many children we got.
    let py = "import os, time\nn = 0\nkids = []\ntry:\n    while n < 1000:\n        pid = os.fork()\n        if pid == 0:\n            time.sleep(30)\n            os._exit(0)\n        kids.append(pid)\n        n += 1\nexcept OSError as e:\n    print('refused', e.errno)\nprint('forked', n)\nfor k in kids: os.kill(k, 9)\n";
    let (code, out, err) = sh(
        &id,
        &["--pids", "32"],
        &format!("python3 -c \"$(cat <<'EOF'\n{py}EOF\n)\""),
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("refused 11"),
        "fork must fail with EAGAIN: {out}"
    );
    let n: u32 = out
        .lines()
        .find_map(|l| l.strip_prefix("forked "))
        .and_then(|s| s.trim().parse().ok())
        .unwrap();
    assert!(n < 32, "forked {n} processes with a limit of 32");
}

#[test]
fn cpu_limit_holds() {
    // Two busy threads for 2 s of wall time, with and without a quota of 0.5 CPU.
    let py = "import time, threading\ndef spin(end):\n    while time.monotonic() < end: pass\nend = time.monotonic() + 2.0\nt0 = time.process_time()\nts = [threading.Thread(target=spin, args=(end,)) for _ in range(2)]\n[t.start() for t in ts]\n[t.join() for t in ts]\nprint(time.process_time() - t0)\n";
    let script = format!("python3 -c \"$(cat <<'EOF'\n{py}EOF\n)\"");
    let measure = |flags: &[&str], tag: &str| -> f64 {
        let (code, out, err) = sh(&unique_id(tag), flags, &script);
        assert_eq!(code, 0, "{err}");
        out.trim().parse().unwrap()
    };
    let free = measure(&[], "cpufree");
    let limited = measure(&["--cpus", "0.5"], "cpu");
    // The quota allows 1 CPU-second in 2 s (plus scheduling slack).
    assert!(
        limited < 1.3,
        "used {limited} CPU-seconds in 2 s with --cpus 0.5"
    );
    assert!(limited > 0.0);
    // When the machine had room to give more, the quota must be what held it back.
    if free > 1.5 {
        assert!(
            limited < 0.75 * free,
            "limited {limited} vs unlimited {free}"
        );
    } else {
        eprintln!("cpu_limit_holds: the machine is busy (unlimited run got {free} CPU-s); only the quota bound was checked");
    }
}

#[test]
fn writable_layer_size_limit_holds() {
    let id = unique_id("disk");
    let (code, out, err) = sh(
        &id,
        &["--disk", "16M"],
        "dd if=/dev/zero of=/tmp/big bs=1M count=64 2>&1; echo rc=$?; du -m /tmp/big | cut -f1",
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("No space left on device"), "{out}");
    assert!(!out.contains("rc=0"), "{out}");
    let used: u64 = out.lines().last().unwrap().trim().parse().unwrap();
    assert!(used <= 16, "wrote {used} MiB into a 16 MiB layer");
}

#[test]
fn lifetime_timeout_kills_everything() {
    let id = unique_id("lifetime");
    let t = Instant::now();
    let o = run(
        &id,
        &[
            "--timeout",
            "2s",
            "--",
            "/bin/sh",
            "-c",
            "sleep 100 & sleep 100 & sleep 100",
        ],
    );
    let took = t.elapsed();
    assert_eq!(o.status.code(), Some(137), "{}", stderr(&o));
    assert!(stderr(&o).contains("lifetime"), "{}", stderr(&o));
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(15),
        "{took:?}"
    );
    // run() already asserted no cgroup/run dir; no sleeper survived either.
    assert!(host_processes_matching("sleep 100").is_empty());
}

#[test]
fn hundred_megabytes_of_stdout_arrive_intact() {
    let id = unique_id("bigout");
    let gen = "yes 'sandlot streams every byte 0123456789' | head -c 100000000";
    let o = run(&id, &["--", "/bin/sh", "-c", gen]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let expected = Command::new("/bin/sh")
        .args(["-c", gen])
        .output()
        .unwrap()
        .stdout;
    assert_eq!(o.stdout.len(), 100_000_000);
    assert!(
        o.stdout == expected,
        "stdout differs from the expected bytes"
    );
}

#[test]
fn stdin_round_trips() {
    let id = unique_id("stdin");
    let data: Vec<u8> = (0..8_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    let o = run_with_stdin(&id, &["--", "cat"], &data);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(o.stdout.len(), data.len());
    assert!(o.stdout == data);
}

/// The command starts with the sandbox, before the CLI attaches to it: what it
/// writes at once, several times the agent's retention, still arrives whole.
#[test]
fn output_written_before_the_cli_attaches_arrives_whole() {
    let (code, out, err) = sh(
        &unique_id("burst-out"),
        &[],
        "head -c 6000000 /dev/zero | tr '\\0' x; echo; echo end >&2",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.len(), 6_000_001);
    assert!(out.trim_end().bytes().all(|b| b == b'x'));
    assert_eq!(err, "end\n");
}

#[test]
fn exit_codes_and_signals_propagate() {
    assert_eq!(sh(&unique_id("exit3"), &[], "exit 3").0, 3);
    assert_eq!(sh(&unique_id("kill9"), &[], "kill -9 $$").0, 137);
    assert_eq!(sh(&unique_id("term"), &[], "kill -TERM $$").0, 143);
    let (code, out, _) = sh(
        &unique_id("env"),
        &["--env", "GREETING=hi there", "--workdir", "/tmp"],
        "echo \"$GREETING\"; pwd",
    );
    assert_eq!((code, out.as_str()), (0, "hi there\n/tmp\n"));
    let (code, out, _) = sh(
        &unique_id("user"),
        &["--user", "user"],
        "id -u; echo $HOME; pwd",
    );
    assert_eq!((code, out.as_str()), (0, "1000\n/home/user\n/home/user\n"));
}

#[test]
fn signals_to_the_cli_are_forwarded() {
    require_root();
    let id = unique_id("fwd");
    let mut child = Command::new(sandlot())
        .args([
            "run",
            "--id",
            &id,
            "--",
            "/bin/sh",
            "-c",
            "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.1; done",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut buf = [0u8; 6];
    out.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ready\n");
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let st = child.wait().unwrap();
    assert_eq!(rest, "got-term\n");
    assert_eq!(st.code(), Some(7));
    assert_no_leftovers(&id);
}

#[test]
fn pty_session_sees_a_terminal_and_its_size() {
    require_root();
    let id = unique_id("pty");
    // script(1) gives the CLI a real terminal of 40x100.
    let cmd = format!(
        "stty rows 40 cols 100; {} run --id {id} -t -- /bin/sh -c 'test -t 0 && echo is-a-tty; stty size'",
        sandlot().display()
    );
    let o = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .expect("script(1) from bsdutils");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("is-a-tty"), "{out}");
    assert!(out.contains("40 100"), "{out}");
    assert_no_leftovers(&id);
}

/// Regression: PID 1's `ready` line could reach the host before the helper's
/// `pid` line, and about one create in sixty failed with "exited without reporting".
#[test]
fn create_survives_the_ready_pid_race() {
    for i in 0..80 {
        let id = unique_id("race");
        let o = run(&id, &["--", "/bin/true"]);
        assert_eq!(o.status.code(), Some(0), "iteration {i}: {}", stderr(&o));
    }
}

/// Concurrent creators must not sweep each other's fresh sandboxes.
#[test]
fn concurrent_runs_do_not_interfere() {
    let handles: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..10 {
                    let id = unique_id(&format!("conc{t}"));
                    let (code, out, err) = sh(&id, &[], "echo $((6*7))");
                    assert_eq!(
                        (code, out.as_str()),
                        (0, "42\n"),
                        "thread {t} iteration {i}: {err}"
                    );
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// `sandlot bench runtime` times bubblewrap doing a sandbox's isolation work (its
/// mounts, Sandlot's seccomp filter, its cgroups) beside the CLI and plain
/// bubblewrap, and leaves none of the cgroups it made for that peer.
#[test]
fn the_runtime_benchmark_times_bubblewrap_doing_the_sandboxs_work_and_leaves_no_cgroup() {
    require_root();
    let dir = std::env::temp_dir().join(unique_id("bench-runtime"));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("runtime.json");
    let o = Command::new(sandlot())
        .args(["bench", "runtime", "-n", "2", "--json"])
        .arg(&json)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let peer = v["wall"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "bwrap, the sandbox's work")
        .unwrap_or_else(|| panic!("no bubblewrap peer doing the sandbox's work: {v}"));
    assert_eq!(peer["n"], 2, "{v}");
    for k in [
        "matched_over_bwrap_wall",
        "cli_over_matched_wall",
        "cli_over_bwrap_cpu",
    ] {
        assert!(v[k].as_f64().is_some_and(|r| r > 0.0), "{k}: {v}");
    }
    // v2 (the unified root) and each v1 hierarchy.
    let roots = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .map(|e| e.path());
    for root in std::iter::once("/sys/fs/cgroup".into()).chain(roots) {
        let d = root.join("sandlot-bench-peer");
        assert!(!d.exists(), "leftover cgroup {}", d.display());
    }
}

/// A platform benchmark stopped by SIGTERM in the middle of its work deletes its
/// private daemon's sandboxes, stops the daemon and leaves nothing behind (a
/// stopped daemon keeps its sandboxes for its next start, which a private one
/// never has).
#[test]
fn a_platform_benchmark_stopped_midway_leaves_no_sandbox_behind() {
    use std::io::BufRead;
    require_root();
    let out = std::env::temp_dir().join(unique_id("bench-out"));
    // No pool: the only sandbox the daemon lists is the exec section's own, which
    // the benchmark deletes only when that section ends.
    let mut b = Command::new(sandlot())
        .args(["bench", "platform", "--only", "exec", "--exec-n", "1000000"])
        .args(["--pool", "0", "--out"])
        .arg(&out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = b.id();
    let prefix = format!("bp{pid}-");
    let socket = std::env::temp_dir().join(format!("sandlot-bench-{pid}/api.sock"));
    let _sweep = SweepPrefixOnFailure(prefix.clone());
    let lines = {
        let err = std::io::BufReader::new(b.stderr.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in err.lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        rx
    };
    let mut bench = KillOnDrop::new(b);
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut live = Vec::new();
    while live.is_empty() {
        assert!(Instant::now() < deadline, "no sandbox to exec in: {seen}");
        while let Ok(l) = lines.try_recv() {
            seen.push_str(&l);
            seen.push('\n');
        }
        if seen.contains("exec round trip") {
            live = live_sandboxes(&socket);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut b = bench.0.take().unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&b),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let st = loop {
        if let Some(st) = b.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = b.kill();
            let _ = b.wait();
            panic!("the benchmark did not end within 60 s of SIGTERM: {seen}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for l in lines.try_iter() {
        seen.push_str(&l);
        seen.push('\n');
    }
    assert!(!st.success(), "{seen}");
    assert!(seen.contains("stopped by SIGTERM"), "{seen}");
    let _ = std::fs::remove_dir_all(&out);
    for id in &live {
        assert!(id.starts_with(&prefix), "{id}");
        assert_no_leftovers(id);
    }
    let daemons = host_processes_matching(&format!("--id-prefix {prefix}"));
    assert!(
        daemons.is_empty(),
        "the private daemon runs on: {daemons:?}"
    );
}

/// The ids of the live sandboxes a daemon lists on its Unix socket (none if it
/// does not answer).
fn live_sandboxes(socket: &std::path::Path) -> Vec<String> {
    use std::io::Write;
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(socket) else {
        return Vec::new();
    };
    if s.set_read_timeout(Some(Duration::from_secs(5))).is_err() {
        return Vec::new();
    }
    let mut answer = String::new();
    if s.write_all(b"GET /v1/sandboxes HTTP/1.0\r\nHost: sandlot\r\n\r\n")
        .is_err()
        || s.read_to_string(&mut answer).is_err()
    {
        return Vec::new();
    }
    let Some((_, body)) = answer.split_once("\r\n\r\n") else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    v["sandboxes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// A child process killed (and reaped) if it still runs when this is dropped.
struct KillOnDrop(Option<std::process::Child>);

impl KillOnDrop {
    fn new(c: std::process::Child) -> KillOnDrop {
        KillOnDrop(Some(c))
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// When a test fails: stops a private daemon a benchmark left running with id
/// prefix `.0`, then starts and stops a daemon with that prefix, whose start-up
/// removes every sandbox, cgroup and network slot of the prefix.
struct SweepPrefixOnFailure(String);

impl Drop for SweepPrefixOnFailure {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let needle = format!("--id-prefix {}", self.0);
        let daemons = || host_processes_matching(&needle);
        for d in daemons() {
            if let Some(pid) = d
                .split(':')
                .next()
                .and_then(|p| p.parse().ok())
                .and_then(rustix::process::Pid::from_raw)
            {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while !daemons().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let dir = std::env::temp_dir().join(unique_id("sweep"));
        let sock = dir.join("api.sock");
        let Ok(mut d) = Command::new(sandlot())
            .args(["serve", "--data-dir"])
            .arg(dir.join("data"))
            .arg("--socket")
            .arg(&sock)
            .args(["--id-prefix", &self.0])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        else {
            return;
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !sock.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_child(&d),
            rustix::process::Signal::TERM,
        );
        let _ = d.wait();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
