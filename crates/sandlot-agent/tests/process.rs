//! Processes through the protocol: exit statuses, signals, timeouts, env/cwd/user,
//! stdin, terminals, re-attach, listings, concurrency, reaping.
//! Runs as root (CI does): switching users needs it.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{run, sh, TestAgent};
use sandlot_guest::client::{ClientError, ErrorCode, ExecRequest, ProcessEvent, PtySize};

#[tokio::test]
async fn exit_codes_and_output_propagate() {
    let a = TestAgent::start();
    let c = a.client().await;
    c.ping().await.unwrap();
    let o = run(&a, &c, sh("echo out; echo err >&2; exit 3")).await;
    assert_eq!(o.status.code, Some(3));
    assert_eq!(o.status.signal, None);
    assert!(!o.status.timed_out);
    assert_eq!(o.stdout, b"out\n");
    assert_eq!(o.stderr, b"err\n");
    let o = run(&a, &c, ExecRequest::new(["true"])).await;
    assert!(o.status.success());
    a.finish(&c).await;
}

#[tokio::test]
async fn signals_are_reported_not_translated() {
    let a = TestAgent::start();
    let c = a.client().await;
    // Killed by its own SIGKILL.
    let o = run(&a, &c, sh("kill -9 $$")).await;
    assert_eq!((o.status.code, o.status.signal), (None, Some(9)));
    // SIGTERM through the protocol, to the process group.
    let mut p = c
        .exec(sh("sleep 100 & sleep 100; echo never"))
        .await
        .unwrap();
    a.track(&p);
    // The group exists once the exec reply arrived; signal it.
    p.signal(15).await.unwrap();
    let st = p.wait().await.unwrap();
    assert_eq!(st.signal, Some(15));
    assert_eq!(st.code, None);
    // Signalling a finished process is an error naming it.
    let e = c.signal(p.id(), 15).await.unwrap_err();
    assert!(
        matches!(
            e.code(),
            Some(ErrorCode::ProcessExited) | Some(ErrorCode::NoSuchProcess)
        ),
        "{e}"
    );
    let e = c.signal(p.id(), 0).await.unwrap_err();
    assert!(e.to_string().contains("signal"), "{e}");
    a.finish(&c).await;
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let a = TestAgent::start();
    let c = a.client().await;
    let mut req = sh("sleep 60 & echo $!; sleep 60");
    req.timeout = Some(sandlot_proto::units::Seconds(Duration::from_millis(300)));
    let started = std::time::Instant::now();
    let p = c.exec(req).await.unwrap();
    a.track(&p);
    let o = p.output().await.unwrap();
    assert!(o.status.timed_out, "{:?}", o.status);
    assert_eq!(o.status.signal, Some(9));
    assert!(started.elapsed() < Duration::from_secs(10));
    let bg: i32 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    // The background child of the group is gone too (and reaped).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::path::Path::new(&format!("/proc/{bg}")).exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "background process {bg} survived"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.finish(&c).await;
}

#[tokio::test]
async fn env_cwd_and_defaults() {
    let a = TestAgent::start_with(&["--env", "BASE=1", "--env", "OVER=base"]);
    let c = a.client().await;
    let mut req = sh("echo $BASE $OVER $NEW; pwd; echo $HOME; echo $USER; echo $PATH");
    req.env = BTreeMap::from([
        ("OVER".to_string(), "req".to_string()),
        ("NEW".to_string(), "x y".to_string()),
    ]);
    req.cwd = Some(a.dir.str(""));
    let o = run(&a, &c, req).await;
    let out = String::from_utf8(o.stdout).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "1 req x y");
    assert_eq!(
        std::fs::canonicalize(lines[1]).unwrap(),
        std::fs::canonicalize(a.dir.path()).unwrap()
    );
    assert_eq!(lines[2], "/root");
    assert_eq!(lines[3], "root");
    assert!(lines[4].contains("/usr/bin"), "{}", lines[4]);
    // Bad requests are refused with clear messages.
    let e = c
        .exec(ExecRequest::new(["no-such-program-xyz"]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound));
    assert!(e.to_string().contains("no-such-program-xyz"), "{e}");
    let mut bad = sh("true");
    bad.cwd = Some("/no/such/dir".into());
    let e = c.exec(bad).await.unwrap_err();
    assert!(e.to_string().contains("/no/such/dir"), "{e}");
    let e = c
        .exec(ExecRequest::new(Vec::<String>::new()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::BadRequest));
    let mut bad = sh("true");
    bad.user = Some("no-such-user-xyz".into());
    let e = c.exec(bad).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidUser));
    a.finish(&c).await;
}

