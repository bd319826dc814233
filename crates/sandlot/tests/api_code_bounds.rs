//! Code contexts against a hostile sandbox: what a kernel or its driver sends back
//! cannot make the daemon hold unbounded memory (a flood of tiny stream events, a
//! result whose JSON expands when parsed), runs waiting for a busy context are
//! capped, and a driver that stops reading its input cannot hold a run past its
//! timeout. The daemon's memory is read as its peak resident set (`VmHWM`, reset
//! through `clear_refs` before each attack).
//! Needs python3 with ipykernel on the host (`host` image).

mod api_support;

use std::time::Duration;

use api_support::{block_on_within, eventually, Daemon};
use sandlot_client::code::{CreateContextBody, Execution, RunCodeBody, RunStatus};
use sandlot_client::{Client, CreateSandbox};
use serde_json::json;

fn cell(code: &str) -> RunCodeBody {
    RunCodeBody {
        code: code.into(),
        ..Default::default()
    }
}

async fn run(c: &Client, id: &str, ctx: &str, code: &str) -> Execution {
    c.run_code(id, ctx, &cell(code)).await.unwrap()
}

/// Starts measuring the peak resident set of process `pid` afresh (from its
/// resident set now) and returns that.
fn reset_peak_rss(pid: i32) -> u64 {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    peak_rss(pid)
}

/// The peak resident set of process `pid`, in bytes.
fn peak_rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kb << 10
}

/// What the daemon may grow by while it serves one of these runs: its output
/// (up to 8 MiB here), a driver line in flight and the answer's copy, with room
/// for the allocator.
const GROWTH_ALLOWED: u64 = 64 << 20;

/// Python that writes `LINE` (bytes) `TIMES` times straight into the driver's
/// event pipe (the one write-only pipe of the driver besides its stderr), as a
/// cell that took over the driver's output would.
const WRITE_TO_DRIVER: &str = r#"
import os
ppid = os.getppid()
def target(fd):
    try:
        return os.readlink('/proc/%d/fd/%d' % (ppid, fd))
    except OSError:
        return None
def write_only(fd):
    with open('/proc/%d/fdinfo/%d' % (ppid, fd)) as f:
        flags = int(f.read().split('flags:')[1].split()[0], 8)
    return flags & 3 == 1
err = target(2)
fds = sorted(int(n) for n in os.listdir('/proc/%d/fd' % ppid))
events = [n for n in fds if n > 2 and (target(n) or '').startswith('pipe:')
          and target(n) != err and write_only(n)]
out = os.open('/proc/%d/fd/%d' % (ppid, events[0]), os.O_WRONLY)
chunk = LINE * 100000
for _ in range(TIMES):
    view = memoryview(chunk)
    while view:
        view = view[os.write(out, view):]
os.close(out)
"#;

fn flood(line: &str, times: usize) -> String {
    WRITE_TO_DRIVER
        .replace("LINE", &format!("{line:?}.encode()"))
        .replace("TIMES", &times.to_string())
}

#[test]
fn a_flood_of_tiny_stream_events_keeps_the_daemon_memory_bounded() {
    let d = Daemon::start(None);
    let c = d.client();
    block_on_within(600, "stream flood", async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let id = sb.id.as_str();
        let ctx = c
            .create_context(id, &CreateContextBody::default())
            .await
            .unwrap();
        run(&c, &sb.id, &ctx.id, "1").await;
        let before = reset_peak_rss(d.pid());
        // Four million one-byte stdout events, then empty ones: each was kept
        // as a chunk of its own (tens of bytes each for one byte of text).
        let x = run(
            &c,
            id,
            &ctx.id,
            &flood("{\"t\":\"stdout\",\"text\":\"x\"}\n", 40),
        )
        .await;
        assert_eq!(x.status, RunStatus::Ok, "{:?}", x.error);
        assert_eq!(x.stdout.concat().matches('x').count(), 4_000_000);
        let x = run(
            &c,
            id,
            &ctx.id,
            &flood("{\"t\":\"stdout\",\"text\":\"\"}\n", 40),
        )
        .await;
        assert_eq!(x.status, RunStatus::Ok, "{:?}", x.error);
        assert!(x.stdout.concat().is_empty(), "{:?}", x.stdout.len());
        // stdout and stderr in turn, so that no two events can be merged: each
        // chunk counts against the run's stream cap with its overhead.
        let x = run(
            &c,
            id,
            &ctx.id,
            &flood(
                "{\"t\":\"stdout\",\"text\":\"x\"}\n{\"t\":\"stderr\",\"text\":\"y\"}\n",
                20,
            ),
        )
        .await;
        let grown = peak_rss(d.pid()).saturating_sub(before);
        assert!(
            grown < GROWTH_ALLOWED,
            "the daemon grew by {} MiB serving the flood",
            grown >> 20
        );
        assert_eq!(x.status, RunStatus::Ok, "{:?}", x.error);
        assert!(x.truncated);
        // The context goes on.
        let x = run(&c, id, &ctx.id, "print('after')").await;
        assert_eq!(x.stdout.concat(), "after\n");
        c.delete_sandbox(id).await.unwrap();
    });
}

