//! Checkpoints and forks through a real daemon, on both backends. On gVisor a
//! fork continues the checkpoint's processes from their memory, and each fork
//! writes only its own files; on the namespace backend forks get the files and
//! start their processes afresh. A restore in place brings back the earlier
//! state; a sandbox's end removes its checkpoints; a fork past the tenant's quota
//! makes no sandbox; another tenant's ids are not found. A gVisor checkpoint's
//! copy keeps sparse files sparse and hard links linked; a resume or delete
//! racing a checkpoint, restore or fork waits or is refused and leaves nothing. Needs root (and
//! Debian's `runsc` for the gVisor tests). Each gVisor sandbox is restored once
//! at most, but for the restore in place (its checkpoint, then its restore).

mod api_support;

use std::path::Path;

use api_support::counter::{copies, entries, on, probe, sh, start_counter};
use api_support::{eventually, mounts_under, rt, Daemon};
use sandlot_client::checkpoint::{CreateCheckpoint, ForkRequest};
use sandlot_client::SandboxState;

fn keep_running() -> CreateCheckpoint {
    CreateCheckpoint::default()
}

#[test]
fn gvisor_forks_continue_a_counter_from_the_same_value_and_then_diverge() {
    let mut d = Daemon::start_isolated(None, "gvisor");
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&on("gvisor")).await.unwrap();
        start_counter(&c, &s.id).await;
        assert_eq!(probe(&c, &s.id).await.0, 1);
        let (n, pid) = probe(&c, &s.id).await;
        assert_eq!(n, 2);
        sh(&c, &s.id, "echo before > /tmp/before").await;
        let f = c
            .fork_sandbox(
                &s.id,
                &ForkRequest {
                    count: 3,
                    checkpoint: None,
                },
            )
            .await
            .unwrap();
        assert_eq!(f.kind, sandlot_client::api::PauseKind::Memory);
        assert_eq!(f.sandboxes.len(), 3);
        let ids: Vec<String> = f.sandboxes.iter().map(|s| s.id.clone()).collect();
        for fs in &f.sandboxes {
            assert_eq!(fs.state, SandboxState::Running);
            assert_eq!(fs.tenant, s.tenant);
            assert_ne!(fs.id, s.id);
            assert_eq!(fs.spec["isolation"], "gvisor");
        }
        // Each continues the same process from the same count, with the files
        // written before.
        for id in &ids {
            assert_eq!(probe(&c, id).await, (3, pid.clone()), "fork {id}");
            assert_eq!(sh(&c, id, "cat /tmp/before").await, "before\n");
        }
        // The parent runs on from where it was.
        assert_eq!(probe(&c, &s.id).await, (3, pid.clone()));
        // They go apart: counts and files are each one's own.
        assert_eq!(probe(&c, &ids[0]).await.0, 4);
        assert_eq!(probe(&c, &ids[0]).await.0, 5);
        assert_eq!(probe(&c, &ids[1]).await.0, 4);
        sh(&c, &ids[0], "echo mine > /tmp/who").await;
        for other in [&ids[1], &ids[2], &s.id] {
            assert_eq!(
                sh(&c, other, "cat /tmp/who 2>/dev/null || echo none").await,
                "none\n",
                "{other} sees a fork's write"
            );
        }
        // The checkpoint the fork took is gone with it.
        assert!(c.list_checkpoints(&s.id).await.unwrap().is_empty());
        assert!(
            entries(&copies(&d)).is_empty(),
            "{:?}",
            entries(&copies(&d))
        );
    });
    d.shutdown();
}

