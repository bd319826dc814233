//! The sandbox spec: everything about a sandbox that is declared at construction.
//!
//! The same schema is used by `sandlot run` flags, the HTTP API body and spec files.
//! Requests are strict: unknown fields are refused (`deny_unknown_fields`), and
//! [`SandboxSpec::validate`] checks what serde cannot (paths, limits, names).

use std::collections::BTreeMap;
use std::path::{Component, Path};

use serde::{Deserialize, Serialize};

use crate::units::{ByteSize, Seconds};

mod isolation;
pub mod memory_backed;
mod network;
mod secrets;
pub use isolation::Isolation;
pub use memory_backed::{MemoryBacked, TmpfsLimit};
pub use network::{
    check_domain_pattern, AllowRule, Cidr, DenyRule, NetworkMode, NetworkSpec, MAX_ALLOW_RULES,
    MAX_RULE_PORTS,
};
pub use secrets::{FileMode, SecretRef, SECRET_FILE_MODE};

/// Validation failures of a [`SandboxSpec`]. Each names the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("{field}: {problem}")]
    Invalid { field: String, problem: String },
}

impl SpecError {
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        SpecError::Invalid {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// The dotted path of the field that failed validation (`mounts[1].target`).
    pub fn field(&self) -> &str {
        match self {
            SpecError::Invalid { field, .. } => field,
        }
    }
}

/// Name of the built-in image that needs no download: read-only binds of the host's
/// `/usr` (and `/bin`, `/lib*`, `/sbin`) with a synthesized `/etc`.
pub const HOST_IMAGE: &str = "host";

/// Hard ceilings that no spec may exceed, whatever the operator configures.
pub mod limits {
    use crate::units::ByteSize;
    /// Smallest memory limit: below this the guest agent itself cannot run.
    pub const MIN_MEMORY: ByteSize = ByteSize(16 << 20);
    pub const MAX_MEMORY: ByteSize = ByteSize(1 << 40);
    pub const MIN_DISK: ByteSize = ByteSize(1 << 20);
    pub const MAX_DISK: ByteSize = ByteSize(1 << 40);
    pub const MIN_PIDS: u32 = 8;
    pub const MAX_PIDS: u32 = 1 << 22;
    pub const MAX_CPUS: f64 = 1024.0;
    pub const MIN_CPUS: f64 = 0.01;
    pub const MAX_TIMEOUT_SECS: u64 = 7 * 24 * 3600;
    pub const MAX_MOUNTS: usize = 64;
    pub const MAX_ENV: usize = 4096;
}

/// A sandbox, as declared at construction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSpec {
    /// Image name. `host` (the default) is built in.
    #[serde(default = "default_image")]
    pub image: String,
    /// Use this host directory as the root filesystem instead of an image (read-only
    /// lower layer under a writable upper). Mutually exclusive with a non-default `image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<MountSpec>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory of processes that do not name one. Default: the user's home.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// Default user of processes: `root`, `user`, or `UID[:GID]` inside the sandbox.
    #[serde(default = "default_user")]
    pub user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default)]
    pub resources: Resources,
    /// Lifetime: the sandbox and everything in it is killed after this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Seconds>,
    #[serde(default)]
    pub network: NetworkSpec,
    /// Inbound: whether the sandbox's ports answer without a credential.
    #[serde(default, skip_serializing_if = "PortsSpec::is_default")]
    pub ports: PortsSpec,
    /// Named volumes of the daemon, mounted at create.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMount>,
    /// Named secrets of the daemon, injected at create as variables or files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretRef>,
    /// What isolates the sandbox from the host kernel: `namespace` (the default)
    /// or `gvisor`.
    #[serde(default, skip_serializing_if = "Isolation::is_namespace")]
    pub isolation: Isolation,
}

/// Inbound traffic to a sandbox's ports. See `docs/api.md` ("Public ports").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PortsSpec {
    /// The sandbox's ports answer host-name URLs (`PORT-ID.DOMAIN`, the E2B front
    /// door's `[e2b] domain`) without a credential, except
    /// [`NEVER_PUBLIC_PORTS`]. Default false: such URLs need the sandbox's traffic
    /// access token or the tenant's key. The operator may forbid it
    /// (`[ports] allow_public`).
    #[serde(default)]
    pub public: bool,
}

/// Ports that never answer without a credential, public or not: E2B's envd (49983)
/// and code interpreter (49999) control the sandbox.
pub const NEVER_PUBLIC_PORTS: &[u16] = &[49983, 49999];

impl PortsSpec {
    pub fn is_default(&self) -> bool {
        *self == PortsSpec::default()
    }

    /// Whether `port` answers without a credential.
    pub fn is_public(&self, port: u16) -> bool {
        self.public && !NEVER_PUBLIC_PORTS.contains(&port)
    }
}

/// A named volume mounted into a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    pub name: String,
    /// Absolute path in the sandbox.
    pub target: String,
    #[serde(default)]
    pub read_only: bool,
}

/// Names of volumes and secrets: 1 to 64 letters, digits, '-', '_' or '.', not
/// starting with '.' or '-'.
pub fn valid_object_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !n.starts_with(['.', '-'])
}

/// Where secret files go in a sandbox.
pub const SECRETS_DIR: &str = "/run/secrets";

