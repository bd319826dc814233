//! Checkpoints, forks and snapshots of gVisor sandboxes of a store image (not
//! the `host` image) through a real daemon: the sandbox's writable layer is
//! saved with its memory image, so a restore in place brings back the files and
//! processes of the checkpoint (files the image had and the sandbox deleted stay
//! deleted, a directory it made again stays opaque), each fork gets a writable
//! layer of its own, and a snapshot holds its image (a delete of the image is
//! refused and a prune keeps it, across a daemon restart) until the snapshot is
//! deleted; a layer whose copy was cut short is never resumed. Needs root and
//! Debian's `runsc`.
//!
//! The store image is a snapshot of a `host` sandbox (`POST
//! /v1/sandboxes/{id}/snapshot`): its layer over the host's programs, so that
//! the counter (`python3`) runs in it.

mod api_support;

use api_support::counter::{copies, entries, probe, sh, start_counter};
use api_support::{eventually, mounts_under, rt, spec_body, Daemon};
use sandlot_client::checkpoint::{CreateCheckpoint, ForkRequest};
use sandlot_client::snapshot::{CreateSnapshot, StartFromSnapshot};
use sandlot_client::{Client, SandboxState};
use serde_json::json;

const IMAGE: &str = "test/py:1";

/// The target of `/tmp/root-link`, the links of `/tmp/h1` and whether `/tmp/h2`
/// is the same file, and the owner and mode of `/tmp/owned`.
const ATTRS: &str = "import os; a, b, o = os.stat('/tmp/h1'), os.stat('/tmp/h2'), os.stat('/tmp/owned'); \
print(os.readlink('/tmp/root-link'), a.st_nlink, a.st_ino == b.st_ino, o.st_uid, o.st_gid, oct(o.st_mode & 0o7777))";

fn store_image() -> sandlot_client::CreateSandbox {
    spec_body(json!({"image": IMAGE, "isolation": "gvisor"}))
}

/// Makes [`IMAGE`]: a `host` sandbox's files (`/tmp/base`, `/tmp/doomed`,
/// `/tmp/dir/old`) committed over the host's programs.
async fn make_image(c: &Client) {
    let h = c
        .create_sandbox(&spec_body(json!({"isolation": "gvisor"})))
        .await
        .unwrap();
    sh(
        c,
        &h.id,
        "echo base > /tmp/base; echo doomed > /tmp/doomed; mkdir /tmp/dir; echo old > /tmp/dir/old",
    )
    .await;
    let img = c
        .call_json(
            "POST",
            &format!("/v1/sandboxes/{}/snapshot", h.id),
            Some(&json!({ "tag": IMAGE })),
        )
        .await
        .unwrap();
    assert_eq!(img["source"], "snapshot", "{img}");
    c.delete_sandbox(&h.id).await.unwrap();
}

/// What of the image's files and the sandbox's own `/tmp/file` sandbox `id` sees.
async fn files(c: &Client, id: &str) -> String {
    sh(
        c,
        id,
        "for f in /tmp/base /tmp/doomed /tmp/dir/old /tmp/dir/new /tmp/file /tmp/later; do \
         if [ -e $f ]; then echo \"$f=$(cat $f)\"; else echo \"$f gone\"; fi; done",
    )
    .await
}

async fn no_leftovers(d: &Daemon) {
    let data = d.data_dir();
    eventually(20, "the copies, layers and mounts to go", || {
        let data = data.clone();
        async move {
            entries(&data.join("sandbox-checkpoints")).is_empty()
                && entries(&data.join("checkpoints")).is_empty()
                && entries(&data.join("rw")).is_empty()
                && mounts_under(&data).is_empty()
        }
    })
    .await;
}