#[test]
fn a_result_whose_json_expands_when_parsed_keeps_the_daemon_memory_bounded() {
    let d = Daemon::start(None);
    let c = d.client();
    block_on_within(600, "expanding result", async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let id = sb.id.as_str();
        run(&c, id, "default", "1").await;
        let before = reset_peak_rss(d.pid());
        // 8 MiB of JSON text, a million objects: hundreds of MiB as parsed values.
        let x = run(
            &c,
            id,
            "default",
            "from IPython.display import display\n\
             display({'application/json': [{'a': 0}] * 1_000_000}, raw=True)",
        )
        .await;
        assert_eq!(x.status, RunStatus::Ok, "{:?}", x.error);
        assert_eq!(x.results.len(), 1);
        let items = x.results[0].data["application/json"].as_array().unwrap();
        assert_eq!((items.len(), &items[0]), (1_000_000, &json!({"a": 0})));
        drop(x);
        let grown = peak_rss(d.pid()).saturating_sub(before);
        assert!(
            grown < GROWTH_ALLOWED,
            "the daemon grew by {} MiB for an 8 MiB result",
            grown >> 20
        );
        c.delete_sandbox(id).await.unwrap();
    });
}

/// Runs waiting for a busy context, past which a run is refused.
const MAX_WAITING: usize = 8;

#[test]
fn runs_waiting_for_a_busy_context_are_capped() {
    let d = Daemon::start(None);
    let c = d.client();
    block_on_within(300, "waiting runs", async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let id = sb.id.clone();
        let ctx = c
            .create_context(&id, &CreateContextBody::default())
            .await
            .unwrap()
            .id;
        let busy = tokio::spawn({
            let (c, id, ctx) = (c.clone(), id.clone(), ctx.clone());
            async move {
                run(
                    &c,
                    &id,
                    &ctx,
                    "import os, time\nopen('/tmp/busy', 'w').close()\n\
                     while not os.path.exists('/tmp/go'):\n    time.sleep(0.02)\n'done'",
                )
                .await
            }
        });
        eventually(60, "the busy cell to start", || async {
            c.run(&id, &["test", "-e", "/tmp/busy"])
                .await
                .unwrap()
                .exit
                .code
                == Some(0)
        })
        .await;
        let extra = 3;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for i in 0..MAX_WAITING + extra {
            let (c, id, ctx, tx) = (c.clone(), id.clone(), ctx.clone(), tx.clone());
            tokio::spawn(async move {
                let r = c.run_code(&id, &ctx, &cell(&format!("{i}"))).await;
                let _ = tx.send(r);
            });
        }
        // The runs past the cap are refused at once, while the others wait.
        for _ in 0..extra {
            let r = tokio::time::timeout(Duration::from_secs(60), rx.recv())
                .await
                .expect("no run was refused while more than the cap waited")
                .unwrap();
            let e = r.expect_err("a run answered while the context was busy");
            assert_eq!(e.code(), Some("quota_exceeded"), "{e}");
            assert!(
                e.to_string().contains(&format!("{MAX_WAITING} runs")),
                "{e}"
            );
        }
        c.run(&id, &["touch", "/tmp/go"]).await.unwrap();
        assert_eq!(busy.await.unwrap().status, RunStatus::Ok);
        for _ in 0..MAX_WAITING {
            let x = rx.recv().await.unwrap().unwrap();
            assert_eq!(x.status, RunStatus::Ok, "{:?}", x.error);
        }
        c.delete_sandbox(&id).await.unwrap();
    });
}

#[test]
fn a_driver_that_stops_reading_its_input_cannot_hold_a_run_past_its_timeout() {
    let d = Daemon::start(None);
    let c = d.client();
    block_on_within(300, "a stopped driver", async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let id = sb.id.as_str();
        let ctx = c
            .create_context(id, &CreateContextBody::default())
            .await
            .unwrap()
            .id;
        // The cell stops its driver (SIGSTOP) just after it ended: the driver
        // reads nothing more.
        let x = run(
            &c,
            id,
            &ctx,
            "import os, signal, threading, time\n\
             def stop():\n    time.sleep(0.3)\n    os.kill(os.getppid(), signal.SIGSTOP)\n\
             threading.Thread(target=stop).start()",
        )
        .await;
        assert_eq!(x.status, RunStatus::Ok, "{:?}", x.error);
        eventually(60, "the driver to be stopped", || async {
            let out = c
                .run(
                    id,
                    &[
                        "sh",
                        "-c",
                        "grep -l '^State:.*(stopped)' /proc/[0-9]*/status",
                    ],
                )
                .await
                .unwrap();
            !out.stdout.is_empty()
        })
        .await;
        // A cell larger than the pipe and the agent's window: writing it blocks.
        let mut big = cell(&format!("# {}\n1", "x".repeat(900_000)));
        big.timeout = Some(json!(2));
        let x = tokio::time::timeout(Duration::from_secs(120), c.run_code(id, &ctx, &big))
            .await
            .expect("the run outlived its timeout by minutes")
            .unwrap();
        assert_eq!(x.status, RunStatus::TimedOut, "{x:?}");
        let e = x.error.unwrap();
        assert!(e.value.contains("did not read"), "{}", e.value);
        // The next run has a new interpreter.
        let x = run(&c, id, &ctx, "2").await;
        assert_eq!((x.status, x.restarted), (RunStatus::Ok, true), "{x:?}");
        c.delete_sandbox(id).await.unwrap();
    });
}
