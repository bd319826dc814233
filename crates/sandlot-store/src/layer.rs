//! Layers on disk: unpacking an OCI layer tar into a directory that overlayfs can
//! stack (OCI whiteouts become overlay whiteouts and opaque directories), packing a
//! directory in overlay format (a sandbox's writable layer) back into an OCI layer
//! tar, and the flattened file tree of a stack of layers (for diffs).
//!
//! Overlay format, as mounted with `userxattr` inside a user namespace: a deleted
//! path is a character device 0:0; a directory that hides everything below it has
//! the extended attribute `user.overlay.opaque` = `y`.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

/// OCI whiteout prefix and the opaque-directory marker.
pub const WHITEOUT_PREFIX: &str = ".wh.";
pub const OPAQUE_MARKER: &str = ".wh..wh..opq";
/// The opaque-directory attribute overlayfs reads with `userxattr`.
pub const OPAQUE_XATTR: &str = "user.overlay.opaque";
const TRUSTED_OPAQUE_XATTR: &str = "trusted.overlay.opaque";

#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("layer entry {path:?}: {problem}")]
    BadEntry { path: String, problem: String },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
}

fn io_at<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> LayerError + 'a {
    move |source| LayerError::Io {
        op,
        path: path.display().to_string(),
        source,
    }
}

/// What unpacking did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct UnpackStats {
    pub entries: u64,
    pub whiteouts: u64,
    pub opaque_dirs: u64,
    /// Device nodes are never created from images (they would be usable on the host).
    pub skipped_devices: u64,
}

/// A relative path from a tar entry, checked: no `..`, no absolute paths, no NUL.
fn clean_rel(raw: &Path) -> Result<PathBuf, LayerError> {
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(LayerError::BadEntry {
                    path: raw.display().to_string(),
                    problem: "path escapes the layer".into(),
                })
            }
        }
    }
    Ok(out)
}

/// Creates the directories of `rel` under `dir` that are missing and returns the
/// path, without following a symbolic link anywhere on the way: an entry of a layer
/// (a whiteout, an opaque marker, a FIFO) under a link that the layer made must not
/// reach outside it (`a -> /etc`, then `a/.wh.passwd`).
fn dir_in(dir: &Path, rel: &Path, raw: &Path) -> Result<PathBuf, LayerError> {
    let mut at = dir.to_path_buf();
    for c in rel.components() {
        at.push(c);
        match fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(m) => {
                return Err(LayerError::BadEntry {
                    path: raw.display().to_string(),
                    problem: if m.file_type().is_symlink() {
                        "path goes through a symbolic link".into()
                    } else {
                        "path goes through a file that is not a directory".into()
                    },
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir(&at).map_err(io_at("create", &at))?
            }
            Err(e) => return Err(io_at("stat", &at)(e)),
        }
    }
    Ok(at)
}

/// Creates the FIFO `name` of a layer entry in `parent`, with its mode, owner and
/// modification time (`tar` would make it an empty regular file).
fn make_fifo(parent: &Path, name: &std::ffi::OsStr, h: &tar::Header) -> io::Result<()> {
    let path = parent.join(name);
    match fs::symlink_metadata(&path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(&path)?,
        Ok(_) => fs::remove_file(&path)?,
        Err(_) => {}
    }
    let mode = h.mode()? & 0o7777;
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(mode),
        0,
    )?;
    let (uid, gid) = (h.uid()? as u32, h.gid()? as u32);
    rustix::fs::chownat(
        rustix::fs::CWD,
        &path,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )?;
    // mknod applies the umask: set the mode as the layer says.
    rustix::fs::chmodat(
        rustix::fs::CWD,
        &path,
        rustix::fs::Mode::from_raw_mode(mode),
        rustix::fs::AtFlags::empty(),
    )?;
    let t = rustix::fs::Timespec {
        tv_sec: h.mtime()? as i64,
        tv_nsec: 0,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        &path,
        &rustix::fs::Timestamps {
            last_access: t,
            last_modification: t,
        },
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )?;
    Ok(())
}

