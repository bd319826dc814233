//! The optional per-session copy-on-write scratch area, and [`Fs`], the merged
//! view of a session's pruned tree and its scratch area that every command
//! reads through.
//!
//! The scratch area is an in-memory overlay keyed by node id. Nodes of the
//! session's tree keep their ids; files and directories created in the scratch
//! area get ids past the tree's last node. A tree node that is renamed,
//! modified or is a directory whose entries change is "copied up": it gets an
//! overlay entry (name, parent, mtime, and its children or its content) that
//! shadows the tree. A removed tree node simply disappears from its copied-up
//! parent's children (a whiteout). The overlay only ever sees the pruned tree,
//! so it cannot reveal a document the principal may not read: a name that is
//! pruned is, for the overlay, a name that does not exist.
//!
//! Memory is bounded by [`ScratchLimits`]: `max_bytes` of file content (every
//! file created, copied or modified in the scratch area counts with its full
//! size; a collection document that is only renamed counts nothing) and
//! `max_entries` files and directories created. Copied-up tree metadata is
//! bounded by the size of the session's tree. Everything is freed with the
//! session.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::cmd_files::{VStat, DIR_SIZE};
use super::vpath::FsErr;
use crate::manifest::{NodeId, NodeKind, Tree, ROOT};
use crate::store::View;

/// Size limits of a session's scratch area.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScratchLimits {
    /// Bytes of file content the scratch area may hold; writes past it fail
    /// with "No space left on device".
    pub max_bytes: u64,
    /// Files and directories that may be created in it (like a tmpfs inode
    /// limit); creating more fails with "No space left on device".
    pub max_entries: u64,
}

impl Default for ScratchLimits {
    fn default() -> Self {
        ScratchLimits {
            max_bytes: 16 << 20,
            max_entries: 10_000,
        }
    }
}

/// What a session's scratch area holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ScratchUsage {
    /// Bytes of file content counted against `max_bytes`.
    pub bytes: u64,
    /// Files and directories created, counted against `max_entries`.
    pub entries: u64,
    /// The limits in force.
    pub limits: ScratchLimits,
}

/// Longest file name (bytes), as on Linux file systems.
pub(crate) const NAME_MAX: usize = 255;

/// File content in the overlay.
#[derive(Debug, Clone)]
pub(crate) enum Content {
    /// The content of the tree document at this node (unmodified).
    Base(NodeId),
    /// Bytes written in the scratch area (shared by copies until written).
    Bytes(Arc<Vec<u8>>),
}

#[derive(Debug, Clone)]
enum Kind {
    /// Children sorted by name bytes.
    Dir(Vec<NodeId>),
    /// `charged`: the size counts against `max_bytes`.
    File { content: Content, charged: bool },
}

#[derive(Debug, Clone)]
struct Entry {
    name: Box<str>,
    parent: NodeId,
    mtime: i64,
    kind: Kind,
}

/// A session's copy-on-write scratch area.
#[derive(Debug)]
pub(crate) struct Scratch {
    base_len: NodeId,
    entries: HashMap<NodeId, Entry>,
    /// Removed tree directories (a working directory may still point at one).
    dead: HashSet<NodeId>,
    next: NodeId,
    bytes: u64,
    created: u64,
    limits: ScratchLimits,
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Directory lookups used by path resolution (the plain tree or the merged view).
pub(crate) trait Dirs {
    fn is_dir(&self, n: NodeId) -> bool;
    fn child(&self, dir: NodeId, name: &str) -> Option<NodeId>;
    fn parent(&self, n: NodeId) -> NodeId;
}

impl Dirs for Tree {
    fn is_dir(&self, n: NodeId) -> bool {
        Tree::is_dir(self, n)
    }
    fn child(&self, dir: NodeId, name: &str) -> Option<NodeId> {
        Tree::child(self, dir, name)
    }
    fn parent(&self, n: NodeId) -> NodeId {
        self.node(n).parent
    }
}

/// The merged, read-only view of a session's tree and its scratch area.
#[derive(Clone, Copy)]
pub(crate) struct Fs<'a> {
    view: &'a View,
    sc: Option<&'a Scratch>,
}

