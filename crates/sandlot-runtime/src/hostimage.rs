//! The built-in `host` image: the host's `/usr` (and the top-level `/bin`, `/lib*`,
//! `/sbin` entries) bound read-only, plus a synthesized `/etc`.
//!
//! Only non-sensitive host `/etc` entries are exposed (an allow list); the host's
//! `/etc/shadow`, `/root`, `/home` and `/var` never are.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Top-level host entries that make up the image's read-only part.
pub const TOP_LEVEL: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Host `/etc` entries bound read-only when present. None of them holds secrets.
pub const ETC_ALLOW: &[&str] = &[
    "alternatives",
    "bash.bashrc",
    "ca-certificates.conf",
    "debian_version",
    "environment",
    "ethertypes",
    "gai.conf",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "login.defs",
    "magic",
    "magic.mime",
    "mailcap",
    "matplotlibrc",
    "manpath.config",
    "mime.types",
    "os-release",
    "perl",
    "profile",
    "profile.d",
    "protocols",
    "rpc",
    "services",
    "ssl/certs",
    "ssl/openssl.cnf",
    "terminfo",
    "timezone",
    "fonts",
    "gitconfig",
];

/// Prefixes of host `/etc` entries bound read-only (e.g. `python3.11`).
pub const ETC_ALLOW_PREFIX: &[&str] = &["python3"];

/// What a host path is, as far as the image is concerned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HostEntry {
    Dir,
    File,
    Symlink(String),
}

/// Facts about the host that the `host` image depends on, gathered once.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HostFacts {
    /// `(name, kind)` for each present [`TOP_LEVEL`] entry.
    pub top_level: Vec<(String, HostEntry)>,
    /// `(path relative to /etc, kind)` for each present allowed `/etc` entry.
    pub etc: Vec<(String, HostEntry)>,
}

fn entry(p: &Path) -> Option<HostEntry> {
    let md = std::fs::symlink_metadata(p).ok()?;
    if md.file_type().is_symlink() {
        let t = std::fs::read_link(p).ok()?;
        Some(HostEntry::Symlink(t.to_string_lossy().into_owned()))
    } else if md.is_dir() {
        Some(HostEntry::Dir)
    } else if md.is_file() {
        Some(HostEntry::File)
    } else {
        None
    }
}

impl HostFacts {
    /// Probes the host filesystem rooted at `root` (normally `/`).
    pub fn probe(root: &Path) -> HostFacts {
        let top_level = TOP_LEVEL
            .iter()
            .filter_map(|n| entry(&root.join(n)).map(|e| (n.to_string(), e)))
            .collect();
        let mut etc: Vec<(String, HostEntry)> = ETC_ALLOW
            .iter()
            .filter_map(|n| entry(&root.join("etc").join(n)).map(|e| (n.to_string(), e)))
            .collect();
        if let Ok(rd) = std::fs::read_dir(root.join("etc")) {
            let mut extra: Vec<(String, HostEntry)> = rd
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if ETC_ALLOW_PREFIX.iter().any(|p| name.starts_with(p)) {
                        entry(&e.path()).map(|k| (name, k))
                    } else {
                        None
                    }
                })
                .collect();
            extra.sort_by(|a, b| a.0.cmp(&b.0));
            etc.extend(extra);
        }
        HostFacts { top_level, etc }
    }
}

/// Synthesized `/etc` files: `(name, contents, mode)`.
/// The `/etc` files the runtime writes into the root of a sandbox of a store image
/// (which brings its own `/etc`): its identity, written again at every start, as
/// (name, contents, mode).
pub fn image_identity_files(hostname: &str) -> Vec<(&'static str, String, u32)> {
    synthesized_etc(hostname)
        .into_iter()
        .filter(|f| matches!(f.0, "hostname" | "hosts"))
        .collect()
}

pub fn synthesized_etc(hostname: &str) -> Vec<(&'static str, String, u32)> {
    vec![
        (
            "passwd",
            "root:x:0:0:root:/root:/bin/bash\n\
             user:x:1000:1000:user:/home/user:/bin/bash\n\
             nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
                .to_string(),
            0o644,
        ),
        (
            "group",
            "root:x:0:\ntty:x:5:\nusers:x:100:user\nuser:x:1000:\nnogroup:x:65534:\n".to_string(),
            0o644,
        ),
        ("hostname", format!("{hostname}\n"), 0o644),
        (
            "hosts",
            format!("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{hostname}\n"),
            0o644,
        ),
        ("resolv.conf", "# no network in this sandbox\n".to_string(), 0o644),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n\
             protocols: files\nservices: files\nethers: files\nrpc: files\n"
                .to_string(),
            0o644,
        ),
    ]
}

/// The environment every process starts with, before the spec's and the exec's.
pub fn base_env(hostname: &str) -> Vec<(String, String)> {
    vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        ("LANG".into(), "C.UTF-8".into()),
        ("HOSTNAME".into(), hostname.into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthesized_etc_has_root_and_user_and_no_shadow() {
        let files = synthesized_etc("sb");
        let passwd = &files.iter().find(|f| f.0 == "passwd").unwrap().1;
        assert!(passwd.starts_with("root:x:0:0:"));
        assert!(passwd.contains("\nuser:x:1000:1000:"));
        assert!(!files.iter().any(|f| f.0 == "shadow"));
        let hosts = &files.iter().find(|f| f.0 == "hosts").unwrap().1;
        assert!(hosts.contains("\tsb\n"));
    }

    #[test]
    fn allow_list_excludes_secrets() {
        for bad in [
            "shadow",
            "gshadow",
            "ssh",
            "sudoers",
            "ssl/private",
            "machine-id",
        ] {
            assert!(!ETC_ALLOW.contains(&bad), "{bad} must never be exposed");
        }
    }

    #[test]
    fn probe_finds_entries_in_a_fake_root() {
        let d = std::env::temp_dir().join(format!("sandlot-hostfacts-{}", std::process::id()));
        std::fs::create_dir_all(d.join("usr/bin")).unwrap();
        std::fs::create_dir_all(d.join("etc/python3.11")).unwrap();
        std::fs::write(d.join("etc/shadow"), "secret").unwrap();
        std::fs::write(d.join("etc/ld.so.cache"), "x").unwrap();
        std::os::unix::fs::symlink("usr/bin", d.join("bin")).unwrap();
        let f = HostFacts::probe(&d);
        assert!(f.top_level.contains(&("usr".into(), HostEntry::Dir)));
        assert!(f
            .top_level
            .contains(&("bin".into(), HostEntry::Symlink("usr/bin".into()))));
        assert!(f.etc.contains(&("ld.so.cache".into(), HostEntry::File)));
        assert!(f.etc.contains(&("python3.11".into(), HostEntry::Dir)));
        assert!(!f.etc.iter().any(|(n, _)| n == "shadow"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
