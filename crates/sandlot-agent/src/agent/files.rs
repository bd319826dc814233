//! File operations, done by the agent itself on behalf of a sandbox user.
//!
//! Acting as the user: around every path lookup the agent's thread switches its
//! filesystem uid and gid (`setfsuid`/`setfsgid`) and its supplementary groups to the
//! user's. The kernel then checks permissions exactly as for the user and drops the
//! agent's file capabilities meanwhile; files and directories created are owned by
//! the user. Reads and writes of an already open file need no switch (the open file
//! carries its credentials).

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use bytes::BytesMut;
use sandlot_proto::guest::{
    stream, DirEntry, ErrorBody, ErrorCode, FileKind, FileStat, ListDirRequest, MkdirRequest,
    ReadFileRequest, RemoveRequest, RenameRequest, Reply, StatRequest, WriteFileRequest,
    DATA_CHUNK,
};

use super::own_proc::{self, PinnedDir};
use super::users::User;
use super::{Agent, Chan};
use rustix::fs::OFlags;
use rustix::process::{Gid, Uid};
use std::os::fd::AsFd;

/// Switches the calling thread's filesystem credentials.
pub(crate) struct FsCreds {
    /// The agent runs as root (otherwise it can only act as itself).
    enabled: bool,
    /// The kernel has `setfsuid`. gVisor's (Debian 12's release) answers ENOSYS:
    /// there the thread's effective ids are switched instead, keeping the saved
    /// uid 0 to switch back (the kernel keeps the permitted capabilities then and
    /// gives the effective ones back with euid 0).
    fsuid: bool,
    saved_groups: Vec<Gid>,
}

/// Sets this thread's supplementary groups only. (glibc's `setgroups` changes every
/// thread of the process, which would be wrong for an agent embedded in a test
/// process and needless otherwise.)
fn set_thread_groups(groups: &[Gid]) -> io::Result<()> {
    Ok(rustix::thread::set_thread_groups(groups)?)
}

/// The gids of `groups` as rustix's type.
fn gids(groups: &[u32]) -> Vec<Gid> {
    groups.iter().map(|&g| Gid::from_raw_unchecked(g)).collect()
}

/// This thread's effective uid (`setresuid(-1, euid, -1)`), or gid with `group`:
/// the raw system call changes the calling thread only (glibc's changes every
/// thread).
fn set_thread_effective(id: u32, group: bool) -> io::Result<()> {
    if group {
        rustix::thread::set_thread_res_gid(None, Gid::from_raw_unchecked(id), None)?;
    } else {
        rustix::thread::set_thread_res_uid(None, Uid::from_raw_unchecked(id), None)?;
    }
    Ok(())
}

/// `setfsuid(uid)`: this thread's filesystem uid; answers the previous one (or,
/// where the kernel lacks the call, -1). rustix has no `setfsuid`.
fn set_fsuid(uid: u32) -> u32 {
    // SAFETY: an integer argument; no memory is passed. The call cannot fail in a
    // way it reports: it answers the previous fsuid either way.
    unsafe { libc::setfsuid(uid) as u32 }
}

/// `setfsgid(gid)`, as [`set_fsuid`] for the filesystem gid.
fn set_fsgid(gid: u32) -> u32 {
    // SAFETY: as in `set_fsuid`.
    unsafe { libc::setfsgid(gid) as u32 }
}

/// Gives the thread its identity back when an operation as a user ends.
enum Restore<'a> {
    Fs {
        saved_groups: &'a [Gid],
        uid: u32,
        gid: u32,
    },
    Effective {
        saved_groups: &'a [Gid],
    },
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        match self {
            Restore::Fs {
                saved_groups,
                uid,
                gid,
            } => {
                set_fsuid(*uid);
                set_fsgid(*gid);
                let _ = set_thread_groups(saved_groups);
            }
            Restore::Effective { saved_groups } => {
                // uid first: setting the gid back takes euid 0.
                let uid = set_thread_effective(0, false);
                let gid = set_thread_effective(0, true);
                let groups = set_thread_groups(saved_groups);
                if uid.and(gid).and(groups).is_err() {
                    // A thread of the agent that stays a user's would do
                    // everything after as that user: no way on from here.
                    eprintln!(
                        "sandlot agent: cannot restore a thread's ids after a file operation"
                    );
                    std::process::abort();
                }
            }
        }
    }
}