#[test]
fn gvisor_restore_in_place_of_a_store_image_sandbox_brings_back_its_layer_and_memory() {
    let mut d = Daemon::start_isolated(None, "gvisor");
    let c = d.client();
    rt().block_on(async {
        make_image(&c).await;
        let s = c.create_sandbox(&store_image()).await.unwrap();
        start_counter(&c, &s.id).await;
        let (n, pid) = probe(&c, &s.id).await;
        assert_eq!(n, 1);
        // A file of the image deleted (a whiteout), a directory of it made
        // again (opaque), a file of its own, and 2 MiB the quota counts.
        sh(
            &c,
            &s.id,
            "echo one > /tmp/file; rm /tmp/doomed; rm -r /tmp/dir; mkdir /tmp/dir; \
             echo fresh > /tmp/dir/new; dd if=/dev/urandom of=/tmp/big bs=1M count=2 2>/dev/null; \
             truncate -s 1T /tmp/sparse; echo end >> /tmp/sparse; \
             ln -s / /tmp/root-link; echo h > /tmp/h1; ln /tmp/h1 /tmp/h2; \
             touch /tmp/owned; chown 1000:1000 /tmp/owned; chmod 640 /tmp/owned",
        )
        .await;
        let at_checkpoint = files(&c, &s.id).await;
        assert_eq!(
            at_checkpoint,
            "/tmp/base=base\n/tmp/doomed gone\n/tmp/dir/old gone\n/tmp/dir/new=fresh\n/tmp/file=one\n/tmp/later gone\n"
        );
        let t0 = std::time::Instant::now();
        let cp = c
            .create_checkpoint(&s.id, &CreateCheckpoint::default())
            .await
            .unwrap();
        eprintln!(
            "checkpoint of a running store image sandbox: {:?}, {} bytes",
            t0.elapsed(),
            cp.size
        );
        assert!(cp.memory, "{cp:?}");
        // Its layer counts, a terabyte of holes does not.
        assert!(cp.size >= 2 << 20, "its layer counts: {cp:?}");
        assert!(cp.size < 256 << 20, "holes stay holes: {cp:?}");
        // It runs on; files and memory change after the checkpoint.
        assert_eq!(probe(&c, &s.id).await, (2, pid.clone()));
        sh(
            &c,
            &s.id,
            "echo two > /tmp/file; echo later > /tmp/later; echo back > /tmp/doomed; echo old2 > /tmp/dir/old",
        )
        .await;
        assert_eq!(probe(&c, &s.id).await, (3, pid.clone()));
        // A second checkpoint, left paused: the diff of the two is of the
        // image under each writable layer.
        let later = c
            .create_checkpoint(
                &s.id,
                &CreateCheckpoint {
                    name: None,
                    leave_running: false,
                },
            )
            .await
            .unwrap();
        let diff = c.diff_checkpoints(&s.id, &cp.id, &later.id).await.unwrap();
        let has = |v: &[String], p: &str| v.iter().any(|x| x == p);
        assert!(has(&diff.changed, "/tmp/file"), "{diff:?}");
        assert!(has(&diff.added, "/tmp/later"), "{diff:?}");
        assert!(has(&diff.added, "/tmp/doomed"), "{diff:?}");
        assert!(has(&diff.added, "/tmp/dir/old"), "{diff:?}");
        assert!(!has(&diff.changed, "/tmp/base"), "{diff:?}");
        let t0 = std::time::Instant::now();
        let r = c.restore_checkpoint(&s.id, &cp.id).await.unwrap();
        eprintln!("restore in place of a paused store image sandbox: {:?}", t0.elapsed());
        assert_eq!(r.sandbox.state, SandboxState::Running);
        assert_eq!(probe(&c, &s.id).await, (2, pid.clone()));
        assert_eq!(files(&c, &s.id).await, at_checkpoint);
        assert_eq!(
            sh(&c, &s.id, "python3 -c \"import os; print(os.stat('/tmp/sparse').st_size)\"; tail -c 4 /tmp/sparse").await,
            "1099511627780\nend\n"
        );
        // A link stays a link (never followed into the host's root), hard links
        // stay one file, owners and modes stay the sandbox's.
        assert_eq!(
            sh(&c, &s.id, &format!("python3 -c \"{ATTRS}\"")).await,
            "/ 2 True 1000 1000 0o640\n"
        );
        // Restored again from the same checkpoint: its copy stayed as it was.
        sh(&c, &s.id, "echo three > /tmp/file").await;
        c.restore_checkpoint(&s.id, &cp.id).await.unwrap();
        assert_eq!(probe(&c, &s.id).await, (2, pid));
        assert_eq!(files(&c, &s.id).await, at_checkpoint);
        c.delete_sandbox(&s.id).await.unwrap();
        no_leftovers(&d).await;
    });
    d.shutdown();
}

