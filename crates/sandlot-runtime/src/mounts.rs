//! The sandbox's filesystem: a mount plan computed as data from the spec and host
//! facts ([`plan_mounts`], pure, unit-tested), then applied in one place inside the
//! sandbox's mount namespace ([`apply`]).
//!
//! Paths in the plan are inside the sandbox (`/etc/passwd`). [`apply`] resolves each of
//! them under the new root with `openat2(RESOLVE_IN_ROOT)`, so symlinks in a
//! user-supplied rootfs cannot redirect a mount or a write outside it.

use std::io;
use std::path::{Path, PathBuf};

use sandlot_proto::spec::TmpfsLimit;
use serde::{Deserialize, Serialize};

use crate::host_path::{self, HostId, PinError, PinnedPath};
use crate::hostimage::{self, HostEntry, HostFacts};

mod apply;
pub(crate) use apply::bind_in;
pub use apply::{apply, apply_with_trees, mount_layers, mount_root, RootInfo};

/// The writable root filesystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RootFs {
    /// A size-limited tmpfs (the `host` image: everything else is bound into it).
    /// Sizes of the writable layer are the spec's
    /// [`SandboxSpec::memory_backed`](sandlot_proto::spec::SandboxSpec::memory_backed).
    Tmpfs { size: TmpfsLimit },
    /// An overlay of a read-only host directory under a size-limited tmpfs upper layer.
    /// `lower` is a pinned path ([`crate::host_path`]): it is mounted only if it is
    /// still the directory `lower_id`, reached without following a link.
    Overlay {
        lower: PathBuf,
        lower_id: HostId,
        size: TmpfsLimit,
    },
    /// An image from the store: an overlay of its layer directories (top first),
    /// each idmapped, under a writable layer that is either a size-limited tmpfs
    /// inside the sandbox or, with `rw`, the `upper/` and `work/` directories of a
    /// host directory the caller prepared (idmapped too, so the caller can read the
    /// writable layer with in-sandbox ownership, e.g. to snapshot it).
    Layers {
        lowers: Vec<PathBuf>,
        rw: Option<PathBuf>,
        size: TmpfsLimit,
    },
}

/// An image resolved by the caller (the daemon or the CLI, from the image store)
/// for [`crate::CreateOptions::image`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageRoot {
    /// Overlay lower directories, **top first**; each in overlay format (whiteouts
    /// are character devices 0:0, opaque directories carry `user.overlay.opaque`).
    pub layers: Vec<PathBuf>,
    /// Host directory holding `upper/` and `work/` for the writable layer.
    pub rw: Option<PathBuf>,
    /// The image config's environment (`KEY=VALUE`), under the spec's.
    pub env: Vec<String>,
    /// The image config's working directory, unless the spec gives one.
    pub workdir: Option<String>,
    /// The image config's user, unless the spec names one other than `root`.
    pub user: Option<String>,
    /// The layers go on top of the `host` image (a snapshot of a `host` sandbox):
    /// the host's entries are bound and `/etc` synthesized over them as for the
    /// `host` image.
    pub on_host: bool,
}

/// A host directory bound with the identity idmap of the sandbox (files owned by
/// uid N on disk are owned by uid N inside, in every sandbox): named volumes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedDir {
    pub source: PathBuf,
    pub target: String,
    pub readonly: bool,
}

/// How a path is created when it does not exist yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    Dir,
    File,
}

/// A secret's value in a plan: serialized as the string, never shown by `Debug` (a
/// plan or mount op in a log line must not carry it).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretText(pub String);

impl std::fmt::Debug for SecretText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<secret, {} bytes>", self.0.len())
    }
}

/// One step of building the sandbox filesystem. Paths are inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MountOp {
    Dir {
        path: String,
        mode: u32,
        uid: u32,
        gid: u32,
    },
    Symlink {
        path: String,
        target: String,
    },
    File {
        path: String,
        contents: String,
        mode: u32,
    },
    /// A secret file, created with no access, then given its owner and `mode`. An
    /// owner or group left `None` is `user`'s (the sandbox's user, resolved against
    /// the root's `/etc/passwd` and `/etc/group` when this op runs; root if it does not
    /// resolve there).
    SecretFile {
        path: String,
        contents: SecretText,
        mode: u32,
        uid: Option<u32>,
        gid: Option<u32>,
        user: String,
    },
    /// Bind a host path. `required: false` skips it when the host path is gone.
    /// With `pinned` (a host path the spec named, [`crate::host_path`]) the source is
    /// opened without following a link and bound only if it is still that file.
    Bind {
        source: PathBuf,
        path: String,
        readonly: bool,
        kind: Kind,
        required: bool,
        #[serde(default)]
        pinned: Option<HostId>,
    },
    Tmpfs {
        path: String,
        size: TmpfsLimit,
        mode: u32,
        noexec: bool,
    },
    Proc {
        path: String,
    },
    /// sysfs, read-only. Skipped when the kernel refuses it.
    Sysfs {
        path: String,
    },
    Devpts {
        path: String,
    },
    /// Cover a file with `/dev/null` (if the file exists).
    MaskFile {
        path: String,
    },
    /// Cover a directory (if it exists) with a read-only bind of one empty directory,
    /// removed once the plan is applied (no superblock of its own; an empty
    /// read-only tmpfs on a kernel that refuses that bind).
    MaskDir {
        path: String,
    },
    /// Make an existing mount point read-only (bind it onto itself first).
    ReadOnly {
        path: String,
    },
    /// The `host` image's allow-listed host `/etc` entries. With `use_view` and the
    /// fork server's prepared view (see [`crate::etc_view`]) the view is attached
    /// read-only once at [`HOST_ETC_VIEW`] and each entry becomes a symlink into it,
    /// so that `/etc` stays a writable directory of the sandbox; otherwise each entry
    /// is bound read-only on its own (a host entry that is gone is skipped either
    /// way). `use_view` is false when a spec mount would cover the view.
    HostEtc {
        entries: Vec<(String, HostEntry)>,
        use_view: bool,
    },
    /// Bind a host directory through an idmapped mount the helper prepared
    /// (`SandboxPlan::idmap_sources`, entry `index`); a plain bind if the kernel
    /// refused the idmap.
    IdmappedBind {
        index: usize,
        source: PathBuf,
        path: String,
        readonly: bool,
    },
}

