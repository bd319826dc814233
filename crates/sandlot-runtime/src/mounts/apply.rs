//! Applying a [`super::MountPlan`]: the root filesystem ([`mount_root`],
//! [`mount_layers`]) and the plan's operations ([`apply_with_trees`]), inside the
//! sandbox's mount namespace. Every path is resolved under the new root with
//! `openat2(RESOLVE_IN_ROOT)`. The system calls go through [`MountSyscalls`]:
//! [`Kernel`] here, a fake that records them in the unit tests.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

use super::{
    apply_err, entry_kind, in_root_err, HostEntry, Kind, MountError, MountOp, RootFs, TmpfsLimit,
    HOST_ETC_VIEW,
};
use crate::host_path::HostId;
use crate::sys;

#[cfg(test)]
mod fake;
mod syscalls;
#[cfg(test)]
mod tests;

use syscalls::{Kernel, MountSyscalls};

/// Names of the overlay's working directories inside the root tmpfs.
const OVL_LOWER: &str = ".sandlot-lower";
const OVL_UPPER: &str = ".sandlot-upper";
const OVL_WORK: &str = ".sandlot-work";

/// Result of mounting the root, for diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootInfo {
    /// The lower layer is idmapped (its root-owned files appear owned by root inside).
    pub idmapped: bool,
}

/// Mounts the root filesystem at `at` (a directory in the current mount namespace).
/// `idmapped_lower` is a detached, idmapped copy of the overlay's lower directory.
pub fn mount_root(
    root: &RootFs,
    at: &Path,
    idmapped_lower: Option<OwnedFd>,
) -> Result<RootInfo, MountError> {
    mount_root_with(&Kernel, root, at, idmapped_lower)
}

/// [`mount_root`], making its system calls through `kernel`.
fn mount_root_with<S: MountSyscalls>(
    kernel: &S,
    root: &RootFs,
    at: &Path,
    idmapped_lower: Option<S::Fd>,
) -> Result<RootInfo, MountError> {
    let at_c = sys::cstr(at).map_err(apply_err("mount root", at.display().to_string()))?;
    match root {
        RootFs::Tmpfs { size } => {
            mount_scratch(kernel, at, &at_c, *size, "mount tmpfs root at")?;
            Ok(RootInfo { idmapped: false })
        }
        RootFs::Overlay {
            lower,
            lower_id,
            size,
        } => {
            mount_scratch(kernel, at, &at_c, *size, "mount overlay scratch at")?;
            for d in [OVL_LOWER, OVL_UPPER, OVL_WORK] {
                kernel
                    .create_dir(&at.join(d))
                    .map_err(apply_err("mkdir", d))?;
            }
            let lower_at = sys::cstr(&at.join(OVL_LOWER)).map_err(apply_err("lower", OVL_LOWER))?;
            let mut idmapped = false;
            if let Some(fd) = idmapped_lower {
                idmapped = kernel.move_mount_to(&fd, &lower_at).is_ok();
            }
            if !idmapped {
                // The pinned directory, reached without a link, or nothing.
                let (src, _) = kernel
                    .reopen_pinned(lower, *lower_id)
                    .map_err(apply_err("open rootfs", lower.display().to_string()))?;
                let tree = kernel
                    .open_tree_clone_fd(&src, true)
                    .map_err(apply_err("bind rootfs", lower.display().to_string()))?;
                kernel
                    .move_mount_to(&tree, &lower_at)
                    .map_err(apply_err("bind rootfs", lower.display().to_string()))?;
            }
            let opts = format!(
                "lowerdir={0}/{OVL_LOWER},upperdir={0}/{OVL_UPPER},workdir={0}/{OVL_WORK},userxattr",
                at.display()
            );
            mount_overlay(kernel, at, &at_c, opts)?;
            Ok(RootInfo { idmapped })
        }
        RootFs::Layers { .. } => Err(MountError::Apply {
            op: "mount layered root",
            path: at.display().to_string(),
            source: io::Error::other("use mount_layers"),
        }),
    }
}

