//! Snapshots through a real daemon, on both backends: a snapshot outlives its
//! sandbox and a daemon restart; a sandbox started from a gVisor snapshot
//! continues its processes from their memory, one from a namespace snapshot
//! gets its files and starts afresh; another tenant's snapshot is not found;
//! the tenant's count and disk quotas refuse a snapshot (or a checkpoint) past
//! them (two racing at the limit: one passes) and leave nothing; a snapshot
//! racing a fork or its sandbox's delete is whole or refused; a delete frees its
//! disk, also while a start reads it; the state a crash mid-snapshot leaves is
//! cleaned up at the next start. Needs root (and Debian's `runsc` for the gVisor tests).

mod api_support;

use api_support::counter::{copies, entries, on, probe, sh, start_counter};
use api_support::{eventually, rt, Daemon};
use sandlot_client::checkpoint::CreateCheckpoint;
use sandlot_client::snapshot::{CreateSnapshot, StartFromSnapshot};

/// Images in the daemon's store (the operator sees every one).
fn image_count(d: &Daemon) -> usize {
    let (code, v) = d.raw("GET", "/v1/images", "");
    assert_eq!(code, 200, "{v}");
    v["images"].as_array().map_or(0, Vec::len)
}

fn status(e: &sandlot_client::Error) -> Option<u16> {
    e.status().map(|s| s.as_u16())
}

fn named(name: &str) -> CreateSnapshot {
    CreateSnapshot {
        name: Some(name.into()),
        checkpoint: None,
    }
}

#[test]
fn gvisor_a_sandbox_started_from_a_snapshot_continues_its_processes_after_the_source_is_deleted() {
    let mut d = Daemon::start_isolated(None, "gvisor");
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&on("gvisor")).await.unwrap();
        start_counter(&c, &s.id).await;
        assert_eq!(probe(&c, &s.id).await.0, 1);
        let (n, pid) = probe(&c, &s.id).await;
        assert_eq!(n, 2);
        sh(&c, &s.id, "echo kept > /tmp/file").await;
        let snap = c.create_snapshot(&s.id, &named("counter")).await.unwrap();
        assert!(snap.memory, "{snap:?}");
        assert!(snap.size > 0, "{snap:?}");
        // The sandbox ran on, and its checkpoints are not the snapshot.
        assert_eq!(probe(&c, &s.id).await.0, 3);
        assert!(c.list_checkpoints(&s.id).await.unwrap().is_empty());
        c.delete_sandbox(&s.id).await.unwrap();
        let from = c
            .start_from_snapshot(&snap.id, &StartFromSnapshot::default())
            .await
            .unwrap();
        assert_eq!(
            probe(&c, &from.id).await,
            (3, pid.clone()),
            "the counter continues from its memory"
        );
        assert_eq!(sh(&c, &from.id, "cat /tmp/file").await, "kept\n");
        c.delete_snapshot(&snap.id).await.unwrap();
        assert!(
            !entries(&copies(&d)).contains(&snap.id),
            "a deleted snapshot's copy stayed"
        );
        // The sandbox started from it runs on.
        assert_eq!(probe(&c, &from.id).await.0, 4);
        let e = c.delete_snapshot(&snap.id).await.unwrap_err();
        assert_eq!(status(&e), Some(404), "{e}");
    });
    d.shutdown();
}

