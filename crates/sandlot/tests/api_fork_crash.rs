//! A daemon killed (SIGKILL) while a fork starts its sandboxes: after the
//! restart every fork of the request is either running or paused (never stuck
//! `resuming`); a paused one resumes into the checkpoint's state, or, if the
//! daemon died while copying the checkpoint for it, is refused as damaged and
//! never resumed from the partial copy; deleting them all leaves nothing on the
//! host: no runsc process, mount, cgroup, checkpoint directory or writable
//! layer. For the `host` image and a store image. Needs root and Debian's
//! `runsc`.

mod api_support;

use std::time::{Duration, Instant};

use api_support::{eventually, rt, spec_body, Daemon};
use sandlot_client::checkpoint::{CreateCheckpoint, ForkRequest};
use sandlot_client::{Client, ListFilter, SandboxState};
use serde_json::json;

async fn sh(c: &Client, id: &str, script: &str) -> String {
    let o = c.run(id, &["/bin/sh", "-c", script]).await.unwrap();
    assert_eq!(o.exit.code, Some(0), "{script}");
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn a_daemon_killed_during_a_fork_leaves_each_fork_running_or_paused_and_nothing_stray() {
    killed_during_a_fork(false);
}

/// The same for a sandbox of a store image (a `host` sandbox's snapshot): each
/// fork's own writable layer is either whole or refused as damaged.
#[test]
fn a_daemon_killed_during_a_fork_of_a_store_image_sandbox_leaves_no_fork_on_a_partial_layer() {
    killed_during_a_fork(true);
}

fn killed_during_a_fork(store_image: bool) {
    let mut d = Daemon::start_isolated(None, "gvisor");
    let c = d.client();
    // The `host` sandbox the store image is made of, ended before the fork.
    let mut maker = None;
    let (parent, cp) = rt().block_on(async {
        let mut spec = json!({ "isolation": "gvisor" });
        if store_image {
            let h = c.create_sandbox(&spec_body(spec.clone())).await.unwrap();
            let img = c
                .call_json(
                    "POST",
                    &format!("/v1/sandboxes/{}/snapshot", h.id),
                    Some(&json!({ "tag": "test/crash:1" })),
                )
                .await
                .unwrap();
            assert_eq!(img["source"], "snapshot", "{img}");
            c.delete_sandbox(&h.id).await.unwrap();
            maker = Some(h.id);
            spec["image"] = json!("test/crash:1");
        }
        let s = c.create_sandbox(&spec_body(spec)).await.unwrap();
        sh(&c, &s.id, "echo from-the-checkpoint > /tmp/kept").await;
        let cp = c
            .create_checkpoint(&s.id, &CreateCheckpoint::default())
            .await
            .unwrap();
        (s.id, cp.id)
    });
    // The fork runs on a thread of its own; this one watches for its sandboxes
    // to be admitted (`resuming`) and kills the daemon then, mid-start.
    let forker = {
        let (c, parent, cp) = (c.clone(), parent.clone(), cp.clone());
        std::thread::spawn(move || {
            rt().block_on(c.fork_sandbox(
                &parent,
                &ForkRequest {
                    count: 3,
                    checkpoint: Some(cp),
                },
            ))
        })
    };
    let all = ListFilter {
        states: vec!["all".into()],
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let resuming = rt().block_on(async {
        loop {
            let l = c.list_sandboxes(&all).await.unwrap();
            let r: Vec<String> = l
                .iter()
                .filter(|s| {
                    s.id != parent
                        && Some(&s.id) != maker.as_ref()
                        && s.state == SandboxState::Resuming
                })
                .map(|s| s.id.clone())
                .collect();
            if !r.is_empty() {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "no fork was seen resuming in 30 s: {l:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    d.kill9();
    // The request died with the daemon.
    assert!(forker.join().unwrap().is_err());
    d.spawn();
    let c = d.client();
    rt().block_on(async {
        let forks: Vec<_> = c
            .list_sandboxes(&all)
            .await
            .unwrap()
            .into_iter()
            .filter(|s| s.id != parent && Some(&s.id) != maker.as_ref())
            .collect();
        assert_eq!(
            forks.len(),
            3,
            "every fork of the request has a record: {forks:?}"
        );
        let states: Vec<_> = forks.iter().map(|f| f.state).collect();
        eprintln!(
            "forks after the restart: {states:?} ({} seen resuming)",
            resuming.len()
        );
        assert!(resuming.iter().all(|id| forks.iter().any(|f| &f.id == id)));
        for f in &forks {
            assert!(
                matches!(f.state, SandboxState::Running | SandboxState::Paused),
                "fork {} is {:?} after the restart",
                f.id,
                f.state
            );
        }
        // A fork resumes into the checkpoint's state, or, when the daemon died
        // while it copied the checkpoint, is refused as damaged (never resumed
        // from a partial copy) and can be deleted.
        let mut damaged = 0;
        for f in &forks {
            if f.state == SandboxState::Paused {
                if let Err(e) = c.resume_sandbox(&f.id).await {
                    assert_eq!(e.code(), Some("checkpoint_damaged"), "fork {}: {e}", f.id);
                    assert_eq!(
                        c.get_sandbox(&f.id).await.unwrap().state,
                        SandboxState::Paused
                    );
                    c.delete_sandbox(&f.id).await.unwrap();
                    damaged += 1;
                    continue;
                }
            }
            assert_eq!(
                sh(&c, &f.id, "cat /tmp/kept").await,
                "from-the-checkpoint\n",
                "fork {}",
                f.id
            );
        }
        eprintln!("{damaged} of the forks were refused as damaged");
        // The checkpoint itself is intact: another fork from it starts.
        let again = c
            .fork_sandbox(
                &parent,
                &ForkRequest {
                    count: 1,
                    checkpoint: Some(cp.clone()),
                },
            )
            .await
            .unwrap();
        assert_eq!(
            sh(&c, &again.sandboxes[0].id, "cat /tmp/kept").await,
            "from-the-checkpoint\n"
        );
        for s in c.list_sandboxes(&Default::default()).await.unwrap() {
            c.delete_sandbox(&s.id).await.unwrap();
        }
        // The pauses' and checkpoints' directories go with their sandboxes.
        let data = d.data_dir();
        eventually(20, "the checkpoint directories to go", || {
            let data = data.clone();
            async move {
                ["checkpoints", "sandbox-checkpoints", "rw"]
                    .iter()
                    .all(|sub| {
                        std::fs::read_dir(data.join(sub)).map_or(true, |mut rd| rd.next().is_none())
                    })
            }
        })
        .await;
    });
    // Stops the daemon and checks that nothing of the sandboxes is left
    // (processes, mounts, cgroups).
    d.shutdown();
}
