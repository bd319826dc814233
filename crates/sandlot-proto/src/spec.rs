//! The sandbox spec: everything about a sandbox that is declared at construction.
//!
//! The same schema is used by `sandlot run` flags, the HTTP API body and spec files.
//! Requests are strict: unknown fields are refused (`deny_unknown_fields`), and
//! [`SandboxSpec::validate`] checks what serde cannot (paths, limits, names).

use std::collections::BTreeMap;
use std::path::{Component, Path};

use serde::{Deserialize, Serialize};

use crate::units::{ByteSize, Seconds};

/// Validation failures of a [`SandboxSpec`]. Each names the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("{field}: {problem}")]
    Invalid { field: String, problem: String },
}

impl SpecError {
    fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
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
        }
    }
}

/// Resource limits. Absent values take the defaults below.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// CPU quota in cores (`0.5` = half a core). Absent: no quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Memory limit of everything in the sandbox, including its tmpfs writable layer.
    #[serde(default = "default_memory")]
    pub memory: ByteSize,
    /// Maximum number of processes and threads.
    #[serde(default = "default_pids")]
    pub pids: u32,
    /// Size limit of the writable layer.
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
            MountSpec::Bind { target, .. } | MountSpec::Tmpfs { target, .. } => target,
        }
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

/// How the sandbox reaches the network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    #[serde(default)]
    pub mode: NetworkMode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// Loopback only.
    #[default]
    None,
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
    if uid > 65534 || gid > 65534 {
        return None;
    }
    Some(UserIds { uid, gid })
}

impl SandboxSpec {
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
            return Err(SpecError::new(
                "image",
                format!(
                    "unknown image {:?}: the built-in image is {HOST_IMAGE:?}, or pass a rootfs directory",
                    self.image
                ),
            ));
        }
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
        assert_eq!(field_of(r#"{"image":"ubuntu"}"#), "image");
        assert_eq!(field_of(r#"{"rootfs":"rel/dir"}"#), "rootfs");
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
}
