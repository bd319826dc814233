//! Picking up edits made outside Sandlot: an inotify watcher (via `notify`) that reconciles the
//! index with the files after each burst of changes, and re-embeds pending chunks when idle.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use notify::{RecursiveMode, Watcher as _};

use crate::store::{Store, StoreError, SyncReport, INDEX_DIR};

/// Errors from starting a watcher.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("watch store {root}: {source}")]
    Notify {
        root: String,
        #[source]
        source: notify::Error,
    },
    #[error("start watcher thread for {root}: {source}")]
    Thread {
        root: String,
        #[source]
        source: std::io::Error,
    },
}

/// Called after every reconcile the watcher runs.
pub type SyncCallback = Box<dyn Fn(Result<&SyncReport, &StoreError>) + Send>;

/// Watcher settings.
pub struct WatchOptions {
    /// Quiet time after the last change before reconciling (a `git checkout` is one burst).
    pub debounce: Duration,
    /// Longest a burst may delay a reconcile.
    pub max_delay: Duration,
    /// Chunks embedded per idle step when vectors of the active model are missing.
    pub embed_batch: usize,
    pub on_sync: Option<SyncCallback>,
}

impl Default for WatchOptions {
    fn default() -> WatchOptions {
        WatchOptions {
            debounce: Duration::from_millis(50),
            max_delay: Duration::from_millis(500),
            embed_batch: 64,
            on_sync: None,
        }
    }
}

/// A running watcher; stops (and joins its thread) when dropped.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    syncs: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
    // Dropping the notify watcher closes the event channel.
    inner: Option<notify::RecommendedWatcher>,
}

impl Watcher {
    /// Reconciles run so far.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        drop(self.inner.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether a changed path can affect the index (hidden paths, `.git` and the index itself can't).
fn relevant(root: &Path, p: &Path) -> bool {
    let Ok(rel) = p.strip_prefix(root) else {
        return false;
    };
    !rel.components().any(|c| {
        let s = c.as_os_str().to_string_lossy();
        s.starts_with('.') || s == INDEX_DIR
    })
}

/// Starts watching `store`'s files. Runs one reconcile first, so changes made while nothing was
/// watching are picked up too.
pub fn watch(store: Arc<Store>, opts: WatchOptions) -> Result<Watcher, WatchError> {
    let root = store.root().to_path_buf();
    let (tx, rx) = channel::<()>();
    let root_for_events = root.clone();
    let handler = move |res: notify::Result<notify::Event>| {
        match res {
            Ok(ev) => {
                if ev.paths.iter().any(|p| relevant(&root_for_events, p)) || ev.need_rescan() {
                    let _ = tx.send(());
                }
            }
            // Queue overflow and similar: reconcile everything.
            Err(_) => {
                let _ = tx.send(());
            }
        }
    };
    // Never through a symbolic link: a sandbox that mounts the store could plant `l -> /`
    // and have the daemon walk, and watch, the whole host.
    let config = notify::Config::default().with_follow_symlinks(false);
    let mut inner =
        notify::RecommendedWatcher::new(handler, config).map_err(|source| WatchError::Notify {
            root: root.display().to_string(),
            source,
        })?;
    inner
        .watch(&root, RecursiveMode::Recursive)
        .map_err(|source| WatchError::Notify {
            root: root.display().to_string(),
            source,
        })?;
    let stop = Arc::new(AtomicBool::new(false));
    let syncs = Arc::new(AtomicU64::new(0));
    let (stop2, syncs2) = (stop.clone(), syncs.clone());
    let thread = std::thread::Builder::new()
        .name("sandlot-memory-watch".into())
        .spawn(move || {
            let run_sync = |store: &Store| {
                let res = store.sync();
                syncs2.fetch_add(1, Ordering::Relaxed);
                if let Some(cb) = &opts.on_sync {
                    cb(res.as_ref());
                }
            };
            run_sync(&store);
            let mut pending_embeds = true;
            while !stop2.load(Ordering::Relaxed) {
                let wait = if pending_embeds {
                    Duration::from_millis(0)
                } else {
                    Duration::from_millis(200)
                };
                match rx.recv_timeout(wait) {
                    Ok(()) => {
                        // Debounce: wait for a quiet period, bounded by max_delay.
                        let started = Instant::now();
                        loop {
                            match rx.recv_timeout(opts.debounce) {
                                Ok(()) if started.elapsed() < opts.max_delay => continue,
                                Ok(()) => break,
                                Err(RecvTimeoutError::Timeout) => break,
                                Err(RecvTimeoutError::Disconnected) => return,
                            }
                        }
                        run_sync(&store);
                        pending_embeds = true;
                    }
                    Err(RecvTimeoutError::Timeout) => {
                        if pending_embeds {
                            pending_embeds =
                                matches!(store.embed_pending(opts.embed_batch), Ok(n) if n > 0);
                        }
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
        })
        .map_err(|source| WatchError::Thread {
            root: root.display().to_string(),
            source,
        })?;
    Ok(Watcher {
        stop,
        syncs,
        thread: Some(thread),
        inner: Some(inner),
    })
}