impl FsCreds {
    pub fn new() -> FsCreds {
        let enabled = rustix::process::geteuid().is_root();
        let saved_groups = rustix::process::getgroups().unwrap_or_default();
        // `setfsuid(-1)` changes nothing and answers the current fsuid, or -1 where
        // the kernel lacks the call.
        let fsuid = set_fsuid(u32::MAX) != u32::MAX;
        FsCreds {
            enabled,
            fsuid,
            saved_groups,
        }
    }

    /// Runs `f` with the filesystem identity of `user`.
    pub fn run<T>(&self, user: &User, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let me = rustix::process::geteuid().as_raw();
        if !self.enabled {
            if user.uid != me {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "cannot act as uid {}: the agent is not running as root",
                        user.uid
                    ),
                ));
            }
            return f();
        }
        if user.uid == 0 && user.gid == 0 {
            return f();
        }
        if !self.fsuid {
            set_thread_groups(&gids(&user.groups))?;
            let _restore = Restore::Effective {
                saved_groups: &self.saved_groups,
            };
            set_thread_effective(user.gid, true)?;
            set_thread_effective(user.uid, false)?;
            return f();
        }
        set_thread_groups(&gids(&user.groups))?;
        let gid = set_fsgid(user.gid);
        let uid = set_fsuid(user.uid);
        let _restore = Restore::Fs {
            saved_groups: &self.saved_groups,
            uid,
            gid,
        };
        f()
    }
}

/// The error code for an I/O error.
pub(crate) fn code_of(e: &io::Error) -> ErrorCode {
    match e.raw_os_error() {
        Some(libc::ENOTDIR) => return ErrorCode::NotADirectory,
        Some(libc::EISDIR) => return ErrorCode::IsADirectory,
        Some(libc::ENOTEMPTY) => return ErrorCode::DirectoryNotEmpty,
        Some(libc::EEXIST) => return ErrorCode::AlreadyExists,
        Some(libc::ENOENT) => return ErrorCode::NotFound,
        Some(libc::EACCES) | Some(libc::EPERM) => return ErrorCode::PermissionDenied,
        _ => {}
    }
    match e.kind() {
        io::ErrorKind::NotFound => ErrorCode::NotFound,
        io::ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
        io::ErrorKind::AlreadyExists => ErrorCode::AlreadyExists,
        io::ErrorKind::InvalidInput => ErrorCode::BadRequest,
        _ => ErrorCode::Io,
    }
}

fn fail(op: &str, path: &str, e: io::Error) -> ErrorBody {
    ErrorBody::new(code_of(&e), format!("{op} {path}: {e}"))
}

fn check_path(op: &str, p: &str) -> Result<(), ErrorBody> {
    if !p.starts_with('/') {
        return Err(ErrorBody::new(
            ErrorCode::BadRequest,
            format!("{op}: path {p:?} must be absolute"),
        ));
    }
    if p.contains('\0') {
        return Err(ErrorBody::new(
            ErrorCode::BadRequest,
            format!("{op}: path {p:?} contains a NUL byte"),
        ));
    }
    Ok(())
}

/// The stat record of `path`, whose metadata is `m`; a symlink's target is read
/// through `link`, a path that reaches the same entry (see [`own_proc::PinnedDir`]).
pub(crate) fn stat_of(path: &Path, m: &std::fs::Metadata, link: &Path) -> FileStat {
    stat_through(path, m, link, false)
}

/// [`stat_of`], the attributes read through `link` following it (`follow`: a
/// `/proc/self/fd` path of the opened file) or not.
fn stat_through(path: &Path, m: &std::fs::Metadata, link: &Path, follow: bool) -> FileStat {
    let ft = m.file_type();
    let kind = if ft.is_symlink() {
        FileKind::Symlink
    } else if ft.is_dir() {
        FileKind::Dir
    } else if ft.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    };
    FileStat {
        path: path.to_string_lossy().into_owned(),
        kind,
        size: m.size(),
        mode: m.mode() & 0o7777,
        uid: m.uid(),
        gid: m.gid(),
        mtime: m.mtime(),
        mtime_nsec: m.mtime_nsec() as u32,
        symlink_target: if ft.is_symlink() {
            std::fs::read_link(link)
                .ok()
                .map(|t| t.to_string_lossy().into_owned())
        } else {
            None
        },
        // Links cannot carry `user.` attributes.
        xattrs: if ft.is_symlink() {
            Default::default()
        } else {
            user_xattrs(link, follow)
        },
    }
}

/// The stat record of `path`, already opened as `f` (following links; `m` its
/// metadata): its attributes are read through the descriptor, never through `path`
/// again (a link swapped in meanwhile could lead the lookup elsewhere).
pub(crate) fn stat_of_opened(path: &Path, f: &File, m: &std::fs::Metadata) -> FileStat {
    let via = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(f)
    ));
    stat_through(path, m, &via, true)
}

