//! Auto-pause and resume on demand through a real daemon: a sandbox whose idle
//! or lifetime timeout passes with the `pause` policy is paused instead of ended
//! (gVisor: with its memory; namespace: its files), and with `auto_resume` an
//! exec on it resumes it (once, for concurrent callers); without, it answers 409.
//! An auto-pause the paused cap refuses ends it, saying why; a delete during a
//! resume on demand ends the sandbox; a resume past the maximum lifetime is
//! refused and leaves it paused. Needs root (and Debian's `runsc` for the
//! gVisor tests). Only namespace sandboxes are paused and resumed more than once.

mod api_support;

use api_support::{event_kinds, eventually, leftovers_of, rt, spec_body, Daemon};
use sandlot_client::api::lifecycle::OnExpiry;
use sandlot_client::api::PauseKind;
use sandlot_client::{Client, CreateSandbox, ExecBody, SandboxState};
use serde_json::json;

/// Pauses after 2 s idle: long enough that a loaded machine's stall between a
/// test's call and its next look does not pause it again in between.
fn idle_pausing(isolation: &str, auto_resume: bool) -> CreateSandbox {
    CreateSandbox {
        request: sandlot_client::CreateSandboxRequest {
            idle_timeout: Some(Some(sandlot_proto::units::Seconds::secs(2))),
            on_idle: Some(OnExpiry::Pause),
            auto_resume: Some(auto_resume),
            ..Default::default()
        },
        ..spec_body(json!({"isolation": isolation}))
    }
}

async fn sh(c: &Client, id: &str, script: &str) -> String {
    let o = c.run(id, &["/bin/sh", "-c", script]).await.unwrap();
    assert_eq!(
        o.exit.code,
        Some(0),
        "{script}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Waits until sandbox `id` is in `state`.
async fn wait_state(c: &Client, id: &str, state: SandboxState) {
    eventually(60, &format!("sandbox {id} to be {state:?}"), || {
        let (c, id) = (c.clone(), id.to_string());
        async move { c.get_sandbox(&id).await.is_ok_and(|s| s.state == state) }
    })
    .await;
}

/// Waits until nothing of sandbox `id` is left on the host (its teardown
/// finishes after the delete answers).
async fn no_leftovers(id: &str) {
    eventually(30, &format!("the leftovers of {id} to go"), || async {
        leftovers_of(id).is_empty()
    })
    .await;
}

fn count(kinds: &[String], kind: &str) -> usize {
    kinds.iter().filter(|k| *k == kind).count()
}

#[test]
fn an_idle_namespace_sandbox_pauses_and_an_exec_resumes_it_with_its_files() {
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        let s = c
            .create_sandbox(&idle_pausing("namespace", true))
            .await
            .unwrap();
        assert_eq!((s.on_idle, s.auto_resume), (OnExpiry::Pause, true));
        sh(&c, &s.id, "echo kept > /root/note").await;
        wait_state(&c, &s.id, SandboxState::Paused).await;
        let p = c.get_sandbox(&s.id).await.unwrap();
        assert_eq!((p.pause, p.end_reason), (Some(PauseKind::Filesystem), None));
        assert!(event_kinds(&c, &s.id)
            .await
            .contains(&"auto_paused".to_string()));
        // The exec resumes it and runs.
        assert_eq!(sh(&c, &s.id, "cat /root/note").await, "kept\n");
        let r = c.get_sandbox(&s.id).await.unwrap();
        assert_eq!(r.state, SandboxState::Running);
        c.delete_sandbox(&s.id).await.unwrap();
        no_leftovers(&s.id).await;
    });
}

