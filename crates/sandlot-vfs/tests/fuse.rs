//! The FUSE mount is a read-only POSIX filesystem for real tools, shows the
//! same pruned tree as the virtual shell, and leaves no mount behind.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{fixture_files, TempDir};
use sandlot_vfs::fuse::{is_mounted, mount, MountOptions};
use sandlot_vfs::{Acl, AclPolicy, AclRule, IngestOptions, Limits, Principal, Source, Store};

fn fuse_available() -> bool {
    common::require_root("it mounts FUSE file systems");
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIPPED: /dev/fuse is missing on this machine; the FUSE tests need the fuse kernel module");
        return false;
    }
    true
}

/// Run a command line with real bash in `dir` (no mount namespace: the FUSE
/// mount lives in this process's namespace).
fn bash_in(dir: &Path, cmd: &str) -> (Vec<u8>, Vec<u8>, i32) {
    let out = Command::new("bash")
        .arg("-c")
        .arg(cmd)
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("LC_ALL", "C.UTF-8")
        .env("TZ", "UTC")
        .env("HOME", "/")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (out.stdout, out.stderr, out.status.code().unwrap_or(-1))
}

/// Commands whose output must be identical on the mount (GNU tools) and in
/// the virtual shell, including the stat-derived ones (`ls -l`, `find -size`).
const ON_MOUNT: &[&str] = &[
    "ls -l",
    "ls -la docs",
    "ls -lR src",
    "ls -lS docs",
    "ls -lt notes",
    "ls -lh docs",
    "ls -F",
    "find . -size -2",
    "find . -size +1k -type d",
    "find docs -printf '%p %s %y %m %n\\n'",
    "find . -empty",
    "tree -a",
    "grep -rn 'rate limit' . | head -50",
    "grep -rc timeout docs",
    "wc -l docs/long.md README.md",
    "cat docs/api/lib.py | sort | uniq -c | sort -rn | head -5",
    "touch new.txt",
    "echo hi > out.txt",
    "mkdir newdir",
    "rm README.md",
    "rm -r docs",
    "mv README.md x.md",
    "cp README.md x.md",
    "ln -s README.md link",
    "chmod 644 README.md",
    "echo x | tee docs/t.txt",
];

