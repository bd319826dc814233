//! Reading a source's files on the host (a directory, a git work tree, a JSONL
//! export) when someone else may be writing them: an operator allows a directory
//! that a sandbox also has bound read-write, say. Nothing is reached through a
//! symbolic link (`openat2(RESOLVE_NO_SYMLINKS)`, beneath the source's root for its
//! entries), a file is read only if `fstat` of the opened descriptor says it is a
//! regular file (it is opened `O_NONBLOCK`, so a FIFO swapped in never blocks the
//! ingest), and never past [`IngestLimits::max_file_bytes`].

use std::fs;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags, Stat};

use super::{IngestError, IngestLimits};

const NO_LINKS: ResolveFlags = ResolveFlags::NO_SYMLINKS.union(ResolveFlags::NO_MAGICLINKS);

/// Opens the directory `root` (an absolute path) without following a link anywhere
/// on the way.
pub(crate) fn open_root(root: &Path) -> Result<OwnedFd, IngestError> {
    rustix::fs::openat2(
        rustix::fs::CWD,
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        NO_LINKS,
    )
    .map_err(|e| IngestError::Io {
        what: root.display().to_string(),
        source: with_reason(e),
    })
}

/// Opens the directory `rel` beneath `dir` (`rel` a single name or a relative path),
/// without following a link.
pub(crate) fn open_dir_beneath(dir: BorrowedFd<'_>, rel: &str) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat2(
        dir,
        rel,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | NO_LINKS,
    )
}

/// What `rel` beneath `dir` is, without following a link: the directory holding it
/// is reached without a link too (`None`: it does not exist; `Err(LOOP)` or
/// `Err(NOTDIR)`: a link or a file is on the way).
pub(crate) fn lstat_beneath(dir: BorrowedFd<'_>, rel: &str) -> rustix::io::Result<Option<Stat>> {
    let (parent, name) = match rel.rsplit_once('/') {
        Some((p, n)) => (Some(open_dir_beneath(dir, p)?), n),
        None => (None, rel),
    };
    let at = parent.as_ref().map_or(dir, |p| p.as_fd());
    match rustix::fs::statat(at, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The kind of file `st` describes.
pub(crate) fn kind(st: &Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

/// Reads the regular file `rel` beneath `dir` (or the absolute `rel` without a
/// `dir`), at most `limits.max_file_bytes` of it. `what` names it in errors.
pub(crate) fn read_file(
    dir: Option<BorrowedFd<'_>>,
    rel: &Path,
    what: &str,
    limits: &IngestLimits,
) -> Result<(Vec<u8>, Stat), IngestError> {
    let (f, st) = open_file(dir, rel, what, limits)?;
    let mut bytes = Vec::with_capacity(usize::try_from(st.st_size).unwrap_or(0));
    f.take(limits.max_file_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| IngestError::Io {
            what: what.to_string(),
            source,
        })?;
    if bytes.len() as u64 > limits.max_file_bytes {
        return Err(IngestError::TooLarge {
            what: what.to_string(),
            max: limits.max_file_bytes,
        });
    }
    Ok((bytes, st))
}

/// Opens the regular file `rel` beneath `dir` (or the absolute `rel`) for reading,
/// refusing a link on the way, anything but a regular file, and a file larger
/// than `limits.max_file_bytes`.
pub(crate) fn open_file(
    dir: Option<BorrowedFd<'_>>,
    rel: &Path,
    what: &str,
    limits: &IngestLimits,
) -> Result<(fs::File, Stat), IngestError> {
    let io = |e: rustix::io::Errno| IngestError::Io {
        what: what.to_string(),
        source: with_reason(e),
    };
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let fd = match dir {
        Some(d) => rustix::fs::openat2(
            d,
            rel,
            flags,
            Mode::empty(),
            ResolveFlags::BENEATH | NO_LINKS,
        ),
        None => rustix::fs::openat2(rustix::fs::CWD, rel, flags, Mode::empty(), NO_LINKS),
    }
    .map_err(io)?;
    let st = rustix::fs::fstat(&fd).map_err(io)?;
    if kind(&st) != FileType::RegularFile {
        return Err(IngestError::NotAFile {
            what: what.to_string(),
        });
    }
    if st.st_size as u64 > limits.max_file_bytes {
        return Err(IngestError::TooLarge {
            what: what.to_string(),
            max: limits.max_file_bytes,
        });
    }
    Ok((fs::File::from(fd), st))
}

/// The error, with what a refused link means said in words.
fn with_reason(e: rustix::io::Errno) -> std::io::Error {
    let io = std::io::Error::from(e);
    if e == rustix::io::Errno::LOOP {
        std::io::Error::new(
            io.kind(),
            "a symbolic link is on the way (links are never followed)",
        )
    } else {
        io
    }
}
