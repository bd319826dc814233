//! A gVisor sandbox's root filesystem kept across a checkpoint: the `host`
//! image's root tmpfs, which the backend mounts on the host, holds the files the
//! sandbox wrote, and a restore must find them as they were (gVisor opens again
//! every file its saved kernel had open). [`keep`] binds it into the checkpoint
//! directory before the sandbox's own directory goes; [`take_back`] binds it
//! again as a restored sandbox's root, its file owners moved to the id range the
//! restored sandbox got.

use std::ffi::CStr;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::{sys, RuntimeError};

/// The kept root in a checkpoint directory.
pub const KEPT_ROOT: &str = "root";
/// The first host id of the range the kept root's files belong to (decimal).
pub(crate) const KEPT_IDS: &str = "root-ids";
/// The range a move of the files' owners is under way to; renamed to
/// [`KEPT_IDS`] once every file is moved, so that a move a crash cut short is
/// finished by the next restore instead of taken for the old range.
const KEPT_IDS_NEXT: &str = "root-ids.next";
/// Present while a checkpoint directory is being made from a copy
/// (`kept_copy::materialize`): one a crash cut short is never restored.
pub(crate) const INCOMPLETE: &str = "incomplete";

fn io_err(what: String) -> impl FnOnce(std::io::Error) -> RuntimeError {
    move |source| RuntimeError::Io { what, source }
}

/// Whether `dir` is a mount point of this mount namespace.
pub fn is_mount_point(dir: &Path) -> bool {
    fs::read_to_string("/proc/self/mountinfo")
        .map(|info| crate::mounts::mount_points_under(&info, dir).contains(&dir.to_path_buf()))
        .unwrap_or(false)
}

fn bind(from: &Path, to: &Path) -> Result<(), RuntimeError> {
    let what = || format!("bind {} on {}", from.display(), to.display());
    let src = sys::cstr(from).map_err(io_err(what()))?;
    let dst = sys::cstr(to).map_err(io_err(what()))?;
    sys::mount(
        Some(&src),
        &dst,
        None::<&CStr>,
        libc::MS_BIND | libc::MS_REC,
        None,
    )
    .map_err(io_err(what()))
}

/// Binds `root` (a mount point: the sandbox's root tmpfs) at `ckpt/root` and
/// records its files' id range. False when `root` is no mount of the host's.
pub fn keep(root: &Path, id_base: u32, ckpt: &Path) -> Result<bool, RuntimeError> {
    if !is_mount_point(root) {
        return Ok(false);
    }
    let kept = ckpt.join(KEPT_ROOT);
    fs::create_dir(&kept).map_err(io_err(format!("create {}", kept.display())))?;
    bind(root, &kept)?;
    let ids = ckpt.join(KEPT_IDS);
    fs::write(&ids, id_base.to_string()).map_err(io_err(format!("write {}", ids.display())))?;
    Ok(true)
}

/// The kept root of checkpoint `ckpt` and the first id of its files' range, if
/// it kept one. A root it kept that is no longer mounted (the host restarted: a
/// tmpfs does not survive that) is an error: the sandbox's files are gone.
pub fn kept(ckpt: &Path) -> Result<Option<(PathBuf, u32)>, RuntimeError> {
    if !ckpt.is_dir() || ckpt.join(INCOMPLETE).exists() {
        return Err(RuntimeError::FilesLost(
            "its checkpoint, whose copy the daemon's stop cut short".into(),
        ));
    }
    let Ok(ids) = fs::read_to_string(ckpt.join(KEPT_IDS)) else {
        return Ok(None);
    };
    let root = ckpt.join(KEPT_ROOT);
    let base: Option<u32> = ids.trim().parse().ok();
    let Some(base) = base.filter(|_| is_mount_point(&root)) else {
        return Err(RuntimeError::FilesLost(
            "the root filesystem its checkpoint kept".into(),
        ));
    };
    match fs::read_to_string(ckpt.join(KEPT_IDS_NEXT)) {
        Ok(next) => {
            let next: u32 = next
                .trim()
                .parse()
                .map_err(|_| RuntimeError::FilesLost("the id range of its kept root".into()))?;
            move_owners(ckpt, &root, base, next)?;
            Ok(Some((root, next)))
        }
        Err(_) => Ok(Some((root, base))),
    }
}

/// Moves the owners of the kept root's files from the range at `from` to the one
/// at `to`, recording both ends so that a move cut short is finished later.
fn move_owners(ckpt: &Path, root: &Path, from: u32, to: u32) -> Result<(), RuntimeError> {
    let next = ckpt.join(KEPT_IDS_NEXT);
    fs::write(&next, to.to_string()).map_err(io_err(format!("write {}", next.display())))?;
    shift_ids(root, from, to)?;
    let ids = ckpt.join(KEPT_IDS);
    fs::rename(&next, &ids).map_err(io_err(format!("rename {}", next.display())))
}