#[test]
fn namespace_a_snapshot_outlives_its_sandbox_and_a_daemon_restart_and_starts_afresh_on_its_files_and_its_image_goes_with_the_last_of_them(
) {
    let mut d = Daemon::start_isolated(None, "namespace");
    let c = d.client();
    let images_before = image_count(&d);
    let snap = rt().block_on(async {
        let s = c.create_sandbox(&on("namespace")).await.unwrap();
        sh(
            &c,
            &s.id,
            "echo kept > /tmp/file; sleep 1000 >/dev/null 2>&1 &",
        )
        .await;
        let snap = c.create_snapshot(&s.id, &named("files")).await.unwrap();
        assert!(!snap.memory, "{snap:?}");
        // A paused sandbox is snapshotted too, and stays paused.
        c.pause_sandbox(&s.id).await.unwrap();
        let second = c.create_snapshot(&s.id, &named("paused")).await.unwrap();
        assert_eq!(
            c.get_sandbox(&s.id).await.unwrap().state,
            sandlot_client::SandboxState::Paused
        );
        c.delete_snapshot(&second.id).await.unwrap();
        c.delete_sandbox(&s.id).await.unwrap();
        snap
    });
    d.kill9();
    d.spawn();
    let c = d.client();
    let (a, b) = rt().block_on(async {
        assert_eq!(
            c.list_snapshots(None, None).await.unwrap(),
            vec![snap.clone()]
        );
        assert_eq!(
            c.list_snapshots(None, Some("files")).await.unwrap().len(),
            1
        );
        assert!(c
            .list_snapshots(None, Some("other"))
            .await
            .unwrap()
            .is_empty());
        let a = c
            .start_from_snapshot(&snap.id, &StartFromSnapshot { timeout: Some(60) })
            .await
            .unwrap();
        let b = c
            .start_from_snapshot(&snap.id, &StartFromSnapshot::default())
            .await
            .unwrap();
        assert_eq!(sh(&c, &a.id, "cat /tmp/file").await, "kept\n");
        assert_eq!(
            sh(&c, &a.id, "pgrep -x sleep || true").await,
            "",
            "processes start afresh"
        );
        // Each has files of its own.
        sh(&c, &a.id, "echo changed > /tmp/file").await;
        assert_eq!(sh(&c, &b.id, "cat /tmp/file").await, "kept\n");
        c.delete_snapshot(&snap.id).await.unwrap();
        assert_eq!(sh(&c, &a.id, "cat /tmp/file").await, "changed\n");
        let e = c
            .start_from_snapshot(&snap.id, &StartFromSnapshot::default())
            .await
            .unwrap_err();
        assert_eq!(status(&e), Some(404), "{e}");
        (a.id, b.id)
    });
    // Its image goes once the sandboxes started from it are gone too, also when
    // the daemon restarted in between.
    let images_held = image_count(&d);
    assert!(images_held > images_before, "the sandboxes hold the image");
    d.kill9();
    d.spawn();
    let c = d.client();
    rt().block_on(async {
        assert_eq!(image_count(&d), images_held);
        assert_eq!(sh(&c, &a, "cat /tmp/file").await, "changed\n");
        c.delete_sandbox(&a).await.unwrap();
        assert_eq!(image_count(&d), images_held, "b holds it still");
        c.delete_sandbox(&b).await.unwrap();
        eventually(20, "the snapshot's image to go", || {
            let d = &d;
            async move { image_count(d) == images_before }
        })
        .await;
    });
    d.shutdown();
}

#[test]
fn another_tenants_snapshot_is_not_found() {
    let mut d = Daemon::start_isolated(None, "namespace");
    let a = d.tcp(Some(&d.token("tenant-a")));
    let b = d.tcp(Some(&d.token("tenant-b")));
    rt().block_on(async {
        let s = a.create_sandbox(&on("namespace")).await.unwrap();
        let snap = a
            .create_snapshot(&s.id, &CreateSnapshot::default())
            .await
            .unwrap();
        let is_404 = |r: Result<(), sandlot_client::Error>| {
            let e = r.expect_err("refused");
            assert_eq!(status(&e), Some(404), "{e}");
        };
        is_404(b.get_snapshot(&snap.id).await.map(|_| ()));
        is_404(b.delete_snapshot(&snap.id).await);
        is_404(
            b.start_from_snapshot(&snap.id, &StartFromSnapshot::default())
                .await
                .map(|_| ()),
        );
        is_404(
            b.create_snapshot(&s.id, &CreateSnapshot::default())
                .await
                .map(|_| ()),
        );
        assert!(b.list_snapshots(None, None).await.unwrap().is_empty());
        assert_eq!(a.list_snapshots(None, None).await.unwrap().len(), 1);
        // An id that is not one is not a path either.
        is_404(a.get_snapshot("../sandbox-checkpoints").await.map(|_| ()));
    });
    d.shutdown();
}

