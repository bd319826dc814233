//! Layers on disk: unpacking an OCI layer tar into a directory that overlayfs can
//! stack (OCI whiteouts become overlay whiteouts and opaque directories), packing a
//! directory in overlay format (a sandbox's writable layer) back into an OCI layer
//! tar, and the flattened file tree of a stack of layers (for diffs).
//!
//! Overlay format, as mounted with `userxattr` inside a user namespace: a deleted
//! path is a character device 0:0; a directory that hides everything below it has
//! the extended attribute `user.overlay.opaque` = `y`.
//!
//! Holes stay holes: packing finds a file's data with `SEEK_DATA`/`SEEK_HOLE` and
//! writes a file with holes as a GNU sparse entry (only its data is stored), and
//! unpacking such an entry seeks over the holes. What a layer *expands to* (files
//! at their apparent size, holes read as zeros, 512 bytes per entry: what a tool
//! that ignores holes reads or writes) is counted against a [`SizeLimit`] while
//! packing, measuring ([`expanded_size`]) or comparing ([`diff`]), so that a file
//! that is small on disk but huge when read cannot make the daemon write or read
//! without bound.

use std::collections::{BTreeMap, BTreeSet, HashMap};
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
    #[error("{what} is larger than {} when read (files at their apparent size, holes included, and 512 bytes per entry)", .limit.name)]
    TooLarge { what: String, limit: SizeLimit },
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

/// A bound on the bytes an operation may expand to when read (see the module's
/// notes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeLimit {
    pub bytes: u64,
    /// Names the limit in errors: `the sandbox's disk limit (resources.disk = 64M)`.
    pub name: String,
}

/// Bytes counted against an optional [`SizeLimit`].
#[derive(Debug)]
pub struct Budget<'a> {
    limit: Option<&'a SizeLimit>,
    what: &'a str,
    used: u64,
}