/// Moves an idmapped tree onto `at`, or binds `source` there if there is none.
/// Returns whether the idmapped tree was used.
fn attach_tree<S: MountSyscalls>(
    kernel: &S,
    tree: Option<S::Fd>,
    source: &Path,
    at: &Path,
) -> Result<bool, MountError> {
    let at_c = sys::cstr(at).map_err(apply_err("mount point", at.display().to_string()))?;
    if let Some(fd) = tree {
        if kernel.move_mount_to(&fd, &at_c).is_ok() {
            return Ok(true);
        }
    }
    let src = sys::cstr(source).map_err(apply_err("bind", source.display().to_string()))?;
    kernel
        .mount(Some(&src), &at_c, None, libc::MS_BIND | libc::MS_REC, None)
        .map_err(apply_err("bind", source.display().to_string()))?;
    Ok(false)
}

/// Mounts an image root ([`RootFs::Layers`]) at `at`. `trees` are the idmapped
/// trees of [`MountPlan::idmap_sources`], in order; the ones used are taken. With
/// `idmapped_rw`, a host writable layer that cannot be idmapped is an error (its
/// files would show as nobody); without, it is bound as it is.
pub fn mount_layers(
    root: &RootFs,
    at: &Path,
    trees: &mut [Option<OwnedFd>],
    idmapped_rw: bool,
) -> Result<RootInfo, MountError> {
    mount_layers_with(&Kernel, root, at, trees, idmapped_rw)
}

/// [`mount_layers`], making its system calls through `kernel`.
fn mount_layers_with<S: MountSyscalls>(
    kernel: &S,
    root: &RootFs,
    at: &Path,
    trees: &mut [Option<S::Fd>],
    idmapped_rw: bool,
) -> Result<RootInfo, MountError> {
    let RootFs::Layers { lowers, rw, size } = root else {
        return mount_root_with(kernel, root, at, None);
    };
    let at_c = sys::cstr(at).map_err(apply_err("mount root", at.display().to_string()))?;
    // The scratch tmpfs holds the layer mount points (and the writable layer when
    // it lives inside the sandbox).
    let scratch = if rw.is_some() {
        TmpfsLimit::of_size(1 << 20)
    } else {
        *size
    };
    mount_scratch(kernel, at, &at_c, scratch, "mount overlay scratch at")?;
    let mut idmapped = true;
    let mut lowerdirs = Vec::new();
    for (i, l) in lowers.iter().enumerate() {
        let name = format!(".sandlot-l{i}");
        let p = at.join(&name);
        kernel
            .create_dir(&p)
            .map_err(apply_err("mkdir", name.clone()))?;
        idmapped &= attach_tree(kernel, trees.get_mut(i).and_then(Option::take), l, &p)?;
        lowerdirs.push(p.display().to_string());
    }
    let (upper, work) = match rw {
        Some(dir) => {
            let p = at.join(".sandlot-rw");
            kernel
                .create_dir(&p)
                .map_err(apply_err("mkdir", ".sandlot-rw"))?;
            let tree = trees.get_mut(lowers.len()).and_then(Option::take);
            if !attach_tree(kernel, tree, dir, &p)? && idmapped_rw {
                return Err(MountError::Apply {
                    op: "idmap the writable layer",
                    path: dir.display().to_string(),
                    source: io::Error::other("the kernel refused an idmapped mount"),
                });
            }
            (p.join("upper"), p.join("work"))
        }
        None => {
            for d in [OVL_UPPER, OVL_WORK] {
                kernel
                    .create_dir(&at.join(d))
                    .map_err(apply_err("mkdir", d))?;
            }
            (at.join(OVL_UPPER), at.join(OVL_WORK))
        }
    };
    let opts = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        lowerdirs.join(":"),
        upper.display(),
        work.display()
    );
    mount_overlay(kernel, at, &at_c, opts)?;
    Ok(RootInfo { idmapped })
}

/// The root's tmpfs (the `host` image's root, or an overlay's scratch) at `at`.
fn mount_scratch(
    kernel: &impl MountSyscalls,
    at: &Path,
    at_c: &CStr,
    size: TmpfsLimit,
    op: &'static str,
) -> Result<(), MountError> {
    let opts = CString::new(format!("{},mode=0755", size.mount_options())).expect("no NUL");
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    kernel
        .mount(Some(c"sandlot"), at_c, Some(c"tmpfs"), flags, Some(&opts))
        .map_err(apply_err(op, at.display().to_string()))
}

/// The root's overlay at `at`, with `opts` (`lowerdir=...,upperdir=...,...`).
fn mount_overlay(
    kernel: &impl MountSyscalls,
    at: &Path,
    at_c: &CStr,
    opts: String,
) -> Result<(), MountError> {
    let opts_c = CString::new(opts).map_err(|_| MountError::Apply {
        op: "overlay options",
        path: at.display().to_string(),
        source: io::ErrorKind::InvalidInput.into(),
    })?;
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    kernel
        .mount(
            Some(c"overlay"),
            at_c,
            Some(c"overlay"),
            flags,
            Some(&opts_c),
        )
        .map_err(apply_err("mount overlay at", at.display().to_string()))
}

