//! The store's history, through libgit2 (the `git2` crate): never the `git` binary.
//!
//! A store can be mounted read-write into an untrusted sandbox, and the daemon that reads and
//! commits it runs as root. The `git` binary takes programs from repository data in many ways
//! (filter drivers, textconv, external diff, pagers, hooks, fsmonitor, includes, and the same
//! again in any nested repository it descends into), so it is not used at all. libgit2 runs no
//! external program (no filter drivers, hooks, textconv, diff drivers or pagers; this build has
//! no network transports), and this module adds its own rules on top:
//!
//! * the repository is the store root's own `.git` directory, opened **bare** (libgit2 has no
//!   work tree, so it never opens a work-tree file itself: no `.gitignore`, `.gitattributes`
//!   or content that a sandbox could swap for a link or a FIFO); a `.git` that is not a
//!   directory is refused;
//! * everything from the work tree is read by this module through [`WorkTree`] (directory
//!   descriptors, no symbolic link ever followed, regular files only, bounded in size) and
//!   handed to libgit2 as bytes with no path, so no attribute-selected filter applies;
//! * status is computed here (HEAD, the index, and the work tree read the same way);
//! * a folder with a `.git` entry of its own (a nested repository) is never staged, listed
//!   as a submodule or descended into: staging it is refused ([`GitError::NestedRepository`]).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use git2::{
    Delta, DiffFindOptions, DiffFormat, DiffOptions, ErrorCode, Index, IndexEntry, IndexTime,
    ObjectType, Oid, Repository, RepositoryInitOptions, Signature, Sort, Tree, TreeWalkMode,
    TreeWalkResult,
};

use crate::tree::{join, Entry, Kind, TreeError, WorkTree, MAX_FILE_BYTES};
use serde::Serialize;

/// Errors from the store's history.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// libgit2 failed on the store's repository.
    #[error("git {op}: {message}")]
    Repo { op: &'static str, message: String },
    /// A revision the caller named does not resolve to a commit.
    #[error("unknown revision {rev:?}")]
    BadRevision { rev: String },
    /// A folder to commit holds a repository of its own.
    #[error(
        "{path} holds a nested git repository (a .git entry), which a memory store does not keep"
    )]
    NestedRepository { path: String },
    /// Reading the work tree failed.
    #[error(transparent)]
    Tree(#[from] TreeError),
    /// Content is not UTF-8 where text was asked for.
    #[error("{what} is not UTF-8 text")]
    NotUtf8 { what: String },
    /// A revert whose changes conflict with later ones, or that cannot be written back.
    #[error("revert {rev}: {reason}")]
    Revert { rev: String, reason: String },
}

impl GitError {
    fn repo(op: &'static str) -> impl FnOnce(git2::Error) -> GitError {
        move |e| GitError::Repo {
            op,
            message: e.message().to_string(),
        }
    }
}

type Result<T, E = GitError> = std::result::Result<T, E>;

/// Who a change is attributed to: the tenant or agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Author {
    pub name: String,
    pub email: String,
}

impl Author {
    pub fn new(name: impl Into<String>, email: impl Into<String>) -> Author {
        Author {
            name: name.into(),
            email: email.into(),
        }
    }
}

impl Default for Author {
    fn default() -> Author {
        Author::new("sandlot", "sandlot@localhost")
    }
}

/// One commit of the store history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Commit {
    pub rev: String,
    pub author: String,
    pub email: String,
    /// RFC 3339.
    pub time: String,
    pub message: String,
    /// Store-relative paths the commit touched.
    pub paths: Vec<String>,
}

/// What one path holds in a commit's tree, for writing it back to the work tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Content {
    /// Absent.
    Gone,
    /// A regular file's bytes.
    File(Vec<u8>),
}

/// A git work tree: the store's root and its own `.git`.
#[derive(Debug, Clone)]
pub(crate) struct Git {
    dir: PathBuf,
    tree: WorkTree,
}

impl Git {
    pub(crate) fn new(dir: &Path) -> Git {
        Git {
            dir: dir.to_path_buf(),
            tree: WorkTree::new(dir),
        }
    }

