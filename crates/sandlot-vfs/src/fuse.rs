//! Read-only FUSE mount of one principal's view of a collection, so real
//! tools (`rg`, `grep -r`, `find`, `os.walk`) see exactly what the virtual
//! shell shows: the same pruned tree, sizes, modes and times.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, MountOption, OpenAccMode, OpenFlags, ReplyAttr,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    Request, SessionACL,
};

use crate::manifest::{NodeId, NodeKind};
use crate::store::View;

/// Errors from mounting.
#[derive(Debug, thiserror::Error)]
pub enum FuseError {
    /// The mount point is missing or not a directory.
    #[error("mount point {path}: {reason}")]
    MountPoint { path: PathBuf, reason: String },
    /// The kernel mount failed (no /dev/fuse, no fusermount3, not permitted).
    #[error("mount {collection} on {path}")]
    Mount {
        collection: String,
        path: PathBuf,
        source: io::Error,
    },
    /// Unmounting failed.
    #[error("unmount {path}")]
    Unmount {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Mount options.
#[derive(Debug, Clone, Default)]
pub struct MountOptions {
    /// Let users other than the mounting one access the mount (`allow_other`).
    pub allow_other: bool,
}

/// Most files open at once through one mount; past it `open` fails with EMFILE.
/// Only on kernels without no-open support: elsewhere `open` is not a request at
/// all (see [`VfsFs`]) and every read opens its stored blob in place. Content is
/// read in place, a request at a time, so a reader cannot make the server buffer
/// documents.
pub const MAX_OPEN_FILES: usize = 4096;

/// How long the kernel may cache entries and attributes. The view is one pinned,
/// immutable version: nothing it serves ever changes, so the caches never go stale.
const TTL: Duration = Duration::from_secs(24 * 3600);
const DIR_SIZE: u64 = 4096;
/// Request threads per mount: reads and readahead of one tree walk are answered
/// in parallel.
const THREADS: usize = 2;

/// The view a mount serves, supplied once, possibly after the mount exists:
/// requests that arrive before it wait for it (so a mount can be handed out while
/// its view is still loading, and never serves anything else). Cloning shares it.
#[derive(Clone, Default)]
pub struct ViewSlot(Arc<SlotInner>);

#[derive(Default)]
struct SlotInner {
    /// The view, or why it could not be loaded (requests then fail with EIO).
    value: OnceLock<Result<Arc<View>, String>>,
    lock: Mutex<()>,
    filled: Condvar,
}

impl ViewSlot {
    /// An empty slot.
    pub fn new() -> ViewSlot {
        ViewSlot::default()
    }

    /// Supplies the view (or the reason there is none) and wakes waiting requests.
    /// Only the first call counts.
    pub fn fill(&self, view: Result<Arc<View>, String>) {
        let _g = self.0.lock.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self.0.value.set(view);
        self.0.filled.notify_all();
    }

    /// The view, waiting until it is supplied; None if it could not be loaded.
    fn wait(&self) -> Option<&View> {
        if let Some(v) = self.0.value.get() {
            return v.as_deref().ok();
        }
        let mut g = self.0.lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(v) = self.0.value.get() {
                return v.as_deref().ok();
            }
            g = self.0.filled.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// The filesystem served over FUSE.
///
/// What it asks of the kernel (where the kernel offers it): no `open`/`opendir`
/// requests (answered ENOSYS once; the kernel then keeps file pages and directory
/// listings cached across opens), `readdirplus` (a listing carries every entry's
/// attributes, so a tree walk needs no `lookup` per entry), parallel directory
/// operations, the largest readahead, and entries and attributes cached for a day.
pub struct VfsFs {
    view: ViewSlot,
    open: Mutex<HashMap<u64, Arc<std::fs::File>>>,
    next_fh: AtomicU64,
    /// The kernel handles ENOSYS from `open` (no open requests from then on).
    no_open: bool,
    /// The kernel handles ENOSYS from `opendir`.
    no_opendir: bool,
    statfs_blocks: OnceLock<u64>,
}

fn ino_of(n: NodeId) -> INodeNo {
    INodeNo(u64::from(n) + 1)
}

fn time_of(secs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

/// The node of inode `ino` in `view`, if any.
fn valid(view: &View, ino: INodeNo) -> Option<NodeId> {
    let n = ino.0.checked_sub(1)?;
    if (n as usize) < view.tree().len() {
        Some(n as NodeId)
    } else {
        None
    }
}

/// The attributes of node `n`.
fn attr_of(view: &View, n: NodeId) -> FileAttr {
    let tree = view.tree();
    let (kind, size, mtime, nlink, perm) = match &tree.node(n).kind {
        NodeKind::Dir { mtime, subdirs, .. } => {
            (FileType::Directory, DIR_SIZE, *mtime, 2 + *subdirs, 0o555)
        }
        NodeKind::File { .. } => {
            let d = view.doc(n);
            (
                FileType::RegularFile,
                d.map(|d| d.size).unwrap_or(0),
                d.map(|d| d.mtime).unwrap_or(0),
                1,
                0o444,
            )
        }
    };
    let t = time_of(mtime);
    FileAttr {
        ino: ino_of(n),
        size,
        blocks: if kind == FileType::Directory {
            8
        } else {
            size.div_ceil(4096) * 8
        },
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        kind,
        perm,
        nlink,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// The entries of directory `n`: ".", "..", then its children in sorted order.
/// Offsets given to the kernel are 1-based positions in this list.
/// A directory's entries: (node, kind, name).
type Listing<'a> = Vec<(NodeId, FileType, &'a str)>;

fn dir_entries(view: &View, n: NodeId) -> Listing<'_> {
    let tree = view.tree();
    let mut entries: Vec<(NodeId, FileType, &str)> = Vec::with_capacity(tree.children(n).len() + 2);
    entries.push((n, FileType::Directory, "."));
    entries.push((tree.node(n).parent, FileType::Directory, ".."));
    for &c in tree.children(n) {
        let kind = if tree.is_dir(c) {
            FileType::Directory
        } else {
            FileType::RegularFile
        };
        entries.push((c, kind, &tree.node(c).name));
    }
    entries
}

impl VfsFs {
    /// Serve `view`.
    pub fn new(view: Arc<View>) -> Self {
        let slot = ViewSlot::new();
        slot.fill(Ok(view));
        VfsFs::with_slot(slot)
    }

    /// Serve the view `slot` is (or will be) filled with.
    pub fn with_slot(slot: ViewSlot) -> Self {
        VfsFs {
            view: slot,
            open: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            no_open: false,
            no_opendir: false,
            statfs_blocks: OnceLock::new(),
        }
    }

    /// The view (waiting for it), or EIO if it could not be loaded.
    fn view(&self) -> Result<&View, Errno> {
        self.view.wait().ok_or(Errno::EIO)
    }

    /// The view and the node of `ino` in it.
    fn node(&self, ino: INodeNo) -> Result<(&View, NodeId), Errno> {
        let view = self.view()?;
        let n = valid(view, ino).ok_or(Errno::ENOENT)?;
        Ok((view, n))
    }

    /// The entries of directory `ino` (`.` and `..` first), for readdir(plus).
    fn listing(&self, ino: INodeNo) -> Result<(&View, Listing<'_>), Errno> {
        let (view, n) = self.node(ino)?;
        if !view.tree().is_dir(n) {
            return Err(Errno::ENOTDIR);
        }
        Ok((view, dir_entries(view, n)))
    }
}

/// The stored blob of file node `n`, opened for reading.
fn open_blob(view: &View, n: NodeId) -> Option<std::fs::File> {
    view.blob_path(n).and_then(|p| std::fs::File::open(p).ok())
}

impl Filesystem for VfsFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let caps = config.capabilities();
        self.no_open = caps.contains(InitFlags::FUSE_NO_OPEN_SUPPORT);
        self.no_opendir = caps.contains(InitFlags::FUSE_NO_OPENDIR_SUPPORT);
        for want in [
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_PARALLEL_DIROPS,
        ] {
            if caps.contains(want) {
                let _ = config.add_capabilities(want);
            }
        }
        // As much readahead as the kernel allows (it answers with its maximum).
        if let Err(max) = config.set_max_readahead(u32::MAX) {
            let _ = config.set_max_readahead(max);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let (view, p) = match self.node(parent) {
            Ok(v) => v,
            Err(e) => return reply.error(e),
        };
        let tree = view.tree();
        if !tree.is_dir(p) {
            return reply.error(Errno::ENOTDIR);
        }
        let Some(name) = name.to_str() else {
            return reply.error(Errno::ENOENT);
        };
        match tree.child(p, name) {
            Some(c) => reply.entry(&TTL, &attr_of(view, c), Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.node(ino) {
            Ok((view, n)) => reply.attr(&TTL, &attr_of(view, n)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if self.no_open {
            // The kernel then opens without asking, from now on, keeping cached
            // pages (the mount is read-only: it refuses writable opens itself).
            return reply.error(Errno::ENOSYS);
        }
        let (view, n) = match self.node(ino) {
            Ok(v) => v,
            Err(e) => return reply.error(e),
        };
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        if view.tree().is_dir(n) {
            return reply.error(Errno::EISDIR);
        }
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.len() >= MAX_OPEN_FILES {
            return reply.error(Errno::EMFILE);
        }
        match open_blob(view, n) {
            Some(f) => {
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                open.insert(fh, Arc::new(f));
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE);
            }
            None => reply.error(Errno::EIO),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let file = self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&fh.0)
            .cloned();
        let file = match file {
            Some(f) => f,
            // No handle (the kernel opens without asking): the blob, in place.
            None => match self.node(ino).ok().and_then(|(view, n)| open_blob(view, n)) {
                Some(f) => Arc::new(f),
                None => return reply.error(Errno::EIO),
            },
        };
        match read_range(&file, offset, size as usize) {
            Ok(buf) => reply.data(&buf),
            Err(_) => reply.error(Errno::EIO),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fh.0);
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing is ever written: the kernel stops sending flushes.
        reply.error(Errno::ENOSYS);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if self.no_opendir {
            // The kernel then opens directories without asking and caches their
            // listings (FOPEN_CACHE_DIR).
            return reply.error(Errno::ENOSYS);
        }
        let (view, n) = match self.node(ino) {
            Ok(v) => v,
            Err(e) => return reply.error(e),
        };
        if !view.tree().is_dir(n) {
            return reply.error(Errno::ENOTDIR);
        }
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        reply.opened(
            FileHandle(0),
            FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR,
        );
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match self.listing(ino) {
            Ok((_, e)) => e,
            Err(e) => return reply.error(e),
        };
        for (i, (c, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(ino_of(*c), (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let (view, entries) = match self.listing(ino) {
            Ok(v) => v,
            Err(e) => return reply.error(e),
        };
        for (i, (c, _, name)) in entries.iter().enumerate().skip(offset as usize) {
            let attr = attr_of(view, *c);
            if reply.add(ino_of(*c), (i + 1) as u64, name, &TTL, &attr, Generation(0)) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let view = match self.view() {
            Ok(v) => v,
            Err(e) => return reply.error(e),
        };
        let tree = view.tree();
        let blocks = *self.statfs_blocks.get_or_init(|| {
            (0..tree.len() as u32)
                .map(|n| attr_of(view, n).blocks)
                .sum::<u64>()
                / 8
        });
        reply.statfs(blocks, 0, 0, tree.len() as u64, 0, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let (view, n) = match self.node(ino) {
            Ok(v) => v,
            Err(e) => return reply.error(e),
        };
        if mask.contains(AccessFlags::W_OK) {
            return reply.error(Errno::EROFS);
        }
        if mask.contains(AccessFlags::X_OK) && !view.tree().is_dir(n) {
            return reply.error(Errno::EACCES);
        }
        reply.ok();
    }
}

/// Up to `size` bytes at `offset` (fewer at the end of the file).
fn read_range(file: &std::fs::File, offset: u64, size: usize) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; size];
    let mut got = 0;
    while got < size {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

/// A live mount; unmounted on [`Mount::unmount`] or drop.
pub struct Mount {
    session: Option<fuser::BackgroundSession>,
    path: PathBuf,
}

impl std::fmt::Debug for Mount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mount").field("path", &self.path).finish()
    }
}

impl Mount {
    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the filesystem is still being served (false after an external `umount`).
    pub fn is_alive(&self) -> bool {
        self.session
            .as_ref()
            .is_some_and(|s| !s.guard.is_finished())
    }

    /// Unmount and wait for the serving thread to end.
    pub fn unmount(mut self) -> Result<(), FuseError> {
        self.unmount_inner()
    }

    fn unmount_inner(&mut self) -> Result<(), FuseError> {
        match self.session.take() {
            Some(s) => {
                let finished = s.guard.is_finished();
                let res = if finished {
                    s.join()
                } else {
                    s.umount_and_join()
                };
                // An already-unmounted filesystem is not an error here.
                match res {
                    Err(e) if !finished && !is_mounted(&self.path) => {
                        let _ = e;
                        Ok(())
                    }
                    Err(e) if is_mounted(&self.path) => Err(FuseError::Unmount {
                        path: self.path.clone(),
                        source: e,
                    }),
                    _ => Ok(()),
                }
            }
            None => Ok(()),
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = self.unmount_inner();
    }
}

/// Whether `path` is currently a mount point (per /proc/self/mountinfo).
pub fn is_mounted(path: &Path) -> bool {
    let Ok(canon) = std::fs::canonicalize(path) else {
        return false;
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = canon.to_string_lossy().replace(' ', "\\040");
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

/// Mount `view` read-only at `mountpoint`, served by background threads.
pub fn mount(view: Arc<View>, mountpoint: &Path, opts: &MountOptions) -> Result<Mount, FuseError> {
    let collection = view.collection().to_string();
    let slot = ViewSlot::new();
    slot.fill(Ok(view));
    mount_slot(&collection, slot, mountpoint, opts)?.serve()
}

/// A mount whose kernel handshake is done but whose requests are not served yet
/// (no thread started): the place to drop privileges, which serving threads then
/// inherit. Dropped unserved, it is unmounted.
pub struct PendingMount {
    session: fuser::Session<VfsFs>,
    collection: String,
    path: PathBuf,
}

impl std::fmt::Debug for PendingMount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingMount")
            .field("path", &self.path)
            .finish()
    }
}

impl PendingMount {
    /// Starts the request threads.
    pub fn serve(self) -> Result<Mount, FuseError> {
        let PendingMount {
            session,
            collection,
            path,
        } = self;
        let session = session.spawn().map_err(|source| FuseError::Mount {
            collection,
            path: path.clone(),
            source,
        })?;
        Ok(Mount {
            session: Some(session),
            path,
        })
    }
}

/// Mount collection `collection` read-only at `mountpoint` (in the calling thread:
/// mount and kernel handshake; no thread is started until [`PendingMount::serve`]),
/// possibly before its view is loaded: requests wait until `slot` is filled
/// ([`ViewSlot::fill`]), and fail with EIO if it is filled with an error. The
/// caller can hand the mount out (bind it elsewhere) while it loads the view.
pub fn mount_slot(
    collection: &str,
    slot: ViewSlot,
    mountpoint: &Path,
    opts: &MountOptions,
) -> Result<PendingMount, FuseError> {
    let md = std::fs::metadata(mountpoint).map_err(|e| FuseError::MountPoint {
        path: mountpoint.to_path_buf(),
        reason: e.to_string(),
    })?;
    if !md.is_dir() {
        return Err(FuseError::MountPoint {
            path: mountpoint.to_path_buf(),
            reason: "not a directory".into(),
        });
    }
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("sandlot-vfs:{collection}")),
        MountOption::Subtype("sandlot".into()),
        MountOption::RO,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoExec,
        MountOption::NoAtime,
        MountOption::DefaultPermissions,
    ];
    if opts.allow_other {
        config.acl = SessionACL::All;
    }
    // The threads share the one descriptor: cloning it would open /dev/fuse after
    // the caller may have dropped the right to.
    config.n_threads = Some(THREADS);
    let fs = VfsFs::with_slot(slot);
    let session =
        fuser::Session::new(fs, mountpoint, &config).map_err(|source| FuseError::Mount {
            collection: collection.to_string(),
            path: mountpoint.to_path_buf(),
            source,
        })?;
    Ok(PendingMount {
        session,
        collection: collection.to_string(),
        path: mountpoint.to_path_buf(),
    })
}