/// Resolves `path` under `root` (RESOLVE_IN_ROOT), creating missing components.
/// Tries the whole path first; only missing suffixes are walked.
fn ensure<S: MountSyscalls>(kernel: &S, root: &S::Fd, path: &str, kind: Kind) -> io::Result<S::Fd> {
    let trimmed = path.trim_end_matches('/');
    let c = CString::new(if trimmed.is_empty() { "/" } else { trimmed })
        .map_err(|_| io::ErrorKind::InvalidInput)?;
    match kernel.open_in_root(root, &c) {
        Ok(fd) => return Ok(fd),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) && !trimmed.is_empty() => {}
        Err(e) => return Err(e),
    }
    let (parent, name) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
    let pfd = ensure(
        kernel,
        root,
        if parent.is_empty() { "/" } else { parent },
        Kind::Dir,
    )?;
    let cname = CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
    let made = match kind {
        Kind::File => kernel.touchat(&pfd, &cname, 0o644),
        Kind::Dir => kernel.mkdirat(&pfd, &cname, 0o755),
    };
    match made {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(e) => return Err(e),
    }
    kernel.open_in_root(root, &c)
}

fn exists_in_root<S: MountSyscalls>(kernel: &S, root: &S::Fd, path: &str) -> bool {
    CString::new(path)
        .ok()
        .map(|c| kernel.open_in_root(root, &c).is_ok())
        .unwrap_or(false)
}

fn remount_readonly<S: MountSyscalls>(
    kernel: &S,
    root: &S::Fd,
    path: &str,
    recursive: bool,
) -> io::Result<()> {
    let c = CString::new(path).map_err(|_| io::ErrorKind::InvalidInput)?;
    let fd = kernel.open_in_root(root, &c)?;
    make_readonly(kernel, &fd, recursive, 0)
}

/// Makes the mount at `path` and those below it `nosuid` and `nodev` (a writable
/// volume or store: a set-id program or a device node written there by anyone with
/// access to it must give nothing).
fn remount_nosuid<S: MountSyscalls>(kernel: &S, root: &S::Fd, path: &str) -> io::Result<()> {
    let c = CString::new(path).map_err(|_| io::ErrorKind::InvalidInput)?;
    let fd = kernel.open_in_root(root, &c)?;
    let set = sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
    kernel.mount_setattr(&fd, true, set)
}

/// Makes the mount at `fd` (and, with `recursive`, those below it) read-only,
/// `nosuid` and `nodev`, plus the `extra` `MOUNT_ATTR_*` flags.
fn make_readonly<S: MountSyscalls>(
    kernel: &S,
    fd: &S::Fd,
    recursive: bool,
    extra: u64,
) -> io::Result<()> {
    let set = sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV | extra;
    kernel.mount_setattr(fd, recursive, set)
}

/// Creates the symlink `path` -> `target` under the root (an existing entry is kept).
fn symlink_in<S: MountSyscalls>(
    kernel: &S,
    r: &S::Fd,
    parents: &mut ParentDir<S::Fd>,
    path: &str,
    target: &str,
) -> Result<(), MountError> {
    let (pfd, name) = parents
        .get(kernel, r, path)
        .map_err(in_root_err("symlink", path))?;
    let t = CString::new(target).map_err(|_| MountError::Apply {
        op: "symlink",
        path: path.to_string(),
        source: io::ErrorKind::InvalidInput.into(),
    })?;
    match kernel.symlinkat(pfd, &name, &t) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        Err(e) => Err(MountError::Apply {
            op: "symlink",
            path: path.to_string(),
            source: e,
        }),
    }
}

/// The parent directory of the last entry created, kept open for the next entry in
/// the same directory (the `/etc` and `/dev` entries come in runs): one `openat2`
/// per directory instead of one per entry. Every mount clears it, since a mount may
/// cover the directory it holds.
struct ParentDir<F>(Option<(String, F)>);

impl<F> Default for ParentDir<F> {
    fn default() -> Self {
        ParentDir(None)
    }
}

