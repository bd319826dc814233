//! Picking up edits made outside Sandlot: an inotify watch on the store's folders that
//! reconciles the index with the files after each burst of changes, and re-embeds pending
//! chunks when idle.
//!
//! A store can be mounted read-write into an untrusted sandbox, so the folders watched are
//! chosen from data the sandbox writes, and the watch belongs to the daemon (root). Three
//! rules follow:
//!
//! * **No link is followed.** Folders are found by walking the store through directory
//!   descriptors (each opened beneath the root with `RESOLVE_NO_SYMLINKS`), and each watch
//!   is added on the descriptor itself (`/proc/self/fd/N`), never on a path the sandbox could
//!   swap for a link between a check and the watch. (A recursive watch by path walked and
//!   watched whatever a new folder's name pointed to by the time the watcher looked: a
//!   folder created and swapped for `l -> /` had the daemon watch the whole host.)
//! * **Bounded.** inotify watches and instances are counted per user across the host
//!   (`fs.inotify.max_user_watches`, `max_user_instances`), and the daemon is root: one
//!   instance serves every store of the process ([`Hub`]), each store watches at most
//!   [`WatchOptions::max_folders`] folders, and all stores together at most a quarter of the
//!   host's `max_user_watches`. Changes in folders past that are picked up by the next
//!   reconcile (a change in a watched folder, or `reindex`).
//! * **Hidden folders are not watched** (`.git`, the index's `.sandlot`, any `.name`): they
//!   are not part of the index.

use std::collections::{HashMap, HashSet};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::fs::inotify::{self, ReadFlags, WatchFlags};
use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::store::{Store, StoreError, SyncReport};

/// Errors from starting a watcher.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("watch store {root}: {source}")]
    Inotify {
        root: String,
        #[source]
        source: std::io::Error,
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
    /// Most folders of this store watched (the root included).
    pub max_folders: usize,
    pub on_sync: Option<SyncCallback>,
}

/// [`WatchOptions::max_folders`] by default: a memory store is notes in a few folders.
pub const DEFAULT_MAX_FOLDERS: usize = 1024;

impl Default for WatchOptions {
    fn default() -> WatchOptions {
        WatchOptions {
            debounce: Duration::from_millis(50),
            max_delay: Duration::from_millis(500),
            embed_batch: 64,
            max_folders: DEFAULT_MAX_FOLDERS,
            on_sync: None,
        }
    }
}

/// A running watcher; stops (and joins its thread) when dropped.
pub struct Watcher {
    id: u64,
    hub: Arc<Hub>,
    stop: Arc<AtomicBool>,
    syncs: Arc<AtomicU64>,
    signals: Arc<Signals>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Reconciles run so far.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Folders of the store watched now.
    pub fn folders(&self) -> usize {
        self.hub.folders(self.id)
    }

    /// Whether a folder was ever left unwatched because a cap was reached.
    pub fn capped(&self) -> bool {
        self.signals.capped.load(Ordering::Relaxed)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Removes the store's watches and its wake-up sender: the thread sees the channel
        // close.
        self.hub.unregister(self.id);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What happened to a store since its thread last looked.
#[derive(Debug, Default)]
struct Signals {
    /// A new folder appeared (or events were lost): walk the store for folders to watch.
    rewatch: AtomicBool,
    capped: AtomicBool,
}

/// One store known to the [`Hub`].
struct Registered {
    wake: SyncSender<()>,
    signals: Arc<Signals>,
    wds: HashSet<i32>,
    max: usize,
}

#[derive(Default)]
struct HubState {
    next_id: u64,
    /// Watch descriptor → store.
    by_wd: HashMap<i32, u64>,
    stores: HashMap<u64, Registered>,
}

/// The process's one inotify instance, shared by every store it watches, and the thread
/// that reads its events.
struct Hub {
    fd: OwnedFd,
    /// Most watches all stores together hold.
    cap: usize,
    held: AtomicUsize,
    state: Mutex<HubState>,
}

/// Events a watched folder reports.
const MASK: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::CLOSE_WRITE)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::ONLYDIR)
    .union(WatchFlags::EXCL_UNLINK);

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

fn lock(m: &Mutex<HubState>) -> MutexGuard<'_, HubState> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The share of the host's per-user watch limit all stores together may hold.
fn host_share() -> usize {
    std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .unwrap_or(8192)
        / 4
}

/// Whether an entry named `name` can matter to the index (hidden ones cannot).
fn visible(name: &[u8]) -> bool {
    !name.starts_with(b".")
}