#[test]
fn gvisor_forks_of_a_store_image_sandbox_each_write_a_layer_of_their_own() {
    let mut d = Daemon::start_isolated(None, "gvisor");
    let c = d.client();
    rt().block_on(async {
        make_image(&c).await;
        let s = c.create_sandbox(&store_image()).await.unwrap();
        start_counter(&c, &s.id).await;
        let (n, pid) = probe(&c, &s.id).await;
        assert_eq!(n, 1);
        sh(&c, &s.id, "echo parent > /tmp/file; rm /tmp/doomed").await;
        let t0 = std::time::Instant::now();
        let f = c
            .fork_sandbox(
                &s.id,
                &ForkRequest {
                    count: 2,
                    checkpoint: None,
                },
            )
            .await
            .unwrap();
        eprintln!("fork of 2 of a store image sandbox: {:?}", t0.elapsed());
        let ids: Vec<String> = f.sandboxes.iter().map(|s| s.id.clone()).collect();
        assert_eq!(ids.len(), 2);
        for id in &ids {
            assert_eq!(probe(&c, id).await, (2, pid.clone()), "fork {id}");
            assert_eq!(
                sh(
                    &c,
                    id,
                    "cat /tmp/file /tmp/base; test -e /tmp/doomed || echo gone"
                )
                .await,
                "parent\nbase\ngone\n",
                "fork {id}"
            );
        }
        sh(
            &c,
            &ids[0],
            "echo mine > /tmp/who; echo changed > /tmp/file",
        )
        .await;
        sh(&c, &s.id, "echo later > /tmp/later").await;
        for other in [&ids[1], &s.id] {
            assert_eq!(
                sh(
                    &c,
                    other,
                    "cat /tmp/who 2>/dev/null || echo none; cat /tmp/file"
                )
                .await,
                "none\nparent\n",
                "{other} sees a fork's write"
            );
        }
        for fork in &ids {
            assert_eq!(
                sh(&c, fork, "cat /tmp/later 2>/dev/null || echo none").await,
                "none\n",
                "fork {fork} sees its parent's later write"
            );
        }
        for id in ids.iter().chain([&s.id]) {
            c.delete_sandbox(id).await.unwrap();
        }
        no_leftovers(&d).await;
    });
    d.shutdown();
}

#[test]
fn gvisor_a_snapshot_of_a_store_image_sandbox_holds_its_image_across_a_restart_and_starts_with_its_files_and_processes(
) {
    let mut d = Daemon::start_isolated(None, "gvisor");
    let c = d.client();
    let (snap, pid) = rt().block_on(async {
        make_image(&c).await;
        let s = c.create_sandbox(&store_image()).await.unwrap();
        start_counter(&c, &s.id).await;
        let (_, pid) = probe(&c, &s.id).await;
        sh(&c, &s.id, "echo kept > /tmp/file; rm /tmp/doomed").await;
        let snap = c
            .create_snapshot(
                &s.id,
                &CreateSnapshot {
                    name: Some("store".into()),
                    checkpoint: None,
                },
            )
            .await
            .unwrap();
        assert!(snap.memory, "{snap:?}");
        c.delete_sandbox(&s.id).await.unwrap();
        (snap, pid)
    });
    let refused = |c: Client| async move {
        let e = c
            .call_json("DELETE", &format!("/v1/images/{IMAGE}"), None)
            .await
            .unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(409), "{e}");
    };
    rt().block_on(async {
        refused(c.clone()).await;
        // A prune keeps every layer of an image something holds.
        c.call_json("POST", "/v1/images/prune", None).await.unwrap();
    });
    d.terminate();
    d.spawn();
    let c = d.client();
    rt().block_on(async {
        // The snapshot still holds its image after the restart.
        refused(c.clone()).await;
        let from = c
            .start_from_snapshot(&snap.id, &StartFromSnapshot::default())
            .await
            .unwrap();
        assert_eq!(probe(&c, &from.id).await, (2, pid), "its memory");
        assert_eq!(
            sh(
                &c,
                &from.id,
                "cat /tmp/file /tmp/base; test -e /tmp/doomed || echo gone"
            )
            .await,
            "kept\nbase\ngone\n"
        );
        c.delete_sandbox(&from.id).await.unwrap();
        // Its last holder gone, the image goes when asked.
        c.delete_snapshot(&snap.id).await.unwrap();
        assert!(!entries(&copies(&d)).contains(&snap.id));
        c.call_json("DELETE", &format!("/v1/images/{IMAGE}"), None)
            .await
            .unwrap();
        no_leftovers(&d).await;
    });
    d.shutdown();
}