impl<F> ParentDir<F> {
    /// The parent of `path` (resolved in the root, created if missing) and the name.
    fn get<S: MountSyscalls<Fd = F>>(
        &mut self,
        kernel: &S,
        root: &F,
        path: &str,
    ) -> io::Result<(&F, CString)> {
        let p = Path::new(path);
        let parent = p.parent().and_then(|p| p.to_str()).unwrap_or("/");
        let name = p
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or(io::ErrorKind::InvalidInput)?;
        let name = CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
        if !matches!(&self.0, Some((cached, _)) if cached == parent) {
            let fd = ensure(kernel, root, parent, Kind::Dir)?;
            self.0 = Some((parent.to_string(), fd));
        }
        let (_, fd) = self.0.as_ref().expect("set above");
        Ok((fd, name))
    }

    fn clear(&mut self) {
        self.0 = None;
    }
}

/// Creates directory `path` with `mode` and owner, or fixes the mode and owner of an
/// existing one. The common case (a new directory in a directory already open) is
/// `mkdirat`, `openat`, `fchmod` and maybe `fchown`; anything else (an existing
/// symlink in an image, say) takes the general path through the root.
fn dir_in<S: MountSyscalls>(
    kernel: &S,
    r: &S::Fd,
    parents: &mut ParentDir<S::Fd>,
    path: &str,
    mode: u32,
    uid: u32,
    gid: u32,
) -> Result<(), MountError> {
    let mut fast = || -> io::Result<()> {
        let (pfd, name) = parents.get(kernel, r, path)?;
        match kernel.mkdirat(pfd, &name, 0o700) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(e),
        }
        // Refuses a symlink (ELOOP) or a non-directory (ENOTDIR): the general path.
        let dir = kernel.open_dir_nofollow(pfd, &name)?;
        kernel.fchmod(&dir, mode)?;
        if uid != 0 || gid != 0 {
            kernel.fchown(&dir, uid, gid)?;
        }
        Ok(())
    };
    if fast().is_ok() {
        return Ok(());
    }
    let fd = ensure(kernel, r, path, Kind::Dir).map_err(in_root_err("mkdir", path))?;
    kernel
        .chmod_fd_path(&fd, mode)
        .map_err(apply_err("chmod", path))?;
    if uid != 0 || gid != 0 {
        kernel
            .fchown(&fd, uid, gid)
            .map_err(apply_err("chown", path))?;
    }
    Ok(())
}

/// Binds host path `source` at `path` under the root `r`. A detached copy of the
/// source tree is made read-only before it is attached: three syscalls and no
/// /proc/self/fd path lookups. A missing source is skipped unless `required`.
pub(crate) fn bind_in(
    r: &OwnedFd,
    source: &Path,
    path: &str,
    readonly: bool,
    kind: Kind,
    required: bool,
) -> Result<(), MountError> {
    bind_in_with(&Kernel, r, source, path, readonly, kind, required)
}

/// [`bind_in`], making its system calls through `kernel`.
fn bind_in_with<S: MountSyscalls>(
    kernel: &S,
    r: &S::Fd,
    source: &Path,
    path: &str,
    readonly: bool,
    kind: Kind,
    required: bool,
) -> Result<(), MountError> {
    let sc = sys::cstr(source).map_err(apply_err("bind", path))?;
    let tree = match kernel.open_tree_clone(&sc) {
        Ok(fd) => fd,
        Err(_) if !required => return Ok(()),
        Err(e) => {
            return Err(MountError::Apply {
                op: "open bind source",
                path: source.display().to_string(),
                source: e,
            })
        }
    };
    let device = !readonly && kernel.is_device(source);
    attach_bind(kernel, r, tree, path, readonly, kind, device)
}