#[test]
fn an_idle_gvisor_sandbox_pauses_and_an_exec_resumes_it_with_its_process_and_files() {
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        let s = c
            .create_sandbox(&idle_pausing("gvisor", true))
            .await
            .unwrap();
        sh(&c, &s.id, "echo kept > /tmp/note").await;
        c.exec(
            &s.id,
            &ExecBody {
                argv: vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    "echo $$ > /tmp/pid; exec sleep 100000".into(),
                ],
                background: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        eventually(20, "the sleeper to write its pid", || {
            let (c, id) = (c.clone(), s.id.clone());
            async move {
                c.run(&id, &["/bin/cat", "/tmp/pid"])
                    .await
                    .is_ok_and(|o| !o.stdout.is_empty())
            }
        })
        .await;
        let pid = sh(&c, &s.id, "cat /tmp/pid").await.trim().to_string();
        wait_state(&c, &s.id, SandboxState::Paused).await;
        let p = c.get_sandbox(&s.id).await.unwrap();
        assert_eq!(p.pause, Some(PauseKind::Memory));
        // Its process came back (the same pid, alive) and so did its files.
        let out = sh(&c, &s.id, &format!("kill -0 {pid} && cat /tmp/note")).await;
        assert_eq!(out, "kept\n");
        c.delete_sandbox(&s.id).await.unwrap();
        no_leftovers(&s.id).await;
    });
}

#[test]
fn without_auto_resume_an_auto_paused_sandbox_answers_invalid_state() {
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        let s = c
            .create_sandbox(&idle_pausing("namespace", false))
            .await
            .unwrap();
        wait_state(&c, &s.id, SandboxState::Paused).await;
        let e = c.run(&s.id, &["/bin/true"]).await.unwrap_err();
        assert_eq!(
            (e.code(), e.status().map(|s| s.as_u16())),
            (Some("invalid_state"), Some(409)),
            "{e}"
        );
        let e = c.stat(&s.id, "/tmp").await.unwrap_err();
        assert_eq!(e.code(), Some("invalid_state"), "{e}");
        assert_eq!(
            c.get_sandbox(&s.id).await.unwrap().state,
            SandboxState::Paused
        );
        c.delete_sandbox(&s.id).await.unwrap();
    });
}

#[test]
fn concurrent_calls_on_an_auto_paused_sandbox_share_one_resume() {
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        let s = c
            .create_sandbox(&idle_pausing("namespace", true))
            .await
            .unwrap();
        wait_state(&c, &s.id, SandboxState::Paused).await;
        let calls = (0..4).map(|i| {
            let (c, id) = (c.clone(), s.id.clone());
            tokio::spawn(async move {
                c.run(&id, &["/bin/echo", &i.to_string()])
                    .await
                    .map(|o| o.stdout)
            })
        });
        for (i, call) in calls.enumerate() {
            let out = call.await.unwrap().unwrap();
            assert_eq!(out, format!("{i}\n").into_bytes());
        }
        let kinds = event_kinds(&c, &s.id).await;
        assert_eq!(count(&kinds, "resumed"), 1, "{kinds:?}");
        // One resume was started for them all (each would start its own
        // otherwise, all but one then waiting for it).
        assert_eq!(on_demand_resumes(&d, &s.id), 1, "{}", d.log());
        c.delete_sandbox(&s.id).await.unwrap();
    });
}

/// How many resumes on demand of sandbox `id` the daemon started.
fn on_demand_resumes(d: &Daemon, id: &str) -> usize {
    d.log()
        .lines()
        .filter(|l| l.contains("resuming the sandbox on demand") && l.contains(id))
        .count()
}

#[test]
fn a_sandbox_auto_paused_again_after_a_shared_resume_is_resumed_on_demand_again() {
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        let s = c
            .create_sandbox(&idle_pausing("namespace", true))
            .await
            .unwrap();
        for round in 1..=2 {
            wait_state(&c, &s.id, SandboxState::Paused).await;
            let calls: Vec<_> = (0..3)
                .map(|i| {
                    let (c, id) = (c.clone(), s.id.clone());
                    tokio::spawn(async move {
                        c.run(&id, &["/bin/echo", &format!("{round}.{i}")])
                            .await
                            .map(|o| o.stdout)
                    })
                })
                .collect();
            for (i, call) in calls.into_iter().enumerate() {
                let out = call.await.unwrap().unwrap();
                assert_eq!(out, format!("{round}.{i}\n").into_bytes());
            }
            let kinds = event_kinds(&c, &s.id).await;
            assert_eq!(count(&kinds, "resumed"), round, "{kinds:?}");
            assert_eq!(count(&kinds, "auto_paused"), round, "{kinds:?}");
        }
        c.delete_sandbox(&s.id).await.unwrap();
        no_leftovers(&s.id).await;
    });
}