#[test]
fn mount_serves_the_pruned_view_read_only() {
    if !fuse_available() {
        return;
    }
    common::require_tool("python3");
    let files = fixture_files(11);
    let src = TempDir::new(Path::new("/tmp"), "fuse-src");
    for (p, d) in &files {
        let full = src.path.join(p);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, d).unwrap();
    }
    let st = Command::new("find")
        .arg(&src.path)
        .args(["-exec", "touch", "-d", "@1700000000", "{}", "+"])
        .status()
        .unwrap();
    assert!(st.success());
    let sd = TempDir::new(Path::new("/tmp"), "fuse-store");
    let store = Store::open(&sd.path).unwrap();
    let policy = AclPolicy {
        default: Acl::public(),
        rules: vec![AclRule {
            pattern: "src/**".into(),
            acl: Acl::groups(["eng"]),
        }],
    };
    store
        .create(
            "f",
            Source::Dir {
                path: src.path.clone(),
            },
            IngestOptions { acl: policy },
        )
        .unwrap();
    let coll = store.collection("f").unwrap();

    for (principal, sees_src) in [
        (Principal::operator(), true),
        (Principal::anonymous(), false),
    ] {
        let mp = TempDir::new(Path::new("/tmp"), "fuse-mnt");
        let view = coll.view(&principal).unwrap();
        let m = mount(view, &mp.path, &MountOptions::default()).unwrap();
        assert!(is_mounted(&mp.path));

        // Real tools see exactly the virtual tree.
        let mut s = coll
            .open_session(principal.clone(), Limits::default())
            .unwrap();
        let mut failures = Vec::new();
        for cmd in ON_MOUNT {
            let v = s.run(cmd).unwrap();
            let (out, err, code) = bash_in(&mp.path, cmd);
            if v.stdout != out || v.stderr != err || v.exit_code != code {
                failures.push(format!(
                    "### {cmd}\n--- virtual ({}):\n{}{}--- mount ({code}):\n{}{}",
                    v.exit_code,
                    String::from_utf8_lossy(&v.stdout),
                    String::from_utf8_lossy(&v.stderr),
                    String::from_utf8_lossy(&out),
                    String::from_utf8_lossy(&err)
                ));
            }
        }
        // python os.walk sees the visible documents, nothing else.
        let (out, err, code) = bash_in(
            &mp.path,
            "python3 -c 'import os\nfor r, ds, fs in os.walk(\".\"):\n    for f in fs: print(os.path.join(r, f)[2:])' | sort",
        );
        assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
        let walked: Vec<String> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        let mut expect: Vec<String> = files
            .keys()
            .filter(|p| sees_src || !p.starts_with("src/"))
            .cloned()
            .collect();
        expect.sort();
        assert_eq!(walked, expect);
        // Writes through the Python API fail with EROFS.
        let (_, _, code) = bash_in(
            &mp.path,
            "python3 -c 'import errno\ntry:\n    open(\"README.md\", \"a\")\nexcept OSError as e:\n    raise SystemExit(0 if e.errno == errno.EROFS else 3)\nraise SystemExit(4)'",
        );
        assert_eq!(code, 0, "append open did not fail with EROFS");
        if !sees_src {
            let (_, err, code) = bash_in(&mp.path, "cat src/lib/intro.md || ls src");
            assert_ne!(code, 0);
            assert!(String::from_utf8_lossy(&err).contains("No such file or directory"));
        }
        m.unmount().unwrap();
        assert!(
            !is_mounted(&mp.path),
            "mount left behind at {}",
            mp.path.display()
        );
        assert!(
            failures.is_empty(),
            "{} commands differ on the mount:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}

#[test]
fn dropping_the_mount_unmounts() {
    if !fuse_available() {
        return;
    }
    let src = TempDir::new(Path::new("/tmp"), "fuse-drop-src");
    std::fs::write(src.path.join("a.txt"), b"hello\n").unwrap();
    let sd = TempDir::new(Path::new("/tmp"), "fuse-drop-store");
    let store = Store::open(&sd.path).unwrap();
    store
        .create(
            "d",
            Source::Dir {
                path: src.path.clone(),
            },
            IngestOptions::default(),
        )
        .unwrap();
    let view = store
        .collection("d")
        .unwrap()
        .view(&Principal::operator())
        .unwrap();
    let mp = TempDir::new(Path::new("/tmp"), "fuse-drop-mnt");
    {
        let _m = mount(view.clone(), &mp.path, &MountOptions::default()).unwrap();
        assert_eq!(std::fs::read(mp.path.join("a.txt")).unwrap(), b"hello\n");
    }
    assert!(!is_mounted(&mp.path));
    // External umount is noticed and unmount() then succeeds.
    let m = mount(view, &mp.path, &MountOptions::default()).unwrap();
    let st = Command::new("umount").arg(&mp.path).status().unwrap();
    assert!(st.success());
    for _ in 0..50 {
        if !m.is_alive() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!m.is_alive());
    m.unmount().unwrap();
    assert!(!is_mounted(&mp.path));
    // A file is not a mount point.
    let e = mount(
        store
            .collection("d")
            .unwrap()
            .view(&Principal::operator())
            .unwrap(),
        &src.path.join("a.txt"),
        &MountOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("not a directory"), "{e}");
}

#[test]
fn a_mount_made_before_its_view_serves_only_that_view_once_loaded() {
    use sandlot_vfs::fuse::{mount_slot, ViewSlot};
    use sandlot_vfs::{StoreError, View};
    use std::sync::Arc;
    if !fuse_available() {
        return;
    }
    let src = TempDir::new(Path::new("/tmp"), "fuse-slot-src");
    std::fs::create_dir_all(src.path.join("src")).unwrap();
    std::fs::write(src.path.join("a.txt"), b"hello\n").unwrap();
    std::fs::write(src.path.join("src/secret.txt"), b"eng only\n").unwrap();
    let sd = TempDir::new(Path::new("/tmp"), "fuse-slot-store");
    let store = Store::open(&sd.path).unwrap();
    let policy = AclPolicy {
        default: Acl::public(),
        rules: vec![AclRule {
            pattern: "src/**".into(),
            acl: Acl::groups(["eng"]),
        }],
    };
    store
        .create(
            "s",
            Source::Dir {
                path: src.path.clone(),
            },
            IngestOptions { acl: policy },
        )
        .unwrap();
    // The view loaded without the index has the same pruned tree as the store's.
    let anon = Principal::anonymous();
    let unindexed = View::load_unindexed(&sd.path, "s", 1, &anon).unwrap();
    let cached = store.collection("s").unwrap().view(&anon).unwrap();
    assert_eq!(unindexed.tree().len(), cached.tree().len());
    assert!(matches!(
        View::load_unindexed(&sd.path, "s", 9, &anon),
        Err(StoreError::NoSuchVersion { version: 9, .. })
    ));
    assert!(View::load_unindexed(&sd.path, "../s", 1, &anon).is_err());

    // Requests made before the view is supplied wait for it, then see only it.
    let mp = TempDir::new(Path::new("/tmp"), "fuse-slot-mnt");
    let slot = ViewSlot::new();
    let m = mount_slot("s", slot.clone(), &mp.path, &MountOptions::default())
        .unwrap()
        .serve()
        .unwrap();
    let dir = mp.path.clone();
    let reader = std::thread::spawn(move || {
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        (names, std::fs::read(dir.join("a.txt")).unwrap())
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        !reader.is_finished(),
        "a request was answered before the view existed"
    );
    slot.fill(Ok(Arc::new(unindexed)));
    let (names, a) = reader.join().unwrap();
    assert_eq!(names, vec!["a.txt".to_string()]);
    assert_eq!(a, b"hello\n");
    assert!(std::fs::metadata(mp.path.join("src/secret.txt")).is_err());
    m.unmount().unwrap();

    // A view that could not be loaded: every request fails with EIO.
    let slot = ViewSlot::new();
    slot.fill(Err("no view".into()));
    let m = mount_slot("s", slot, &mp.path, &MountOptions::default())
        .unwrap()
        .serve()
        .unwrap();
    let e = std::fs::read_dir(&mp.path).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    m.unmount().unwrap();
    assert!(!is_mounted(&mp.path));
}