/// The `user.` extended attributes of the entry at `link` (not following a final
/// link) whose values are UTF-8, bounded as [`FileStat::xattrs`] says; none where
/// the filesystem has no extended attributes.
fn user_xattrs(link: &Path, follow: bool) -> std::collections::BTreeMap<String, String> {
    use sandlot_proto::guest::{MAX_XATTRS, MAX_XATTR_VALUE};
    let mut out = std::collections::BTreeMap::new();
    let mut names = vec![0u8; 16 * 1024];
    let listed = match follow {
        true => rustix::fs::listxattr(link, &mut names[..]),
        false => rustix::fs::llistxattr(link, &mut names[..]),
    };
    let Ok(n) = listed else {
        return out;
    };
    let mut value = vec![0u8; MAX_XATTR_VALUE];
    for name in names[..n].split(|b| *b == 0) {
        if out.len() >= MAX_XATTRS {
            break;
        }
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        if !name.starts_with("user.") {
            continue;
        }
        // A value longer than the buffer is ERANGE: left out.
        let got = match follow {
            true => rustix::fs::getxattr(link, name, &mut value[..]),
            false => rustix::fs::lgetxattr(link, name, &mut value[..]),
        };
        if let Ok(len) = got {
            if let Ok(v) = std::str::from_utf8(&value[..len]) {
                out.insert(name.to_string(), v.to_string());
            }
        }
    }
    out
}

/// Checks the extended attributes a write asks for.
fn check_xattrs(r: &WriteFileRequest) -> Result<(), ErrorBody> {
    use sandlot_proto::guest::{MAX_XATTRS, MAX_XATTR_VALUE};
    let bad = |m: String| {
        Err(ErrorBody::new(
            ErrorCode::BadRequest,
            format!("write_file: {m}"),
        ))
    };
    if r.xattrs.is_empty() {
        return Ok(());
    }
    if r.append {
        return bad(
            "extended attributes are set only on a file written whole (not with append)".into(),
        );
    }
    if r.xattrs.len() > MAX_XATTRS {
        return bad(format!("at most {MAX_XATTRS} extended attributes"));
    }
    for (k, v) in &r.xattrs {
        if !k.starts_with("user.") || k.len() <= 5 || k.len() > 255 || k.contains('\0') {
            return bad(format!(
                "extended attribute {k:?}: names are user.NAME, at most 255 bytes"
            ));
        }
        if v.len() > MAX_XATTR_VALUE {
            return bad(format!(
                "extended attribute {k:?}: value longer than {MAX_XATTR_VALUE} bytes"
            ));
        }
    }
    Ok(())
}

/// Reads and writes stream regular files only: devices, FIFOs and sockets could
/// block the agent (which serves everything from one thread) indefinitely.
fn not_regular(m: &std::fs::Metadata) -> io::Result<()> {
    if m.is_file() {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file (devices, FIFOs and sockets cannot be streamed)",
        ))
    }
}

/// A file being streamed to a client.
pub(crate) struct ReadStream {
    file: File,
    remaining: Option<u64>,
    pub credit: u64,
}

/// A file being received from a client.
pub(crate) struct WriteStream {
    file: Option<File>,
    /// Set-id bits to put back at EOF (a write, and root's chown to the old owner,
    /// clear them), with the rest of the mode; 0 when there are none.
    setid_mode: u32,
    /// Temporary file renamed over `dest` at EOF (None when appending).
    temp: Option<PathBuf>,
    dest: PathBuf,
    display: String,
    user: User,
    bytes: u64,
    /// Credit granted and not yet used.
    pub credit: u64,
}

impl Drop for WriteStream {
    fn drop(&mut self) {
        // Cancelled, failed or the connection went away: leave nothing half-written.
        if let Some(t) = self.temp.take() {
            let _ = std::fs::remove_file(t);
        }
    }
}

/// A directory tree being listed.
pub(crate) struct ListStream {
    stack: Vec<DirFrame>,
    max_depth: u32,
    user: User,
    pending: BytesMut,
    pub credit: u64,
}

struct DirFrame {
    /// As the client named it.
    dir: PathBuf,
    /// The same directory, opened and checked once.
    pinned: PinnedDir,
    names: Vec<OsString>,
    next: usize,
    depth: u32,
}

fn sorted_names(dir: &Path) -> io::Result<Vec<OsString>> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir)? {
        names.push(e?.file_name());
    }
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok(names)
}

