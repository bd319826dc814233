//! Finding `runsc` and learning what the installed release can do: its version,
//! its flags and its platforms are read from the binary (`runsc --version`,
//! `runsc flags`), never assumed from a release number.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Why gVisor cannot be used on this host. The messages name no host path: the
/// daemon shows them to tenants (the log has the path).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    #[error("runsc is not installed (no {0:?} on the daemon's PATH)")]
    NotOnPath(String),
    #[error("runsc was not found where the operator configured it")]
    NotAtPath,
    #[error("runsc does not run: {0}")]
    DoesNotRun(String),
    #[error("runsc {version} is too old: it has no --{flag} flag ({why})")]
    TooOld {
        version: String,
        flag: &'static str,
        why: &'static str,
    },
    #[error("runsc {version} has no {platform:?} platform (it has: {})", have.join(", "))]
    NoPlatform {
        version: String,
        platform: String,
        have: Vec<String>,
    },
    #[error("the gVisor backend needs root")]
    NotRoot,
}

/// What the installed `runsc` is and can do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runsc {
    /// The binary, resolved.
    pub path: PathBuf,
    /// `0.0~20221219.0`, `release-20240513.0`, ...
    pub version: String,
    /// Top-level flag names (`host-uds`, `overlay2`, ...).
    pub flags: BTreeSet<String>,
    /// Platforms the build lists (`ptrace`, `kvm`, `systrap`).
    pub platforms: Vec<String>,
    /// The platform sandboxes run on.
    pub platform: String,
}

/// Flags Sandlot cannot do without, and what for.
const REQUIRED: &[(&str, &str)] = &[
    ("root", "per-sandbox state directories"),
    ("network", "the sandbox's network slot as gVisor's network"),
    ("platform", "choosing the platform"),
    (
        "host-uds",
        "the guest agent listens on a Unix socket the daemon connects to",
    ),
];

impl Runsc {
    /// Finds `runsc` (`configured`: a path, or a name looked up on `PATH`) and
    /// reads its version, flags and platforms; `platform` is `auto` (systrap where
    /// the build has it, else ptrace) or a platform name the build must list.
    pub fn probe(configured: &Path, platform: &str) -> Result<Runsc, Unavailable> {
        let path = locate(configured)?;
        // Both at once: each is a Go program's start (tens of milliseconds), and
        // the daemon answers nothing until they are done. Each is kept from the
        // orphan reaper until waited for: one may end while the other is awaited.
        let spawn = |arg: &str| {
            let child = Command::new(&path)
                .arg(arg)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| Unavailable::DoesNotRun(format!("runsc {arg}: {e}")))?;
            crate::orphans::protect(child.id() as i32);
            Ok(child)
        };
        let text = |arg: &str, child: std::process::Child| {
            let pid = child.id() as i32;
            let out = child.wait_with_output();
            crate::orphans::unprotect(pid);
            let out = out.map_err(|e| Unavailable::DoesNotRun(format!("runsc {arg}: {e}")))?;
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            Ok::<_, Unavailable>(text)
        };
        let version_run = spawn("--version")?;
        let flags_run = match spawn("flags") {
            Ok(c) => c,
            Err(e) => {
                let _ = text("--version", version_run);
                return Err(e);
            }
        };
        let version_text = text("--version", version_run);
        let help = text("flags", flags_run);
        let version = parse_version(&version_text?)
            .ok_or_else(|| Unavailable::DoesNotRun("runsc --version printed no version".into()))?;
        let help = help?;
        let flags = parse_flag_names(&help);
        for (flag, why) in REQUIRED {
            if !flags.contains(*flag) {
                return Err(Unavailable::TooOld { version, flag, why });
            }
        }
        let platforms = parse_platforms(&help);
        let platform =
            choose_platform(platform, &platforms).ok_or_else(|| Unavailable::NoPlatform {
                version: version.clone(),
                platform: platform.to_string(),
                have: platforms.clone(),
            })?;
        Ok(Runsc {
            path,
            version,
            flags,
            platforms,
            platform,
        })
    }

    /// The global flags every `runsc` command of a sandbox gets (`state` is its
    /// own state directory).
    pub fn global_args(&self, state: &Path, network: bool) -> Vec<String> {
        let mut v = vec![
            format!("--root={}", state.display()),
            format!("--platform={}", self.platform),
            format!("--network={}", if network { "sandbox" } else { "none" }),
            // The agent binds its socket in a directory bound from the host, where
            // the daemon connects to it; and a socket a program binds in the root
            // filesystem or `/tmp` (host directories served by the gofer) is a
            // host socket, which its clients in the sandbox must be able to open
            // (a Jupyter kernel's `ipc` sockets never answered).
            "--host-uds=all".to_string(),
        ];
        // Writes reach the host's directories (the writable layer a snapshot reads,
        // the disk limit of its tmpfs) instead of memory of gVisor's own.
        if self.flags.contains("overlay2") {
            v.push("--overlay2=none".into());
        }
        v
    }
}

