//! `run_agent` embedded in a host process (as the runtime calls it), and as PID 1 of
//! a pid namespace. Own test binary: the embedded agent makes this process a child
//! subreaper, which must not affect other test binaries.

mod common;

use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{sh, TempDir};
use sandlot_agent::{run_agent, AgentConfig};
use sandlot_guest::client::{GuestClient, ProcessEvent};

async fn connect(path: &Path) -> GuestClient {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match GuestClient::connect(path).await {
            Ok(c) => return c,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(5)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
}

fn gone(pid: i32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

async fn wait_gone(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gone(pid) {
        assert!(Instant::now() < deadline, "process {pid} still exists");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn embedded_agent_never_steals_its_hosts_children() {
    common::require_root();
    let dir = TempDir::new("embedded");
    let sock = dir.join("a.sock");
    // A child of the host process, unrelated to the agent.
    let mut mine = Command::new("sh")
        .args(["-c", "sleep 0.3; exit 5"])
        .spawn()
        .unwrap();
    let listener = UnixListener::bind(&sock).unwrap();
    let agent = std::thread::spawn(move || run_agent(listener, AgentConfig::default()));
    let c = connect(&sock).await;
    // Processes, orphans and plenty of SIGCHLDs while the host's child is alive.
    let mut orphans = Vec::new();
    for _ in 0..10 {
        let o = c
            .exec(sh("sleep 0.1 & echo $!"))
            .await
            .unwrap()
            .output()
            .await
            .unwrap();
        assert!(o.status.success());
        orphans.push(
            String::from_utf8(o.stdout)
                .unwrap()
                .trim()
                .parse::<i32>()
                .unwrap(),
        );
    }
    // The host reaps its own child with its own status.
    let st = tokio::task::spawn_blocking(move || mine.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(
        st.code(),
        Some(5),
        "the agent stole or changed the host's child status"
    );
    // The orphans were adopted and reaped by the agent (no zombies left).
    for pid in orphans {
        wait_gone(pid).await;
    }
    c.shutdown().await.unwrap();
    let r = tokio::task::spawn_blocking(move || agent.join().unwrap())
        .await
        .unwrap();
    assert!(r.is_ok(), "{r:?}");
}

#[tokio::test]
async fn closing_the_lifeline_kills_everything_and_returns() {
    common::require_root();
    let dir = TempDir::new("lifeline");
    let sock = dir.join("a.sock");
    let (rd, wr) = rustix::pipe::pipe().unwrap();
    let listener = UnixListener::bind(&sock).unwrap();
    let cfg = AgentConfig {
        lifeline: Some(rd),
        ..AgentConfig::default()
    };
    let agent = std::thread::spawn(move || run_agent(listener, cfg));
    let c = connect(&sock).await;
    let mut p = c.exec(sh("echo up; sleep 100")).await.unwrap();
    let pid = p.pid();
    assert_eq!(
        p.next_event().await.unwrap(),
        Some(ProcessEvent::Stdout(bytes::Bytes::from_static(b"up\n")))
    );
    drop(wr);
    let r = tokio::task::spawn_blocking(move || agent.join().unwrap())
        .await
        .unwrap();
    assert!(r.is_ok(), "{r:?}");
    wait_gone(pid).await;
    // The connection is closed with a reason.
    let e = c.ping().await.unwrap_err();
    assert!(e.to_string().contains("closed"), "{e}");
}

#[tokio::test]
async fn as_pid1_of_a_pid_namespace_it_reaps_everything() {
    common::require_root();
    assert!(
        Command::new("unshare").arg("--version").output().is_ok(),
        "unshare(1) is missing: apt-get install util-linux"
    );
    let dir = TempDir::new("pid1");
    let sock = dir.join("a.sock");
    let mut ns = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(env!("CARGO_BIN_EXE_sandlot-guest-agent"))
        .arg("--listen")
        .arg(&sock)
        .spawn()
        .unwrap();
    let c = connect(&sock).await;
    let o = c
        .exec(sh("echo $PPID"))
        .await
        .unwrap()
        .output()
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8(o.stdout).unwrap(),
        "1\n",
        "the agent is PID 1"
    );
    // Double-forked daemons escape every session the agent made; as PID 1 it still
    // reaps them.
    for _ in 0..5 {
        let o = c
            .exec(sh("setsid sh -c 'sleep 0.1 &' ; (sleep 0.1 &) ; echo ok"))
            .await
            .unwrap()
            .output()
            .await
            .unwrap();
        assert!(o.status.success());
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let o = c
        .exec(sh(
            "for f in /proc/[0-9]*/stat; do cut -d' ' -f1-3 $f; done",
        ))
        .await
        .unwrap()
        .output()
        .await
        .unwrap();
    let table = String::from_utf8(o.stdout).unwrap();
    assert!(
        !table.lines().any(|l| l.split(' ').nth(2) == Some("Z")),
        "zombies in the namespace:\n{table}"
    );
    // Processes started detached are killed at shutdown, with the namespace.
    let mut req = sh("sleep 100");
    req.detached = true;
    c.exec(req).await.unwrap();
    c.shutdown().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let st = loop {
        if let Some(s) = ns.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "agent (PID 1) did not exit");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(st.success(), "{st:?}");
}

/// An agent serving `sock` with `cfg` on a thread, and a client of it.
async fn start(
    sock: &Path,
    cfg: AgentConfig,
) -> (GuestClient, std::thread::JoinHandle<std::io::Result<()>>) {
    let listener = UnixListener::bind(sock).unwrap();
    let agent = std::thread::spawn(move || run_agent(listener, cfg));
    (connect(sock).await, agent)
}

/// Shuts the agent down through `c` and checks that it returned cleanly.
async fn stop(c: GuestClient, agent: std::thread::JoinHandle<std::io::Result<()>>) {
    c.shutdown().await.unwrap();
    let r = tokio::task::spawn_blocking(move || agent.join().unwrap())
        .await
        .unwrap();
    assert!(r.is_ok(), "{r:?}");
}

/// Waits until the held first command has filled the retention (64 KiB).
async fn filled(c: &GuestClient) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ps = c.list_processes().await.unwrap();
        if ps.iter().any(|p| p.stdout.produced >= 64 * 1024) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the first command never filled: {ps:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The first command of the agent's config, attached to from its first byte.
fn first_process() -> sandlot_proto::guest::AttachRequest {
    sandlot_proto::guest::AttachRequest {
        id: sandlot_proto::guest::FIRST_PROCESS,
        stdout_from: Some(0),
        stderr_from: Some(0),
    }
}

#[tokio::test]
async fn the_first_command_keeps_all_its_output_until_attached_and_a_failed_one_says_why() {
    common::require_root();
    let dir = TempDir::new("first");
    // Four times what the agent retains of a stream nobody reads: it arrives whole
    // only if the agent held it for the first attach.
    let (c, agent) = start(
        &dir.join("a.sock"),
        AgentConfig {
            output_retention: 64 * 1024,
            first_exec: Some(sh("head -c 262144 /dev/zero; echo done >&2; exit 7")),
            ..AgentConfig::default()
        },
    )
    .await;
    // Whatever the command could write before anyone attached, it has written: the
    // retention and no more, kept from its first byte; the command waits.
    filled(&c).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let held = c.list_processes().await.unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].id, sandlot_proto::guest::FIRST_PROCESS);
    assert_eq!(held[0].stdout.retained_from, 0);
    assert_eq!(held[0].stdout.produced, 64 * 1024);
    assert!(held[0].exit.is_none(), "{held:?}");
    let out = c
        .attach_with(first_process())
        .await
        .unwrap()
        .output()
        .await
        .unwrap();
    assert_eq!(out.stdout.len(), 262_144, "stdout lost bytes");
    assert!(out.stdout.iter().all(|b| *b == 0));
    assert_eq!(out.stderr, b"done\n");
    assert_eq!(out.status.code, Some(7));
    stop(c, agent).await;

    // A client that attaches from now on, not from the first byte, releases a held
    // command that filled the retention: it runs to its end.
    let (c, agent) = start(
        &dir.join("c.sock"),
        AgentConfig {
            output_retention: 64 * 1024,
            first_exec: Some(sh("head -c 262144 /dev/zero; exit 5")),
            ..AgentConfig::default()
        },
    )
    .await;
    filled(&c).await;
    let mut p = c
        .attach(sandlot_proto::guest::FIRST_PROCESS, None)
        .await
        .unwrap();
    let st = tokio::time::timeout(Duration::from_secs(10), p.wait())
        .await
        .expect("the held command never ran on after a later attach")
        .unwrap();
    assert_eq!(st.code, Some(5));
    stop(c, agent).await;

    // A first command that cannot start: attaching to it says why, as an exec would.
    let (c, agent) = start(
        &dir.join("b.sock"),
        AgentConfig {
            first_exec: Some(sandlot_proto::guest::ExecRequest::new(["/no/such/program"])),
            ..AgentConfig::default()
        },
    )
    .await;
    let e = c.attach_with(first_process()).await.unwrap_err();
    assert_eq!(
        e.code(),
        Some(sandlot_proto::guest::ErrorCode::NotFound),
        "{e}"
    );
    assert!(
        e.to_string().starts_with("exec \"/no/such/program\""),
        "{e}"
    );
    // Any other id is simply unknown.
    let e = c
        .attach(sandlot_proto::guest::ProcessId(2), None)
        .await
        .unwrap_err();
    assert!(!e.to_string().contains("/no/such/program"), "{e}");
    // The next process does not take the first one's id.
    let mut next = c.exec(sh("true")).await.unwrap();
    assert_ne!(next.id(), sandlot_proto::guest::FIRST_PROCESS);
    next.wait().await.unwrap();
    let e = c.attach_with(first_process()).await.unwrap_err();
    assert!(
        e.to_string().starts_with("exec \"/no/such/program\""),
        "{e}"
    );
    stop(c, agent).await;

    // A start refused before the spawn (a user the sandbox does not have) reads as
    // the refused exec of the same request reads.
    let mut req = sh("true");
    req.user = Some("no-such-user".into());
    let (c, agent) = start(
        &dir.join("d.sock"),
        AgentConfig {
            first_exec: Some(req.clone()),
            ..AgentConfig::default()
        },
    )
    .await;
    let first = c.attach_with(first_process()).await.unwrap_err();
    let again = c.exec(req).await.unwrap_err();
    assert_eq!(first.code(), again.code(), "{first} / {again}");
    assert_eq!(first.to_string(), again.to_string());
    stop(c, agent).await;
}