pub(crate) fn user_for(agent: &mut Agent, op: &str, spec: Option<&str>) -> Result<User, ErrorBody> {
    let spec = spec.unwrap_or(&agent.settings.default_user).to_string();
    agent
        .users
        .resolve(&spec)
        .map_err(|m| ErrorBody::new(ErrorCode::InvalidUser, format!("{op}: {m}")))
}

/// Name of the temporary file a write goes to before its rename.
fn temp_name(dest: &Path, n: u64) -> PathBuf {
    let name = dest
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    dest.with_file_name(format!(".{name}.sandlot-{}-{n}.tmp", std::process::id()))
}

impl Agent {
    pub fn stat(&mut self, r: &StatRequest) -> Result<FileStat, ErrorBody> {
        check_path("stat", &r.path)?;
        let user = user_for(self, "stat", r.user.as_deref())?;
        let p = Path::new(&r.path);
        self.fs
            .run(&user, || {
                if r.follow {
                    let f = File::from(own_proc::open(p, OFlags::PATH, true)?);
                    return Ok(stat_of_opened(p, &f, &f.metadata()?));
                }
                // The entry itself, in its checked parent directory.
                let (dir, name) = PinnedDir::parent_of(p)?;
                let entry = dir.entry(&name);
                let m = std::fs::symlink_metadata(&entry)?;
                if m.is_dir() {
                    dir.child(&name)?;
                }
                Ok(stat_of(p, &m, &entry))
            })
            .map_err(|e| fail("stat", &r.path, e))
    }

