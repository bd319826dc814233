//! Output of background (detached) processes after a reader received the exit: the
//! agent forgets such a process then, and the daemon keeps its last 256 KiB of
//! output for `limits.finished_retention` (docs/api.md, "Output delivery").

mod api_support;

use std::time::Duration;

use api_support::{block_on_within, Daemon};
use sandlot_client::{Client, CreateSandbox, ExecBody, RunOutput};

fn background(script: &str) -> ExecBody {
    ExecBody {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        background: true,
        ..Default::default()
    }
}

/// All output of process `pid` from the given (stdout, stderr) offsets, to its exit.
async fn read_from(c: &Client, id: &str, pid: u64, from: (u64, u64)) -> RunOutput {
    c.output(id, pid, from.0, from.1)
        .await
        .unwrap_or_else(|e| panic!("output of process {pid} from {from:?}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("output of process {pid} from {from:?}: {e}"))
}

/// Starts a background process and waits (which consumes nothing) for its exit.
async fn finished(c: &Client, id: &str, script: &str) -> u64 {
    let p = c.exec(id, &background(script)).await.unwrap();
    assert!(p.background);
    let w = c.wait(id, p.id, 30.0).await.unwrap();
    assert!(w.exited, "{w:?}");
    p.id
}

/// Regression: the second read of a detached process's output answered 410 `gone`
/// at once (the agent forgot the process when the first reader received its exit,
/// and the daemon kept nothing of it), where a foreground process's was replayed.
#[test]
fn output_of_a_detached_process_can_be_read_twice_within_retention() {
    let d = Daemon::start(None);
    let c = d.client();
    block_on_within(120, "reading a detached process twice", async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let id = sb.id.as_str();
        let pid = finished(&c, id, "echo FIFTH; printf oops >&2; exit 4").await;
        let first = read_from(&c, id, pid, (0, 0)).await;
        assert_eq!(
            (&first.stdout[..], &first.stderr[..], first.exit.code),
            (&b"FIFTH\n"[..], &b"oops"[..], Some(4))
        );
        assert_eq!((first.exit.stdout_end, first.exit.stderr_end), (6, 4));
        // Again, whole: the same bytes and exit (replays do not consume).
        for _ in 0..2 {
            let again = read_from(&c, id, pid, (0, 0)).await;
            assert_eq!(
                (&again.stdout[..], &again.stderr[..]),
                (&first.stdout[..], &first.stderr[..])
            );
            assert_eq!(again.exit, first.exit);
        }
        // From offsets, as a reader whose connection dropped resumes.
        let mut s = c.output(id, pid, 3, 1).await.unwrap();
        match s.next_event().await.unwrap().unwrap() {
            sandlot_client::StreamEvent::Attached {
                stdout_from,
                stderr_from,
                ..
            } => assert_eq!((stdout_from, stderr_from), (3, 1)),
            other => panic!("{other:?}"),
        }
        drop(s);
        let rest = read_from(&c, id, pid, (3, 1)).await;
        assert_eq!(
            (&rest.stdout[..], &rest.stderr[..], rest.exit.code),
            (&b"TH\n"[..], &b"ops"[..], Some(4))
        );
        // The listing still reports it, exited with its code.
        let view = c.process(id, pid).await.unwrap();
        assert_eq!(
            (view.state.as_str(), view.exit.and_then(|x| x.code)),
            ("exited", Some(4))
        );

        // More than the daemon keeps (256 KiB): the agent still had all of it for
        // the first reader; afterwards the start is gone and the end is not.
        let big = finished(&c, id, "head -c 409600 /dev/zero | tr '\\0' x; exit 4").await;
        let all = read_from(&c, id, big, (0, 0)).await;
        assert_eq!((all.stdout.len(), all.exit.code), (409_600, Some(4)));
        let e = c
            .output(id, big, 0, 0)
            .await
            .err()
            .expect("the start is no longer retained");
        assert_eq!(e.code(), Some("gone"), "{e}");
        let end = read_from(&c, id, big, (409_600 - 256 * 1024, 0)).await;
        assert_eq!((end.stdout.len(), end.exit.code), (256 * 1024, Some(4)));
        assert!(end.stdout.iter().all(|&b| b == b'x'));

        // A detached process that is still running when read: the reader that
        // sees its exit live makes the daemon keep the output as well.
        let p = c
            .exec(id, &background("sleep 0.5; echo late; exit 4"))
            .await
            .unwrap();
        let live = read_from(&c, id, p.id, (0, 0)).await;
        assert_eq!(
            (&live.stdout[..], live.exit.code),
            (&b"late\n"[..], Some(4))
        );
        let again = read_from(&c, id, p.id, (0, 0)).await;
        assert_eq!((&again.stdout[..], again.exit), (&b"late\n"[..], live.exit));
        c.delete_sandbox(id).await.unwrap();
    });
}

/// After `limits.finished_retention` the kept output is dropped: 410 `gone`.
#[test]
fn output_of_a_detached_process_is_gone_after_retention() {
    let d = Daemon::start(Some("[limits]\nfinished_retention = \"2s\"\n"));
    let c = d.client();
    block_on_within(120, "reading a detached process after retention", async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let id = sb.id.as_str();
        let pid = finished(&c, id, "echo FIFTH; exit 4").await;
        let first = read_from(&c, id, pid, (0, 0)).await;
        assert_eq!(
            (&first.stdout[..], first.exit.code),
            (&b"FIFTH\n"[..], Some(4))
        );
        let again = read_from(&c, id, pid, (2, 0)).await;
        assert_eq!(
            (&again.stdout[..], again.exit.code),
            (&b"FTH\n"[..], Some(4))
        );
        tokio::time::sleep(Duration::from_millis(3500)).await;
        for from in [(0, 0), (2, 0)] {
            let e = c
                .output(id, pid, from.0, from.1)
                .await
                .err()
                .expect("the output is no longer retained");
            assert_eq!(e.code(), Some("gone"), "{e}");
        }
        // The process itself is still known, with its exit.
        let view = c.process(id, pid).await.unwrap();
        assert_eq!(view.exit.and_then(|x| x.code), Some(4));
        c.delete_sandbox(id).await.unwrap();
    });
}
