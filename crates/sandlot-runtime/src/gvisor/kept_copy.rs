//! Copies of a checkpoint that outlive it, for checkpoints a sandbox keeps and
//! forks: [`save`] copies a pause's checkpoint directory (its memory image and
//! the root it kept, [`super::kept_root`]) into a directory of plain files on
//! disk, and [`materialize`] makes a checkpoint directory that a restore takes
//! from such a copy: the image's files linked, the root copied into a tmpfs of
//! its own, so that every sandbox restored from one copy writes only its own
//! files and the copy stays as it was.
//!
//! The trees copied are a sandbox's files: nothing of it runs while they are
//! copied (its checkpoint ended it), links are never followed (each entry is
//! read with `lstat`, files opened with `O_NOFOLLOW`), and only directories,
//! regular files and symbolic links are copied (hard links become separate
//! files; a fifo, socket or device node is left out).

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use sandlot_proto::spec::TmpfsLimit;

use super::kept_root::{self, KEPT_IDS, KEPT_ROOT};
use crate::{sys, RuntimeError};

/// The kept root's copy in a saved checkpoint (a plain directory).
pub const SAVED_ROOT: &str = "rootfs";
/// The size of the tmpfs the kept root was (`bytes files`, decimal).
const SAVED_ROOT_SIZE: &str = "rootfs-size";

fn io_err(what: String) -> impl FnOnce(io::Error) -> RuntimeError {
    move |source| RuntimeError::Io { what, source }
}

/// What [`save`] copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Saved {
    /// Bytes of the regular files copied (image and root).
    pub bytes: u64,
    /// Entries of the root left out (not a directory, file or link).
    pub skipped: u64,
}

/// Copies checkpoint directory `ckpt` (memory image files, hard-linked where
/// the file system allows, and the root it kept if any) into `to`, which must
/// not exist. Blocking.
pub fn save(ckpt: &Path, to: &Path) -> Result<Saved, RuntimeError> {
    fs::create_dir(to).map_err(io_err(format!("create {}", to.display())))?;
    fs::set_permissions(to, fs::Permissions::from_mode(0o700))
        .map_err(io_err(format!("set the mode of {}", to.display())))?;
    let mut out = Saved::default();
    for e in fs::read_dir(ckpt).map_err(io_err(format!("read {}", ckpt.display())))? {
        let e = e.map_err(io_err(format!("read {}", ckpt.display())))?;
        let m = fs::symlink_metadata(e.path())
            .map_err(io_err(format!("stat {}", e.path().display())))?;
        let name = e.file_name();
        if m.is_file() && name != KEPT_IDS {
            // The image is only read: a link where the file system allows one.
            let dst = to.join(&name);
            if fs::hard_link(e.path(), &dst).is_err() {
                copy_file(&e.path(), &dst, &m)?;
            }
            out.bytes += m.len();
        }
    }
    if let Some((root, base)) = kept_root::kept(ckpt)? {
        let dst = to.join(SAVED_ROOT);
        let vfs = statvfs(&root)?;
        copy_tree(&root, &dst, &mut out)?;
        write(&to.join(KEPT_IDS), &base.to_string())?;
        write(&to.join(SAVED_ROOT_SIZE), &format!("{} {}", vfs.0, vfs.1))?;
    }
    Ok(out)
}

/// Makes checkpoint directory `to` (which must not exist) from `saved`, a copy
/// [`save`] made: its image files hard-linked (copied across file systems), its
/// root copied into a new tmpfs at `to/root` as large as the one it was kept
/// from. Removed with [`kept_root::remove_checkpoint`]. Blocking.
pub fn materialize(saved: &Path, to: &Path) -> Result<(), RuntimeError> {
    fs::create_dir(to).map_err(io_err(format!("create {}", to.display())))?;
    fs::set_permissions(to, fs::Permissions::from_mode(0o700))
        .map_err(io_err(format!("set the mode of {}", to.display())))?;
    for e in fs::read_dir(saved).map_err(io_err(format!("read {}", saved.display())))? {
        let e = e.map_err(io_err(format!("read {}", saved.display())))?;
        let m = fs::symlink_metadata(e.path())
            .map_err(io_err(format!("stat {}", e.path().display())))?;
        let name = e.file_name();
        if !m.is_file() || name == KEPT_IDS || name == SAVED_ROOT_SIZE {
            continue;
        }
        let dst = to.join(&name);
        if fs::hard_link(e.path(), &dst).is_err() {
            copy_file(&e.path(), &dst, &m)?;
        }
    }
    let src = saved.join(SAVED_ROOT);
    if !src.is_dir() {
        return Ok(());
    }
    let ids = fs::read_to_string(saved.join(KEPT_IDS))
        .map_err(io_err(format!("read {}", saved.join(KEPT_IDS).display())))?;
    let size = fs::read_to_string(saved.join(SAVED_ROOT_SIZE)).map_err(io_err(format!(
        "read {}",
        saved.join(SAVED_ROOT_SIZE).display()
    )))?;
    let limit = parse_size(&size).ok_or_else(|| {
        RuntimeError::Init(format!(
            "checkpoint copy {}: bad root size",
            saved.display()
        ))
    })?;
    let root = to.join(KEPT_ROOT);
    fs::create_dir(&root).map_err(io_err(format!("create {}", root.display())))?;
    crate::mounts::mount_root(&crate::mounts::RootFs::Tmpfs { size: limit }, &root, None)
        .map_err(|e| RuntimeError::Init(format!("mount a root for {}: {e}", to.display())))?;
    let mut ignored = Saved::default();
    copy_tree(&src, &root, &mut ignored)?;
    write(&to.join(KEPT_IDS), ids.trim())
}

