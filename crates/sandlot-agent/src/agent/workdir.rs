//! The default working directory is created when it is missing, as Docker does for
//! `WORKDIR` and `docker run -w`: a spec's `workdir`, an image's (a Dockerfile's
//! `WORKDIR`) or one a pool claim configures. Each missing directory is made 0755
//! and owned by the sandbox's default user, so that user can work in it. The agent
//! does this when it starts and when it is configured, before any process of the
//! sandbox runs.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path};

use rustix::fs::{fchown, mkdirat, openat, Mode, OFlags};
use rustix::io::Errno;
use rustix::process::{Gid, Uid};

/// Makes `path` (absolute) and every missing directory above it, each created one
/// 0755 and owned by `uid`:`gid`; existing ones are left as they are (links among
/// them followed, as a path lookup would). A directory made here is opened without
/// following a link before it is given its owner, so nothing else is ever chowned.
/// Returns whether anything was made.
pub(crate) fn ensure(path: &str, uid: u32, gid: u32) -> io::Result<bool> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{path:?} is not an absolute path"),
        ));
    }
    if p.is_dir() {
        return Ok(false);
    }
    let dir_flags = OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::RDONLY;
    let mut at: OwnedFd = rustix::fs::open("/", dir_flags, Mode::empty())?;
    let mut made = false;
    for c in p.components() {
        let name = match c {
            Component::RootDir | Component::CurDir => continue,
            Component::ParentDir => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{path:?} has a '..' component"),
                ))
            }
            Component::Normal(n) => n,
            Component::Prefix(_) => unreachable!("no prefixes on Unix"),
        };
        let name = CString::new(name.as_encoded_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
        let created = match mkdirat(at.as_fd(), name.as_c_str(), Mode::from_raw_mode(0o755)) {
            Ok(()) => true,
            Err(Errno::EXIST) => false,
            Err(e) => return Err(e.into()),
        };
        let flags = if created {
            dir_flags | OFlags::NOFOLLOW
        } else {
            dir_flags
        };
        let next = openat(at.as_fd(), name.as_c_str(), flags, Mode::empty())?;
        if created {
            fchown(
                next.as_fd(),
                Some(Uid::from_raw_unchecked(uid)),
                Some(Gid::from_raw_unchecked(gid)),
            )?;
            made = true;
        }
        at = next;
    }
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn missing_directories_are_made_and_existing_ones_left_alone() {
        let t = tempfile::tempdir().unwrap();
        let (uid, gid) = (
            rustix::process::getuid().as_raw(),
            rustix::process::getgid().as_raw(),
        );
        std::fs::create_dir(t.path().join("a")).unwrap();
        std::fs::set_permissions(t.path().join("a"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        std::os::unix::fs::symlink("a", t.path().join("link")).unwrap();
        let deep = t.path().join("link/b/c");
        assert!(ensure(deep.to_str().unwrap(), uid, gid).unwrap());
        let c = std::fs::metadata(t.path().join("a/b/c")).unwrap();
        assert!(c.is_dir());
        assert_eq!((c.mode() & 0o7777, c.uid(), c.gid()), (0o755, uid, gid));
        // The existing directory keeps its mode; a second call makes nothing.
        let a = std::fs::metadata(t.path().join("a")).unwrap();
        assert_eq!(a.mode() & 0o7777, 0o700);
        assert!(!ensure(deep.to_str().unwrap(), uid, gid).unwrap());
        // A file in the way, a relative path and '..' are refused.
        std::fs::write(t.path().join("f"), b"").unwrap();
        assert!(ensure(t.path().join("f/x").to_str().unwrap(), uid, gid).is_err());
        assert!(ensure("rel/dir", uid, gid).is_err());
        assert!(ensure(t.path().join("a/../z").to_str().unwrap(), uid, gid).is_err());
    }
}