#[test]
fn gvisor_forks_from_a_named_checkpoint_and_the_checkpoints_go_with_their_sandbox() {
    let mut d = Daemon::start_isolated(None, "gvisor");
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&on("gvisor")).await.unwrap();
        start_counter(&c, &s.id).await;
        assert_eq!(probe(&c, &s.id).await.0, 1);
        sh(&c, &s.id, "echo one > /tmp/file").await;
        // Left paused: the sandbox itself is not restored by this test.
        let cp = c
            .create_checkpoint(
                &s.id,
                &CreateCheckpoint {
                    name: Some("one".into()),
                    leave_running: false,
                },
            )
            .await
            .unwrap();
        assert!(cp.memory);
        assert!(cp.size > 0);
        assert_eq!(
            (cp.name.as_deref(), cp.parent.as_deref()),
            (Some("one"), None)
        );
        assert_eq!(
            c.get_sandbox(&s.id).await.unwrap().state,
            SandboxState::Paused
        );
        // The create's answer tells the sandbox's state; a listing does not.
        assert_eq!(cp.sandbox_state, Some(SandboxState::Paused));
        let cp = sandlot_client::checkpoint::Checkpoint {
            sandbox_state: None,
            ..cp
        };
        let listed = c.list_checkpoints(&s.id).await.unwrap();
        assert_eq!(listed, vec![cp.clone()]);
        // Its copy is root's only.
        use std::os::unix::fs::PermissionsExt;
        let dir = copies(&d).join(&cp.id);
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let f = c
            .fork_sandbox(
                &s.id,
                &ForkRequest {
                    count: 2,
                    checkpoint: Some(cp.id.clone()),
                },
            )
            .await
            .unwrap();
        assert_eq!(f.checkpoint, cp.id);
        for fs in &f.sandboxes {
            assert_eq!(probe(&c, &fs.id).await.0, 2);
            assert_eq!(sh(&c, &fs.id, "cat /tmp/file").await, "one\n");
        }
        // A fork's checkpoint names where its state came from.
        let a = &f.sandboxes[0].id;
        let child = c.create_checkpoint(a, &keep_running()).await;
        // (A second restore of a fork on this runsc may fail: only its record is
        // checked when it does.)
        if let Ok(child) = child {
            assert_eq!(child.parent.as_deref(), Some(cp.id.as_str()));
        }
        // A second checkpoint of the same paused state: nothing differs; one
        // of a fork that wrote a file differs by that file.
        let same = c
            .create_checkpoint(
                &s.id,
                &CreateCheckpoint {
                    name: None,
                    leave_running: false,
                },
            )
            .await
            .unwrap();
        assert_eq!(same.parent.as_deref(), Some(cp.id.as_str()));
        assert_eq!(
            std::fs::read_to_string(copies(&d).join(&same.id).join("rootfs/tmp/file")).unwrap(),
            "one\n"
        );
        let diff = c.diff_checkpoints(&s.id, &cp.id, &same.id).await.unwrap();
        assert_eq!(diff, Default::default());
        c.delete_checkpoint(&s.id, &same.id).await.unwrap();
        // Deleting the checkpoint leaves the forks running.
        c.delete_checkpoint(&s.id, &cp.id).await.unwrap();
        assert!(!dir.exists());
        let e = c.delete_checkpoint(&s.id, &cp.id).await.unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(404), "{e}");
        assert_eq!(probe(&c, &f.sandboxes[1].id).await.0, 3);
        // A sandbox's end removes its checkpoints: files and mounts.
        let again = c
            .create_checkpoint(
                &s.id,
                &CreateCheckpoint {
                    name: None,
                    leave_running: false,
                },
            )
            .await
            .unwrap();
        assert!(copies(&d).join(&again.id).exists());
        c.delete_sandbox(&s.id).await.unwrap();
        for fs in &f.sandboxes {
            c.delete_sandbox(&fs.id).await.unwrap();
        }
        eventually(20, "the checkpoints to go", || {
            let dir = copies(&d);
            async move { entries(&dir).is_empty() }
        })
        .await;
        assert!(
            mounts_under(&d.data_dir()).is_empty(),
            "{:?}",
            mounts_under(&d.data_dir())
        );
        assert!(entries(&d.data_dir().join("checkpoints")).is_empty());
    });
    d.shutdown();
}

