//! Local directory and git work-tree sources.
//!
//! The tree may be written by someone else while it is read (a directory an operator
//! allows may also be bound read-write into a sandbox), so it is read through
//! descriptors only ([`super::host_files`]): the root is opened without following a
//! link, each directory is opened beneath its parent without following one, entries
//! are examined with `lstat` relative to their directory, and a document is opened
//! again beneath the root without following a link, read only if it is a regular
//! file, and never past the largest file allowed. In git mode only the index file is
//! read (`.git/index`, a regular file in a real `.git` directory): no repository
//! configuration, include, `commondir` or program it names is ever looked at.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Stat};
use rustix::io::Errno;

use super::host_files::{self, kind};
use super::{IngestError, IngestLimits, Listing, SourceEntry, SourceReader};

/// Reads a directory tree, or only the files git tracks in it.
pub(crate) struct DirReader {
    root: PathBuf,
    git: bool,
    limits: IngestLimits,
    /// The root, opened by [`SourceReader::list`]; documents are fetched beneath it.
    dir: Option<OwnedFd>,
}

impl DirReader {
    pub(crate) fn new(root: PathBuf, git: bool, limits: IngestLimits) -> Self {
        DirReader {
            root,
            git,
            limits,
            dir: None,
        }
    }

    fn root_fd(&mut self) -> Result<BorrowedFd<'_>, IngestError> {
        if self.dir.is_none() {
            self.dir = Some(host_files::open_root(&self.root)?);
        }
        Ok(self.dir.as_ref().expect("opened above").as_fd())
    }
}

fn file_entry(
    rel: &str,
    st: &Stat,
    limits: &IngestLimits,
    skipped: &mut Vec<String>,
) -> Option<SourceEntry> {
    match kind(st) {
        FileType::Symlink => {
            skipped.push(format!("{rel}: symbolic link"));
            return None;
        }
        FileType::RegularFile => {}
        _ => {
            skipped.push(format!("{rel}: not a regular file"));
            return None;
        }
    }
    if st.st_size as u64 > limits.max_file_bytes {
        skipped.push(format!(
            "{rel}: larger than the largest file allowed ({} bytes)",
            limits.max_file_bytes
        ));
        return None;
    }
    Some(SourceEntry {
        path: rel.to_string(),
        tag: format!("file:{}:{}.{}", st.st_size, st.st_mtime, st.st_mtime_nsec),
        mtime: st.st_mtime,
        acl: None,
        metadata: BTreeMap::new(),
        inline: None,
        locator: rel.to_string(),
    })
}

/// The document `rel` of a work tree, examined beneath the root without following a
/// link (a tracked path that goes through a link is skipped, not followed).
fn stat_entry(
    root: BorrowedFd<'_>,
    rel: &str,
    limits: &IngestLimits,
    skipped: &mut Vec<String>,
) -> Result<Option<SourceEntry>, IngestError> {
    match host_files::lstat_beneath(root, rel) {
        Ok(Some(st)) => Ok(file_entry(rel, &st, limits, skipped)),
        Ok(None) | Err(Errno::NOENT) => {
            skipped.push(format!("{rel}: missing from the work tree"));
            Ok(None)
        }
        Err(Errno::LOOP | Errno::NOTDIR) => {
            skipped.push(format!("{rel}: goes through a symbolic link or a file"));
            Ok(None)
        }
        Err(e) => Err(IngestError::Io {
            what: rel.to_string(),
            source: e.into(),
        }),
    }
}