#[tokio::test]
async fn runs_as_another_user() {
    let a = TestAgent::start();
    let c = a.client().await;
    let mut req = sh("id -u; id -g; id -G; echo $HOME; touch \"$F\"; cat /proc/self/oom_score_adj");
    req.user = Some("1000:1000".into());
    let f = a.dir.str("by-user");
    std::fs::set_permissions(
        a.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    req.env.insert("F".into(), f.clone());
    let o = run(&a, &c, req).await;
    let out = String::from_utf8(o.stdout).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(&lines[..3], &["1000", "1000", "1000"], "{out}");
    let home = std::fs::read_to_string("/etc/passwd")
        .unwrap_or_default()
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 7 && f[2] == "1000")
        .map(|f| f[5].to_string())
        .unwrap_or_else(|| "/".to_string());
    assert_eq!(lines[3], home, "HOME from /etc/passwd");
    assert_eq!(lines[4], "0", "oom_score_adj reset");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&f).unwrap().uid(), 1000);
    // A numeric uid with no group takes the passwd primary group, or itself.
    let mut req = sh("id -u; id -g");
    req.user = Some("4242".into());
    let o = run(&a, &c, req).await;
    assert_eq!(String::from_utf8(o.stdout).unwrap(), "4242\n4242\n");
    a.finish(&c).await;
}

#[tokio::test]
async fn stdin_round_trips_a_large_payload() {
    let a = TestAgent::start();
    let c = a.client().await;
    let mut req = ExecRequest::new(["cat"]);
    req.stdin = true;
    let mut p = c.exec(req).await.unwrap();
    a.track(&p);
    let payload: Vec<u8> = (0..8 * 1024 * 1024u32)
        .map(|i| (i * 7 + i / 251) as u8)
        .collect();
    let mut stdin = p.take_stdin().expect("stdin requested");
    let data = payload.clone();
    let writer = tokio::spawn(async move {
        stdin.write(&data).await.unwrap();
        stdin.close();
    });
    let mut got = Vec::with_capacity(payload.len());
    let status = loop {
        match p.next_event().await.unwrap().unwrap() {
            ProcessEvent::Stdout(b) => got.extend_from_slice(&b),
            ProcessEvent::Stderr(b) => panic!("stderr: {b:?}"),
            ProcessEvent::Exit(s) => break s,
        }
    };
    writer.await.unwrap();
    assert!(status.success());
    assert_eq!(got.len(), payload.len());
    assert!(got == payload, "stdin did not round-trip intact");
    // Without stdin, the process reads /dev/null.
    let o = run(&a, &c, ExecRequest::new(["cat"])).await;
    assert!(o.status.success() && o.stdout.is_empty());
    a.finish(&c).await;
}

#[tokio::test]
async fn pty_sees_a_terminal_of_the_given_size_and_resizes() {
    let a = TestAgent::start();
    let c = a.client().await;
    let mut req = sh(
        "test -t 0 && test -t 1 && echo tty; stty size; read line; stty size; echo \"got $line\"",
    );
    req.pty = Some(PtySize {
        rows: 33,
        cols: 101,
    });
    let mut p = c.exec(req).await.unwrap();
    a.track(&p);
    assert!(p.is_pty());
    let mut seen = String::new();
    while !seen.contains("33 101") {
        match next(&mut p).await {
            ProcessEvent::Stdout(b) => seen.push_str(&String::from_utf8_lossy(&b)),
            other => panic!("unexpected {other:?} after {seen:?}"),
        }
    }
    assert!(seen.contains("tty"), "{seen:?}");
    p.resize(50, 120).await.unwrap();
    p.write_stdin(b"hello\n").await.unwrap();
    let status = loop {
        match next(&mut p).await {
            ProcessEvent::Stdout(b) => seen.push_str(&String::from_utf8_lossy(&b)),
            ProcessEvent::Stderr(_) => panic!("a pty has no separate stderr"),
            ProcessEvent::Exit(s) => break s,
        }
    };
    assert!(status.success(), "{status:?}: {seen:?}");
    assert!(seen.contains("50 120"), "resize not seen: {seen:?}");
    assert!(seen.contains("got hello"), "{seen:?}");
    // Resizing a non-terminal process is refused.
    let p2 = c.exec(sh("sleep 5")).await.unwrap();
    a.track(&p2);
    let e = p2.resize(10, 10).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{e}");
    p2.signal(9).await.unwrap();
    drop(p2);
    a.finish(&c).await;
}