impl Dirs for Fs<'_> {
    fn is_dir(&self, n: NodeId) -> bool {
        Fs::is_dir(self, n)
    }
    fn child(&self, dir: NodeId, name: &str) -> Option<NodeId> {
        Fs::child(self, dir, name)
    }
    fn parent(&self, n: NodeId) -> NodeId {
        Fs::parent(self, n)
    }
}

impl<'a> Fs<'a> {
    pub(crate) fn new(view: &'a View, sc: Option<&'a Scratch>) -> Fs<'a> {
        Fs { view, sc }
    }

    /// Whether writes go to a scratch area.
    pub(crate) fn writable(&self) -> bool {
        self.sc.is_some()
    }

    fn tree(&self) -> &'a Tree {
        self.view.tree()
    }

    fn entry(&self, n: NodeId) -> Option<&'a Entry> {
        self.sc.and_then(|s| s.entries.get(&n))
    }

    fn is_base(&self, n: NodeId) -> bool {
        (n as usize) < self.tree().len()
    }

    fn is_dead(&self, n: NodeId) -> bool {
        self.sc.is_some_and(|s| s.dead.contains(&n))
    }

    /// Whether `n` is a directory. A removed scratch directory (only a stale
    /// working directory can name one) is an empty directory.
    pub(crate) fn is_dir(&self, n: NodeId) -> bool {
        match self.entry(n) {
            Some(e) => matches!(e.kind, Kind::Dir(_)),
            None if self.is_base(n) => self.tree().is_dir(n),
            None => true,
        }
    }

    /// Children of a directory, sorted by name bytes (empty for files).
    pub(crate) fn children(&self, n: NodeId) -> &'a [NodeId] {
        match self.entry(n) {
            Some(Entry {
                kind: Kind::Dir(c), ..
            }) => c.as_slice(),
            Some(_) => &[],
            None if self.is_base(n) && !self.is_dead(n) => self.tree().children(n),
            None => &[],
        }
    }

    /// File name of a node (empty for the root).
    pub(crate) fn name(&self, n: NodeId) -> &'a str {
        match self.entry(n) {
            Some(e) => &e.name,
            None if self.is_base(n) => &self.tree().node(n).name,
            None => "",
        }
    }

    /// Parent of a node (the root is its own parent).
    pub(crate) fn parent(&self, n: NodeId) -> NodeId {
        match self.entry(n) {
            Some(e) => e.parent,
            None if self.is_base(n) => self.tree().node(n).parent,
            None => ROOT,
        }
    }

    /// Look up a child by exact name.
    pub(crate) fn child(&self, dir: NodeId, name: &str) -> Option<NodeId> {
        let ch = self.children(dir);
        ch.binary_search_by(|c| self.name(*c).as_bytes().cmp(name.as_bytes()))
            .ok()
            .map(|i| ch[i])
    }

    /// Absolute path of a node (`/` for the root).
    pub(crate) fn path(&self, n: NodeId) -> String {
        if n == ROOT {
            return "/".into();
        }
        let mut parts = Vec::new();
        let mut cur = n;
        while cur != ROOT && parts.len() <= 4096 {
            parts.push(self.name(cur));
            cur = self.parent(cur);
        }
        let mut s = String::new();
        for p in parts.iter().rev() {
            s.push('/');
            s.push_str(p);
        }
        s
    }

    /// Whether `anc` is `n` or one of its ancestors.
    pub(crate) fn is_ancestor(&self, anc: NodeId, n: NodeId) -> bool {
        let mut cur = n;
        for _ in 0..=4096 {
            if cur == anc {
                return true;
            }
            if cur == ROOT {
                return false;
            }
            cur = self.parent(cur);
        }
        false
    }

    fn content_size(&self, c: &Content) -> u64 {
        match c {
            Content::Base(b) => self.view.doc(*b).map(|d| d.size).unwrap_or(0),
            Content::Bytes(b) => b.len() as u64,
        }
    }

    /// Size of a file in bytes.
    pub(crate) fn size(&self, n: NodeId) -> u64 {
        match self.entry(n) {
            Some(Entry {
                kind: Kind::File { content, .. },
                ..
            }) => self.content_size(content),
            Some(_) => DIR_SIZE,
            None if self.is_base(n) && !self.tree().is_dir(n) => {
                self.view.doc(n).map(|d| d.size).unwrap_or(0)
            }
            None => DIR_SIZE,
        }
    }

    /// What `stat` reports.
    pub(crate) fn stat(&self, n: NodeId) -> VStat {
        match self.entry(n) {
            Some(e) => match &e.kind {
                Kind::Dir(children) => VStat {
                    is_dir: true,
                    size: DIR_SIZE,
                    mtime: e.mtime,
                    nlink: 2 + children.iter().filter(|c| self.is_dir(**c)).count() as u64,
                    blocks: 8,
                },
                Kind::File { content, .. } => {
                    let size = self.content_size(content);
                    VStat {
                        is_dir: false,
                        size,
                        mtime: e.mtime,
                        nlink: 1,
                        blocks: size.div_ceil(4096) * 8,
                    }
                }
            },
            None if self.is_base(n) => base_stat(self.view, n),
            None => VStat {
                is_dir: true,
                size: DIR_SIZE,
                mtime: 0,
                nlink: 2,
                blocks: 8,
            },
        }
    }

    /// Content of a file node.
    pub(crate) fn read(&self, n: NodeId) -> Result<Vec<u8>, FsErr> {
        if self.is_dir(n) {
            return Err(FsErr::IsDir);
        }
        let base = match self.entry(n) {
            Some(Entry {
                kind: Kind::File { content, .. },
                ..
            }) => match content {
                Content::Bytes(b) => return Ok(b.to_vec()),
                Content::Base(b) => *b,
            },
            _ => n,
        };
        self.view.read(base).map_err(|e| FsErr::Io(e.to_string()))
    }

    /// Whether a file may match a trigram query. Content written in the scratch
    /// area is not in the collection's index, so it is always a candidate.
    pub(crate) fn is_candidate(&self, n: NodeId, cands: &Option<Vec<bool>>) -> bool {
        match self.entry(n) {
            Some(Entry {
                kind: Kind::File { content, .. },
                ..
            }) => match content {
                Content::Bytes(_) => true,
                Content::Base(b) => self.view.is_candidate(*b, cands),
            },
            Some(_) => false,
            None if self.is_base(n) => self.view.is_candidate(n, cands),
            None => false,
        }
    }

    fn content(&self, n: NodeId) -> Option<Content> {
        match self.entry(n) {
            Some(Entry {
                kind: Kind::File { content, .. },
                ..
            }) => Some(content.clone()),
            Some(_) => None,
            None if self.is_base(n) && !self.tree().is_dir(n) => Some(Content::Base(n)),
            None => None,
        }
    }
}