/// Creates the overlay whiteout for `path` (a character device 0:0).
pub fn make_whiteout(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path)?,
        Ok(_) => fs::remove_file(path)?,
        Err(_) => {}
    }
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::empty(),
        0,
    )
    .map_err(io::Error::from)
}

/// Marks `dir` opaque for overlayfs.
pub fn make_opaque(dir: &Path) -> io::Result<()> {
    rustix::fs::lsetxattr(dir, OPAQUE_XATTR, b"y", rustix::fs::XattrFlags::empty())
        .map_err(io::Error::from)
}

fn is_opaque(dir: &Path) -> bool {
    let mut buf = [0u8; 4];
    for name in [OPAQUE_XATTR, TRUSTED_OPAQUE_XATTR] {
        if let Ok(n) = rustix::fs::lgetxattr(dir, name, &mut buf) {
            if &buf[..n] == b"y" {
                return true;
            }
        }
    }
    false
}

fn is_whiteout(md: &fs::Metadata) -> bool {
    md.file_type().is_char_device() && md.rdev() == 0
}

/// Unpacks an (uncompressed) OCI layer tar into `dir`, which must be empty.
/// Ownership, permissions (set-id bits included) and times are kept.
pub fn unpack<R: Read>(tar: R, dir: &Path) -> Result<UnpackStats, LayerError> {
    let mut ar = tar::Archive::new(tar);
    ar.set_preserve_permissions(true);
    ar.set_preserve_mtime(true);
    ar.set_preserve_ownerships(true);
    ar.set_overwrite(true);
    ar.set_unpack_xattrs(false);
    let mut st = UnpackStats::default();
    let entries = ar.entries().map_err(io_at("read layer", dir))?;
    for e in entries {
        let mut e = e.map_err(io_at("read layer entry in", dir))?;
        let raw = e
            .path()
            .map_err(io_at("read entry path in", dir))?
            .into_owned();
        let rel = clean_rel(&raw)?;
        st.entries += 1;
        let name = rel
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            let parent = dir_in(dir, rel.parent().unwrap_or(Path::new("")), &raw)?;
            if name == OPAQUE_MARKER {
                make_opaque(&parent).map_err(io_at("mark opaque", &parent))?;
                st.opaque_dirs += 1;
            } else {
                if hidden.is_empty() || hidden == "." || hidden == ".." {
                    return Err(LayerError::BadEntry {
                        path: raw.display().to_string(),
                        problem: "empty whiteout".into(),
                    });
                }
                let target = parent.join(hidden);
                make_whiteout(&target).map_err(io_at("create whiteout", &target))?;
                st.whiteouts += 1;
            }
            continue;
        }
        let ty = e.header().entry_type();
        if ty.is_character_special() || ty.is_block_special() {
            st.skipped_devices += 1;
            continue;
        }
        if rel.as_os_str().is_empty() {
            continue;
        }
        if ty.is_fifo() {
            let parent = dir_in(dir, rel.parent().unwrap_or(Path::new("")), &raw)?;
            let name = rel.file_name().unwrap_or_default();
            make_fifo(&parent, name, e.header()).map_err(|source| LayerError::Io {
                op: "unpack",
                path: raw.display().to_string(),
                source,
            })?;
            continue;
        }
        let ok = e.unpack_in(dir).map_err(|source| LayerError::Io {
            op: "unpack",
            path: raw.display().to_string(),
            source,
        })?;
        if !ok {
            return Err(LayerError::BadEntry {
                path: raw.display().to_string(),
                problem: "path escapes the layer".into(),
            });
        }
    }
    Ok(st)
}

fn header_for(md: &fs::Metadata) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_mode(md.mode() & 0o7777);
    h.set_uid(md.uid() as u64);
    h.set_gid(md.gid() as u64);
    h.set_mtime(md.mtime().max(0) as u64);
    h
}