impl Hub {
    /// The process's hub, started on first use.
    fn get() -> std::io::Result<Arc<Hub>> {
        static HUB: Mutex<Option<Arc<Hub>>> = Mutex::new(None);
        let mut g = HUB.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = g.as_ref() {
            return Ok(h.clone());
        }
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC)?;
        let hub = Arc::new(Hub {
            fd,
            cap: host_share().max(1),
            held: AtomicUsize::new(0),
            state: Mutex::new(HubState::default()),
        });
        let reader = hub.clone();
        std::thread::Builder::new()
            .name("sandlot-memory-inotify".into())
            .spawn(move || reader.read_events())?;
        *g = Some(hub.clone());
        Ok(hub)
    }

    fn register(&self, wake: SyncSender<()>, signals: Arc<Signals>, max: usize) -> u64 {
        let mut st = lock(&self.state);
        st.next_id += 1;
        let id = st.next_id;
        st.stores.insert(
            id,
            Registered {
                wake,
                signals,
                wds: HashSet::new(),
                max,
            },
        );
        id
    }

    fn unregister(&self, id: u64) {
        let mut st = lock(&self.state);
        let Some(r) = st.stores.remove(&id) else {
            return;
        };
        for wd in r.wds {
            st.by_wd.remove(&wd);
            self.held.fetch_sub(1, Ordering::Relaxed);
            let _ = inotify::remove_watch(&self.fd, wd);
        }
    }

    fn folders(&self, id: u64) -> usize {
        lock(&self.state).stores.get(&id).map_or(0, |r| r.wds.len())
    }

    /// Watches the folder open at `dir` for store `id`; `false` when a cap refused it.
    fn add(&self, id: u64, dir: &OwnedFd) -> std::io::Result<bool> {
        let mut st = lock(&self.state);
        let Some(r) = st.stores.get(&id) else {
            return Ok(false);
        };
        if r.wds.len() >= r.max || self.held.load(Ordering::Relaxed) >= self.cap {
            r.signals.capped.store(true, Ordering::Relaxed);
            return Ok(false);
        }
        // The descriptor's own folder: the magic link leads to exactly the object opened,
        // whatever its name leads to now.
        let wd = inotify::add_watch(
            &self.fd,
            format!("/proc/self/fd/{}", dir.as_raw_fd()).as_str(),
            MASK,
        )?;
        if st.by_wd.insert(wd, id).is_none() {
            self.held.fetch_add(1, Ordering::Relaxed);
            if let Some(r) = st.stores.get_mut(&id) {
                r.wds.insert(wd);
            }
        }
        Ok(true)
    }

    /// Walks the store at `root` by descriptors (no link followed, hidden folders skipped)
    /// and watches every folder not watched yet, up to the caps (at most `max` folders
    /// wait to be looked at: a folder of a million folders costs no more).
    fn watch_tree(&self, id: u64, root: &Path, max: usize) -> std::io::Result<()> {
        let root_fd = rustix::fs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut stack = vec![String::new()];
        while let Some(rel) = stack.pop() {
            let opened = if rel.is_empty() {
                rustix::fs::openat(
                    &root_fd,
                    ".",
                    OFlags::RDONLY | OFlags::DIRECTORY,
                    Mode::empty(),
                )
            } else {
                rustix::fs::openat2(
                    &root_fd,
                    rel.as_str(),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                    RESOLVE,
                )
            };
            // Gone, or swapped for a link or a file meanwhile: nothing to watch there.
            let Ok(dir) = opened else { continue };
            if !self.add(id, &dir)? {
                return Ok(());
            }
            let Ok(entries) = rustix::fs::Dir::read_from(&dir) else {
                continue;
            };
            for ent in entries.flatten() {
                let name = ent.file_name().to_bytes();
                if !visible(name) || name == b"." || name == b".." {
                    continue;
                }
                if !matches!(
                    ent.file_type(),
                    rustix::fs::FileType::Directory | rustix::fs::FileType::Unknown
                ) {
                    continue;
                }
                let Ok(name) = std::str::from_utf8(name) else {
                    continue;
                };
                if stack.len() >= max {
                    break;
                }
                stack.push(crate::tree::join(&rel, name));
            }
        }
        Ok(())
    }

    /// The event loop: tells each store what happened in its folders.
    fn read_events(self: Arc<Hub>) {
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 64 * 1024];
        let mut events = inotify::Reader::new(&self.fd, &mut buf);
        loop {
            let ev = match events.next() {
                Ok(ev) => ev,
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            let flags = ev.events();
            let mut st = lock(&self.state);
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                // Events were lost: every store looks at everything again.
                for r in st.stores.values() {
                    r.signals.rewatch.store(true, Ordering::Relaxed);
                    let _ = r.wake.try_send(());
                }
                continue;
            }
            let Some(&id) = st.by_wd.get(&ev.wd()) else {
                continue;
            };
            if flags.contains(ReadFlags::IGNORED) {
                // The folder is gone (or its watch was removed).
                st.by_wd.remove(&ev.wd());
                if let Some(r) = st.stores.get_mut(&id) {
                    if r.wds.remove(&ev.wd()) {
                        self.held.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                continue;
            }
            if let Some(n) = ev.file_name() {
                if !visible(n.to_bytes()) {
                    continue;
                }
            }
            let Some(r) = st.stores.get(&id) else {
                continue;
            };
            if flags.contains(ReadFlags::ISDIR)
                && flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO)
            {
                r.signals.rewatch.store(true, Ordering::Relaxed);
            }
            let _ = r.wake.try_send(());
        }
    }
}

