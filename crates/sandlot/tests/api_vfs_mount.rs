//! Collections mounted into sandboxes through a real daemon: real tools on the
//! ACL-pruned view, read-only, a version pinned for the sandbox's life, strict
//! validation, and the lifecycle of the FUSE mounts and their helper processes
//! (delete, reap, create failure, daemon crash and restart). Needs root and
//! /dev/fuse.

mod api_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use api_support::vfs::{acl, body, tar_of};
use api_support::{rt, Daemon};
use sandlot_client::vfs::UploadFormat;
use sandlot_client::{Client, CreateSandbox};
use serde_json::{json, Value};

const SITE: &[(&str, &str)] = &[
    ("README.md", "hello\n"),
    (
        "docs/guide.md",
        "# Guide\nThe API has a rate limit of 10 requests.\nSee limits.\n",
    ),
    (
        "docs/faq.md",
        "Q: what is the rate limit?\nA: ten per second\n",
    ),
    ("docs/api/v1/limits.md", "rate limit: 10/s\nburst: 20\n"),
    ("docs/api/v1/empty.txt", ""),
    (
        "internal/secret.md",
        "the rate limit bypass token is hunter2\n",
    ),
    ("internal/plans/q3.md", "raise the rate limit\n"),
];

fn fuse_available() -> bool {
    if !Path::new("/dev/fuse").exists() {
        eprintln!(
            "SKIPPED: /dev/fuse is missing on this machine; collection mounts need the fuse kernel module"
        );
        return false;
    }
    true
}

fn create_body(mounts: Value) -> CreateSandbox {
    let mut spec = serde_json::Map::new();
    spec.insert("mounts".into(), mounts);
    CreateSandbox {
        spec,
        ..Default::default()
    }
}

/// `sh -c CMD` in the sandbox: (exit code, stdout, stderr).
async fn sh(c: &Client, id: &str, cmd: &str) -> (i32, String, String) {
    let full = format!("export LC_ALL=C HOME=/tmp; {cmd}");
    let o = c.run(id, &["/bin/sh", "-c", full.as_str()]).await.unwrap();
    (
        o.exit.code.unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

async fn ok(c: &Client, id: &str, cmd: &str) -> String {
    let (code, out, err) = sh(c, id, cmd).await;
    assert_eq!(code, 0, "{cmd}: exit {code}\nstdout: {out}\nstderr: {err}");
    out
}

/// FUSE mount points under `dir` in this (the host's) mount namespace.
fn fuse_mounts_under(dir: &Path) -> Vec<String> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .filter(|l| {
            let fstype = l.split(" - ").nth(1).and_then(|r| r.split(' ').next());
            fstype.is_some_and(|t| t.starts_with("fuse"))
        })
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|mp| Path::new(mp).starts_with(&dir))
        .map(str::to_string)
        .collect()
}

/// `sandlot __vfs-serve` helpers serving a mount point under `dir`: (pid, mount point).
fn helpers_under(dir: &Path) -> Vec<(i32, PathBuf)> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        if args.len() >= 3 && args[1] == b"__vfs-serve" {
            let mp = PathBuf::from(String::from_utf8_lossy(args[2]).into_owned());
            if mp.starts_with(&dir) {
                out.push((pid, mp));
            }
        }
    }
    out
}