fn parse_size(s: &str) -> Option<TmpfsLimit> {
    let mut it = s.split_whitespace().map(str::parse::<u64>);
    let (bytes, files) = (it.next()?.ok()?, it.next()?.ok()?);
    (it.next().is_none() && bytes > 0 && files > 0).then_some(TmpfsLimit { bytes, files })
}

fn write(path: &Path, text: &str) -> Result<(), RuntimeError> {
    fs::write(path, text).map_err(io_err(format!("write {}", path.display())))
}

/// Total bytes and inodes of the file system at `dir`.
fn statvfs(dir: &Path) -> Result<(u64, u64), RuntimeError> {
    let c = sys::cstr(dir).map_err(io_err(format!("statvfs {}", dir.display())))?;
    let mut v = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `v` points to writable memory of
    // the size of a `statvfs`, which the call fills on success.
    let r = unsafe { libc::statvfs(c.as_ptr(), v.as_mut_ptr()) };
    if r != 0 {
        return Err(io_err(format!("statvfs {}", dir.display()))(
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: the call succeeded, so it filled `v`.
    let v = unsafe { v.assume_init() };
    Ok((v.f_blocks.saturating_mul(v.f_frsize), v.f_files))
}

/// Copies regular file `from` (never following a link) to `to`, new, with its
/// owner, mode and times. Returns its size.
fn copy_file(from: &Path, to: &Path, m: &fs::Metadata) -> Result<u64, RuntimeError> {
    let mut src = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(from)
        .map_err(io_err(format!("open {}", from.display())))?;
    let mut dst = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)
        .map_err(io_err(format!("create {}", to.display())))?;
    let n = io::copy(&mut src, &mut dst).map_err(io_err(format!("copy {}", from.display())))?;
    drop(dst);
    set_attrs(to, m, false)?;
    Ok(n)
}

/// Owner, then mode (set-id bits included: a chown clears them) and times.
fn set_attrs(path: &Path, m: &fs::Metadata, link: bool) -> Result<(), RuntimeError> {
    std::os::unix::fs::lchown(path, Some(m.uid()), Some(m.gid()))
        .map_err(io_err(format!("chown {}", path.display())))?;
    if !link {
        fs::set_permissions(path, fs::Permissions::from_mode(m.mode() & 0o7777))
            .map_err(io_err(format!("chmod {}", path.display())))?;
    }
    let c = sys::cstr(path).map_err(io_err(format!("set times of {}", path.display())))?;
    let times = [
        libc::timespec {
            tv_sec: m.atime() as libc::time_t,
            tv_nsec: m.atime_nsec() as _,
        },
        libc::timespec {
            tv_sec: m.mtime() as libc::time_t,
            tv_nsec: m.mtime_nsec() as _,
        },
    ];
    // SAFETY: `c` is a NUL-terminated path and `times` two valid timespecs.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r != 0 {
        return Err(io_err(format!("set times of {}", path.display()))(
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Copies directory `from` into `to` (created if missing), depth first; the
/// directories' own attributes are set once their entries are in.
fn copy_tree(from: &Path, to: &Path, out: &mut Saved) -> Result<(), RuntimeError> {
    let m = fs::symlink_metadata(from).map_err(io_err(format!("stat {}", from.display())))?;
    if !to.exists() {
        fs::create_dir(to).map_err(io_err(format!("create {}", to.display())))?;
    }
    for e in fs::read_dir(from).map_err(io_err(format!("read {}", from.display())))? {
        let e = e.map_err(io_err(format!("read {}", from.display())))?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let em = fs::symlink_metadata(&src).map_err(io_err(format!("stat {}", src.display())))?;
        let ft = em.file_type();
        if ft.is_dir() {
            copy_tree(&src, &dst, out)?;
        } else if ft.is_file() {
            out.bytes += copy_file(&src, &dst, &em)?;
        } else if ft.is_symlink() {
            let target =
                fs::read_link(&src).map_err(io_err(format!("read link {}", src.display())))?;
            std::os::unix::fs::symlink(&target, &dst)
                .map_err(io_err(format!("create link {}", dst.display())))?;
            set_attrs(&dst, &em, true)?;
        } else {
            out.skipped += 1;
        }
    }
    set_attrs(to, &m, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_root_size_is_two_positive_numbers() {
        assert_eq!(
            parse_size("1048576 256\n"),
            Some(TmpfsLimit {
                bytes: 1 << 20,
                files: 256
            })
        );
        assert_eq!(parse_size("0 5"), None);
        assert_eq!(parse_size("5"), None);
        assert_eq!(parse_size("5 5 5"), None);
        assert_eq!(parse_size("/etc 5"), None);
    }

    #[test]
    fn a_tree_copy_keeps_files_links_and_modes_and_follows_no_link() {
        let dir = std::env::temp_dir().join(format!("sandlot-kept-copy-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let src = dir.join("src");
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::write(src.join("sub/f"), b"hello").unwrap();
        fs::set_permissions(src.join("sub/f"), fs::Permissions::from_mode(0o640)).unwrap();
        // A link out of the tree is copied as a link, never followed.
        std::os::unix::fs::symlink("/etc/hostname", src.join("out")).unwrap();
        let mut out = Saved::default();
        copy_tree(&src, &dir.join("dst"), &mut out).unwrap();
        assert_eq!(fs::read(dir.join("dst/sub/f")).unwrap(), b"hello");
        let m = fs::metadata(dir.join("dst/sub/f")).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o640);
        assert_eq!(
            fs::read_link(dir.join("dst/out")).unwrap(),
            Path::new("/etc/hostname")
        );
        assert_eq!(
            out,
            Saved {
                bytes: 5,
                skipped: 0
            }
        );
        let _ = fs::remove_dir_all(&dir);
    }
}
