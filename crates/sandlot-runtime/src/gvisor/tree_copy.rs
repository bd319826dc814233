//! A copy of a tree of files a sandbox wrote, made by the daemon (root) and
//! safe against the tree's contents: it walks with directory descriptors, never
//! with paths. Each directory is opened relative to its parent's descriptor with
//! `O_NOFOLLOW | O_DIRECTORY`, listed through its own descriptor, and every
//! entry is looked at with `fstatat(AT_SYMLINK_NOFOLLOW)` and opened with
//! `openat(O_NOFOLLOW)`; the copy's entries are made relative to the
//! destination directory's descriptor. A directory swapped for a link between
//! the look and the open is refused (`ENOTDIR`), never followed.
//!
//! The copy writes no more than the tree holds: holes of a sparse file stay
//! holes (`SEEK_DATA`/`SEEK_HOLE`), and files hard-linked together stay linked
//! in the copy. The bytes written are counted against [`Limits::bytes`], and the
//! walk (an explicit stack, no recursion) against [`Limits::depth`] and
//! [`Limits::entries`]: past any of them the copy stops with
//! [`RuntimeError::PastLimit`] and the caller removes what it made.
//!
//! [`copy_layer`] copies an overlay's upper directory (a store image's writable
//! layer): besides, it keeps the overlay's whiteouts (character devices 0:0,
//! made anew with `mknodat`; any other device node is left out) and the `user.`
//! extended attributes of directories and files (`user.overlay.opaque` and the
//! overlay's other attributes, read from and written to open descriptors).

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use crate::{sys, RuntimeError};

/// Bounds of one copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of file data the copy may write.
    pub bytes: u64,
    /// Levels of directories below the top the copy goes into.
    pub depth: usize,
    /// Entries (of any kind) the copy takes.
    pub entries: u64,
}

/// Most levels of directories a copy goes into.
pub const MAX_DEPTH: usize = 256;
/// Most entries one copy takes.
pub const MAX_ENTRIES: u64 = 4_000_000;

impl Limits {
    /// At most `bytes` of data, [`MAX_DEPTH`] levels and [`MAX_ENTRIES`] entries.
    pub fn bytes(bytes: u64) -> Limits {
        Limits {
            bytes,
            depth: MAX_DEPTH,
            entries: MAX_ENTRIES,
        }
    }
}

/// What a copy did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Copied {
    /// Bytes of file data written.
    pub bytes: u64,
    /// Entries left out (not a directory, regular file or link).
    pub skipped: u64,
    /// Entries taken.
    pub entries: u64,
}

const CHUNK: usize = 1 << 20;

fn io_err(what: String) -> impl FnOnce(io::Error) -> RuntimeError {
    move |source| RuntimeError::Io { what, source }
}

fn shown(name: &CStr) -> String {
    name.to_string_lossy().into_owned()
}

/// Opens directory `path` for a walk, refusing a link as its last component.
pub fn open_dir(path: &Path) -> Result<OwnedFd, RuntimeError> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map(OwnedFd::from)
        .map_err(io_err(format!("open {}", path.display())))
}

/// What a walk takes besides directories, regular files and links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Nothing else.
    Files,
    /// An overlay's upper layer: whiteouts and `user.` extended attributes too.
    Layer,
}

/// Most `user.` extended attributes one entry of a layer carries in its copy.
const MAX_XATTRS: usize = 64;

/// Copies directory `from` into directory `to` (made, mode 0700 until its
/// attributes are set, if missing; `to`'s parent is the caller's), within
/// `limits`. Blocking.
pub fn copy_tree(from: &Path, to: &Path, limits: Limits) -> Result<Copied, RuntimeError> {
    copy_tree_as(from, to, limits, Kind::Files)
}

/// [`copy_tree`] of an overlay's upper directory: its whiteouts and `user.`
/// extended attributes (opaque directories) kept too. Blocking.
pub fn copy_layer(from: &Path, to: &Path, limits: Limits) -> Result<Copied, RuntimeError> {
    copy_tree_as(from, to, limits, Kind::Layer)
}