/// Binds the host's `path` read-only at the same path under the root, through the
/// parent directory `parents` keeps open (the directory it keeps is the parent of
/// `path`, which a mount at `path` does not cover): a detached copy, its flags, the
/// target made, the attach; no lookup from the root per entry. An entry the root
/// has already (an image's) is resolved in the root instead. A host entry that is
/// gone is skipped.
fn bind_host_entry<S: MountSyscalls>(
    kernel: &S,
    r: &S::Fd,
    parents: &mut ParentDir<S::Fd>,
    path: &str,
    kind: Kind,
) -> Result<(), MountError> {
    let sc = CString::new(path).map_err(|_| MountError::Apply {
        op: "bind",
        path: path.to_string(),
        source: io::ErrorKind::InvalidInput.into(),
    })?;
    let Ok(tree) = kernel.open_tree_clone(&sc) else {
        return Ok(());
    };
    make_readonly(kernel, &tree, true, 0).map_err(apply_err("make read-only", path))?;
    let (pfd, name) = parents
        .get(kernel, r, path)
        .map_err(in_root_err("create bind target", path))?;
    let made = match kind {
        Kind::File => kernel.create_file_at(pfd, &name, 0o644),
        Kind::Dir => kernel.mkdirat(pfd, &name, 0o755),
    };
    match made {
        // Just made, so nothing but this entry is there.
        Ok(()) => kernel
            .move_mount_at(&tree, pfd, &name)
            .map_err(apply_err("bind", path)),
        // Something of the image's is there (a root with layers): resolved in the
        // root, as any other bind target.
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            let tgt =
                ensure(kernel, r, path, kind).map_err(in_root_err("create bind target", path))?;
            kernel
                .move_mount_onto(&tree, &tgt)
                .map_err(apply_err("bind", path))
        }
        Err(e) => Err(in_root_err("create bind target", path)(e)),
    }
}

/// Binds the host path `source` the spec named, pinned to the file `id`
/// ([`crate::host_path`]): opened again without following a link anywhere on the
/// way, and refused if it is no longer that file (a swap for a link to `/` after
/// the daemon checked it).
fn bind_pinned<S: MountSyscalls>(
    kernel: &S,
    r: &S::Fd,
    source: &Path,
    id: HostId,
    path: &str,
    readonly: bool,
    kind: Kind,
) -> Result<(), MountError> {
    let (src, mode) = kernel
        .reopen_pinned(source, id)
        .map_err(|e| MountError::Apply {
            op: "open bind source",
            path: source.display().to_string(),
            source: e,
        })?;
    let tree = kernel
        .open_tree_clone_fd(&src, true)
        .map_err(|e| MountError::Apply {
            op: "open bind source",
            path: source.display().to_string(),
            source: e,
        })?;
    let device = matches!(mode & libc::S_IFMT, libc::S_IFCHR | libc::S_IFBLK);
    attach_bind(kernel, r, tree, path, readonly, kind, device)
}

/// Attaches the detached bind `tree` at `path` under the root: read-only, or
/// writable, `nosuid` and (unless `device`) `nodev`.
fn attach_bind<S: MountSyscalls>(
    kernel: &S,
    r: &S::Fd,
    tree: S::Fd,
    path: &str,
    readonly: bool,
    kind: Kind,
    device: bool,
) -> Result<(), MountError> {
    if readonly {
        make_readonly(kernel, &tree, true, 0).map_err(apply_err("make read-only", path))?;
    } else {
        // Writable binds are `nosuid`, and `nodev` unless they are a device node
        // themselves (`/dev/null` and the like).
        let mut set = sys::MOUNT_ATTR_NOSUID;
        if !device {
            set |= sys::MOUNT_ATTR_NODEV;
        }
        kernel
            .mount_setattr(&tree, true, set)
            .map_err(apply_err("make nosuid", path))?;
    }
    let tgt = ensure(kernel, r, path, kind).map_err(in_root_err("create bind target", path))?;
    kernel
        .move_mount_onto(&tree, &tgt)
        .map_err(apply_err("bind", path))
}

/// Applies `ops` under the root mounted at `root_dir`. Runs as root of the sandbox's
/// user namespace, in its own mount namespace, before `pivot_root`.
pub fn apply(root_dir: &Path, ops: &[MountOp]) -> Result<(), MountError> {
    apply_with_trees(root_dir, ops, &mut [], None)
}

/// [`apply`], with the idmapped trees [`MountOp::IdmappedBind`] refers to and the
/// fork server's `/etc` view for [`MountOp::HostEtc`] (consumed; dropped if unused).
pub fn apply_with_trees(
    root_dir: &Path,
    ops: &[MountOp],
    trees: &mut [Option<OwnedFd>],
    etc_view: Option<OwnedFd>,
) -> Result<(), MountError> {
    apply_ops(&Kernel, root_dir, ops, trees, etc_view)
}