/// Packs a directory in overlay format into an OCI layer tar: whiteouts become
/// `.wh.NAME` files and opaque directories get a `.wh..wh..opq` entry. Entries are
/// sorted, so the same tree always gives the same bytes.
pub fn pack<W: Write>(dir: &Path, out: W) -> Result<W, LayerError> {
    let mut b = tar::Builder::new(out);
    b.mode(tar::HeaderMode::Complete);
    b.follow_symlinks(false);
    let mut links: HashMap<(u64, u64), PathBuf> = HashMap::new();
    pack_dir(&mut b, dir, Path::new(""), &mut links)?;
    b.into_inner().map_err(io_at("finish layer tar of", dir))
}

fn pack_dir<W: Write>(
    b: &mut tar::Builder<W>,
    root: &Path,
    rel: &Path,
    links: &mut HashMap<(u64, u64), PathBuf>,
) -> Result<(), LayerError> {
    let abs = root.join(rel);
    let mut names: Vec<_> = fs::read_dir(&abs)
        .map_err(io_at("read dir", &abs))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(io_at("read dir", &abs))?;
    names.sort();
    for n in names {
        let r = rel.join(&n);
        let p = root.join(&r);
        let md = fs::symlink_metadata(&p).map_err(io_at("stat", &p))?;
        let ft = md.file_type();
        let add = |b: &mut tar::Builder<W>, h: &mut tar::Header, path: &Path, data: &[u8]| {
            b.append_data(h, path, data).map_err(io_at("pack", path))
        };
        if is_whiteout(&md) {
            let wh = rel.join(format!("{WHITEOUT_PREFIX}{}", n.to_string_lossy()));
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(md.mtime().max(0) as u64);
            h.set_size(0);
            add(b, &mut h, &wh, &[])?;
        } else if ft.is_dir() {
            let mut h = header_for(&md);
            h.set_entry_type(tar::EntryType::Directory);
            h.set_size(0);
            add(b, &mut h, &r, &[])?;
            if is_opaque(&p) {
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(0o644);
                h.set_uid(0);
                h.set_gid(0);
                h.set_mtime(md.mtime().max(0) as u64);
                h.set_size(0);
                add(b, &mut h, &r.join(OPAQUE_MARKER), &[])?;
            }
            pack_dir(b, root, &r, links)?;
        } else if ft.is_symlink() {
            let target = fs::read_link(&p).map_err(io_at("readlink", &p))?;
            let mut h = header_for(&md);
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, &r, &target)
                .map_err(io_at("pack", &p))?;
        } else if ft.is_file() {
            if md.nlink() > 1 {
                if let Some(first) = links.get(&(md.dev(), md.ino())) {
                    let mut h = header_for(&md);
                    h.set_entry_type(tar::EntryType::Link);
                    h.set_size(0);
                    b.append_link(&mut h, &r, first)
                        .map_err(io_at("pack", &p))?;
                    continue;
                }
                links.insert((md.dev(), md.ino()), r.clone());
            }
            let mut h = header_for(&md);
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(md.len());
            let f = fs::File::open(&p).map_err(io_at("open", &p))?;
            b.append_data(&mut h, &r, f.take(md.len()))
                .map_err(io_at("pack", &p))?;
        } else if ft.is_fifo() {
            let mut h = header_for(&md);
            h.set_entry_type(tar::EntryType::Fifo);
            h.set_size(0);
            add(b, &mut h, &r, &[])?;
        }
        // Sockets and device nodes are not part of a filesystem image.
    }
    Ok(())
}

/// One path of a flattened image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    pub kind: EntryKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// The layer file that provides it (for content comparison).
    pub source: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    File,
    Symlink(PathBuf),
    Fifo,
}

/// The merged view of `layers` (bottom first), as overlayfs would show it.
pub fn flatten(layers: &[PathBuf]) -> Result<BTreeMap<String, TreeEntry>, LayerError> {
    let mut tree = BTreeMap::new();
    for l in layers {
        merge_dir(&mut tree, l, Path::new(""))?;
    }
    Ok(tree)
}