/// A writable layer marked incomplete (what a daemon stopped while copying a
/// checkpoint's layer into it leaves) is never resumed: the sandbox stays
/// paused, 409 `checkpoint_damaged`, and is deleted whole.
#[test]
fn gvisor_a_store_image_sandbox_whose_layer_copy_was_cut_short_is_never_resumed() {
    let mut d = Daemon::start_isolated(None, "gvisor");
    let c = d.client();
    rt().block_on(async {
        make_image(&c).await;
        let s = c.create_sandbox(&store_image()).await.unwrap();
        sh(&c, &s.id, "echo mine > /tmp/file").await;
        c.pause_sandbox(&s.id).await.unwrap();
        let rw = d.data_dir().join("rw").join(&s.id);
        std::fs::write(rw.join("incomplete"), "").unwrap();
        let e = c.resume_sandbox(&s.id).await.unwrap_err();
        assert_eq!(
            (e.status().map(|s| s.as_u16()), e.code()),
            (Some(409), Some("checkpoint_damaged")),
            "{e}"
        );
        assert!(
            !e.to_string().contains(d.data_dir().to_str().unwrap()),
            "{e}"
        );
        assert_eq!(
            c.get_sandbox(&s.id).await.unwrap().state,
            SandboxState::Paused
        );
        // Neither is it checkpointed, forked or snapshotted from.
        let e = c
            .create_checkpoint(&s.id, &CreateCheckpoint::default())
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some("checkpoint_damaged"), "{e}");
        c.delete_sandbox(&s.id).await.unwrap();
        no_leftovers(&d).await;
    });
    d.shutdown();
}

/// The daemon's data directory under a shared mount (what systemd makes of
/// `/`): a restore in place moves no mount (a mount move fails under a shared
/// parent), so the sandbox comes back whole, twice.
#[test]
fn gvisor_a_restore_in_place_under_a_shared_mount_brings_the_sandbox_back() {
    use std::process::Command;
    let mut d = Daemon::start_isolated(None, "gvisor");
    let rw = d.data_dir().join("rw");
    let mount = |args: &[&str]| {
        let ok = Command::new("mount").args(args).status().unwrap().success();
        assert!(ok, "mount {args:?}");
    };
    std::fs::create_dir_all(&rw).unwrap();
    let rw_s = rw.to_str().unwrap().to_string();
    mount(&["--bind", &rw_s, &rw_s]);
    // Unmounted however the test ends.
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(rw.clone());
    mount(&["--make-shared", &rw_s]);
    let c = d.client();
    rt().block_on(async {
        make_image(&c).await;
        let s = c.create_sandbox(&store_image()).await.unwrap();
        start_counter(&c, &s.id).await;
        let (_, pid) = probe(&c, &s.id).await;
        sh(&c, &s.id, "echo one > /tmp/file").await;
        let at_checkpoint = files(&c, &s.id).await;
        let cp = c
            .create_checkpoint(&s.id, &CreateCheckpoint::default())
            .await
            .unwrap();
        for _ in 0..2 {
            sh(&c, &s.id, "echo two > /tmp/file; echo later > /tmp/later").await;
            let r = c.restore_checkpoint(&s.id, &cp.id).await.unwrap();
            assert_eq!(r.sandbox.state, SandboxState::Running);
            assert_eq!(probe(&c, &s.id).await, (2, pid.clone()));
            assert_eq!(files(&c, &s.id).await, at_checkpoint);
        }
        c.delete_sandbox(&s.id).await.unwrap();
    });
    d.shutdown();
}