/// [`apply_with_trees`], making its system calls through `kernel`.
fn apply_ops<S: MountSyscalls>(
    kernel: &S,
    root_dir: &Path,
    ops: &[MountOp],
    trees: &mut [Option<S::Fd>],
    mut etc_view: Option<S::Fd>,
) -> Result<(), MountError> {
    let rc = sys::cstr(root_dir).map_err(apply_err("open root", root_dir.display().to_string()))?;
    let root = kernel
        .open_path(&rc, false)
        .map_err(apply_err("open root", root_dir.display().to_string()))?;
    let r = &root;
    let mut parents = ParentDir::default();
    let mut empty = EmptyDir::default();
    // The sandbox user's ids, resolved once for the secret files that need them.
    let mut sandbox_user: Option<(u32, u32)> = None;
    for op in ops {
        if !matches!(
            op,
            MountOp::Dir { .. }
                | MountOp::Symlink { .. }
                | MountOp::File { .. }
                | MountOp::SecretFile { .. }
        ) {
            parents.clear();
        }
        match op {
            MountOp::Dir {
                path,
                mode,
                uid,
                gid,
            } => dir_in(kernel, r, &mut parents, path, *mode, *uid, *gid)?,
            MountOp::Symlink { path, target } => symlink_in(kernel, r, &mut parents, path, target)?,
            MountOp::File {
                path,
                contents,
                mode,
            } => {
                let (pfd, name) = parents
                    .get(kernel, r, path)
                    .map_err(in_root_err("write", path))?;
                // The runtime's own file (`/etc/hosts`, `/etc/hostname`...) takes
                // the place of a link or a FIFO the image has there: it is removed,
                // never followed or waited on, then the file written.
                let written = match kernel.write_at(pfd, &name, contents.as_bytes(), *mode) {
                    Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENXIO)) => kernel
                        .unlinkat(pfd, &name)
                        .and_then(|()| kernel.write_at(pfd, &name, contents.as_bytes(), *mode)),
                    other => other,
                };
                written.map_err(in_root_err("write", path))?;
            }
            MountOp::SecretFile {
                path,
                contents,
                mode,
                uid,
                gid,
                user,
            } => {
                let (uid, gid) = match (uid, gid) {
                    (Some(u), Some(g)) => (*u, *g),
                    _ => {
                        let u =
                            sandbox_user.get_or_insert_with(|| resolve_in_root(kernel, r, user));
                        (uid.unwrap_or(u.0), gid.unwrap_or(u.1))
                    }
                };
                let (pfd, name) = parents
                    .get(kernel, r, path)
                    .map_err(in_root_err("write", path))?;
                kernel
                    .write_owned_at(pfd, &name, contents.0.as_bytes(), *mode, uid, gid)
                    .map_err(|e| match e.raw_os_error() {
                        // The spec's secrets, not the host's disk.
                        Some(libc::ENOSPC) => MountError::InRoot {
                            op: "write",
                            path: path.clone(),
                            problem: "does not fit: a sandbox's secret files share \
                                      /run/secrets, a tmpfs of 1 MiB in which each file \
                                      takes at least 4 KiB",
                            source: e,
                        },
                        _ => in_root_err("write", path)(e),
                    })?;
            }
            MountOp::Bind {
                source,
                path,
                readonly,
                kind,
                required,
                pinned,
            } => match pinned {
                Some(id) => bind_pinned(kernel, r, source, *id, path, *readonly, *kind)?,
                None => bind_in_with(kernel, r, source, path, *readonly, *kind, *required)?,
            },
            MountOp::HostEtc { entries, use_view } => {
                // The view is attached once; a failed attach falls back to binds.
                let attached = match etc_view.take().filter(|_| *use_view) {
                    Some(tree) => {
                        let tgt = ensure(kernel, r, HOST_ETC_VIEW, Kind::Dir)
                            .map_err(in_root_err("create view target", HOST_ETC_VIEW))?;
                        kernel.move_mount_onto(&tree, &tgt).is_ok()
                    }
                    None => false,
                };
                for (name, kind) in entries {
                    let path = format!("/etc/{name}");
                    match kind {
                        HostEntry::Symlink(t) => symlink_in(kernel, r, &mut parents, &path, t)?,
                        _ if attached => symlink_in(
                            kernel,
                            r,
                            &mut parents,
                            &path,
                            &format!("{HOST_ETC_VIEW}/{name}"),
                        )?,
                        HostEntry::Dir | HostEntry::File => {
                            bind_host_entry(kernel, r, &mut parents, &path, entry_kind(kind))?
                        }
                    }
                }
            }
            MountOp::Tmpfs {
                path,
                size,
                mode,
                noexec,
            } => {
                let tgt = ensure(kernel, r, path, Kind::Dir)
                    .map_err(in_root_err("create tmpfs target", path))?;
                let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
                if *noexec {
                    flags |= libc::MS_NOEXEC;
                }
                let opts = CString::new(format!("{},mode={mode:o}", size.mount_options()))
                    .expect("no NUL");
                kernel
                    .mount(
                        Some(c"tmpfs"),
                        &kernel.fd_path(&tgt),
                        Some(c"tmpfs"),
                        flags,
                        Some(&opts),
                    )
                    .map_err(apply_err("mount tmpfs", path))?;
            }
            MountOp::Proc { path } => {
                let tgt = ensure(kernel, r, path, Kind::Dir)
                    .map_err(in_root_err("create proc target", path))?;
                let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
                kernel
                    .mount(
                        Some(c"proc"),
                        &kernel.fd_path(&tgt),
                        Some(c"proc"),
                        flags,
                        None,
                    )
                    .map_err(apply_err("mount proc", path))?;
            }
            MountOp::Sysfs { path } => {
                let tgt = ensure(kernel, r, path, Kind::Dir)
                    .map_err(in_root_err("create sysfs target", path))?;
                let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RDONLY;
                // Refused when the host's sysfs is not fully visible; /sys then stays empty.
                let _ = kernel.mount(
                    Some(c"sysfs"),
                    &kernel.fd_path(&tgt),
                    Some(c"sysfs"),
                    flags,
                    None,
                );
            }
            MountOp::Devpts { path } => {
                let tgt = ensure(kernel, r, path, Kind::Dir)
                    .map_err(in_root_err("create devpts target", path))?;
                let flags = libc::MS_NOSUID | libc::MS_NOEXEC;
                kernel
                    .mount(
                        Some(c"devpts"),
                        &kernel.fd_path(&tgt),
                        Some(c"devpts"),
                        flags,
                        Some(c"newinstance,ptmxmode=0666,mode=0620"),
                    )
                    .map_err(apply_err("mount devpts", path))?;
            }
            MountOp::MaskFile { path } => {
                if !exists_in_root(kernel, r, path) {
                    continue;
                }
                let tgt = ensure(kernel, r, path, Kind::File).map_err(apply_err("mask", path))?;
                let null = kernel
                    .open_in_root(r, c"/dev/null")
                    .map_err(apply_err("open", "/dev/null"))?;
                kernel
                    .mount(
                        Some(&kernel.fd_path(&null)),
                        &kernel.fd_path(&tgt),
                        None,
                        libc::MS_BIND,
                        None,
                    )
                    .map_err(apply_err("mask", path))?;
            }
            MountOp::MaskDir { path } => {
                if !exists_in_root(kernel, r, path) {
                    continue;
                }
                let tgt = ensure(kernel, r, path, Kind::Dir).map_err(apply_err("mask", path))?;
                match empty.bind(kernel, r) {
                    Ok(tree) => kernel.move_mount_onto(&tree, &tgt),
                    Err(_) => mask_with_tmpfs(kernel, &tgt),
                }
                .map_err(apply_err("mask", path))?;
            }
            MountOp::IdmappedBind {
                index,
                source,
                path,
                readonly,
            } => {
                let tgt = ensure(kernel, r, path, Kind::Dir)
                    .map_err(in_root_err("create volume target", path))?;
                let tree = trees.get_mut(*index).and_then(Option::take);
                let moved = tree.is_some_and(|t| kernel.move_mount_onto(&t, &tgt).is_ok());
                if !moved {
                    // No idmapped tree: a plain bind (files then show as nobody).
                    let sc = sys::cstr(source).map_err(apply_err("bind", path))?;
                    let src = kernel
                        .open_path(&sc, false)
                        .map_err(apply_err("open volume", path))?;
                    kernel
                        .mount(
                            Some(&kernel.fd_path(&src)),
                            &kernel.fd_path(&tgt),
                            None,
                            libc::MS_BIND | libc::MS_REC,
                            None,
                        )
                        .map_err(apply_err("bind", path))?;
                }
                // Set here, once the tree is in the sandbox's mount namespace: the
                // helper's detached tree belongs to the host's.
                if *readonly {
                    remount_readonly(kernel, r, path, true)
                        .map_err(apply_err("make read-only", path))?;
                } else {
                    remount_nosuid(kernel, r, path).map_err(apply_err("make nosuid", path))?;
                }
            }
            MountOp::ReadOnly { path } => {
                if !exists_in_root(kernel, r, path) {
                    continue;
                }
                let tgt =
                    ensure(kernel, r, path, Kind::Dir).map_err(apply_err("read-only", path))?;
                let p = kernel.fd_path(&tgt);
                kernel
                    .mount(Some(&p), &p, None, libc::MS_BIND | libc::MS_REC, None)
                    .map_err(apply_err("read-only bind", path))?;
                remount_readonly(kernel, r, path, true).map_err(apply_err("read-only", path))?;
            }
        }
    }
    empty
        .remove(kernel)
        .map_err(apply_err("remove the mask source", "/dev/.sandlot-mask"))
}

