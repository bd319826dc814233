//! Read-only FUSE mount of one principal's view of a collection, so real
//! tools (`rg`, `grep -r`, `find`, `os.walk`) see exactly what the virtual
//! shell shows: the same pruned tree, sizes, modes and times.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, LockOwner, MountOption, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, Request, SessionACL,
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
/// Each open file holds one descriptor of its stored blob, nothing more: content
/// is read in place, a request at a time, so a reader cannot make the server
/// buffer documents.
pub const MAX_OPEN_FILES: usize = 4096;

const TTL: Duration = Duration::from_secs(60);
const DIR_SIZE: u64 = 4096;

/// The filesystem served over FUSE.
pub struct VfsFs {
    view: Arc<View>,
    open: Mutex<HashMap<u64, Arc<std::fs::File>>>,
    next_fh: AtomicU64,
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

impl VfsFs {
    /// Serve `view`.
    pub fn new(view: Arc<View>) -> Self {
        VfsFs {
            view,
            open: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
        }
    }

    fn valid(&self, ino: INodeNo) -> Option<NodeId> {
        let n = ino.0.checked_sub(1)?;
        if (n as usize) < self.view.tree().len() {
            Some(n as NodeId)
        } else {
            None
        }
    }

    fn attr(&self, n: NodeId) -> FileAttr {
        let tree = self.view.tree();
        let (kind, size, mtime, nlink, perm) = match &tree.node(n).kind {
            NodeKind::Dir { mtime, subdirs, .. } => {
                (FileType::Directory, DIR_SIZE, *mtime, 2 + *subdirs, 0o555)
            }
            NodeKind::File { .. } => {
                let d = self.view.doc(n);
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
}

impl Filesystem for VfsFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(p) = self.valid(parent) else {
            return reply.error(Errno::ENOENT);
        };
        let tree = self.view.tree();
        if !tree.is_dir(p) {
            return reply.error(Errno::ENOTDIR);
        }
        let Some(name) = name.to_str() else {
            return reply.error(Errno::ENOENT);
        };
        match tree.child(p, name) {
            Some(c) => reply.entry(&TTL, &self.attr(c), Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.valid(ino) {
            Some(n) => reply.attr(&TTL, &self.attr(n)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let Some(n) = self.valid(ino) else {
            return reply.error(Errno::ENOENT);
        };
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        if self.view.tree().is_dir(n) {
            return reply.error(Errno::EISDIR);
        }
        let Some(path) = self.view.blob_path(n) else {
            return reply.error(Errno::EIO);
        };
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.len() >= MAX_OPEN_FILES {
            return reply.error(Errno::EMFILE);
        }
        match std::fs::File::open(&path) {
            Ok(f) => {
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                open.insert(fh, Arc::new(f));
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE);
            }
            Err(_) => reply.error(Errno::EIO),
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
            // A handle we never gave out (the kernel only uses ours): open in place.
            None => match self
                .valid(ino)
                .and_then(|n| self.view.blob_path(n))
                .and_then(|p| std::fs::File::open(p).ok())
            {
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

    fn opendir(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let Some(n) = self.valid(ino) else {
            return reply.error(Errno::ENOENT);
        };
        if !self.view.tree().is_dir(n) {
            return reply.error(Errno::ENOTDIR);
        }
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(n) = self.valid(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let tree = self.view.tree();
        if !tree.is_dir(n) {
            return reply.error(Errno::ENOTDIR);
        }
        // Entries: ".", "..", then children in sorted order. Offsets are 1-based positions.
        let mut entries: Vec<(INodeNo, FileType, &str)> = vec![
            (ino_of(n), FileType::Directory, "."),
            (ino_of(tree.node(n).parent), FileType::Directory, ".."),
        ];
        for &c in tree.children(n) {
            let kind = if tree.is_dir(c) {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            entries.push((ino_of(c), kind, &tree.node(c).name));
        }
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let tree = self.view.tree();
        let blocks: u64 = (0..tree.len() as u32)
            .map(|n| self.attr(n).blocks)
            .sum::<u64>()
            / 8;
        reply.statfs(blocks, 0, 0, tree.len() as u64, 0, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let Some(n) = self.valid(ino) else {
            return reply.error(Errno::ENOENT);
        };
        if mask.contains(AccessFlags::W_OK) {
            return reply.error(Errno::EROFS);
        }
        if mask.contains(AccessFlags::X_OK) && !self.view.tree().is_dir(n) {
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

/// Mount `view` read-only at `mountpoint`, served by a background thread.
pub fn mount(view: Arc<View>, mountpoint: &Path, opts: &MountOptions) -> Result<Mount, FuseError> {
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
    let collection = view.collection().to_string();
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
    let fs = VfsFs::new(view);
    let session =
        fuser::spawn_mount(fs, mountpoint, &config).map_err(|source| FuseError::Mount {
            collection,
            path: mountpoint.to_path_buf(),
            source,
        })?;
    Ok(Mount {
        session: Some(session),
        path: mountpoint.to_path_buf(),
    })
}