    /// Whether the root has a `.git` directory (a `.git` file or link is no store of ours).
    pub(crate) fn is_repo(&self) -> bool {
        std::fs::symlink_metadata(self.dir.join(".git")).is_ok_and(|m| m.is_dir())
    }

    pub(crate) fn init(&self) -> Result<()> {
        let mut opts = RepositoryInitOptions::new();
        opts.initial_head("main").no_reinit(true).mkpath(false);
        Repository::init_opts(&self.dir, &opts).map_err(GitError::repo("init"))?;
        Ok(())
    }

    /// The store's own repository, opened bare: its `.git` directory exactly, no discovery,
    /// and no work tree for libgit2 to read.
    fn open(&self) -> Result<Repository> {
        if !self.is_repo() {
            return Err(GitError::Repo {
                op: "open",
                message: "the store has no .git directory".into(),
            });
        }
        Repository::open_bare(self.dir.join(".git")).map_err(GitError::repo("open"))
    }

    /// Stages `paths` (additions, modifications and deletions, whole folders included) and
    /// commits exactly those paths; returns the new revision, or `None` when nothing changed.
    /// Changes to other paths, staged or not, are left as they are.
    pub(crate) fn commit_paths(
        &self,
        paths: &[&str],
        message: &str,
        author: &Author,
    ) -> Result<Option<String>> {
        let repo = self.open()?;
        let head = head_commit(&repo)?;
        // The commit's tree: HEAD's tree with the paths replaced by the work tree's content.
        let mut next = Index::new().map_err(GitError::repo("commit"))?;
        if let Some(c) = &head {
            let tree = c.tree().map_err(GitError::repo("commit"))?;
            next.read_tree(&tree).map_err(GitError::repo("commit"))?;
        }
        let mut staged = Vec::new();
        for p in paths {
            self.collect(&repo, p, &mut staged)?;
        }
        for p in paths {
            remove_under(&mut next, p)?;
        }
        for e in &staged {
            next.add(&e.entry).map_err(GitError::repo("stage"))?;
        }
        let tree_id = next
            .write_tree_to(&repo)
            .map_err(GitError::repo("write tree"))?;
        let head_tree = head.as_ref().map(|c| c.tree_id());
        if head_tree == Some(tree_id) {
            return Ok(None);
        }
        let tree = repo.find_tree(tree_id).map_err(GitError::repo("commit"))?;
        let sig =
            Signature::now(&author.name, &author.email).map_err(GitError::repo("sign commit"))?;
        let parents: Vec<&git2::Commit> = head.iter().collect();
        let id = repo
            .commit(Some("HEAD"), &sig, &sig, message, &tree, &parents)
            .map_err(GitError::repo("commit"))?;
        // The repository's index follows for these paths, so status shows them clean.
        let mut index = repo.index().map_err(GitError::repo("read index"))?;
        for p in paths {
            remove_under(&mut index, p)?;
        }
        for e in &staged {
            index.add(&e.entry).map_err(GitError::repo("stage"))?;
        }
        index.write().map_err(GitError::repo("write index"))?;
        Ok(Some(id.to_string()))
    }