#[test]
fn snapshots_past_the_tenants_count_or_disk_quota_are_refused_and_leave_nothing() {
    let mut d = Daemon::start_isolated(
        Some("[quotas]\nmax_snapshots = 1\n[tenants.tiny]\nmax_saved_disk = 1\n"),
        "namespace",
    );
    let c = d.tcp(Some(&d.token("acme")));
    let tiny = d.tcp(Some(&d.token("tiny")));
    rt().block_on(async {
        let s1 = c.create_sandbox(&on("namespace")).await.unwrap();
        let s2 = c.create_sandbox(&on("namespace")).await.unwrap();
        sh(&c, &s1.id, "echo one > /tmp/file").await;
        // Two at once at the limit: one passes, the other is refused.
        let none = CreateSnapshot::default();
        let (r1, r2) = tokio::join!(
            c.create_snapshot(&s1.id, &none),
            c.create_snapshot(&s2.id, &none)
        );
        let (ok, refused): (Vec<_>, Vec<_>) = [r1, r2].into_iter().partition(Result::is_ok);
        assert_eq!((ok.len(), refused.len()), (1, 1), "{ok:?} {refused:?}");
        let e = refused.into_iter().next().unwrap().unwrap_err();
        assert_eq!(status(&e), Some(429), "{e}");
        assert!(e.to_string().contains("max_snapshots"), "{e}");
        assert_eq!(c.list_snapshots(None, None).await.unwrap().len(), 1);
        for s in [&s1, &s2] {
            assert!(
                c.list_checkpoints(&s.id).await.unwrap().is_empty(),
                "the refused snapshot's checkpoint stayed"
            );
        }
        // Deleting one makes room.
        let kept = ok.into_iter().next().unwrap().unwrap();
        c.delete_snapshot(&kept.id).await.unwrap();
        c.create_snapshot(&s2.id, &CreateSnapshot::default())
            .await
            .unwrap();

        // A tenant whose disk quota is one byte: refused once its size is known.
        let t = tiny.create_sandbox(&on("namespace")).await.unwrap();
        sh(&tiny, &t.id, "head -c 100000 /dev/urandom > /tmp/big").await;
        let e = tiny
            .create_snapshot(&t.id, &CreateSnapshot::default())
            .await
            .unwrap_err();
        assert_eq!(status(&e), Some(429), "{e}");
        assert!(e.to_string().contains("max_saved_disk"), "{e}");
        assert!(tiny.list_snapshots(None, None).await.unwrap().is_empty());
        assert!(tiny.list_checkpoints(&t.id).await.unwrap().is_empty());
    });
    d.shutdown();
}

#[test]
fn a_checkpoint_promoted_to_a_snapshot_leaves_its_sandbox_and_a_bad_name_is_refused() {
    let mut d = Daemon::start_isolated(None, "namespace");
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&on("namespace")).await.unwrap();
        sh(&c, &s.id, "echo at-checkpoint > /tmp/file").await;
        let cp = c
            .create_checkpoint(&s.id, &CreateCheckpoint::default())
            .await
            .unwrap();
        sh(&c, &s.id, "echo later > /tmp/file").await;
        let snap = c
            .create_snapshot(
                &s.id,
                &CreateSnapshot {
                    name: None,
                    checkpoint: Some(cp.id.clone()),
                },
            )
            .await
            .unwrap();
        assert!(c.list_checkpoints(&s.id).await.unwrap().is_empty());
        let from = c
            .start_from_snapshot(&snap.id, &StartFromSnapshot::default())
            .await
            .unwrap();
        assert_eq!(sh(&c, &from.id, "cat /tmp/file").await, "at-checkpoint\n");
        let e = c
            .create_snapshot(&s.id, &named(&"x".repeat(65)))
            .await
            .unwrap_err();
        assert_eq!(status(&e), Some(400), "{e}");
        let e = c
            .create_snapshot(
                &s.id,
                &CreateSnapshot {
                    name: None,
                    checkpoint: Some("cp-nope".into()),
                },
            )
            .await
            .unwrap_err();
        assert_eq!(status(&e), Some(404), "{e}");
        assert_eq!(c.list_snapshots(Some(&s.id), None).await.unwrap().len(), 1);
    });
    d.shutdown();
}

