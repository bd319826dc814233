//! The sandbox spec flags `sandlot run` and `sandlot create` share. They are applied
//! to the JSON form of a spec, setting only what was given, so that a create leaves
//! every other field to the daemon's defaults (its default network policy, say).

use std::path::PathBuf;

use anyhow::{bail, Context};
use sandlot_proto::spec::MountSpec;
use sandlot_proto::units::{ByteSize, Seconds};
use serde_json::{Map, Value};

#[derive(Debug, Default, clap::Args)]
pub struct SpecFlags {
    /// Image (built in: host).
    #[arg(long)]
    pub image: Option<String>,
    /// Use this directory as the root filesystem (read-only lower layer).
    #[arg(long, value_name = "DIR", conflicts_with = "image")]
    pub rootfs: Option<PathBuf>,
    /// Memory limit, e.g. 512M.
    #[arg(long, value_parser = parse_size, allow_negative_numbers = true)]
    pub memory: Option<ByteSize>,
    /// CPU quota in cores, e.g. 0.5.
    #[arg(long, allow_negative_numbers = true)]
    pub cpus: Option<f64>,
    /// Maximum number of processes and threads.
    #[arg(long, allow_negative_numbers = true)]
    pub pids: Option<u32>,
    /// Size limit of the writable layer, e.g. 1G.
    #[arg(long, value_parser = parse_size, allow_negative_numbers = true)]
    pub disk: Option<ByteSize>,
    /// Lifetime: everything is killed after this long, e.g. 10m.
    #[arg(long, value_parser = parse_duration, allow_negative_numbers = true)]
    pub timeout: Option<Seconds>,
    /// Bind a host path: SRC:DST[:ro|rw] (default ro); or, with a daemon, mount a
    /// collection read-only: collection:NAME:DST[:principal=P,group=G,version=N,all-access].
    /// Repeatable.
    #[arg(long = "mount", value_name = "SRC:DST[:ro|rw]")]
    pub mounts: Vec<String>,
    /// A fresh tmpfs: DST[:SIZE] (default 64M). Repeatable.
    #[arg(long = "tmpfs", value_name = "DST[:SIZE]")]
    pub tmpfs: Vec<String>,
    /// Environment variable K=V. Repeatable.
    #[arg(short, long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Working directory of commands that do not name one.
    #[arg(short, long)]
    pub workdir: Option<String>,
    /// User: root, user, or UID[:GID].
    #[arg(short, long)]
    pub user: Option<String>,
    /// Host name inside the sandbox (default: derived from its id).
    #[arg(long)]
    pub hostname: Option<String>,
    /// What isolates the sandbox from the host kernel: namespace (Linux
    /// namespaces) or gvisor (gVisor's kernel in user space, through runsc).
    #[arg(long, value_name = "KIND", value_parser = ["namespace", "gvisor"])]
    pub isolation: Option<String>,
}

pub fn parse_size(s: &str) -> Result<ByteSize, String> {
    s.parse()
        .map_err(|e: sandlot_proto::units::UnitError| e.to_string())
}

pub fn parse_duration(s: &str) -> Result<Seconds, String> {
    s.parse()
        .map_err(|e: sandlot_proto::units::UnitError| e.to_string())
}

/// `K=V` of a repeatable flag.
pub fn key_value(s: &str, flag: &str) -> anyhow::Result<(String, String)> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => bail!("{flag} {s:?}: expected KEY=VALUE"),
    }
}

fn absolute(p: &std::path::Path) -> anyhow::Result<String> {
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    };
    Ok(abs.to_string_lossy().into_owned())
}

/// The object under `key` of `spec` (created empty, or replaced if not an object).
fn object<'a>(spec: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let v = spec
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    v.as_object_mut().expect("just made an object")
}

/// The array under `key` of `spec`.
fn array<'a>(spec: &'a mut Map<String, Value>, key: &str) -> &'a mut Vec<Value> {
    let v = spec
        .entry(key.to_string())
        .or_insert_with(|| Value::Array(Vec::new()));
    if !v.is_array() {
        *v = Value::Array(Vec::new());
    }
    v.as_array_mut().expect("just made an array")
}