/// `stat` of a node of the session's tree, as stored.
pub(crate) fn base_stat(view: &View, n: NodeId) -> VStat {
    match &view.tree().node(n).kind {
        NodeKind::Dir { mtime, subdirs, .. } => VStat {
            is_dir: true,
            size: DIR_SIZE,
            mtime: *mtime,
            nlink: 2 + u64::from(*subdirs),
            blocks: 8,
        },
        NodeKind::File { .. } => {
            let d = view.doc(n);
            let size = d.map(|d| d.size).unwrap_or(0);
            VStat {
                is_dir: false,
                size,
                mtime: d.map(|d| d.mtime).unwrap_or(0),
                nlink: 1,
                blocks: size.div_ceil(4096) * 8,
            }
        }
    }
}

impl Scratch {
    /// An empty scratch area over a tree of `base_len` nodes.
    pub(crate) fn new(base_len: usize, limits: ScratchLimits) -> Scratch {
        let base_len = NodeId::try_from(base_len).unwrap_or(NodeId::MAX);
        Scratch {
            base_len,
            entries: HashMap::new(),
            dead: HashSet::new(),
            next: base_len,
            bytes: 0,
            created: 0,
            limits,
        }
    }

    pub(crate) fn usage(&self) -> ScratchUsage {
        ScratchUsage {
            bytes: self.bytes,
            entries: self.created,
            limits: self.limits,
        }
    }

    fn fs<'a>(&'a self, view: &'a View) -> Fs<'a> {
        Fs::new(view, Some(self))
    }