    /// The work tree's entries at `rel` (a file, a link, or a folder's files), as index
    /// entries whose blobs are already written. Missing: none (a deletion).
    fn collect(&self, repo: &Repository, rel: &str, out: &mut Vec<Staged>) -> Result<()> {
        let e = match self.tree.stat(rel) {
            Ok(e) => e,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        if e.kind == Kind::Dir {
            let (entries, skipped) = self.tree.list(rel)?;
            if let Some(name) = skipped.first() {
                return Err(GitError::NotUtf8 {
                    what: format!("the file name {name:?} in {rel}"),
                });
            }
            if entries.iter().any(|(n, _)| n == ".git") {
                return Err(GitError::NestedRepository {
                    path: rel.to_string(),
                });
            }
            for (name, _) in entries {
                self.collect(repo, &join(rel, &name), out)?;
            }
            return Ok(());
        }
        let Some((mode, oid)) = self.worktree_blob(repo, rel, &e)? else {
            // Sockets, FIFOs and devices are not content.
            return Ok(());
        };
        out.push(Staged {
            entry: index_entry(rel, mode, oid, &e),
        });
        Ok(())
    }

    /// Writes the work tree's `rel` (a regular file or a symbolic link, as `e` says) as a
    /// blob: read through the work tree's descriptors, unfiltered, streamed, bounded.
    fn worktree_blob(&self, repo: &Repository, rel: &str, e: &Entry) -> Result<Option<(u32, Oid)>> {
        match e.kind {
            Kind::Link => {
                let target = self.tree.read_link(rel)?;
                let oid = repo.blob(&target).map_err(GitError::repo("write blob"))?;
                Ok(Some((0o120000, oid)))
            }
            Kind::File => {
                let (f, opened) = self.tree.open_file(rel, MAX_FILE_BYTES)?;
                let mut w = repo
                    .blob_writer(None)
                    .map_err(GitError::repo("write blob"))?;
                let mut f = f.take(MAX_FILE_BYTES + 1);
                let mut buf = vec![0u8; 64 * 1024];
                let mut total = 0u64;
                let io = |op, source| TreeError::Io {
                    op,
                    rel: rel.to_string(),
                    source,
                };
                loop {
                    let n = f.read(&mut buf).map_err(|e| io("read", e))?;
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                    if total > MAX_FILE_BYTES {
                        return Err(TreeError::TooLarge {
                            rel: rel.to_string(),
                            limit: MAX_FILE_BYTES,
                        }
                        .into());
                    }
                    w.write_all(&buf[..n]).map_err(|e| io("write blob of", e))?;
                }
                let oid = w.commit().map_err(GitError::repo("write blob"))?;
                Ok(Some((file_mode(opened.mode), oid)))
            }
            Kind::Dir | Kind::Other => Ok(None),
        }
    }

    /// The id the work tree's `rel` would have as a blob, without writing anything (`None`:
    /// neither a file nor a link, or too large to hash).
    fn worktree_oid(&self, rel: &str, e: &Entry) -> Option<(u32, Oid)> {
        match e.kind {
            Kind::Link => {
                let t = self.tree.read_link(rel).ok()?;
                Some((0o120000, Oid::hash_object(ObjectType::Blob, &t).ok()?))
            }
            Kind::File => {
                let b = self.tree.read(rel, MAX_FILE_BYTES).ok()?;
                Some((
                    file_mode(e.mode),
                    Oid::hash_object(ObjectType::Blob, &b).ok()?,
                ))
            }
            _ => None,
        }
    }

    pub(crate) fn head(&self) -> Result<Option<String>> {
        let repo = self.open()?;
        let head = head_commit(&repo)?.map(|c| c.id().to_string());
        Ok(head)
    }

    /// History, newest first, optionally of one path (following renames).
    pub(crate) fn log(&self, path: Option<&str>, limit: usize) -> Result<Vec<Commit>> {
        let repo = self.open()?;
        if head_commit(&repo)?.is_none() {
            return Ok(Vec::new());
        }
        let mut walk = repo.revwalk().map_err(GitError::repo("log"))?;
        walk.set_sorting(Sort::TOPOLOGICAL | Sort::TIME)
            .map_err(GitError::repo("log"))?;
        walk.push_head().map_err(GitError::repo("log"))?;
        let mut followed = path.map(str::to_string);
        let mut out = Vec::new();
        for oid in walk {
            if out.len() >= limit {
                break;
            }
            let oid = oid.map_err(GitError::repo("log"))?;
            let commit = repo.find_commit(oid).map_err(GitError::repo("log"))?;
            // Renames are followed only when near-identical: memories share front matter
            // keys, so a looser threshold would splice unrelated small files together.
            let threshold = if followed.is_some() { 90 } else { 50 };
            let deltas = commit_deltas(&repo, &commit, Some(threshold))?;
            let paths = match followed.as_mut() {
                None => deltas.iter().map(|d| d.shown().to_string()).collect(),
                Some(cur) => {
                    let here = |d: &&Change| {
                        d.new.as_deref() == Some(cur.as_str())
                            || (d.status == Delta::Deleted
                                && d.old.as_deref() == Some(cur.as_str()))
                    };
                    let Some(d) = deltas.iter().find(here) else {
                        continue;
                    };
                    let shown = vec![cur.clone()];
                    if let (Delta::Renamed, Some(old)) = (d.status, &d.old) {
                        *cur = old.clone();
                    }
                    shown
                }
            };
            out.push(commit_record(&commit, paths));
        }
        Ok(out)
    }

    /// Unified diff between two revisions (or a revision and the work tree when `to` is
    /// `None`), of the store or one path.
    pub(crate) fn diff(&self, from: &str, to: Option<&str>, path: Option<&str>) -> Result<String> {
        let repo = self.open()?;
        let from_tree = commit_tree(&repo, from)?;
        let mut opts = DiffOptions::new();
        opts.ignore_submodules(true).include_untracked(false);
        if let Some(p) = path {
            opts.pathspec(p).disable_pathspec_match(true);
        }
        let diff = match to {
            Some(t) => {
                let to_tree = commit_tree(&repo, t)?;
                repo.diff_tree_to_tree(Some(&from_tree), Some(&to_tree), Some(&mut opts))
            }
            None => {
                let snapshot = self.worktree_snapshot(&repo, path)?;
                repo.diff_tree_to_index(Some(&from_tree), Some(&snapshot), Some(&mut opts))
            }
        }
        .map_err(GitError::repo("diff"))?;
        let mut text = Vec::new();
        diff.print(DiffFormat::Patch, |_, _, line| {
            if matches!(line.origin(), '+' | '-' | ' ') {
                text.push(line.origin() as u8);
            }
            text.extend_from_slice(line.content());
            true
        })
        .map_err(GitError::repo("diff"))?;
        String::from_utf8(text).map_err(|_| GitError::NotUtf8 {
            what: "the diff".into(),
        })
    }

    /// The work tree's tracked files (or only `path`) as an in-memory index whose blobs live
    /// in an in-memory object database (nothing is written to the store's): libgit2 itself
    /// never opens a work-tree file, which a sandbox could swap for a link between a check
    /// and the read.
    fn worktree_snapshot(&self, repo: &Repository, path: Option<&str>) -> Result<Index> {
        let odb = repo.odb().map_err(GitError::repo("diff"))?;
        odb.add_new_mempack_backend(1000)
            .map_err(GitError::repo("diff"))?;
        let tracked = repo.index().map_err(GitError::repo("read index"))?;
        let mut rels: Vec<String> = tracked
            .iter()
            .filter_map(|e| String::from_utf8(e.path).ok())
            .collect();
        if let Some(p) = path {
            let prefix = format!("{p}/");
            rels.retain(|r| r == p || r.starts_with(&prefix));
            if rels.is_empty() {
                rels.push(p.to_string());
            }
        }
        let mut snapshot = Index::new().map_err(GitError::repo("diff"))?;
        for rel in rels {
            let e = match self.tree.stat(&rel) {
                Ok(e) => e,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e.into()),
            };
            if let Some((mode, oid)) = self.worktree_blob(repo, &rel, &e)? {
                snapshot
                    .add(&index_entry(&rel, mode, oid, &e))
                    .map_err(GitError::repo("diff"))?;
            }
        }
        Ok(snapshot)
    }