#[test]
fn gvisor_a_delete_of_the_snapshot_during_a_start_from_it_leaves_the_start_whole_and_frees_its_copy(
) {
    let mut d = Daemon::start_isolated(None, "gvisor");
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&on("gvisor")).await.unwrap();
        start_counter(&c, &s.id).await;
        assert_eq!(probe(&c, &s.id).await.0, 1);
        let snap = c
            .create_snapshot(&s.id, &CreateSnapshot::default())
            .await
            .unwrap();
        c.delete_sandbox(&s.id).await.unwrap();
        let start = StartFromSnapshot::default();
        let (started, deleted) = tokio::join!(
            c.start_from_snapshot(&snap.id, &start),
            c.delete_snapshot(&snap.id)
        );
        deleted.unwrap();
        match started {
            // Started before the delete: whole, continuing the counter.
            Ok(sb) => assert_eq!(probe(&c, &sb.id).await.0, 2),
            // Or the delete came first.
            Err(e) => assert_eq!(status(&e), Some(404), "{e}"),
        }
        assert!(
            !entries(&copies(&d)).contains(&snap.id),
            "the deleted snapshot's copy stayed"
        );
    });
    d.shutdown();
}

/// Plants, in a stopped daemon's database, snapshot `id` being made from
/// checkpoint `cp` of sandbox `sb` (`fresh`: taken for it), as a crash after
/// its copy moved leaves it.
fn plant_half_made(d: &Daemon, id: &str, sb: &str, cp: &str, fresh: bool) {
    std::fs::rename(copies(d).join(cp), copies(d).join(id)).unwrap();
    let db = rusqlite::Connection::open(d.data_dir().join("sandlot.db")).unwrap();
    db.execute(
        "INSERT INTO snapshots (id, tenant, name, sandbox_id, kind, created_at, size, saved, source, ready, checkpoint_id, checkpoint_fresh)
         SELECT ?1, tenant, NULL, ?2, 'memory', 1, 10, '{}', '{\"spec\": {}, \"memory_bytes\": 0, \"timeout_ms\": 1000}', 0, ?3, ?4
         FROM sandboxes WHERE id = ?2",
        rusqlite::params![id, sb, cp, fresh],
    )
    .unwrap();
}

#[test]
fn gvisor_a_crash_mid_snapshot_leaves_no_half_snapshot_and_no_orphan_copy() {
    let mut d = Daemon::start_isolated(None, "gvisor");
    let c = d.client();
    let (id, taken, promoted) = rt().block_on(async {
        let s = c.create_sandbox(&on("gvisor")).await.unwrap();
        sh(&c, &s.id, "echo kept > /tmp/file").await;
        let keep = CreateCheckpoint::default();
        let taken = c.create_checkpoint(&s.id, &keep).await.unwrap();
        let promoted = c.create_checkpoint(&s.id, &keep).await.unwrap();
        (s.id, taken.id, promoted.id)
    });
    d.kill9();
    // One whose checkpoint was taken for it, one promoting the tenant's.
    plant_half_made(&d, "sn-00000000000000aa", &id, &taken, true);
    plant_half_made(&d, "sn-00000000000000bb", &id, &promoted, false);
    d.spawn();
    let c = d.client();
    rt().block_on(async {
        assert!(c.list_snapshots(None, None).await.unwrap().is_empty());
        let left: Vec<String> = c
            .list_checkpoints(&id)
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.id)
            .collect();
        assert_eq!(
            left,
            vec![promoted.clone()],
            "the checkpoint taken for it went, the promoted one stayed"
        );
        let mut on_disk = entries(&copies(&d));
        on_disk.sort();
        assert_eq!(on_disk, vec![promoted.clone()], "no half snapshot on disk");
        // The checkpoint that was being promoted is whole: a snapshot of it works.
        let snap = c
            .create_snapshot(
                &id,
                &CreateSnapshot {
                    name: None,
                    checkpoint: Some(promoted),
                },
            )
            .await
            .unwrap();
        let from = c
            .start_from_snapshot(&snap.id, &StartFromSnapshot::default())
            .await
            .unwrap();
        assert_eq!(sh(&c, &from.id, "cat /tmp/file").await, "kept\n");
        c.delete_snapshot(&snap.id).await.unwrap();
    });
    d.shutdown();
}