fn copy_tree_as(
    from: &Path,
    to: &Path,
    limits: Limits,
    kind: Kind,
) -> Result<Copied, RuntimeError> {
    let src = open_dir(from)?;
    match std::fs::create_dir(to) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            return Err(io_err(format!("create {}", to.display()))(e))
        }
        _ => {}
    }
    let dst = open_dir(to)?;
    if kind == Kind::Layer {
        sys::copy_user_xattrs(src.as_fd(), dst.as_fd(), MAX_XATTRS)
            .map_err(io_err(format!("copy the attributes of {}", from.display())))?;
    }
    walk(src, dst, limits, kind).map_err(|e| match e {
        RuntimeError::Io { what, source } => RuntimeError::Io {
            what: format!("copy {} to {}: {what}", from.display(), to.display()),
            source,
        },
        e => e,
    })
}

/// A directory being copied: its source and copy, the names left to take.
struct Frame {
    src: OwnedFd,
    dst: OwnedFd,
    st: libc::stat,
    names: std::vec::IntoIter<CString>,
}

impl Frame {
    fn new(src: OwnedFd, dst: OwnedFd, name: &str) -> Result<Frame, RuntimeError> {
        let st = sys::fstat(src.as_fd()).map_err(io_err(format!("stat {name}")))?;
        let names = sys::read_dir_names(src.as_fd()).map_err(io_err(format!("read {name}")))?;
        Ok(Frame {
            src,
            dst,
            st,
            names: names.into_iter(),
        })
    }
}

/// The walk of [`copy_tree`], from open directories.
pub fn copy_tree_fd(src: OwnedFd, dst: OwnedFd, limits: Limits) -> Result<Copied, RuntimeError> {
    walk(src, dst, limits, Kind::Files)
}

fn walk(src: OwnedFd, dst: OwnedFd, limits: Limits, kind: Kind) -> Result<Copied, RuntimeError> {
    let mut out = Copied::default();
    let root = dst
        .try_clone()
        .map_err(io_err("duplicate the copy's top".into()))?;
    let mut stack = vec![Frame::new(src, dst, ".")?];
    // The path (from the copy's top) of each level's directory.
    let mut path: Vec<CString> = Vec::new();
    // (device, inode) of each file of several links → its first copy's path.
    let mut linked: HashMap<(u64, u64), CString> = HashMap::new();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let depth = stack.len();
        let Some(top) = stack.last_mut() else { break };
        let Some(name) = top.names.next() else {
            let done = stack.pop().expect("a frame");
            set_attrs(done.dst.as_fd(), None, &done.st).map_err(io_err("set attributes".into()))?;
            path.pop();
            continue;
        };
        out.entries += 1;
        if out.entries > limits.entries {
            return Err(RuntimeError::PastLimit {
                what: "the sandbox's files",
                limit: limits.entries,
                unit: "entries",
            });
        }
        let (s, d) = (top.src.as_fd(), top.dst.as_fd());
        let st = sys::lstatat(s, &name).map_err(io_err(format!("stat {}", shown(&name))))?;
        #[cfg(test)]
        tests::after_look(s, &name);
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => {
                if depth > limits.depth {
                    return Err(RuntimeError::PastLimit {
                        what: "the depth of the sandbox's directories",
                        limit: limits.depth as u64,
                        unit: "levels",
                    });
                }
                // A link put in the directory's place since the look: refused.
                let sub = sys::open_dir_nofollow(s, &name)
                    .map_err(io_err(format!("open {}", shown(&name))))?;
                sys::mkdirat(d, &name, 0o700)
                    .map_err(io_err(format!("create {}", shown(&name))))?;
                let copy = sys::open_dir_nofollow(d, &name)
                    .map_err(io_err(format!("open the copy of {}", shown(&name))))?;
                if kind == Kind::Layer {
                    sys::copy_user_xattrs(sub.as_fd(), copy.as_fd(), MAX_XATTRS)
                        .map_err(io_err(format!("copy the attributes of {}", shown(&name))))?;
                }
                let frame = Frame::new(sub, copy, &shown(&name))?;
                path.push(name);
                stack.push(frame);
            }
            libc::S_IFREG => {
                let id = (st.st_dev, st.st_ino);
                if st.st_nlink > 1 {
                    if let Some(first) = linked.get(&id) {
                        let f = sys::open_no_symlinks(Some(root.as_fd()), first)
                            .map_err(io_err(format!("open the copy of {}", shown(first))))?;
                        sys::link_fd_at(f.as_fd(), d, &name)
                            .map_err(io_err(format!("link {}", shown(&name))))?;
                        continue;
                    }
                }
                let n = copy_file_at(s, &name, d, &name, &mut buf, &limits, out.bytes)?;
                out.bytes += n;
                if kind == Kind::Layer {
                    copy_file_xattrs(s, d, &name)?;
                }
                if st.st_nlink > 1 {
                    linked.insert(id, joined(&path, &name));
                }
            }
            libc::S_IFLNK => {
                let target = sys::readlinkat(s, &name)
                    .map_err(io_err(format!("read link {}", shown(&name))))?;
                sys::symlinkat(&target, d, &name)
                    .map_err(io_err(format!("create link {}", shown(&name))))?;
                set_attrs(d, Some(&name), &st)
                    .map_err(io_err(format!("set attributes of {}", shown(&name))))?;
            }
            libc::S_IFCHR if kind == Kind::Layer && st.st_rdev == 0 => {
                // An overlay whiteout: a file of the image the sandbox deleted.
                sys::mknod_whiteout_at(d, &name, st.st_mode)
                    .map_err(io_err(format!("create whiteout {}", shown(&name))))?;
                set_attrs(d, Some(&name), &st)
                    .map_err(io_err(format!("set attributes of {}", shown(&name))))?;
            }
            _ => out.skipped += 1,
        }
    }
    Ok(out)
}