    /// The content of `path` at `rev`, as text.
    pub(crate) fn show(&self, rev: &str, path: &str) -> Result<String> {
        match self.content_at(rev, path)? {
            Content::File(b) => String::from_utf8(b).map_err(|_| GitError::NotUtf8 {
                what: format!("{path} at {rev}"),
            }),
            Content::Gone => Err(GitError::BadRevision {
                rev: format!("{rev}:{path}"),
            }),
        }
    }

    /// What `path` holds at `rev` (a link or a folder is refused: not a memory).
    pub(crate) fn content_at(&self, rev: &str, path: &str) -> Result<Content> {
        let repo = self.open()?;
        let tree = commit_tree(&repo, rev)?;
        blob_content(&repo, &tree, path)
    }

    /// Whether `ancestor` is `rev` or one of its ancestors.
    pub(crate) fn is_ancestor(&self, ancestor: &str, rev: &str) -> Result<bool> {
        let repo = self.open()?;
        let a = commit_id(&repo, ancestor)?;
        let r = commit_id(&repo, rev)?;
        if a == r {
            return Ok(true);
        }
        repo.graph_descendant_of(r, a)
            .map_err(GitError::repo("merge-base"))
    }

    /// Whether `path` exists at `rev`.
    pub(crate) fn exists_at(&self, rev: &str, path: &str) -> Result<bool> {
        let repo = self.open()?;
        let tree = commit_tree(&repo, rev)?;
        Ok(tree.get_path(Path::new(path)).is_ok())
    }