    pub fn mkdir(&mut self, r: &MkdirRequest) -> Result<(), ErrorBody> {
        check_path("mkdir", &r.path)?;
        let user = user_for(self, "mkdir", r.user.as_deref())?;
        let mode = r.mode.unwrap_or(0o755);
        if mode > 0o7777 {
            return Err(ErrorBody::new(
                ErrorCode::BadRequest,
                format!("mkdir: mode {mode:o} is not a permission mode"),
            ));
        }
        self.fs
            .run(&user, || {
                // `mkdir -p -m`: the mode is for a directory made now, never for
                // one that was there (it turned `/tmp` into 0700).
                let existed = std::fs::symlink_metadata(&r.path).is_ok_and(|m| m.is_dir());
                let mut b = std::fs::DirBuilder::new();
                b.recursive(r.parents);
                std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o755);
                b.create(&r.path)?;
                if r.mode.is_some() && !existed {
                    std::fs::set_permissions(&r.path, std::fs::Permissions::from_mode(mode))?;
                }
                Ok(())
            })
            .map_err(|e| fail("mkdir", &r.path, e))
    }

    pub fn remove(&mut self, r: &RemoveRequest) -> Result<(), ErrorBody> {
        check_path("remove", &r.path)?;
        if Path::new(&r.path).parent().is_none() {
            return Err(ErrorBody::new(
                ErrorCode::BadRequest,
                "remove: refusing to remove /",
            ));
        }
        let user = user_for(self, "remove", r.user.as_deref())?;
        self.fs
            .run(&user, || {
                let m = std::fs::symlink_metadata(&r.path)?;
                if m.is_dir() {
                    if r.recursive {
                        std::fs::remove_dir_all(&r.path)
                    } else {
                        std::fs::remove_dir(&r.path)
                    }
                } else {
                    std::fs::remove_file(&r.path)
                }
            })
            .map_err(|e| fail("remove", &r.path, e))
    }

    pub fn rename(&mut self, r: &RenameRequest) -> Result<(), ErrorBody> {
        check_path("rename", &r.from)?;
        check_path("rename", &r.to)?;
        let user = user_for(self, "rename", r.user.as_deref())?;
        let to = Path::new(&r.to);
        let seed = rand_seed();
        self.fs
            .run(&user, || {
                // The source in its checked parent directory: a move by copy reads it.
                let (dir, name) = PinnedDir::parent_of(Path::new(&r.from))?;
                let from = dir.entry(&name);
                match rename_in_place(&from, to, r.overwrite) {
                    // Another filesystem, or a reparenting that landlock refuses (a
                    // ruleset that does not grant LANDLOCK_ACCESS_FS_REFER answers
                    // EXDEV to every rename across directories): copy, then swap in.
                    Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                        let src = Source {
                            dir: &dir,
                            name: &name,
                            named: Path::new(&r.from),
                        };
                        move_by_copy(&src, to, r.overwrite, user.uid == 0, seed)
                    }
                    other => other,
                }
            })
            .map_err(|e| fail("rename", &format!("{} -> {}", r.from, r.to), e))
    }

    /// Opens a file for reading; the stream starts once the client grants credit.
    pub fn open_read(&mut self, r: &ReadFileRequest) -> Result<(FileStat, ReadStream), ErrorBody> {
        check_path("read_file", &r.path)?;
        let user = user_for(self, "read_file", r.user.as_deref())?;
        let (file, stat) = self
            .fs
            .run(&user, || {
                // Non-blocking open: a FIFO without a writer must not stall the agent.
                let p = Path::new(&r.path);
                let mut f = File::from(own_proc::open(
                    p,
                    OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
                    true,
                )?);
                let m = f.metadata()?;
                if m.is_dir() {
                    return Err(io::Error::from_raw_os_error(libc::EISDIR));
                }
                not_regular(&m)?;
                if r.offset > 0 {
                    f.seek(SeekFrom::Start(r.offset))?;
                }
                let st = stat_of_opened(p, &f, &m);
                Ok((f, st))
            })
            .map_err(|e| fail("read_file", &r.path, e))?;
        Ok((
            stat,
            ReadStream {
                file,
                remaining: r.length,
                credit: 0,
            },
        ))
    }

    pub fn pump_read(&mut self, conn_id: u64, chan: u32) {
        let Agent { conns, scratch, .. } = self;
        let Some(conn) = conns.get_mut(&conn_id) else {
            return;
        };
        let Some(Chan::Read(rs)) = conn.chans.get_mut(&chan) else {
            return;
        };
        let scratch = scratch.get();
        loop {
            if rs.remaining == Some(0) {
                break;
            }
            if rs.credit == 0 {
                return;
            }
            let room = conn.out.room();
            if room == 0 {
                conn.out.block(chan);
                return;
            }
            let mut n = (rs.credit as usize).min(DATA_CHUNK).min(room);
            if let Some(rem) = rs.remaining {
                n = n.min(rem as usize);
            }
            match rs.file.read(&mut scratch[..n]) {
                Ok(0) => break,
                Ok(n) => {
                    conn.out.data(chan, stream::OUTPUT, &scratch[..n]);
                    rs.credit -= n as u64;
                    if let Some(rem) = &mut rs.remaining {
                        *rem -= n as u64;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    conn.chans.remove(&chan);
                    conn.out
                        .error(chan, ErrorBody::new(code_of(&e), format!("read_file: {e}")));
                    return;
                }
            }
        }
        conn.chans.remove(&chan);
        conn.out.eof(chan, stream::OUTPUT);
        conn.out.end(chan);
    }

    /// Opens the destination of a write (creating parents) as the user.
    pub fn open_write(&mut self, r: &WriteFileRequest) -> Result<WriteStream, ErrorBody> {
        check_path("write_file", &r.path)?;
        if let Some(m) = r.mode {
            if m > 0o7777 {
                return Err(ErrorBody::new(
                    ErrorCode::BadRequest,
                    format!("write_file: mode {m:o} is not a permission mode"),
                ));
            }
        }
        check_xattrs(r)?;
        let user = user_for(self, "write_file", r.user.as_deref())?;
        let seq = self.next_proc + self.next_conn * 1_000_003 + rand_seed();
        let acting_root = user.uid == 0;
        self.fs
            .run(&user, || {
                let mut dest = PathBuf::from(&r.path);
                if r.create_parents {
                    if let Some(parent) = dest.parent() {
                        let mut b = std::fs::DirBuilder::new();
                        b.recursive(true);
                        b.create(parent)?;
                    }
                }
                // Writing through a symlink writes its target.
                if let Ok(m) = std::fs::symlink_metadata(&dest) {
                    if m.file_type().is_symlink() {
                        dest = std::fs::canonicalize(&dest)?;
                    }
                }
                let existing = std::fs::metadata(&dest).ok();
                if let Some(m) = &existing {
                    if m.is_dir() {
                        return Err(io::Error::from_raw_os_error(libc::EISDIR));
                    }
                    not_regular(m)?;
                }
                let mode = r
                    .mode
                    .or(existing.as_ref().map(|m| m.mode() & 0o7777))
                    .unwrap_or(0o644);
                if r.append {
                    let f = OpenOptions::new()
                        .append(true)
                        .create(true)
                        .mode(mode)
                        .custom_flags(libc::O_NONBLOCK)
                        .open(&dest)?;
                    own_proc::refuse_own(f.as_fd())?;
                    not_regular(&f.metadata()?)?;
                    if r.mode.is_some() {
                        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
                    }
                    return Ok(WriteStream {
                        file: Some(f),
                        setid_mode: if r.mode.is_some() { setid(mode) } else { 0 },
                        temp: None,
                        display: r.path.clone(),
                        dest,
                        user: user.clone(),
                        bytes: 0,
                        credit: 0,
                    });
                }
                let mut attempt = 0;
                let (f, temp) = loop {
                    let t = temp_name(&dest, seq + attempt);
                    match OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .open(&t)
                    {
                        Ok(f) => break (f, t),
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 16 => {
                            attempt += 1
                        }
                        Err(e) => return Err(e),
                    }
                };
                let ws = WriteStream {
                    file: Some(f),
                    setid_mode: setid(mode),
                    temp: Some(temp),
                    display: r.path.clone(),
                    dest,
                    user: user.clone(),
                    bytes: 0,
                    credit: 0,
                };
                let f = ws.file.as_ref().expect("just opened");
                f.set_permissions(std::fs::Permissions::from_mode(mode))?;
                // On the new file only: a file written again loses the old
                // attributes, one renamed keeps them.
                for (k, v) in &r.xattrs {
                    rustix::fs::fsetxattr(
                        f,
                        k.as_str(),
                        v.as_bytes(),
                        rustix::fs::XattrFlags::empty(),
                    )
                    .map_err(|e| match e {
                        rustix::io::Errno::OPNOTSUPP => io::Error::new(
                            io::ErrorKind::InvalidInput,
                            "this filesystem has no user extended attributes (file metadata)",
                        ),
                        e => e.into(),
                    })?;
                }
                if acting_root {
                    if let Some(m) = &existing {
                        // Root rewriting someone's file keeps it theirs.
                        std::os::unix::fs::fchown(f, Some(m.uid()), Some(m.gid()))?;
                    }
                }
                Ok(ws)
            })
            .map_err(|e| fail("write_file", &r.path, e))
    }

    /// DATA for a write. Returns Err on a credit violation (protocol error).
    pub fn write_data(&mut self, conn_id: u64, chan: u32, data: &[u8]) -> Result<(), String> {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return Ok(());
        };
        let Some(Chan::Write(ws)) = conn.chans.get_mut(&chan) else {
            return Ok(());
        };
        let n = data.len() as u64;
        if n > ws.credit {
            return Err(format!(
                "{n} bytes of file data exceed the granted credit of {}",
                ws.credit
            ));
        }
        ws.credit -= n;
        let f = ws.file.as_mut().expect("open while the channel exists");
        match f.write_all(data) {
            Ok(()) => {
                ws.bytes += n;
                ws.credit += n;
                conn.out.window(chan, stream::INPUT, n as u32);
            }
            Err(e) => {
                let msg = format!("write_file {}: {e}", ws.display);
                conn.chans.remove(&chan);
                conn.out.error(chan, ErrorBody::new(code_of(&e), msg));
            }
        }
        Ok(())
    }

    /// EOF of a write: put the file in place.
    pub fn write_eof(&mut self, conn_id: u64, chan: u32) {
        let Agent { conns, fs, .. } = self;
        let Some(conn) = conns.get_mut(&conn_id) else {
            return;
        };
        let Some(Chan::Write(mut ws)) = conn.chans.remove(&chan) else {
            return;
        };
        let file = ws.file.take().expect("open until EOF");
        let setid_mode = ws.setid_mode;
        let restored = if setid_mode != 0 {
            fs.run(&ws.user, || {
                file.set_permissions(std::fs::Permissions::from_mode(setid_mode))
            })
        } else {
            Ok(())
        };
        drop(file);
        if let Err(e) = restored {
            conn.out.error(chan, fail("write_file", &ws.display, e));
            return;
        }
        let res = match ws.temp.clone() {
            Some(t) => fs
                .run(&ws.user, || std::fs::rename(&t, &ws.dest))
                .map(|()| {
                    ws.temp = None;
                }),
            None => Ok(()),
        };
        match res {
            Ok(()) => {
                conn.out.reply(chan, &Reply::Written { bytes: ws.bytes });
                conn.out.end(chan);
            }
            Err(e) => conn.out.error(chan, fail("write_file", &ws.display, e)),
        }
    }

    /// Starts a listing (the root must be a directory the user can read).
    pub fn open_list(&mut self, r: &ListDirRequest) -> Result<(FileStat, ListStream), ErrorBody> {
        check_path("list_dir", &r.path)?;
        if r.depth == 0 {
            return Err(ErrorBody::new(
                ErrorCode::BadRequest,
                "list_dir: depth must be at least 1",
            ));
        }
        let user = user_for(self, "list_dir", r.user.as_deref())?;
        let root = PathBuf::from(&r.path);
        let (stat, names, pinned) = self
            .fs
            .run(&user, || {
                let pinned = PinnedDir::open(&root, true)?;
                let m = std::fs::metadata(pinned.path())?;
                Ok((
                    stat_of(&root, &m, &root),
                    sorted_names(&pinned.path())?,
                    pinned,
                ))
            })
            .map_err(|e| fail("list_dir", &r.path, e))?;
        Ok((
            stat,
            ListStream {
                stack: vec![DirFrame {
                    dir: root,
                    pinned,
                    names,
                    next: 0,
                    depth: 1,
                }],
                max_depth: r.depth,
                user,
                pending: BytesMut::new(),
                credit: 0,
            },
        ))
    }

    pub fn pump_list(&mut self, conn_id: u64, chan: u32) {
        let Agent { conns, fs, .. } = self;
        let Some(conn) = conns.get_mut(&conn_id) else {
            return;
        };
        let Some(Chan::List(ls)) = conn.chans.get_mut(&chan) else {
            return;
        };
        loop {
            // Send what is pending, within credit.
            while !ls.pending.is_empty() && ls.credit > 0 {
                let room = conn.out.room();
                if room == 0 {
                    conn.out.block(chan);
                    return;
                }
                let n = ls
                    .pending
                    .len()
                    .min(ls.credit as usize)
                    .min(DATA_CHUNK)
                    .min(room);
                let chunk = ls.pending.split_to(n);
                conn.out.data(chan, stream::OUTPUT, &chunk);
                ls.credit -= n as u64;
            }
            if !ls.pending.is_empty() {
                return;
            }
            if ls.stack.is_empty() {
                conn.chans.remove(&chan);
                conn.out.eof(chan, stream::OUTPUT);
                conn.out.end(chan);
                return;
            }
            // Generate the next batch of records, as the user.
            let user = ls.user.clone();
            let _ = fs.run(&user, || {
                while ls.pending.len() < DATA_CHUNK {
                    let Some(top) = ls.stack.last_mut() else {
                        break;
                    };
                    if top.next >= top.names.len() {
                        ls.stack.pop();
                        continue;
                    }
                    let name = top.names[top.next].clone();
                    let path = top.dir.join(&name);
                    let at = top.pinned.entry(&name);
                    top.next += 1;
                    let depth = top.depth;
                    let Ok(m) = std::fs::symlink_metadata(&at) else {
                        continue; // vanished meanwhile
                    };
                    let mut entry = DirEntry {
                        stat: stat_of(&path, &m, &at),
                        depth,
                        error: None,
                    };
                    if m.is_dir() && depth < ls.max_depth {
                        let sub = top
                            .pinned
                            .child(&name)
                            .and_then(|p| Ok((sorted_names(&p.path())?, p)));
                        match sub {
                            Ok((names, pinned)) => ls.stack.push(DirFrame {
                                dir: path,
                                pinned,
                                names,
                                next: 0,
                                depth: depth + 1,
                            }),
                            Err(e) => entry.error = Some(e.to_string()),
                        }
                    }
                    let mut line = serde_json::to_vec(&entry).map_err(io::Error::other)?;
                    line.push(b'\n');
                    ls.pending.extend_from_slice(&line);
                }
                Ok(())
            });
        }
    }
}