#[test]
fn a_delete_during_a_resume_on_demand_ends_the_sandbox() {
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        let s = c
            .create_sandbox(&idle_pausing("gvisor", true))
            .await
            .unwrap();
        wait_state(&c, &s.id, SandboxState::Paused).await;
        let call = {
            let (c, id) = (c.clone(), s.id.clone());
            tokio::spawn(async move { c.run(&id, &["/bin/true"]).await })
        };
        // Deleted as soon as its resume shows.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let seen = loop {
            let st = c.get_sandbox(&s.id).await.unwrap().state;
            if st != SandboxState::Paused {
                break st;
            }
            assert!(std::time::Instant::now() < deadline, "no resume");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        };
        if seen != SandboxState::Resuming {
            eprintln!("NOTE: the resume had finished before the delete ({seen:?})");
        }
        let gone = c.delete_sandbox(&s.id).await.unwrap();
        assert_eq!(gone.state, SandboxState::Stopped);
        assert_eq!(gone.end_reason.as_deref(), Some("deleted"));
        let _ = call.await.unwrap();
        no_leftovers(&s.id).await;
        assert!(!d.data_dir().join("checkpoints").join(&s.id).exists());
        // It stays deleted: neither running on nor paused again.
        let e = c.get_sandbox(&s.id).await.unwrap();
        assert_eq!(e.state, SandboxState::Stopped);
    });
}

#[test]
fn a_resume_past_the_maximum_lifetime_is_refused_and_the_sandbox_stays_paused() {
    let d = Daemon::start(Some(
        "[limits]\nmax_timeout = \"8s\"\ndefault_timeout = \"8s\"\n",
    ));
    let c = d.client();
    rt().block_on(async {
        let s = c
            .create_sandbox(&idle_pausing("namespace", true))
            .await
            .unwrap();
        wait_state(&c, &s.id, SandboxState::Paused).await;
        let created = sandlot_server::timefmt::parse_rfc3339(&s.created_at).unwrap();
        eventually(30, "the maximum lifetime to pass", || async {
            sandlot_server::store::now_ms() > created + 8_000
        })
        .await;
        for e in [
            c.run(&s.id, &["/bin/true"]).await.unwrap_err(),
            c.resume_sandbox(&s.id).await.unwrap_err(),
        ] {
            assert_eq!(
                (e.status().map(|s| s.as_u16()), e.code()),
                (Some(409), Some("lifetime_exceeded")),
                "{e}"
            );
            assert!(e.to_string().contains("maximum lifetime"), "{e}");
        }
        let p = c.get_sandbox(&s.id).await.unwrap();
        assert_eq!(p.state, SandboxState::Paused);
        assert!(p.pause.is_some());
        c.delete_sandbox(&s.id).await.unwrap();
        no_leftovers(&s.id).await;
    });
}

#[test]
fn a_lifetime_timeout_with_the_pause_policy_pauses_and_the_resume_gives_the_lifetime_again() {
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        let body = CreateSandbox {
            request: sandlot_client::CreateSandboxRequest {
                on_timeout: Some(OnExpiry::Pause),
                auto_resume: Some(true),
                ..Default::default()
            },
            ..spec_body(json!({"isolation": "namespace", "timeout": 3}))
        };
        let s = c.create_sandbox(&body).await.unwrap();
        wait_state(&c, &s.id, SandboxState::Paused).await;
        let before = sandlot_server::store::now_ms();
        sh(&c, &s.id, "true").await;
        let after = sandlot_server::store::now_ms();
        let r = c.get_sandbox(&s.id).await.unwrap();
        assert_eq!(r.state, SandboxState::Running);
        // It runs on with its created 3 s ahead of it again, from its resume
        // (between `before` and `after`), not the nothing it had left when it
        // was paused. A second either way is the slack of the clocks read.
        let expires = sandlot_server::timefmt::parse_rfc3339(&r.expires_at).unwrap();
        assert!(
            (before + 3_000 - 1_000..=after + 3_000 + 1_000).contains(&expires),
            "expires {} is not 3 s after the resume ({before}..{after} ms)",
            r.expires_at
        );
        c.delete_sandbox(&s.id).await.unwrap();
    });
}

