//! The immutable per-version manifest (documents and their metadata) and the
//! path tree built from it, pruned per principal.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::acl::{Acl, Principal};

/// Errors from validating document paths and building trees.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// A path is empty, absolute, has `.`/`..`/empty components, or a NUL byte.
    #[error("invalid document path {path:?}: {reason}")]
    InvalidPath { path: String, reason: &'static str },
    /// A path is both a document and a directory of other documents.
    #[error("document path {path:?} is also a directory of other documents")]
    FileDirConflict { path: String },
    /// The same path appears twice.
    #[error("duplicate document path {path:?}")]
    Duplicate { path: String },
}

/// One document of a collection version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DocEntry {
    /// Relative path, `/`-separated, no leading slash.
    pub path: String,
    /// Content hash (BLAKE3, hex) in the collection's content store.
    pub hash: String,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, seconds since the Unix epoch.
    pub mtime: i64,
    /// Who may read it.
    pub acl: Acl,
    /// Source metadata (e.g. JSONL chunk metadata, S3 ETag).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, serde_json::Value>,
    /// Source fingerprint used to skip unchanged documents on re-ingest.
    pub source_tag: String,
}

/// A directory of the source with no document under it, kept so that listings
/// (`ls`, `find -type d`) show the source's directories.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirEntry {
    /// Relative path, `/`-separated, no leading slash.
    pub path: String,
    /// Modification time, seconds since the Unix epoch.
    pub mtime: i64,
    /// Who sees it: what a document at its path would get.
    pub acl: Acl,
}

/// The immutable manifest of one collection version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Collection name.
    pub collection: String,
    /// Version number, starting at 1.
    pub version: u64,
    /// Creation time, seconds since the Unix epoch.
    pub created: i64,
    /// Human-readable source description (`git:/src`, `s3://b/p`, ...).
    pub source: String,
    /// Documents sorted by path.
    pub docs: Vec<DocEntry>,
    /// Directories with no document under them, sorted by path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dirs: Vec<DirEntry>,
}

/// Check that a document path is relative and normalized.
pub fn validate_path(path: &str) -> Result<(), ManifestError> {
    let bad = |reason| {
        Err(ManifestError::InvalidPath {
            path: path.to_string(),
            reason,
        })
    };
    if path.is_empty() {
        return bad("empty path");
    }
    if path.starts_with('/') {
        return bad("absolute path");
    }
    if path.contains('\0') {
        return bad("contains a NUL byte");
    }
    for comp in path.split('/') {
        match comp {
            "" => return bad("empty path component"),
            "." | ".." => return bad("`.` or `..` component"),
            _ => {}
        }
    }
    Ok(())
}

/// Index of a node in a [`Tree`]. The root is node 0.
pub type NodeId = u32;

/// Node payload.
#[derive(Debug, Clone)]
pub enum NodeKind {
    /// Directory with children sorted by name (byte order).
    Dir {
        children: Vec<NodeId>,
        mtime: i64,
        subdirs: u32,
    },
    /// Document, indexing into the manifest's `docs`.
    File { doc: u32 },
}

/// One node of the path tree.
#[derive(Debug, Clone)]
pub struct Node {
    /// File name (empty for the root).
    pub name: Box<str>,
    /// Parent (the root is its own parent).
    pub parent: NodeId,
    /// Payload.
    pub kind: NodeKind,
}

/// A path tree over a subset of a manifest's documents.
#[derive(Debug, Clone)]
pub struct Tree {
    nodes: Vec<Node>,
    visible_docs: usize,
}

/// The root node id.
pub const ROOT: NodeId = 0;

/// The directory node at `prefix` (its last component `name`), made as a child of
/// `parent` if there is none yet; `conflict` names the path in the error when
/// `parent` turns out to be a file.
fn dir_node<'a>(
    nodes: &mut Vec<Node>,
    dirs: &mut HashMap<&'a str, NodeId>,
    parent: NodeId,
    prefix: &'a str,
    name: &str,
    conflict: &str,
) -> Result<NodeId, ManifestError> {
    if let Some(&id) = dirs.get(prefix) {
        return Ok(id);
    }
    let id = nodes.len() as NodeId;
    nodes.push(Node {
        name: name.into(),
        parent,
        kind: NodeKind::Dir {
            children: Vec::new(),
            mtime: 0,
            subdirs: 0,
        },
    });
    match &mut nodes[parent as usize].kind {
        NodeKind::Dir {
            children, subdirs, ..
        } => {
            children.push(id);
            *subdirs += 1;
        }
        NodeKind::File { .. } => {
            return Err(ManifestError::FileDirConflict {
                path: conflict.to_string(),
            })
        }
    }
    dirs.insert(prefix, id);
    Ok(id)
}

impl Tree {
    /// Build the tree of the documents and empty directories `principal` may
    /// read. Other directories exist only as prefixes of visible entries, so pruned
    /// ones vanish entirely.
    pub fn for_principal(
        manifest: &Manifest,
        principal: &Principal,
    ) -> Result<Tree, ManifestError> {
        Tree::build(manifest, |acl| acl.allows(principal))
    }