#[test]
fn gvisor_restore_in_place_brings_back_the_earlier_files_and_processes() {
    let mut d = Daemon::start_isolated(None, "gvisor");
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&on("gvisor")).await.unwrap();
        start_counter(&c, &s.id).await;
        let (n, pid) = probe(&c, &s.id).await;
        assert_eq!(n, 1);
        sh(&c, &s.id, "echo one > /tmp/file").await;
        let cp = c.create_checkpoint(&s.id, &keep_running()).await.unwrap();
        // It runs on from the checkpoint.
        assert_eq!(probe(&c, &s.id).await, (2, pid.clone()));
        sh(&c, &s.id, "echo two > /tmp/file; echo new > /tmp/later").await;
        // A second checkpoint, the sandbox left paused (no restore on the way):
        // the diff of their kept roots names what changed.
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
        assert!(
            diff.changed.iter().any(|p| p.ends_with("tmp/file")),
            "{diff:?}"
        );
        assert!(
            diff.added.iter().any(|p| p.ends_with("tmp/later")),
            "{diff:?}"
        );
        // Restored from paused, to the earlier one.
        let r = c.restore_checkpoint(&s.id, &cp.id).await.unwrap();
        assert_eq!(r.kind, sandlot_client::api::PauseKind::Memory);
        assert_eq!(r.sandbox.state, SandboxState::Running);
        assert_eq!(probe(&c, &s.id).await, (2, pid));
        assert_eq!(sh(&c, &s.id, "cat /tmp/file").await, "one\n");
        assert_eq!(
            sh(&c, &s.id, "cat /tmp/later 2>/dev/null || echo none").await,
            "none\n"
        );
        // Its end leaves no copy, checkpoint directory or mount behind.
        c.delete_sandbox(&s.id).await.unwrap();
        let data = d.data_dir();
        eventually(20, "the checkpoints to go", || {
            let data = data.clone();
            async move {
                entries(&data.join("sandbox-checkpoints")).is_empty()
                    && entries(&data.join("checkpoints")).is_empty()
                    && mounts_under(&data).is_empty()
            }
        })
        .await;
    });
    d.shutdown();
}

#[test]
fn namespace_forks_get_the_files_and_start_their_processes_afresh() {
    let mut d = Daemon::start_isolated(None, "namespace");
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&on("namespace")).await.unwrap();
        sh(
            &c,
            &s.id,
            "echo before > /tmp/before; sleep 1000 >/dev/null 2>&1 &",
        )
        .await;
        let f = c
            .fork_sandbox(
                &s.id,
                &ForkRequest {
                    count: 3,
                    checkpoint: None,
                },
            )
            .await
            .unwrap();
        assert_eq!(f.kind, sandlot_client::api::PauseKind::Filesystem);
        assert_eq!(f.sandboxes.len(), 3);
        let ids: Vec<String> = f.sandboxes.iter().map(|s| s.id.clone()).collect();
        for id in &ids {
            assert_eq!(sh(&c, id, "cat /tmp/before").await, "before\n");
            // Processes started afresh: no sleep of the parent's.
            assert_eq!(
                sh(
                    &c,
                    id,
                    "pgrep -x sleep >/dev/null && echo found || echo none"
                )
                .await,
                "none\n"
            );
        }
        sh(&c, &ids[0], "echo mine > /tmp/who").await;
        for other in [&ids[1], &ids[2], &s.id] {
            assert_eq!(
                sh(&c, other, "cat /tmp/who 2>/dev/null || echo none").await,
                "none\n"
            );
        }
        // The parent ran on untouched.
        assert_eq!(
            sh(
                &c,
                &s.id,
                "pgrep -x sleep >/dev/null && echo found || echo none"
            )
            .await,
            "found\n"
        );
        assert!(c.list_checkpoints(&s.id).await.unwrap().is_empty());
    });
    d.shutdown();
}

#[test]
fn namespace_restore_in_place_brings_back_the_earlier_files() {
    let mut d = Daemon::start_isolated(None, "namespace");
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&on("namespace")).await.unwrap();
        sh(&c, &s.id, "echo one > /tmp/file").await;
        let cp = c.create_checkpoint(&s.id, &keep_running()).await.unwrap();
        assert!(!cp.memory);
        sh(&c, &s.id, "echo two > /tmp/file; echo new > /tmp/later").await;
        let cp2 = c.create_checkpoint(&s.id, &keep_running()).await.unwrap();
        assert_eq!(cp2.parent.as_deref(), Some(cp.id.as_str()));
        // What changed between them: the diff of their images.
        let diff = c.diff_checkpoints(&s.id, &cp.id, &cp2.id).await.unwrap();
        assert!(
            diff.changed.iter().any(|p| p.ends_with("tmp/file")),
            "{diff:?}"
        );
        assert!(
            diff.added.iter().any(|p| p.ends_with("tmp/later")),
            "{diff:?}"
        );
        assert!(diff.removed.is_empty(), "{diff:?}");
        let back = c.diff_checkpoints(&s.id, &cp2.id, &cp.id).await.unwrap();
        assert!(
            back.removed.iter().any(|p| p.ends_with("tmp/later")),
            "{back:?}"
        );
        let r = c.restore_checkpoint(&s.id, &cp.id).await.unwrap();
        assert_eq!(r.kind, sandlot_client::api::PauseKind::Filesystem);
        assert_eq!(sh(&c, &s.id, "cat /tmp/file").await, "one\n");
        assert_eq!(
            sh(&c, &s.id, "cat /tmp/later 2>/dev/null || echo none").await,
            "none\n"
        );
        // And forward again to the later one: the tree keeps both.
        c.restore_checkpoint(&s.id, &cp2.id).await.unwrap();
        assert_eq!(sh(&c, &s.id, "cat /tmp/file").await, "two\n");
        let third = c.create_checkpoint(&s.id, &keep_running()).await.unwrap();
        assert_eq!(third.parent.as_deref(), Some(cp2.id.as_str()));
        assert_eq!(c.list_checkpoints(&s.id).await.unwrap().len(), 3);
        // Its end removes them, and the images they held.
        c.delete_sandbox(&s.id).await.unwrap();
        let snapshots = || {
            let (status, v) = d.raw("GET", "/v1/images", "");
            assert_eq!(status, 200);
            let images = v["images"].as_array().cloned().unwrap_or_default();
            images.iter().filter(|i| i["source"] == "snapshot").count()
        };
        eventually(20, "the checkpoints' images to go", || {
            let n = snapshots();
            async move { n == 0 }
        })
        .await;
    });
    d.shutdown();
}

