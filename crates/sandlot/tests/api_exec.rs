//! Processes through the API: NDJSON and WebSocket streams, stdin, signals, wait,
//! background processes and re-attach from an offset, 100 concurrent streams.

mod api_support;

use std::time::Duration;

use api_support::{block_on_within, rt, Daemon};
use sandlot_client::stream::Output;
use sandlot_client::{Client, CreateSandbox, ExecBody, RunOutput, StreamEvent};
use serde_json::json;

fn argv(a: &[&str]) -> ExecBody {
    ExecBody {
        argv: a.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// All output of process `pid` from the given (stdout, stderr) offsets, to its exit.
async fn read_from(c: &Client, id: &str, pid: u64, from: (u64, u64)) -> RunOutput {
    c.output(id, pid, from.0, from.1)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap()
}

#[test]
fn stdin_signals_wait_and_reattach() {
    stdin_signals_wait_and_reattach_on(&api_support::suite_isolation());
}

#[test]
fn stdin_signals_wait_and_reattach_on_gvisor() {
    stdin_signals_wait_and_reattach_on("gvisor");
}

/// On the namespace backend and on gVisor: the same API, the same answers.
fn stdin_signals_wait_and_reattach_on(isolation: &str) {
    let d = Daemon::start_isolated(None, isolation);
    let c = d.client();
    rt().block_on(async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let id = sb.id.as_str();
        // Stdin over HTTP, output read afterwards from the start (held for us).
        let mut cat = argv(&["cat"]);
        cat.stdin = true;
        let p = c.exec(id, &cat).await.unwrap();
        assert!(p.stdin);
        c.write_stdin(id, p.id, b"hello ".to_vec(), false)
            .await
            .unwrap();
        c.write_stdin(id, p.id, b"world".to_vec(), true)
            .await
            .unwrap();
        let out = read_from(&c, id, p.id, (0, 0)).await;
        assert_eq!(
            (out.stdout.as_slice(), out.exit.code),
            (&b"hello world"[..], Some(0))
        );
        let e = c
            .write_stdin(id, p.id, b"x".to_vec(), false)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some("conflict"));
        // Wait with a timeout, then a signal.
        let p = c.exec(id, &argv(&["sleep", "60"])).await.unwrap();
        let w = c.wait(id, p.id, 0.3).await.unwrap();
        assert!(!w.exited);
        c.signal(id, p.id, "TERM").await.unwrap();
        let w = c.wait(id, p.id, 10.0).await.unwrap();
        assert_eq!(w.exit.unwrap().signal, Some(15));
        assert_eq!(c.process(id, p.id).await.unwrap().state, "exited");
        // A background process: output is kept for re-attach from any offset.
        let mut bg = argv(&[
            "sh",
            "-c",
            "for i in 1 2 3 4 5; do echo line$i; done; sleep 30",
        ]);
        bg.background = true;
        let p = c.exec(id, &bg).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut s = c.output(id, p.id, 0, 0).await.unwrap();
        match s.next_event().await.unwrap().unwrap() {
            StreamEvent::Attached { stdout_from, .. } => assert_eq!(stdout_from, 0),
            other => panic!("{other:?}"),
        }
        let mut got = Vec::new();
        while got.len() < 30 {
            match s.next().await.unwrap().unwrap() {
                Output::Stdout(_, b) => got.extend(b),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(got, b"line1\nline2\nline3\nline4\nline5\n");
        drop(s); // The client goes away; re-attach from an offset.
        let mut s = c.output(id, p.id, 12, 0).await.unwrap();
        match s.next_event().await.unwrap().unwrap() {
            StreamEvent::Attached { stdout_from, .. } => assert_eq!(stdout_from, 12),
            other => panic!("{other:?}"),
        }
        // The rest arrives from offset 12 on, in as many chunks as the output was
        // written in (one per `echo`, or fewer), each continuing where the last ended.
        let mut rest = Vec::new();
        while rest.len() < 18 {
            match s.next().await.unwrap().unwrap() {
                Output::Stdout(off, b) => {
                    assert_eq!(off, 12 + rest.len() as u64, "offsets continue");
                    rest.extend(b);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(rest, b"line3\nline4\nline5\n");
        drop(s);
        let procs = c.list_processes(id).await.unwrap();
        assert!(
            procs.iter().any(|x| x.id == p.id && x.state == "running"),
            "{procs:?}"
        );
        c.signal(id, p.id, "KILL").await.unwrap();
        assert_eq!(
            c.wait(id, p.id, 10.0).await.unwrap().exit.unwrap().signal,
            Some(9)
        );
        // WebSocket: a PTY shell with stdin, resize and exit.
        let mut body = argv(&["sh"]);
        body.pty = Some(sandlot_client::PtySize { rows: 24, cols: 80 });
        body.stdin = true;
        let mut ws = c.exec_ws(id, &body).await.unwrap();
        assert!(matches!(
            ws.next_event().await.unwrap(),
            Some(StreamEvent::Started { .. })
        ));
        ws.resize(33, 101).await.unwrap();
        ws.write_stdin(b"stty size; exit 4\n").await.unwrap();
        let mut out = Vec::new();
        let code = loop {
            match tokio::time::timeout(Duration::from_secs(10), ws.next())
                .await
                .unwrap()
                .unwrap()
            {
                Some(Output::Stdout(_, b)) => out.extend(b),
                Some(Output::Exit(x)) => break x.code,
                Some(Output::Stderr(..)) => {}
                None => panic!("ended without exit: {}", String::from_utf8_lossy(&out)),
            }
        };
        assert_eq!(code, Some(4));
        assert!(
            String::from_utf8_lossy(&out).contains("33 101"),
            "{}",
            String::from_utf8_lossy(&out)
        );
    });
}

#[test]
fn hundred_concurrent_exec_streams_lose_nothing() {
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        let sb = c
            .create_sandbox(&CreateSandbox {
                spec: serde_json::from_value(json!({"resources": {"memory": "1G", "pids": 2048}}))
                    .unwrap(),
                ..Default::default()
            })
            .await
            .unwrap();
        let tasks: Vec<_> = (0..100)
            .map(|i| {
                let c = c.clone();
                let id = sb.id.clone();
                tokio::spawn(async move {
                    // 256 KiB of stdout (and a little stderr) per process, with a
                    // per-process pattern so crossed streams would show.
                    let script = format!(
                        "yes {i:03}-abcdefghijklmnopqrstuvwxyz | head -c 262144; echo done{i} >&2"
                    );
                    let body = argv(&["sh", "-c", &script]);
                    let (_, mut s) = c.exec_stream(&id, &body).await?;
                    let out = s.collect().await?;
                    Ok::<_, sandlot_client::Error>((i, out))
                })
            })
            .collect();
        for t in tasks {
            let (i, out) = t.await.unwrap().unwrap();
            assert_eq!(out.exit.code, Some(0));
            assert_eq!(out.stdout.len(), 262144, "process {i}");
            let line = format!("{i:03}-abcdefghijklmnopqrstuvwxyz\n");
            let expect: Vec<u8> = line.bytes().cycle().take(262144).collect();
            assert!(out.stdout == expect, "process {i}: output differs");
            assert_eq!(out.stderr, format!("done{i}\n").into_bytes());
            assert_eq!(out.exit.stdout_end, 262144);
        }
        let s = c.get_sandbox(&sb.id).await.unwrap();
        assert_eq!(s.usage.exec_count, 100);
        assert!(s.usage.stdout_bytes >= 100 * 262144);
    });
}

/// SDK request: a reader that lost its connection after the exit was delivered can
/// re-attach at the offset it had reached (not only at 0), within what the daemon
/// keeps; beyond that, 410.
#[test]
fn reattach_at_an_offset_after_the_exit_was_delivered() {
    let d = Daemon::start(None);
    let c = d.client();
    block_on_within(120, "re-attaching at offsets", async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let id = sb.id.as_str();
        let p = c
            .exec(
                id,
                &argv(&["sh", "-c", "printf hello; printf world >&2; exit 3"]),
            )
            .await
            .unwrap();
        let all = read_from(&c, id, p.id, (0, 0)).await;
        assert_eq!(
            (&all.stdout[..], &all.stderr[..], all.exit.code),
            (&b"hello"[..], &b"world"[..], Some(3))
        );
        // The exit reached the first reader: resume mid-stream.
        let again = read_from(&c, id, p.id, (3, 1)).await;
        assert_eq!(
            (&again.stdout[..], &again.stderr[..], again.exit.code),
            (&b"lo"[..], &b"orld"[..], Some(3))
        );
        // And from the start, twice (replays do not consume).
        for _ in 0..2 {
            let whole = read_from(&c, id, p.id, (0, 0)).await;
            assert_eq!(&whole.stdout[..], b"hello");
        }
        // More output than the daemon keeps: the start is gone, the end is not.
        let big = c
            .exec(
                id,
                &argv(&["sh", "-c", "head -c 409600 /dev/zero | tr '\\0' x"]),
            )
            .await
            .unwrap();
        let out = read_from(&c, id, big.id, (0, 0)).await;
        assert_eq!(out.stdout.len(), 409_600);
        let e = c
            .output(id, big.id, 0, 0)
            .await
            .err()
            .expect("the start is dropped");
        assert_eq!(e.code(), Some("gone"), "{e}");
        let end = read_from(&c, id, big.id, (409_590, 0)).await;
        assert_eq!(
            (&end.stdout[..], end.exit.code),
            (&b"xxxxxxxxxx"[..], Some(0))
        );
    });
}

/// A reader that arrives after the process wrote many small pieces (more than a
/// reader's channel holds) still gets them all. The supervisor used to push its
/// parked events into the reader's channel before handing the channel over, and
/// hung once they did not fit.
#[test]
fn a_late_reader_gets_output_parked_in_many_small_writes() {
    let d = Daemon::start(None);
    let c = d.client();
    block_on_within(60, "a late reader of parked output", async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let id = sb.id.as_str();
        let p = c
            .exec(
                id,
                &argv(&[
                    "sh",
                    "-c",
                    "for i in $(seq 40); do echo $i; sleep 0.005; done; sleep 1",
                ]),
            )
            .await
            .unwrap();
        // Let every write be parked as its own piece, while the process still
        // runs, before anyone reads.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let out = read_from(&c, id, p.id, (0, 0)).await;
        let want: String = (1..=40).map(|i| format!("{i}\n")).collect();
        assert_eq!(String::from_utf8_lossy(&out.stdout), want);
        assert_eq!(out.exit.code, Some(0));
    });
}

/// Sandboxed processes must not inherit the daemon's OOM score (a service manager
/// often protects the daemon, e.g. systemd's `OOMScoreAdjust=-900`), and the agent
/// keeps its own: a child of the agent may not open its own `oom_score_adj`, so the
/// agent sets it up for the child at the clone. Raised here (lowering needs
/// `CAP_SYS_RESOURCE`), through the fork server (and a pool claim once the pool is
/// ready), as root, another user and on a terminal.
#[test]
fn processes_start_at_oom_score_0_whatever_the_daemon_runs_at() {
    let d = Daemon::start_with_oom_score_adj(Some("[[pools]]\nname = \"p\"\nsize = 1\n"), 300);
    let c = d.client();
    rt().block_on(async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let id = sb.id.as_str();
        let score = |o: RunOutput| {
            assert_eq!(o.exit.code, Some(0), "{o:?}");
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        };
        let agent_score = ["sh", "-c", include_str!("scripts/agent_oom_score.sh")];
        let agent = score(c.run(id, &agent_score).await.unwrap());
        // The helper's -999 takes where the daemon has CAP_SYS_RESOURCE.
        assert!(
            agent == "300" || agent == "-999",
            "the agent keeps its own score: {agent}"
        );
        assert_eq!(
            score(
                c.run(id, &["cat", "/proc/self/oom_score_adj"])
                    .await
                    .unwrap()
            ),
            "0"
        );
        let mut nobody = argv(&["cat", "/proc/self/oom_score_adj"]);
        nobody.user = Some("nobody".into());
        let (_, mut s) = c.exec_stream(id, &nobody).await.unwrap();
        assert_eq!(score(s.collect().await.unwrap()), "0");
        let mut tty = argv(&["cat", "/proc/self/oom_score_adj"]);
        tty.pty = Some(sandlot_client::PtySize { rows: 24, cols: 80 });
        let (_, mut s) = c.exec_stream(id, &tty).await.unwrap();
        assert_eq!(score(s.collect().await.unwrap()), "0");
        // And the agent's score is back after each child.
        assert_eq!(score(c.run(id, &agent_score).await.unwrap()), agent);
    });
}
