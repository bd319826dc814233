//! Restart safety: the daemon is killed with SIGKILL while creating sandboxes under
//! load; on restart every record is accounted for, surviving sandboxes are
//! re-adopted and still run commands, and nothing leaks.

mod api_support;

use std::time::Duration;

use api_support::{free_port, prefix_lock, rt, spec_body, wait_exit, Daemon};
use sandlot_client::{CreateSandbox, ListFilter, SandboxState};

#[test]
fn sigkill_mid_load_loses_nothing_and_leaks_nothing() {
    let mut d = Daemon::start(None);
    let c = d.client();
    let r = rt();
    let survivors: Vec<String> = r.block_on(async {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(
                c.create_sandbox(&CreateSandbox::default())
                    .await
                    .unwrap()
                    .id,
            );
        }
        // A background process in one survivor, with output to re-attach to later.
        let mut bg = sandlot_client::ExecBody {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "echo before-restart; sleep 600".into(),
            ],
            ..Default::default()
        };
        bg.background = true;
        c.exec(&v[0], &bg).await.unwrap();
        v
    });
    // Load: creates in flight when the daemon dies (once some have answered).
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let load: Vec<_> = (0..8)
        .map(|_| {
            let c = c.clone();
            let answered = answered.clone();
            r.spawn(async move {
                let mut n = 0;
                while c.create_sandbox(&CreateSandbox::default()).await.is_ok() {
                    n += 1;
                    answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                n
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while answered.load(std::sync::atomic::Ordering::SeqCst) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the load created nothing in 60 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    d.kill9();
    let created: i32 = r.block_on(async {
        let mut t = 0;
        for l in load {
            t += l.await.unwrap();
        }
        t
    });
    assert!(created > 0, "the load created nothing before the kill");
    d.spawn();
    let c = d.client();
    r.block_on(async {
        let all = c
            .list_sandboxes(&ListFilter {
                states: vec!["all".into()],
                ..Default::default()
            })
            .await
            .unwrap();
        // Every sandbox the clients were told about has a record.
        for id in &survivors {
            let s = all
                .iter()
                .find(|s| &s.id == id)
                .unwrap_or_else(|| panic!("lost record of {id}"));
            assert_eq!(s.state, SandboxState::Running, "{s:?}");
        }
        assert!(
            all.len() >= survivors.len() + created as usize,
            "{} records, {} created",
            all.len(),
            survivors.len() + created as usize
        );
        // Every record is settled: running (re-adopted) or stopped with a reason.
        for s in &all {
            assert!(
                s.state == SandboxState::Running
                    || (s.state == SandboxState::Stopped && s.end_reason.is_some()),
                "{s:?}"
            );
        }
        // Running ones work; stopped ones left nothing on the host.
        for s in all.iter().filter(|s| s.state == SandboxState::Running) {
            let out = c.run(&s.id, &["echo", "alive"]).await.unwrap();
            assert_eq!(out.stdout, b"alive\n", "{}", s.id);
        }
        let left = d.leftovers();
        for s in all.iter().filter(|s| s.state == SandboxState::Stopped) {
            assert!(
                !left.iter().any(|l| l.ends_with(&s.id)),
                "{} is stopped but left {left:?}",
                s.id
            );
        }
        // Output of a process started before the restart is re-attachable.
        let procs = c.list_processes(&survivors[0]).await.unwrap();
        let p = procs
            .iter()
            .find(|p| p.state == "running")
            .expect("the background process survived");
        let mut s = c.output(&survivors[0], p.id, 0, 0).await.unwrap();
        match s.next().await.unwrap().unwrap() {
            sandlot_client::stream::Output::Stdout(_, b) => assert_eq!(b, b"before-restart\n"),
            other => panic!("{other:?}"),
        }
    });
    // A second SIGKILL with nothing in flight, then an orderly end.
    d.kill9();
    d.spawn();
    let n = r
        .block_on(d.client().list_sandboxes(&ListFilter::default()))
        .unwrap()
        .len();
    assert!(n >= survivors.len());
    d.shutdown();
}

/// SIGTERM stops the daemon even while a client streams the output of a process
/// that keeps running: open streams end after the shutdown grace period, and the
/// sandbox survives for the next daemon.
#[test]
fn sigterm_with_an_open_output_stream_stops_the_daemon() {
    let mut d = Daemon::start(None);
    let c = d.client();
    let r = rt();
    let (id, reader) = r.block_on(async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let body = sandlot_client::ExecBody {
            argv: vec!["sh".into(), "-c".into(), "echo started; sleep 600".into()],
            ..Default::default()
        };
        let (_, mut s) = c.exec_stream(&sb.id, &body).await.unwrap();
        // The stream is open and producing before the stop signal.
        match s.next().await.unwrap() {
            Some(sandlot_client::stream::Output::Stdout(_, d)) => assert_eq!(d, b"started\n"),
            other => panic!("expected the first output, got {other:?}"),
        }
        let reader = tokio::spawn(async move {
            // Ends (with an error or end of stream) when the daemon drops it.
            while let Ok(Some(_)) = s.next().await {}
        });
        (sb.id, reader)
    });
    let pid = rustix::process::Pid::from_raw(d.pid()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let mut child = d.child.take().unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(20))
        .expect("the daemon did not stop within 20 s of SIGTERM with a stream open");
    assert!(status.success(), "daemon exit: {status}");
    r.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .expect("the client's stream ended")
            .unwrap();
    });
    // The sandbox outlived the daemon and is adopted by the next one.
    d.spawn();
    let c = d.client();
    r.block_on(async {
        let sb = c.get_sandbox(&id).await.unwrap();
        assert_eq!(sb.state, SandboxState::Running);
        let out = c.run(&id, &["echo", "still here"]).await.unwrap();
        assert_eq!(out.stdout, b"still here\n");
    });
}

/// A second daemon (another data directory and socket)
/// with the same id prefix used to reconcile the first one's live sandboxes and
/// network slots away as its own leftovers. It must refuse to start instead.
#[test]
fn a_second_daemon_with_the_same_id_prefix_refuses_to_start() {
    let mut d = Daemon::start(None);
    let c = d.client();
    let r = rt();
    let id = r.block_on(async {
        c.create_sandbox(&CreateSandbox::default())
            .await
            .unwrap()
            .id
    });
    let other = d.dir.join("second");
    std::fs::create_dir_all(&other).unwrap();
    let log = other.join("serve.log");
    let mut second = std::process::Command::new(api_support::sandlot())
        .arg("serve")
        .arg("--data-dir")
        .arg(other.join("data"))
        .arg("--socket")
        .arg(other.join("api.sock"))
        .arg("--id-prefix")
        .arg(&d.prefix)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("run a second sandlot serve");
    let Some(status) = wait_exit(&mut second, Duration::from_secs(15)) else {
        let _ = second.kill();
        let _ = second.wait();
        panic!(
            "a second daemon with the first one's id prefix kept running; log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    };
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "the second daemon exited 0; log:\n{err}");
    assert!(
        err.contains(&format!(
            "another sandlot daemon (pid {}) uses the id prefix {:?}",
            d.pid(),
            d.prefix
        )),
        "stderr:\n{err}"
    );
    assert!(
        !other.join("api.sock").exists(),
        "the refused daemon left its socket"
    );
    // The first daemon's sandbox was not touched.
    r.block_on(async {
        let sb = c.get_sandbox(&id).await.unwrap();
        assert_eq!(sb.state, SandboxState::Running);
        let out = c.run(&id, &["echo", "untouched"]).await.unwrap();
        assert_eq!(out.stdout, b"untouched\n");
    });
    let lock = prefix_lock(&d.prefix);
    assert_eq!(
        std::fs::read_to_string(&lock).unwrap(),
        format!("{}\n", d.pid())
    );
    d.shutdown();
    assert!(!lock.exists(), "a stopped daemon left {}", lock.display());
}

/// A stop signal while the daemon is still starting (its sockets accept, but it is
/// still reconciling and starting its network service) ends it gracefully: exit
/// status 0 and its id-prefix lock file removed. Before, the signal could arrive
/// before the handler was installed and kill it with nothing cleaned up.
#[test]
fn sigterm_while_the_daemon_starts_stops_it_gracefully() {
    let mut d = Daemon::start(None);
    let lock = prefix_lock(&d.prefix);
    let pid = rustix::process::Pid::from_raw(d.pid()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let mut child = d.child.take().unwrap();
    let Some(status) = wait_exit(&mut child, Duration::from_secs(20)) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "the daemon did not stop within 20 s of SIGTERM; log:\n{}",
            d.log()
        );
    };
    assert!(status.success(), "daemon exit: {status}; log:\n{}", d.log());
    assert!(!lock.exists(), "the daemon left {}", lock.display());
    d.shutdown();
}

/// A client that waits for the operator socket (a service manager, a script, the
/// test harnesses) finds every TCP listener bound the moment the socket accepts:
/// the API, metrics and E2B ports are bound before the socket. And the socket file
/// is root-only (0600) whenever it is seen, even under a umask of 0, which the
/// daemon inherits here: its mode is set before `bind` makes the file. Polled every
/// millisecond over ten starts (a socket bound before the E2B port failed at the
/// second start).
#[test]
fn the_socket_appears_root_only_and_after_every_listener() {
    use std::os::unix::fs::PermissionsExt;
    let (metrics, e2b) = (free_port(), free_port());
    let mut d = Daemon::start(Some(&format!(
        "metrics_listen = \"127.0.0.1:{metrics}\"\n[e2b]\nlisten = \"127.0.0.1:{e2b}\"\n"
    )));
    // This test's own process (nextest runs each test in one): the daemons
    // launched below inherit it.
    rustix::process::umask(rustix::fs::Mode::empty());
    for start in 0..10 {
        d.terminate();
        d.launch();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(&d.socket).is_err() {
            if let Ok(m) = std::fs::symlink_metadata(&d.socket) {
                let mode = m.permissions().mode() & 0o777;
                assert_eq!(
                    mode, 0o600,
                    "start {start}: the socket was seen with mode {mode:o}"
                );
            }
            d.assert_starting(deadline);
            std::thread::sleep(Duration::from_millis(1));
        }
        for (what, port) in [("API", d.port), ("metrics", metrics), ("E2B", e2b)] {
            assert!(
                std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
                "start {start}: the socket accepts but the {what} port {port} refuses; log:\n{}",
                d.log()
            );
        }
    }
    d.shutdown();
}

/// `sandlot run --id` with an id that starts with a running daemon's prefix used to
/// make a sandbox that daemon's next start took for a leftover of its own and
/// killed mid-run. It is refused now, before anything is made, naming the prefix.
#[test]
fn sandlot_run_refuses_an_id_with_a_daemons_prefix() {
    let mut d = Daemon::start(None);
    let id = format!("{}cli", d.prefix);
    let out = std::process::Command::new(api_support::sandlot())
        .args(["run", "--id", &id, "--", "echo", "ran"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run sandlot run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "sandlot run exited 0; stderr:\n{err}"
    );
    assert!(out.stdout.is_empty(), "the command ran: {:?}", out.stdout);
    assert!(
        err.contains(&format!("--id {id:?}")) && err.contains(&format!("{:?}", d.prefix)),
        "stderr:\n{err}"
    );
    assert!(
        !std::path::Path::new("/run/sandlot/sandboxes")
            .join(&id)
            .exists(),
        "a refused run left its run directory"
    );
    // An id of its own runs as before, next to the daemon.
    let out = std::process::Command::new(api_support::sandlot())
        .args([
            "run",
            "--id",
            &format!("cli-{}", d.prefix),
            "--",
            "echo",
            "ran",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run sandlot run");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"ran\n");
    d.shutdown();
}

/// Network namespaces, links and the nftables table of the daemon with id prefix
/// `prefix` still on the host.
fn network_traces(prefix: &str) -> Vec<String> {
    let slots = sandlot_net::slot_prefix(prefix);
    let mut v = Vec::new();
    for dir in ["/run/netns", "/sys/class/net"] {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(&slots) {
                    v.push(format!("{dir}/{name}"));
                }
            }
        }
    }
    let tables = std::process::Command::new("nft")
        .args(["list", "tables"])
        .output()
        .expect("run nft");
    let table = format!("sandlot_{slots}");
    if String::from_utf8_lossy(&tables.stdout).contains(&table) {
        v.push(format!("nftables table {table}"));
    }
    v
}

/// Found by probing restarts: a re-adopted sandbox that stopped at once (here, its
/// timeout ran out while the daemon was down) could be torn down before the network
/// service had started; its slot was then kept for a live sandbox and outlived it,
/// the daemon's stop included. Owner tasks of re-adopted sandboxes now start after
/// the network service.
#[test]
fn sandboxes_that_end_while_the_daemon_restarts_release_their_network() {
    let mut d = Daemon::start(None);
    let c = d.client();
    let r = rt();
    let ids: Vec<String> = r.block_on(async {
        let mut v = Vec::new();
        for _ in 0..8 {
            let body = spec_body(serde_json::json!({"timeout": "2s",
                "network": {"mode": "allow", "allow": [{"cidr": "203.0.113.1/32"}]}}));
            v.push(c.create_sandbox(&body).await.unwrap().id);
        }
        v
    });
    d.kill9();
    // Their timeouts run out while the daemon is down.
    std::thread::sleep(Duration::from_millis(2500));
    d.spawn();
    let c = d.client();
    r.block_on(async {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        for id in &ids {
            loop {
                let s = c.get_sandbox(id).await.unwrap();
                if s.state == SandboxState::Stopped {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{id} still {:?} after its timeout",
                    s.state
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    d.terminate();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !network_traces(&d.prefix).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = network_traces(&d.prefix);
    remove_network_traces(&d.prefix);
    assert_eq!(
        left,
        Vec::<String>::new(),
        "network left after the stop; log:\n{}",
        d.log()
    );
    d.shutdown();
}

/// Removes what [`network_traces`] finds, so that a failure leaves the host clean.
fn remove_network_traces(prefix: &str) {
    let slots = sandlot_net::slot_prefix(prefix);
    let ip = |args: &[&str]| {
        let _ = std::process::Command::new("ip").args(args).output();
    };
    for t in network_traces(prefix) {
        if let Some(ns) = t.strip_prefix("/run/netns/") {
            ip(&["netns", "delete", ns]);
        } else if let Some(link) = t.strip_prefix("/sys/class/net/") {
            ip(&["link", "delete", link]);
        }
    }
    let _ = std::process::Command::new("nft")
        .args(["delete", "table", "inet", &format!("sandlot_{slots}")])
        .output();
}

/// Found by probing two daemons side by side: both carved their slots from the same
/// default subnet, so their sandboxes got the same addresses and the second one's
/// replies were routed into the first one's veths (its sandboxes could not reach
/// even their own daemon's egress proxy). Each daemon now holds a subnet of its own.
#[test]
fn two_daemons_hand_out_different_addresses_and_both_have_egress() {
    let mut a = Daemon::start(None);
    let mut b = Daemon::start(None);
    let r = rt();
    let probe = "ip -4 -o addr show dev eth0 | awk '{print $4}'; \
                 gw=$(ip route show default | awk '{print $3}'); \
                 timeout 5 bash -c \"exec 3<>/dev/tcp/$gw/80\" && echo connected";
    let mut seen = Vec::new();
    for d in [&a, &b] {
        let c = d.client();
        let out = r.block_on(async {
            let body = spec_body(serde_json::json!(
                {"network": {"mode": "allow", "allow": [{"cidr": "203.0.113.1/32"}]}}));
            let id = c.create_sandbox(&body).await.unwrap().id;
            c.run(&id, &["sh", "-c", probe]).await.unwrap()
        });
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut lines = text.lines();
        let addr = lines.next().unwrap_or_default().to_string();
        assert!(addr.contains('/'), "no address: {text:?}");
        assert_eq!(
            lines.next(),
            Some("connected"),
            "the sandbox of {} cannot reach its gateway: {text:?} {}",
            d.prefix,
            String::from_utf8_lossy(&out.stderr)
        );
        seen.push(addr);
    }
    assert_ne!(seen[0], seen[1], "both daemons handed out {}", seen[0]);
    a.shutdown();
    b.shutdown();
}

/// Found by probing restarts: a sandbox whose delete a daemon crash interrupted
/// (its record left `stopping`, reason `deleted`) was recorded after the restart with
/// the error "the sandbox ended while the daemon was not running", as if it had been
/// lost. The stop has simply finished: no error.
#[test]
fn a_stop_that_a_crash_interrupted_finishes_without_an_error() {
    let mut d = Daemon::start(None);
    let c = d.client();
    let r = rt();
    let id = r
        .block_on(c.create_sandbox(&CreateSandbox::default()))
        .unwrap()
        .id;
    d.kill9();
    // Where a delete leaves things when the daemon dies before the teardown: the
    // record says stopping (deleted), and then PID 1 goes.
    let db = rusqlite::Connection::open(d.data_dir().join("sandlot.db")).unwrap();
    let n = db
        .execute(
            "UPDATE sandboxes SET state = 'stopping', end_reason = 'deleted' WHERE id = ?1",
            [&id],
        )
        .unwrap();
    assert_eq!(n, 1);
    drop(db);
    let procs = ["memory/sandlot", "sandlot"]
        .iter()
        .find_map(|p| std::fs::read_to_string(format!("/sys/fs/cgroup/{p}/{id}/cgroup.procs")).ok())
        .expect("the sandbox's cgroup");
    for pid in procs.split_whitespace() {
        let pid = rustix::process::Pid::from_raw(pid.parse().unwrap()).unwrap();
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
    d.spawn();
    let c = d.client();
    let s = r.block_on(c.get_sandbox(&id)).unwrap();
    assert_eq!(
        (s.state, s.end_reason.as_deref(), s.error.as_deref()),
        (SandboxState::Stopped, Some("deleted"), None),
        "{s:?}"
    );
    d.shutdown();
}

/// Stocked cgroups (`.stock-<pid>-...`) of daemon `pid`, in every hierarchy.
fn stocked_cgroups(pid: i32) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut parents = vec![std::path::PathBuf::from("/sys/fs/cgroup/sandlot")];
    for e in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        parents.push(e.path().join("sandlot"));
    }
    for p in parents {
        let Ok(rd) = std::fs::read_dir(&p) else {
            continue;
        };
        for e in rd.flatten() {
            if e.file_name()
                .to_string_lossy()
                .starts_with(&format!(".stock-{pid}-"))
            {
                out.push(e.path());
            }
        }
    }
    out
}

/// A daemon killed with SIGKILL and restarted at once, before its process is reaped
/// (a zombie still holding its pid, as under a supervisor that restarts before it
/// waits), leaves none of its stocked cgroups behind once the new one has started
/// (found by a review: they stayed until the next start).
#[test]
fn stocked_cgroups_of_a_killed_daemon_are_gone_after_an_immediate_restart() {
    let mut d = Daemon::start(None);
    let old = d.pid();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let names = |pid| {
        let mut n: Vec<_> = stocked_cgroups(pid)
            .iter()
            .map(|p| p.file_name().unwrap().to_owned())
            .collect();
        n.sort();
        n.dedup();
        n.len()
    };
    while names(old) < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "the stock never filled"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut zombie = d.kill9_unreaped();
    // Restart as soon as the killed daemon lets go of its data directory (the
    // kernel releases its locks before it is a zombie, long before it is reaped).
    let lock = std::fs::File::open(d.data_dir().join("daemon.lock")).unwrap();
    while rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the killed daemon kept its lock"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(lock);
    d.spawn();
    // The new daemon sweeps before it starts its own stock.
    while names(d.pid()) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the new daemon made no stock"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let left = stocked_cgroups(old);
    zombie.wait().unwrap();
    assert!(
        left.is_empty(),
        "the killed daemon's stock is left: {left:?}"
    );
    let new = d.pid();
    d.shutdown();
    assert!(stocked_cgroups(new).is_empty());
}
