//! A named, host-wide lock held by one process for as long as it runs: a file
//! under `/run/lock/sandlot` with an exclusive `flock` and the holder's pid in it,
//! removed when the holder lets go. Daemons lock their id prefix (server) and
//! their slot subnet (net) this way.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A held lock; dropping it removes the file (still locked, so a process that
/// opened it just before locks a file without the name, notices, and retries).
#[derive(Debug)]
pub struct HostLock {
    _file: File,
    path: PathBuf,
}

impl HostLock {
    /// Takes the lock `path` without waiting, creating its directory and file as
    /// needed: `Ok(Err(holder))` when another process holds it, `holder` being the
    /// pid it wrote (`None` if it has not written one yet).
    pub fn try_take(path: &Path) -> io::Result<Result<HostLock, Option<u32>>> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        loop {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(path)?;
            if !crate::sys::try_flock_exclusive(f.as_fd())? {
                let mut pid = String::new();
                let _ = f.read_to_string(&mut pid);
                return Ok(Err(pid.trim().parse().ok()));
            }
            // A holder that let go between our open and our lock removed the name:
            // this file then locks nothing.
            let ours = f.metadata()?;
            match std::fs::metadata(path) {
                Ok(m) if (m.dev(), m.ino()) == (ours.dev(), ours.ino()) => {}
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
            f.set_len(0)?;
            writeln!(f, "{}", std::process::id())?;
            return Ok(Ok(HostLock {
                _file: f,
                path: path.to_path_buf(),
            }));
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for HostLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
