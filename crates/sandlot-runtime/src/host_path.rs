//! Host paths that a sandbox's mounts are made from when its spec names them (bind
//! sources, a rootfs directory): resolved once ([`pin`]) to a canonical path and the
//! device and inode it names, then opened again when the mount is made ([`reopen`])
//! without following a symbolic link, and only if it is still that file.
//!
//! Whoever can write a directory on the way (another sandbox with a writable bind of
//! it) can swap an entry for a link between a check and the mount. The check and the
//! mount therefore use the same object: a bind of `/srv/share/x` that passed the
//! daemon's policy never becomes a bind of `/` because `x` became a link to it; the
//! mount fails instead.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::sys;

/// A file's identity on the host: its device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostId {
    pub dev: u64,
    pub ino: u64,
}

/// A host path resolved once ([`pin`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedPath {
    /// The path as the spec names it.
    pub requested: String,
    /// Its canonical form: absolute, without a symbolic link, `.` or `..`.
    pub path: PathBuf,
    /// What `path` named when it was resolved.
    pub id: HostId,
    pub dir: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("{path} does not exist on the host")]
    Missing { path: String },
    #[error("{path} is not beneath {root}")]
    Outside { path: String, root: PathBuf },
    #[error("{path} changed while it was resolved")]
    Changed { path: String },
    #[error("resolve {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// Resolves the absolute host path `requested` once: its canonical path, opened
/// without following a link anywhere, and the identity of what it names. With
/// `root` (a canonical path that `requested` lies under, lexically), `requested` is
/// resolved from `root` itself and never above it (`RESOLVE_BENEATH`): links that
/// stay beneath it are followed, one that leads out is [`PinError::Outside`] without
/// the host path it names being looked at (so whether a host path outside exists
/// never shows in the answer), and the canonical path must then be reachable from
/// `root` one real directory at a time.
pub fn pin(requested: &str, root: Option<&Path>) -> Result<PinnedPath, PinError> {
    let io_err = |source: io::Error| PinError::Io {
        path: requested.to_string(),
        source,
    };
    // A link, a vanished entry or a way out appeared while resolving.
    let changed = |e: io::Error| match e.raw_os_error() {
        Some(libc::ELOOP | libc::EXDEV | libc::ENOENT | libc::ENOTDIR) => PinError::Changed {
            path: requested.to_string(),
        },
        _ => io_err(e),
    };
    let missing = || PinError::Missing {
        path: requested.to_string(),
    };
    let (canonical, fd) = match root {
        None => {
            let canonical = std::fs::canonicalize(requested).map_err(|e| {
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) {
                    missing()
                } else {
                    io_err(e)
                }
            })?;
            let fd = sys::open_no_symlinks(None, &sys::cstr(&canonical).map_err(io_err)?)
                .map_err(changed)?;
            (canonical, fd)
        }
        Some(root) => {
            let outside = || PinError::Outside {
                path: requested.to_string(),
                root: root.to_path_buf(),
            };
            let rel = Path::new(requested)
                .strip_prefix(root)
                .map_err(|_| outside())?;
            let dir =
                sys::open_no_symlinks(None, &sys::cstr(root).map_err(io_err)?).map_err(changed)?;
            if rel.as_os_str().is_empty() {
                (root.to_path_buf(), dir)
            } else {
                let found = sys::open_beneath(dir.as_fd(), &sys::cstr(rel).map_err(io_err)?)
                    .map_err(|e| match e.raw_os_error() {
                        Some(libc::ENOENT | libc::ENOTDIR) => missing(),
                        Some(libc::EXDEV) => outside(),
                        _ => io_err(e),
                    })?;
                // Where the object found lives: its canonical path.
                let canonical = std::fs::read_link(format!("/proc/self/fd/{}", found.as_raw_fd()))
                    .map_err(io_err)?;
                let crel = canonical.strip_prefix(root).map_err(|_| outside())?;
                if crel.as_os_str().is_empty() {
                    (canonical, dir)
                } else {
                    // Reached again one real directory at a time: the path a mount
                    // reopens must lead there without a link.
                    let fd =
                        sys::open_no_symlinks(Some(dir.as_fd()), &sys::cstr(crel).map_err(io_err)?)
                            .map_err(changed)?;
                    let id = |f: &OwnedFd| sys::fstat_id(f.as_fd()).map(|(d, i, _)| (d, i));
                    if id(&fd).map_err(io_err)? != id(&found).map_err(io_err)? {
                        return Err(PinError::Changed {
                            path: requested.to_string(),
                        });
                    }
                    (canonical, fd)
                }
            }
        }
    };
    let (dev, ino, mode) = sys::fstat_id(fd.as_fd()).map_err(io_err)?;
    Ok(PinnedPath {
        requested: requested.to_string(),
        path: canonical,
        id: HostId { dev, ino },
        dir: mode & libc::S_IFMT == libc::S_IFDIR,
    })
}