#[test]
fn an_auto_pause_past_the_paused_cap_ends_the_sandbox_saying_why() {
    let d = Daemon::start(Some("[limits]\nmax_paused_per_tenant = 1\n"));
    let c = d.client();
    rt().block_on(async {
        let first = c
            .create_sandbox(&spec_body(json!({"isolation": "namespace"})))
            .await
            .unwrap();
        c.pause_sandbox(&first.id).await.unwrap();
        let s = c
            .create_sandbox(&idle_pausing("namespace", true))
            .await
            .unwrap();
        wait_state(&c, &s.id, SandboxState::Stopped).await;
        let e = c.get_sandbox(&s.id).await.unwrap();
        assert_eq!(e.end_reason.as_deref(), Some("idle_timeout"));
        let why = e.error.unwrap_or_default();
        assert!(why.contains("max_paused_per_tenant"), "{why}");
        no_leftovers(&s.id).await;
        c.delete_sandbox(&first.id).await.unwrap();
    });
}

#[test]
fn auto_pauses_at_once_past_the_paused_cap_pause_one_and_end_the_other_saying_why() {
    let d = Daemon::start(Some("[limits]\nmax_paused_per_tenant = 1\n"));
    let c = d.client();
    rt().block_on(async {
        // Idle from their creation: their timeouts pass about together.
        let body = idle_pausing("namespace", true);
        let (a, b) = tokio::join!(c.create_sandbox(&body), c.create_sandbox(&body));
        let ids = [a.unwrap().id, b.unwrap().id];
        for id in &ids {
            eventually(60, &format!("sandbox {id} to pause or end"), || {
                let (c, id) = (c.clone(), id.clone());
                async move {
                    c.get_sandbox(&id).await.is_ok_and(|s| {
                        matches!(s.state, SandboxState::Paused | SandboxState::Stopped)
                    })
                }
            })
            .await;
        }
        let mut states = Vec::new();
        for id in &ids {
            let s = c.get_sandbox(id).await.unwrap();
            if s.state == SandboxState::Stopped {
                assert_eq!(s.end_reason.as_deref(), Some("idle_timeout"));
                let why = s.error.unwrap_or_default();
                assert!(why.contains("max_paused_per_tenant"), "{why}");
            }
            states.push(s.state);
        }
        states.sort_by_key(|s| format!("{s:?}"));
        assert_eq!(states, [SandboxState::Paused, SandboxState::Stopped]);
        for id in &ids {
            c.delete_sandbox(id).await.unwrap();
            no_leftovers(id).await;
        }
    });
}

#[test]
fn a_delete_while_a_sandbox_auto_pauses_ends_it_with_nothing_left() {
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        let s = c
            .create_sandbox(&idle_pausing("gvisor", true))
            .await
            .unwrap();
        // Deleted as soon as its auto-pause shows (pausing, or paused already).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let seen = loop {
            let st = c.get_sandbox(&s.id).await.unwrap().state;
            if matches!(st, SandboxState::Pausing | SandboxState::Paused) {
                break st;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no auto-pause ({st:?})"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        if seen != SandboxState::Pausing {
            eprintln!("NOTE: the auto-pause had finished before the delete ({seen:?})");
        }
        c.delete_sandbox(&s.id).await.unwrap();
        wait_state(&c, &s.id, SandboxState::Stopped).await;
        let e = c.get_sandbox(&s.id).await.unwrap();
        assert_eq!(e.end_reason.as_deref(), Some("deleted"));
        no_leftovers(&s.id).await;
        let checkpoints = d.data_dir().join("checkpoints");
        assert!(!checkpoints.join(&s.id).exists());
        // Nor what a checkpoint cut short had written.
        assert!(!checkpoints.join(format!("{}.partial", s.id)).exists());
        // It stays deleted: no late pause or resume brings it back.
        let e = c.run(&s.id, &["/bin/true"]).await.unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(409), "{e}");
    });
}