/// `configured` itself when it names a path (has a `/`), else the first
/// executable of that name on `PATH`.
fn locate(configured: &Path) -> Result<PathBuf, Unavailable> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let name = configured.to_string_lossy();
    if name.contains('/') {
        return if runnable(configured) {
            Ok(configured.to_path_buf())
        } else {
            Err(Unavailable::NotAtPath)
        };
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(configured))
        .find(|p| runnable(p))
        .ok_or_else(|| Unavailable::NotOnPath(name.into_owned()))
}

/// The version in `runsc version X` (first line of `runsc --version`).
pub fn parse_version(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("runsc version "))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// Flag names of `runsc flags` (Go's flag listing: `  -name type` lines).
pub fn parse_flag_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("  -"))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| {
            n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
        })
        .map(str::to_string)
        .collect()
}

/// The platforms the `-platform` flag's help lists ("specifies which platform to
/// use: ptrace (default), kvm."), in its order.
pub fn parse_platforms(text: &str) -> Vec<String> {
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        let Some(rest) = l.strip_prefix("  -platform") else {
            continue;
        };
        if !rest.is_empty() && !rest.starts_with(' ') {
            continue;
        }
        let help = lines.next().unwrap_or_default();
        let Some((_, list)) = help.split_once(':') else {
            return Vec::new();
        };
        return list
            .split(',')
            .filter_map(|p| p.split_whitespace().next())
            .map(|p| p.trim_end_matches('.').to_string())
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric()))
            .collect();
    }
    Vec::new()
}

/// `auto`: systrap where listed, else ptrace (KVM is used only when asked for:
/// it needs hardware virtualization the host may only pretend to have). A named
/// platform must be listed (an empty list, from a help text we could not read,
/// accepts it).
pub fn choose_platform(wanted: &str, listed: &[String]) -> Option<String> {
    let has = |p: &str| listed.iter().any(|l| l == p);
    match wanted {
        "auto" if has("systrap") => Some("systrap".into()),
        "auto" => Some("ptrace".into()),
        p if listed.is_empty() || has(p) => Some(p.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `runsc flags` of Debian 12's runsc (0.0~20221219.0), abridged.
    const OLD: &str = "  -host-uds value
    \tcontrols permission to access host Unix-domain sockets. Values: none|open|create|all, default: none
  -network value
    \tspecifies which network to use: sandbox (default), host, none. Using network inside the sandbox is more secure because it's isolated from the host network.
  -overlay2 value
    \twrap mounts with overlayfs.
  -platform string
    \tspecifies which platform to use: ptrace (default), kvm. (default \"ptrace\")
  -platform_device_path string
    \tpath to a platform-specific device file.
  -root string
    \troot directory for storage of container state.
";

    #[test]
    fn flags_and_platforms_are_read_from_the_help_text() {
        let f = parse_flag_names(OLD);
        for n in [
            "host-uds",
            "network",
            "overlay2",
            "platform",
            "platform_device_path",
            "root",
        ] {
            assert!(f.contains(n), "{n} in {f:?}");
        }
        assert_eq!(parse_platforms(OLD), vec!["ptrace", "kvm"]);
        let newer = "  -platform string\n    \tspecifies which platform to use: systrap (default), ptrace, kvm. (default \"systrap\")\n";
        assert_eq!(parse_platforms(newer), vec!["systrap", "ptrace", "kvm"]);
        assert_eq!(
            parse_version("runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n").as_deref(),
            Some("0.0~20221219.0")
        );
        assert_eq!(parse_version("spec: 1.0.2-dev\n"), None);
    }

    #[test]
    fn auto_takes_systrap_where_the_build_has_it_and_kvm_only_when_asked() {
        let old = vec!["ptrace".to_string(), "kvm".to_string()];
        let new = vec![
            "systrap".to_string(),
            "ptrace".to_string(),
            "kvm".to_string(),
        ];
        assert_eq!(choose_platform("auto", &old).as_deref(), Some("ptrace"));
        assert_eq!(choose_platform("auto", &new).as_deref(), Some("systrap"));
        assert_eq!(choose_platform("kvm", &old).as_deref(), Some("kvm"));
        assert_eq!(choose_platform("systrap", &old), None);
    }

    #[test]
    fn a_runsc_without_host_uds_is_too_old_and_says_why() {
        let e = Unavailable::TooOld {
            version: "0.0~2021".into(),
            flag: "host-uds",
            why: "the guest agent listens on a Unix socket the daemon connects to",
        };
        let m = e.to_string();
        assert!(m.contains("0.0~2021") && m.contains("--host-uds"), "{m}");
        assert!(!parse_flag_names("  -fsgofer-host-uds\n").contains("host-uds"));
    }
}
