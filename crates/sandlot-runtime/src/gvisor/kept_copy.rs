//! Copies of a checkpoint that outlive it, for checkpoints a sandbox keeps and
//! forks: [`save`] copies a pause's checkpoint directory (its memory image and
//! the root it kept, [`super::kept_root`]) into a directory of plain files on
//! disk, and [`materialize`] makes a checkpoint directory that a restore takes
//! from such a copy: the image's files linked, the root copied into a tmpfs of
//! its own, so that every sandbox restored from one copy writes only its own
//! files and the copy stays as it was.
//!
//! The trees copied are a sandbox's files: nothing of it runs while they are
//! copied (its checkpoint ended it, and the daemon holds it paused), and the
//! copy ([`super::tree_copy`]) walks with directory descriptors, never follows
//! a link, keeps holes and hard links, and stops at a bound of bytes, depth and
//! entries. Only directories, regular files and symbolic links are copied (a
//! fifo, socket or device node is left out).
//!
//! A sandbox of a store image keeps its files in its writable layer (an
//! overlay's upper directory the daemon owns): [`save_layer`] copies it into the
//! copy too (its whiteouts and opaque directories kept: `tree_copy::copy_layer`),
//! and [`fill_layer`] copies it into a new sandbox's writable layer, marked
//! incomplete until it is whole ([`layer_whole`]).

use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use sandlot_proto::spec::TmpfsLimit;

use super::kept_root::{self, KEPT_IDS, KEPT_ROOT};
use super::tree_copy::{self, Limits};
use crate::{sys, RuntimeError};

/// The kept root's copy in a saved checkpoint (a plain directory).
pub const SAVED_ROOT: &str = "rootfs";
/// The writable layer's copy in a saved checkpoint (overlay format).
pub const SAVED_LAYER: &str = "layer";
/// The size of the tmpfs the kept root was (`bytes files`, decimal).
const SAVED_ROOT_SIZE: &str = "rootfs-size";

fn io_err(what: String) -> impl FnOnce(io::Error) -> RuntimeError {
    move |source| RuntimeError::Io { what, source }
}

/// What [`save`] copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Saved {
    /// Bytes of file data written (the image's files that could not be linked
    /// and the root's).
    pub bytes: u64,
    /// Entries of the root left out (not a directory, file or link).
    pub skipped: u64,
}

/// Copies checkpoint directory `ckpt` (memory image files, hard-linked where
/// the file system allows, and the root it kept if any) into `to`, which must
/// not exist. Blocking.
/// At most `max_bytes` of file data are written (image files that cannot be
/// linked included); past that the copy stops with
/// [`RuntimeError::PastLimit`] and the caller removes `to`.
pub fn save(ckpt: &Path, to: &Path, max_bytes: u64) -> Result<Saved, RuntimeError> {
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
                let limits = Limits::bytes(max_bytes);
                out.bytes += copy_file(&e.path(), &dst, &limits, out.bytes)?;
            }
        }
    }
    if let Some((root, base)) = kept_root::kept(ckpt)? {
        let dst = to.join(SAVED_ROOT);
        let vfs = statvfs(&root)?;
        let c = tree_copy::copy_tree(
            &root,
            &dst,
            Limits::bytes(max_bytes - out.bytes.min(max_bytes)),
        )?;
        out.bytes += c.bytes;
        out.skipped += c.skipped;
        write(&to.join(KEPT_IDS), &base.to_string())?;
        write(&to.join(SAVED_ROOT_SIZE), &format!("{} {}", vfs.0, vfs.1))?;
    }
    Ok(out)
}

/// Makes checkpoint directory `to` (which must not exist) from `saved`, a copy
/// [`save`] made: its image files hard-linked (copied across file systems), its
/// root copied into a new tmpfs at `to/root` as large as the one it was kept
/// from. Until it is done, `to` holds a marker that keeps a restore from it
/// (a crash cut it short: `kept_root::kept` says the files are lost). Removed
/// with [`kept_root::remove_checkpoint`]. Blocking.
pub fn materialize(saved: &Path, to: &Path) -> Result<(), RuntimeError> {
    fs::create_dir(to).map_err(io_err(format!("create {}", to.display())))?;
    fs::set_permissions(to, fs::Permissions::from_mode(0o700))
        .map_err(io_err(format!("set the mode of {}", to.display())))?;
    let incomplete = to.join(kept_root::INCOMPLETE);
    write(&incomplete, "")?;
    copy_into(saved, to)?;
    fs::remove_file(&incomplete).map_err(io_err(format!("remove {}", incomplete.display())))
}