    /// Resolves a revision expression to a full commit id.
    pub(crate) fn resolve(&self, rev: &str) -> Result<String> {
        let repo = self.open()?;
        Ok(commit_id(&repo, rev)?.to_string())
    }

    /// What reverting commit `rev` on top of HEAD gives for each path it touched: the caller
    /// writes that back and commits it. Refused when the revert conflicts with later changes.
    pub(crate) fn reverted_contents(&self, rev: &str) -> Result<Vec<(String, Content)>> {
        let repo = self.open()?;
        let err = |reason: String| GitError::Revert {
            rev: rev.to_string(),
            reason,
        };
        let commit = repo
            .find_commit(commit_id(&repo, rev)?)
            .map_err(GitError::repo("revert"))?;
        if commit.parent_count() > 1 {
            return Err(err("a merge commit cannot be reverted".into()));
        }
        let head = head_commit(&repo)?.ok_or_else(|| err("the store has no commits".into()))?;
        let index = repo
            .revert_commit(&commit, &head, 0, None)
            .map_err(GitError::repo("revert"))?;
        if index.has_conflicts() {
            return Err(err(
                "its changes conflict with later changes to the same files".into(),
            ));
        }
        let mut out = Vec::new();
        for d in commit_deltas(&repo, &commit, None)? {
            let p = d.shown().to_string();
            let content = match index.get_path(Path::new(&p), 0) {
                None => Content::Gone,
                Some(e) if e.mode == 0o100644 || e.mode == 0o100755 => {
                    let blob = repo.find_blob(e.id).map_err(GitError::repo("revert"))?;
                    Content::File(blob.content().to_vec())
                }
                Some(_) => {
                    return Err(err(format!(
                        "{p} would be restored as something other than a regular file"
                    )))
                }
            };
            out.push((p, content));
        }
        Ok(out)
    }

    /// The message `git revert` gives a revert of `rev`.
    pub(crate) fn revert_message(&self, rev: &str) -> Result<String> {
        let repo = self.open()?;
        let c = repo
            .find_commit(commit_id(&repo, rev)?)
            .map_err(GitError::repo("revert"))?;
        let subject = c.summary().ok().flatten().unwrap_or("").to_string();
        Ok(format!(
            "Revert \"{subject}\"\n\nThis reverts commit {}.",
            c.id()
        ))
    }

    /// Uncommitted changes by path, as `git status --porcelain` codes (`M`, `A`, `D`, `??`,
    /// `AM`...). The work tree is read through [`WorkTree`]; `.git`, the index folder
    /// `.sandlot` and nested repositories are not part of it.
    pub(crate) fn status(&self) -> Result<HashMap<String, String>> {
        let repo = self.open()?;
        let mut head: HashMap<String, (u32, Oid)> = HashMap::new();
        if let Some(c) = head_commit(&repo)? {
            let tree = c.tree().map_err(GitError::repo("status"))?;
            tree.walk(TreeWalkMode::PreOrder, |dir, e| {
                if e.kind() == Some(ObjectType::Blob) {
                    if let Ok(name) = e.name() {
                        head.insert(format!("{dir}{name}"), (e.filemode() as u32, e.id()));
                    }
                }
                TreeWalkResult::Ok
            })
            .map_err(GitError::repo("status"))?;
        }
        let index = repo.index().map_err(GitError::repo("read index"))?;
        let mut staged: HashMap<String, IndexEntry> = HashMap::new();
        for e in index.iter() {
            if let Ok(p) = String::from_utf8(e.path.clone()) {
                staged.insert(p, e);
            }
        }
        let mut work: HashMap<String, Entry> = HashMap::new();
        self.walk_work_tree("", &mut work)?;
        let mut paths: Vec<&String> = head
            .keys()
            .chain(staged.keys())
            .chain(work.keys())
            .collect();
        paths.sort();
        paths.dedup();
        let mut out = HashMap::new();
        for p in paths {
            let h = head.get(p);
            let i = staged.get(p);
            let w = work.get(p);
            let x = match (h, i) {
                (None, Some(_)) => 'A',
                (Some(_), None) => 'D',
                (Some(h), Some(i)) if h.0 != i.mode || h.1 != i.id => 'M',
                _ => ' ',
            };
            let y = match (i, w) {
                (None, Some(_)) => {
                    out.insert(p.clone(), "??".to_string());
                    continue;
                }
                (Some(_), None) => 'D',
                (Some(i), Some(w)) if !stat_matches(i, w) => match self.worktree_oid(p, w) {
                    Some((mode, oid)) if mode == i.mode && oid == i.id => ' ',
                    _ => 'M',
                },
                _ => ' ',
            };
            let code = format!("{x}{y}").trim().to_string();
            if !code.is_empty() {
                out.insert(p.clone(), code);
            }
        }
        Ok(out)
    }