/// The `user.` extended attributes of regular file `name` in `src` set on its
/// copy in `dst` (each opened without following a link, and only if it is still
/// a regular file).
fn copy_file_xattrs(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    name: &CStr,
) -> Result<(), RuntimeError> {
    let open = |dir: BorrowedFd<'_>| -> Result<OwnedFd, RuntimeError> {
        let f = sys::openat_nofollow(
            dir,
            name,
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
            0,
        )
        .map_err(io_err(format!("open {}", shown(name))))?;
        let st = sys::fstat(f.as_fd()).map_err(io_err(format!("stat {}", shown(name))))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(io_err(format!("copy {}", shown(name)))(io::Error::other(
                "no longer a regular file",
            )));
        }
        Ok(f)
    };
    let (from, to) = (open(src)?, open(dst)?);
    sys::copy_user_xattrs(from.as_fd(), to.as_fd(), MAX_XATTRS)
        .map_err(io_err(format!("copy the attributes of {}", shown(name))))?;
    Ok(())
}

fn joined(path: &[CString], name: &CStr) -> CString {
    let mut b = Vec::new();
    for p in path {
        b.extend_from_slice(p.as_bytes());
        b.push(b'/');
    }
    b.extend_from_slice(name.to_bytes());
    CString::new(b).expect("names hold no NUL")
}

/// Copies regular file `name` in `src` (no link followed) to new file `to` in
/// `dst`, its holes kept, with its owner, mode and times; `written` bytes of the
/// copy are already counted against `limits`. Returns the bytes written.
pub fn copy_file_at(
    src: BorrowedFd<'_>,
    name: &CStr,
    dst: BorrowedFd<'_>,
    to: &CStr,
    buf: &mut [u8],
    limits: &Limits,
    written: u64,
) -> Result<u64, RuntimeError> {
    let what = |w: &str| format!("{w} {}", shown(name));
    // O_NONBLOCK: a fifo put in the file's place is never waited on.
    let f = sys::openat_nofollow(
        src,
        name,
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
        0,
    )
    .map_err(io_err(what("open")))?;
    let st = sys::fstat(f.as_fd()).map_err(io_err(what("stat")))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(io_err(what("copy"))(io::Error::other(
            "no longer a regular file",
        )));
    }
    let out = sys::openat_nofollow(
        dst,
        to,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        0o600,
    )
    .map_err(io_err(format!("create {}", shown(to))))?;
    let (fin, fout) = (File::from(f), File::from(out));
    let size = u64::try_from(st.st_size).unwrap_or(0);
    let mut n = 0u64;
    let mut off = 0u64;
    while off < size {
        let data = match sys::seek_data_or_hole(fin.as_fd(), off, libc::SEEK_DATA) {
            Ok(Some(o)) => o,
            Ok(None) => break,
            // No SEEK_DATA here: all of it is data.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => off,
            Err(e) => return Err(io_err(what("seek in"))(e)),
        };
        let hole = match sys::seek_data_or_hole(fin.as_fd(), data, libc::SEEK_HOLE) {
            Ok(Some(o)) => o.min(size),
            Ok(None) => size,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => size,
            Err(e) => return Err(io_err(what("seek in"))(e)),
        };
        let mut at = data;
        while at < hole {
            let want = usize::try_from(hole - at)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            let got = fin
                .read_at(&mut buf[..want], at)
                .map_err(io_err(what("read")))?;
            if got == 0 {
                break;
            }
            if written + n + got as u64 > limits.bytes {
                return Err(RuntimeError::PastLimit {
                    what: "the copy of the sandbox's files",
                    limit: limits.bytes,
                    unit: "bytes",
                });
            }
            fout.write_all_at(&buf[..got], at)
                .map_err(io_err(format!("write {}", shown(to))))?;
            n += got as u64;
            at += got as u64;
        }
        off = hole.max(data + 1);
    }
    fout.set_len(size)
        .map_err(io_err(format!("size {}", shown(to))))?;
    set_attrs(fout.as_fd(), None, &st)
        .map_err(io_err(format!("set attributes of {}", shown(to))))?;
    Ok(n)
}

