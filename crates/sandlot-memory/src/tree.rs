//! The store's work tree, reached only through directory descriptors.
//!
//! A store can be mounted read-write into an untrusted sandbox while the daemon, as root,
//! reads, writes, moves and deletes files in it. A path string checked for symbolic links
//! and then used is a race the sandbox can win (swap a folder for a link to `/etc` between
//! the check and the use). So every operation here resolves the path once, beneath the
//! root, with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`, and
//! acts relative to the descriptor it got: `openat`, `mkdirat`, `renameat`, `unlinkat`,
//! `statat`. A symbolic link anywhere on the way is an error, never followed; a file that
//! is not a regular file (a FIFO, a device) is never opened for reading as one; and reads
//! are bounded by a size the caller gives.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, ResolveFlags};

/// Errors of work-tree operations; `rel` is the store-relative path.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    #[error("{op} {rel}: {source}")]
    Io {
        op: &'static str,
        rel: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{rel} is larger than {limit} bytes, the most a memory store handles in one file")]
    TooLarge { rel: String, limit: u64 },
    #[error("{rel} is not a regular file")]
    NotAFile { rel: String },
}

impl TreeError {
    /// Whether the path led through a symbolic link (or out of the root), which is refused.
    pub fn is_link_on_the_way(&self) -> bool {
        let codes = [
            rustix::io::Errno::LOOP.raw_os_error(),
            rustix::io::Errno::XDEV.raw_os_error(),
        ];
        matches!(self, TreeError::Io { source, .. } if source.raw_os_error().is_some_and(|c| codes.contains(&c)))
    }

    /// Whether the error is "no such file or folder".
    pub fn is_not_found(&self) -> bool {
        matches!(self, TreeError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

type Result<T, E = TreeError> = std::result::Result<T, E>;

/// The largest file the daemon reads from or commits in a store (a sparse file costs a
/// sandbox nothing on disk, so apparent sizes are bounded here, before any read).
pub(crate) const MAX_FILE_BYTES: u64 = 64 << 20;

/// What an entry is, without following a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
    Link,
    Other,
}

/// `lstat` facts of one entry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    pub kind: Kind,
    pub size: u64,
    pub mode: u32,
    pub mtime_ns: i64,
    pub ctime: (i64, i64),
    pub mtime: (i64, i64),
    pub dev: u64,
    pub ino: u64,
    pub uid: u32,
    pub gid: u32,
}

impl Entry {
    fn of(st: &rustix::fs::Stat) -> Entry {
        let kind = match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => Kind::File,
            FileType::Directory => Kind::Dir,
            FileType::Symlink => Kind::Link,
            _ => Kind::Other,
        };
        Entry {
            kind,
            size: st.st_size as u64,
            mode: st.st_mode,
            mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec as i64,
            ctime: (st.st_ctime, st.st_ctime_nsec as i64),
            mtime: (st.st_mtime, st.st_mtime_nsec as i64),
            dev: st.st_dev,
            ino: st.st_ino,
            uid: st.st_uid,
            gid: st.st_gid,
        }
    }
}

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// A folder's entries (UTF-8 names with their `lstat` facts, sorted) and the names that
/// are not UTF-8.
pub(crate) type Listing = (Vec<(String, Entry)>, Vec<String>);

/// A work tree rooted at a directory the daemon chose.
#[derive(Debug, Clone)]
pub(crate) struct WorkTree {
    root: PathBuf,
}

impl WorkTree {
    pub(crate) fn new(root: &Path) -> WorkTree {
        WorkTree {
            root: root.to_path_buf(),
        }
    }

    fn io<'a>(op: &'static str, rel: &'a str) -> impl FnOnce(std::io::Error) -> TreeError + 'a {
        move |source| TreeError::Io {
            op,
            rel: rel.to_string(),
            source,
        }
    }

