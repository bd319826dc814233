//! The store's watcher against a work tree a sandbox writes: it never watches through a
//! link, however the link appears, and it holds a bounded number of the host's inotify
//! watches and instances.

mod common;

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{eventually, TempDir};
use sandlot_memory::{Author, EmbedError, Embedder, Store, WatchOptions};

/// Vectors that need no model: these tests are about which files are looked at.
struct Flat;

impl Embedder for Flat {
    fn model_id(&self) -> &str {
        "flat"
    }
    fn dim(&self) -> usize {
        4
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(texts.iter().map(|_| vec![0.5; 4]).collect())
    }
}

fn store(root: &Path) -> Arc<Store> {
    Arc::new(Store::init(root, Arc::new(Flat), &Author::default()).unwrap())
}

/// The inodes this process's inotify instances watch (`/proc/self/fdinfo`), and how many
/// instances it holds.
fn watched_inodes() -> (Vec<u64>, usize) {
    let mut inodes = Vec::new();
    let mut instances = 0;
    for e in std::fs::read_dir("/proc/self/fdinfo").unwrap().flatten() {
        let Ok(s) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let mut any = false;
        for l in s.lines().filter(|l| l.starts_with("inotify wd:")) {
            any = true;
            let ino = l
                .split_whitespace()
                .find_map(|w| w.strip_prefix("ino:"))
                .unwrap();
            inodes.push(u64::from_str_radix(ino, 16).unwrap());
        }
        let link = std::fs::read_link(format!("/proc/self/fd/{}", e.file_name().to_string_lossy()));
        if any || link.is_ok_and(|l| l == Path::new("anon_inode:inotify")) {
            instances += 1;
        }
    }
    (inodes, instances)
}

/// The attack: a folder is created in the store (the watcher sees it appear) and swapped
/// for a link to a host directory before the watcher looks at it. The watcher must never
/// watch the host directory or anything under it.
#[test]
fn a_folder_swapped_for_a_link_is_never_watched() {
    let base = TempDir::new("watch-swap");
    let root = base.path().join("store");
    let host = base.path().join("host");
    std::fs::create_dir_all(host.join("etc/cron.d")).unwrap();
    let host_dirs: HashSet<u64> = [host.clone(), host.join("etc"), host.join("etc/cron.d")]
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().ino())
        .collect();
    let s = store(&root);
    let w = sandlot_memory::watch(s, WatchOptions::default()).unwrap();
    for i in 0..200 {
        let d = root.join("notes");
        std::fs::create_dir(&d).unwrap();
        std::fs::rename(&d, root.join(format!("old-{i}"))).unwrap();
        std::os::unix::fs::symlink(&host, &d).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        std::fs::remove_file(&d).unwrap();
    }
    // The watcher has looked at every new folder by now.
    assert!(eventually(10, || w.folders() == 201), "{}", w.folders());
    let (watched, _) = watched_inodes();
    let leaked: Vec<_> = watched.iter().filter(|i| host_dirs.contains(i)).collect();
    assert!(leaked.is_empty(), "host directories watched: {leaked:?}");
    drop(w);
}

/// A sandbox making thousands of folders gets the store's cap of watches, no more; every
/// store of the process shares one inotify instance (the host counts them per user, and
/// the daemon is root).
#[test]
fn folders_past_the_cap_are_not_watched_and_stores_share_one_instance() {
    let base = TempDir::new("watch-cap");
    let (_, instances_before) = watched_inodes();
    let mut watchers = Vec::new();
    for n in 0..3 {
        let root = base.path().join(format!("store-{n}"));
        let s = store(&root);
        for i in 0..40 {
            std::fs::create_dir_all(root.join(format!("f{i}/g"))).unwrap();
        }
        let opts = WatchOptions {
            max_folders: 16,
            ..Default::default()
        };
        watchers.push((sandlot_memory::watch(s.clone(), opts).unwrap(), s, root));
    }
    for (w, _, _) in &watchers {
        assert_eq!(w.folders(), 16);
        assert!(w.capped());
    }
    let (_, instances) = watched_inodes();
    assert!(
        instances <= instances_before.max(1),
        "{instances} inotify instances for 3 stores"
    );
    // What the watch misses, the next reconcile finds.
    let (w, s, root) = &watchers[0];
    std::fs::write(root.join("f39/g/late.md"), "# Late\nan unwatched folder\n").unwrap();
    std::fs::write(root.join("top.md"), "# Top\nthe root is watched\n").unwrap();
    assert!(
        eventually(10, || s.counts().unwrap().0 == 2),
        "{:?}",
        s.counts()
    );
    assert!(w.syncs() >= 2);
}