/// Owner, then mode (set-id bits included: a chown clears them) and times, of
/// `name` in `dir` (a link's own) or of `dir` itself when `name` is `None`.
fn set_attrs(dir: BorrowedFd<'_>, name: Option<&CStr>, st: &libc::stat) -> io::Result<()> {
    let times = [
        libc::timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec,
        },
        libc::timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec,
        },
    ];
    match name {
        Some(n) => sys::lchownat(dir, n, st.st_uid, st.st_gid)?,
        None => {
            sys::fchown_fd(dir, st.st_uid, st.st_gid)?;
            sys::fchmod(dir, st.st_mode & 0o7777)?;
        }
    }
    sys::set_times_at(dir, name, &times)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::path::PathBuf;

    type Hook = Box<dyn FnMut(BorrowedFd<'_>, &CStr)>;

    thread_local! {
        /// Run by the walk right after it looks at an entry (tests only).
        static AFTER_LOOK: RefCell<Option<Hook>> = RefCell::new(None);
    }

    pub(super) fn after_look(dir: BorrowedFd<'_>, name: &CStr) {
        AFTER_LOOK.with(|h| {
            if let Some(f) = h.borrow_mut().as_mut() {
                f(dir, name)
            }
        });
    }

    fn scratch(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("sandlot-tree-copy-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("src")).unwrap();
        dir
    }

    fn set_xattr(path: &Path, name: &str, value: &[u8]) {
        let (p, n) = (sys::cstr(path).unwrap(), CString::new(name).unwrap());
        // SAFETY: NUL-terminated path and name; `value` is readable for its length.
        let r = unsafe {
            libc::lsetxattr(
                p.as_ptr(),
                n.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        assert_eq!(r, 0, "setxattr {name}: {}", io::Error::last_os_error());
    }

    fn get_xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
        let (p, n) = (sys::cstr(path).unwrap(), CString::new(name).unwrap());
        let mut buf = vec![0u8; 256];
        // SAFETY: NUL-terminated path and name; `buf` is writable for its length.
        let r =
            unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        usize::try_from(r).ok().map(|n| buf[..n].to_vec())
    }

    #[test]
    fn a_layer_copy_keeps_whiteouts_opaque_directories_and_owners_and_follows_no_link() {
        // SAFETY: no arguments.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIPPED: making whiteouts (device nodes) needs root");
            return;
        }
        let dir = scratch("layer");
        let src = dir.join("src");
        // A file of the image the sandbox deleted: a whiteout, 0:0.
        let (gone, cgone) = (src.join("gone"), sys::cstr(&src.join("gone")).unwrap());
        // SAFETY: NUL-terminated path; device number 0 (a whiteout).
        assert_eq!(unsafe { libc::mknod(cgone.as_ptr(), libc::S_IFCHR, 0) }, 0);
        std::os::unix::fs::lchown(&gone, Some(100_000), Some(100_000)).unwrap();
        // A directory the sandbox removed and made again: opaque.
        fs::create_dir_all(src.join("opaque")).unwrap();
        fs::write(src.join("opaque/f"), b"new").unwrap();
        set_xattr(&src.join("opaque"), "user.overlay.opaque", b"y");
        std::os::unix::fs::lchown(src.join("opaque/f"), Some(1000), Some(1000)).unwrap();
        // Another device node is no whiteout: left out.
        let null = sys::cstr(&src.join("null")).unwrap();
        // SAFETY: NUL-terminated path; the device number of /dev/null.
        let made =
            unsafe { libc::mknod(null.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
        assert_eq!(made, 0);
        std::os::unix::fs::symlink("/etc", src.join("out")).unwrap();
        let dst = dir.join("dst");
        let out = copy_layer(&src, &dst, Limits::bytes(1 << 20)).unwrap();
        assert_eq!((out.bytes, out.skipped), (3, 1));
        let m = fs::symlink_metadata(dst.join("gone")).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_char_device(
            &m.file_type()
        ));
        assert_eq!((m.rdev(), m.uid(), m.gid()), (0, 100_000, 100_000));
        assert_eq!(
            get_xattr(&dst.join("opaque"), "user.overlay.opaque"),
            Some(b"y".to_vec())
        );
        assert_eq!(fs::read(dst.join("opaque/f")).unwrap(), b"new");
        assert_eq!(
            fs::symlink_metadata(dst.join("opaque/f")).unwrap().uid(),
            1000
        );
        assert!(fs::symlink_metadata(dst.join("null")).is_err());
        assert_eq!(fs::read_link(dst.join("out")).unwrap(), Path::new("/etc"));
        // A plain copy keeps neither.
        let plain = copy_tree(&src, &dir.join("plain"), Limits::bytes(1 << 20)).unwrap();
        assert_eq!(plain.skipped, 2);
        assert_eq!(
            get_xattr(&dir.join("plain/opaque"), "user.overlay.opaque"),
            None
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_tree_copy_keeps_files_links_and_modes_and_follows_no_link() {
        let dir = scratch("plain");
        let src = dir.join("src");
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::write(src.join("sub/f"), b"hello").unwrap();
        fs::set_permissions(src.join("sub/f"), fs::Permissions::from_mode(0o640)).unwrap();
        // A link out of the tree is copied as a link, never followed.
        std::os::unix::fs::symlink("/etc/hostname", src.join("out")).unwrap();
        let out = copy_tree(&src, &dir.join("dst"), Limits::bytes(1 << 20)).unwrap();
        assert_eq!(fs::read(dir.join("dst/sub/f")).unwrap(), b"hello");
        let m = fs::metadata(dir.join("dst/sub/f")).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o640);
        assert_eq!(
            fs::read_link(dir.join("dst/out")).unwrap(),
            Path::new("/etc/hostname")
        );
        assert_eq!((out.bytes, out.skipped, out.entries), (5, 0, 3));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_swapped_for_a_link_after_its_look_is_refused_not_followed() {
        let dir = scratch("swap");
        let (src, secret) = (dir.join("src"), dir.join("secret"));
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::create_dir_all(&secret).unwrap();
        fs::write(secret.join("key"), b"host secret").unwrap();
        let target = secret.clone();
        AFTER_LOOK.with(|h| {
            *h.borrow_mut() = Some(Box::new(move |d: BorrowedFd<'_>, name: &CStr| {
                if name == c"sub" {
                    // The directory goes and a link to the host's takes its name.
                    let s = sys::fd_path(d);
                    let here = PathBuf::from(s.to_str().unwrap());
                    let real = fs::read_link(&here).unwrap();
                    fs::rename(real.join("sub"), real.join("gone")).unwrap();
                    std::os::unix::fs::symlink(&target, real.join("sub")).unwrap();
                }
            }));
        });
        let r = copy_tree(&src, &dir.join("dst"), Limits::bytes(1 << 20));
        AFTER_LOOK.with(|h| *h.borrow_mut() = None);
        let e = r.unwrap_err();
        assert!(
            matches!(&e, RuntimeError::Io { source, .. }
                if matches!(source.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR))),
            "{e}"
        );
        assert!(!dir.join("dst/sub/key").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_walk_keeps_to_the_directory_it_opened_when_its_path_becomes_a_link() {
        let dir = scratch("moved");
        let (src, secret) = (dir.join("src"), dir.join("secret"));
        fs::write(src.join("mine"), b"sandbox").unwrap();
        fs::create_dir_all(&secret).unwrap();
        fs::write(secret.join("key"), b"host secret").unwrap();
        let top = open_dir(&src).unwrap();
        fs::rename(&src, dir.join("moved")).unwrap();
        std::os::unix::fs::symlink(&secret, &src).unwrap();
        fs::create_dir(dir.join("dst")).unwrap();
        let dst = open_dir(&dir.join("dst")).unwrap();
        copy_tree_fd(top, dst, Limits::bytes(1 << 20)).unwrap();
        assert_eq!(fs::read(dir.join("dst/mine")).unwrap(), b"sandbox");
        assert!(!dir.join("dst/key").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_sparse_file_stays_sparse_and_counts_only_its_data() {
        let dir = scratch("sparse");
        let f = fs::File::create(dir.join("src/big")).unwrap();
        f.set_len(1 << 30).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(b"tail", (1 << 30) - 4).unwrap();
        drop(f);
        let out = copy_tree(&dir.join("src"), &dir.join("dst"), Limits::bytes(1 << 20)).unwrap();
        let m = fs::metadata(dir.join("dst/big")).unwrap();
        assert_eq!(m.len(), 1 << 30);
        assert!(
            m.blocks() * 512 < 1 << 20,
            "{} blocks allocated",
            m.blocks()
        );
        assert!(out.bytes < 1 << 20, "{} bytes written", out.bytes);
        let c = fs::File::open(dir.join("dst/big")).unwrap();
        let mut b = [0u8; 4];
        c.read_exact_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"head");
        c.read_exact_at(&mut b, (1 << 30) - 4).unwrap();
        assert_eq!(&b, b"tail");
        c.read_exact_at(&mut b, 1 << 29).unwrap();
        assert_eq!(b, [0; 4]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hard_links_stay_links_and_their_data_is_written_once() {
        let dir = scratch("links");
        let src = dir.join("src");
        fs::create_dir(src.join("sub")).unwrap();
        fs::write(src.join("a"), vec![7u8; 100_000]).unwrap();
        for n in 0..50 {
            fs::hard_link(src.join("a"), src.join(format!("sub/l{n}"))).unwrap();
        }
        // Room for one copy of the data only.
        let out = copy_tree(&src, &dir.join("dst"), Limits::bytes(150_000)).unwrap();
        assert_eq!(out.bytes, 100_000);
        let a = fs::metadata(dir.join("dst/a")).unwrap();
        let l = fs::metadata(dir.join("dst/sub/l49")).unwrap();
        assert_eq!((a.ino(), a.nlink()), (l.ino(), 51));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_copy_stops_once_past_its_byte_limit() {
        let dir = scratch("bytes");
        fs::write(dir.join("src/a"), vec![1u8; 300_000]).unwrap();
        fs::write(dir.join("src/b"), vec![2u8; 300_000]).unwrap();
        let e = copy_tree(&dir.join("src"), &dir.join("dst"), Limits::bytes(500_000)).unwrap_err();
        assert!(
            matches!(
                e,
                RuntimeError::PastLimit {
                    limit: 500_000,
                    unit: "bytes",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("500000 bytes"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_tree_deeper_than_the_limit_fails_cleanly() {
        let dir = scratch("deep");
        // 3000 levels: deeper than a path can name, so made through descriptors.
        let mut d = open_dir(&dir.join("src")).unwrap();
        for _ in 0..3000 {
            sys::mkdirat(d.as_fd(), c"d", 0o755).unwrap();
            d = sys::open_dir_nofollow(d.as_fd(), c"d").unwrap();
        }
        drop(d);
        let e = copy_tree(&dir.join("src"), &dir.join("dst"), Limits::bytes(1 << 20)).unwrap_err();
        assert!(
            matches!(e, RuntimeError::PastLimit { unit: "levels", .. }),
            "{e}"
        );
        // Within the limit, the same walk (no recursion) copies every level.
        let mut lim = Limits::bytes(1 << 20);
        lim.depth = 300;
        let dir2 = scratch("deep-ok");
        let mut d = open_dir(&dir2.join("src")).unwrap();
        for _ in 0..300 {
            sys::mkdirat(d.as_fd(), c"d", 0o755).unwrap();
            d = sys::open_dir_nofollow(d.as_fd(), c"d").unwrap();
        }
        drop(d);
        let out = copy_tree(&dir2.join("src"), &dir2.join("dst"), lim).unwrap();
        assert_eq!(out.entries, 300);
        fs::remove_dir_all(&dir).unwrap();
        fs::remove_dir_all(&dir2).unwrap();
    }
}