    /// Build the tree of the documents and empty directories whose ACL passes `keep`.
    pub fn build(manifest: &Manifest, keep: impl Fn(&Acl) -> bool) -> Result<Tree, ManifestError> {
        let mut nodes = vec![Node {
            name: "".into(),
            parent: ROOT,
            kind: NodeKind::Dir {
                children: Vec::new(),
                mtime: 0,
                subdirs: 0,
            },
        }];
        let mut dirs: HashMap<&str, NodeId> = HashMap::new();
        let mut visible = 0;
        for (i, doc) in manifest.docs.iter().enumerate() {
            if !keep(&doc.acl) {
                continue;
            }
            visible += 1;
            let mut parent = ROOT;
            let mut start = 0;
            let path = doc.path.as_str();
            // Walk/create each directory prefix.
            while let Some(off) = path[start..].find('/') {
                let prefix = &path[..start + off];
                let name = &path[start..start + off];
                let conflict = path.get(..start.saturating_sub(1)).unwrap_or("");
                parent = dir_node(&mut nodes, &mut dirs, parent, prefix, name, conflict)?;
                start += off + 1;
            }
            if dirs.contains_key(path) {
                return Err(ManifestError::FileDirConflict {
                    path: path.to_string(),
                });
            }
            let id = nodes.len() as NodeId;
            nodes.push(Node {
                name: path[start..].into(),
                parent,
                kind: NodeKind::File { doc: i as u32 },
            });
            match &mut nodes[parent as usize].kind {
                NodeKind::Dir { children, .. } => children.push(id),
                NodeKind::File { .. } => {
                    return Err(ManifestError::FileDirConflict {
                        path: path[..start - 1].to_string(),
                    })
                }
            }
            // Propagate mtime to ancestors.
            let mut p = parent;
            loop {
                if let NodeKind::Dir { mtime, .. } = &mut nodes[p as usize].kind {
                    if *mtime < doc.mtime {
                        *mtime = doc.mtime;
                    }
                }
                if p == ROOT {
                    break;
                }
                p = nodes[p as usize].parent;
            }
        }
        // Empty directories, and their parents as prefixes.
        for d in manifest.dirs.iter().filter(|d| keep(&d.acl)) {
            validate_path(&d.path)?;
            let mut parent = ROOT;
            let path = d.path.as_str();
            let ends = path
                .match_indices('/')
                .map(|(i, _)| i)
                .chain(std::iter::once(path.len()));
            let mut start = 0;
            for end in ends {
                let prefix = &path[..end];
                let name = &path[start..end];
                start = end + 1;
                parent = dir_node(&mut nodes, &mut dirs, parent, prefix, name, prefix)?;
            }
            if let NodeKind::Dir { mtime, .. } = &mut nodes[parent as usize].kind {
                *mtime = (*mtime).max(d.mtime);
            }
        }
        // A file whose path equals a directory created later.
        for (i, doc) in manifest.docs.iter().enumerate() {
            if keep(&doc.acl) && dirs.contains_key(doc.path.as_str()) {
                let _ = i;
                return Err(ManifestError::FileDirConflict {
                    path: doc.path.clone(),
                });
            }
        }
        // Sort children by name bytes; detect duplicates.
        let names: Vec<Box<str>> = nodes.iter().map(|n| n.name.clone()).collect();
        for node in &mut nodes {
            if let NodeKind::Dir { children, .. } = &mut node.kind {
                children.sort_by(|a, b| {
                    names[*a as usize]
                        .as_bytes()
                        .cmp(names[*b as usize].as_bytes())
                });
                for w in children.windows(2) {
                    if names[w[0] as usize] == names[w[1] as usize] {
                        return Err(ManifestError::Duplicate {
                            path: names[w[0] as usize].to_string(),
                        });
                    }
                }
            }
        }
        Ok(Tree {
            nodes,
            visible_docs: visible,
        })
    }

    /// Number of visible documents.
    pub fn doc_count(&self) -> usize {
        self.visible_docs
    }

    /// A node by id.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }

    /// Number of nodes (directories and files).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: the root exists.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether `id` is a directory.
    pub fn is_dir(&self, id: NodeId) -> bool {
        matches!(self.nodes[id as usize].kind, NodeKind::Dir { .. })
    }

    /// Children of a directory (empty for files), sorted by name.
    pub fn children(&self, id: NodeId) -> &[NodeId] {
        match &self.nodes[id as usize].kind {
            NodeKind::Dir { children, .. } => children,
            NodeKind::File { .. } => &[],
        }
    }

    /// Look up a child by exact name.
    pub fn child(&self, dir: NodeId, name: &str) -> Option<NodeId> {
        let ch = self.children(dir);
        ch.binary_search_by(|c| self.nodes[*c as usize].name.as_bytes().cmp(name.as_bytes()))
            .ok()
            .map(|i| ch[i])
    }