impl SpecFlags {
    /// Sets the given flags in `spec` (a spec's JSON object; relative host paths
    /// become absolute). Fields no flag names are left as they are.
    pub fn apply(&self, spec: &mut Map<String, Value>) -> anyhow::Result<()> {
        if let Some(i) = &self.image {
            spec.insert("image".into(), Value::from(i.clone()));
        }
        if let Some(r) = &self.rootfs {
            spec.insert("rootfs".into(), Value::from(absolute(r)?));
        }
        let resources = [
            ("memory", self.memory.map(serde_json::to_value)),
            ("cpus", self.cpus.map(|c| Ok(Value::from(c)))),
            ("pids", self.pids.map(|p| Ok(Value::from(p)))),
            ("disk", self.disk.map(serde_json::to_value)),
        ];
        for (k, v) in resources {
            if let Some(v) = v {
                object(spec, "resources").insert(k.into(), v?);
            }
        }
        if let Some(t) = self.timeout {
            spec.insert("timeout".into(), serde_json::to_value(t)?);
        }
        for m in &self.mounts {
            if let Some(c) = MountSpec::parse_collection(m) {
                array(spec, "mounts").push(serde_json::to_value(&c?)?);
                continue;
            }
            let mut m = MountSpec::parse_bind(m)?;
            if let MountSpec::Bind { source, .. } = &mut m {
                *source = absolute(std::path::Path::new(source.as_str()))?;
            }
            array(spec, "mounts").push(serde_json::to_value(&m)?);
        }
        for t in &self.tmpfs {
            let (target, size) = match t.split_once(':') {
                Some((d, s)) => (
                    d,
                    parse_size(s).map_err(|e| anyhow::anyhow!("--tmpfs {t:?}: {e}"))?,
                ),
                None => (t.as_str(), ByteSize::mib(64)),
            };
            let m = MountSpec::Tmpfs {
                target: target.to_string(),
                size,
            };
            array(spec, "mounts").push(serde_json::to_value(&m)?);
        }
        for e in &self.env {
            let (k, v) = key_value(e, "--env")?;
            object(spec, "env").insert(k, Value::from(v));
        }
        for (k, v) in [
            ("workdir", &self.workdir),
            ("user", &self.user),
            ("hostname", &self.hostname),
            ("isolation", &self.isolation),
        ] {
            if let Some(v) = v {
                spec.insert(k.into(), Value::from(v.clone()));
            }
        }
        Ok(())
    }
}

/// `--volume NAME:DST[:ro|rw]` (a daemon's named volume, default read-write) as a
/// spec's `volumes` entry.
pub fn volume_flag(s: &str) -> anyhow::Result<Value> {
    let bad = || anyhow::anyhow!("--volume {s:?}: expected NAME:DST[:ro|rw]");
    let (name, rest) = s.split_once(':').ok_or_else(bad)?;
    let (target, read_only) = match rest.rsplit_once(':') {
        Some((t, "ro")) => (t, true),
        Some((t, "rw")) => (t, false),
        _ => (rest, false),
    };
    if name.is_empty() || target.is_empty() {
        return Err(bad());
    }
    Ok(serde_json::json!({"name": name, "target": target, "read_only": read_only}))
}

/// `--secret NAME:DST` (a file, DST an absolute path under `/run/secrets/`) or
/// `--secret NAME:ENV` (a variable) as a spec's `secrets` entry.
pub fn secret_flag(s: &str) -> anyhow::Result<Value> {
    match s.split_once(':') {
        Some((name, dst)) if !name.is_empty() && dst.starts_with('/') => {
            Ok(serde_json::json!({"name": name, "path": dst}))
        }
        Some((name, env)) if !name.is_empty() && !env.is_empty() => {
            Ok(serde_json::json!({"name": name, "env": env}))
        }
        _ => bail!("--secret {s:?}: expected NAME:/run/secrets/FILE or NAME:ENV_VAR"),
    }
}