#[test]
fn a_fork_past_the_tenants_quota_makes_no_sandbox() {
    let mut d = Daemon::start_isolated(Some("[quotas]\nmax_sandboxes = 3\n"), "namespace");
    let c = d.tcp(Some(&d.token("acme")));
    rt().block_on(async {
        let s = c.create_sandbox(&on("namespace")).await.unwrap();
        let cp = c.create_checkpoint(&s.id, &keep_running()).await.unwrap();
        let e = c
            .fork_sandbox(
                &s.id,
                &ForkRequest {
                    count: 3,
                    checkpoint: Some(cp.id.clone()),
                },
            )
            .await
            .unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(429), "{e}");
        assert!(e.to_string().contains("none was made"), "{e}");
        let all = c.list_sandboxes(&Default::default()).await.unwrap();
        assert_eq!(all.len(), 1, "{all:?}");
        // Two fit.
        let f = c
            .fork_sandbox(
                &s.id,
                &ForkRequest {
                    count: 2,
                    checkpoint: Some(cp.id),
                },
            )
            .await
            .unwrap();
        assert_eq!(f.sandboxes.len(), 2);
        // A count out of range is refused before anything.
        let e = c
            .fork_sandbox(
                &s.id,
                &ForkRequest {
                    count: 0,
                    checkpoint: None,
                },
            )
            .await
            .unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(400), "{e}");
    });
    d.shutdown();
}

#[test]
fn a_sandbox_holds_at_most_the_operators_number_of_checkpoints() {
    let mut d = Daemon::start_isolated(
        Some("[limits]\nmax_checkpoints_per_sandbox = 2\n"),
        "namespace",
    );
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&on("namespace")).await.unwrap();
        c.create_checkpoint(&s.id, &keep_running()).await.unwrap();
        let second = c.create_checkpoint(&s.id, &keep_running()).await.unwrap();
        let e = c
            .create_checkpoint(&s.id, &keep_running())
            .await
            .unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(429), "{e}");
        assert!(e.to_string().contains("max_checkpoints_per_sandbox"), "{e}");
        c.delete_checkpoint(&s.id, &second.id).await.unwrap();
        c.create_checkpoint(&s.id, &keep_running()).await.unwrap();
    });
    d.shutdown();
}

#[test]
fn another_tenants_sandbox_and_checkpoints_are_not_found() {
    let mut d = Daemon::start_isolated(None, "namespace");
    let a = d.tcp(Some(&d.token("tenant-a")));
    let b = d.tcp(Some(&d.token("tenant-b")));
    rt().block_on(async {
        let s = a.create_sandbox(&on("namespace")).await.unwrap();
        let cp = a.create_checkpoint(&s.id, &keep_running()).await.unwrap();
        let is_404 = |r: Result<(), sandlot_client::Error>| {
            let e = r.expect_err("refused");
            assert_eq!(e.status().map(|s| s.as_u16()), Some(404), "{e}");
        };
        is_404(b.list_checkpoints(&s.id).await.map(|_| ()));
        is_404(
            b.create_checkpoint(&s.id, &keep_running())
                .await
                .map(|_| ()),
        );
        is_404(b.delete_checkpoint(&s.id, &cp.id).await);
        is_404(b.restore_checkpoint(&s.id, &cp.id).await.map(|_| ()));
        is_404(
            b.fork_sandbox(
                &s.id,
                &ForkRequest {
                    count: 1,
                    checkpoint: Some(cp.id.clone()),
                },
            )
            .await
            .map(|_| ()),
        );
        // Nor may a checkpoint of one sandbox be named on another.
        let other = a.create_sandbox(&on("namespace")).await.unwrap();
        is_404(a.restore_checkpoint(&other.id, &cp.id).await.map(|_| ()));
        assert_eq!(a.list_checkpoints(&s.id).await.unwrap().len(), 1);
    });
    d.shutdown();
}