fn remove_subtree(tree: &mut BTreeMap<String, TreeEntry>, path: &str, keep_self: bool) {
    let prefix = format!("{path}/");
    let doomed: Vec<String> = tree
        .range(prefix.clone()..)
        .take_while(|(k, _)| k.starts_with(&prefix))
        .map(|(k, _)| k.clone())
        .collect();
    for k in doomed {
        tree.remove(&k);
    }
    if !keep_self {
        tree.remove(path);
    }
}

fn merge_dir(
    tree: &mut BTreeMap<String, TreeEntry>,
    root: &Path,
    rel: &Path,
) -> Result<(), LayerError> {
    let abs = root.join(rel);
    let rd = fs::read_dir(&abs).map_err(io_at("read dir", &abs))?;
    for e in rd {
        let e = e.map_err(io_at("read dir", &abs))?;
        let r = rel.join(e.file_name());
        let key = format!("/{}", r.display());
        let p = root.join(&r);
        let md = fs::symlink_metadata(&p).map_err(io_at("stat", &p))?;
        if is_whiteout(&md) {
            remove_subtree(tree, &key, false);
            continue;
        }
        let ft = md.file_type();
        let kind = if ft.is_dir() {
            EntryKind::Dir
        } else if ft.is_symlink() {
            EntryKind::Symlink(fs::read_link(&p).map_err(io_at("readlink", &p))?)
        } else if ft.is_file() {
            EntryKind::File
        } else if ft.is_fifo() {
            EntryKind::Fifo
        } else {
            continue;
        };
        let is_dir = kind == EntryKind::Dir;
        // A non-directory replaces a whole lower subtree; an opaque dir hides it.
        if !is_dir || is_opaque(&p) {
            remove_subtree(tree, &key, true);
        }
        tree.insert(
            key,
            TreeEntry {
                kind,
                mode: md.mode() & 0o7777,
                uid: md.uid(),
                gid: md.gid(),
                size: if is_dir { 0 } else { md.len() },
                source: p.clone(),
            },
        );
        if is_dir {
            merge_dir(tree, root, &r)?;
        }
    }
    Ok(())
}

/// How two images differ, path by path.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TreeDiff {
    pub added: Vec<String>,
    pub changed: Vec<String>,
    pub removed: Vec<String>,
}