    /// The work tree's files and links under `rel`, without `.git`, the root's `.sandlot`
    /// or any folder holding a repository of its own.
    fn walk_work_tree(&self, rel: &str, out: &mut HashMap<String, Entry>) -> Result<()> {
        let (entries, _) = match self.tree.list(rel) {
            Ok(l) => l,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        if !rel.is_empty() && entries.iter().any(|(n, _)| n == ".git") {
            return Ok(());
        }
        for (name, e) in entries {
            if name == ".git" || (rel.is_empty() && name == crate::store::INDEX_DIR) {
                continue;
            }
            let child = join(rel, &name);
            match e.kind {
                Kind::Dir => self.walk_work_tree(&child, out)?,
                Kind::File | Kind::Link => {
                    out.insert(child, e);
                }
                Kind::Other => {}
            }
        }
        Ok(())
    }
}

/// Whether an index entry's recorded stat still matches the file (then its content is
/// taken as unchanged, as git does).
fn stat_matches(i: &IndexEntry, w: &Entry) -> bool {
    i.file_size == w.size as u32
        && i.mtime.seconds() == w.mtime.0 as i32
        && i.mtime.nanoseconds() == w.mtime.1 as u32
        && (w.kind == Kind::Link) == (i.mode == 0o120000)
}

/// git's mode for a regular file: executable or not.
fn file_mode(mode: u32) -> u32 {
    if mode & 0o100 != 0 {
        0o100755
    } else {
        0o100644
    }
}

/// One entry to stage.
struct Staged {
    entry: IndexEntry,
}

fn index_entry(rel: &str, mode: u32, id: Oid, e: &Entry) -> IndexEntry {
    let t = |(s, ns): (i64, i64)| IndexTime::new(s as i32, ns as u32);
    IndexEntry {
        ctime: t(e.ctime),
        mtime: t(e.mtime),
        dev: e.dev as u32,
        ino: e.ino as u32,
        mode,
        uid: e.uid,
        gid: e.gid,
        file_size: e.size as u32,
        id,
        flags: rel.len().min(0xfff) as u16,
        flags_extended: 0,
        path: rel.as_bytes().to_vec(),
    }
}

/// Removes `rel` and everything under it from an index.
fn remove_under(index: &mut Index, rel: &str) -> Result<()> {
    let prefix = format!("{rel}/");
    let doomed: Vec<Vec<u8>> = index
        .iter()
        .filter(|e| e.path == rel.as_bytes() || e.path.starts_with(prefix.as_bytes()))
        .map(|e| e.path)
        .collect();
    for p in doomed {
        let p = String::from_utf8_lossy(&p).into_owned();
        index
            .remove_path(Path::new(&p))
            .map_err(GitError::repo("stage"))?;
    }
    Ok(())
}

fn head_commit(repo: &Repository) -> Result<Option<git2::Commit<'_>>> {
    match repo.head() {
        Ok(r) => Ok(Some(
            r.peel_to_commit().map_err(GitError::repo("read HEAD"))?,
        )),
        Err(e) if matches!(e.code(), ErrorCode::UnbornBranch | ErrorCode::NotFound) => Ok(None),
        Err(e) => Err(GitError::repo("read HEAD")(e)),
    }
}