#[test]
fn an_auto_pause_gvisor_refuses_ends_the_sandbox_with_the_reason() {
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        // A spec tmpfs mount, whose files a gVisor pause does not keep: the pause
        // is refused, so the idle timeout ends the sandbox as it would have.
        let body = CreateSandbox {
            request: sandlot_client::CreateSandboxRequest {
                idle_timeout: Some(Some(sandlot_proto::units::Seconds::secs(1))),
                on_idle: Some(OnExpiry::Pause),
                auto_resume: Some(true),
                ..Default::default()
            },
            ..spec_body(
                json!({"isolation": "gvisor", "mounts": [{"type": "tmpfs", "target": "/scratch"}]}),
            )
        };
        let s = c.create_sandbox(&body).await.unwrap();
        wait_state(&c, &s.id, SandboxState::Stopped).await;
        let e = c.get_sandbox(&s.id).await.unwrap();
        assert_eq!(e.end_reason.as_deref(), Some("idle_timeout"));
        let why = e.error.unwrap_or_default();
        assert!(
            why.contains("pause failed") && why.contains("/scratch"),
            "{why}"
        );
        assert!(!event_kinds(&c, &s.id)
            .await
            .contains(&"auto_paused".to_string()));
        no_leftovers(&s.id).await;
    });
}

#[test]
fn the_cli_sets_the_lifecycle_and_refuses_an_unknown_policy() {
    let d = Daemon::start(None);
    let c = d.client();
    let (code, id, err) = d.cli(&[
        "create",
        "--idle-timeout",
        "10m",
        "--on-idle",
        "pause",
        "--on-timeout",
        "pause",
        "--auto-resume",
    ]);
    assert_eq!(code, 0, "{err}");
    rt().block_on(async {
        let s = c.get_sandbox(id.trim()).await.unwrap();
        assert_eq!(
            (s.on_idle, s.on_timeout, s.auto_resume),
            (OnExpiry::Pause, OnExpiry::Pause, true)
        );
    });
    let (code, out, err) = d.cli(&["inspect", id.trim()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("on idle pause, on timeout pause, auto-resume"),
        "{out}"
    );
    rt().block_on(async { c.delete_sandbox(id.trim()).await.unwrap() });
    let (code, _, err) = d.cli(&["create", "--on-timeout", "sleep"]);
    assert_ne!(code, 0);
    assert!(err.contains("expected kill or pause"), "{err}");
}

#[test]
fn an_auto_paused_sandbox_keeps_its_lifecycle_across_a_daemon_restart() {
    let mut d = Daemon::start(None);
    let c = d.client();
    let id = rt().block_on(async {
        let s = c
            .create_sandbox(&idle_pausing("namespace", true))
            .await
            .unwrap();
        sh(&c, &s.id, "echo kept > /root/note").await;
        wait_state(&c, &s.id, SandboxState::Paused).await;
        s.id
    });
    d.kill9();
    d.spawn();
    let c = d.client();
    rt().block_on(async {
        let s = c.get_sandbox(&id).await.unwrap();
        assert_eq!(
            (s.state, s.on_idle, s.auto_resume),
            (SandboxState::Paused, OnExpiry::Pause, true)
        );
        // Still resumed on demand by the new daemon.
        assert_eq!(sh(&c, &id, "cat /root/note").await, "kept\n");
        c.delete_sandbox(&id).await.unwrap();
        no_leftovers(&id).await;
    });
}
