//! Path resolution on a view with POSIX error semantics, and GNU-style
//! quoting of file names in diagnostics.

use super::overlay::Dirs;
use crate::manifest::{NodeId, ROOT};

/// Why a path could not be used (the `strerror` text GNU tools print).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FsErr {
    NotFound,
    NotDir,
    IsDir,
    Exists,
    NotEmpty,
    NoSpace,
    NameTooLong,
    Busy,
    ReadOnly,
    Invalid,
    Io(String),
}

impl FsErr {
    pub(crate) fn msg(&self) -> &str {
        match self {
            FsErr::NotFound => "No such file or directory",
            FsErr::NotDir => "Not a directory",
            FsErr::IsDir => "Is a directory",
            FsErr::Exists => "File exists",
            FsErr::NotEmpty => "Directory not empty",
            FsErr::NoSpace => "No space left on device",
            FsErr::NameTooLong => "File name too long",
            FsErr::Busy => "Device or resource busy",
            FsErr::ReadOnly => "Read-only file system",
            FsErr::Invalid => "Invalid argument",
            FsErr::Io(_) => "Input/output error",
        }
    }
}

/// Resolve `path` relative to `cwd`.
pub(crate) fn resolve<D: Dirs + ?Sized>(
    tree: &D,
    cwd: NodeId,
    path: &str,
) -> Result<NodeId, FsErr> {
    if path.is_empty() {
        return Err(FsErr::NotFound);
    }
    let mut cur = if path.starts_with('/') { ROOT } else { cwd };
    for comp in path.split('/') {
        match comp {
            "" => {
                // Repeated or trailing slash: the current node must be a directory
                // (checked below for trailing slashes).
            }
            "." | ".." => {
                if !tree.is_dir(cur) {
                    return Err(FsErr::NotDir);
                }
                if comp == ".." {
                    cur = tree.parent(cur);
                }
            }
            name => {
                if !tree.is_dir(cur) {
                    return Err(FsErr::NotDir);
                }
                cur = tree.child(cur, name).ok_or(FsErr::NotFound)?;
            }
        }
    }
    if path.ends_with('/') && !tree.is_dir(cur) {
        return Err(FsErr::NotDir);
    }
    Ok(cur)
}

/// Whether the parent directory of `path` exists (for write errors).
pub(crate) fn parent_exists<D: Dirs + ?Sized>(tree: &D, cwd: NodeId, path: &str) -> bool {
    let trimmed = path.trim_end_matches('/');
    match trimmed.rfind('/') {
        None => true,
        Some(0) => true,
        Some(i) => resolve(tree, cwd, &trimmed[..i])
            .map(|n| tree.is_dir(n))
            .unwrap_or(false),
    }
}

fn needs_quoting(s: &str) -> bool {
    if s.is_empty() {
        return true;
    }
    let first = s.chars().next().unwrap_or(' ');
    if first == '~' || first == '#' {
        return true;
    }
    s.chars().any(|c| {
        matches!(
            c,
            ' ' | '\t'
                | '\n'
                | '!'
                | '"'
                | '$'
                | '&'
                | '\''
                | '('
                | ')'
                | '*'
                | ';'
                | '<'
                | '>'
                | '?'
                | '['
                | '\\'
                | ']'
                | '^'
                | '`'
                | '{'
                | '|'
                | '}'
        ) || c.is_control()
    })
}

fn single_quote(s: &str) -> String {
    if !s.contains('\'') {
        return format!("'{s}'");
    }
    if !s.contains(['"', '$', '`', '\\']) {
        return format!("\"{s}\"");
    }
    let mut out = String::from("'");
    for c in s.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// `quotef`: quote only when the name needs it (cat, head, wc, grep messages).
pub(crate) fn quotef(s: &str) -> String {
    if needs_quoting(s) {
        single_quote(s)
    } else {
        s.to_string()
    }
}

/// `quote`: always quote (ls "cannot access", head "cannot open", find).
pub(crate) fn quote(s: &str) -> String {
    single_quote(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::Acl;
    use crate::manifest::{DocEntry, Manifest, Tree};

    fn tree() -> Tree {
        let doc = |p: &str| DocEntry {
            path: p.into(),
            hash: String::new(),
            size: 0,
            mtime: 0,
            acl: Acl::public(),
            metadata: Default::default(),
            source_tag: String::new(),
        };
        let m = Manifest {
            collection: "c".into(),
            version: 1,
            created: 0,
            source: String::new(),
            docs: vec![doc("a/b.md"), doc("c.md")],
            dirs: Vec::new(),
        };
        Tree::build(&m, |_| true).unwrap()
    }

    #[test]
    fn resolution_errors() {
        let t = tree();
        let a = resolve(&t, ROOT, "a").unwrap();
        assert_eq!(
            resolve(&t, a, "b.md").unwrap(),
            resolve(&t, ROOT, "/a/b.md").unwrap()
        );
        assert_eq!(
            resolve(&t, a, "../c.md").unwrap(),
            resolve(&t, ROOT, "c.md").unwrap()
        );
        assert_eq!(resolve(&t, ROOT, "/../../a/").unwrap(), a);
        assert_eq!(resolve(&t, ROOT, "c.md/"), Err(FsErr::NotDir));
        assert_eq!(resolve(&t, ROOT, "c.md/x"), Err(FsErr::NotDir));
        assert_eq!(resolve(&t, ROOT, "c.md/.."), Err(FsErr::NotDir));
        assert_eq!(resolve(&t, ROOT, "nope/x"), Err(FsErr::NotFound));
        assert_eq!(resolve(&t, ROOT, ""), Err(FsErr::NotFound));
    }

    #[test]
    fn quoting() {
        assert_eq!(quotef("a.md"), "a.md");
        assert_eq!(quotef("a b"), "'a b'");
        assert_eq!(quote("x"), "'x'");
        assert_eq!(quote("it's"), "\"it's\"");
    }
}