fn copy_into(saved: &Path, to: &Path) -> Result<(), RuntimeError> {
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
            copy_file(&e.path(), &dst, &Limits::bytes(u64::MAX), 0)?;
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
    // The tmpfs's size bounds what the copy writes.
    tree_copy::copy_tree(&src, &root, Limits::bytes(limit.bytes))?;
    write(&to.join(KEPT_IDS), ids.trim())
}

/// Copies `upper`, the upper directory of a sandbox's writable layer (nothing of
/// the sandbox runs), into `copy`, a checkpoint's copy [`save`] made, with at
/// most `max_bytes` of file data. Blocking.
pub fn save_layer(
    upper: &Path,
    copy: &Path,
    max_bytes: u64,
) -> Result<tree_copy::Copied, RuntimeError> {
    tree_copy::copy_layer(upper, &copy.join(SAVED_LAYER), Limits::bytes(max_bytes))
}

/// Whether checkpoint copy `saved` holds a writable layer.
pub fn has_layer(saved: &Path) -> bool {
    fs::symlink_metadata(saved.join(SAVED_LAYER)).is_ok_and(|m| m.is_dir())
}

/// Copies the writable layer of checkpoint copy `saved` into `rw`, a new
/// sandbox's empty writable layer (`upper/` and `work/` on a size-limited tmpfs,
/// which bounds what is written). Until it is whole, `rw` holds a marker that
/// keeps a sandbox from starting on it ([`layer_whole`]). Blocking.
pub fn fill_layer(saved: &Path, rw: &Path) -> Result<(), RuntimeError> {
    let incomplete = rw.join(kept_root::INCOMPLETE);
    write(&incomplete, "")?;
    tree_copy::copy_layer(
        &saved.join(SAVED_LAYER),
        &rw.join("upper"),
        Limits::bytes(u64::MAX),
    )?;
    fs::remove_file(&incomplete).map_err(io_err(format!("remove {}", incomplete.display())))
}

/// Marks writable layer `rw` incomplete: no sandbox starts on it any more.
pub fn mark_layer_incomplete(rw: &Path) -> Result<(), RuntimeError> {
    write(&rw.join(kept_root::INCOMPLETE), "")
}

/// Marks writable layer `rw` whole (again). Blocking.
pub fn mark_layer_whole(rw: &Path) -> Result<(), RuntimeError> {
    let marker = rw.join(kept_root::INCOMPLETE);
    match fs::remove_file(&marker) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(io_err(format!("remove {}", marker.display()))(e))
        }
        _ => Ok(()),
    }
}

/// Whether writable layer `rw` is whole: no copy into it was cut short.
pub fn layer_whole(rw: &Path) -> bool {
    fs::symlink_metadata(rw.join(kept_root::INCOMPLETE)).is_err()
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

/// Copies regular file `from` (never following a link) to `to`, new, its holes
/// kept, with its owner, mode and times. Returns the bytes written.
fn copy_file(from: &Path, to: &Path, limits: &Limits, written: u64) -> Result<u64, RuntimeError> {
    let name = |p: &Path| -> Result<std::ffi::CString, RuntimeError> {
        let n = p.file_name().unwrap_or_default();
        sys::cstr(Path::new(n)).map_err(io_err(format!("copy {}", p.display())))
    };
    let dir = |p: &Path| tree_copy::open_dir(p.parent().unwrap_or(Path::new("/")));
    let (sd, dd) = (dir(from)?, dir(to)?);
    let mut buf = vec![0u8; 1 << 20];
    tree_copy::copy_file_at(
        sd.as_fd(),
        &name(from)?,
        dd.as_fd(),
        &name(to)?,
        &mut buf,
        limits,
        written,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writable_layer_whose_fill_was_cut_short_is_never_whole() {
        let dir = std::env::temp_dir().join(format!("sandlot-fill-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let (saved, rw) = (dir.join("saved"), dir.join("rw"));
        fs::create_dir_all(saved.join(SAVED_LAYER).join("d")).unwrap();
        fs::write(saved.join(SAVED_LAYER).join("d/f"), "kept").unwrap();
        for d in ["upper", "work"] {
            fs::create_dir_all(rw.join(d)).unwrap();
        }
        assert!(layer_whole(&rw));
        fill_layer(&saved, &rw).unwrap();
        assert!(layer_whole(&rw));
        assert_eq!(fs::read_to_string(rw.join("upper/d/f")).unwrap(), "kept");
        // A second fill finds `d` there: it fails, and the layer stays marked.
        assert!(fill_layer(&saved, &rw).is_err());
        assert!(!layer_whole(&rw));
        fs::remove_dir_all(&dir).unwrap();
    }

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
}