/// `mode` when it has set-id bits, else 0.
fn setid(mode: u32) -> u32 {
    if mode & 0o6000 != 0 {
        mode
    } else {
        0
    }
}

fn rand_seed() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0)
}

/// `rename(2)`, or `renameat2(RENAME_NOREPLACE)` when `overwrite` is false.
fn rename_in_place(from: &Path, to: &Path, overwrite: bool) -> io::Result<()> {
    if overwrite {
        std::fs::rename(from, to)
    } else {
        use rustix::fs::CWD;
        Ok(rustix::fs::renameat_with(
            CWD,
            from,
            CWD,
            to,
            rustix::fs::RenameFlags::NOREPLACE,
        )?)
    }
}

/// The source of a move: entry `name` of a checked directory, as the client named it.
struct Source<'a> {
    dir: &'a PinnedDir,
    name: &'a std::ffi::OsStr,
    named: &'a Path,
}

/// A rename that `rename(2)` refused with `EXDEV`, done the way `mv` does it, with
/// the same outcome as a rename: the tree is copied (contents, modes, times, and
/// owners when acting as root; symlinks as symlinks) to a temporary name next to
/// `to`, swapped in with a rename inside that directory (atomic, `RENAME_NOREPLACE`
/// unless `overwrite`), and only then is `from` removed. On failure the copy is
/// removed and `from` is untouched. Hard links inside a moved tree become copies.
fn move_by_copy(
    src_entry: &Source<'_>,
    to: &Path,
    overwrite: bool,
    as_root: bool,
    seed: u64,
) -> io::Result<()> {
    let from = &src_entry.dir.entry(src_entry.name);
    let src = std::fs::symlink_metadata(from)?;
    // The checks rename(2) makes against an existing destination.
    match std::fs::symlink_metadata(to) {
        Ok(_) if !overwrite => return Err(io::Error::from_raw_os_error(libc::EEXIST)),
        Ok(dst) if dst.is_dir() && !src.is_dir() => {
            return Err(io::Error::from_raw_os_error(libc::EISDIR))
        }
        Ok(dst) if !dst.is_dir() && src.is_dir() => {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR))
        }
        Ok(dst) if dst.is_dir() && std::fs::read_dir(to)?.next().is_some() => {
            return Err(io::Error::from_raw_os_error(libc::ENOTEMPTY))
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if src.is_dir() && to.starts_with(src_entry.named) {
        // rename(2) refuses to move a directory into itself.
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // The source must be removable before anything is swapped in: failing after the
    // swap left both, and with `overwrite` the old destination was gone (found by
    // probing a move out of a read-only mount). `AT_EACCESS` checks as the acting
    // user (its fsuid); a read-only file system answers EROFS.
    access_as_effective(
        &src_entry.dir.path(),
        rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
    )?;
    let temp = temp_name(to, seed);
    if let Err(e) = copy_tree(src_entry.dir, src_entry.name, &temp, &src, as_root) {
        let _ = remove_tree(&temp);
        return Err(e);
    }
    if let Err(e) = rename_in_place(&temp, to, overwrite) {
        let _ = remove_tree(&temp);
        return Err(e);
    }
    remove_tree(from).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "copied to {} but removing the source failed: {e}",
                to.display()
            ),
        )
    })
}