/// The JSON object in `path` (a spec, or a create body).
pub fn read_object(path: &std::path::Path) -> anyhow::Result<Map<String, Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    match serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))? {
        Value::Object(m) => Ok(m),
        _ => bail!("{}: expected a JSON object", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandlot_proto::spec::SandboxSpec;

    /// `--volume` and `--secret` give the spec's `volumes` and `secrets` entries,
    /// which the spec then validates like any other.
    #[test]
    fn volume_and_secret_flags_are_spec_entries() {
        let mut spec = Map::new();
        for v in ["data:/data", "cache:/cache:ro", "logs:/var/log/app:rw"] {
            array(&mut spec, "volumes").push(volume_flag(v).unwrap());
        }
        for v in ["token:/run/secrets/token", "key:API_KEY"] {
            array(&mut spec, "secrets").push(secret_flag(v).unwrap());
        }
        let s: SandboxSpec = serde_json::from_value(Value::Object(spec)).unwrap();
        s.validate().unwrap();
        let vols: Vec<_> = s
            .volumes
            .iter()
            .map(|v| (v.name.as_str(), v.target.as_str(), v.read_only))
            .collect();
        assert_eq!(
            vols,
            [
                ("data", "/data", false),
                ("cache", "/cache", true),
                ("logs", "/var/log/app", false)
            ]
        );
        assert_eq!(s.secrets[0].path.as_deref(), Some("/run/secrets/token"));
        assert_eq!(s.secrets[1].env.as_deref(), Some("API_KEY"));
        for bad in ["data", ":/data", "data:"] {
            assert!(volume_flag(bad).is_err(), "{bad}");
        }
        for bad in ["token", ":X", "token:"] {
            assert!(secret_flag(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_given_flags_are_set_and_the_result_is_a_valid_spec() {
        let mut spec = Map::new();
        SpecFlags::default().apply(&mut spec).unwrap();
        assert!(spec.is_empty(), "{spec:?}");
        let f = SpecFlags {
            memory: Some(parse_size("256M").unwrap()),
            pids: Some(64),
            timeout: Some(parse_duration("30s").unwrap()),
            mounts: vec!["/srv:/data:rw".into()],
            tmpfs: vec!["/scratch:1M".into()],
            env: vec!["A=1".into(), "B=x=y".into()],
            user: Some("user".into()),
            ..Default::default()
        };
        let mut spec: Map<String, Value> =
            serde_json::from_str(r#"{"env": {"KEEP": "1"}, "resources": {"cpus": 0.5}}"#).unwrap();
        f.apply(&mut spec).unwrap();
        let s: SandboxSpec = serde_json::from_value(Value::Object(spec)).unwrap();
        s.validate().unwrap();
        assert_eq!(s.resources.memory, ByteSize::mib(256));
        assert_eq!(s.resources.cpus, Some(0.5));
        assert_eq!(s.resources.pids, 64);
        assert_eq!(s.env.get("B").map(String::as_str), Some("x=y"));
        assert_eq!(s.env.get("KEEP").map(String::as_str), Some("1"));
        assert_eq!(s.mounts.len(), 2);
        assert_eq!(s.user, "user");
    }

    #[test]
    fn collection_mounts_are_a_mount_form() {
        let f = SpecFlags {
            mounts: vec![
                "collection:docs:/docs:principal=alice,group=eng".into(),
                "/srv:/data".into(),
            ],
            ..Default::default()
        };
        let mut spec = Map::new();
        f.apply(&mut spec).unwrap();
        assert_eq!(
            spec["mounts"][0],
            serde_json::json!({"type": "collection", "collection": "docs", "target": "/docs",
                "principal": "alice", "groups": ["eng"]})
        );
        assert_eq!(spec["mounts"][1]["type"], "bind");
        let s: SandboxSpec = serde_json::from_value(Value::Object(spec)).unwrap();
        s.validate().unwrap();
        let bad = SpecFlags {
            mounts: vec!["collection:docs:/d:group".into()],
            ..Default::default()
        };
        let e = bad.apply(&mut Map::new()).unwrap_err().to_string();
        assert!(e.contains("collection:docs:/d:group"), "{e}");
    }

    #[test]
    fn bad_flags_name_themselves() {
        let f = SpecFlags {
            env: vec!["NOEQUALS".into()],
            ..Default::default()
        };
        let e = f.apply(&mut Map::new()).unwrap_err().to_string();
        assert!(e.contains("--env"), "{e}");
        let f = SpecFlags {
            tmpfs: vec!["/t:lots".into()],
            ..Default::default()
        };
        let e = f.apply(&mut Map::new()).unwrap_err().to_string();
        assert!(e.contains("--tmpfs"), "{e}");
    }
}
