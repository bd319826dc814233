//! A gVisor sandbox survives a process that allocates past its memory limit:
//! the host cgroup leaves headroom above the declared limit for gVisor's own
//! processes, a watcher sees the use pass the declared limit, and the sandbox's
//! agent kills the largest process, as the kernel's OOM killer does on the
//! namespace backend. Needs root and Debian's `runsc` (scripts/setup.sh).

mod api_support;

use api_support::{block_on_within, spec_body, Daemon};
use sandlot_client::code::{RunCodeBody, RunStatus, DEFAULT_CONTEXT};
use sandlot_client::{ExecBody, SandboxState};
use serde_json::json;

/// Allocates 600 MB and touches every page.
const GROW_600M: &str =
    "x = bytearray(600 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1\nprint('survived')";

fn gvisor_256m() -> sandlot_client::CreateSandbox {
    spec_body(json!({"isolation": "gvisor", "resources": {"memory": "256M"}}))
}

#[test]
fn a_process_past_a_gvisor_sandboxs_memory_limit_is_killed_and_the_sandbox_lives_on() {
    let d = Daemon::start_isolated(None, "gvisor");
    let c = d.client();
    block_on_within(240, "gvisor oom", async {
        let sb = c.create_sandbox(&gvisor_256m()).await.unwrap();
        let id = sb.id.as_str();
        // A small sleeper started before lives through the kill.
        let sleeper = c
            .exec(
                id,
                &ExecBody {
                    argv: vec!["sleep".into(), "600".into()],
                    background: true,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let o = c.run(id, &["python3", "-c", GROW_600M]).await.unwrap();
        // Killed by SIGKILL, as the kernel's OOM killer does on the namespace
        // backend.
        assert_eq!(
            (o.exit.signal, o.exit.shell_code()),
            (Some(9), 137),
            "{:?} {}",
            o.exit,
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!String::from_utf8_lossy(&o.stdout).contains("survived"));
        let s = c.get_sandbox(id).await.unwrap();
        assert_eq!(s.state, SandboxState::Running, "{s:?}\n{}", d.log());
        let after = c.run(id, &["echo", "alive"]).await.unwrap();
        assert_eq!(
            (after.exit.code, after.stdout.as_slice()),
            (Some(0), &b"alive\n"[..])
        );
        let procs = c.list_processes(id).await.unwrap();
        let p = procs.iter().find(|p| p.id == sleeper.id).unwrap();
        assert_eq!(p.state, "running", "{procs:?}");
        assert!(
            d.log().contains("killed the sandbox's largest process"),
            "{}",
            d.log()
        );
        // The kernel told of the crossing (the watch was not left to poll).
        assert!(!d.log().contains("memory watch polls"), "{}", d.log());
        c.delete_sandbox(id).await.unwrap();
    });
}

#[test]
fn a_gvisor_code_cell_past_the_memory_limit_is_named_and_the_context_answers_after() {
    let d = Daemon::start_isolated(None, "gvisor");
    let c = d.client();
    block_on_within(300, "gvisor code oom", async {
        let sb = c.create_sandbox(&gvisor_256m()).await.unwrap();
        let id = sb.id.as_str();
        let run = |code: &str| {
            let body = RunCodeBody {
                code: code.into(),
                ..Default::default()
            };
            let c = c.clone();
            let id = id.to_string();
            async move { c.run_code(&id, DEFAULT_CONTEXT, &body).await.unwrap() }
        };
        run("state = 1").await;
        let x = run(GROW_600M).await;
        // As on the namespace backend (api_code's crash test): the kernel died,
        // named as out of memory; the next run restarts it.
        assert_eq!(x.status, RunStatus::Crashed, "{x:?}");
        let e = x.error.unwrap();
        assert_eq!(e.name, "KernelDied");
        assert!(e.value.contains("out of memory"), "{}", e.value);
        let x = run("'state' in globals()").await;
        assert!(x.restarted, "{x:?}");
        let main = x.results.iter().find(|r| r.is_main_result).unwrap();
        assert_eq!(main.data["text/plain"], "False");
        let s = c.get_sandbox(id).await.unwrap();
        assert_eq!(s.state, SandboxState::Running);
        c.delete_sandbox(id).await.unwrap();
    });
}

#[test]
fn many_processes_past_the_headroom_end_the_gvisor_sandbox_as_out_of_memory() {
    let d = Daemon::start_isolated(None, "gvisor");
    let c = d.client();
    block_on_within(240, "gvisor hard limit", async {
        let sb = c.create_sandbox(&gvisor_256m()).await.unwrap();
        let id = sb.id.as_str();
        // Eight processes of 200 MB, started together once all are up: the
        // watcher kills one at a time (and waits for its memory to come back
        // before the next), so the use passes the hard limit (declared + headroom)
        // first.
        let grow = "import os, time\nwhile not os.path.exists('/tmp/go'): time.sleep(0.01)\n\
                    x = bytearray(200 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1\n\
                    time.sleep(30)";
        let many = format!(
            "for i in $(seq 8); do python3 -c \"{grow}\" & done; sleep 2; touch /tmp/go; wait"
        );
        let _ = c.run(id, &["sh", "-c", &many]).await;
        api_support::eventually(60, "the sandbox to end", || async {
            c.get_sandbox(id).await.unwrap().state == SandboxState::Stopped
        })
        .await;
        let s = c.get_sandbox(id).await.unwrap();
        assert_eq!(s.end_reason.as_deref(), Some("exited"), "{s:?}");
    });
}

#[test]
fn a_gvisor_sandbox_taken_back_after_a_daemon_restart_is_still_watched() {
    let mut d = Daemon::start_isolated(None, "gvisor");
    let id = block_on_within(120, "create", async {
        d.client().create_sandbox(&gvisor_256m()).await.unwrap().id
    });
    // The next daemon finds the declared limit again from the cgroup's hard one.
    d.kill9();
    d.spawn();
    let c = d.client();
    block_on_within(180, "gvisor oom after restart", async {
        let o = c.run(&id, &["python3", "-c", GROW_600M]).await.unwrap();
        assert_eq!(o.exit.signal, Some(9), "{:?}\n{}", o.exit, d.log());
        assert_eq!(
            c.get_sandbox(&id).await.unwrap().state,
            SandboxState::Running
        );
        let after = c.run(&id, &["echo", "alive"]).await.unwrap();
        assert_eq!(after.exit.code, Some(0));
        c.delete_sandbox(&id).await.unwrap();
    });
}