/// `faccessat(AT_FDCWD, path, access, AT_EACCESS)` as glibc does it: where the
/// kernel has no `faccessat2` (ENOSYS), the check falls back to `faccessat`, which
/// checks as the real ids.
fn access_as_effective(path: &Path, access: rustix::fs::Access) -> io::Result<()> {
    use rustix::fs::{AtFlags, CWD};
    match rustix::fs::accessat(CWD, path, access, AtFlags::EACCESS) {
        Err(rustix::io::Errno::NOSYS) => {
            Ok(rustix::fs::accessat(CWD, path, access, AtFlags::empty())?)
        }
        r => Ok(r?),
    }
}

fn remove_tree(p: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Copies entry `name` of `dir` (whose `lstat` is `m`) to the new path `to`,
/// recursively, each directory through a checked descriptor.
fn copy_tree(
    dir: &PinnedDir,
    name: &std::ffi::OsStr,
    to: &Path,
    m: &std::fs::Metadata,
    as_root: bool,
) -> io::Result<()> {
    let from = &dir.entry(name);
    let ft = m.file_type();
    if ft.is_symlink() {
        std::os::unix::fs::symlink(std::fs::read_link(from)?, to)?;
    } else if ft.is_dir() {
        let sub = dir.child(name)?;
        std::fs::DirBuilder::new().mode(0o700).create(to)?;
        for n in sorted_names(&sub.path())? {
            let m = std::fs::symlink_metadata(sub.entry(&n))?;
            copy_tree(&sub, &n, &to.join(&n), &m, as_root)?;
        }
    } else if ft.is_file() {
        let mut input = File::from(dir.open_file(name)?);
        let mut output = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(to)?;
        io::copy(&mut input, &mut output)?;
        output.sync_data()?;
    } else if ft.is_fifo() {
        rustix::fs::mkfifoat(rustix::fs::CWD, to, rustix::fs::Mode::from_raw_mode(0o600))?;
    } else {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "{}: sockets and device nodes cannot be moved to another directory",
                from.display()
            ),
        ));
    }
    if as_root {
        std::os::unix::fs::lchown(to, Some(m.uid()), Some(m.gid()))?;
    }
    if !ft.is_symlink() {
        // After the owner: chown clears set-id bits.
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(m.mode() & 0o7777))?;
    }
    let time = |tv_sec: i64, tv_nsec: i64| rustix::fs::Timespec { tv_sec, tv_nsec };
    let times = rustix::fs::Timestamps {
        last_access: time(m.atime(), m.atime_nsec()),
        last_modification: time(m.mtime(), m.mtime_nsec()),
    };
    Ok(rustix::fs::utimensat(
        rustix::fs::CWD,
        to,
        &times,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )?)
}