/// Where the sandbox's masked directories come from: one empty directory made in
/// its `/dev`, bound read-only over each masked directory, and removed once the
/// plan is applied ([`EmptyDir::remove`]).
///
/// Why not an empty tmpfs per mask, as runc does: every superblock registers a
/// shrinker, and each memory cgroup on the host keeps bookkeeping sized by the most
/// shrinkers the host has ever had (see `docs/benchmarks.md`, density). A bind makes
/// no superblock. A removed directory stays empty: the kernel refuses new entries in
/// it, and no path in the sandbox leads to it but the masks themselves. Until then
/// only this setup runs in the sandbox. Failing to remove it fails the create: left
/// in `/dev`, it would let the sandbox's root put entries under every mask.
struct EmptyDir<F> {
    /// `/dev`, once the directory is made in it ([`EmptyDir::remove`] must run).
    dev: Option<F>,
    /// The directory, opened once for all masks.
    dir: Option<F>,
}

impl<F> Default for EmptyDir<F> {
    fn default() -> Self {
        EmptyDir {
            dev: None,
            dir: None,
        }
    }
}

impl<F> EmptyDir<F> {
    const NAME: &'static CStr = c".sandlot-mask";

    /// A detached, read-only bind of the empty directory, ready to attach.
    fn bind<S: MountSyscalls<Fd = F>>(&mut self, kernel: &S, r: &F) -> io::Result<F> {
        let dir = match &mut self.dir {
            Some(dir) => dir,
            none => {
                if self.dev.is_none() {
                    let dev = ensure(kernel, r, "/dev", Kind::Dir)?;
                    kernel.mkdirat(&dev, Self::NAME, 0o555)?;
                    self.dev = Some(dev);
                }
                let dev = self.dev.as_ref().expect("set above");
                none.insert(kernel.open_dir_nofollow(dev, Self::NAME)?)
            }
        };
        let tree = kernel.open_tree_clone_fd(dir, false)?;
        make_readonly(kernel, &tree, false, sys::MOUNT_ATTR_NOEXEC)?;
        Ok(tree)
    }