/// Lists the directory `dir` (`rel` beneath the root) and the directories below it.
fn walk(
    dir: BorrowedFd<'_>,
    rel: &str,
    limits: &IngestLimits,
    out: &mut Vec<SourceEntry>,
    empty: &mut Vec<(String, i64)>,
    skipped: &mut Vec<String>,
) -> Result<(), IngestError> {
    let io = |e: Errno| IngestError::Io {
        what: if rel.is_empty() {
            ".".into()
        } else {
            rel.to_string()
        },
        source: e.into(),
    };
    let mut names = Vec::new();
    for ent in rustix::fs::Dir::read_from(dir).map_err(io)? {
        let name = ent.map_err(io)?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            names.push(name);
        }
    }
    names.sort();
    for name in names {
        let Ok(name) = String::from_utf8(name.clone()) else {
            skipped.push(format!(
                "{}/{}: file name is not UTF-8",
                rel,
                String::from_utf8_lossy(&name)
            ));
            continue;
        };
        if name == ".git" {
            continue;
        }
        let child = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        let st = match rustix::fs::statat(dir, name.as_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
        {
            Ok(st) => st,
            Err(Errno::NOENT) => continue, // gone while listed
            Err(e) => {
                return Err(IngestError::Io {
                    what: child,
                    source: e.into(),
                })
            }
        };
        if kind(&st) == FileType::Directory {
            match host_files::open_dir_beneath(dir, &name) {
                Ok(sub) => {
                    let before = out.len();
                    walk(sub.as_fd(), &child, limits, out, empty, skipped)?;
                    // No document under it: kept as a directory of its own.
                    if out.len() == before {
                        empty.push((child, st.st_mtime as i64));
                    }
                }
                Err(Errno::LOOP | Errno::NOTDIR | Errno::NOENT) => {
                    skipped.push(format!("{child}: changed while it was listed"));
                }
                Err(e) => {
                    return Err(IngestError::Io {
                        what: child,
                        source: e.into(),
                    })
                }
            }
        } else if let Some(e) = file_entry(&child, &st, limits, skipped) {
            out.push(e);
        }
    }
    Ok(())
}

/// The tracked files of the git work tree `root`, from its index file alone: `.git`
/// must be a real directory and `.git/index` a regular file in it (both reached
/// without a link; a FIFO there is refused, not waited on), read through the
/// descriptor that was checked. No repository is opened, so no configuration,
/// include, `commondir`, work-tree setting, hook, filter or fsmonitor is read or run.
/// A path in the index that would leave the root or enter a `.git` is skipped with a
/// reason.
fn git_tracked(
    root: BorrowedFd<'_>,
    root_path: &Path,
    limits: &IngestLimits,
    skipped: &mut Vec<String>,
) -> Result<Vec<(String, String)>, IngestError> {
    let gerr = |reason: String| IngestError::Git {
        dir: root_path.to_path_buf(),
        reason,
    };
    let dot_git = host_files::open_dir_beneath(root, ".git").map_err(|e| {
        gerr(match e {
            Errno::NOENT => "not a git work tree (no .git directory)".into(),
            Errno::LOOP | Errno::NOTDIR => {
                ".git is not a directory of the work tree (a link or a file)".into()
            }
            e => format!(".git: {e}"),
        })
    })?;
    let (index_file, _) = match host_files::open_file(
        Some(dot_git.as_fd()),
        Path::new("index"),
        ".git/index",
        limits,
    ) {
        Ok(f) => f,
        Err(IngestError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            // A repository with nothing staged yet.
            return Ok(Vec::new());
        }
        Err(IngestError::NotAFile { .. }) => {
            return Err(gerr(".git/index is not a regular file".into()))
        }
        Err(e) => return Err(e),
    };
    // libgit2 reads the file through the descriptor that was checked.
    let via = PathBuf::from(format!("/proc/self/fd/{}", index_file.as_raw_fd()));
    let index = git2::Index::open(&via).map_err(|e| gerr(e.message().to_string()))?;
    drop(index_file);
    let mut files = Vec::new();
    for e in index.iter() {
        let path = match String::from_utf8(e.path.clone()) {
            Ok(p) => p,
            Err(_) => {
                skipped.push(format!(
                    "{}: tracked path is not UTF-8",
                    String::from_utf8_lossy(&e.path)
                ));
                continue;
            }
        };
        if let Some(reason) = unsafe_tracked_path(&path) {
            skipped.push(format!("{path}: {reason}"));
            continue;
        }
        let stage = (e.flags >> 12) & 3;
        files.push((format!("{:o} {} {stage}", e.mode, e.id), path));
    }
    Ok(files)
}

/// Why a path from a git index must not be read under the work tree, if it must not.
fn unsafe_tracked_path(path: &str) -> Option<&'static str> {
    if path.starts_with('/') {
        return Some("absolute path in the index");
    }
    for seg in path.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." {
            return Some("path in the index leaves the work tree");
        }
        if seg.eq_ignore_ascii_case(".git") {
            return Some("path in the index enters a .git directory");
        }
    }
    None
}