/// Waits until no FUSE mount, helper or directory of sandbox `id` is left.
fn assert_no_traces(d: &Daemon, id: &str) {
    let dir = d.data_dir().join("vfs-mounts").join(id);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mounts = fuse_mounts_under(&dir);
        let helpers = helpers_under(&dir);
        if mounts.is_empty() && helpers.is_empty() && !dir.exists() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "sandbox {id} left mounts {mounts:?}, helpers {helpers:?}, dir exists: {}",
            dir.exists()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILLs every process in sandbox `id`'s cgroup (v1 or v2), PID 1 and the
/// helpers moved there.
fn kill_cgroup(d: &Daemon, id: &str) {
    let traces = d.leftovers();
    let cgs: Vec<&String> = traces
        .iter()
        .filter(|p| p.starts_with("/sys/fs/cgroup") && p.ends_with(id))
        .collect();
    assert!(!cgs.is_empty(), "no cgroup of {id} in {traces:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids: Vec<i32> = cgs
            .iter()
            .filter_map(|cg| std::fs::read_to_string(Path::new(cg).join("cgroup.procs")).ok())
            .flat_map(|s| {
                s.lines()
                    .filter_map(|l| l.trim().parse::<i32>().ok())
                    .collect::<Vec<_>>()
            })
            .collect();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            if let Some(p) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
        }
        assert!(Instant::now() < deadline, "{id}'s cgroup does not empty");
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn wait_stopped(c: &Client, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = c.get_sandbox(id).await.unwrap();
        if s.state.as_str() == "stopped" {
            return;
        }
        assert!(Instant::now() < deadline, "{id} did not stop: {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Commands run both on the mount and on a plain copy of the files the principal
/// may see: the outputs must be identical.
const SAME_AS_A_COPY: &[&str] = &[
    "ls -R",
    "ls -a docs docs/api",
    "find . | sort",
    "find . -type f -size -1k | sort",
    "find . -empty",
    "find . -maxdepth 2 -type d | sort",
    "grep -rn 'rate limit' . | sort",
    "grep -rc limit . | sort",
    "grep -r -i 'BURST' --include='*.md' .",
    "wc -c $(find . -type f | sort)",
    "cat docs/guide.md docs/faq.md | sort | uniq -c",
    "head -c 7 docs/api/v1/limits.md; tail -n 1 docs/guide.md",
    "python3 -c 'import os; print(sorted((r, sorted(d), sorted(f)) for r, d, f in os.walk(\".\")))'",
    "python3 -c 'import pathlib; print(sorted(str(p) for p in pathlib.Path(\".\").rglob(\"*\")))'",
    "git grep --no-index -n 'rate limit' | sort",
    "git grep --no-index -c limit -- docs | sort",
];

#[test]
fn collection_mount_serves_the_pruned_view_to_real_tools_read_only() {
    if !fuse_available() {
        return;
    }
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        c.create_collection_upload("docs", UploadFormat::Tar, &acl(), body(tar_of(SITE)))
            .await
            .unwrap();
        let sb = c
            .create_sandbox(&create_body(json!([
                {"type": "collection", "collection": "docs", "target": "/docs"},
                {"type": "collection", "collection": "docs", "target": "/eng",
                 "principal": "alice", "groups": ["eng"]},
            ])))
            .await
            .unwrap();
        let id = sb.id.clone();
        // The version is pinned into the recorded spec; the principal is left as given.
        assert_eq!(sb.spec["mounts"][0]["version"], 1, "{}", sb.spec);
        assert!(sb.spec["mounts"][0].get("principal").is_none());
        assert_eq!(sb.spec["mounts"][1]["version"], 1);

        // The anonymous view: public documents only, by any path and any tool.
        assert_eq!(
            ok(&c, &id, "ls -R /docs").await,
            "/docs:\nREADME.md\ndocs\n\n/docs/docs:\napi\nfaq.md\nguide.md\n\n\
             /docs/docs/api:\nv1\n\n/docs/docs/api/v1:\nempty.txt\nlimits.md\n"
        );
        assert_eq!(
            ok(&c, &id, "grep -rn 'rate limit' /docs | sort").await,
            "/docs/docs/api/v1/limits.md:1:rate limit: 10/s\n\
             /docs/docs/faq.md:1:Q: what is the rate limit?\n\
             /docs/docs/guide.md:2:The API has a rate limit of 10 requests.\n"
        );
        for cmd in [
            "cat /docs/internal/secret.md",
            "ls /docs/internal",
            "stat /docs/internal/plans/q3.md",
            "ls -d /docs/internal/plans",
        ] {
            let (code, _, err) = sh(&c, &id, cmd).await;
            assert_ne!(code, 0, "{cmd} succeeded");
            assert!(err.contains("No such file or directory"), "{cmd}: {err}");
        }
        assert_eq!(
            ok(&c, &id, "find /docs -name '*secret*' -o -name 'q3*' | wc -l").await,
            "0\n"
        );
        // alice of eng sees internal/ in her mount of the same collection.
        assert_eq!(
            ok(&c, &id, "grep -rln 'rate limit' /eng/internal | sort").await,
            "/eng/internal/plans/q3.md\n/eng/internal/secret.md\n"
        );
        assert_eq!(
            ok(&c, &id, "cat /eng/internal/secret.md").await,
            "the rate limit bypass token is hunter2\n"
        );

        // The same commands on a plain copy of what the anonymous principal sees.
        for (p, content) in SITE.iter().filter(|(p, _)| !p.starts_with("internal/")) {
            let full = format!("/tmp/ref/{p}");
            let parent = Path::new(&full).parent().unwrap().to_str().unwrap().to_string();
            c.mkdir(&id, &parent, true).await.unwrap();
            c.write_file_bytes(&id, &full, content.as_bytes().to_vec())
                .await
                .unwrap();
        }
        for cmd in SAME_AS_A_COPY {
            let on_mount = sh(&c, &id, &format!("cd /docs && {cmd}")).await;
            let on_copy = sh(&c, &id, &format!("cd /tmp/ref && {cmd}")).await;
            assert_eq!(on_mount, on_copy, "{cmd}");
            assert!(!on_mount.1.is_empty(), "{cmd}: no output: {on_mount:?}");
        }
        // ripgrep, if the host has it (the host image binds its /usr).
        let (has_rg, _, _) = sh(&c, &id, "command -v rg").await;
        if has_rg == 0 {
            let cmd = "rg -n --sort path 'rate limit' .";
            let on_mount = sh(&c, &id, &format!("cd /docs && {cmd}")).await;
            let on_copy = sh(&c, &id, &format!("cd /tmp/ref && {cmd}")).await;
            assert_eq!(on_mount, on_copy, "{cmd}");
            assert_eq!(on_mount.0, 0, "{on_mount:?}");
            let (code, out, _) = sh(&c, &id, "rg -l hunter2 /docs /eng").await;
            assert_eq!((code, out.as_str()), (0, "/eng/internal/secret.md\n"));
        } else {
            eprintln!("SKIPPED (rg part only): ripgrep is not installed on this host, so the sandbox has no rg");
        }

        // Read-only: every write fails with EROFS, as root in the sandbox too.
        for cmd in [
            "touch /docs/new.md",
            "echo x > /docs/README.md",
            "echo x >> /docs/README.md",
            "mkdir /docs/newdir",
            "rm /docs/README.md",
            "mv /docs/README.md /docs/x.md",
            "chmod 666 /docs/README.md",
            "ln -s README.md /docs/link",
            "truncate -s 0 /docs/docs/guide.md",
        ] {
            let (code, _, err) = sh(&c, &id, cmd).await;
            assert_ne!(code, 0, "{cmd} succeeded");
            assert!(err.contains("Read-only file system"), "{cmd}: {err}");
        }
        assert_eq!(ok(&c, &id, "cat /docs/README.md").await, "hello\n");
        let mounts = ok(&c, &id, "grep -E ' /(docs|eng) ' /proc/self/mounts").await;
        for l in mounts.lines() {
            assert!(l.contains(" ro,") && l.contains("fuse"), "{l}");
            assert!(l.contains("nosuid") && l.contains("nodev"), "{l}");
        }

        // On the host: the mounts live under a root-only directory, and each helper
        // was moved into the sandbox's cgroup.
        let root = d.data_dir().join("vfs-mounts");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&root).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(fuse_mounts_under(&root.join(&id)).len(), 2);
        let helpers = helpers_under(&root.join(&id));
        assert_eq!(helpers.len(), 2, "{helpers:?}");
        for (pid, _) in &helpers {
            let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
            assert!(cg.contains(&id), "helper {pid} is not in the sandbox's cgroup: {cg}");
        }
        // Once mounted, every thread of each helper (the request threads too) has
        // no capability left in any set and may not regain one; where the kernel
        // has Landlock, the helper says it restricted itself to its collection.
        // SAFETY: a null attribute, size 0 and LANDLOCK_CREATE_RULESET_VERSION only
        // query the ABI version.
        let landlock = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<u8>(),
                0usize,
                1u32,
            )
        } >= 1;
        for (pid, mp) in &helpers {
            let tasks: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/task"))
                .unwrap()
                .flatten()
                .collect();
            assert!(tasks.len() >= 2, "helper {pid}: no request threads");
            for t in tasks {
                let status = std::fs::read_to_string(t.path().join("status")).unwrap();
                let field = |k: &str| {
                    status
                        .lines()
                        .find_map(|l| l.strip_prefix(k))
                        .unwrap_or_else(|| panic!("no {k} in {status}"))
                        .trim()
                        .to_string()
                };
                for k in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
                    assert_eq!(
                        field(k),
                        "0000000000000000",
                        "helper {pid} thread {:?}: {k}",
                        t.file_name()
                    );
                }
                assert_eq!(field("NoNewPrivs:"), "1", "helper {pid}");
            }
            let log = std::fs::read_to_string(mp.with_extension("log")).unwrap();
            assert!(log.contains("confined: no capabilities"), "{log}");
            if landlock {
                assert!(log.contains("landlock ABI"), "{log}");
            } else {
                eprintln!("SKIPPED (landlock part only): this kernel has no Landlock LSM enabled");
            }
        }

        // A re-ingest publishes version 2; the sandbox keeps seeing version 1, a new
        // sandbox gets version 2.
        let mut v2: Vec<(&str, &str)> = SITE.to_vec();
        v2[0] = ("README.md", "hello, version two\n");
        v2.push(("docs/new.md", "new in v2\n"));
        let a = c
            .ingest_collection_upload("docs", UploadFormat::Tar, Some(&acl()), body(tar_of(&v2)))
            .await
            .unwrap();
        assert_eq!(a.ingest.version, 2);
        assert_eq!(ok(&c, &id, "cat /docs/README.md").await, "hello\n");
        let (code, _, _) = sh(&c, &id, "test -e /docs/docs/new.md").await;
        assert_eq!(code, 1, "version 2's document showed up in a version 1 mount");
        let sb2 = c
            .create_sandbox(&create_body(json!([
                {"type": "collection", "collection": "docs", "target": "/docs"}
            ])))
            .await
            .unwrap();
        assert_eq!(sb2.spec["mounts"][0]["version"], 2);
        assert_eq!(
            ok(&c, &sb2.id, "cat /docs/README.md /docs/docs/new.md").await,
            "hello, version two\nnew in v2\n"
        );
        // An older version can be asked for explicitly.
        let sb3 = c
            .create_sandbox(&create_body(json!([
                {"type": "collection", "collection": "docs", "target": "/d", "version": 1}
            ])))
            .await
            .unwrap();
        assert_eq!(ok(&c, &sb3.id, "cat /d/README.md").await, "hello\n");

        // A mounted collection cannot be removed.
        let e = c.delete_collection("docs").await.unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(409), "{e}");
        assert!(e.to_string().contains(&id), "{e}");

        // Delete: mounts, helpers and directories go.
        for s in [&id, &sb2.id, &sb3.id] {
            c.delete_sandbox(s).await.unwrap();
            assert_no_traces(&d, s);
        }
        // Reaped by its timeout: the same.
        let mut short = create_body(json!([
            {"type": "collection", "collection": "docs", "target": "/docs"}
        ]));
        // Long enough that a slow create still finds it mounted for the look below.
        short.spec.insert("timeout".into(), json!("5s"));
        let sb4 = c.create_sandbox(&short).await.unwrap();
        assert_eq!(fuse_mounts_under(&root.join(&sb4.id)).len(), 1);
        wait_stopped(&c, &sb4.id).await;
        assert_no_traces(&d, &sb4.id);
        // Nothing mounts it any more: it can be removed.
        c.delete_collection("docs").await.unwrap();
        assert!(fuse_mounts_under(&d.data_dir()).is_empty());
        assert!(helpers_under(&d.data_dir()).is_empty());
    });
}