/// Image references: `host`, a name (`team/app:1.0`, `127.0.0.1:5000/app`), or an
/// id (`sha256:...`). Resolved against the image store by the daemon or CLI.
fn check_image_ref(r: &str) -> Result<(), SpecError> {
    let ok = !r.is_empty()
        && r.len() <= 255
        && r.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/:@".contains(&b))
        && !r.starts_with(['/', ':', '.', '-']);
    if ok {
        Ok(())
    } else {
        Err(SpecError::new(
            "image",
            format!("{r:?} is not an image reference (NAME[:TAG] or sha256:ID)"),
        ))
    }
}

fn default_image() -> String {
    HOST_IMAGE.to_string()
}

fn default_user() -> String {
    "root".to_string()
}

impl Default for SandboxSpec {
    fn default() -> Self {
        SandboxSpec {
            image: default_image(),
            rootfs: None,
            mounts: Vec::new(),
            env: BTreeMap::new(),
            workdir: None,
            user: default_user(),
            hostname: None,
            resources: Resources::default(),
            timeout: None,
            network: NetworkSpec::default(),
            ports: PortsSpec::default(),
            volumes: Vec::new(),
            secrets: Vec::new(),
            isolation: Isolation::Namespace,
        }
    }
}

/// Resource limits. Absent values take the defaults below.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// CPU quota in cores (`0.5` = half a core). Absent: the operator's default
    /// (the daemon's `runtime.default_cpus`; `sandlot run`: no quota).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Memory limit of everything in the sandbox, including its memory-backed
    /// filesystems: the writable layer and `tmpfs` mounts, which together hold at
    /// most this less a headroom for the agent ([`memory_backed`]).
    #[serde(default = "default_memory")]
    pub memory: ByteSize,
    /// Maximum number of processes and threads.
    #[serde(default = "default_pids")]
    pub pids: u32,
    /// Size limit of the writable layer. The layer is a tmpfs: it holds the
    /// smaller of this and what the memory limit leaves it ([`memory_backed`]).
    #[serde(default = "default_disk")]
    pub disk: ByteSize,
}

fn default_memory() -> ByteSize {
    ByteSize::mib(512)
}
fn default_pids() -> u32 {
    512
}
fn default_disk() -> ByteSize {
    ByteSize::mib(1024)
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            cpus: None,
            memory: default_memory(),
            pids: default_pids(),
            disk: default_disk(),
        }
    }
}

/// A filesystem mount declared at construction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum MountSpec {
    /// A host path bound into the sandbox.
    Bind {
        source: String,
        target: String,
        #[serde(default = "yes")]
        readonly: bool,
    },
    /// A fresh tmpfs.
    Tmpfs {
        target: String,
        #[serde(default = "default_tmpfs_size")]
        size: ByteSize,
    },
    /// A memory store of the sandbox's tenant (daemon only): its files, read-write unless
    /// `readonly`; its git and index directories are always read-only inside.
    Memory {
        store: String,
        target: String,
        #[serde(default)]
        readonly: bool,
    },
    /// A virtual filesystem collection of the sandbox's tenant (daemon only), read-only:
    /// the view of `principal` (default: `anonymous`, who sees public documents only),
    /// served over FUSE. The version is pinned when the sandbox is created (the head
    /// unless `version` names one) and kept for the sandbox's life.
    Collection {
        collection: String,
        target: String,
        /// Who the documents are pruned for, as in a shell session (`principal`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        principal: Option<String>,
        /// Groups of the principal: it sees public documents and those of these groups.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        groups: Vec<String>,
        /// See every document regardless of ACLs (the tenant's own view).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        all_access: bool,
        /// Collection version; the daemon fills in the head when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        version: Option<u64>,
    },
}

/// Most collection mounts in one spec (each is served by a helper process).
pub const MAX_COLLECTION_MOUNTS: usize = 8;

/// The principal a collection mount is pruned for when the spec names none.
pub const ANONYMOUS_PRINCIPAL: &str = "anonymous";

/// Collection names: 1 to 64 letters, digits, '.', '_' or '-', not starting with '.'.
pub fn valid_collection_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Principal and group names of a collection mount: 1 to 128 characters without
/// spaces, commas or control characters (the vfs session API's rule).
pub fn valid_principal_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || c == ',')
}

/// Memory store names: 1 to 64 letters, digits, '-', '_' or '.', not starting with '.'.
pub fn valid_memory_store_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn yes() -> bool {
    true
}
fn default_tmpfs_size() -> ByteSize {
    ByteSize::mib(64)
}

impl MountSpec {
    pub fn target(&self) -> &str {
        match self {
            MountSpec::Bind { target, .. }
            | MountSpec::Tmpfs { target, .. }
            | MountSpec::Memory { target, .. }
            | MountSpec::Collection { target, .. } => target,
        }
    }