impl<'a> Budget<'a> {
    /// A budget for `what` (named in the error: `the writable layer of sandbox X`).
    pub fn new(limit: Option<&'a SizeLimit>, what: &'a str) -> Budget<'a> {
        Budget {
            limit,
            what,
            used: 0,
        }
    }

    /// A budget that only counts.
    pub fn unlimited() -> Budget<'static> {
        Budget::new(None, "")
    }

    /// Counts `n` more bytes; an error once the limit is passed.
    pub fn charge(&mut self, n: u64) -> Result<(), LayerError> {
        self.used = self.used.saturating_add(n);
        match self.limit {
            Some(l) if self.used > l.bytes => Err(LayerError::TooLarge {
                what: self.what.to_string(),
                limit: l.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Bytes counted so far.
    pub fn used(&self) -> u64 {
        self.used
    }
}

/// `n` rounded up to whole 512-byte tar blocks.
fn blocks(n: u64) -> u64 {
    n.div_ceil(512).saturating_mul(512)
}

/// What one tar entry expands to: its header, a GNU long name or link target when
/// one does not fit the header, and `data` bytes of contents.
pub fn entry_cost(path_len: usize, link_len: usize, data: u64) -> u64 {
    let long = |n: usize| {
        if n > 100 {
            512 + blocks(n as u64 + 1)
        } else {
            0
        }
    };
    (512 + long(path_len) + long(link_len)).saturating_add(blocks(data))
}

/// The runs of `f` that hold data within its first `size` bytes, as `[start,
/// end)` pairs, 512-byte aligned (but for the end of the file) and merged: the
/// rest are holes. The whole file when the file system cannot tell.
pub fn data_runs(f: &fs::File, size: u64) -> io::Result<Vec<(u64, u64)>> {
    use rustix::fs::{seek, SeekFrom};
    use rustix::io::Errno;
    let whole = if size == 0 { vec![] } else { vec![(0, size)] };
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut pos = 0;
    while pos < size {
        let start = match seek(f, SeekFrom::Data(pos)) {
            Ok(s) => s,
            Err(Errno::NXIO) => break,
            Err(Errno::INVAL | Errno::OPNOTSUPP) => return Ok(whole),
            Err(e) => return Err(e.into()),
        };
        if start >= size {
            break;
        }
        let end = match seek(f, SeekFrom::Hole(start)) {
            Ok(e) => e.min(size),
            Err(Errno::NXIO) => size,
            Err(e) => return Err(e.into()),
        };
        if end <= start {
            // The file changed under us: read it all (holes then read as zeros).
            return Ok(whole);
        }
        let (s, e) = (start / 512 * 512, blocks(end).min(size));
        match runs.last_mut() {
            Some(last) if last.1 >= s => last.1 = last.1.max(e),
            _ => runs.push((s, e)),
        }
        pos = end;
    }
    Ok(runs)
}

/// Copies regular file `from` to `to` (created or truncated) with its holes: only
/// its data runs are read and written.
pub fn copy_file(from: &Path, to: &Path) -> io::Result<u64> {
    let src = fs::File::open(from)?;
    let dst = fs::File::create(to)?;
    copy_file_into(&src, &dst)
}

/// [`copy_file`] between open files: only `src`'s data runs are written into `dst`,
/// whose length is then set to `src`'s, so holes stay holes.
pub fn copy_file_into(src: &fs::File, dst: &fs::File) -> io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let size = src.metadata()?.len();
    let runs = data_runs(src, size)?;
    let mut buf = vec![0u8; 256 << 10];
    let mut r = RunReader {
        f: src,
        runs: &runs,
        at: 0,
    };
    while let Some((at, n)) = r.next_chunk(&mut buf)? {
        dst.write_all_at(&buf[..n], at)?;
    }
    dst.set_len(size)?;
    Ok(size)
}

/// Reads the data runs of a file one after the other, exactly: a file that shrank
/// meanwhile reads as zeros past its end, so that a tar entry keeps its size.
struct RunReader<'a> {
    f: &'a fs::File,
    runs: &'a [(u64, u64)],
    at: u64,
}

impl RunReader<'_> {
    /// The next bytes of the runs, and where they are in the file.
    fn next_chunk(&mut self, buf: &mut [u8]) -> io::Result<Option<(u64, usize)>> {
        use std::os::unix::fs::FileExt;
        while let Some(&(start, end)) = self.runs.first() {
            let pos = self.at.max(start);
            if pos >= end {
                self.runs = &self.runs[1..];
                continue;
            }
            let want = ((end - pos) as usize).min(buf.len());
            let n = match self.f.read_at(&mut buf[..want], pos)? {
                0 => {
                    buf[..want].fill(0);
                    want
                }
                n => n,
            };
            self.at = pos + n as u64;
            return Ok(Some((pos, n)));
        }
        Ok(None)
    }
}

impl Read for RunReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Ok(self.next_chunk(buf)?.map_or(0, |(_, n)| n))
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
    let mut st = UnpackStats::default();
    let configure = |ar: &mut tar::Archive<_>| {
        ar.set_preserve_permissions(true);
        ar.set_preserve_mtime(true);
        ar.set_preserve_ownerships(true);
        ar.set_overwrite(true);
        ar.set_unpack_xattrs(false);
    };
    let read_error = |source: io::Error| {
        // The bound on what the reader holds between entries: the layer's fault.
        if source.kind() == io::ErrorKind::InvalidData {
            return LayerError::BadEntry {
                path: "(between entries)".into(),
                problem: source.to_string(),
            };
        }
        LayerError::Io {
            op: "read layer entry in",
            path: dir.display().to_string(),
            source,
        }
    };
    crate::tar_bound::for_each_entry(tar, configure, read_error, |e| {
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
            return Ok(());
        }
        let ty = e.header().entry_type();
        if ty.is_character_special() || ty.is_block_special() {
            st.skipped_devices += 1;
            return Ok(());
        }
        if rel.as_os_str().is_empty() {
            return Ok(());
        }
        if ty.is_fifo() {
            let parent = dir_in(dir, rel.parent().unwrap_or(Path::new("")), &raw)?;
            let name = rel.file_name().unwrap_or_default();
            make_fifo(&parent, name, e.header()).map_err(|source| LayerError::Io {
                op: "unpack",
                path: raw.display().to_string(),
                source,
            })?;
            return Ok(());
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
        Ok(())
    })?;
    Ok(st)
}