#[test]
fn the_cli_creates_lists_restores_and_deletes_checkpoints_and_forks() {
    let mut d = Daemon::start_isolated(None, "namespace");
    let c = d.client();
    let id = rt().block_on(async {
        let s = c.create_sandbox(&on("namespace")).await.unwrap();
        sh(&c, &s.id, "echo one > /tmp/file").await;
        s.id
    });
    let (code, cp, err) = d.cli(&["checkpoint", "create", &id, "--name", "first"]);
    assert_eq!(code, 0, "{err}");
    let cp = cp.trim().to_string();
    let (code, out, err) = d.cli(&["checkpoint", "list", &id]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&cp) && out.contains("first"), "{out}");
    rt().block_on(sh(&c, &id, "echo two > /tmp/file"));
    let (code, cp2, err) = d.cli(&["checkpoint", "create", &id]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = d.cli(&["checkpoint", "diff", &id, &cp, cp2.trim()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().any(|l| l == "~ /tmp/file"), "{out}");
    let (code, out, err) = d.cli(&["checkpoint", "restore", &id, &cp]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("processes started afresh"), "{out}");
    assert_eq!(rt().block_on(sh(&c, &id, "cat /tmp/file")), "one\n");
    let (code, out, err) = d.cli(&["fork", &id, "--count", "2", "--checkpoint", &cp]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 2, "{out}");
    let (code, _, err) = d.cli(&["checkpoint", "delete", &id, &cp]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = d.cli(&["checkpoint", "delete", &id, &cp]);
    assert_eq!(code, 125, "{err}");
    assert!(err.contains("not_found"), "{err}");
    d.shutdown();
}

#[test]
fn checkpoints_survive_a_daemon_restart_and_copies_without_a_record_are_removed() {
    for isolation in ["namespace", "gvisor"] {
        let mut d = Daemon::start_isolated(None, isolation);
        let c = d.client();
        let (id, cp) = rt().block_on(async {
            let s = c.create_sandbox(&on(isolation)).await.unwrap();
            sh(&c, &s.id, "echo kept > /tmp/file").await;
            // Left paused on gVisor: this sandbox is never restored itself.
            let cp = c
                .create_checkpoint(
                    &s.id,
                    &CreateCheckpoint {
                        name: Some("kept".into()),
                        leave_running: isolation == "namespace",
                    },
                )
                .await
                .unwrap();
            let cp = sandlot_client::checkpoint::Checkpoint {
                sandbox_state: None,
                ..cp
            };
            (s.id, cp)
        });
        // A copy a crash left without its record.
        let stray = copies(&d).join("cp-00000000deadbeef");
        std::fs::create_dir_all(stray.join("rootfs")).unwrap();
        d.kill9();
        d.spawn();
        let c = d.client();
        rt().block_on(async {
            assert_eq!(c.list_checkpoints(&id).await.unwrap(), vec![cp.clone()]);
            assert!(!stray.exists(), "{isolation}: a stray copy stayed");
            let f = c
                .fork_sandbox(
                    &id,
                    &ForkRequest {
                        count: 1,
                        checkpoint: Some(cp.id.clone()),
                    },
                )
                .await
                .unwrap();
            assert_eq!(
                sh(&c, &f.sandboxes[0].id, "cat /tmp/file").await,
                "kept\n",
                "{isolation}"
            );
        });
        d.shutdown();
    }
}

#[test]
fn a_fork_whose_start_fails_ends_all_its_sandboxes_and_leaves_nothing() {
    let mut d = Daemon::start_isolated(None, "gvisor");
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&on("gvisor")).await.unwrap();
        let cp = c
            .create_checkpoint(
                &s.id,
                &CreateCheckpoint {
                    name: None,
                    leave_running: false,
                },
            )
            .await
            .unwrap();
        // The copy's memory image altered on the disk: every fork's start is
        // refused by the check of its sums.
        let dir = copies(&d).join(&cp.id);
        // The largest file is the memory image.
        let image = entries(&dir)
            .into_iter()
            .map(|n| dir.join(n))
            .filter(|p| p.is_file())
            .max_by_key(|p| std::fs::metadata(p).unwrap().len())
            .expect("a memory image file");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&image)
            .unwrap()
            .set_len(1)
            .unwrap();
        let e = c
            .fork_sandbox(
                &s.id,
                &ForkRequest {
                    count: 2,
                    checkpoint: Some(cp.id.clone()),
                },
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some("checkpoint_damaged"), "{e}");
        // No fork runs or stays paused; each is recorded stopped.
        let all = c.list_sandboxes(&Default::default()).await.unwrap();
        let live: Vec<_> = all
            .iter()
            .filter(|x| x.id != s.id && x.state != SandboxState::Stopped)
            .map(|x| (x.id.clone(), x.state))
            .collect();
        assert!(live.is_empty(), "{live:?}");
        let data = d.data_dir();
        let parent = s.id.clone();
        eventually(20, "the forks' directories to go", || {
            let (data, parent) = (data.clone(), parent.clone());
            async move {
                let ours = format!("checkpoints/{parent}");
                entries(&data.join("checkpoints")) == vec![parent.clone()]
                    && mounts_under(&data.join("checkpoints"))
                        .iter()
                        .all(|m| m.contains(&ours))
            }
        })
        .await;
    });
    d.shutdown();
}