    /// Parses the CLI form `collection:NAME:DST[:OPTION,...]`, options being
    /// `principal=NAME`, `group=NAME` (repeatable), `version=N` and `all-access`.
    /// `None` when `s` is not of that form (it does not start with `collection:`).
    pub fn parse_collection(s: &str) -> Option<Result<MountSpec, SpecError>> {
        let rest = s.strip_prefix("collection:")?;
        let usage = || {
            SpecError::new(
                "mount",
                format!(
                    "{s:?}: expected collection:NAME:DST[:principal=NAME,group=NAME,version=N,all-access]"
                ),
            )
        };
        let mut parts = rest.splitn(3, ':');
        let (Some(name), Some(target)) = (parts.next(), parts.next()) else {
            return Some(Err(usage()));
        };
        if name.is_empty() || target.is_empty() {
            return Some(Err(usage()));
        }
        let mut m = MountSpec::Collection {
            collection: name.to_string(),
            target: target.to_string(),
            principal: None,
            groups: Vec::new(),
            all_access: false,
            version: None,
        };
        let MountSpec::Collection {
            principal,
            groups,
            all_access,
            version,
            ..
        } = &mut m
        else {
            unreachable!("just built a collection mount")
        };
        for opt in parts
            .next()
            .unwrap_or("")
            .split(',')
            .filter(|o| !o.is_empty())
        {
            let bad = |why: &str| SpecError::new("mount", format!("{s:?}: option {opt:?}: {why}"));
            match opt.split_once('=') {
                Some(("principal", v)) if principal.is_none() => *principal = Some(v.to_string()),
                Some(("principal", _)) => return Some(Err(bad("given twice"))),
                Some(("group", v)) => groups.push(v.to_string()),
                Some(("version", v)) => match v.parse::<u64>() {
                    Ok(n) => *version = Some(n),
                    Err(_) => return Some(Err(bad("a version is a positive integer"))),
                },
                None if opt == "all-access" => *all_access = true,
                _ => {
                    return Some(Err(bad(
                        "expected principal=NAME, group=NAME, version=N or all-access",
                    )))
                }
            }
        }
        Some(Ok(m))
    }

    /// Parses the CLI form `SRC:DST[:ro|rw]` (default `ro`).
    pub fn parse_bind(s: &str) -> Result<MountSpec, SpecError> {
        let parts: Vec<&str> = s.split(':').collect();
        let (source, target, readonly) = match parts.as_slice() {
            [src, dst] => (*src, *dst, true),
            [src, dst, "ro"] => (*src, *dst, true),
            [src, dst, "rw"] => (*src, *dst, false),
            [_, _, mode] => {
                return Err(SpecError::new(
                    "mount",
                    format!("{s:?}: mode must be ro or rw, not {mode:?}"),
                ))
            }
            _ => {
                return Err(SpecError::new(
                    "mount",
                    format!("{s:?}: expected SRC:DST[:ro|rw]"),
                ))
            }
        };
        if source.is_empty() || target.is_empty() {
            return Err(SpecError::new(
                "mount",
                format!("{s:?}: expected SRC:DST[:ro|rw]"),
            ));
        }
        Ok(MountSpec::Bind {
            source: source.to_string(),
            target: target.to_string(),
            readonly,
        })
    }
}

/// Paths in the sandbox that a mount may not cover: the runtime owns them.
const RESERVED_TARGETS: &[&str] = &["/", "/proc", "/dev", "/sys"];

/// Checks that `p` is an absolute, normalized path inside the sandbox with no `..`.
pub fn check_sandbox_path(field: &str, p: &str) -> Result<(), SpecError> {
    if p.is_empty() {
        return Err(SpecError::new(field, "must not be empty"));
    }
    if p.contains('\0') {
        return Err(SpecError::new(field, format!("{p:?} contains a NUL byte")));
    }
    if !p.starts_with('/') {
        return Err(SpecError::new(
            field,
            format!("{p:?} must be an absolute path"),
        ));
    }
    for c in Path::new(p).components() {
        match c {
            Component::ParentDir => {
                return Err(SpecError::new(
                    field,
                    format!("{p:?} must not contain '..'"),
                ))
            }
            Component::CurDir => {
                return Err(SpecError::new(field, format!("{p:?} must not contain '.'")))
            }
            _ => {}
        }
    }
    if p.len() > 1024 {
        return Err(SpecError::new(field, "path longer than 1024 bytes"));
    }
    Ok(())
}

/// Normalizes a sandbox path (drops duplicate and trailing slashes). Call after
/// [`check_sandbox_path`].
pub fn normalize_sandbox_path(p: &str) -> String {
    let parts: Vec<&str> = p.split('/').filter(|s| !s.is_empty()).collect();
    format!("/{}", parts.join("/"))
}

fn check_hostname(h: &str) -> Result<(), SpecError> {
    let ok = !h.is_empty()
        && h.len() <= 63
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && !h.starts_with('-')
        && !h.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(SpecError::new(
            "hostname",
            format!("{h:?} is not a valid hostname (letters, digits, '-' and '.', at most 63)"),
        ))
    }
}

fn check_env_name(k: &str) -> bool {
    !k.is_empty()
        && !k.as_bytes()[0].is_ascii_digit()
        && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A user as written in a spec, resolved against the sandbox's `/etc/passwd` names
/// that Sandlot itself synthesizes (`root` = 0, `user` = 1000).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserIds {
    pub uid: u32,
    pub gid: u32,
}

/// Uid of the unprivileged `user` account in sandboxes.
pub const USER_UID: u32 = 1000;

/// The highest uid or gid a sandbox's files and processes can have (ids 0 to 65535
/// are mapped; 65535 is the kernel's overflow id).
pub const MAX_SANDBOX_ID: u32 = 65534;