    /// Give a tree node an overlay entry (no-op if it has one).
    fn copy_up(&mut self, view: &View, n: NodeId) -> Result<(), FsErr> {
        if self.entries.contains_key(&n) {
            return Ok(());
        }
        if n >= self.base_len || (n as usize) >= view.tree().len() || self.dead.contains(&n) {
            return Err(FsErr::NotFound);
        }
        let node = view.tree().node(n);
        let st = base_stat(view, n);
        let kind = match &node.kind {
            NodeKind::Dir { children, .. } => Kind::Dir(children.clone()),
            NodeKind::File { .. } => Kind::File {
                content: Content::Base(n),
                charged: false,
            },
        };
        self.entries.insert(
            n,
            Entry {
                name: node.name.clone(),
                parent: node.parent,
                mtime: st.mtime,
                kind,
            },
        );
        Ok(())
    }

    fn charge_of(&self, view: &View, e: &Entry) -> u64 {
        match &e.kind {
            Kind::File {
                content,
                charged: true,
            } => self.fs(view).content_size(content),
            _ => 0,
        }
    }

    /// Insert `id` (already named) into directory `dir`'s children.
    fn link(&mut self, view: &View, dir: NodeId, id: NodeId) -> Result<(), FsErr> {
        if !self.fs(view).is_dir(dir) {
            return Err(FsErr::NotDir);
        }
        self.copy_up(view, dir)?;
        let fs = self.fs(view);
        let name = fs.name(id);
        let pos = fs
            .children(dir)
            .binary_search_by(|c| fs.name(*c).as_bytes().cmp(name.as_bytes()));
        let i = match pos {
            Ok(_) => return Err(FsErr::Exists),
            Err(i) => i,
        };
        if let Some(Entry {
            kind: Kind::Dir(kids),
            mtime,
            ..
        }) = self.entries.get_mut(&dir)
        {
            kids.insert(i, id);
            *mtime = now();
        }
        Ok(())
    }

    /// Remove `id` from its parent's children.
    fn unlink(&mut self, view: &View, id: NodeId) -> Result<(), FsErr> {
        let dir = self.fs(view).parent(id);
        self.copy_up(view, dir)?;
        if let Some(Entry {
            kind: Kind::Dir(kids),
            mtime,
            ..
        }) = self.entries.get_mut(&dir)
        {
            if let Some(i) = kids.iter().position(|c| *c == id) {
                kids.remove(i);
                *mtime = now();
            }
        }
        Ok(())
    }

    fn check_name(name: &str) -> Result<(), FsErr> {
        if name.len() > NAME_MAX {
            Err(FsErr::NameTooLong)
        } else {
            Ok(())
        }
    }

    fn new_entry(
        &mut self,
        view: &View,
        dir: NodeId,
        name: &str,
        kind: Kind,
    ) -> Result<NodeId, FsErr> {
        Self::check_name(name)?;
        let fs = self.fs(view);
        if !fs.is_dir(dir) {
            return Err(FsErr::NotDir);
        }
        if fs.child(dir, name).is_some() {
            return Err(FsErr::Exists);
        }
        // A removed directory (a stale working directory) takes no new entries.
        let alive = dir == ROOT || fs.child(fs.parent(dir), fs.name(dir)) == Some(dir);
        if !alive {
            return Err(FsErr::NotFound);
        }
        if self.created >= self.limits.max_entries || self.next == NodeId::MAX {
            return Err(FsErr::NoSpace);
        }
        let id = self.next;
        self.next += 1;
        self.created += 1;
        self.entries.insert(
            id,
            Entry {
                name: name.into(),
                parent: dir,
                mtime: now(),
                kind,
            },
        );
        if let Err(e) = self.link(view, dir, id) {
            self.entries.remove(&id);
            self.created -= 1;
            return Err(e);
        }
        Ok(id)
    }

    /// Create an empty file `name` in `dir`.
    pub(crate) fn create_file(
        &mut self,
        view: &View,
        dir: NodeId,
        name: &str,
    ) -> Result<NodeId, FsErr> {
        let kind = Kind::File {
            content: Content::Bytes(Arc::new(Vec::new())),
            charged: true,
        };
        self.new_entry(view, dir, name, kind)
    }

    /// Create an empty directory `name` in `dir`.
    pub(crate) fn mkdir(&mut self, view: &View, dir: NodeId, name: &str) -> Result<NodeId, FsErr> {
        self.new_entry(view, dir, name, Kind::Dir(Vec::new()))
    }