#[test]
fn gvisor_a_snapshot_racing_a_fork_or_a_delete_of_its_sandbox_is_whole_or_refused_and_leaves_nothing(
) {
    let mut d = Daemon::start_isolated(None, "gvisor");
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&on("gvisor")).await.unwrap();
        sh(&c, &s.id, "echo kept > /tmp/file").await;
        let none = CreateSnapshot::default();
        let fork = sandlot_client::checkpoint::ForkRequest::default();
        let (snap, forked) = tokio::join!(
            c.create_snapshot(&s.id, &none),
            c.fork_sandbox(&s.id, &fork)
        );
        let refused = |e: &sandlot_client::Error| status(e) == Some(409);
        assert!(
            snap.as_ref().is_ok() || snap.as_ref().is_err_and(refused),
            "{snap:?}"
        );
        assert!(
            forked.as_ref().is_ok() || forked.as_ref().is_err_and(refused),
            "{forked:?}"
        );
        assert!(snap.is_ok() || forked.is_ok(), "one of them runs");
        eprintln!(
            "snapshot {:?}, fork {:?}",
            snap.as_ref().map(|s| &s.id),
            forked.as_ref().map(|f| f.sandboxes.len())
        );
        // A snapshot and a delete of its sandbox at once.
        let (snap2, deleted) =
            tokio::join!(c.create_snapshot(&s.id, &none), c.delete_sandbox(&s.id));
        let deleted_ok = deleted.is_ok()
            || deleted
                .as_ref()
                .is_err_and(|e| matches!(status(e), Some(409)));
        assert!(deleted_ok, "{deleted:?}");
        eprintln!(
            "snapshot {:?}, delete {:?}",
            snap2.as_ref().map(|s| &s.id),
            deleted.as_ref().map(|_| ())
        );
        if let Err(e) = &snap2 {
            assert!(matches!(status(e), Some(404 | 409)), "{e}");
        }
        // Whatever won: every snapshot listed starts whole, and the disk holds
        // the copies of listed snapshots and live checkpoints only.
        let listed = c.list_snapshots(None, None).await.unwrap();
        for sn in &listed {
            let from = c
                .start_from_snapshot(&sn.id, &StartFromSnapshot::default())
                .await
                .unwrap();
            assert_eq!(sh(&c, &from.id, "cat /tmp/file").await, "kept\n");
            c.delete_sandbox(&from.id).await.unwrap();
        }
        if deleted.is_err() {
            c.delete_sandbox(&s.id).await.unwrap();
        }
        if let Ok(f) = &forked {
            for sb in &f.sandboxes {
                c.delete_sandbox(&sb.id).await.unwrap();
            }
        }
        let mut want: Vec<String> = listed.iter().map(|s| s.id.clone()).collect();
        want.sort();
        eventually(20, "only the listed snapshots' copies to stay", || {
            let (d, want) = (&d, want.clone());
            async move {
                let mut on_disk = entries(&copies(d));
                on_disk.sort();
                on_disk == want
            }
        })
        .await;
        for sn in &listed {
            c.delete_snapshot(&sn.id).await.unwrap();
        }
        assert!(
            entries(&copies(&d)).is_empty(),
            "{:?}",
            entries(&copies(&d))
        );
    });
    d.shutdown();
}

#[test]
fn gvisor_a_checkpoint_past_the_tenants_saved_disk_quota_is_refused_and_leaves_nothing() {
    let mut d = Daemon::start_isolated(Some("[quotas]\nmax_saved_disk = \"100K\"\n"), "gvisor");
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&on("gvisor")).await.unwrap();
        let e = c
            .create_checkpoint(&s.id, &CreateCheckpoint::default())
            .await
            .unwrap_err();
        assert_eq!(status(&e), Some(429), "{e}");
        assert!(e.to_string().contains("max_saved_disk"), "{e}");
        assert!(c.list_checkpoints(&s.id).await.unwrap().is_empty());
        assert!(
            entries(&copies(&d)).is_empty(),
            "{:?}",
            entries(&copies(&d))
        );
        // The sandbox runs on.
        assert_eq!(sh(&c, &s.id, "echo alive").await, "alive\n");
    });
    d.shutdown();
}