impl SourceReader for DirReader {
    fn list(&mut self) -> Result<Listing, IngestError> {
        let (git, limits) = (self.git, self.limits);
        let root_path = self.root.clone();
        let root = self.root_fd()?;
        let mut entries = Vec::new();
        let mut skipped = Vec::new();
        let mut empty_dirs = Vec::new();
        if git {
            let mut last = String::new();
            for (meta, path) in git_tracked(root, &root_path, &limits, &mut skipped)? {
                if path == last {
                    continue; // unmerged entries appear once per stage
                }
                last = path.clone();
                let mode = meta.split(' ').next().unwrap_or("");
                match mode {
                    "160000" => {
                        skipped.push(format!("{path}: submodule"));
                        continue;
                    }
                    "120000" => {
                        skipped.push(format!("{path}: symbolic link"));
                        continue;
                    }
                    _ => {}
                }
                if let Some(mut e) = stat_entry(root, &path, &limits, &mut skipped)? {
                    if let Some(oid) = meta.split(' ').nth(1) {
                        e.metadata
                            .insert("git_oid".into(), serde_json::Value::String(oid.to_string()));
                    }
                    entries.push(e);
                }
            }
        } else {
            walk(
                root,
                "",
                &limits,
                &mut entries,
                &mut empty_dirs,
                &mut skipped,
            )?;
        }
        Ok(Listing {
            entries,
            skipped,
            empty_dirs,
        })
    }

    fn fetch(&mut self, entry: &SourceEntry) -> Result<Vec<u8>, IngestError> {
        let limits = self.limits;
        let root = self.root_fd()?;
        let (bytes, _) = host_files::read_file(
            Some(root),
            Path::new(&entry.locator),
            &entry.locator,
            &limits,
        )?;
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is listed is not trusted at fetch time: a directory of the source
    /// swapped for a link to elsewhere, a document swapped for a FIFO, or one that
    /// grew past the limit after it was listed, is refused when it is read (the old
    /// reader returned a FIFO as an empty document).
    #[test]
    fn documents_changed_after_listing_are_refused_when_read() {
        let d = tempfile::tempdir().unwrap();
        let (root, outside) = (d.path().join("src"), d.path().join("outside"));
        for p in [root.join("docs"), outside.clone()] {
            std::fs::create_dir_all(p).unwrap();
        }
        std::fs::write(root.join("docs/a.md"), "a").unwrap();
        std::fs::write(root.join("b.md"), "b").unwrap();
        std::fs::write(root.join("c.md"), "c").unwrap();
        std::fs::write(outside.join("a.md"), "host secret").unwrap();
        let limits = IngestLimits { max_file_bytes: 4 };
        let mut r = DirReader::new(root.clone(), false, limits);
        let listed = r.list().unwrap().entries;
        let entry = |p: &str| listed.iter().find(|e| e.path == p).unwrap().clone();
        assert_eq!(listed.len(), 3);

        std::fs::rename(root.join("docs"), root.join("docs.old")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("docs")).unwrap();
        let e = r.fetch(&entry("docs/a.md")).unwrap_err();
        assert!(e.to_string().contains("read docs/a.md"), "{e}");

        std::fs::remove_file(root.join("b.md")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("b.md"),
            FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let e = r.fetch(&entry("b.md")).unwrap_err();
        assert!(matches!(e, IngestError::NotAFile { .. }), "{e}");

        std::fs::write(root.join("c.md"), "grown").unwrap();
        let e = r.fetch(&entry("c.md")).unwrap_err();
        assert!(matches!(e, IngestError::TooLarge { max: 4, .. }), "{e}");
    }

    #[test]
    fn index_paths_that_leave_the_work_tree_or_enter_git_are_refused() {
        for bad in [
            "../etc/shadow",
            "a/../../x",
            "/etc/passwd",
            "a//b",
            "./a",
            ".git/config",
            "x/.GIT/hooks/p",
        ] {
            assert!(unsafe_tracked_path(bad).is_some(), "{bad}");
        }
        for good in ["a.md", "docs/a.md", ".github/workflows/ci.yml", "a..b/c"] {
            assert_eq!(unsafe_tracked_path(good), None, "{good}");
        }
    }
}