#[test]
fn collection_mounts_are_validated_and_tenant_scoped() {
    if !fuse_available() {
        return;
    }
    // Bind sources under /tmp are allowed, so that a bind can fail in the sandbox's
    // init, after the collection mounts were set up.
    let d = Daemon::start(Some("[mounts]\nallowed_host_paths = [\"/tmp\"]\n"));
    let alpha = d.tcp(Some(&d.token("alpha")));
    let beta = d.tcp(Some(&d.token("beta")));
    rt().block_on(async {
        alpha
            .create_collection_upload("kb", UploadFormat::Tar, &acl(), body(tar_of(SITE)))
            .await
            .unwrap();
        let field = |e: &sandlot_client::Error| match e {
            sandlot_client::Error::Api { status, body } => {
                (status.as_u16(), body.field.clone().unwrap_or_default())
            }
            e => panic!("not an API error: {e}"),
        };
        // Another tenant's collection does not exist for beta.
        let e = beta
            .create_sandbox(&create_body(json!([
                {"type": "tmpfs", "target": "/t"},
                {"type": "collection", "collection": "kb", "target": "/kb"}
            ])))
            .await
            .unwrap_err();
        assert_eq!(field(&e), (400, "mounts[1].collection".into()), "{e}");
        assert!(e.to_string().contains("no collection \"kb\""), "{e}");
        let e = alpha
            .create_sandbox(&create_body(json!([
                {"type": "collection", "collection": "kb", "target": "/kb", "version": 9}
            ])))
            .await
            .unwrap_err();
        assert_eq!(field(&e), (400, "mounts[0].version".into()), "{e}");
        assert!(e.to_string().contains("head is 1"), "{e}");
        for (m, f) in [
            (json!({"type": "collection", "collection": "../kb", "target": "/kb"}), "mounts[0].collection"),
            (json!({"type": "collection", "collection": "kb", "target": "kb"}), "mounts[0].target"),
            (json!({"type": "collection", "collection": "kb", "target": "/kb", "principal": "a b"}), "mounts[0].principal"),
            (json!({"type": "collection", "collection": "kb", "target": "/kb", "groups": ["ok", ""]}), "mounts[0].groups[1]"),
        ] {
            let e = alpha.create_sandbox(&create_body(json!([m]))).await.unwrap_err();
            assert_eq!(field(&e), (400, f.to_string()), "{e}");
        }
        let e = alpha
            .create_sandbox(&create_body(json!([
                {"type": "collection", "collection": "kb", "target": "/kb", "readonly": false}
            ])))
            .await
            .unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(400), "{e}");
        assert!(e.to_string().contains("readonly"), "{e}");
        // No sandbox was recorded for any of these, and nothing was mounted.
        assert!(fuse_mounts_under(&d.data_dir()).is_empty());

        // A missing bind source is refused before anything is set up.
        let missing = format!("/tmp/sandlot-missing-{}", std::process::id());
        let e = alpha
            .create_sandbox(&create_body(json!([
                {"type": "collection", "collection": "kb", "target": "/kb"},
                {"type": "bind", "source": missing, "target": "/x"}
            ])))
            .await
            .unwrap_err();
        assert_eq!(field(&e), (400, "mounts[1].source".to_string()), "{e}");
        assert!(fuse_mounts_under(&d.data_dir()).is_empty());

        // A create that fails in the runtime, after the collection was mounted,
        // leaves nothing behind: a directory cannot be bound over the file
        // `/etc/hostname`.
        let e = alpha
            .create_sandbox(&create_body(json!([
                {"type": "collection", "collection": "kb", "target": "/kb"},
                {"type": "bind", "source": "/tmp", "target": "/etc/hostname"}
            ])))
            .await
            .unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(500), "{e}");
        let failed = alpha
            .list_sandboxes(&sandlot_client::ListFilter {
                states: vec!["all".into()],
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert_no_traces(&d, &failed[0].id);
        assert!(fuse_mounts_under(&d.data_dir()).is_empty());
        assert!(helpers_under(&d.data_dir()).is_empty());

        // The CLI form of --mount.
        let (code, out, err) = d.cli(&[
            "create",
            "--mount",
            "collection:kb:/kb:principal=alice,group=eng",
        ]);
        assert_eq!(code, 125, "the operator's tenant has no kb: {out}{err}");
        assert!(err.contains("mounts[0].collection"), "{err}");
        let (code, out, err) = d.cli(&[
            "create",
            "--tenant",
            "alpha",
            "--json",
            "--mount",
            "collection:kb:/kb:principal=alice,group=eng",
        ]);
        assert_eq!(code, 0, "{out}{err}");
        let sb: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            sb["spec"]["mounts"][0],
            json!({"type": "collection", "collection": "kb", "target": "/kb",
                   "principal": "alice", "groups": ["eng"], "version": 1})
        );
        let id = sb["id"].as_str().unwrap().to_string();
        assert_eq!(
            ok(&alpha, &id, "cat /kb/internal/plans/q3.md").await,
            "raise the rate limit\n"
        );
        alpha.delete_sandbox(&id).await.unwrap();
        assert_no_traces(&d, &id);
    });
}