/// Bytes the files under `dir` take on the disk (their allocated blocks, each
/// inode once).
fn allocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let (mut n, mut seen, mut stack) =
        (0, std::collections::HashSet::new(), vec![dir.to_path_buf()]);
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else if seen.insert(m.ino()) {
                n += m.blocks() * 512;
            }
        }
    }
    n
}

#[test]
fn gvisor_a_checkpoint_keeps_sparse_files_sparse_and_hard_links_linked() {
    let mut d = Daemon::start_isolated(None, "gvisor");
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&on("gvisor")).await.unwrap();
        // A terabyte of holes, and 4 MiB linked under 100 names.
        sh(
            &c,
            &s.id,
            "truncate -s 1T /tmp/big && printf end >> /tmp/big && \
             dd if=/dev/zero of=/tmp/f bs=1M count=4 2>/dev/null && \
             mkdir /tmp/l && for i in $(seq 100); do ln /tmp/f /tmp/l/$i; done",
        )
        .await;
        let cp = c.create_checkpoint(&s.id, &keep_running()).await.unwrap();
        assert_eq!(cp.sandbox_state, Some(SandboxState::Running));
        let root = copies(&d).join(&cp.id).join("rootfs");
        let big = std::fs::metadata(root.join("tmp/big")).unwrap();
        assert_eq!(big.len(), (1 << 40) + 3);
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(root.join("tmp/f")).unwrap().nlink(), 101);
        let on_disk = allocated(&root);
        assert!(on_disk < 64 << 20, "the copy takes {on_disk} bytes");
        // A fork's root (a tmpfs of its own) has them as they were.
        let f = c
            .fork_sandbox(
                &s.id,
                &ForkRequest {
                    count: 1,
                    checkpoint: Some(cp.id.clone()),
                },
            )
            .await
            .unwrap();
        let fork = &f.sandboxes[0].id;
        let stat = "python3 -c \"import os; print(os.stat('/tmp/big').st_size, os.stat('/tmp/f').st_nlink)\"";
        assert_eq!(sh(&c, fork, stat).await, "1099511627779 101\n");
        assert_eq!(sh(&c, fork, "tail -c 3 /tmp/big").await, "end");
        c.delete_sandbox(fork).await.unwrap();
        c.delete_sandbox(&s.id).await.unwrap();
    });
    d.shutdown();
}