/// How [`pack_from`] reads a tree that is not an overlay upper directory of the
/// store's own: the root of a running sandbox, seen from the host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackSource {
    /// Leave out every entry on another filesystem than the tree's root (mount
    /// points: what is bound or mounted into the tree is not part of it).
    pub one_filesystem: bool,
    /// The tree's files carry host ids: the layer records the ids they map to
    /// inside (`None`: the ids as they are).
    pub ids: Option<IdMap>,
    /// Paths (relative to the tree's root) where the runtime mounted something
    /// inside the sandbox. What it made there to mount on (an empty directory or
    /// file: `dev`, `proc`, `etc/hosts`...) is left out, and so is a directory that
    /// holds nothing but such stubs (`run` made for `run/secrets`). Anything else
    /// at those paths is kept.
    pub stubs: BTreeSet<PathBuf>,
    /// Files the runtime wrote into the tree (relative path, contents: a sandbox's
    /// `etc/hostname`): left out while they hold exactly that, like stubs.
    pub written: BTreeMap<PathBuf, Vec<u8>>,
}

/// A user namespace's id maps (`/proc/PID/uid_map` and `gid_map` lines: inside,
/// outside, count), read backwards: host ids to the ids inside. An id outside
/// every range becomes [`IdMap::OVERFLOW`], as the kernel shows it inside.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdMap {
    pub uids: Vec<(u32, u32, u32)>,
    pub gids: Vec<(u32, u32, u32)>,
}

impl IdMap {
    /// The kernel's overflow id (`nobody`).
    pub const OVERFLOW: u32 = 65534;

    /// Parses the text of a `uid_map` and a `gid_map`.
    pub fn parse(uid_map: &str, gid_map: &str) -> Option<IdMap> {
        fn ranges(text: &str) -> Option<Vec<(u32, u32, u32)>> {
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| {
                    let mut f = l.split_whitespace().map(|n| n.parse::<u32>().ok());
                    Some((f.next()??, f.next()??, f.next()??))
                })
                .collect()
        }
        Some(IdMap {
            uids: ranges(uid_map)?,
            gids: ranges(gid_map)?,
        })
    }

    fn inside(ranges: &[(u32, u32, u32)], host: u32) -> u32 {
        ranges
            .iter()
            .find(|(_, outside, count)| host >= *outside && host - outside < *count)
            .map_or(Self::OVERFLOW, |(inside, outside, _)| {
                inside + (host - outside)
            })
    }

    pub fn uid(&self, host: u32) -> u32 {
        Self::inside(&self.uids, host)
    }

    pub fn gid(&self, host: u32) -> u32 {
        Self::inside(&self.gids, host)
    }
}

/// Walks a tree for [`pack_from`]: the tree's root and what [`PackSource`] asks.
struct Walk<'a> {
    root: &'a Path,
    /// The root's device, with [`PackSource::one_filesystem`].
    device: Option<u64>,
    ids: Option<&'a IdMap>,
    stubs: &'a BTreeSet<PathBuf>,
    written: &'a BTreeMap<PathBuf, Vec<u8>>,
}