fn same_contents(a: &Path, b: &Path) -> io::Result<bool> {
    if a == b {
        return Ok(true);
    }
    let (mut fa, mut fb) = (fs::File::open(a)?, fs::File::open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 64 << 10], vec![0u8; 64 << 10]);
    loop {
        let na = read_full(&mut fa, &mut ba)?;
        let nb = read_full(&mut fb, &mut bb)?;
        if na != nb || ba[..na] != bb[..nb] {
            return Ok(false);
        }
        if na == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut fs::File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Compares two flattened trees: kind, mode, owner, size, link target and, for
/// regular files of the same size from different layers, contents.
pub fn diff(
    a: &BTreeMap<String, TreeEntry>,
    b: &BTreeMap<String, TreeEntry>,
) -> Result<TreeDiff, LayerError> {
    let mut d = TreeDiff::default();
    for (k, ea) in a {
        match b.get(k) {
            None => d.removed.push(k.clone()),
            Some(eb) => {
                let meta_same = ea.kind == eb.kind
                    && ea.mode == eb.mode
                    && ea.uid == eb.uid
                    && ea.gid == eb.gid
                    && ea.size == eb.size;
                let same = meta_same
                    && (ea.kind != EntryKind::File
                        || same_contents(&ea.source, &eb.source)
                            .map_err(io_at("compare", &eb.source))?);
                if !same {
                    d.changed.push(k.clone());
                }
            }
        }
    }
    for k in b.keys() {
        if !a.contains_key(k) {
            d.added.push(k.clone());
        }
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer tar of raw headers: (path, type, link target, mode).
    fn tar_raw(entries: &[(&str, tar::EntryType, &str, u32)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, ty, link, mode) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*ty);
            h.set_mode(*mode);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(1_700_000_000);
            h.set_size(0);
            if ty.is_symlink() {
                b.append_link(&mut h, path, link).unwrap();
            } else {
                b.append_data(&mut h, path, &[][..]).unwrap();
            }
        }
        b.into_inner().unwrap()
    }

    /// Found by probing imports: a whiteout or an opaque marker under a symbolic link
    /// that the same layer made followed the link, and deleted or created things
    /// anywhere on the host, as root (`a -> /victims`, then `a/.wh.file`).
    #[test]
    fn issue6_whiteouts_never_reach_through_a_symlink() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        fs::create_dir_all(outside.join("vdir")).unwrap();
        fs::write(outside.join("victim"), "precious").unwrap();
        let out = outside.to_str().unwrap();
        for (i, entry) in [
            "a/.wh.victim",
            "a/.wh.vdir",
            "a/newdir/.wh..wh..opq",
            "a/pipe",
        ]
        .into_iter()
        .enumerate()
        {
            let ty = if entry.ends_with("pipe") {
                tar::EntryType::Fifo
            } else {
                tar::EntryType::Regular
            };
            let layer = t.path().join(format!("layer{i}"));
            fs::create_dir(&layer).unwrap();
            let tar = tar_raw(&[
                ("a", tar::EntryType::Symlink, out, 0o777),
                (entry, ty, "", 0o644),
            ]);
            let e = unpack(&tar[..], &layer).unwrap_err();
            assert!(
                e.to_string().contains("path goes through a symbolic link"),
                "{entry}: {e}"
            );
        }
        // Relative links are refused the same way.
        let layer = t.path().join("layer-rel");
        fs::create_dir(&layer).unwrap();
        let tar = tar_raw(&[
            ("a", tar::EntryType::Symlink, "../outside", 0o777),
            ("a/.wh.victim", tar::EntryType::Regular, "", 0o644),
        ]);
        assert!(unpack(&tar[..], &layer).is_err());
        assert_eq!(
            fs::read_to_string(outside.join("victim")).unwrap(),
            "precious"
        );
        assert!(outside.join("vdir").is_dir());
        assert!(!outside.join("newdir").exists());
        assert!(!outside.join("pipe").exists());
        // Whiteouts in real directories of the layer still work.
        let layer = t.path().join("layer-ok");
        fs::create_dir(&layer).unwrap();
        let tar = tar_raw(&[
            ("d", tar::EntryType::Directory, "", 0o755),
            ("d/.wh.gone", tar::EntryType::Regular, "", 0o644),
            ("e/f/.wh..wh..opq", tar::EntryType::Regular, "", 0o644),
        ]);
        let st = unpack(&tar[..], &layer).unwrap();
        assert_eq!((st.whiteouts, st.opaque_dirs), (1, 1));
        assert!(is_whiteout(
            &fs::symlink_metadata(layer.join("d/gone")).unwrap()
        ));
        assert!(is_opaque(&layer.join("e/f")));
    }

    /// Found by probing snapshots: a FIFO in a layer became an empty regular file.
    #[test]
    fn issue6_fifos_stay_fifos() {
        let t = tempfile::tempdir().unwrap();
        let tar = tar_raw(&[
            ("opt", tar::EntryType::Directory, "", 0o755),
            ("opt/myfifo", tar::EntryType::Fifo, "", 0o640),
        ]);
        unpack(&tar[..], t.path()).unwrap();
        let md = fs::symlink_metadata(t.path().join("opt/myfifo")).unwrap();
        assert!(md.file_type().is_fifo(), "{:?}", md.file_type());
        assert_eq!(md.mode() & 0o7777, 0o640);
        assert_eq!(md.mtime(), 1_700_000_000);
        // And back into a layer as a FIFO.
        let packed = pack(t.path(), Vec::new()).unwrap();
        let mut ar = tar::Archive::new(&packed[..]);
        let fifo = ar
            .entries()
            .unwrap()
            .map(|e| e.unwrap())
            .find(|e| e.path().unwrap().ends_with("myfifo"))
            .unwrap();
        assert!(fifo.header().entry_type().is_fifo());
    }

    fn tar_of(entries: &[(&str, Option<&[u8]>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            match data {
                Some(d) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(0o644);
                    h.set_size(d.len() as u64);
                    b.append_data(&mut h, path, *d).unwrap();
                }
                None => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(0o755);
                    h.set_size(0);
                    b.append_data(&mut h, path, &[][..]).unwrap();
                }
            }
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn whiteouts_become_overlay_whiteouts_and_back() {
        let t = tempfile::tempdir().unwrap();
        let l1 = t.path().join("l1");
        let l2 = t.path().join("l2");
        fs::create_dir(&l1).unwrap();
        fs::create_dir(&l2).unwrap();
        unpack(
            &tar_of(&[
                ("etc", None),
                ("etc/a", Some(b"a")),
                ("etc/b", Some(b"b")),
                ("opt", None),
                ("opt/x", Some(b"x")),
            ])[..],
            &l1,
        )
        .unwrap();
        let st = unpack(
            &tar_of(&[
                ("etc/.wh.a", Some(b"")),
                ("opt/.wh..wh..opq", Some(b"")),
                ("opt/y", Some(b"y")),
                ("new", Some(b"n")),
            ])[..],
            &l2,
        )
        .unwrap();
        assert_eq!((st.whiteouts, st.opaque_dirs), (1, 1));
        let md = fs::symlink_metadata(l2.join("etc/a")).unwrap();
        assert!(md.file_type().is_char_device() && md.rdev() == 0);
        assert!(is_opaque(&l2.join("opt")));

        let tree = flatten(&[l1.clone(), l2.clone()]).unwrap();
        let keys: Vec<&str> = tree.keys().map(String::as_str).collect();
        assert_eq!(keys, ["/etc", "/etc/b", "/new", "/opt", "/opt/y"]);

        // Packing the overlay-format layer gives OCI whiteouts again.
        let packed = pack(&l2, Vec::new()).unwrap();
        let mut ar = tar::Archive::new(&packed[..]);
        let names: Vec<String> = ar
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert!(names.contains(&"etc/.wh.a".to_string()), "{names:?}");
        assert!(names.contains(&"opt/.wh..wh..opq".to_string()), "{names:?}");
        // Deterministic.
        assert_eq!(packed, pack(&l2, Vec::new()).unwrap());
    }

    #[test]
    fn escaping_paths_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(1);
        h.set_mode(0o644);
        // Bypass the builder's own path check.
        h.as_gnu_mut().unwrap().name[..9].copy_from_slice(b"../escape");
        h.set_cksum();
        b.append(&h, &b"x"[..]).unwrap();
        let data = b.into_inner().unwrap();
        let e = unpack(&data[..], t.path()).unwrap_err();
        assert!(e.to_string().contains("escapes"), "{e}");
        assert!(!t.path().parent().unwrap().join("escape").exists());
    }

    #[test]
    fn diff_reports_added_changed_removed() {
        let t = tempfile::tempdir().unwrap();
        let a = t.path().join("a");
        let b = t.path().join("b");
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        unpack(
            &tar_of(&[("k", Some(b"same")), ("c", Some(b"one")), ("r", Some(b"r"))])[..],
            &a,
        )
        .unwrap();
        unpack(
            &tar_of(&[("k", Some(b"same")), ("c", Some(b"two")), ("n", Some(b"n"))])[..],
            &b,
        )
        .unwrap();
        let d = diff(&flatten(&[a]).unwrap(), &flatten(&[b]).unwrap()).unwrap();
        assert_eq!(d.added, ["/n"]);
        assert_eq!(d.changed, ["/c"]);
        assert_eq!(d.removed, ["/r"]);
    }
}