/// Mount points at or under `dir` in a mountinfo text. Pure.
pub fn mount_points_under(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some(mp) = line.split(' ').nth(4) else {
            continue;
        };
        let p = PathBuf::from(unescape_mountinfo(mp));
        if p.starts_with(dir) && !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// Mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = std::str::from_utf8(&b[i + 1..i + 4]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(oct, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The whole filesystem of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountPlan {
    pub root: RootFs,
    pub ops: Vec<MountOp>,
}

impl MountPlan {
    /// Whether the plan uses host paths that may be mounts the host made after the
    /// fork server started: an image's writable layer (a tmpfs the daemon mounts
    /// per sandbox), or binds of host paths other than the `host` image's own (its
    /// top-level directories and `/dev` nodes): spec mounts, volumes, collection
    /// and memory mounts. Such a sandbox is built in the host's mount namespace
    /// (see [`crate::zygote`]).
    pub fn needs_host_mounts(&self) -> bool {
        if matches!(self.root, RootFs::Layers { rw: Some(_), .. }) {
            return true;
        }
        self.ops.iter().any(|op| match op {
            MountOp::Bind { source, .. } => !is_host_image_source(source),
            MountOp::IdmappedBind { .. } => true,
            _ => false,
        })
    }
}

/// `/usr`, `/lib64`, ... or `/dev/null`, ...: what every `host` image sandbox binds.
fn is_host_image_source(p: &Path) -> bool {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    match p.parent().and_then(|d| d.to_str()) {
        Some("/") => crate::hostimage::TOP_LEVEL.contains(&name),
        Some("/dev") => true,
        _ => false,
    }
}

/// Errors of planning and applying mounts. The messages name host paths (for the
/// local CLI and the daemon's log); which variant it is tells whose mistake it is:
/// the spec's ([`MissingSource`](Self::MissingSource) of `mounts[index]`,
/// [`MissingRootfs`](Self::MissingRootfs)) or the caller's of the runtime (a layer
/// or shared directory it resolved).
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The host path of the spec's bind mount `mounts[index]` does not exist.
    #[error("mount source {path} does not exist on the host")]
    MissingSource { index: usize, path: PathBuf },
    /// The spec's `rootfs` is not a directory.
    #[error("rootfs {path} is not a directory on the host")]
    MissingRootfs { path: PathBuf },
    /// A layer (or the writable layer) of a resolved image is not a directory.
    #[error("image layer {path} is not a directory on the host")]
    MissingLayer { path: PathBuf },
    /// A shared directory given in the create options (a volume, a memory store,
    /// a collection mount) is not a directory.
    #[error("shared directory {path} is not a directory on the host")]
    MissingShared { path: PathBuf },
    #[error("mount source {path}: {source}")]
    HostPath {
        path: String,
        #[source]
        source: PinError,
    },
    #[error("mount source {path} was not resolved by the caller")]
    NotPinned { path: String },
    #[error("{op} {path}: {source}")]
    Apply {
        op: &'static str,
        path: String,
        source: io::Error,
    },
    /// The sandbox's own files (its image, its writable layer) make step `op` at
    /// `path` (a path inside the sandbox, never a host path) impossible: a link
    /// that loops, a file where a directory must be. The tenant's to mend.
    #[error("{path} in the sandbox {problem}")]
    InRoot {
        op: &'static str,
        path: String,
        problem: &'static str,
        /// What the kernel said (for the daemon's log).
        #[source]
        source: io::Error,
    },
}

fn apply_err(op: &'static str, path: impl Into<String>) -> impl FnOnce(io::Error) -> MountError {
    let path = path.into();
    move |source| MountError::Apply { op, path, source }
}

/// What an error of a step on sandbox path `path` says of the sandbox's own
/// files, if it is theirs to answer for (see [`MountError::InRoot`]).
pub fn in_root_problem(e: &io::Error) -> Option<&'static str> {
    Some(match e.raw_os_error()? {
        libc::ELOOP => "is a symbolic link where none may be, or a loop of links",
        libc::ENOTDIR => "is reached through a file where a directory must be, or is no directory",
        libc::EISDIR => "is a directory where a file must be",
        libc::ENOENT => "leads through a symbolic link to nothing",
        libc::ENAMETOOLONG => "has a name too long (a part over 255 bytes, or over 4096 in all)",
        _ => return None,
    })
}

/// [`apply_err`] for a step on a path inside the sandbox that its own files can
/// make impossible: [`MountError::InRoot`] for those errors, `Apply` otherwise.
fn in_root_err(op: &'static str, path: impl Into<String>) -> impl FnOnce(io::Error) -> MountError {
    let path = path.into();
    move |source| match in_root_problem(&source) {
        Some(problem) => MountError::InRoot {
            op,
            path,
            problem,
            source,
        },
        None => MountError::Apply { op, path, source },
    }
}