    /// Removes the directory from `/dev`; the masks keep it, empty for good.
    fn remove<S: MountSyscalls<Fd = F>>(self, kernel: &S) -> io::Result<()> {
        match self.dev {
            Some(dev) => kernel.rmdirat(&dev, Self::NAME),
            None => Ok(()),
        }
    }
}

/// Masks the directory `tgt` with an empty read-only tmpfs: the fallback when the
/// kernel refuses [`EmptyDir::bind`] (a detached clone, or making it read-only).
fn mask_with_tmpfs<S: MountSyscalls>(kernel: &S, tgt: &S::Fd) -> io::Result<()> {
    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    kernel.mount(
        Some(c"tmpfs"),
        &kernel.fd_path(tgt),
        Some(c"tmpfs"),
        flags,
        Some(c"size=0"),
    )
}

/// The uid and primary gid of `user` (a spec's user: `root`, `user`, `UID[:GID]` or a
/// name) in the `/etc/passwd` and `/etc/group` under `root`, as the agent resolves it
/// for the processes it starts; root's when it does not resolve (the agent then
/// refuses to start anything as that user).
fn resolve_in_root<S: MountSyscalls>(kernel: &S, root: &S::Fd, user: &str) -> (u32, u32) {
    /// More than any real account database; an image's files are untrusted.
    const LIMIT: u64 = 4 << 20;
    let read = |p: &CStr| {
        kernel
            .read_in_root(root, p, LIMIT)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    };
    let passwd = read(c"/etc/passwd");
    let group = read(c"/etc/group");
    sandlot_proto::users::resolve_user(user, &passwd, &group)
        .map(|u| (u.uid, u.gid))
        .unwrap_or((0, 0))
}