#[tokio::test]
async fn python_sees_the_terminal_size() {
    if which("python3").is_none() {
        eprintln!("SKIPPED python_sees_the_terminal_size: python3 not installed");
        return;
    }
    let a = TestAgent::start();
    let c = a.client().await;
    let mut req = ExecRequest::new([
        "python3",
        "-c",
        "import os,sys; print(os.isatty(0), os.isatty(1), tuple(os.get_terminal_size()))",
    ]);
    req.pty = Some(PtySize {
        rows: 40,
        cols: 132,
    });
    let o = run(&a, &c, req).await;
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("True True (132, 40)"), "{out:?}");
    a.finish(&c).await;
}

async fn next(p: &mut sandlot_guest::client::Process) -> ProcessEvent {
    tokio::time::timeout(Duration::from_secs(10), p.next_event())
        .await
        .expect("pty output within 10s")
        .unwrap()
        .expect("an event")
}

fn which(p: &str) -> Option<std::path::PathBuf> {
    std::env::var("PATH")
        .ok()?
        .split(':')
        .map(|d| std::path::Path::new(d).join(p))
        .find(|c| c.is_file())
}

#[tokio::test]
async fn reattach_after_disconnect_from_start_and_offset() {
    let a = TestAgent::start();
    let fifo = a.dir.join("go");
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .unwrap();
    let id;
    {
        let c1 = a.client().await;
        let mut req = sh(&format!(
            "echo first; echo e1 >&2; read x < {}; echo second",
            fifo.display()
        ));
        req.tag = Some("reattach".into());
        let mut p = c1.exec(req).await.unwrap();
        a.track(&p);
        id = p.id();
        match p.next_event().await.unwrap().unwrap() {
            ProcessEvent::Stdout(b) => assert_eq!(&b[..], b"first\n"),
            ProcessEvent::Stderr(b) => assert_eq!(&b[..], b"e1\n"),
            other => panic!("{other:?}"),
        }
        // The whole client goes away while the process runs.
    }
    let c2 = a.client().await;
    let list = c2.list_processes().await.unwrap();
    let info = list.iter().find(|p| p.id == id).expect("still listed");
    assert_eq!(info.tag.as_deref(), Some("reattach"));
    assert!(info.exit.is_none());
    // A second client attaches from offset 6 ("second\n" only) while a third replays
    // everything: both see the end.
    let mut from6 = c2.attach(id, Some(6)).await.unwrap();
    let all = c2.attach(id, Some(0)).await.unwrap();
    std::fs::write(&fifo, b"go\n").unwrap();
    let o = all.output().await.unwrap();
    assert_eq!(o.stdout, b"first\nsecond\n");
    assert_eq!(o.stderr, b"e1\n");
    assert!(o.status.success());
    let mut rest = Vec::new();
    loop {
        match from6.next_event().await.unwrap().unwrap() {
            ProcessEvent::Stdout(b) => rest.extend_from_slice(&b),
            ProcessEvent::Stderr(_) => {}
            ProcessEvent::Exit(_) => break,
        }
    }
    assert_eq!(rest, b"second\n");
    drop(from6);
    a.finish(&c2).await;
}

#[tokio::test]
async fn finished_detached_process_is_kept_until_collected() {
    let a = TestAgent::start();
    let c = a.client().await;
    let mut req = sh("echo hello; exit 7");
    req.detached = true;
    let mut p = c.exec(req).await.unwrap();
    a.track(&p);
    assert!(matches!(
        p.next_event().await,
        Err(ClientError::Detached(_))
    ));
    let id = p.id();
    // Wait until it has exited.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let l = c.list_processes().await.unwrap();
        let info = l
            .iter()
            .find(|i| i.id == id)
            .expect("kept while uncollected");
        if let Some(exit) = info.exit {
            assert_eq!(exit.code, Some(7));
            assert_eq!(info.stdout.produced, 6);
            break;
        }
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let o = c.attach(id, Some(0)).await.unwrap().output().await.unwrap();
    assert_eq!(o.stdout, b"hello\n");
    assert_eq!(o.status.code, Some(7));
    // Collected: gone from the listing, attach refused.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while c.list_processes().await.unwrap().iter().any(|i| i.id == id) {
        assert!(std::time::Instant::now() < deadline, "not collected");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let e = c.attach(id, Some(0)).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NoSuchProcess));
    a.finish(&c).await;
}