/// Inputs of the plan besides the spec.
#[derive(Debug, Clone)]
pub struct PlanInput<'a> {
    pub spec: &'a sandlot_proto::spec::SandboxSpec,
    pub hostname: &'a str,
    pub host: &'a HostFacts,
    /// A store image instead of `host` or `spec.rootfs`.
    pub image: Option<&'a ImageRoot>,
    /// Named volumes, bound idmapped after the spec's mounts.
    pub shared: &'a [SharedDir],
    /// Files under `/run/secrets`, on a tmpfs of their own (never in the writable
    /// layer, so never in a snapshot).
    pub secret_files: &'a [crate::SecretFile],
    /// The spec's host paths as the caller resolved them ([`crate::CreateOptions::pinned`]);
    /// `None`: resolved here.
    pub pinned: Option<&'a [PinnedPath]>,
}

/// The host path `requested` of the spec (its `mounts[index]`), pinned: the caller's
/// pin, or resolved here when the caller has none.
fn pinned_source(
    inp: &PlanInput<'_>,
    index: usize,
    requested: &str,
) -> Result<PinnedPath, MountError> {
    match inp.pinned {
        Some(pins) => pins
            .iter()
            .find(|p| p.requested == requested)
            .cloned()
            .ok_or_else(|| MountError::NotPinned {
                path: requested.to_string(),
            }),
        None => host_path::pin(requested, None).map_err(|e| match e {
            PinError::Missing { .. } => MountError::MissingSource {
                index,
                path: PathBuf::from(requested),
            },
            source => MountError::HostPath {
                path: requested.to_string(),
                source,
            },
        }),
    }
}