/// Bytes under the image store's unpacked layers and blobs.
fn store_bytes(d: &Daemon) -> u64 {
    let root = d.data_dir().join("images");
    ["layers", "blobs"]
        .iter()
        .map(|sub| {
            let mut n = 0;
            let mut stack = vec![root.join(sub)];
            while let Some(dir) = stack.pop() {
                for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let m = std::fs::symlink_metadata(e.path()).unwrap();
                    if m.is_dir() {
                        stack.push(e.path());
                    } else {
                        n += m.len();
                    }
                }
            }
            n
        })
        .sum()
}

#[test]
fn namespace_a_snapshot_counts_its_packed_and_unpacked_files_and_its_delete_frees_them() {
    let mut d = Daemon::start_isolated(None, "namespace");
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&on("namespace")).await.unwrap();
        let before = store_bytes(&d);
        // 8 MiB that do not compress.
        sh(&c, &s.id, "head -c 8388608 /dev/urandom > /tmp/big").await;
        let snap = c.create_snapshot(&s.id, &named("big")).await.unwrap();
        let grown = store_bytes(&d) - before;
        // The blob and the unpacked file: both on the disk, both counted.
        assert!(grown >= 2 * 8_388_608, "the store grew by {grown}");
        assert!(
            snap.size >= 2 * 8_388_608 && snap.size <= grown + 1_048_576,
            "counted {} of {grown}",
            snap.size
        );
        c.delete_sandbox(&s.id).await.unwrap();
        c.delete_snapshot(&snap.id).await.unwrap();
        eventually(20, "the snapshot's layer and blob to go", || {
            let now = store_bytes(&d);
            async move { now <= before + 1_048_576 }
        })
        .await;
    });
    d.shutdown();
}

#[test]
fn the_cli_creates_lists_inspects_starts_from_and_removes_snapshots() {
    let mut d = Daemon::start_isolated(None, "namespace");
    let c = d.client();
    let id = rt().block_on(async {
        let s = c.create_sandbox(&on("namespace")).await.unwrap();
        sh(&c, &s.id, "echo one > /tmp/file").await;
        s.id
    });
    let (code, sn, err) = d.cli(&["snapshot", "create", &id, "--name", "first"]);
    assert_eq!(code, 0, "{err}");
    let sn = sn.trim().to_string();
    assert!(err.contains("files; processes start afresh"), "{err}");
    let (code, out, err) = d.cli(&["snapshot", "ls", "--sandbox", &id]);
    assert_eq!(code, 0, "{err}");
    let row = out.lines().find(|l| l.starts_with(&sn)).expect(&out);
    assert!(row.contains("first") && row.contains("filesystem"), "{out}");
    let (code, out, err) = d.cli(&["snapshot", "ls", "-q", "--name", "other"]);
    assert_eq!((code, out.trim()), (0, ""), "{err}");
    let (code, out, err) = d.cli(&["snapshot", "inspect", &sn, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["id"].as_str(), v["sandbox_id"].as_str()),
        (Some(&sn[..]), Some(&id[..]))
    );
    let (code, out, err) = d.cli(&["snapshot", "inspect", &sn]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("keeps    files; processes start afresh"),
        "{out}"
    );
    let (code, _, err) = d.cli(&["rm", &id]);
    assert_eq!(code, 0, "{err}");
    let (code, from, err) = d.cli(&["snapshot", "start", &sn, "--timeout", "600"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(rt().block_on(sh(&c, from.trim(), "cat /tmp/file")), "one\n");
    let (code, out, err) = d.cli(&["snapshot", "rm", &sn, "sn-missing"]);
    assert_eq!(code, 125, "{out}");
    assert_eq!(out.trim(), sn);
    assert!(err.contains("not_found"), "{err}");
    let (code, out, err) = d.cli(&["snapshot", "ls", "-q"]);
    assert_eq!((code, out.trim()), (0, ""), "{err}");
    d.shutdown();
}