#[tokio::test]
async fn hundred_concurrent_execs_on_one_connection() {
    let a = TestAgent::start();
    let c = a.client().await;
    let mut tasks = Vec::new();
    for i in 0..100u32 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let p = c
                .exec(sh(&format!(
                    "i={i}; seq 1 $((i * 50)); echo done-$i >&2; exit $((i % 7))"
                )))
                .await
                .unwrap();
            let pid = p.pid();
            (i, pid, p.output().await.unwrap())
        }));
    }
    for t in tasks {
        let (i, pid, o) = t.await.unwrap();
        a.track_pid(pid);
        assert_eq!(o.status.code, Some((i % 7) as i32));
        let expect: String = (1..=i * 50).map(|n| format!("{n}\n")).collect();
        assert_eq!(String::from_utf8(o.stdout).unwrap(), expect, "process {i}");
        assert_eq!(o.stderr, format!("done-{i}\n").into_bytes());
    }
    a.finish(&c).await;
}

#[tokio::test]
async fn orphans_and_zombies_are_reaped() {
    let a = TestAgent::start();
    let c = a.client().await;
    // The shell exits at once; its background child is orphaned to the agent.
    let o = run(&a, &c, sh("sleep 0.3 & echo $!")).await;
    let orphan: i32 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut saw_parent_agent = false;
    while let Some((_, ppid, _)) = common::proc_stat(orphan) {
        saw_parent_agent |= ppid == a.pid();
        assert!(
            std::time::Instant::now() < deadline,
            "orphan {orphan} never reaped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        saw_parent_agent,
        "the agent (a subreaper) adopted the orphan"
    );
    // Many short-lived processes leave no zombies either.
    for _ in 0..20 {
        run(&a, &c, sh("(true &); true")).await;
    }
    let zombies: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| matches!(common::proc_stat(p), Some(('Z', ppid, _)) if ppid == a.pid()))
        .collect();
    // Exits race with the scan; give stragglers a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let still: Vec<i32> = zombies
        .into_iter()
        .filter(|&p| matches!(common::proc_stat(p), Some(('Z', ..))))
        .collect();
    assert!(still.is_empty(), "zombies of the agent: {still:?}");
    a.finish(&c).await;
}

#[tokio::test]
async fn children_inherit_no_agent_descriptors() {
    let a = TestAgent::start();
    let c = a.client().await;
    let o = run(&a, &c, sh("ls /proc/self/fd")).await;
    let fds: Vec<String> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    // 0-2 and the directory ls reads.
    assert!(fds.len() <= 4, "inherited descriptors: {fds:?}");
    // Signal dispositions are defaults (SigIgn mask is empty), mask empty.
    let o = run(&a, &c, sh("grep -E 'SigIgn|SigBlk' /proc/self/status")).await;
    let s = String::from_utf8(o.stdout).unwrap();
    for l in s.lines() {
        assert!(l.ends_with("0000000000000000"), "{l}");
    }
    a.finish(&c).await;
}

#[tokio::test]
async fn list_processes_shows_running_ones() {
    let a = TestAgent::start();
    let c = a.client().await;
    let mut req = sh("sleep 30");
    req.tag = Some("sleeper".into());
    let p = c.exec(req).await.unwrap();
    a.track(&p);
    let l = c.list_processes().await.unwrap();
    let info = l.iter().find(|i| i.id == p.id()).unwrap();
    assert_eq!(info.pid, p.pid());
    assert_eq!(info.argv, vec!["/bin/sh", "-c", "sleep 30"]);
    assert_eq!(info.tag.as_deref(), Some("sleeper"));
    assert!(info.exit.is_none());
    assert_eq!(info.attached, 1);
    a.finish(&c).await;
}