/// `/proc` files that leak host information or allow host actions, masked like runc.
pub const PROC_MASKED_FILES: &[&str] = &[
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/sysrq-trigger",
];
pub const PROC_MASKED_DIRS: &[&str] = &["/proc/acpi", "/proc/scsi"];
pub const PROC_READONLY: &[&str] = &["/proc/sys", "/proc/irq", "/proc/bus", "/proc/fs"];
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Computes the mount plan. Checks host paths of bind mounts and the rootfs (they
/// must exist) but changes nothing.
pub fn plan_mounts(inp: &PlanInput<'_>) -> Result<MountPlan, MountError> {
    let spec = inp.spec;
    // Every tmpfs sized from one memory budget: filling them never OOM-kills PID 1.
    let memory_backed = spec.memory_backed();
    let disk = memory_backed.writable;
    let mut ops = Vec::new();
    let root = match (&spec.rootfs, inp.image) {
        (_, Some(img)) => {
            if img.layers.is_empty() {
                return Err(MountError::MissingLayer {
                    path: PathBuf::from("<image with no layers>"),
                });
            }
            for l in img.layers.iter().chain(img.rw.iter()) {
                if !l.is_dir() {
                    return Err(MountError::MissingLayer { path: l.clone() });
                }
            }
            RootFs::Layers {
                lowers: img.layers.clone(),
                rw: img.rw.clone(),
                size: disk,
            }
        }
        (Some(dir), None) => {
            let pin = match pinned_source(inp, 0, dir) {
                Err(MountError::MissingSource { path, .. }) => {
                    return Err(MountError::MissingRootfs { path })
                }
                r => r?,
            };
            if !pin.dir {
                return Err(MountError::MissingRootfs {
                    path: PathBuf::from(dir),
                });
            }
            RootFs::Overlay {
                lower: pin.path,
                lower_id: pin.id,
                size: disk,
            }
        }
        (None, None) => RootFs::Tmpfs { size: disk },
    };
    // The `host` image's root is a tmpfs; a snapshot of one is layers on top of it.
    let host_root = matches!(root, RootFs::Tmpfs { .. });
    let host_image = host_root || inp.image.is_some_and(|i| i.on_host);
    if host_image {
        for (name, kind) in &inp.host.top_level {
            let path = format!("/{name}");
            match kind {
                HostEntry::Symlink(t) => ops.push(MountOp::Symlink {
                    path,
                    target: t.clone(),
                }),
                HostEntry::Dir => ops.push(MountOp::Bind {
                    source: PathBuf::from(&path),
                    path,
                    readonly: true,
                    kind: Kind::Dir,
                    required: true,
                    pinned: None,
                }),
                HostEntry::File => {}
            }
        }
        ops.push(MountOp::Dir {
            path: "/etc".into(),
            mode: 0o755,
            uid: 0,
            gid: 0,
        });
        for (name, contents, mode) in hostimage::synthesized_etc(inp.hostname) {
            ops.push(MountOp::File {
                path: format!("/etc/{name}"),
                contents,
                mode,
            });
        }
        ops.push(MountOp::Symlink {
            path: "/etc/mtab".into(),
            target: "../proc/self/mounts".into(),
        });
        ops.push(MountOp::HostEtc {
            entries: inp.host.etc.clone(),
            use_view: view_stays_visible(inp),
        });
        for (path, mode, uid) in [
            ("/tmp", 0o1777, 0),
            ("/var", 0o755, 0),
            ("/var/tmp", 0o1777, 0),
            ("/root", 0o700, 0),
            ("/home", 0o755, 0),
            ("/home/user", 0o755, sandlot_proto::spec::USER_UID),
            ("/run", 0o755, 0),
            ("/opt", 0o755, 0),
            ("/mnt", 0o755, 0),
        ] {
            ops.push(MountOp::Dir {
                path: path.into(),
                mode,
                uid,
                gid: uid,
            });
        }
    } else {
        // A rootfs directory brings its own /etc; only identity files are written.
        for (name, contents, mode) in hostimage::image_identity_files(inp.hostname) {
            ops.push(MountOp::File {
                path: format!("/etc/{name}"),
                contents,
                mode,
            });
        }
        ops.push(MountOp::Dir {
            path: "/tmp".into(),
            mode: 0o1777,
            uid: 0,
            gid: 0,
        });
    }

    // /dev: the harmless devices bound from the host, a private devpts, /dev/shm.
    // The `host` image's /dev and every /dev/shm are directories, not tmpfs mounts
    // of their own: each superblock costs every memory cgroup on the host shrinker
    // bookkeeping (docs/benchmarks.md, density). An image's /dev is a tmpfs, since
    // its root is an overlay of the image's own /dev.
    if host_root {
        ops.push(MountOp::Dir {
            path: "/dev".into(),
            mode: 0o755,
            uid: 0,
            gid: 0,
        });
    } else {
        let shm = memory_backed.shm;
        ops.push(MountOp::Tmpfs {
            path: "/dev".into(),
            size: memory_backed.dev.unwrap_or(TmpfsLimit::of_size(
                sandlot_proto::spec::memory_backed::DEV_SIZE + shm,
            )),
            mode: 0o755,
            noexec: false,
        });
    }
    for d in DEVICES {
        ops.push(MountOp::Bind {
            source: PathBuf::from(format!("/dev/{d}")),
            path: format!("/dev/{d}"),
            readonly: false,
            kind: Kind::File,
            required: true,
            pinned: None,
        });
    }
    for (path, target) in [
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
        ("/dev/ptmx", "pts/ptmx"),
        ("/dev/core", "/proc/kcore"),
    ] {
        ops.push(MountOp::Symlink {
            path: path.into(),
            target: target.into(),
        });
    }
    ops.push(MountOp::Devpts {
        path: "/dev/pts".into(),
    });
    ops.push(MountOp::Dir {
        path: "/dev/shm".into(),
        mode: 0o1777,
        uid: 0,
        gid: 0,
    });

    // /proc, with what runc masks.
    ops.push(MountOp::Proc {
        path: "/proc".into(),
    });
    for f in PROC_MASKED_FILES {
        ops.push(MountOp::MaskFile { path: (*f).into() });
    }
    for d in PROC_MASKED_DIRS {
        ops.push(MountOp::MaskDir { path: (*d).into() });
    }
    for d in PROC_READONLY {
        ops.push(MountOp::ReadOnly { path: (*d).into() });
    }
    ops.push(MountOp::Sysfs {
        path: "/sys".into(),
    });
    ops.push(MountOp::MaskDir {
        path: "/sys/firmware".into(),
    });

    // The spec's own mounts come last so they can cover image paths.
    for (index, m) in spec.mounts.iter().enumerate() {
        match m {
            sandlot_proto::spec::MountSpec::Bind {
                source,
                target,
                readonly,
            } => {
                let pin = pinned_source(inp, index, source)?;
                ops.push(MountOp::Bind {
                    source: pin.path,
                    path: sandlot_proto::spec::normalize_sandbox_path(target),
                    readonly: *readonly,
                    kind: if pin.dir { Kind::Dir } else { Kind::File },
                    required: true,
                    pinned: Some(pin.id),
                });
            }
            sandlot_proto::spec::MountSpec::Tmpfs { target, size } => ops.push(MountOp::Tmpfs {
                path: sandlot_proto::spec::normalize_sandbox_path(target),
                size: TmpfsLimit::of_size(size.bytes()),
                mode: 0o1777,
                noexec: false,
            }),
            // Resolved by the daemon into `shared` directories (the store's work tree and its
            // read-only git and index directories); nothing to do here.
            sandlot_proto::spec::MountSpec::Memory { .. } => {}
            // Served over FUSE by the daemon at a host directory it passes in `shared`.
            sandlot_proto::spec::MountSpec::Collection { .. } => {}
        }
    }
    let base = idmapped_layer_count(&root);
    for (i, v) in inp.shared.iter().enumerate() {
        if !v.source.is_dir() {
            return Err(MountError::MissingShared {
                path: v.source.clone(),
            });
        }
        ops.push(MountOp::IdmappedBind {
            index: base + i,
            source: v.source.clone(),
            path: sandlot_proto::spec::normalize_sandbox_path(&v.target),
            readonly: v.readonly,
        });
    }
    if !inp.secret_files.is_empty() {
        ops.push(MountOp::Tmpfs {
            path: SECRETS_DIR.into(),
            size: memory_backed.secrets.unwrap_or(TmpfsLimit::of_size(
                sandlot_proto::spec::memory_backed::SECRETS_SIZE,
            )),
            mode: 0o755,
            noexec: true,
        });
        let user = sandbox_user(spec, inp.image);
        for f in inp.secret_files {
            ops.push(MountOp::SecretFile {
                path: f.path.clone(),
                contents: SecretText(f.contents.clone()),
                mode: f.mode,
                uid: f.uid,
                gid: f.gid,
                user: user.clone(),
            });
        }
    }
    Ok(MountPlan { root, ops })
}

/// Where the `host` image's prepared `/etc` view is attached in a sandbox (the
/// `/run/host` convention of systemd-nspawn and Flatpak for what comes from the host).
pub const HOST_ETC_VIEW: &str = "/run/host/etc";

fn entry_kind(e: &HostEntry) -> Kind {
    if *e == HostEntry::Dir {
        Kind::Dir
    } else {
        Kind::File
    }
}

/// Whether no mount the spec asks for covers [`HOST_ETC_VIEW`] (a tmpfs at `/run`
/// would hide it and leave the `/etc` symlinks dangling).
fn view_stays_visible(inp: &PlanInput<'_>) -> bool {
    let covers = |target: &str| {
        let t = sandlot_proto::spec::normalize_sandbox_path(target);
        let t = t.trim_end_matches('/');
        t.is_empty() || HOST_ETC_VIEW == t || HOST_ETC_VIEW.starts_with(&format!("{t}/"))
    };
    !inp.spec.mounts.iter().any(|m| covers(m.target()))
        && !inp.shared.iter().any(|v| covers(&v.target))
}

/// Where secret files live in a sandbox (a tmpfs of their own).
pub const SECRETS_DIR: &str = "/run/secrets";

/// The user the sandbox's commands run as by default: the spec's, or the image's when
/// the spec says `root` (the default).
pub fn sandbox_user(spec: &sandlot_proto::spec::SandboxSpec, image: Option<&ImageRoot>) -> String {
    match image.and_then(|i| i.user.clone()) {
        Some(u) if spec.user == "root" => u,
        _ => spec.user.clone(),
    }
}

/// How many idmapped trees the root filesystem needs (lowers, then the rw dir).
fn idmapped_layer_count(root: &RootFs) -> usize {
    match root {
        RootFs::Layers { lowers, rw, .. } => lowers.len() + usize::from(rw.is_some()),
        _ => 0,
    }
}

impl MountPlan {
    /// Where the plan mounts something over the root filesystem, relative to the
    /// root (`proc`, `dev/pts`, `etc/resolv.conf` on a bind...): the runtime made
    /// stubs there to mount on, which are not the sandbox's own files.
    pub fn mount_targets(&self) -> std::collections::BTreeSet<PathBuf> {
        self.ops
            .iter()
            .filter_map(|op| match op {
                MountOp::Bind { path, .. }
                | MountOp::Tmpfs { path, .. }
                | MountOp::Proc { path }
                | MountOp::Sysfs { path }
                | MountOp::Devpts { path }
                | MountOp::MaskFile { path }
                | MountOp::MaskDir { path }
                | MountOp::IdmappedBind { path, .. } => Some(path),
                _ => None,
            })
            .filter_map(|p| {
                let rel = Path::new(p).strip_prefix("/").ok()?;
                (!rel.as_os_str().is_empty()).then(|| rel.to_path_buf())
            })
            .collect()
    }
}

impl MountPlan {
    /// Host directories the helper idmaps into the sandbox's user namespace, in
    /// order: image layers (top first), the writable layer directory, volumes.
    pub fn idmap_sources(&self) -> Vec<PathBuf> {
        let mut v = Vec::new();
        if let RootFs::Layers { lowers, rw, .. } = &self.root {
            v.extend(lowers.iter().cloned());
            v.extend(rw.iter().cloned());
        }
        for op in &self.ops {
            if let MountOp::IdmappedBind { source, .. } = op {
                v.push(source.clone());
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandlot_proto::spec::{MountSpec, SandboxSpec};

    fn facts() -> HostFacts {
        HostFacts {
            top_level: vec![
                ("usr".into(), HostEntry::Dir),
                ("bin".into(), HostEntry::Symlink("usr/bin".into())),
            ],
            etc: vec![
                ("ld.so.cache".into(), HostEntry::File),
                (
                    "os-release".into(),
                    HostEntry::Symlink("../usr/lib/os-release".into()),
                ),
            ],
        }
    }

    fn plan(spec: &SandboxSpec) -> MountPlan {
        plan_mounts(&PlanInput {
            spec,
            hostname: "sb",
            host: &facts(),
            image: None,
            shared: &[],
            secret_files: &[],
            pinned: None,
        })
        .unwrap()
    }

    #[test]
    fn a_secret_value_never_shows_in_a_plans_debug_output() {
        let op = MountOp::SecretFile {
            path: "/run/secrets/token".into(),
            contents: SecretText("hunter2-value".into()),
            mode: 0o400,
            uid: None,
            gid: None,
            user: "app".into(),
        };
        let shown = format!("{op:?}");
        assert!(
            !shown.contains("hunter2-value") && shown.contains("/run/secrets/token"),
            "{shown}"
        );
    }

    #[test]
    fn host_image_binds_usr_readonly_and_synthesizes_etc() {
        let p = plan(&SandboxSpec::default());
        // The default disk (1G) is more than the default memory (512M) holds.
        assert!(matches!(p.root, RootFs::Tmpfs { size } if size.bytes == 384 << 20));
        assert!(p.ops.contains(&MountOp::Bind {
            source: "/usr".into(),
            path: "/usr".into(),
            readonly: true,
            kind: Kind::Dir,
            required: true,
            pinned: None,
        }));
        assert!(p.ops.contains(&MountOp::Symlink {
            path: "/bin".into(),
            target: "usr/bin".into()
        }));
        assert!(p
            .ops
            .iter()
            .any(|o| matches!(o, MountOp::File { path, .. } if path == "/etc/passwd")));
        // Never the host's secrets.
        for o in &p.ops {
            if let MountOp::Bind { source, .. } = o {
                let s = source.to_string_lossy();
                assert!(
                    !s.starts_with("/etc/shadow")
                        && !s.starts_with("/root")
                        && !s.starts_with("/home")
                        && !s.starts_with("/var"),
                    "{s}"
                );
            }
        }
    }

    #[test]
    fn host_etc_is_one_op_unless_a_spec_mount_would_cover_the_view() {
        let etc = |p: &MountPlan| -> Vec<bool> {
            p.ops
                .iter()
                .filter_map(|o| match o {
                    MountOp::HostEtc { entries, use_view } => {
                        assert_eq!(*entries, facts().etc);
                        Some(*use_view)
                    }
                    _ => None,
                })
                .collect()
        };
        let p = plan(&SandboxSpec::default());
        assert_eq!(etc(&p), [true]);
        // No per-entry op for /etc is planned next to it.
        assert!(!p.ops.iter().any(|o| matches!(o,
            MountOp::Bind { path, .. } | MountOp::Symlink { path, .. }
                if path.starts_with("/etc/") && path != "/etc/mtab")));
        let with_tmpfs = |target: &str| SandboxSpec {
            mounts: vec![MountSpec::Tmpfs {
                target: target.into(),
                size: sandlot_proto::units::ByteSize::mib(1),
            }],
            ..Default::default()
        };
        for target in ["/run", "/run/", "/run/host", "/run/host/etc", "/"] {
            assert_eq!(etc(&plan(&with_tmpfs(target))), [false], "{target}");
        }
        // Mounts beside or inside the view leave it in use.
        for target in ["/run/secrets2", "/runner", "/run/host/etc/x", "/etc"] {
            assert_eq!(etc(&plan(&with_tmpfs(target))), [true], "{target}");
        }
        // A volume (or memory or collection mount) at /run covers it too.
        let p = plan_mounts(&PlanInput {
            spec: &SandboxSpec::default(),
            hostname: "sb",
            host: &facts(),
            image: None,
            shared: &[SharedDir {
                source: "/".into(),
                target: "/run".into(),
                readonly: true,
            }],
            secret_files: &[],
            pinned: None,
        })
        .unwrap();
        assert_eq!(etc(&p), [false]);
    }

    /// Only plans that bind host paths beyond the `host` image's own are built in
    /// the host's mount namespace (the fork server works in a smaller copy).
    #[test]
    fn only_spec_mounts_volumes_and_writable_layers_need_the_hosts_mount_table() {
        assert!(!plan(&SandboxSpec::default()).needs_host_mounts());
        let tmpfs = SandboxSpec {
            mounts: vec![MountSpec::Tmpfs {
                target: "/data".into(),
                size: sandlot_proto::units::ByteSize::mib(1),
            }],
            ..Default::default()
        };
        assert!(!plan(&tmpfs).needs_host_mounts());
        for source in ["/tmp", "/usr/share", "/"] {
            let bind = SandboxSpec {
                mounts: vec![MountSpec::Bind {
                    source: source.into(),
                    target: "/data".into(),
                    readonly: true,
                }],
                ..Default::default()
            };
            assert!(plan(&bind).needs_host_mounts(), "{source}");
        }
        let volume = plan_mounts(&PlanInput {
            spec: &SandboxSpec::default(),
            hostname: "sb",
            host: &facts(),
            image: None,
            shared: &[SharedDir {
                source: "/usr".into(),
                target: "/data".into(),
                readonly: true,
            }],
            secret_files: &[],
            pinned: None,
        })
        .unwrap();
        assert!(volume.needs_host_mounts());
        // An image's writable layer is a tmpfs the daemon mounts per sandbox.
        let image = |rw: Option<PathBuf>| {
            plan_mounts(&PlanInput {
                spec: &SandboxSpec::default(),
                hostname: "sb",
                host: &facts(),
                image: Some(&ImageRoot {
                    layers: vec![std::env::temp_dir()],
                    rw,
                    ..Default::default()
                }),
                shared: &[],
                secret_files: &[],
                pinned: None,
            })
            .unwrap()
        };
        assert!(image(Some(std::env::temp_dir())).needs_host_mounts());
        assert!(!image(None).needs_host_mounts());
        assert!(is_host_image_source(Path::new("/lib64")));
        assert!(is_host_image_source(Path::new("/dev/null")));
        assert!(!is_host_image_source(Path::new("/etc")));
        assert!(!is_host_image_source(Path::new("/usr/lib")));
    }

    #[test]
    fn proc_is_masked_after_it_is_mounted() {
        let p = plan(&SandboxSpec::default());
        let pos = |want: &MountOp| p.ops.iter().position(|o| o == want).unwrap();
        let proc_at = pos(&MountOp::Proc {
            path: "/proc".into(),
        });
        assert!(
            pos(&MountOp::MaskFile {
                path: "/proc/kcore".into()
            }) > proc_at
        );
        assert!(
            pos(&MountOp::ReadOnly {
                path: "/proc/sys".into()
            }) > proc_at
        );
        let dev = pos(&MountOp::Dir {
            path: "/dev".into(),
            mode: 0o755,
            uid: 0,
            gid: 0,
        });
        assert!(dev < proc_at, "/dev/null must exist before masks use it");
        let null = pos(&MountOp::Bind {
            source: "/dev/null".into(),
            path: "/dev/null".into(),
            readonly: false,
            kind: Kind::File,
            required: true,
            pinned: None,
        });
        assert!(null < proc_at);
    }

    /// Each superblock a sandbox mounts costs every memory cgroup on the host
    /// shrinker bookkeeping: the `host` image mounts only its root, devpts, proc
    /// and sysfs; an image root adds its `/dev` tmpfs, which holds `/dev/shm`.
    #[test]
    fn dev_and_shm_are_directories_not_superblocks() {
        let superblocks = |p: &MountPlan| -> Vec<String> {
            p.ops
                .iter()
                .filter_map(|o| match o {
                    MountOp::Tmpfs { path, .. }
                    | MountOp::Proc { path }
                    | MountOp::Sysfs { path }
                    | MountOp::Devpts { path } => Some(path.clone()),
                    _ => None,
                })
                .collect()
        };
        let shm_dir = MountOp::Dir {
            path: "/dev/shm".into(),
            mode: 0o1777,
            uid: 0,
            gid: 0,
        };
        let host = plan(&SandboxSpec::default());
        assert_eq!(superblocks(&host), ["/dev/pts", "/proc", "/sys"]);
        assert!(host.ops.contains(&shm_dir));

        let rfs = std::env::temp_dir();
        let spec = SandboxSpec {
            rootfs: Some(rfs.display().to_string()),
            ..SandboxSpec::default()
        };
        let image = plan(&spec);
        assert_eq!(superblocks(&image), ["/dev", "/dev/pts", "/proc", "/sys"]);
        assert!(image.ops.contains(&MountOp::Tmpfs {
            path: "/dev".into(),
            size: TmpfsLimit::of_size((1 << 20) + (64 << 20)),
            mode: 0o755,
            noexec: false,
        }));
        assert!(image.ops.contains(&shm_dir));
        let pos = |p: &MountPlan, want: &MountOp| p.ops.iter().position(|o| o == want);
        assert!(
            pos(&image, &shm_dir)
                > pos(
                    &image,
                    &MountOp::Devpts {
                        path: "/dev/pts".into()
                    }
                )
        );

        // A spec tmpfs at /dev/shm (a size of its own) still comes after, covering it.
        let mut spec = SandboxSpec::default();
        spec.mounts.push(MountSpec::Tmpfs {
            target: "/dev/shm".into(),
            size: sandlot_proto::units::ByteSize::mib(256),
        });
        let sized = plan(&spec);
        let t = sized
            .ops
            .iter()
            .position(|o| matches!(o, MountOp::Tmpfs { path, .. } if path == "/dev/shm"))
            .expect("the spec's /dev/shm tmpfs");
        assert!(pos(&sized, &shm_dir) < Some(t));
    }

    #[test]
    fn spec_mounts_come_last_and_missing_sources_fail() {
        let mut spec = SandboxSpec::default();
        spec.mounts.push(MountSpec::Tmpfs {
            target: "/scratch/".into(),
            size: sandlot_proto::units::ByteSize::mib(8),
        });
        spec.mounts.push(MountSpec::Bind {
            source: "/tmp".into(),
            target: "/data".into(),
            readonly: false,
        });
        let p = plan(&spec);
        let n = p.ops.len();
        assert!(
            matches!(&p.ops[n - 2], MountOp::Tmpfs { path, size, .. } if path == "/scratch" && size.bytes == 8 << 20)
        );
        assert!(
            matches!(&p.ops[n - 1], MountOp::Bind { path, readonly: false, .. } if path == "/data")
        );

        spec.mounts.push(MountSpec::Bind {
            source: "/definitely/not/here".into(),
            target: "/x".into(),
            readonly: true,
        });
        let e = plan_mounts(&PlanInput {
            spec: &spec,
            hostname: "sb",
            host: &facts(),
            image: None,
            shared: &[],
            secret_files: &[],
            pinned: None,
        })
        .unwrap_err();
        assert!(e.to_string().contains("/definitely/not/here"), "{e}");
    }

    /// The daemon resolves and checks a spec's host paths against its policy; the
    /// plan then uses exactly what it checked (the canonical path, pinned to its
    /// device and inode), never the spec's string again, and a host path it did not
    /// resolve is an error rather than resolved here without the policy.
    #[test]
    fn spec_host_paths_are_planned_from_the_callers_pins() {
        let t = std::env::temp_dir();
        let pin = crate::host_path::pin(t.to_str().unwrap(), None).unwrap();
        let pins = [PinnedPath {
            requested: "/srv/share/current".into(),
            ..pin.clone()
        }];
        let mut spec = SandboxSpec {
            rootfs: Some("/srv/share/current".into()),
            ..Default::default()
        };
        spec.mounts.push(MountSpec::Bind {
            source: "/srv/share/current".into(),
            target: "/data".into(),
            readonly: false,
        });
        let host = facts();
        let input = |pinned| PlanInput {
            spec: &spec,
            hostname: "sb",
            host: &host,
            image: None,
            shared: &[],
            secret_files: &[],
            pinned,
        };
        let p = plan_mounts(&input(Some(&pins))).unwrap();
        assert_eq!(
            p.root,
            RootFs::Overlay {
                lower: pin.path.clone(),
                lower_id: pin.id,
                size: spec.memory_backed().writable
            }
        );
        assert!(p.ops.contains(&MountOp::Bind {
            source: pin.path.clone(),
            path: "/data".into(),
            readonly: false,
            kind: Kind::Dir,
            required: true,
            pinned: Some(pin.id),
        }));
        let e = plan_mounts(&input(Some(&[]))).unwrap_err();
        assert!(matches!(e, MountError::NotPinned { .. }), "{e}");
    }

    #[test]
    fn rootfs_dir_uses_an_overlay_and_must_exist() {
        let spec = SandboxSpec {
            rootfs: Some("/tmp".into()),
            ..Default::default()
        };
        let p = plan(&spec);
        assert!(matches!(&p.root, RootFs::Overlay { lower, .. } if lower == Path::new("/tmp")));
        assert!(!p
            .ops
            .iter()
            .any(|o| matches!(o, MountOp::Bind { path, .. } if path == "/usr")));
        let spec = SandboxSpec {
            rootfs: Some("/no/such/rootfs".into()),
            ..Default::default()
        };
        assert!(plan_mounts(&PlanInput {
            spec: &spec,
            hostname: "sb",
            host: &facts(),
            image: None,
            shared: &[],
            secret_files: &[],
            pinned: None,
        })
        .is_err());
    }

    /// A snapshot of a `host` sandbox is layers with the host's entries bound and
    /// `/etc` synthesized over them, as for the `host` image; its `/dev` is a tmpfs
    /// of its own (the layers' `/dev` is no place for devices).
    #[test]
    fn layers_on_the_host_image_get_the_host_entries() {
        let t = std::env::temp_dir();
        let on_host = |on_host: bool| {
            plan_mounts(&PlanInput {
                spec: &SandboxSpec::default(),
                hostname: "sb",
                host: &facts(),
                image: Some(&ImageRoot {
                    layers: vec![t.clone()],
                    rw: Some(t.clone()),
                    on_host,
                    ..Default::default()
                }),
                shared: &[],
                secret_files: &[],
                pinned: None,
            })
            .unwrap()
        };
        let usr = MountOp::Bind {
            source: "/usr".into(),
            path: "/usr".into(),
            readonly: true,
            kind: Kind::Dir,
            required: true,
            pinned: None,
        };
        let host = on_host(true);
        assert!(matches!(host.root, RootFs::Layers { .. }));
        assert!(host.ops.contains(&usr));
        assert!(host
            .ops
            .iter()
            .any(|o| matches!(o, MountOp::HostEtc { .. })));
        assert!(host
            .ops
            .iter()
            .any(|o| matches!(o, MountOp::Tmpfs { path, .. } if path == "/dev")));
        let image = on_host(false);
        assert!(!image.ops.contains(&usr));
        assert!(!image
            .ops
            .iter()
            .any(|o| matches!(o, MountOp::HostEtc { .. })));
    }

    #[test]
    fn image_layers_volumes_and_secrets_are_planned_in_idmap_order() {
        let t = std::env::temp_dir();
        let img = ImageRoot {
            layers: vec![t.clone(), PathBuf::from("/")],
            rw: Some(t.clone()),
            ..Default::default()
        };
        let shared = [SharedDir {
            source: t.clone(),
            target: "/data/".into(),
            readonly: true,
        }];
        let secrets = [
            crate::SecretFile {
                path: "/run/secrets/token".into(),
                contents: "s3cret".into(),
                mode: 0o400,
                uid: None,
                gid: None,
            },
            crate::SecretFile {
                path: "/run/secrets/shared".into(),
                contents: "x".into(),
                mode: 0o440,
                uid: Some(0),
                gid: Some(100),
            },
        ];
        let img = ImageRoot {
            user: Some("app".into()),
            ..img
        };
        let spec = SandboxSpec::default();
        let p = plan_mounts(&PlanInput {
            spec: &spec,
            hostname: "sb",
            host: &facts(),
            image: Some(&img),
            shared: &shared,
            secret_files: &secrets,
            pinned: None,
        })
        .unwrap();
        assert!(matches!(&p.root, RootFs::Layers { lowers, rw: Some(_), .. } if lowers.len() == 2));
        // Layers, then rw, then volumes: the volume is tree 3.
        assert_eq!(
            p.idmap_sources(),
            vec![t.clone(), PathBuf::from("/"), t.clone(), t.clone()]
        );
        assert!(p.ops.contains(&MountOp::IdmappedBind {
            index: 3,
            source: t.clone(),
            path: "/data".into(),
            readonly: true
        }));
        // No host binds of /usr for an image; secrets on their own tmpfs, 0400.
        assert!(!p
            .ops
            .iter()
            .any(|o| matches!(o, MountOp::Bind { path, .. } if path == "/usr")));
        let tmpfs = p
            .ops
            .iter()
            .position(|o| matches!(o, MountOp::Tmpfs { path, .. } if path == SECRETS_DIR))
            .unwrap();
        // Each file with its mode; the owner the references give, else the sandbox's
        // user (the image's, since the spec says root), resolved when applied.
        let files: Vec<_> = p
            .ops
            .iter()
            .enumerate()
            .filter(|(_, o)| matches!(o, MountOp::SecretFile { .. }))
            .collect();
        assert!(files.iter().all(|(i, _)| *i > tmpfs));
        assert_eq!(
            files.iter().map(|(_, o)| (*o).clone()).collect::<Vec<_>>(),
            [
                MountOp::SecretFile {
                    path: "/run/secrets/token".into(),
                    contents: SecretText("s3cret".into()),
                    mode: 0o400,
                    uid: None,
                    gid: None,
                    user: "app".into(),
                },
                MountOp::SecretFile {
                    path: "/run/secrets/shared".into(),
                    contents: SecretText("x".into()),
                    mode: 0o440,
                    uid: Some(0),
                    gid: Some(100),
                    user: "app".into(),
                },
            ]
        );
        let missing = ImageRoot {
            layers: vec![PathBuf::from("/no/such/layer")],
            ..Default::default()
        };
        let e = plan_mounts(&PlanInput {
            spec: &spec,
            hostname: "sb",
            host: &facts(),
            image: Some(&missing),
            shared: &[],
            secret_files: &[],
            pinned: None,
        })
        .unwrap_err();
        assert!(e.to_string().contains("/no/such/layer"), "{e}");
    }
}