/// Opens the pinned `path` again (`O_PATH`), without following a link anywhere on
/// the way, and only if it is still the file `id`: the descriptor a mount is made
/// from, and the file's mode.
pub(crate) fn reopen(path: &Path, id: HostId) -> io::Result<(OwnedFd, u32)> {
    let fd = sys::open_no_symlinks(None, &sys::cstr(path)?).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("{} changed since it was checked: {e}", path.display()),
        )
    })?;
    let (dev, ino, mode) = sys::fstat_id(fd.as_fd())?;
    if (HostId { dev, ino }) != id {
        return Err(io::Error::other(format!(
            "{} is another file than the one checked",
            path.display()
        )));
    }
    Ok((fd, mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sandlot-pin-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// The swap the pin exists for: `x` is checked as a directory under the allowed
    /// root, then replaced by a link to `/` (or by another directory) before the mount
    /// is made; opening it again refuses both.
    #[test]
    fn a_path_swapped_for_a_link_after_the_check_is_refused_at_mount_time() {
        let d = tmp("swap");
        let share = d.join("share");
        std::fs::create_dir_all(share.join("x")).unwrap();
        let p = pin(share.join("x").to_str().unwrap(), Some(&share)).unwrap();
        assert!(p.dir);
        assert_eq!(p.path, share.join("x"));
        assert!(reopen(&p.path, p.id).is_ok());
        std::fs::rename(share.join("x"), share.join("old")).unwrap();
        std::os::unix::fs::symlink("/", share.join("x")).unwrap();
        let e = reopen(&p.path, p.id).unwrap_err();
        assert!(
            e.to_string().contains("changed since it was checked"),
            "{e}"
        );
        std::fs::remove_file(share.join("x")).unwrap();
        std::fs::create_dir(share.join("x")).unwrap();
        let e = reopen(&p.path, p.id).unwrap_err();
        assert!(e.to_string().contains("another file"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn pins_name_the_canonical_path_and_stay_beneath_their_root() {
        let d = tmp("root");
        let share = d.join("share");
        std::fs::create_dir_all(share.join("v2")).unwrap();
        std::fs::write(share.join("f"), "x").unwrap();
        std::os::unix::fs::symlink("v2", share.join("current")).unwrap();
        std::os::unix::fs::symlink("/", share.join("out")).unwrap();
        // A link that stays inside resolves to its target.
        let p = pin(share.join("current").to_str().unwrap(), Some(&share)).unwrap();
        assert_eq!(p.path, share.join("v2"));
        assert_eq!(p.requested, share.join("current").to_str().unwrap());
        let f = pin(share.join("f").to_str().unwrap(), Some(&share)).unwrap();
        assert!(!f.dir);
        // One that leads out does not, whether what it names exists or not (the
        // answer must not tell which host paths exist).
        std::os::unix::fs::symlink("/nope-not-here", share.join("out-missing")).unwrap();
        std::os::unix::fs::symlink("../../../etc", share.join("up")).unwrap();
        std::os::unix::fs::symlink("../../../nope-not-here", share.join("up-missing")).unwrap();
        for l in ["out", "out-missing", "up", "up-missing"] {
            let e = pin(share.join(l).to_str().unwrap(), Some(&share)).unwrap_err();
            assert!(matches!(e, PinError::Outside { .. }), "{l}: {e}");
        }
        let e = pin(share.join("current/none").to_str().unwrap(), Some(&share)).unwrap_err();
        assert!(matches!(e, PinError::Missing { .. }), "{e}");
        assert_eq!(
            pin(share.as_os_str().to_str().unwrap(), Some(&share))
                .unwrap()
                .path,
            share
        );
        let e = pin(share.join("none").to_str().unwrap(), Some(&share)).unwrap_err();
        assert!(matches!(e, PinError::Missing { .. }), "{e}");
        // Without a root (`sandlot run`), any existing path.
        assert_eq!(pin("/", None).unwrap().path, PathBuf::from("/"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