/// Binds the kept root `kept` (its files of the range at `from`) at `root`, the
/// files moved to the range at `to`. The kept mount stays where it is: a failed
/// restore leaves it to the next try.
pub fn take_back(kept: &Path, from: u32, root: &Path, to: u32) -> Result<(), RuntimeError> {
    if from != to {
        let ckpt = kept.parent().unwrap_or(kept);
        move_owners(ckpt, kept, from, to)?;
    }
    bind(kept, root)
}

/// Moves the owner and group of every entry under `dir` (not following links)
/// from the id range at `from` to the one at `to`; ids outside the range stay.
/// Nothing of the sandbox runs while this walks its files.
fn shift_ids(dir: &Path, from: u32, to: u32) -> Result<(), RuntimeError> {
    let range = crate::plan::ID_RANGE;
    let shift = |id: u32| {
        if (from..from.saturating_add(range)).contains(&id) {
            id - from + to
        } else {
            id
        }
    };
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = fs::symlink_metadata(&p).map_err(io_err(format!("stat {}", p.display())))?;
        let (uid, gid) = (shift(m.uid()), shift(m.gid()));
        if (uid, gid) != (m.uid(), m.gid()) {
            std::os::unix::fs::lchown(&p, Some(uid), Some(gid))
                .map_err(io_err(format!("chown {}", p.display())))?;
            // A change of owner clears the set-id bits: they are the sandbox's.
            if !m.file_type().is_symlink() && m.mode() & 0o6000 != 0 {
                fs::set_permissions(&p, fs::Permissions::from_mode(m.mode() & 0o7777))
                    .map_err(io_err(format!("chmod {}", p.display())))?;
            }
        }
        if m.is_dir() {
            for e in fs::read_dir(&p).map_err(io_err(format!("read {}", p.display())))? {
                let e = e.map_err(io_err(format!("read {}", p.display())))?;
                stack.push(e.path());
            }
        }
    }
    Ok(())
}

/// Whether `dir` is on another file system than its parent, by their device
/// numbers (read without following a link); `None` when either is unreadable.
fn crosses_mount(dir: &Path) -> Option<bool> {
    let parent = dir.parent()?;
    let (d, p) = (
        fs::symlink_metadata(dir).ok()?,
        fs::symlink_metadata(parent).ok()?,
    );
    Some(d.dev() != p.dev())
}

/// Whether the kept root at `root` may still be a mount: the mount table or the
/// device numbers say so, or they cannot be read (unsure counts as mounted).
fn may_be_mounted(root: &Path) -> bool {
    match fs::symlink_metadata(root) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(_) => true,
        Ok(_) => is_mount_point(root) || crosses_mount(root) != Some(false),
    }
}

/// Removes checkpoint directory `ckpt`: its kept root is unmounted first, and a
/// root that may stay mounted is never walked into (it may be a running
/// sandbox's): the removal is refused.
pub fn remove_checkpoint(ckpt: &Path) -> Result<(), RuntimeError> {
    let root = ckpt.join(KEPT_ROOT);
    if may_be_mounted(&root) {
        let path = sys::cstr(&root).map_err(io_err(format!("unmount {}", root.display())))?;
        sys::umount2(&path, libc::MNT_DETACH)
            .map_err(io_err(format!("unmount {}", root.display())))?;
        if may_be_mounted(&root) {
            return Err(io_err(format!("unmount {}", root.display()))(
                std::io::Error::other("still mounted, or its mount cannot be told"),
            ));
        }
    }
    match fs::remove_dir_all(ckpt) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(io_err(format!("remove {}", ckpt.display()))(e))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_whose_copy_was_cut_short_or_is_missing_is_never_restored() {
        let dir = std::env::temp_dir().join(format!("sandlot-cut-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        // Complete and without a kept root: nothing to take back.
        assert_eq!(kept(&dir).unwrap(), None);
        fs::write(dir.join(INCOMPLETE), "").unwrap();
        assert!(matches!(kept(&dir), Err(RuntimeError::FilesLost(_))));
        fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(kept(&dir), Err(RuntimeError::FilesLost(_))));
    }

    #[test]
    fn a_kept_root_on_another_file_system_or_unreadable_counts_as_mounted() {
        let dir = std::env::temp_dir().join(format!("sandlot-kept-{}", std::process::id()));
        let root = dir.join(KEPT_ROOT);
        fs::create_dir_all(&root).unwrap();
        assert_eq!(crosses_mount(&root), Some(false));
        assert!(!may_be_mounted(&root));
        assert!(!may_be_mounted(&dir.join("absent")));
        // /proc is a file system of its own under /.
        assert_eq!(crosses_mount(Path::new("/proc")), Some(true));
        assert!(may_be_mounted(Path::new("/proc")));
        remove_checkpoint(&dir).unwrap();
        assert!(!dir.exists());
    }
}