    fn root_fd(&self) -> std::io::Result<OwnedFd> {
        Ok(rustix::fs::open(
            &self.root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?)
    }

    /// The folder `rel` ("" for the root), resolved beneath the root without links.
    fn dir_fd(&self, rel: &str) -> std::io::Result<OwnedFd> {
        let root = self.root_fd()?;
        if rel.is_empty() {
            return Ok(root);
        }
        Ok(rustix::fs::openat2(
            &root,
            rel,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )?)
    }

    /// The parent folder of `rel` and its last component.
    fn parent_fd<'a>(&self, rel: &'a str) -> std::io::Result<(OwnedFd, &'a str)> {
        let (dir, name) = split(rel);
        if name.is_empty() || name == "." || name == ".." {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a file name",
            ));
        }
        Ok((self.dir_fd(dir)?, name))
    }

    /// `lstat` of `rel`.
    pub(crate) fn stat(&self, rel: &str) -> Result<Entry> {
        if rel.is_empty() {
            let fd = self.dir_fd("").map_err(Self::io("stat", rel))?;
            let st = rustix::fs::fstat(&fd).map_err(|e| Self::io("stat", rel)(e.into()))?;
            return Ok(Entry::of(&st));
        }
        let (dir, name) = self.parent_fd(rel).map_err(Self::io("stat", rel))?;
        let st = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| Self::io("stat", rel)(e.into()))?;
        Ok(Entry::of(&st))
    }

    /// The kind of `rel`, or `None` when it does not exist (or cannot be reached without
    /// going through a link).
    pub(crate) fn kind(&self, rel: &str) -> Option<Kind> {
        self.stat(rel).ok().map(|e| e.kind)
    }

    /// Opens the regular file `rel` for reading; refuses anything else and anything larger
    /// than `limit` bytes.
    pub(crate) fn open_file(&self, rel: &str, limit: u64) -> Result<(std::fs::File, Entry)> {
        let root = self.root_fd().map_err(Self::io("open", rel))?;
        let fd = rustix::fs::openat2(
            &root,
            rel,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(|e| Self::io("open", rel)(e.into()))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| Self::io("open", rel)(e.into()))?;
        let entry = Entry::of(&st);
        if entry.kind != Kind::File {
            return Err(TreeError::NotAFile {
                rel: rel.to_string(),
            });
        }
        if entry.size > limit {
            return Err(TreeError::TooLarge {
                rel: rel.to_string(),
                limit,
            });
        }
        Ok((std::fs::File::from(fd), entry))
    }

    /// The bytes of the regular file `rel`, at most `limit` of them (a file that grows past
    /// it while being read is refused too).
    pub(crate) fn read(&self, rel: &str, limit: u64) -> Result<Vec<u8>> {
        let (f, entry) = self.open_file(rel, limit)?;
        let mut bytes = Vec::with_capacity(entry.size as usize);
        f.take(limit + 1)
            .read_to_end(&mut bytes)
            .map_err(Self::io("read", rel))?;
        if bytes.len() as u64 > limit {
            return Err(TreeError::TooLarge {
                rel: rel.to_string(),
                limit,
            });
        }
        Ok(bytes)
    }

    /// The target of the symbolic link `rel`.
    pub(crate) fn read_link(&self, rel: &str) -> Result<Vec<u8>> {
        let (dir, name) = self.parent_fd(rel).map_err(Self::io("read link", rel))?;
        let t = rustix::fs::readlinkat(&dir, name, Vec::new())
            .map_err(|e| Self::io("read link", rel)(e.into()))?;
        Ok(t.into_bytes())
    }

    /// The entries of folder `rel`: names (UTF-8 only; others are returned in `skipped`)
    /// with their `lstat` facts, sorted by name.
    pub(crate) fn list(&self, rel: &str) -> Result<Listing> {
        let fd = self.dir_fd(rel).map_err(Self::io("list", rel))?;
        let mut dir =
            rustix::fs::Dir::read_from(&fd).map_err(|e| Self::io("list", rel)(e.into()))?;
        let mut out = Vec::new();
        let mut skipped = Vec::new();
        for ent in dir.by_ref() {
            let ent = ent.map_err(|e| Self::io("list", rel)(e.into()))?;
            let name = ent.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let Ok(name) = std::str::from_utf8(name).map(str::to_string) else {
                skipped.push(String::from_utf8_lossy(name).into_owned());
                continue;
            };
            match rustix::fs::statat(&fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => out.push((name, Entry::of(&st))),
                // Gone meanwhile.
                Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(Self::io("list", rel)(e.into())),
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok((out, skipped))
    }

    /// Creates folder `rel` and its missing parents, never through a link.
    pub(crate) fn create_dirs(&self, rel: &str) -> Result<()> {
        let mut fd = self.root_fd().map_err(Self::io("create folder", rel))?;
        for c in rel.split('/').filter(|c| !c.is_empty()) {
            match rustix::fs::mkdirat(&fd, c, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(Self::io("create folder", rel)(e.into())),
            }
            fd = rustix::fs::openat2(
                &fd,
                c,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                RESOLVE,
            )
            .map_err(|e| Self::io("create folder", rel)(e.into()))?;
        }
        Ok(())
    }

    /// Replaces (or creates) the file `rel` with `data`, atomically: a new temporary file
    /// (`O_EXCL | O_NOFOLLOW`, a random name) in the same folder, renamed over it. Missing
    /// parent folders are created.
    pub(crate) fn write_atomic(&self, rel: &str, data: &[u8]) -> Result<()> {
        self.create_dirs(split(rel).0)?;
        let (dirfd, name) = match self.parent_fd(rel) {
            Ok(p) => p,
            Err(e) => return Err(Self::io("write", rel)(e)),
        };
        debug_assert_eq!(split(rel).1, name);
        let tmp = format!(".{name}.sandlot-tmp-{:016x}", random_u64());
        let fd = rustix::fs::openat(
            &dirfd,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map_err(|e| Self::io("create temporary file for", rel)(e.into()))?;
        let mut f = std::fs::File::from(fd);
        let written = f.write_all(data).and_then(|_| f.sync_data());
        drop(f);
        let renamed = written.and_then(|_| {
            rustix::fs::renameat(&dirfd, tmp.as_str(), &dirfd, name).map_err(Into::into)
        });
        if let Err(e) = renamed {
            let _ = rustix::fs::unlinkat(&dirfd, tmp.as_str(), AtFlags::empty());
            return Err(Self::io("write", rel)(e));
        }
        Ok(())
    }

    /// Moves `from` to `to`, which must not exist.
    pub(crate) fn rename_new(&self, from: &str, to: &str) -> Result<()> {
        let shown = format!("{from} -> {to}");
        let err = |e: std::io::Error| TreeError::Io {
            op: "rename",
            rel: shown.clone(),
            source: e,
        };
        let (fd_from, n_from) = self.parent_fd(from).map_err(err)?;
        let (fd_to, n_to) = self.parent_fd(to).map_err(err)?;
        rustix::fs::renameat_with(&fd_from, n_from, &fd_to, n_to, RenameFlags::NOREPLACE)
            .map_err(|e| err(e.into()))
    }

    /// Removes the file (or empty folder) `rel`.
    pub(crate) fn remove(&self, rel: &str, dir: bool) -> Result<()> {
        let (fd, name) = self.parent_fd(rel).map_err(Self::io("delete", rel))?;
        let flags = if dir {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        rustix::fs::unlinkat(&fd, name, flags).map_err(|e| Self::io("delete", rel)(e.into()))
    }
}

/// `dir/name` or `name`.
pub(crate) fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// The folder part and the last component of a relative path.
fn split(rel: &str) -> (&str, &str) {
    let rel = rel.trim_end_matches('/');
    match rel.rsplit_once('/') {
        Some((d, n)) => (d, n),
        None => ("", rel),
    }
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        return t ^ u64::from(std::process::id()) << 32;
    }
    u64::from_ne_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    struct Dirs {
        base: PathBuf,
    }

    impl Dirs {
        fn new(tag: &str) -> Dirs {
            let base = std::env::temp_dir().join(format!(
                "sandlot-tree-{tag}-{}-{:x}",
                std::process::id(),
                random_u64()
            ));
            std::fs::create_dir_all(base.join("store")).unwrap();
            std::fs::create_dir_all(base.join("host")).unwrap();
            std::fs::write(base.join("host/secret.md"), "host secret\n").unwrap();
            Dirs { base }
        }
        fn store(&self) -> PathBuf {
            self.base.join("store")
        }
        fn host(&self) -> PathBuf {
            self.base.join("host")
        }
    }

    impl Drop for Dirs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.base);
        }
    }

    #[test]
    fn nothing_is_read_written_moved_or_listed_through_a_planted_link() {
        let d = Dirs::new("links");
        let t = WorkTree::new(&d.store());
        symlink(d.host(), d.store().join("zz")).unwrap();
        symlink(d.host().join("secret.md"), d.store().join("leak.md")).unwrap();
        assert!(t
            .read("zz/secret.md", 1 << 20)
            .unwrap_err()
            .is_link_on_the_way());
        assert!(matches!(
            t.read("leak.md", 1 << 20),
            Err(TreeError::Io { .. })
        ));
        assert!(t.list("zz").is_err());
        assert!(t.write_atomic("zz/new.md", b"x").is_err());
        assert!(t.create_dirs("zz/sub").is_err());
        assert!(t.rename_new("zz/secret.md", "moved.md").is_err());
        std::fs::write(d.store().join("mine.md"), "mine").unwrap();
        assert!(t.rename_new("mine.md", "zz/mine.md").is_err());
        assert!(t.remove("zz/secret.md", false).is_err());
        // The host side is untouched.
        let mut host: Vec<String> = std::fs::read_dir(d.host())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        host.sort();
        assert_eq!(host, vec!["secret.md"]);
        assert_eq!(
            std::fs::read_to_string(d.host().join("secret.md")).unwrap(),
            "host secret\n"
        );
        // The link itself is seen as a link, never as what it points to.
        assert_eq!(t.kind("zz"), Some(Kind::Link));
        assert_eq!(t.kind("leak.md"), Some(Kind::Link));
    }

    #[test]
    fn a_write_never_goes_through_a_link_planted_at_a_temporary_name() {
        let d = Dirs::new("tmpname");
        let t = WorkTree::new(&d.store());
        // The names a write's temporary file could have had, planted as links to a host file.
        let victim = d.host().join("secret.md");
        for guess in [
            format!(".x.md.sandlot-tmp-{}", std::process::id()),
            ".x.md.sandlot-tmp-0".to_string(),
        ] {
            symlink(&victim, d.store().join(guess)).unwrap();
        }
        t.write_atomic("x.md", b"tenant text\n").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "host secret\n");
        assert_eq!(
            std::fs::read_to_string(d.store().join("x.md")).unwrap(),
            "tenant text\n"
        );
        assert!(!std::fs::symlink_metadata(d.store().join("x.md"))
            .unwrap()
            .file_type()
            .is_symlink());
    }

    #[test]
    fn fifos_are_never_opened_as_files_and_sizes_are_bounded() {
        let d = Dirs::new("fifo");
        let t = WorkTree::new(&d.store());
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            d.store().join("pipe.md").as_path(),
            Mode::from_raw_mode(0o644),
        )
        .unwrap();
        // Would block for ever if opened as a file for reading.
        assert!(matches!(
            t.read("pipe.md", 1 << 20),
            Err(TreeError::NotAFile { .. })
        ));
        // A sparse file: huge apparent size, nothing on disk.
        let f = std::fs::File::create(d.store().join("big.md")).unwrap();
        f.set_len(64 << 30).unwrap();
        assert!(matches!(
            t.read("big.md", MAX_FILE_BYTES),
            Err(TreeError::TooLarge { .. })
        ));
        assert_eq!(t.stat("big.md").unwrap().size, 64 << 30);
    }
}