    /// Remove `id` and everything under it.
    pub(crate) fn remove(&mut self, view: &View, id: NodeId) -> Result<(), FsErr> {
        if id == ROOT {
            return Err(FsErr::Busy);
        }
        self.unlink(view, id)?;
        let mut stack = vec![id];
        while let Some(n) = stack.pop() {
            stack.extend_from_slice(self.fs(view).children(n));
            if let Some(e) = self.entries.remove(&n) {
                self.bytes -= self.charge_of(view, &e).min(self.bytes);
            }
            if n >= self.base_len {
                self.created = self.created.saturating_sub(1);
            } else if view.tree().is_dir(n) {
                self.dead.insert(n);
            }
        }
        Ok(())
    }

    /// Move `id` to `dir` under `name` (the target name must be free).
    pub(crate) fn rename(
        &mut self,
        view: &View,
        id: NodeId,
        dir: NodeId,
        name: &str,
    ) -> Result<(), FsErr> {
        Self::check_name(name)?;
        if id == ROOT {
            return Err(FsErr::Busy);
        }
        if self.fs(view).child(dir, name).is_some() {
            return Err(FsErr::Exists);
        }
        if self.fs(view).is_ancestor(id, dir) {
            // Into itself: callers report this with their own wording first.
            return Err(FsErr::Invalid);
        }
        self.copy_up(view, id)?;
        self.unlink(view, id)?;
        let old = self.entries.get(&id).map(|e| (e.name.clone(), e.parent));
        if let Some(e) = self.entries.get_mut(&id) {
            e.name = name.into();
            e.parent = dir;
        }
        if let Err(err) = self.link(view, dir, id) {
            // Put it back where it was.
            if let (Some(e), Some((n, p))) = (self.entries.get_mut(&id), old) {
                e.name = n;
                e.parent = p;
                let _ = self.link(view, p, id);
            }
            return Err(err);
        }
        Ok(())
    }

    /// Replace (or append to) a file's content. When the limit is reached the
    /// bytes that fit are stored and `NoSpace` is returned.
    pub(crate) fn write(
        &mut self,
        view: &View,
        id: NodeId,
        data: &[u8],
        append: bool,
    ) -> Result<(), FsErr> {
        if self.fs(view).is_dir(id) {
            return Err(FsErr::IsDir);
        }
        self.copy_up(view, id)?;
        let Some(e) = self.entries.get(&id) else {
            return Err(FsErr::NotFound);
        };
        let Kind::File { content, .. } = &e.kind else {
            return Err(FsErr::IsDir);
        };
        let old_charge = self.charge_of(view, e);
        let old_len = self.fs(view).content_size(content);
        let room = self
            .limits
            .max_bytes
            .saturating_sub(self.bytes - old_charge.min(self.bytes));
        let base_len = if append { old_len } else { 0 };
        if base_len > room {
            // Only possible if the limits shrank; keep what is there.
            return Err(FsErr::NoSpace);
        }
        let (take, full) = if base_len + data.len() as u64 > room {
            ((room - base_len) as usize, true)
        } else {
            (data.len(), false)
        };
        let Some(Entry {
            kind: Kind::File { content, charged },
            mtime,
            ..
        }) = self.entries.get_mut(&id)
        else {
            return Err(FsErr::NotFound);
        };
        // Take the content out so that an unshared buffer is appended in place.
        let old = std::mem::replace(content, Content::Bytes(Arc::new(Vec::new())));
        let mut bytes = match (append, old) {
            (false, _) => Arc::new(Vec::new()),
            (true, Content::Bytes(b)) => b,
            (true, Content::Base(b)) => match view.read(b) {
                Ok(d) => Arc::new(d),
                Err(err) => {
                    *content = Content::Base(b);
                    return Err(FsErr::Io(err.to_string()));
                }
            },
        };
        Arc::make_mut(&mut bytes).extend_from_slice(&data[..take.min(data.len())]);
        let new_len = bytes.len() as u64;
        *content = Content::Bytes(bytes);
        *charged = true;
        *mtime = now();
        self.bytes = self.bytes - old_charge.min(self.bytes) + new_len;
        if full {
            Err(FsErr::NoSpace)
        } else {
            Ok(())
        }
    }