#[tokio::test]
async fn exit_is_not_held_back_by_descendants_holding_the_output() {
    let a = TestAgent::start();
    let c = a.client().await;
    let started = std::time::Instant::now();
    let mut p = c.exec(sh("sleep 3 & echo done")).await.unwrap();
    a.track(&p);
    let mut out = Vec::new();
    let st = loop {
        match p.next_event().await.unwrap().unwrap() {
            ProcessEvent::Stdout(b) => out.extend_from_slice(&b),
            ProcessEvent::Stderr(_) => {}
            ProcessEvent::Exit(s) => break s,
        }
    };
    assert!(st.success());
    assert_eq!(out, b"done\n", "output written before exit precedes it");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "exit waited for the background child: {:?}",
        started.elapsed()
    );
    drop(p);
    a.finish(&c).await;
}

#[tokio::test]
async fn spawn_failures_name_the_failing_step() {
    let a = TestAgent::start();
    let c = a.client().await;
    let private = a.dir.join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let mut req = ExecRequest::new(["/bin/true"]);
    req.user = Some("1000".into());
    req.cwd = Some(private.to_string_lossy().into_owned());
    let e = c.exec(req).await.unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("changing to directory") && m.contains("uid 1000") && m.contains("denied"),
        "{m}"
    );
    let noexec = a.dir.join("noexec");
    std::fs::write(&noexec, b"#!/bin/sh\n").unwrap();
    let e = c
        .exec(ExecRequest::new([noexec.to_str().unwrap()]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::PermissionDenied), "{e}");
    assert!(e.to_string().contains("noexec"), "{e}");
    let junk = a.dir.join("junk");
    std::fs::write(&junk, b"\x7fELF not really").unwrap();
    std::fs::set_permissions(&junk, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let e = c
        .exec(ExecRequest::new([junk.to_str().unwrap()]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::SpawnFailed), "{e}");
    assert!(e.to_string().contains("format"), "{e}");
    // The agent is fine afterwards and left no zombie of the failed children.
    let o = run(&a, &c, ExecRequest::new(["true"])).await;
    assert!(o.status.success());
    let zombies: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| matches!(common::proc_stat(p), Some(('Z', ppid, _)) if ppid == a.pid()))
        .collect();
    assert!(zombies.is_empty(), "{zombies:?}");
    a.finish(&c).await;
}

#[tokio::test]
async fn stdin_is_shared_with_attached_clients_and_pty_eof_works() {
    let a = TestAgent::start();
    let c1 = a.client().await;
    let mut req = ExecRequest::new(["cat"]);
    req.stdin = true;
    let p1 = c1.exec(req).await.unwrap();
    a.track(&p1);
    let c2 = a.client().await;
    let mut p2 = c2.attach(p1.id(), None).await.unwrap();
    p2.write_stdin(b"from-2\n").await.unwrap();
    match p2.next_event().await.unwrap().unwrap() {
        ProcessEvent::Stdout(b) => assert_eq!(&b[..], b"from-2\n"),
        other => panic!("{other:?}"),
    }
    p2.close_stdin();
    assert!(p2.wait().await.unwrap().success());
    drop(p1);

    // On a terminal, closing stdin sends ^D: cat sees end of input.
    let mut req = ExecRequest::new(["cat"]);
    req.pty = Some(PtySize { rows: 24, cols: 80 });
    let mut p = c2.exec(req).await.unwrap();
    a.track(&p);
    p.write_stdin(b"line\n").await.unwrap();
    p.close_stdin();
    let st = tokio::time::timeout(Duration::from_secs(10), p.wait())
        .await
        .expect("cat exits after ^D")
        .unwrap();
    assert!(st.success());
    a.finish(&c2).await;
}

#[tokio::test]
async fn children_get_a_normal_oom_score() {
    assert!(
        std::process::Command::new("choom")
            .arg("--version")
            .output()
            .is_ok(),
        "choom(1) is missing: apt-get install util-linux"
    );
    // The runtime protects the agent with a negative score; lowering needs
    // CAP_SYS_RESOURCE, which test environments may lack, so use a positive one:
    // what matters is that children do not inherit the agent's value.
    let a = TestAgent::start_wrapped(&["choom", "-n", "500", "--"], &[]);
    let c = a.client().await;
    let agent_score = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", a.pid())).unwrap();
    assert_eq!(agent_score.trim(), "500");
    let mut req = sh("cat /proc/self/oom_score_adj");
    req.user = Some("1000".into());
    let o = run(&a, &c, req).await;
    assert_eq!(String::from_utf8(o.stdout).unwrap(), "0\n");
    let o = run(&a, &c, sh("cat /proc/self/oom_score_adj")).await;
    assert_eq!(String::from_utf8(o.stdout).unwrap(), "0\n");
    a.finish(&c).await;
}