#[test]
fn collection_mounts_survive_a_daemon_crash_and_leave_nothing_after() {
    if !fuse_available() {
        return;
    }
    let mut d = Daemon::start(None);
    let c = d.client();
    let r = rt();
    let (keep, lost, orphaned) = r.block_on(async {
        c.create_collection_upload("docs", UploadFormat::Tar, &acl(), body(tar_of(SITE)))
            .await
            .unwrap();
        let mut ids = Vec::new();
        for _ in 0..3 {
            let sb = c
                .create_sandbox(&create_body(json!([
                    {"type": "collection", "collection": "docs", "target": "/docs",
                     "principal": "alice", "groups": ["eng"]}
                ])))
                .await
                .unwrap();
            assert_eq!(
                ok(&c, &sb.id, "cat /docs/internal/secret.md").await,
                "the rate limit bypass token is hunter2\n"
            );
            ids.push(sb.id);
        }
        (ids[0].clone(), ids[1].clone(), ids[2].clone())
    });
    let root = d.data_dir().join("vfs-mounts");
    d.kill9();
    // The helpers are not the daemon's: they keep serving.
    for id in [&keep, &lost, &orphaned] {
        assert_eq!(helpers_under(&root.join(id)).len(), 1, "{id}");
        assert_eq!(fuse_mounts_under(&root.join(id)).len(), 1, "{id}");
    }
    // While the daemon is down, `lost`'s sandbox dies (its whole cgroup, helper
    // included), and `orphaned`'s helper dies alone.
    kill_cgroup(&d, &lost);
    let (hp, _) = helpers_under(&root.join(&orphaned))[0].clone();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(hp).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(helpers_under(&root.join(&lost)).is_empty()
        && helpers_under(&root.join(&orphaned)).is_empty())
    {
        assert!(Instant::now() < deadline, "helpers did not die");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Their host mounts are dead until the daemon comes back: ENOTCONN, or
    // ECONNABORTED when the kernel saw the connection aborted (the helper's request
    // threads each hold a clone of the FUSE device; which error a dead connection
    // gives depends on how its last descriptor went).
    let e = std::fs::read_dir(root.join(&orphaned).join("0")).unwrap_err();
    assert!(
        matches!(
            e.raw_os_error(),
            Some(libc::ENOTCONN) | Some(libc::ECONNABORTED)
        ),
        "{e}"
    );

    d.spawn();
    r.block_on(async {
        // Re-adopted with its mount still served.
        assert_eq!(
            ok(&c, &keep, "cat /docs/internal/secret.md; ls /docs").await,
            "the rate limit bypass token is hunter2\nREADME.md\ndocs\ninternal\n"
        );
        assert_eq!(helpers_under(&root.join(&keep)).len(), 1);
        // The sandbox that died while the daemon was down: recorded lost, its
        // mount and directory removed.
        let s = c.get_sandbox(&lost).await.unwrap();
        assert_eq!(s.state.as_str(), "stopped", "{s:?}");
        assert_no_traces(&d, &lost);
        // The sandbox whose helper died: re-adopted, its dead host mount removed (no
        // ENOTCONN mount left on the host); reads inside fail until it is recreated.
        assert!(fuse_mounts_under(&root.join(&orphaned)).is_empty());
        let (code, _, err) = sh(&c, &orphaned, "ls /docs").await;
        assert_ne!(code, 0);
        assert!(
            err.contains("Transport endpoint is not connected")
                || err.contains("Software caused connection abort"),
            "{err}"
        );
        assert!(d
            .log()
            .contains("helper serving this collection mount died"));
        for id in [&keep, &orphaned] {
            c.delete_sandbox(id).await.unwrap();
            assert_no_traces(&d, id);
        }
    });
    assert!(fuse_mounts_under(&d.data_dir()).is_empty());
    assert!(helpers_under(&d.data_dir()).is_empty());
}

/// Whether a TCP connection to `port` on 127.0.0.1 succeeds from the network
/// namespace `/proc/PID/ns/net` (from a thread that joins it and ends).
fn tcp_reaches_from(pid: i32, port: u16) -> bool {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).unwrap();
    std::thread::spawn(move || {
        use std::os::fd::AsFd;
        rustix::thread::move_into_link_name_space(
            ns.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .unwrap();
        std::net::TcpStream::connect_timeout(
            &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            Duration::from_secs(2),
        )
        .is_ok()
    })
    .join()
    .unwrap()
}

/// The collection mount helper, root on the host, cannot reach the daemon: it runs
/// in an empty network namespace of its own (the daemon's TCP port and abstract
/// sockets are elsewhere) under a seccomp allow-list with no `socket` at all (the
/// operator socket, path-named, would be reachable from any network namespace;
/// Landlock does not cover `connect`), while serving as before. Found by a review:
/// it ran without a seccomp filter, in the daemon's network namespace.
#[test]
fn the_collection_helper_cannot_reach_the_daemon() {
    if !fuse_available() {
        return;
    }
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        c.create_collection_upload("docs", UploadFormat::Tar, &acl(), body(tar_of(SITE)))
            .await
            .unwrap();
        let sb = c
            .create_sandbox(&create_body(json!([
                {"type": "collection", "collection": "docs", "target": "/docs"},
            ])))
            .await
            .unwrap();
        assert_eq!(ok(&c, &sb.id, "cat /docs/README.md").await, "hello\n");
        let helpers = helpers_under(&d.data_dir().join("vfs-mounts").join(&sb.id));
        assert_eq!(helpers.len(), 1, "{helpers:?}");
        let (pid, _) = helpers[0];
        let ns = |p: i32| std::fs::read_link(format!("/proc/{p}/ns/net")).unwrap();
        assert_ne!(
            ns(pid),
            ns(d.pid()),
            "the helper is in the daemon's network namespace"
        );
        // The daemon's TCP port: reachable from here, not from the helper's namespace.
        assert!(tcp_reaches_from(d.pid(), d.port));
        assert!(!tcp_reaches_from(pid, d.port));
        // Every thread, the request threads included, is under the filter.
        let tasks: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .collect();
        assert!(tasks.len() >= 2, "helper {pid}: no request threads");
        for t in tasks {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap();
            let seccomp = status.lines().find_map(|l| l.strip_prefix("Seccomp:"));
            assert_eq!(
                seccomp.map(str::trim),
                Some("2"),
                "helper {pid} thread {:?}",
                t.file_name()
            );
        }
        // Still serving after all that.
        assert_eq!(
            ok(&c, &sb.id, "grep -rl 'rate limit' /docs | sort").await,
            "/docs/docs/api/v1/limits.md\n/docs/docs/faq.md\n/docs/docs/guide.md\n"
        );
        c.delete_sandbox(&sb.id).await.unwrap();
        assert_no_traces(&d, &sb.id);
    });
}