    /// Make `dst` (an existing file) a copy of file `src`. Shares the content
    /// when it fits; otherwise stores what fits and returns `NoSpace`.
    pub(crate) fn copy_content(
        &mut self,
        view: &View,
        src: NodeId,
        dst: NodeId,
    ) -> Result<(), FsErr> {
        let Some(content) = self.fs(view).content(src) else {
            return Err(FsErr::IsDir);
        };
        let size = self.fs(view).content_size(&content);
        self.copy_up(view, dst)?;
        let old_charge = match self.entries.get(&dst) {
            Some(e) if matches!(e.kind, Kind::File { .. }) => self.charge_of(view, e),
            _ => return Err(FsErr::IsDir),
        };
        let room = self
            .limits
            .max_bytes
            .saturating_sub(self.bytes - old_charge.min(self.bytes));
        if size > room {
            let data = self.fs(view).read(src)?;
            return self.write(view, dst, &data, false);
        }
        if let Some(e) = self.entries.get_mut(&dst) {
            e.kind = Kind::File {
                content,
                charged: true,
            };
            e.mtime = now();
        }
        self.bytes = self.bytes - old_charge.min(self.bytes) + size;
        Ok(())
    }

    /// Set a node's modification time (`touch`).
    pub(crate) fn set_mtime(&mut self, view: &View, id: NodeId, mtime: i64) -> Result<(), FsErr> {
        self.copy_up(view, id)?;
        if let Some(e) = self.entries.get_mut(&id) {
            e.mtime = mtime;
        }
        Ok(())
    }

    /// Current time, seconds since the epoch (for `touch`).
    pub(crate) fn now() -> i64 {
        now()
    }
}

/// Where a path names an entry to create or replace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The directory the entry is (or would be) in.
    pub dir: NodeId,
    /// Its final name (`.`/`..`/empty for the root are possible).
    pub name: String,
    /// The entry, if it exists.
    pub node: Option<NodeId>,
    /// The path ended with `/`.
    pub slash: bool,
}

