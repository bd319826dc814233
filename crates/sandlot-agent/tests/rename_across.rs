//! Regression tests: renames across directories. Inside a sandbox, landlock answers
//! EXDEV to every reparenting rename (its ruleset does not grant
//! LANDLOCK_ACCESS_FS_REFER), and a rename between two mounts is EXDEV anyway; the
//! agent must still move the file or tree, with the semantics of rename(2).

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use common::{TempDir, TestAgent};
use sandlot_guest::client::{ErrorCode, RenameRequest};

/// Applies a landlock ruleset like the sandbox's (handles only device-node
/// creation, so REFER is denied), then execs its arguments. Exit 77: no landlock.
const LANDLOCK_WRAPPER: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
CREATE, RESTRICT = 444, 446
if libc.syscall(CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1)) < 1:
    sys.exit(77)
if libc.prctl(38, 1, 0, 0, 0) != 0:
    sys.exit(78)
attr = (ctypes.c_uint64 * 1)((1 << 6) | (1 << 11))
fd = libc.syscall(CREATE, ctypes.byref(attr), ctypes.c_size_t(8), ctypes.c_uint32(0))
if fd < 0 or libc.syscall(RESTRICT, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
    sys.exit(79)
os.execv(sys.argv[1], sys.argv[1:])
"#;

fn landlock_available() -> bool {
    let st = Command::new("python3")
        .args(["-c", LANDLOCK_WRAPPER, "/bin/true"])
        .status()
        .expect("python3 is required by this test (scripts/setup.sh installs it)");
    match st.code() {
        Some(0) => true,
        Some(77) => false,
        other => panic!("the landlock wrapper failed: {other:?}"),
    }
}

/// A directory on another filesystem, removed on drop.
struct ShmDir(std::path::PathBuf);

impl ShmDir {
    fn new(parent: &Path) -> ShmDir {
        let p = parent.join(format!("sandlot-guest-rename-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        ShmDir(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
    fn join(&self, s: &str) -> std::path::PathBuf {
        self.0.join(s)
    }
    fn str(&self, s: &str) -> String {
        self.join(s).to_string_lossy().into_owned()
    }
}

impl Drop for ShmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rename(from: &str, to: &str, overwrite: bool) -> RenameRequest {
    let mut r = RenameRequest::new(from, to);
    r.overwrite = overwrite;
    r
}

#[tokio::test]
async fn rename_across_directories_under_landlock() {
    if !landlock_available() {
        eprintln!("SKIPPED rename_across_directories_under_landlock: this kernel has no landlock, so it cannot refuse reparenting");
        return;
    }
    // The condition the agent meets in a sandbox: a plain rename(2) across
    // directories is EXDEV under this ruleset.
    let probe = TempDir::new("landlock-probe");
    std::fs::create_dir_all(probe.join("a")).unwrap();
    std::fs::create_dir_all(probe.join("b")).unwrap();
    std::fs::write(probe.join("a/f"), b"x").unwrap();
    let o = Command::new("python3")
        .args(["-c", LANDLOCK_WRAPPER, "/usr/bin/env", "python3", "-c"])
        .arg(format!(
            "import os\ntry:\n os.rename({:?}, {:?})\nexcept OSError as e:\n print(e.errno)",
            probe.str("a/f"),
            probe.str("b/f")
        ))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        libc::EXDEV.to_string(),
        "the landlock wrapper should make rename(2) across directories fail with EXDEV; stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );

    let a = TestAgent::start_wrapped(&["python3", "-c", LANDLOCK_WRAPPER], &[]);
    let c = a.client().await;
    let d = a.dir.str("t");
    std::fs::create_dir_all(format!("{d}/deep/dir")).unwrap();
    std::fs::create_dir_all(format!("{d}/deep/other")).unwrap();
    std::fs::write(format!("{d}/deep/dir/a.txt"), b"moved").unwrap();
    std::fs::set_permissions(
        format!("{d}/deep/dir/a.txt"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    c.rename(rename(
        &format!("{d}/deep/dir/a.txt"),
        &format!("{d}/deep/other/b.txt"),
        true,
    ))
    .await
    .expect("a file moves to another directory");
    assert!(!Path::new(&format!("{d}/deep/dir/a.txt")).exists());
    assert_eq!(
        std::fs::read(format!("{d}/deep/other/b.txt")).unwrap(),
        b"moved"
    );
    let m = std::fs::metadata(format!("{d}/deep/other/b.txt")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o640);

    // A whole directory, into another directory.
    std::fs::create_dir_all(format!("{d}/deep/dir/sub/x")).unwrap();
    std::fs::write(format!("{d}/deep/dir/sub/x/y"), b"y").unwrap();
    c.rename(rename(
        &format!("{d}/deep/dir/sub"),
        &format!("{d}/deep/other/sub2"),
        false,
    ))
    .await
    .expect("a directory moves to another directory");
    assert_eq!(
        std::fs::read(format!("{d}/deep/other/sub2/x/y")).unwrap(),
        b"y"
    );
    assert!(!Path::new(&format!("{d}/deep/dir/sub")).exists());
    a.finish(&c).await;
}

#[tokio::test]
async fn rename_across_filesystems() {
    let a = TestAgent::start();
    let c = a.client().await;
    let other = Path::new("/dev/shm");
    let here = std::fs::metadata(a.dir.path()).unwrap().dev();
    if !other.is_dir() || std::fs::metadata(other).unwrap().dev() == here {
        eprintln!(
            "SKIPPED rename_across_filesystems: /dev/shm is not a filesystem separate from {}",
            a.dir.path().display()
        );
        a.finish(&c).await;
        return;
    }
    let shm = ShmDir::new(other);
    let d = a.dir.str("src");
    std::fs::create_dir_all(format!("{d}/tree/sub")).unwrap();
    std::fs::write(format!("{d}/tree/sub/file"), b"contents").unwrap();
    std::fs::set_permissions(
        format!("{d}/tree/sub/file"),
        std::fs::Permissions::from_mode(0o751),
    )
    .unwrap();
    std::os::unix::fs::symlink("sub/file", format!("{d}/tree/link")).unwrap();
    let at = |tv_sec| rustix::fs::Timespec { tv_sec, tv_nsec: 0 };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        format!("{d}/tree/sub/file").as_str(),
        &rustix::fs::Timestamps {
            last_access: at(1_000_000_000),
            last_modification: at(1_000_000_007),
        },
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
    std::fs::write(format!("{d}/single"), b"one").unwrap();

    // overwrite=false with an existing destination: refused, nothing moves.
    std::fs::write(shm.join("taken"), b"old").unwrap();
    let e = c
        .rename(rename(&format!("{d}/single"), &shm.str("taken"), false))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::AlreadyExists), "{e}");
    assert_eq!(std::fs::read(format!("{d}/single")).unwrap(), b"one");
    assert_eq!(std::fs::read(shm.join("taken")).unwrap(), b"old");

    // A directory over a non-empty directory: refused like rename(2).
    std::fs::create_dir_all(shm.join("full/x")).unwrap();
    let e = c
        .rename(rename(&format!("{d}/tree"), &shm.str("full"), true))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::DirectoryNotEmpty), "{e}");
    // A file over a directory.
    let e = c
        .rename(rename(&format!("{d}/single"), &shm.str("full"), true))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::IsADirectory), "{e}");

    // overwrite=true replaces a file.
    c.rename(rename(&format!("{d}/single"), &shm.str("taken"), true))
        .await
        .unwrap();
    assert_eq!(std::fs::read(shm.join("taken")).unwrap(), b"one");
    assert!(!Path::new(&format!("{d}/single")).exists());

    // A tree: contents, modes, times and symlinks survive.
    c.rename(rename(&format!("{d}/tree"), &shm.str("moved"), false))
        .await
        .unwrap();
    assert!(!Path::new(&format!("{d}/tree")).exists());
    let f = shm.join("moved/sub/file");
    assert_eq!(std::fs::read(&f).unwrap(), b"contents");
    let m = std::fs::metadata(&f).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o751);
    assert_eq!(m.mtime(), 1_000_000_007);
    assert_eq!(
        std::fs::read_link(shm.join("moved/link")).unwrap(),
        Path::new("sub/file")
    );
    // No temporary copy is left next to the destination.
    let names: Vec<String> = std::fs::read_dir(shm.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.starts_with('.')),
        "leftover temporary entries: {names:?}"
    );
    a.finish(&c).await;
}