/// Parses `root`, `user` or `UID[:GID]`. Other names are resolved by the guest.
pub fn parse_user(s: &str) -> Option<UserIds> {
    match s {
        "root" => return Some(UserIds { uid: 0, gid: 0 }),
        "user" => {
            return Some(UserIds {
                uid: USER_UID,
                gid: USER_UID,
            })
        }
        _ => {}
    }
    let (u, g) = match s.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (s, None),
    };
    let uid: u32 = u.parse().ok()?;
    let gid: u32 = match g {
        Some(g) => g.parse().ok()?,
        None => uid,
    };
    // Ids are mapped into a 65536-wide range.
    if uid > MAX_SANDBOX_ID || gid > MAX_SANDBOX_ID {
        return None;
    }
    Some(UserIds { uid, gid })
}

/// Checks what serde cannot of `mounts[i]`, a collection mount; the daemon checks that
/// the collection (and version) exists for the tenant.
fn check_collection_mount(
    i: usize,
    collection: &str,
    principal: Option<&str>,
    groups: &[String],
    version: Option<u64>,
) -> Result<(), SpecError> {
    if !valid_collection_name(collection) {
        return Err(SpecError::new(
            format!("mounts[{i}].collection"),
            format!(
                "{collection:?}: collection names are 1 to 64 letters, digits, '.', '_' or '-', \
                 not starting with '.'"
            ),
        ));
    }
    const RULE: &str = "1 to 128 characters without spaces, commas or control characters";
    if let Some(p) = principal {
        if !valid_principal_name(p) {
            return Err(SpecError::new(
                format!("mounts[{i}].principal"),
                format!("{p:?}: {RULE}"),
            ));
        }
    }
    if groups.len() > 256 {
        return Err(SpecError::new(
            format!("mounts[{i}].groups"),
            "at most 256 groups",
        ));
    }
    for (j, g) in groups.iter().enumerate() {
        if !valid_principal_name(g) {
            return Err(SpecError::new(
                format!("mounts[{i}].groups[{j}]"),
                format!("{g:?}: {RULE}"),
            ));
        }
    }
    if version == Some(0) {
        return Err(SpecError::new(
            format!("mounts[{i}].version"),
            "versions start at 1",
        ));
    }
    Ok(())
}

impl SandboxSpec {
    fn validate_volumes_and_secrets(&self) -> Result<(), SpecError> {
        if self.volumes.len() > limits::MAX_MOUNTS {
            return Err(SpecError::new(
                "volumes",
                format!("at most {} volumes", limits::MAX_MOUNTS),
            ));
        }
        let mut targets: std::collections::BTreeSet<String> = self
            .mounts
            .iter()
            .map(|m| normalize_sandbox_path(m.target()))
            .collect();
        for (i, v) in self.volumes.iter().enumerate() {
            if !valid_object_name(&v.name) {
                return Err(SpecError::new(
                    format!("volumes[{i}].name"),
                    format!("{:?}: use 1 to 64 letters, digits, '-', '_' or '.'", v.name),
                ));
            }
            let f = format!("volumes[{i}].target");
            check_sandbox_path(&f, &v.target)?;
            let t = normalize_sandbox_path(&v.target);
            if RESERVED_TARGETS.contains(&t.as_str()) || t == SECRETS_DIR {
                return Err(SpecError::new(
                    f,
                    format!("{t:?} is managed by the runtime and cannot be a mount target"),
                ));
            }
            if !targets.insert(t.clone()) {
                return Err(SpecError::new(f, format!("{t:?} is mounted twice")));
            }
        }
        secrets::check(&self.secrets)?;
        Ok(())
    }

    /// Parses a spec from JSON, strictly.
    pub fn from_json(s: &str) -> Result<SandboxSpec, SpecError> {
        let spec: SandboxSpec =
            serde_json::from_str(s).map_err(|e| SpecError::new("spec", e.to_string()))?;
        spec.validate()?;
        Ok(spec)
    }

