//! Local directory and git work-tree sources.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{IngestError, Listing, SourceEntry, SourceReader};

/// Reads a directory tree, or only the files git tracks in it.
pub(crate) struct DirReader {
    root: PathBuf,
    git: bool,
}

impl DirReader {
    pub(crate) fn new(root: PathBuf, git: bool) -> Self {
        DirReader { root, git }
    }
}

fn io_err(what: &Path, source: std::io::Error) -> IngestError {
    IngestError::Io {
        what: what.display().to_string(),
        source,
    }
}

fn stat_entry(
    root: &Path,
    rel: &str,
    skipped: &mut Vec<String>,
) -> Result<Option<SourceEntry>, IngestError> {
    let full = root.join(rel);
    let md = match fs::symlink_metadata(&full) {
        Ok(md) => md,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            skipped.push(format!("{rel}: missing from the work tree"));
            return Ok(None);
        }
        Err(e) => return Err(io_err(&full, e)),
    };
    if md.file_type().is_symlink() {
        skipped.push(format!("{rel}: symbolic link"));
        return Ok(None);
    }
    if !md.is_file() {
        skipped.push(format!("{rel}: not a regular file"));
        return Ok(None);
    }
    Ok(Some(SourceEntry {
        path: rel.to_string(),
        tag: format!("file:{}:{}.{}", md.len(), md.mtime(), md.mtime_nsec()),
        mtime: md.mtime(),
        acl: None,
        metadata: BTreeMap::new(),
        inline: None,
        locator: rel.to_string(),
    }))
}

fn walk(
    root: &Path,
    rel: &str,
    out: &mut Vec<SourceEntry>,
    skipped: &mut Vec<String>,
) -> Result<(), IngestError> {
    let dir = if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    };
    let rd = fs::read_dir(&dir).map_err(|e| io_err(&dir, e))?;
    let mut names = Vec::new();
    for ent in rd {
        let ent = ent.map_err(|e| io_err(&dir, e))?;
        names.push(ent.file_name());
    }
    names.sort();
    for name in names {
        let Some(name) = name.to_str().map(str::to_string) else {
            skipped.push(format!(
                "{}/{}: file name is not UTF-8",
                rel,
                name.to_string_lossy()
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
        let full = root.join(&child);
        let md = fs::symlink_metadata(&full).map_err(|e| io_err(&full, e))?;
        if md.is_dir() {
            walk(root, &child, out, skipped)?;
        } else if let Some(e) = stat_entry(root, &child, skipped)? {
            out.push(e);
        }
    }
    Ok(())
}

/// The tracked files of the git work tree at `root`, from its index, through libgit2: no
/// program named by the repository (fsmonitor, hooks, filters) runs, the repository is the
/// root's own `.git` (no discovery upwards, no `.git` link elsewhere), and a path in the index
/// that would leave the root or enter a `.git` is skipped with a reason.
fn git_tracked(
    root: &Path,
    skipped: &mut Vec<String>,
) -> Result<Vec<(String, String)>, IngestError> {
    let gerr = |reason: String| IngestError::Git {
        dir: root.to_path_buf(),
        reason,
    };
    let dot_git = fs::symlink_metadata(root.join(".git"));
    if !dot_git.is_ok_and(|m| m.is_dir()) {
        return Err(gerr("not a git work tree (no .git directory)".into()));
    }
    let repo = git2::Repository::open_ext(
        root,
        git2::RepositoryOpenFlags::NO_SEARCH,
        std::iter::empty::<&std::ffi::OsStr>(),
    )
    .map_err(|e| gerr(e.message().to_string()))?;
    let real = |p: &Path| fs::canonicalize(p).ok();
    if repo.workdir().map(real) != Some(real(root)) {
        return Err(gerr("the repository's work tree is elsewhere".into()));
    }
    let index = repo.index().map_err(|e| gerr(e.message().to_string()))?;
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

/// Opens `rel` beneath `root` without following any symbolic link and without leaving
/// `root`: the tree may be written by someone else while it is read.
fn open_beneath(root: &Path, rel: &str) -> std::io::Result<fs::File> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let dir = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let fd = rustix::fs::openat2(
        &dir,
        rel,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?;
    Ok(fs::File::from(fd))
}

impl SourceReader for DirReader {
    fn list(&mut self) -> Result<Listing, IngestError> {
        let md = fs::metadata(&self.root).map_err(|e| io_err(&self.root, e))?;
        if !md.is_dir() {
            return Err(io_err(
                &self.root,
                std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory"),
            ));
        }
        let mut entries = Vec::new();
        let mut skipped = Vec::new();
        if self.git {
            let mut last = String::new();
            for (meta, path) in git_tracked(&self.root, &mut skipped)? {
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
                if let Some(mut e) = stat_entry(&self.root, &path, &mut skipped)? {
                    if let Some(oid) = meta.split(' ').nth(1) {
                        e.metadata
                            .insert("git_oid".into(), serde_json::Value::String(oid.to_string()));
                    }
                    entries.push(e);
                }
            }
        } else {
            walk(&self.root, "", &mut entries, &mut skipped)?;
        }
        Ok(Listing { entries, skipped })
    }

    fn fetch(&mut self, entry: &SourceEntry) -> Result<Vec<u8>, IngestError> {
        let full = self.root.join(&entry.locator);
        let mut f = open_beneath(&self.root, &entry.locator).map_err(|e| io_err(&full, e))?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut bytes).map_err(|e| io_err(&full, e))?;
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::unsafe_tracked_path;

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