/// Starts watching `store`'s files. Runs one reconcile first, so changes made while nothing was
/// watching are picked up too.
pub fn watch(store: Arc<Store>, opts: WatchOptions) -> Result<Watcher, WatchError> {
    let root = store.root().to_path_buf();
    let inotify_err = |source: std::io::Error| WatchError::Inotify {
        root: root.display().to_string(),
        source,
    };
    let hub = Hub::get().map_err(inotify_err)?;
    // One pending wake-up at most: a flood of events costs no memory.
    let (wake, rx) = sync_channel::<()>(1);
    let signals = Arc::new(Signals::default());
    let max = opts.max_folders.max(1);
    let id = hub.register(wake, signals.clone(), max);
    if let Err(e) = hub.watch_tree(id, &root, max) {
        hub.unregister(id);
        return Err(inotify_err(e));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let syncs = Arc::new(AtomicU64::new(0));
    let worker = Worker {
        store,
        root: root.clone(),
        hub: hub.clone(),
        id,
        signals: signals.clone(),
        stop: stop.clone(),
        syncs: syncs.clone(),
        opts,
    };
    let thread = std::thread::Builder::new()
        .name("sandlot-memory-watch".into())
        .spawn(move || worker.run(rx));
    let thread = match thread {
        Ok(t) => t,
        Err(source) => {
            hub.unregister(id);
            return Err(WatchError::Thread {
                root: root.display().to_string(),
                source,
            });
        }
    };
    Ok(Watcher {
        id,
        hub,
        stop,
        syncs,
        signals,
        thread: Some(thread),
    })
}

/// The thread of one watched store.
struct Worker {
    store: Arc<Store>,
    root: PathBuf,
    hub: Arc<Hub>,
    id: u64,
    signals: Arc<Signals>,
    stop: Arc<AtomicBool>,
    syncs: Arc<AtomicU64>,
    opts: WatchOptions,
}

impl Worker {
    fn run_sync(&self) {
        // New folders are watched first, then everything is reconciled: what was written in
        // them before their watch existed is picked up here.
        if self.signals.rewatch.swap(false, Ordering::Relaxed) {
            let _ = self
                .hub
                .watch_tree(self.id, &self.root, self.opts.max_folders.max(1));
        }
        let res = self.store.sync();
        self.syncs.fetch_add(1, Ordering::Relaxed);
        if let Some(cb) = &self.opts.on_sync {
            cb(res.as_ref());
        }
    }

    fn run(self, rx: Receiver<()>) {
        self.run_sync();
        let mut pending_embeds = true;
        while !self.stop.load(Ordering::Relaxed) {
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
                        match rx.recv_timeout(self.opts.debounce) {
                            Ok(()) if started.elapsed() < self.opts.max_delay => continue,
                            Ok(()) => break,
                            Err(RecvTimeoutError::Timeout) => break,
                            Err(RecvTimeoutError::Disconnected) => return,
                        }
                    }
                    self.run_sync();
                    pending_embeds = true;
                }
                Err(RecvTimeoutError::Timeout) => {
                    if pending_embeds {
                        pending_embeds = matches!(
                            self.store.embed_pending(self.opts.embed_batch),
                            Ok(n) if n > 0
                        );
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}