/// Split `path` into its directory (resolved, must exist and be a directory)
/// and final name, POSIX style.
pub(crate) fn target<D: Dirs>(fs: &D, cwd: NodeId, path: &str) -> Result<Target, FsErr> {
    if path.is_empty() {
        return Err(FsErr::NotFound);
    }
    let trimmed = path.trim_end_matches('/');
    let slash = trimmed.len() != path.len();
    if trimmed.is_empty() {
        return Ok(Target {
            dir: ROOT,
            name: String::new(),
            node: Some(ROOT),
            slash,
        });
    }
    let (dir, name) = match trimmed.rfind('/') {
        None => (cwd, trimmed),
        Some(i) => {
            let parent = &trimmed[..i];
            let d = if parent.trim_end_matches('/').is_empty() {
                ROOT
            } else {
                super::vpath::resolve(fs, cwd, parent)?
            };
            (d, &trimmed[i + 1..])
        }
    };
    if !fs.is_dir(dir) {
        return Err(FsErr::NotDir);
    }
    let node = match name {
        "." => Some(dir),
        ".." => Some(fs.parent(dir)),
        n => fs.child(dir, n),
    };
    Ok(Target {
        dir,
        name: name.to_string(),
        node,
        slash,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IngestOptions, Principal, Source, Store};

    struct Fixture {
        _dir: tempfile::TempDir,
        view: Arc<View>,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        for (p, c) in [
            ("a/one.md", "one rate\n"),
            ("a/two.md", "two two\n"),
            ("a/sub/three.md", "three\n"),
            ("b.md", "bee\n"),
        ] {
            let f = src.join(p);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, c).unwrap();
        }
        let store = Store::open(dir.path().join("store")).unwrap();
        store
            .create("c", Source::Dir { path: src }, IngestOptions::default())
            .unwrap();
        let view = store
            .collection("c")
            .unwrap()
            .view(&Principal::operator())
            .unwrap();
        Fixture { _dir: dir, view }
    }

    fn at(fs: &Fs, path: &str) -> Option<NodeId> {
        super::super::vpath::resolve(fs, ROOT, path).ok()
    }

    fn names<'a>(fs: &Fs<'a>, path: &str) -> Vec<&'a str> {
        let d = at(fs, path).unwrap();
        fs.children(d).iter().map(|c| fs.name(*c)).collect()
    }

    fn limits(max_bytes: u64, max_entries: u64) -> ScratchLimits {
        ScratchLimits {
            max_bytes,
            max_entries,
        }
    }

    #[test]
    fn whiteouts_hide_removed_documents_from_every_read() {
        let fx = fixture();
        let v = &*fx.view;
        let mut sc = Scratch::new(v.tree().len(), limits(1 << 20, 100));
        let one = at(&Fs::new(v, Some(&sc)), "/a/one.md").unwrap();
        sc.remove(v, one).unwrap();
        let fs = Fs::new(v, Some(&sc));
        assert_eq!(names(&fs, "/a"), ["sub", "two.md"]);
        assert_eq!(at(&fs, "/a/one.md"), None);
        // The collection's tree is untouched, and a view without the overlay still has it.
        assert!(v.tree().lookup("/a/one.md").is_some());
        assert_eq!(names(&Fs::new(v, None), "/a"), ["one.md", "sub", "two.md"]);
        // A new file may take the removed name; it is scratch content, always a grep candidate.
        let a = at(&fs, "/a").unwrap();
        let n = sc.create_file(v, a, "one.md").unwrap();
        assert_ne!(n, one);
        sc.write(v, n, b"fresh\n", false).unwrap();
        let fs = Fs::new(v, Some(&sc));
        assert_eq!(fs.read(at(&fs, "/a/one.md").unwrap()).unwrap(), b"fresh\n");
        assert!(fs.is_candidate(n, &Some(vec![false; 8])));
        let two = at(&fs, "/a/two.md").unwrap();
        assert!(!fs.is_candidate(two, &Some(vec![false; 8])));
        assert_eq!(sc.usage().bytes, 6);
        assert_eq!(sc.usage().entries, 1);
    }

    #[test]
    fn rename_over_an_existing_file_keeps_identity_and_content() {
        let fx = fixture();
        let v = &*fx.view;
        let mut sc = Scratch::new(v.tree().len(), limits(1 << 20, 100));
        let fs = Fs::new(v, Some(&sc));
        let (two, b) = (at(&fs, "/a/two.md").unwrap(), at(&fs, "/b.md").unwrap());
        // mv a/two.md b.md: the target goes, the source keeps its node id.
        assert_eq!(sc.rename(v, two, ROOT, "b.md"), Err(FsErr::Exists));
        sc.remove(v, b).unwrap();
        sc.rename(v, two, ROOT, "b.md").unwrap();
        let fs = Fs::new(v, Some(&sc));
        assert_eq!(at(&fs, "/b.md"), Some(two));
        assert_eq!(fs.read(two).unwrap(), b"two two\n");
        assert_eq!(fs.path(two), "/b.md");
        assert_eq!(names(&fs, "/a"), ["one.md", "sub"]);
        assert_eq!(names(&fs, "/"), ["a", "b.md"]);
        // A renamed collection document is still its indexed content: no bytes charged.
        assert_eq!(sc.usage().bytes, 0);
        // Renaming a directory carries its subtree; `..` follows the new parent.
        let sub = at(&fs, "/a/sub").unwrap();
        sc.rename(v, sub, ROOT, "top").unwrap();
        let fs = Fs::new(v, Some(&sc));
        assert_eq!(
            fs.read(at(&fs, "/top/three.md").unwrap()).unwrap(),
            b"three\n"
        );
        assert_eq!(at(&fs, "/top/.."), Some(ROOT));
        assert_eq!(names(&fs, "/"), ["a", "b.md", "top"]);
        // Not into itself (the caller checks), and not onto a taken name.
        assert_eq!(sc.rename(v, sub, ROOT, "a"), Err(FsErr::Exists));
    }

    #[test]
    fn recursive_removal_of_a_collection_directory() {
        let fx = fixture();
        let v = &*fx.view;
        let mut sc = Scratch::new(v.tree().len(), limits(1 << 20, 100));
        let fs = Fs::new(v, Some(&sc));
        let (a, sub) = (at(&fs, "/a").unwrap(), at(&fs, "/a/sub").unwrap());
        let n = sc.create_file(v, sub, "new.md").unwrap();
        sc.write(v, n, b"12345", false).unwrap();
        sc.mkdir(v, a, "d").unwrap();
        assert_eq!(sc.usage().entries, 2);
        sc.remove(v, a).unwrap();
        let fs = Fs::new(v, Some(&sc));
        assert_eq!(names(&fs, "/"), ["b.md"]);
        // Everything the scratch area held under it is freed.
        assert_eq!((sc.usage().bytes, sc.usage().entries), (0, 0));
        // A working directory inside it is an empty, dead directory.
        assert!(fs.is_dir(sub) && fs.children(sub).is_empty());
        assert!(fs.children(a).is_empty());
        assert_eq!(sc.create_file(v, sub, "x"), Err(FsErr::NotFound));
        assert_eq!(sc.mkdir(v, a, "x"), Err(FsErr::NotFound));
        // The root itself cannot go.
        assert_eq!(sc.remove(v, ROOT), Err(FsErr::Busy));
    }

    #[test]
    fn size_and_entry_limits_are_no_space_left() {
        let fx = fixture();
        let v = &*fx.view;
        let mut sc = Scratch::new(v.tree().len(), limits(10, 2));
        let f = sc.create_file(v, ROOT, "f").unwrap();
        sc.write(v, f, b"12345678", false).unwrap();
        // Appending past the limit stores what fits, then fails.
        assert_eq!(sc.write(v, f, b"abcde", true), Err(FsErr::NoSpace));
        assert_eq!(Fs::new(v, Some(&sc)).read(f).unwrap(), b"12345678ab");
        assert_eq!(sc.usage().bytes, 10);
        // Truncating frees; rewriting a collection document charges its new size.
        sc.write(v, f, b"", false).unwrap();
        assert_eq!(sc.usage().bytes, 0);
        let b = at(&Fs::new(v, Some(&sc)), "/b.md").unwrap();
        sc.write(v, b, b"x", true).unwrap();
        assert_eq!(Fs::new(v, Some(&sc)).read(b).unwrap(), b"bee\nx");
        assert_eq!(sc.usage().bytes, 5);
        // Copies are charged in full, even when the content is shared.
        let c = sc.create_file(v, ROOT, "c").unwrap();
        sc.copy_content(v, b, c).unwrap();
        assert_eq!(sc.usage().bytes, 10);
        let one = at(&Fs::new(v, Some(&sc)), "/a/one.md").unwrap();
        let d = sc.create_file(v, ROOT, "d");
        assert_eq!(d, Err(FsErr::NoSpace), "the entry limit is 2");
        assert_eq!(sc.copy_content(v, one, c), Err(FsErr::NoSpace));
        assert_eq!(sc.usage().bytes, 10);
        assert_eq!(Fs::new(v, Some(&sc)).read(c).unwrap(), b"one r");
        // Names longer than NAME_MAX are refused.
        sc.remove(v, c).unwrap();
        let long = "n".repeat(NAME_MAX + 1);
        assert_eq!(sc.create_file(v, ROOT, &long), Err(FsErr::NameTooLong));
    }

    #[test]
    fn targets_split_parent_and_name() {
        let fx = fixture();
        let fs = Fs::new(&fx.view, None);
        let a = at(&fs, "/a").unwrap();
        let t = target(&fs, ROOT, "a/new.md").unwrap();
        assert_eq!(
            (t.dir, t.name.as_str(), t.node, t.slash),
            (a, "new.md", None, false)
        );
        let t = target(&fs, a, "../b.md/").unwrap();
        assert_eq!((t.dir, t.slash), (ROOT, true));
        assert_eq!(t.node, at(&fs, "/b.md"));
        assert_eq!(target(&fs, ROOT, "nope/x"), Err(FsErr::NotFound));
        assert_eq!(target(&fs, ROOT, "b.md/x"), Err(FsErr::NotDir));
        assert_eq!(target(&fs, ROOT, "").unwrap_err(), FsErr::NotFound);
        assert_eq!(target(&fs, a, "/").unwrap().node, Some(ROOT));
        assert_eq!(target(&fs, a, ".").unwrap().node, Some(a));
    }
}
