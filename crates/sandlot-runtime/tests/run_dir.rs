//! The sandboxes' run directory (root only): on a tmpfs of the runtime's own (see
//! `sandlot_runtime::run_dir`), and what a sweep of it removes.

use std::fs;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use sandlot_runtime::run_dir::{is_memory_fs, RunDirFs, TMPFS_SOURCE};
use sandlot_runtime::{NamespaceBackend, RuntimeConfig};

fn running_as_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A directory on a disk file system for the run directories of this test, removed
/// (with any tmpfs mounted under it) when dropped.
struct DiskDir(PathBuf);

impl DiskDir {
    fn new() -> Option<DiskDir> {
        let candidates = [
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
            "/var/tmp".into(),
        ];
        for c in candidates {
            let d = c.join(format!("run-dir-test-{}", std::process::id()));
            fs::create_dir_all(&d).unwrap();
            if !is_memory_fs(&d).unwrap() {
                return Some(DiskDir(d));
            }
            fs::remove_dir_all(&d).unwrap();
        }
        None
    }
}

impl Drop for DiskDir {
    fn drop(&mut self) {
        for m in mounts_under(&self.0) {
            let c = std::ffi::CString::new(m.0.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: c is a valid C string.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// (mount point, file system type, source, mount options, optional fields) of every
/// mount at or under `dir`.
fn mounts_under(dir: &Path) -> Vec<(PathBuf, String, String, String, String)> {
    let mi = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut out = Vec::new();
    for l in mi.lines() {
        let (pre, post) = l.split_once(" - ").unwrap();
        let f: Vec<&str> = pre.split(' ').collect();
        let g: Vec<&str> = post.split(' ').collect();
        let at = PathBuf::from(f[4]);
        if at.starts_with(dir) {
            out.push((
                at,
                g[0].to_string(),
                g[1].to_string(),
                f[5].to_string(),
                f[6..].join(" "),
            ));
        }
    }
    out
}

fn backend(run_dir: &Path, tmpfs: bool) -> NamespaceBackend {
    let mut cfg = RuntimeConfig::new(PathBuf::from("/bin/false"));
    cfg.run_dir = run_dir.to_path_buf();
    cfg.cgroup_parent = format!("sandlot-rundir-test-{}", std::process::id());
    cfg.run_dir_tmpfs = tmpfs;
    NamespaceBackend::new(cfg).expect("a backend")
}

/// A sandbox directory as the runtime publishes it, its `alive` lock held (a live
/// PID 1) or not (a dead one).
fn sandbox_dir(run_dir: &Path, id: &str, live: bool) -> Option<fs::File> {
    let d = run_dir.join("sandboxes").join(id);
    fs::create_dir_all(&d).unwrap();
    let f = fs::File::create(d.join("alive")).unwrap();
    if live {
        // SAFETY: f is an open file.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
        return Some(f);
    }
    None
}

#[test]
fn sandboxes_run_dir_moves_to_a_tmpfs_only_when_nothing_lives_there() {
    assert!(
        running_as_root(),
        "privileged test: run as root (it mounts tmpfs); CI runs as root"
    );
    let Some(base) = DiskDir::new() else {
        eprintln!(
            "SKIPPED sandboxes_run_dir_moves_to_a_tmpfs_only_when_nothing_lives_there: \
             neither CARGO_TARGET_TMPDIR nor /var/tmp is on a disk file system here, so there \
             is nothing to move to a tmpfs"
        );
        return;
    };

    // Not asked to: left on the disk, nothing mounted.
    let off = base.0.join("off");
    let b = backend(&off, false);
    match b.run_dir_fs() {
        RunDirFs::Disk(why) => assert!(why.contains("turned off"), "{why}"),
        other => panic!("{other:?}"),
    }
    drop(b);
    assert!(mounts_under(&off).is_empty());

    // A live sandbox keeps the disk (a mount would hide its socket); a dead one is
    // swept first.
    let run = base.0.join("run");
    let live = sandbox_dir(&run, "sb-live", true);
    sandbox_dir(&run, "sb-dead", false);
    let b = backend(&run, true);
    match b.run_dir_fs() {
        RunDirFs::Disk(why) => {
            assert!(why.starts_with("1 live sandbox(es)"), "{why}");
            assert!(why.contains("sb-live"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    drop(b);
    assert!(mounts_under(&run).is_empty(), "mounted over a live sandbox");
    assert!(run.join("sandboxes/sb-live").exists());
    assert!(
        !run.join("sandboxes/sb-dead").exists(),
        "the dead sandbox was not swept"
    );

    // Once it is dead: swept, and a private tmpfs mounted in its place.
    drop(live);
    let b = backend(&run, true);
    assert_eq!(b.run_dir_fs(), &RunDirFs::Mounted);
    drop(b);
    let sandboxes = run.join("sandboxes");
    assert!(is_memory_fs(&sandboxes).unwrap());
    let m = mounts_under(&run);
    assert_eq!(m.len(), 1, "{m:?}");
    let (at, fstype, source, opts, optional) = &m[0];
    assert_eq!(at, &sandboxes);
    assert_eq!((fstype.as_str(), source.as_str()), ("tmpfs", TMPFS_SOURCE));
    for o in ["nosuid", "nodev", "noexec"] {
        assert!(opts.split(',').any(|x| x == o), "{o} missing in {opts}");
    }
    assert!(
        !optional.contains("shared:") && !optional.contains("master:"),
        "the tmpfs propagates: {optional}"
    );
    assert!(fs::read_dir(&sandboxes).unwrap().next().is_none());
    // The slot locks stay on the disk, where no mount can hide a held one.
    assert!(!is_memory_fs(&run.join("slots")).unwrap());

    // The next backend (a restarted daemon, a `sandlot run`) finds it: no second mount.
    let b = backend(&run, true);
    assert_eq!(b.run_dir_fs(), &RunDirFs::Memory);
    drop(b);
    assert_eq!(mounts_under(&run).len(), 1);

    // Backends starting together mount exactly once.
    let race = base.0.join("race");
    let outcomes: Vec<RunDirFs> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| backend(&race, true).run_dir_fs().clone()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mounted = outcomes.iter().filter(|o| **o == RunDirFs::Mounted).count();
    let memory = outcomes.iter().filter(|o| **o == RunDirFs::Memory).count();
    assert_eq!((mounted, memory), (1, 3), "{outcomes:?}");
    assert_eq!(mounts_under(&race).len(), 1, "{:?}", mounts_under(&race));

    drop(base);
    assert!(
        mounts_under(Path::new(env!("CARGO_TARGET_TMPDIR"))).is_empty(),
        "the test left a mount"
    );
}

/// `sweep` once removed a run directory another process was publishing, between the
/// creation of its `alive` file and its lock. A young temporary directory is never
/// swept, even unlocked; a minute-old one is.
#[test]
fn sweep_leaves_a_directory_being_published() {
    assert!(
        running_as_root(),
        "privileged test: run as root (a runtime backend needs it); CI runs as root"
    );
    let run = std::env::temp_dir().join(format!("sandlot-sweep-{}", std::process::id()));
    let mut cfg = RuntimeConfig::new(PathBuf::from("/bin/false"));
    cfg.run_dir = run.clone();
    cfg.cgroup_parent = format!("sandlot-sweep-test-{}", std::process::id());
    let b = NamespaceBackend::new(cfg).expect("a backend");
    // Named as a publisher's temporary directory; its publisher (pid 1) is alive.
    let tmp = run.join("sandboxes").join(".new-x-1");
    fs::create_dir_all(&tmp).unwrap();
    fs::File::create(tmp.join("alive")).unwrap();
    assert!(b.sweep().is_empty());
    assert!(tmp.exists(), "a directory being published was swept");
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(120);
    fs::File::open(&tmp).unwrap().set_modified(old).unwrap();
    b.sweep();
    assert!(!tmp.exists(), "minute-old debris was not swept");
    drop(b);
    fs::remove_dir_all(&run).unwrap();
}