fn commit_id(repo: &Repository, rev: &str) -> Result<Oid> {
    let bad = || GitError::BadRevision {
        rev: rev.to_string(),
    };
    let obj = repo.revparse_single(rev).map_err(|e| match e.code() {
        ErrorCode::NotFound | ErrorCode::InvalidSpec | ErrorCode::Ambiguous => bad(),
        _ => GitError::repo("resolve revision")(e),
    })?;
    Ok(obj.peel_to_commit().map_err(|_| bad())?.id())
}

fn commit_tree<'r>(repo: &'r Repository, rev: &str) -> Result<Tree<'r>> {
    let id = commit_id(repo, rev)?;
    repo.find_commit(id)
        .and_then(|c| c.tree())
        .map_err(GitError::repo("read tree"))
}

fn blob_content(repo: &Repository, tree: &Tree<'_>, path: &str) -> Result<Content> {
    let entry = match tree.get_path(Path::new(path)) {
        Ok(e) => e,
        Err(e) if e.code() == ErrorCode::NotFound => return Ok(Content::Gone),
        Err(e) => return Err(GitError::repo("read tree")(e)),
    };
    match entry.filemode() {
        0o100644 | 0o100755 => {
            let blob = repo
                .find_blob(entry.id())
                .map_err(GitError::repo("read blob"))?;
            Ok(Content::File(blob.content().to_vec()))
        }
        _ => Err(GitError::Repo {
            op: "read",
            message: format!("{path} is not a regular file in that revision"),
        }),
    }
}

/// One change of a commit against its first parent.
struct Change {
    status: Delta,
    old: Option<String>,
    new: Option<String>,
}

impl Change {
    /// The path `git log --name-only` shows: the new name, or the old for a deletion.
    fn shown(&self) -> &str {
        self.new.as_deref().or(self.old.as_deref()).unwrap_or("")
    }
}

fn commit_deltas(
    repo: &Repository,
    commit: &git2::Commit<'_>,
    rename_threshold: Option<u16>,
) -> Result<Vec<Change>> {
    let tree = commit.tree().map_err(GitError::repo("diff"))?;
    let parent = match commit.parent(0) {
        Ok(p) => Some(p.tree().map_err(GitError::repo("diff"))?),
        Err(_) => None,
    };
    let mut opts = DiffOptions::new();
    opts.ignore_submodules(true);
    let mut diff = repo
        .diff_tree_to_tree(parent.as_ref(), Some(&tree), Some(&mut opts))
        .map_err(GitError::repo("diff"))?;
    if let Some(t) = rename_threshold {
        let mut f = DiffFindOptions::new();
        f.renames(true).rename_threshold(t);
        diff.find_similar(Some(&mut f))
            .map_err(GitError::repo("diff"))?;
    }
    let path_of = |f: git2::DiffFile<'_>| f.path().and_then(|p| p.to_str()).map(str::to_string);
    Ok(diff
        .deltas()
        .map(|d| {
            let (old, new) = match d.status() {
                Delta::Added => (None, path_of(d.new_file())),
                Delta::Deleted => (path_of(d.old_file()), None),
                _ => (path_of(d.old_file()), path_of(d.new_file())),
            };
            Change {
                status: d.status(),
                old,
                new,
            }
        })
        .collect())
}

fn commit_record(c: &git2::Commit<'_>, paths: Vec<String>) -> Commit {
    let a = c.author();
    let when = a.when();
    let time = chrono::FixedOffset::east_opt(when.offset_minutes() * 60)
        .and_then(|tz| {
            chrono::DateTime::from_timestamp(when.seconds(), 0).map(|t| t.with_timezone(&tz))
        })
        .map(|t| t.to_rfc3339())
        .unwrap_or_default();
    Commit {
        rev: c.id().to_string(),
        author: a.name().unwrap_or("").to_string(),
        email: a.email().unwrap_or("").to_string(),
        time,
        message: c.message().unwrap_or("").trim().to_string(),
        paths,
    }
}