impl Walk<'_> {
    fn header_for(&self, md: &fs::Metadata) -> tar::Header {
        let mut h = header_for(md);
        if let Some(ids) = self.ids {
            h.set_uid(ids.uid(md.uid()) as u64);
            h.set_gid(ids.gid(md.gid()) as u64);
        }
        h
    }

    /// Whether an entry belongs to the tree (not a mount point on it).
    fn includes(&self, md: &fs::Metadata) -> bool {
        self.device.is_none_or(|d| md.dev() == d)
    }

    /// Whether `rel` is a stub the runtime made to mount on, or a directory of
    /// nothing but such stubs ([`PackSource::stubs`]).
    fn is_stub(&self, rel: &Path, md: &fs::Metadata) -> Result<bool, LayerError> {
        if (self.stubs.is_empty() && self.written.is_empty()) || is_whiteout(md) {
            return Ok(false);
        }
        let p = self.root.join(rel);
        if let Some(want) = self.written.get(rel) {
            return Ok(md.file_type().is_file()
                && md.len() == want.len() as u64
                && fs::read(&p).map_err(io_at("read", &p))? == *want);
        }
        if self.stubs.contains(rel) {
            if md.file_type().is_file() {
                return Ok(md.len() == 0);
            }
            if !md.is_dir() {
                return Ok(false);
            }
        } else if !(md.is_dir()
            && self
                .stubs
                .iter()
                .chain(self.written.keys())
                .any(|s| s.starts_with(rel)))
        {
            return Ok(false);
        }
        // A directory: a stub if everything in it is one.
        if is_opaque(&p) {
            return Ok(false);
        }
        for e in fs::read_dir(&p).map_err(io_at("read dir", &p))? {
            let e = e.map_err(io_at("read dir", &p))?;
            let r = rel.join(e.file_name());
            let md = fs::symlink_metadata(self.root.join(&r)).map_err(io_at("stat", &p))?;
            if self.includes(&md) && !self.is_stub(&r, &md)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
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
/// `.wh.NAME` files and opaque directories get a `.wh..wh..opq` entry, files with
/// holes GNU sparse entries. Entries are sorted, so the same tree always gives the
/// same bytes. What the tar expands to is counted against `budget` as it is
/// written (a hard link counts once: it is a link entry).
pub fn pack<W: Write>(dir: &Path, out: W, budget: &mut Budget) -> Result<W, LayerError> {
    pack_from(dir, &PackSource::default(), out, budget)
}

/// [`pack`], reading `dir` as `source` says. The tree must not change meanwhile
/// (a sandbox's is frozen): entries are found by path.
pub fn pack_from<W: Write>(
    dir: &Path,
    source: &PackSource,
    out: W,
    budget: &mut Budget,
) -> Result<W, LayerError> {
    let device = match source.one_filesystem {
        true => Some(fs::metadata(dir).map_err(io_at("stat", dir))?.dev()),
        false => None,
    };
    let walk = Walk {
        root: dir,
        device,
        ids: source.ids.as_ref(),
        stubs: &source.stubs,
        written: &source.written,
    };
    let mut b = tar::Builder::new(out);
    b.mode(tar::HeaderMode::Complete);
    b.follow_symlinks(false);
    let mut links: HashMap<(u64, u64), PathBuf> = HashMap::new();
    // The end-of-archive blocks.
    budget.charge(1024)?;
    pack_dir(&mut b, &walk, Path::new(""), &mut links, budget)?;
    b.into_inner().map_err(io_at("finish layer tar of", dir))
}

/// Appends regular file `f` (metadata `md`) as `path`: a plain entry, or a GNU
/// sparse entry (data runs only) when it has holes.
/// Most data runs a packed file's sparse map holds. The map is read whole by the
/// unpack (21 runs per 512-byte block after the header's 4), and what an unpack
/// reads between entries is bounded ([`crate::tar_bound::MAX_ENTRY_METADATA`], 1 MiB):
/// 16,384 runs take about 400 KiB, so a layer this store packs always unpacks.
const MAX_SPARSE_RUNS: usize = 16_384;

/// Merges the runs separated by the smallest holes until at most `max` remain (the
/// holes merged are then stored as zeros; what is charged, the apparent size, is
/// the same).
fn coalesce_runs(runs: &mut Vec<(u64, u64)>, max: usize) {
    if runs.len() <= max.max(1) {
        return;
    }
    let mut gaps: Vec<(u64, usize)> = runs
        .windows(2)
        .enumerate()
        .map(|(i, w)| (w[1].0 - w[0].1, i))
        .collect();
    gaps.sort_unstable();
    let mut fill = vec![false; runs.len() - 1];
    for &(_, i) in &gaps[..runs.len() - max.max(1)] {
        fill[i] = true;
    }
    let mut out = Vec::with_capacity(max);
    let mut cur = runs[0];
    for (i, &r) in runs.iter().enumerate().skip(1) {
        if fill[i - 1] {
            cur.1 = r.1;
        } else {
            out.push(cur);
            cur = r;
        }
    }
    out.push(cur);
    *runs = out;
}

fn append_file<W: Write>(
    b: &mut tar::Builder<W>,
    mut h: tar::Header,
    md: &fs::Metadata,
    path: &Path,
    f: &fs::File,
) -> io::Result<()> {
    let size = md.len();
    let mut runs = data_runs(f, size)?;
    coalesce_runs(&mut runs, MAX_SPARSE_RUNS);
    if runs.len() == 1 && runs[0] == (0, size) || size == 0 {
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(size);
        let whole = [(0, size)];
        return b.append_data(
            &mut h,
            path,
            RunReader {
                f,
                runs: &whole,
                at: 0,
            },
        );
    }
    // GNU sparse: the map (4 runs in the header, 21 per extension block after it,
    // ending with a zero-length run at the file's size, as GNU tar writes it),
    // then the runs' bytes.
    h.set_entry_type(tar::EntryType::GNUSparse);
    h.set_size(runs.iter().map(|(s, e)| e - s).sum());
    let mut map: Vec<(u64, u64)> = runs.iter().map(|&(s, e)| (s, e - s)).collect();
    map.push((size, 0));
    let gnu = h.as_gnu_mut().expect("a GNU header");
    gnu.set_real_size(size);
    for (slot, &(off, len)) in gnu.sparse.iter_mut().zip(&map) {
        slot.set_offset(off);
        slot.set_length(len);
    }
    let head = gnu.sparse.len().min(map.len());
    gnu.set_is_extended(map.len() > head);
    let mut ext = Vec::new();
    let mut rest = &map[head..];
    while !rest.is_empty() {
        let mut e = tar::GnuExtSparseHeader::new();
        let n = e.sparse.len().min(rest.len());
        for (slot, &(off, len)) in e.sparse.iter_mut().zip(&rest[..n]) {
            slot.set_offset(off);
            slot.set_length(len);
        }
        rest = &rest[n..];
        e.set_is_extended(!rest.is_empty());
        ext.extend_from_slice(e.as_bytes());
    }
    b.append_data(
        &mut h,
        path,
        io::Cursor::new(ext).chain(RunReader {
            f,
            runs: &runs,
            at: 0,
        }),
    )
}

/// The names in directory `abs`, sorted.
fn sorted_names(abs: &Path) -> Result<std::vec::IntoIter<std::ffi::OsString>, LayerError> {
    let mut names: Vec<_> = fs::read_dir(abs)
        .map_err(io_at("read dir", abs))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(io_at("read dir", abs))?;
    names.sort();
    Ok(names.into_iter())
}

/// Packs the tree below `rel`, depth first in name order. The directories being
/// walked are a list, not the call stack: a sandbox can nest directories
/// thousands deep (`mkdir a; cd a` in a loop), and a walk recursing once per level
/// overflowed the thread's stack, which aborts the daemon.
fn pack_dir<W: Write>(
    b: &mut tar::Builder<W>,
    walk: &Walk<'_>,
    rel: &Path,
    links: &mut HashMap<(u64, u64), PathBuf>,
    budget: &mut Budget,
) -> Result<(), LayerError> {
    let root = walk.root;
    let mut open = vec![(rel.to_path_buf(), sorted_names(&root.join(rel))?)];
    while let Some((rel, names)) = open.last_mut() {
        let Some(n) = names.next() else {
            open.pop();
            continue;
        };
        let rel = rel.clone();
        let r = rel.join(&n);
        let p = root.join(&r);
        let md = fs::symlink_metadata(&p).map_err(|e| {
            if e.raw_os_error() == Some(libc::ENAMETOOLONG) {
                // The sandbox's tree, not the host: named by its path in the layer.
                let full = r.to_string_lossy();
                let mut shown: String = full.chars().take(200).collect();
                if shown.len() < full.len() {
                    shown.push_str("...");
                }
                return LayerError::BadEntry {
                    path: shown,
                    problem: "its path is too long to pack (nested past PATH_MAX)".into(),
                };
            }
            io_at("stat", &p)(e)
        })?;
        if !walk.includes(&md) || walk.is_stub(&r, &md)? {
            continue;
        }
        let ft = md.file_type();
        let add = |b: &mut tar::Builder<W>, h: &mut tar::Header, path: &Path, data: &[u8]| {
            b.append_data(h, path, data).map_err(io_at("pack", path))
        };
        let name_len = r.as_os_str().len() + 1;
        if is_whiteout(&md) {
            budget.charge(entry_cost(name_len + WHITEOUT_PREFIX.len(), 0, 0))?;
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
            budget.charge(entry_cost(name_len, 0, 0))?;
            let mut h = walk.header_for(&md);
            h.set_entry_type(tar::EntryType::Directory);
            h.set_size(0);
            add(b, &mut h, &r, &[])?;
            if is_opaque(&p) {
                budget.charge(entry_cost(name_len + OPAQUE_MARKER.len(), 0, 0))?;
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(0o644);
                h.set_uid(0);
                h.set_gid(0);
                h.set_mtime(md.mtime().max(0) as u64);
                h.set_size(0);
                add(b, &mut h, &r.join(OPAQUE_MARKER), &[])?;
            }
            let names = sorted_names(&p)?;
            open.push((r, names));
        } else if ft.is_symlink() {
            let target = fs::read_link(&p).map_err(io_at("readlink", &p))?;
            budget.charge(entry_cost(name_len, target.as_os_str().len(), 0))?;
            let mut h = walk.header_for(&md);
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, &r, &target)
                .map_err(io_at("pack", &p))?;
        } else if ft.is_file() {
            if md.nlink() > 1 {
                if let Some(first) = links.get(&(md.dev(), md.ino())) {
                    budget.charge(entry_cost(name_len, first.as_os_str().len(), 0))?;
                    let mut h = walk.header_for(&md);
                    h.set_entry_type(tar::EntryType::Link);
                    h.set_size(0);
                    b.append_link(&mut h, &r, first)
                        .map_err(io_at("pack", &p))?;
                    continue;
                }
                links.insert((md.dev(), md.ino()), r.clone());
            }
            budget.charge(entry_cost(name_len, 0, md.len()))?;
            let f = fs::File::open(&p).map_err(io_at("open", &p))?;
            append_file(b, walk.header_for(&md), &md, &r, &f).map_err(io_at("pack", &p))?;
        } else if ft.is_fifo() {
            budget.charge(entry_cost(name_len, 0, 0))?;
            let mut h = walk.header_for(&md);
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
    /// Its device and inode: hard links are compared once.
    pub inode: (u64, u64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    File,
    Symlink(PathBuf),
    Fifo,
}

/// The merged view of `layers` (bottom first), as overlayfs would show it. Every
/// path of every layer read counts 512 bytes against `budget`.
pub fn flatten(
    layers: &[PathBuf],
    budget: &mut Budget,
) -> Result<BTreeMap<String, TreeEntry>, LayerError> {
    let mut tree = BTreeMap::new();
    for l in layers {
        merge_dir(&mut tree, l, Path::new(""), budget)?;
    }
    Ok(tree)
}

/// What the layer directory `dir` expands to when packed by a tool that ignores
/// holes: every entry with its header, regular files at their apparent size (a
/// hard link within the layer once), counted against `budget` (which stops the
/// walk once the limit is passed).
pub fn expanded_size(dir: &Path, budget: &mut Budget) -> Result<(), LayerError> {
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).map_err(io_at("read dir", &d))? {
            let e = e.map_err(io_at("read dir", &d))?;
            let p = e.path();
            let md = fs::symlink_metadata(&p).map_err(io_at("stat", &p))?;
            let name_len = p.strip_prefix(dir).map_or(0, |r| r.as_os_str().len()) + 1;
            let ft = md.file_type();
            let data = if ft.is_file() && (md.nlink() == 1 || seen.insert((md.dev(), md.ino()))) {
                md.len()
            } else {
                0
            };
            let link = if ft.is_symlink() {
                fs::read_link(&p).map_or(0, |t| t.as_os_str().len())
            } else {
                0
            };
            budget.charge(entry_cost(name_len, link, data))?;
            if ft.is_dir() {
                stack.push(p);
            }
        }
    }
    Ok(())
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
    budget: &mut Budget,
) -> Result<(), LayerError> {
    // Directories still to read, one open at a time: a tree nested thousands deep
    // neither recurses (a daemon thread's stack) nor holds a descriptor a level.
    let mut dirs = vec![rel.to_path_buf()];
    while let Some(rel) = dirs.pop() {
        merge_entries(tree, root, &rel, budget, &mut dirs)?;
    }
    Ok(())
}

/// Merges the entries of directory `rel` into `tree`; its subdirectories go to
/// `dirs`.
fn merge_entries(
    tree: &mut BTreeMap<String, TreeEntry>,
    root: &Path,
    rel: &Path,
    budget: &mut Budget,
    dirs: &mut Vec<PathBuf>,
) -> Result<(), LayerError> {
    let abs = root.join(rel);
    let rd = fs::read_dir(&abs).map_err(io_at("read dir", &abs))?;
    for e in rd {
        let e = e.map_err(io_at("read dir", &abs))?;
        budget.charge(512)?;
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
                inode: (md.dev(), md.ino()),
            },
        );
        if is_dir {
            dirs.push(r);
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

/// Whether files `a` and `b`, both `size` bytes long, hold the same bytes. Only
/// the runs where either has data are read (a hole reads as zeros), and what is
/// read counts against `budget`.
fn same_contents(a: &Path, b: &Path, size: u64, budget: &mut Budget) -> Result<bool, LayerError> {
    if a == b {
        return Ok(true);
    }
    let fa = fs::File::open(a).map_err(io_at("compare", a))?;
    let fb = fs::File::open(b).map_err(io_at("compare", b))?;
    let mut runs = data_runs(&fa, size).map_err(io_at("compare", a))?;
    runs.extend(data_runs(&fb, size).map_err(io_at("compare", b))?);
    runs.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (s, e) in runs {
        match merged.last_mut() {
            Some(last) if last.1 >= s => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    let (mut ba, mut bb) = (vec![0u8; 64 << 10], vec![0u8; 64 << 10]);
    for (s, e) in merged {
        let mut pos = s;
        while pos < e {
            let n = ((e - pos) as usize).min(ba.len());
            budget.charge(2 * n as u64)?;
            let na = read_full_at(&fa, &mut ba[..n], pos).map_err(io_at("compare", a))?;
            let nb = read_full_at(&fb, &mut bb[..n], pos).map_err(io_at("compare", b))?;
            if na != nb || ba[..na] != bb[..nb] {
                return Ok(false);
            }
            if na < n {
                // Both ended early (changed since the stat): same so far.
                return Ok(true);
            }
            pos += n as u64;
        }
    }
    Ok(true)
}

fn read_full_at(f: &fs::File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], at + n as u64)? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Compares two flattened trees: kind, mode, owner, size, link target and, for
/// regular files of the same size from different layers, contents (each pair of
/// files once, however many hard links lead to them). The bytes read count
/// against `budget`.
pub fn diff(
    a: &BTreeMap<String, TreeEntry>,
    b: &BTreeMap<String, TreeEntry>,
    budget: &mut Budget,
) -> Result<TreeDiff, LayerError> {
    let mut d = TreeDiff::default();
    // (inode of a, inode of b) -> same contents.
    type Pair = ((u64, u64), (u64, u64));
    let mut compared: HashMap<Pair, bool> = HashMap::new();
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
                        || match compared.get(&(ea.inode, eb.inode)) {
                            Some(&same) => same,
                            None => {
                                let same = same_contents(&ea.source, &eb.source, ea.size, budget)?;
                                compared.insert((ea.inode, eb.inode), same);
                                same
                            }
                        });
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
mod tests;