    /// Checks everything serde cannot. Does not touch the host filesystem: host
    /// paths (bind sources, rootfs) are checked by the runtime when it plans mounts.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.rootfs.is_some() && self.image != HOST_IMAGE {
            return Err(SpecError::new(
                "rootfs",
                "give either an image or a rootfs directory, not both",
            ));
        }
        if self.image.is_empty() {
            return Err(SpecError::new("image", "must not be empty"));
        }
        if self.image != HOST_IMAGE {
            check_image_ref(&self.image)?;
        }
        self.validate_volumes_and_secrets()?;
        if let Some(r) = &self.rootfs {
            if !r.starts_with('/') {
                return Err(SpecError::new(
                    "rootfs",
                    format!("{r:?} must be an absolute host path"),
                ));
            }
        }
        if self.mounts.len() > limits::MAX_MOUNTS {
            return Err(SpecError::new(
                "mounts",
                format!("at most {} mounts", limits::MAX_MOUNTS),
            ));
        }
        let mut targets = std::collections::BTreeSet::new();
        for (i, m) in self.mounts.iter().enumerate() {
            let f = format!("mounts[{i}].target");
            check_sandbox_path(&f, m.target())?;
            let t = normalize_sandbox_path(m.target());
            if RESERVED_TARGETS.contains(&t.as_str()) {
                return Err(SpecError::new(
                    f,
                    format!("{t:?} is managed by the runtime and cannot be a mount target"),
                ));
            }
            if !targets.insert(t.clone()) {
                return Err(SpecError::new(f, format!("{t:?} is mounted twice")));
            }
            match m {
                MountSpec::Bind { source, .. } => {
                    let f = format!("mounts[{i}].source");
                    if !source.starts_with('/') {
                        return Err(SpecError::new(
                            f,
                            format!("{source:?} must be an absolute host path"),
                        ));
                    }
                    if source.contains('\0') {
                        return Err(SpecError::new(f, "contains a NUL byte"));
                    }
                }
                MountSpec::Memory { store, .. } => {
                    if !valid_memory_store_name(store) {
                        return Err(SpecError::new(
                            format!("mounts[{i}].store"),
                            format!(
                                "{store:?}: store names are 1 to 64 letters, digits, '-', '_' \
                                 or '.', not starting with '.'"
                            ),
                        ));
                    }
                }
                MountSpec::Collection {
                    collection,
                    principal,
                    groups,
                    version,
                    ..
                } => check_collection_mount(i, collection, principal.as_deref(), groups, *version)?,
                MountSpec::Tmpfs { size, .. } => {
                    if size.0 < limits::MIN_DISK.0 || size.0 > limits::MAX_DISK.0 {
                        return Err(SpecError::new(
                            format!("mounts[{i}].size"),
                            format!(
                                "{size} is out of range ({}..{})",
                                limits::MIN_DISK,
                                limits::MAX_DISK
                            ),
                        ));
                    }
                }
            }
        }
        let collections = self
            .mounts
            .iter()
            .filter(|m| matches!(m, MountSpec::Collection { .. }))
            .count();
        if collections > MAX_COLLECTION_MOUNTS {
            return Err(SpecError::new(
                "mounts",
                format!("at most {MAX_COLLECTION_MOUNTS} collection mounts (each is served by a process of its own)"),
            ));
        }
        if self.env.len() > limits::MAX_ENV {
            return Err(SpecError::new("env", "too many variables"));
        }
        for (k, v) in &self.env {
            if !check_env_name(k) {
                return Err(SpecError::new(
                    format!("env.{k}"),
                    "variable names are letters, digits and '_', not starting with a digit",
                ));
            }
            if v.contains('\0') {
                return Err(SpecError::new(
                    format!("env.{k}"),
                    "value contains a NUL byte",
                ));
            }
        }
        if let Some(w) = &self.workdir {
            check_sandbox_path("workdir", w)?;
        }
        if parse_user(&self.user).is_none() {
            return Err(SpecError::new(
                "user",
                format!(
                    "{:?} is not a user: use root, user, or UID[:GID] below 65535",
                    self.user
                ),
            ));
        }
        if let Some(h) = &self.hostname {
            check_hostname(h)?;
        }
        let r = &self.resources;
        if let Some(c) = r.cpus {
            if !(c.is_finite() && (limits::MIN_CPUS..=limits::MAX_CPUS).contains(&c)) {
                return Err(SpecError::new(
                    "resources.cpus",
                    format!(
                        "{c} is out of range ({}..{})",
                        limits::MIN_CPUS,
                        limits::MAX_CPUS
                    ),
                ));
            }
        }
        if r.memory < limits::MIN_MEMORY || r.memory > limits::MAX_MEMORY {
            return Err(SpecError::new(
                "resources.memory",
                format!(
                    "{} is out of range ({}..{})",
                    r.memory,
                    limits::MIN_MEMORY,
                    limits::MAX_MEMORY
                ),
            ));
        }
        if r.pids < limits::MIN_PIDS || r.pids > limits::MAX_PIDS {
            return Err(SpecError::new(
                "resources.pids",
                format!(
                    "{} is out of range ({}..{})",
                    r.pids,
                    limits::MIN_PIDS,
                    limits::MAX_PIDS
                ),
            ));
        }
        if r.disk < limits::MIN_DISK || r.disk > limits::MAX_DISK {
            return Err(SpecError::new(
                "resources.disk",
                format!(
                    "{} is out of range ({}..{})",
                    r.disk,
                    limits::MIN_DISK,
                    limits::MAX_DISK
                ),
            ));
        }
        self.check_memory_backed()?;
        self.network.validate()?;
        if let Some(t) = self.timeout {
            if t.0.is_zero() || t.0.as_secs() > limits::MAX_TIMEOUT_SECS {
                return Err(SpecError::new(
                    "timeout",
                    format!(
                        "{t} is out of range (more than 0, at most {}s)",
                        limits::MAX_TIMEOUT_SECS
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(json: &str) -> String {
        SandboxSpec::from_json(json)
            .unwrap_err()
            .field()
            .to_string()
    }

    #[test]
    fn collection_mounts_are_strict_and_name_the_field() {
        let s = SandboxSpec::from_json(
            r#"{"mounts": [{"type": "collection", "collection": "docs", "target": "/docs"}]}"#,
        )
        .unwrap();
        assert_eq!(
            s.mounts[0],
            MountSpec::Collection {
                collection: "docs".into(),
                target: "/docs".into(),
                principal: None,
                groups: vec![],
                all_access: false,
                version: None,
            }
        );
        let full = SandboxSpec::from_json(
            r#"{"mounts": [{"type": "collection", "collection": "docs", "target": "/d",
                "principal": "alice", "groups": ["eng", "ops"], "version": 3}]}"#,
        )
        .unwrap();
        // What is absent stays absent when the spec is written back.
        let back = serde_json::to_value(&s.mounts[0]).unwrap();
        assert_eq!(
            back,
            serde_json::json!({"type": "collection", "collection": "docs", "target": "/docs"})
        );
        assert!(
            matches!(&full.mounts[0], MountSpec::Collection { version: Some(3), groups, .. } if groups.len() == 2)
        );
        let j = |m: &str| format!(r#"{{"mounts": [{{"type": "tmpfs", "target": "/t"}}, {m}]}}"#);
        let c = |extra: &str| {
            j(&format!(
                r#"{{"type": "collection", "collection": "docs", "target": "/d"{extra}}}"#
            ))
        };
        assert_eq!(
            field_of(&j(
                r#"{"type": "collection", "collection": ".hidden", "target": "/d"}"#
            )),
            "mounts[1].collection"
        );
        assert_eq!(
            field_of(&j(
                r#"{"type": "collection", "collection": "a/b", "target": "/d"}"#
            )),
            "mounts[1].collection"
        );
        assert_eq!(
            field_of(&j(
                r#"{"type": "collection", "collection": "docs", "target": "d"}"#
            )),
            "mounts[1].target"
        );
        assert_eq!(
            field_of(&c(r#", "principal": "a b""#)),
            "mounts[1].principal"
        );
        assert_eq!(field_of(&c(r#", "principal": """#)), "mounts[1].principal");
        assert_eq!(
            field_of(&c(r#", "groups": ["eng", "x,y"]"#)),
            "mounts[1].groups[1]"
        );
        assert_eq!(field_of(&c(r#", "version": 0"#)), "mounts[1].version");
        // Unknown and missing fields are refused by serde, naming them.
        let e = SandboxSpec::from_json(&c(r#", "readonly": false"#)).unwrap_err();
        assert!(e.to_string().contains("readonly"), "{e}");
        let e = SandboxSpec::from_json(r#"{"mounts": [{"type": "collection", "target": "/d"}]}"#)
            .unwrap_err();
        assert!(e.to_string().contains("collection"), "{e}");
        // A target mounted twice, whatever the kinds.
        assert_eq!(
            field_of(
                r#"{"mounts": [{"type": "tmpfs", "target": "/d"},
                {"type": "collection", "collection": "docs", "target": "/d/"}]}"#
            ),
            "mounts[1].target"
        );
        let many: Vec<String> = (0..=MAX_COLLECTION_MOUNTS)
            .map(|i| {
                format!(r#"{{"type": "collection", "collection": "c{i}", "target": "/c{i}"}}"#)
            })
            .collect();
        assert_eq!(
            field_of(&format!(r#"{{"mounts": [{}]}}"#, many.join(","))),
            "mounts"
        );
    }

    #[test]
    fn collection_mount_cli_form() {
        assert!(MountSpec::parse_collection("/src:/dst").is_none());
        let m = MountSpec::parse_collection("collection:docs:/docs")
            .unwrap()
            .unwrap();
        assert_eq!(
            m,
            MountSpec::Collection {
                collection: "docs".into(),
                target: "/docs".into(),
                principal: None,
                groups: vec![],
                all_access: false,
                version: None
            }
        );
        let m = MountSpec::parse_collection(
            "collection:docs:/d:principal=alice,group=eng,group=ops,version=2",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            m,
            MountSpec::Collection {
                collection: "docs".into(),
                target: "/d".into(),
                principal: Some("alice".into()),
                groups: vec!["eng".into(), "ops".into()],
                all_access: false,
                version: Some(2)
            }
        );
        let m = MountSpec::parse_collection("collection:docs:/d:all-access")
            .unwrap()
            .unwrap();
        assert!(matches!(
            m,
            MountSpec::Collection {
                all_access: true,
                ..
            }
        ));
        for bad in [
            "collection:docs",
            "collection::/d",
            "collection:docs:",
            "collection:docs:/d:version=x",
            "collection:docs:/d:colour=red",
            "collection:docs:/d:principal=a,principal=b",
        ] {
            let e = MountSpec::parse_collection(bad).unwrap().unwrap_err();
            assert_eq!(e.field(), "mount", "{bad}");
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    #[test]
    fn memory_mounts_are_strict_and_name_the_field() {
        let s = SandboxSpec::from_json(
            r#"{"mounts": [{"type": "memory", "store": "notes", "target": "/memories"}]}"#,
        )
        .unwrap();
        assert_eq!(
            s.mounts[0],
            MountSpec::Memory {
                store: "notes".into(),
                target: "/memories".into(),
                readonly: false
            }
        );
        assert_eq!(
            field_of(r#"{"mounts": [{"type": "memory", "store": ".git", "target": "/m"}]}"#),
            "mounts[0].store"
        );
        assert_eq!(
            field_of(r#"{"mounts": [{"type": "memory", "store": "a/b", "target": "/m"}]}"#),
            "mounts[0].store"
        );
        assert_eq!(
            field_of(r#"{"mounts": [{"type": "memory", "store": "n", "target": "rel"}]}"#),
            "mounts[0].target"
        );
        let unknown = SandboxSpec::from_json(
            r#"{"mounts": [{"type": "memory", "store": "n", "target": "/m", "source": "/x"}]}"#,
        )
        .unwrap_err();
        assert!(unknown.to_string().contains("source"), "{unknown}");
        assert!(
            SandboxSpec::from_json(r#"{"mounts": [{"type": "memory", "target": "/m"}]}"#)
                .unwrap_err()
                .to_string()
                .contains("store")
        );
    }

    #[test]
    fn defaults_are_valid() {
        let s = SandboxSpec::from_json("{}").unwrap();
        assert_eq!(s.image, "host");
        assert_eq!(s.resources.memory, ByteSize::mib(512));
        assert_eq!(s.network.mode, NetworkMode::None);
        assert_eq!(s.user, "root");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let e = SandboxSpec::from_json(r#"{"imagee":"host"}"#).unwrap_err();
        assert!(e.to_string().contains("imagee"), "{e}");
        let e = SandboxSpec::from_json(r#"{"resources":{"mem":"1G"}}"#).unwrap_err();
        assert!(e.to_string().contains("mem"), "{e}");
    }

    #[test]
    fn mount_targets_must_be_absolute_and_not_escape() {
        let j =
            |t: &str| format!(r#"{{"mounts":[{{"type":"bind","source":"/tmp","target":"{t}"}}]}}"#);
        assert_eq!(field_of(&j("relative/x")), "mounts[0].target");
        assert_eq!(field_of(&j("/a/../../etc")), "mounts[0].target");
        assert_eq!(field_of(&j("/proc")), "mounts[0].target");
        assert_eq!(field_of(&j("/")), "mounts[0].target");
        assert!(SandboxSpec::from_json(&j("/data")).is_ok());
        let two = r#"{"mounts":[{"type":"tmpfs","target":"/a"},{"type":"tmpfs","target":"/a/"}]}"#;
        assert_eq!(field_of(two), "mounts[1].target");
        let rel = r#"{"mounts":[{"type":"bind","source":"tmp","target":"/x"}]}"#;
        assert_eq!(field_of(rel), "mounts[0].source");
    }

    #[test]
    fn absurd_limits_are_refused() {
        assert_eq!(
            field_of(r#"{"resources":{"memory":0}}"#),
            "resources.memory"
        );
        assert_eq!(
            field_of(r#"{"resources":{"memory":"4T"}}"#),
            "resources.memory"
        );
        assert_eq!(field_of(r#"{"resources":{"pids":0}}"#), "resources.pids");
        assert_eq!(field_of(r#"{"resources":{"cpus":0}}"#), "resources.cpus");
        assert_eq!(field_of(r#"{"resources":{"disk":"1K"}}"#), "resources.disk");
        assert_eq!(field_of(r#"{"timeout":0}"#), "timeout");
        assert_eq!(field_of(r#"{"timeout":"30d"}"#), "spec");
        assert!(SandboxSpec::from_json(r#"{"resources":{"cpus":0.5,"memory":"64M"}}"#).is_ok());
    }

    #[test]
    fn names_and_env_are_checked() {
        assert_eq!(field_of(r#"{"hostname":"bad host"}"#), "hostname");
        assert_eq!(field_of(r#"{"env":{"1X":"a"}}"#), "env.1X");
        assert_eq!(field_of(r#"{"user":"nobody!"}"#), "user");
        assert_eq!(field_of(r#"{"workdir":"tmp"}"#), "workdir");
        assert_eq!(field_of(r#"{"image":"bad image"}"#), "image");
        assert!(SandboxSpec::from_json(r#"{"image":"team/app:1.0"}"#).is_ok());
        assert_eq!(field_of(r#"{"rootfs":"rel/dir"}"#), "rootfs");
    }

    #[test]
    fn network_rules_are_checked_and_named() {
        let j = |rules: &str| format!(r#"{{"network":{{"mode":"allow","allow":[{rules}]}}}}"#);
        let ok = j(
            r#"{"domain":"api.example.com","ports":[443]},{"domain":"*.example.com"},{"cidr":"203.0.113.0/24","ports":[22,80]},{"cidr":"2001:db8::/32"},{"cidr":"10.0.0.1"}"#,
        );
        let s = SandboxSpec::from_json(&ok).unwrap();
        assert_eq!(s.network.mode, NetworkMode::Allow);
        assert_eq!(s.network.allow.len(), 5);
        let bad = |r: &str| {
            field_of(&j(&format!(
                r#"{{"domain":"a.test"}},{{"cidr":"10.0.0.0/8"}},{r}"#
            )))
        };
        assert_eq!(bad(r#"{"domain":"*.com"}"#), "network.allow[2].domain");
        assert_eq!(bad(r#"{"domain":"a.*.com"}"#), "network.allow[2].domain");
        assert_eq!(
            bad(r#"{"domain":"API.example.com"}"#),
            "network.allow[2].domain"
        );
        assert_eq!(
            bad(r#"{"domain":"example.com."}"#),
            "network.allow[2].domain"
        );
        assert_eq!(
            bad(r#"{"domain":"-a.example.com"}"#),
            "network.allow[2].domain"
        );
        assert_eq!(
            bad(r#"{"domain":"exa mple.com"}"#),
            "network.allow[2].domain"
        );
        assert_eq!(bad(r#"{"cidr":"10.0.0.1/8"}"#), "network.allow[2].cidr");
        assert_eq!(bad(r#"{"cidr":"10.0.0.0/33"}"#), "network.allow[2].cidr");
        assert_eq!(bad(r#"{"cidr":"example.com"}"#), "network.allow[2].cidr");
        assert_eq!(
            bad(r#"{"domain":"a.b","cidr":"10.0.0.0/8"}"#),
            "network.allow[2]"
        );
        assert_eq!(bad(r#"{"ports":[80]}"#), "network.allow[2]");
        assert_eq!(
            bad(r#"{"domain":"a.b","ports":[80,0]}"#),
            "network.allow[2].ports[1]"
        );
        // Unknown keys and modes are refused by serde.
        assert_eq!(bad(r#"{"host":"a.b"}"#), "spec");
        assert_eq!(field_of(r#"{"network":{"mode":"everything"}}"#), "spec");
        // Rules only with mode allow.
        assert_eq!(
            field_of(r#"{"network":{"mode":"open","allow":[{"domain":"a.b"}]}}"#),
            "network.allow"
        );
        assert!(SandboxSpec::from_json(r#"{"network":{"mode":"open"}}"#).is_ok());
        assert!(SandboxSpec::from_json(r#"{"network":{"mode":"allow"}}"#).is_ok());
    }

    #[test]
    fn cidrs_contain_what_they_should() {
        let c = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(c.contains("10.1.255.3".parse().unwrap()));
        assert!(!c.contains("10.2.0.1".parse().unwrap()));
        assert!(c.contains("::ffff:10.1.2.3".parse().unwrap()));
        assert!(!c.contains("2001:db8::1".parse().unwrap()));
        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
        let v6 = Cidr::parse("fd00:ec2::254").unwrap();
        assert_eq!(v6.len, 128);
        assert!(v6.contains("fd00:ec2::254".parse().unwrap()));
        assert!(!v6.contains("fd00:ec2::253".parse().unwrap()));
        assert_eq!(
            Cidr::parse("10.1.0.0/16").unwrap().to_string(),
            "10.1.0.0/16"
        );
    }

    #[test]
    fn users_parse() {
        assert_eq!(parse_user("root"), Some(UserIds { uid: 0, gid: 0 }));
        assert_eq!(
            parse_user("user"),
            Some(UserIds {
                uid: 1000,
                gid: 1000
            })
        );
        assert_eq!(parse_user("5:6"), Some(UserIds { uid: 5, gid: 6 }));
        assert_eq!(parse_user("70000"), None);
        assert_eq!(parse_user("x"), None);
    }

    #[test]
    fn cli_bind_form_parses() {
        assert_eq!(
            MountSpec::parse_bind("/a:/b:rw").unwrap(),
            MountSpec::Bind {
                source: "/a".into(),
                target: "/b".into(),
                readonly: false
            }
        );
        assert!(matches!(
            MountSpec::parse_bind("/a:/b").unwrap(),
            MountSpec::Bind { readonly: true, .. }
        ));
        assert!(MountSpec::parse_bind("/a:/b:rx").is_err());
        assert!(MountSpec::parse_bind("/a").is_err());
    }

    #[test]
    fn normalize_paths() {
        assert_eq!(normalize_sandbox_path("//a//b/"), "/a/b");
        assert_eq!(normalize_sandbox_path("/"), "/");
    }

    #[test]
    fn volumes_and_secrets_are_checked() {
        assert!(SandboxSpec::from_json(
            r#"{"volumes":[{"name":"data","target":"/data","read_only":true}],
                "secrets":[{"name":"tok","env":"TOKEN"},{"name":"key","path":"/run/secrets/key"}]}"#
        )
        .is_ok());
        assert_eq!(
            field_of(r#"{"volumes":[{"name":"../x","target":"/d"}]}"#),
            "volumes[0].name"
        );
        assert_eq!(
            field_of(r#"{"volumes":[{"name":"v","target":"/proc"}]}"#),
            "volumes[0].target"
        );
        assert_eq!(
            field_of(
                r#"{"mounts":[{"type":"tmpfs","target":"/d"}],"volumes":[{"name":"v","target":"/d/"}]}"#
            ),
            "volumes[0].target"
        );
        assert_eq!(field_of(r#"{"secrets":[{"name":"s"}]}"#), "secrets[0]");
        assert_eq!(
            field_of(r#"{"secrets":[{"name":"s","env":"A","path":"/run/secrets/a"}]}"#),
            "secrets[0]"
        );
        assert_eq!(
            field_of(r#"{"secrets":[{"name":"s","path":"/etc/passwd"}]}"#),
            "secrets[0].path"
        );
        // Found by probing: the directory itself passed, and the create failed with a 500.
        for p in ["/run/secrets/.", "/run/secrets/", "/run/secrets"] {
            assert_eq!(
                field_of(&format!(r#"{{"secrets":[{{"name":"s","path":"{p}"}}]}}"#)),
                "secrets[0].path",
                "{p}"
            );
        }
        assert_eq!(
            field_of(r#"{"secrets":[{"name":"s","env":"1A"}]}"#),
            "secrets[0].env"
        );
        assert_eq!(
            field_of(r#"{"volumes":[{"name":"v","target":"/d","mode":"rw"}]}"#),
            "spec"
        );
    }
}