    /// The document index of a file node.
    pub fn doc(&self, id: NodeId) -> Option<u32> {
        match self.nodes[id as usize].kind {
            NodeKind::File { doc } => Some(doc),
            NodeKind::Dir { .. } => None,
        }
    }

    /// Absolute path of a node (`/` for the root).
    pub fn path(&self, id: NodeId) -> String {
        if id == ROOT {
            return "/".into();
        }
        let mut parts = Vec::new();
        let mut cur = id;
        while cur != ROOT {
            parts.push(&*self.nodes[cur as usize].name);
            cur = self.nodes[cur as usize].parent;
        }
        let mut s = String::new();
        for p in parts.iter().rev() {
            s.push('/');
            s.push_str(p);
        }
        s
    }

    /// Resolve an absolute, `/`-separated path (`.` and `..` allowed).
    pub fn lookup(&self, path: &str) -> Option<NodeId> {
        let mut cur = ROOT;
        for comp in path.split('/') {
            match comp {
                "" | "." => {}
                ".." => cur = self.nodes[cur as usize].parent,
                name => cur = self.child(cur, name)?,
            }
        }
        Some(cur)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(path: &str, acl: Acl) -> DocEntry {
        DocEntry {
            path: path.into(),
            hash: String::new(),
            size: 1,
            mtime: 5,
            acl,
            metadata: BTreeMap::new(),
            source_tag: String::new(),
        }
    }

    fn manifest(docs: Vec<DocEntry>) -> Manifest {
        Manifest {
            collection: "c".into(),
            version: 1,
            created: 0,
            source: "t".into(),
            docs,
            dirs: Vec::new(),
        }
    }

    #[test]
    fn builds_sorted_tree() {
        let m = manifest(vec![
            doc("b/z.md", Acl::public()),
            doc("a.md", Acl::public()),
            doc("b/a.md", Acl::public()),
            doc("B.md", Acl::public()),
        ]);
        let t = Tree::build(&m, |_| true).unwrap();
        let names: Vec<&str> = t.children(ROOT).iter().map(|c| &*t.node(*c).name).collect();
        assert_eq!(names, ["B.md", "a.md", "b"]);
        let b = t.lookup("/b").unwrap();
        assert!(t.is_dir(b));
        assert_eq!(t.path(t.lookup("/b/../b/z.md").unwrap()), "/b/z.md");
        assert_eq!(t.lookup("/nope"), None);
    }

    #[test]
    fn prunes_invisible_dirs() {
        let m = manifest(vec![
            doc("pub/a.md", Acl::public()),
            doc("secret/x.md", Acl::groups(["hr"])),
            doc("mixed/ok.md", Acl::public()),
            doc("mixed/no.md", Acl::groups(["hr"])),
        ]);
        let t = Tree::for_principal(&m, &Principal::anonymous()).unwrap();
        assert_eq!(t.lookup("/secret"), None);
        assert_eq!(t.lookup("/mixed/no.md"), None);
        assert!(t.lookup("/mixed/ok.md").is_some());
        assert_eq!(t.doc_count(), 2);
    }

    /// An empty directory is seen by whoever may read a document at its path, with
    /// its parents; a directory at a document's path is a conflict.
    #[test]
    fn empty_dirs_are_kept_for_those_who_may_see_them() {
        let mut m = manifest(vec![doc("pub/a.md", Acl::public())]);
        let dir = |path: &str, acl: Acl| DirEntry {
            path: path.into(),
            mtime: 7,
            acl,
        };
        m.dirs = vec![
            dir("pub/empty", Acl::public()),
            dir("hr/plans/q3", Acl::groups(["hr"])),
        ];
        let anon = Tree::for_principal(&m, &Principal::anonymous()).unwrap();
        assert!(anon.lookup("/pub/empty").is_some());
        assert_eq!(anon.lookup("/hr"), None);
        let hr = Tree::for_principal(&m, &Principal::new("ann", ["hr"])).unwrap();
        let q3 = hr.lookup("/hr/plans/q3").expect("the empty directory");
        assert!(
            matches!(hr.node(q3).kind, NodeKind::Dir { mtime: 7, ref children, .. } if children.is_empty())
        );
        assert_eq!(hr.doc_count(), 1);
        m.dirs = vec![dir("pub/a.md", Acl::public())];
        assert!(Tree::build(&m, |_| true).is_err());
    }

    #[test]
    fn rejects_conflicts_and_bad_paths() {
        let m = manifest(vec![doc("a", Acl::public()), doc("a/b", Acl::public())]);
        assert!(matches!(
            Tree::build(&m, |_| true),
            Err(ManifestError::FileDirConflict { .. })
        ));
        let m = manifest(vec![doc("a/b", Acl::public()), doc("a", Acl::public())]);
        assert!(matches!(
            Tree::build(&m, |_| true),
            Err(ManifestError::FileDirConflict { .. })
        ));
        assert!(validate_path("a/../b").is_err());
        assert!(validate_path("/a").is_err());
        assert!(validate_path("a//b").is_err());
        assert!(validate_path("a/b.md").is_ok());
    }
}