/// A pids cgroup (v1) holding the agent, removed on drop.
struct PidsCgroup(std::path::PathBuf);

impl PidsCgroup {
    fn new(max: u32) -> Option<PidsCgroup> {
        let root = std::path::Path::new("/sys/fs/cgroup/pids");
        if !root.join("cgroup.procs").exists() {
            return None;
        }
        let dir = root.join(format!("sandlot-guest-test-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        let cg = PidsCgroup(dir);
        std::fs::write(cg.0.join("pids.max"), max.to_string()).ok()?;
        Some(cg)
    }
}

impl Drop for PidsCgroup {
    fn drop(&mut self) {
        // Move anything left back to the root, then remove the group.
        if let Ok(procs) = std::fs::read_to_string(self.0.join("cgroup.procs")) {
            for p in procs.lines() {
                let _ = std::fs::write("/sys/fs/cgroup/pids/cgroup.procs", p);
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[tokio::test]
async fn process_limit_is_a_clear_error() {
    common::require_root();
    let Some(cg) = PidsCgroup::new(4) else {
        eprintln!("SKIPPED process_limit_is_a_clear_error: no writable cgroup v1 pids hierarchy");
        return;
    };
    let a = TestAgent::start();
    let c = a.client().await;
    std::fs::write(cg.0.join("cgroup.procs"), a.pid().to_string()).unwrap();
    // The agent counts as one; start sleepers until the limit bites.
    let mut held = Vec::new();
    let err = loop {
        match c.exec(ExecRequest::new(["sleep", "30"])).await {
            Ok(p) => {
                a.track(&p);
                held.push(p);
                assert!(held.len() < 10, "the pids limit was not enforced");
            }
            Err(e) => break e,
        }
    };
    assert_eq!(err.code(), Some(ErrorCode::Limit), "{err}");
    assert!(err.to_string().contains("process limit"), "{err}");
    // Freeing a slot makes exec work again.
    held.pop().unwrap().signal(9).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let o = run(&a, &c, ExecRequest::new(["true"])).await;
    assert!(o.status.success());
    drop(held);
    a.finish(&c).await;
    drop(cg);
}

/// `configure` replaces the defaults of later processes: base environment, default
/// user and working directory; a bad user or a relative directory changes nothing.
#[tokio::test]
async fn configure_sets_defaults_of_later_processes() {
    use sandlot_proto::guest::ConfigureRequest;
    let a = TestAgent::start();
    let c = a.client().await;
    c.configure(ConfigureRequest {
        env: vec![("GREETING".into(), "hello".into())],
        default_user: "root".into(),
        default_cwd: Some("/tmp".into()),
    })
    .await
    .unwrap();
    let o = run(&a, &c, sh("echo $GREETING; pwd")).await;
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hello\n/tmp\n");
    // A request's own env and cwd still win.
    let mut req = sh("echo $GREETING; pwd");
    req.env.insert("GREETING".into(), "request".into());
    req.cwd = Some("/".into());
    let o = run(&a, &c, req).await;
    assert_eq!(String::from_utf8_lossy(&o.stdout), "request\n/\n");

    let e = c
        .configure(ConfigureRequest {
            env: vec![],
            default_user: "no-such-user-here".into(),
            default_cwd: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidUser), "{e}");
    let e = c
        .configure(ConfigureRequest {
            env: vec![],
            default_user: "root".into(),
            default_cwd: Some("tmp".into()),
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("default_cwd"), "{e}");
    // Nothing changed by the refused calls.
    let o = run(&a, &c, sh("echo $GREETING; pwd")).await;
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hello\n/tmp\n");
    c.configure(ConfigureRequest {
        env: vec![],
        default_user: "65534:65534".into(),
        default_cwd: None,
    })
    .await
    .unwrap();
    let o = run(&a, &c, sh("id -u; echo ${GREETING:-unset}")).await;
    assert_eq!(String::from_utf8_lossy(&o.stdout), "65534\nunset\n");
    a.finish(&c).await;
}