#[test]
fn gvisor_a_resume_during_a_checkpoint_or_restore_waits_or_is_refused_and_leaves_nothing() {
    let mut d = Daemon::start_isolated(None, "gvisor");
    let c = d.client();
    rt().block_on(async {
        let body = sandlot_client::CreateSandbox {
            request: sandlot_client::CreateSandboxRequest {
                auto_resume: Some(true),
                ..Default::default()
            },
            ..on("gvisor")
        };
        let s = c.create_sandbox(&body).await.unwrap();
        sh(&c, &s.id, "echo before > /tmp/mark").await;
        c.pause_sandbox(&s.id).await.unwrap();
        // A checkpoint of the paused sandbox holds it while its files are
        // copied: a resume, native or on demand (a command), meanwhile waits
        // for it or is refused, never runs under the copy.
        let stay = CreateCheckpoint {
            name: None,
            leave_running: false,
        };
        let (cp, resumed, ran) = tokio::join!(
            c.create_checkpoint(&s.id, &stay),
            c.resume_sandbox(&s.id),
            c.run(&s.id, &["/bin/cat", "/tmp/mark"]),
        );
        let refused = |e: &sandlot_client::Error| e.code() == Some("invalid_state");
        if let Err(e) = &resumed {
            assert!(refused(e), "{e}");
        }
        if let Err(e) = &ran {
            assert!(refused(e), "{e}");
        }
        let cp = match cp {
            Ok(cp) => cp,
            // A resume came first: the checkpoint found it resuming (or running)
            // and was refused, so one of the resumes ran; taken again now.
            Err(e) => {
                assert!(refused(&e), "{e}");
                assert!(resumed.is_ok() || ran.is_ok(), "nothing won the race");
                c.create_checkpoint(&s.id, &stay).await.unwrap()
            }
        };
        // A restore and a resume side by side: the same.
        let (restored, resumed) =
            tokio::join!(c.restore_checkpoint(&s.id, &cp.id), c.resume_sandbox(&s.id),);
        if let Err(e) = &resumed {
            assert!(refused(e), "{e}");
        }
        let _ = restored;
        c.delete_sandbox(&s.id).await.unwrap();
        let data = d.data_dir();
        eventually(20, "the sandbox's directories and mounts to go", || {
            let data = data.clone();
            async move {
                entries(&data.join("checkpoints")).is_empty()
                    && entries(&data.join("sandbox-checkpoints")).is_empty()
                    && mounts_under(&data).is_empty()
            }
        })
        .await;
    });
    d.shutdown();
}

#[test]
fn gvisor_a_delete_of_the_checkpoint_during_a_fork_leaves_every_fork_whole() {
    let mut d = Daemon::start_isolated(None, "gvisor");
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&on("gvisor")).await.unwrap();
        sh(
            &c,
            &s.id,
            "mkdir -p /tmp/tree/a/b && echo whole > /tmp/tree/a/b/f",
        )
        .await;
        let cp = c.create_checkpoint(&s.id, &keep_running()).await.unwrap();
        let req = ForkRequest {
            count: 2,
            checkpoint: Some(cp.id.clone()),
        };
        let (forked, deleted) = tokio::join!(
            c.fork_sandbox(&s.id, &req),
            c.delete_checkpoint(&s.id, &cp.id),
        );
        // One waits for the other's turn or is refused: the delete never takes
        // the copy from under a fork, whose forks all have the files.
        let refused = |e: &sandlot_client::Error| e.code() == Some("invalid_state");
        let made = match (forked, deleted) {
            (Ok(f), Ok(())) => f.sandboxes,
            (Ok(f), Err(e)) => {
                assert!(refused(&e), "{e}");
                f.sandboxes
            }
            (Err(e), Ok(())) => {
                assert!(refused(&e), "{e}");
                Vec::new()
            }
            (Err(a), Err(b)) => panic!("both failed: {a}; {b}"),
        };
        for f in &made {
            assert_eq!(sh(&c, &f.id, "cat /tmp/tree/a/b/f").await, "whole\n");
            c.delete_sandbox(&f.id).await.unwrap();
        }
        // A fork from a fresh checkpoint removes it after.
        let fresh = c
            .fork_sandbox(
                &s.id,
                &ForkRequest {
                    count: 1,
                    checkpoint: None,
                },
            )
            .await
            .unwrap();
        let left: Vec<_> = c
            .list_checkpoints(&s.id)
            .await
            .unwrap()
            .into_iter()
            .map(|x| x.id)
            .filter(|id| *id == fresh.checkpoint)
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert!(!copies(&d).join(&fresh.checkpoint).exists());
        c.delete_sandbox(&fresh.sandboxes[0].id).await.unwrap();
        c.delete_sandbox(&s.id).await.unwrap();
    });
    d.shutdown();
}
