//! Local directory and git work-tree sources.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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

fn git_tracked(root: &Path) -> Result<Vec<(String, String)>, IngestError> {
    let gerr = |reason: String| IngestError::Git {
        dir: root.to_path_buf(),
        reason,
    };
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "-z", "--stage"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| gerr(format!("cannot run git: {e}")))?;
    if !out.status.success() {
        return Err(gerr(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    let mut files = Vec::new();
    for rec in out.stdout.split(|b| *b == 0).filter(|r| !r.is_empty()) {
        // "<mode> <oid> <stage>\t<path>"
        let tab = rec
            .iter()
            .position(|b| *b == b'\t')
            .ok_or_else(|| gerr("malformed ls-files output".into()))?;
        let meta = String::from_utf8_lossy(&rec[..tab]).to_string();
        let path = String::from_utf8(rec[tab + 1..].to_vec()).map_err(|_| {
            gerr(format!(
                "tracked path is not UTF-8: {}",
                String::from_utf8_lossy(&rec[tab + 1..])
            ))
        })?;
        files.push((meta, path));
    }
    Ok(files)
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
            for (meta, path) in git_tracked(&self.root)? {
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
        fs::read(&full).map_err(|e| io_err(&full, e))
    }
}
