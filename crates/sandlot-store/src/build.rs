//! Declarative image builds, the planning half: a build spec (TOML) or the common
//! Dockerfile subset parsed into steps, cache keys, and `copy` layers staged from
//! the build context. Running `run` steps in sandboxes is the daemon's.
//!
//! A step's cache key is sha256 over the parent image id, the step's canonical
//! text, whether the network was open, and (for `copy`) every copied file's
//! path, mode and content hash; so an unchanged spec is all cache hits, and
//! changing step N rebuilds from N.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use crate::Digest;

/// Errors of build specs and contexts.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{origin}: {problem}")]
    Spec { origin: String, problem: String },
    #[error("{origin}: copy source {path:?}: {problem}")]
    Context {
        origin: String,
        path: String,
        problem: String,
    },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
}

fn spec_err(origin: &str, problem: impl Into<String>) -> BuildError {
    BuildError::Spec {
        origin: origin.to_string(),
        problem: problem.into(),
    }
}

/// One build step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A shell command (`/bin/sh -c`).
    Run(String),
    /// A command without a shell (Dockerfile exec form).
    RunArgv(Vec<String>),
    /// A shell command run as `user` rather than the image's user (E2B's
    /// `run_cmd(..., user=...)`); the image's user stays as it was.
    RunAs {
        user: String,
        command: String,
    },
    /// Context paths to a destination in the image.
    Copy {
        src: Vec<String>,
        dest: String,
    },
    Env(Vec<(String, String)>),
    Workdir(String),
    User(String),
    AptInstall(Vec<String>),
    PipInstall(Vec<String>),
}

impl Step {
    /// Canonical text (cache key input and progress display).
    pub fn text(&self) -> String {
        match self {
            Step::Run(c) => format!("RUN {c}"),
            Step::RunArgv(a) => format!("RUN {}", serde_json::to_string(a).unwrap_or_default()),
            Step::RunAs { user, command } => format!("RUN (as {user}) {command}"),
            Step::Copy { src, dest } => format!("COPY {} {dest}", src.join(" ")),
            Step::Env(kv) => format!(
                "ENV {}",
                kv.iter()
                    .map(|(k, v)| format!("{k}={v:?}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            Step::Workdir(w) => format!("WORKDIR {w}"),
            Step::User(u) => format!("USER {u}"),
            Step::AptInstall(p) => format!("APT_INSTALL {}", p.join(" ")),
            Step::PipInstall(p) => format!("PIP_INSTALL {}", p.join(" ")),
        }
    }

    /// Whether the step runs a command in a sandbox (and so needs a network
    /// decision).
    pub fn runs(&self) -> bool {
        matches!(
            self,
            Step::Run(_)
                | Step::RunArgv(_)
                | Step::RunAs { .. }
                | Step::AptInstall(_)
                | Step::PipInstall(_)
        )
    }

    /// The argv a running step executes.
    pub fn argv(&self) -> Option<Vec<String>> {
        let sh = |c: String| Some(vec!["/bin/sh".into(), "-c".into(), c]);
        match self {
            Step::Run(c) | Step::RunAs { command: c, .. } => sh(c.clone()),
            Step::RunArgv(a) => Some(a.clone()),
            Step::AptInstall(p) => sh(format!(
                "set -e; export DEBIAN_FRONTEND=noninteractive; apt-get update -qq; apt-get install -y -qq --no-install-recommends {}; apt-get clean; rm -rf /var/lib/apt/lists/*",
                shell_words(p)
            )),
            Step::PipInstall(p) => sh(format!(
                "set -e; if command -v pip3 >/dev/null; then pip=pip3; else pip=pip; fi; $pip install --no-cache-dir --break-system-packages {} 2>&1 || $pip install --no-cache-dir {}",
                shell_words(p),
                shell_words(p)
            )),
            _ => None,
        }
    }

    /// The user a running step runs as when it names one (else the image's).
    pub fn user(&self) -> Option<&str> {
        match self {
            Step::RunAs { user, .. } => Some(user),
            _ => None,
        }
    }

    /// Whether a running step needs the network (package helpers do).
    pub fn needs_network(&self) -> bool {
        matches!(self, Step::AptInstall(_) | Step::PipInstall(_))
    }
}

fn shell_words(w: &[String]) -> String {
    w.iter()
        .map(|s| format!("'{}'", s.replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A parsed build: the base and the steps, each with where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildSpec {
    /// The base image (`NAME[:TAG]`, an id, or `debian:SUITE`).
    pub from: String,
    /// (`line 3` / `steps[2]`, step).
    pub steps: Vec<(String, Step)>,
    /// `run` steps may use the network (an explicit choice; package helpers
    /// require it).
    pub network: bool,
}

fn valid_package(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('-')
        && p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-._:=<>~[],!".contains(&b))
}

/// Parses a TOML build spec:
///
/// ```toml
/// from = "team/base:1"
/// network = false
/// [[steps]]
/// run = "make install"
/// [[steps]]
/// copy = { src = ["app/"], dest = "/opt/app" }   # or copy = ["SRC...", "DEST"]
/// [[steps]]
/// env = { MODE = "prod" }
/// ```
pub fn parse_toml(text: &str) -> Result<BuildSpec, BuildError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Raw {
        from: Option<String>,
        #[serde(default)]
        network: bool,
        #[serde(default)]
        steps: Vec<toml::Table>,
    }
    let raw: Raw = toml::from_str(text).map_err(|e| spec_err("build spec", e.to_string()))?;
    let mut from = raw.from;
    let mut steps = Vec::new();
    for (i, t) in raw.steps.into_iter().enumerate() {
        let origin = format!("steps[{i}]");
        if t.len() != 1 {
            return Err(spec_err(
                &origin,
                format!(
                    "a step has exactly one of from, run, copy, env, workdir, user, apt_install, pip_install (found {})",
                    t.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        let (k, v) = t.into_iter().next().expect("one entry");
        let string = |v: &toml::Value| -> Result<String, BuildError> {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| spec_err(&origin, format!("{k} takes a string")))
        };
        let strings = |v: &toml::Value| -> Result<Vec<String>, BuildError> {
            let a = match v {
                toml::Value::String(s) => vec![s.clone()],
                toml::Value::Array(a) => a
                    .iter()
                    .map(|x| x.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| spec_err(&origin, format!("{k} takes strings")))?,
                _ => {
                    return Err(spec_err(
                        &origin,
                        format!("{k} takes a string or a list of strings"),
                    ))
                }
            };
            Ok(a)
        };
        let step = match k.as_str() {
            "from" => {
                if i != 0 || from.is_some() {
                    return Err(spec_err(&origin, "from must be the first step (or the top-level from)"));
                }
                from = Some(string(&v)?);
                continue;
            }
            "run" => match &v {
                toml::Value::Array(_) => Step::RunArgv(strings(&v)?),
                _ => Step::Run(string(&v)?),
            },
            "copy" => match &v {
                toml::Value::Table(t) => {
                    let src = t
                        .get("src")
                        .map(strings)
                        .transpose()?
                        .ok_or_else(|| spec_err(&origin, "copy needs src"))?;
                    let dest = t
                        .get("dest")
                        .map(string)
                        .transpose()?
                        .ok_or_else(|| spec_err(&origin, "copy needs dest"))?;
                    if let Some(x) = t.keys().find(|k| *k != "src" && *k != "dest") {
                        return Err(spec_err(&origin, format!("copy: unknown key {x}")));
                    }
                    Step::Copy { src, dest }
                }
                _ => {
                    let mut a = strings(&v)?;
                    if a.len() < 2 {
                        return Err(spec_err(&origin, "copy takes [SRC..., DEST] or {src, dest}"));
                    }
                    let dest = a.pop().expect("len >= 2");
                    Step::Copy { src: a, dest }
                }
            },
            "env" => {
                let t = v
                    .as_table()
                    .ok_or_else(|| spec_err(&origin, "env takes a table of NAME = \"value\""))?;
                let mut kv = Vec::new();
                for (n, x) in t {
                    let s = x
                        .as_str()
                        .ok_or_else(|| spec_err(&origin, format!("env.{n} must be a string")))?;
                    kv.push((n.clone(), s.to_string()));
                }
                Step::Env(kv)
            }
            "workdir" => Step::Workdir(string(&v)?),
            "user" => Step::User(string(&v)?),
            "apt_install" => Step::AptInstall(strings(&v)?),
            "pip_install" => Step::PipInstall(strings(&v)?),
            other => {
                return Err(spec_err(
                    &origin,
                    format!("unknown step {other:?} (steps: from, run, copy, env, workdir, user, apt_install, pip_install)"),
                ))
            }
        };
        steps.push((origin, step));
    }
    let from = from.ok_or_else(|| spec_err("build spec", "no base image: set from = \"NAME\""))?;
    let spec = BuildSpec {
        from,
        steps,
        network: raw.network,
    };
    check(&spec)?;
    Ok(spec)
}

/// Checks a spec's steps (what the parsers check of what they read).
pub fn check(spec: &BuildSpec) -> Result<(), BuildError> {
    for (origin, s) in &spec.steps {
        match s {
            Step::Run(c) if c.trim().is_empty() => {
                return Err(spec_err(origin, "empty run command"))
            }
            Step::RunArgv(a) if a.is_empty() => return Err(spec_err(origin, "empty run command")),
            Step::RunAs { user, command } => {
                if command.trim().is_empty() {
                    return Err(spec_err(origin, "empty run command"));
                }
                if user.is_empty() {
                    return Err(spec_err(origin, "empty user"));
                }
            }
            Step::AptInstall(p) | Step::PipInstall(p) => {
                if p.is_empty() {
                    return Err(spec_err(origin, "no packages given"));
                }
                if let Some(bad) = p.iter().find(|p| !valid_package(p)) {
                    return Err(spec_err(origin, format!("{bad:?} is not a package name")));
                }
                if !spec.network {
                    return Err(spec_err(
                        origin,
                        "installing packages needs the network: set network = true (TOML) or pass --network",
                    ));
                }
            }
            Step::Env(kv) => {
                for (k, _) in kv {
                    if k.is_empty() || k.contains('=') || k.contains('\0') {
                        return Err(spec_err(origin, format!("invalid variable name {k:?}")));
                    }
                }
            }
            Step::Workdir(w) if !w.starts_with('/') => {
                return Err(spec_err(origin, format!("workdir {w:?} must be absolute")))
            }
            Step::User(u) if u.is_empty() => return Err(spec_err(origin, "empty user")),
            Step::Copy { src, dest } => {
                if dest.is_empty() {
                    return Err(spec_err(origin, "empty copy destination"));
                }
                for s in src {
                    context_relative(origin, s)?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Joins Dockerfile continuation lines; yields (first line number, text).
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut start = 0;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if cur.is_empty() && (t.is_empty() || t.starts_with('#')) {
            continue;
        }
        if !cur.is_empty() && t.starts_with('#') {
            continue;
        }
        if cur.is_empty() {
            start = i + 1;
        }
        if let Some(body) = t.strip_suffix('\\') {
            cur.push_str(body);
            cur.push(' ');
        } else {
            cur.push_str(t);
            out.push((start, std::mem::take(&mut cur)));
        }
    }
    if !cur.trim().is_empty() {
        out.push((start, cur));
    }
    out
}

fn json_array(origin: &str, s: &str) -> Result<Option<Vec<String>>, BuildError> {
    if !s.trim_start().starts_with('[') {
        return Ok(None);
    }
    serde_json::from_str::<Vec<String>>(s.trim())
        .map(Some)
        .map_err(|e| spec_err(origin, format!("not a JSON array of strings: {e}")))
}

/// Parses the Dockerfile subset: FROM, RUN, COPY, ENV, WORKDIR, USER. Anything
/// else is an error naming its line. `network`: whether RUN may use the network.
pub fn parse_dockerfile(text: &str, network: bool) -> Result<BuildSpec, BuildError> {
    let mut from = None;
    let mut steps = Vec::new();
    for (n, line) in logical_lines(text) {
        let origin = format!("Dockerfile line {n}");
        let (ins, rest) = line
            .split_once(char::is_whitespace)
            .map(|(a, b)| (a, b.trim()))
            .unwrap_or((line.as_str(), ""));
        let ins_up = ins.to_ascii_uppercase();
        if rest.is_empty() {
            return Err(spec_err(&origin, format!("{ins_up} needs arguments")));
        }
        if rest.starts_with("--") && ins_up != "RUN" {
            let flag = rest.split_whitespace().next().unwrap_or(rest);
            return Err(spec_err(
                &origin,
                format!("{ins_up} {flag} is not supported"),
            ));
        }
        let step = match ins_up.as_str() {
            "FROM" => {
                if from.is_some() {
                    return Err(spec_err(&origin, "multi-stage builds (a second FROM) are not supported"));
                }
                let mut w = rest.split_whitespace();
                let img = w.next().unwrap_or_default();
                if w.next().is_some() {
                    return Err(spec_err(&origin, "FROM ... AS (stages) is not supported"));
                }
                from = Some(img.to_string());
                continue;
            }
            "RUN" => {
                if rest.starts_with("--") {
                    return Err(spec_err(&origin, format!("RUN {} is not supported", rest.split_whitespace().next().unwrap_or(""))));
                }
                match json_array(&origin, rest)? {
                    Some(a) => Step::RunArgv(a),
                    None => Step::Run(rest.to_string()),
                }
            }
            "COPY" => {
                let mut a = match json_array(&origin, rest)? {
                    Some(a) => a,
                    None => rest.split_whitespace().map(str::to_string).collect(),
                };
                if a.len() < 2 {
                    return Err(spec_err(&origin, "COPY takes SRC... DEST"));
                }
                let dest = a.pop().expect("len >= 2");
                Step::Copy { src: a, dest }
            }
            "ENV" => {
                let mut kv = Vec::new();
                if rest.contains('=') {
                    for w in shell_split(&origin, rest)? {
                        let (k, v) = w.split_once('=').ok_or_else(|| {
                            spec_err(&origin, format!("ENV {w:?}: expected NAME=VALUE"))
                        })?;
                        kv.push((k.to_string(), v.to_string()));
                    }
                } else {
                    let (k, v) = rest
                        .split_once(char::is_whitespace)
                        .ok_or_else(|| spec_err(&origin, "ENV takes NAME=VALUE or NAME VALUE"))?;
                    kv.push((k.to_string(), v.trim().to_string()));
                }
                Step::Env(kv)
            }
            "WORKDIR" => Step::Workdir(rest.to_string()),
            "USER" => Step::User(rest.to_string()),
            other => {
                return Err(spec_err(
                    &origin,
                    format!("unsupported instruction {other} (supported: FROM, RUN, COPY, ENV, WORKDIR, USER)"),
                ))
            }
        };
        if from.is_none() {
            return Err(spec_err(&origin, "the first instruction must be FROM"));
        }
        steps.push((origin, step));
    }
    let from = from.ok_or_else(|| spec_err("Dockerfile", "no FROM instruction"))?;
    let spec = BuildSpec {
        from,
        steps,
        network,
    };
    check(&spec)?;
    Ok(spec)
}

/// Splits `A="x y" B=z` (double and single quotes, backslash escapes).
fn shell_split(origin: &str, s: &str) -> Result<Vec<String>, BuildError> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, '"') | (None, '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (Some(q), c) if c == q => quote = None,
            (q, '\\') if q != Some('\'') => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
                in_word = true;
            }
            (_, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return Err(spec_err(origin, "unterminated quote"));
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// A context path as a relative path inside the context (no `..`, not absolute).
fn context_relative(origin: &str, p: &str) -> Result<PathBuf, BuildError> {
    let path = Path::new(p);
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(x) => out.push(x),
            Component::CurDir => {}
            _ => {
                return Err(BuildError::Context {
                    origin: origin.to_string(),
                    path: p.to_string(),
                    problem: "escapes the build context (absolute or '..')".into(),
                })
            }
        }
    }
    Ok(out)
}

/// `rel` under the build context `ctx`, with no symbolic link among the directories
/// on the way: the context is the client's, and `d -> /etc` then `copy d/shadow`
/// would copy a host file. (The last component may be a link: it is copied as one.)
fn in_context(ctx: &Path, rel: &Path, origin: &str, src: &str) -> Result<PathBuf, BuildError> {
    if let Some(link) = crate::link_on_the_way(ctx, rel, false) {
        return Err(BuildError::Context {
            origin: origin.to_string(),
            path: src.to_string(),
            problem: format!(
                "goes through the symbolic link {} (links are copied as links, never followed)",
                link.display()
            ),
        });
    }
    Ok(ctx.join(rel))
}

/// sha256 over path, mode and content of every file a `copy` takes (sorted), so
/// the cache key changes when any copied byte does.
pub fn hash_copy_sources(ctx: &Path, origin: &str, src: &[String]) -> Result<Digest, BuildError> {
    let mut h = Sha256::new();
    for s in src {
        let rel = context_relative(origin, s)?;
        let top = in_context(ctx, &rel, origin, s)?;
        let mut files = BTreeMap::new();
        walk(ctx, &top, origin, s, &mut files)?;
        for (p, (mode, content)) in files {
            h.update(p.as_bytes());
            h.update([0]);
            h.update(mode.to_le_bytes());
            h.update(content.0);
        }
    }
    Ok(Digest(h.finalize().into()))
}

fn walk(
    ctx: &Path,
    p: &Path,
    origin: &str,
    src: &str,
    out: &mut BTreeMap<String, (u32, Digest)>,
) -> Result<(), BuildError> {
    let m = fs::symlink_metadata(p).map_err(|e| BuildError::Context {
        origin: origin.to_string(),
        path: src.to_string(),
        problem: if e.kind() == io::ErrorKind::NotFound {
            format!(
                "{} is not in the build context",
                p.strip_prefix(ctx).unwrap_or(p).display()
            )
        } else {
            e.to_string()
        },
    })?;
    let rel = p.strip_prefix(ctx).unwrap_or(p).display().to_string();
    if m.is_dir() {
        out.insert(rel, (m.mode(), Digest([0; 32])));
        let mut entries: Vec<_> = fs::read_dir(p)
            .map_err(|source| BuildError::Io {
                op: "read",
                path: p.display().to_string(),
                source,
            })?
            .flatten()
            .map(|e| e.path())
            .collect();
        entries.sort();
        for e in entries {
            walk(ctx, &e, origin, src, out)?;
        }
    } else if m.file_type().is_symlink() {
        let t = fs::read_link(p).map_err(|source| BuildError::Io {
            op: "read link",
            path: p.display().to_string(),
            source,
        })?;
        out.insert(
            rel,
            (m.mode(), Digest::of(t.as_os_str().as_encoded_bytes())),
        );
    } else if m.is_file() {
        let mut f = fs::File::open(p).map_err(|source| BuildError::Io {
            op: "open",
            path: p.display().to_string(),
            source,
        })?;
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = f.read(&mut buf).map_err(|source| BuildError::Io {
                op: "read",
                path: p.display().to_string(),
                source,
            })?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        out.insert(rel, (m.mode(), Digest(h.finalize().into())));
    } else {
        return Err(BuildError::Context {
            origin: origin.to_string(),
            path: src.to_string(),
            problem: format!("{rel} is not a file, directory or symlink"),
        });
    }
    Ok(())
}

/// Stages the layer of a `copy` step in `layer` (an empty directory): each
/// source (a file, or a directory whose contents are copied) lands at `dest`,
/// relative to `workdir` when not absolute. Symlinks are copied as links.
///
/// The layer is written only through descriptors ([`Staging`]): an earlier source
/// of the same copy may have put a link there (`a/etc -> /etc`), and a later one
/// (`b/etc/cron.d/x`) must never write, create or change modes through it.
pub fn stage_copy(
    ctx: &Path,
    origin: &str,
    src: &[String],
    dest: &str,
    workdir: Option<&str>,
    layer: &Path,
) -> Result<(), BuildError> {
    let dest_abs = if dest.starts_with('/') {
        dest.to_string()
    } else {
        format!("{}/{dest}", workdir.unwrap_or("/").trim_end_matches('/'))
    };
    let dest_rel = context_relative(origin, dest_abs.trim_start_matches('/')).map_err(|_| {
        spec_err(
            origin,
            format!("copy destination {dest:?} must not contain '..'"),
        )
    })?;
    let into_dir = dest.ends_with('/') || src.len() > 1;
    let staging = Staging::open(layer).map_err(|source| BuildError::Io {
        op: "open the staging layer",
        path: "/".into(),
        source,
    })?;
    for s in src {
        let rel = context_relative(origin, s)?;
        let from = in_context(ctx, &rel, origin, s)?;
        let m = fs::symlink_metadata(&from).map_err(|_| BuildError::Context {
            origin: origin.to_string(),
            path: s.clone(),
            problem: "is not in the build context".into(),
        })?;
        let target = if !m.is_dir() && into_dir {
            dest_rel.join(from.file_name().unwrap_or_default())
        } else {
            dest_rel.clone()
        };
        let fail = |e: StageError| e.into_build_error(origin, s);
        match target.file_name() {
            Some(name) => {
                let parent = staging
                    .dir(target.parent().unwrap_or(Path::new("")))
                    .map_err(fail)?;
                copy_entry(&from, parent.as_fd(), name, &target).map_err(fail)?;
            }
            // A directory's contents onto the layer's root.
            None if m.is_dir() => {
                copy_contents(&from, staging.root.as_fd(), &target).map_err(fail)?
            }
            None => {
                return Err(BuildError::Context {
                    origin: origin.to_string(),
                    path: s.clone(),
                    problem: format!(
                        "copy destination {dest:?} is the image's root directory, not a file"
                    ),
                })
            }
        }
    }
    Ok(())
}

/// Gives the directories on the way to a `copy` step's destination, which the
/// staged layer holds as fresh `0755 root` directories, the owner and mode they
/// have in the base image (`lowers`: its layer directories, top first), so that
/// a copy into `/home/user/work/` leaves `work` its user's, as `docker build`
/// does. Each path is opened beneath its root without following a link, in the
/// layer as in the base's layers; a directory the base does not have keeps its
/// `0755 root`.
pub fn inherit_dirs(
    layer: &Path,
    dest: &str,
    workdir: Option<&str>,
    lowers: &[PathBuf],
) -> Result<(), BuildError> {
    let dest_abs = if dest.starts_with('/') {
        dest.to_string()
    } else {
        format!("{}/{dest}", workdir.unwrap_or("/").trim_end_matches('/'))
    };
    let io = |op: &'static str, at: &Path| {
        let path = format!("/{}", at.display());
        move |e: Errno| BuildError::Io {
            op,
            path,
            source: e.into(),
        }
    };
    // The directory `rel` beneath `root` with no link on the way: `Ok(None)`
    // when nothing is there, `Err(true)` when something else hides it.
    let beneath = |root: &Path, rel: &Path| -> Result<Option<OwnedFd>, Result<bool, Errno>> {
        let r = rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(Err)?;
        match rustix::fs::openat2(
            &r,
            rel,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::NOENT) => Ok(None),
            Err(Errno::NOTDIR | Errno::LOOP | Errno::XDEV) => Err(Ok(true)),
            Err(e) => Err(Err(e)),
        }
    };
    let mut rel = PathBuf::new();
    for c in Path::new(dest_abs.trim_start_matches('/')).components() {
        let Component::Normal(c) = c else { continue };
        rel.push(c);
        let staged = match beneath(layer, &rel) {
            Ok(Some(fd)) => fd,
            Ok(None) | Err(Ok(_)) => break,
            Err(Err(e)) => return Err(io("open", &rel)(e)),
        };
        // The topmost layer with an entry there decides (a whiteout or a file
        // hides the directories below it).
        for lower in lowers {
            let dir = match beneath(lower, &rel) {
                Ok(Some(fd)) => fd,
                Ok(None) => continue,
                Err(Ok(_)) => break,
                Err(Err(e)) => return Err(io("open", &rel)(e)),
            };
            let st = rustix::fs::fstat(&dir).map_err(io("stat", &rel))?;
            rustix::fs::fchown(
                &staged,
                Some(rustix::fs::Uid::from_raw(st.st_uid)),
                Some(rustix::fs::Gid::from_raw(st.st_gid)),
            )
            .map_err(io("chown", &rel))?;
            rustix::fs::fchmod(&staged, Mode::from_raw_mode(st.st_mode & 0o7777))
                .map_err(io("chmod", &rel))?;
            break;
        }
    }
    Ok(())
}

/// Why a destination in the staged layer could not be written; paths are the
/// image's (`/etc/x`), never the host's.
#[derive(Debug)]
enum StageError {
    /// `at` is a symbolic link an earlier source of this copy put in the layer,
    /// where a directory is needed.
    Link { at: PathBuf },
    /// `at` is a file where a directory is needed, or a directory where a file
    /// or a link is to go.
    Kind { at: PathBuf, problem: &'static str },
    Io {
        op: &'static str,
        at: PathBuf,
        source: io::Error,
    },
}

impl StageError {
    fn io(op: &'static str, at: &Path) -> impl FnOnce(io::Error) -> StageError {
        let at = at.to_path_buf();
        move |source| StageError::Io { op, at, source }
    }

    fn into_build_error(self, origin: &str, src: &str) -> BuildError {
        let shown = |p: &Path| format!("/{}", p.display());
        let context = |problem: String| BuildError::Context {
            origin: origin.to_string(),
            path: src.to_string(),
            problem,
        };
        match self {
            StageError::Link { at } => context(format!(
                "copy destination goes through {}, a symbolic link this copy put in the image (links in the layer being built are never followed)",
                shown(&at)
            )),
            StageError::Kind { at, problem } => context(format!("copy destination {} {problem}", shown(&at))),
            StageError::Io { op, at, source } => BuildError::Io {
                op,
                path: shown(&at),
                source,
            },
        }
    }
}

/// The directory a `copy` step's layer is staged in, written only through
/// descriptors: each directory is opened beneath the root without following a
/// symbolic link (`openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, one component
/// at a time, created when missing), files are created with `O_EXCL | O_NOFOLLOW`
/// in a directory so opened, and modes are set through the descriptor.
struct Staging {
    root: OwnedFd,
}

impl Staging {
    fn open(layer: &Path) -> io::Result<Staging> {
        let root = rustix::fs::open(
            layer,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Staging { root })
    }

    /// The directory `rel` of the layer, with the missing ones on the way created
    /// (mode 0755, as `mkdir -p` in an image).
    fn dir(&self, rel: &Path) -> Result<OwnedFd, StageError> {
        let mut fd = rustix::io::dup(&self.root).map_err(|e| StageError::Io {
            op: "open",
            at: PathBuf::new(),
            source: e.into(),
        })?;
        let mut at = PathBuf::new();
        for c in rel.components() {
            at.push(c);
            fd = dir_at(fd.as_fd(), c.as_os_str(), 0o755, &at)?;
        }
        Ok(fd)
    }
}

/// Opens the directory `name` in `parent`, creating it with `mode` if it is
/// missing; a symbolic link or a file there is refused (`at` names it).
fn dir_at(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    mode: u32,
    at: &Path,
) -> Result<OwnedFd, StageError> {
    let open = || {
        rustix::fs::openat2(
            parent,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
    };
    let r = match open() {
        Err(Errno::NOENT) => match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(mode)) {
            Ok(()) | Err(Errno::EXIST) => open(),
            Err(e) => Err(e),
        },
        r => r,
    };
    r.map_err(|e| match e {
        // A link is refused with one or the other, depending on the kernel's order.
        Errno::LOOP | Errno::NOTDIR => match kind_at(parent, name, at) {
            Ok(Some(FileType::Symlink)) => StageError::Link {
                at: at.to_path_buf(),
            },
            Ok(_) => StageError::Kind {
                at: at.to_path_buf(),
                problem: "is a file in the image, not a directory",
            },
            Err(e) => e,
        },
        e => StageError::Io {
            op: "create",
            at: at.to_path_buf(),
            source: e.into(),
        },
    })
}

/// What is at `name` in `parent`, without following a link (`None`: nothing).
fn kind_at(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    at: &Path,
) -> Result<Option<FileType>, StageError> {
    match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(FileType::from_raw_mode(st.st_mode))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(StageError::Io {
            op: "stat",
            at: at.to_path_buf(),
            source: e.into(),
        }),
    }
}

/// Makes room for a file or link at `name`: what an earlier source put there
/// (a file or a link, never followed) is replaced; a directory is not.
fn replace_at(parent: BorrowedFd<'_>, name: &OsStr, at: &Path) -> Result<(), StageError> {
    match kind_at(parent, name, at)? {
        None => Ok(()),
        Some(FileType::Directory) => Err(StageError::Kind {
            at: at.to_path_buf(),
            problem: "is a directory in the image",
        }),
        Some(_) => rustix::fs::unlinkat(parent, name, AtFlags::empty())
            .map_err(|e| StageError::io("replace", at)(e.into())),
    }
}

/// Copies the context entry `from` to `name` in the layer directory `parent`
/// (`at`: its path in the image, for messages).
fn copy_entry(
    from: &Path,
    parent: BorrowedFd<'_>,
    name: &OsStr,
    at: &Path,
) -> Result<(), StageError> {
    let m = fs::symlink_metadata(from).map_err(StageError::io("read", at))?;
    let mode = Mode::from_raw_mode(m.mode() & 0o7777);
    if m.file_type().is_symlink() {
        let t = fs::read_link(from).map_err(StageError::io("read link", at))?;
        replace_at(parent, name, at)?;
        rustix::fs::symlinkat(&t, parent, name)
            .map_err(|e| StageError::io("create link", at)(e.into()))
    } else if m.is_dir() {
        let dir = dir_at(parent, name, 0o700, at)?;
        rustix::fs::fchmod(&dir, mode).map_err(|e| StageError::io("chmod", at)(e.into()))?;
        copy_contents(from, dir.as_fd(), at)
    } else {
        replace_at(parent, name, at)?;
        let out = rustix::fs::openat(
            parent,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| StageError::io("create", at)(e.into()))?;
        let out = fs::File::from(out);
        let src = fs::File::open(from).map_err(StageError::io("read", at))?;
        // Only the data runs: holes stay holes.
        crate::layer::copy_file_into(&src, &out).map_err(StageError::io("copy", at))?;
        rustix::fs::fchmod(&out, mode).map_err(|e| StageError::io("chmod", at)(e.into()))
    }
}

/// Copies the entries of the context directory `from` into the layer directory `dir`.
fn copy_contents(from: &Path, dir: BorrowedFd<'_>, at: &Path) -> Result<(), StageError> {
    for e in fs::read_dir(from).map_err(StageError::io("read", at))? {
        let e = e.map_err(StageError::io("read", at))?;
        let name = e.file_name();
        copy_entry(&e.path(), dir, &name, &at.join(&name))?;
    }
    Ok(())
}

/// The cache key of a step on `parent`.
pub fn step_key(parent: &Digest, step: &Step, network: bool, copied: Option<&Digest>) -> String {
    let mut h = Sha256::new();
    h.update(b"sandlot-build-step-v1\0");
    h.update(parent.to_string());
    h.update([0]);
    h.update(step.text());
    h.update([0, network as u8]);
    if let Some(c) = copied {
        h.update(c.0);
    }
    format!("build:{}", hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_specs_parse() {
        let s = parse_toml(
            r#"
from = "test/base:1"
network = true
[[steps]]
run = "echo hi"
[[steps]]
copy = ["a", "b", "/dst/"]
[[steps]]
copy = { src = "x", dest = "/y" }
[[steps]]
env = { A = "1" }
[[steps]]
workdir = "/w"
[[steps]]
user = "1000"
[[steps]]
apt_install = ["git", "curl"]
[[steps]]
pip_install = "numpy"
"#,
        )
        .unwrap();
        assert_eq!(s.from, "test/base:1");
        assert_eq!(s.steps.len(), 8);
        assert_eq!(
            s.steps[1].1,
            Step::Copy {
                src: vec!["a".into(), "b".into()],
                dest: "/dst/".into()
            }
        );
        assert_eq!(s.steps[6].0, "steps[6]");
        // Packages need the network chosen explicitly.
        let e = parse_toml("from = \"x\"\n[[steps]]\napt_install = [\"git\"]\n").unwrap_err();
        assert!(e.to_string().contains("needs the network"), "{e}");
        let e = parse_toml("from = \"x\"\n[[steps]]\nrun = \"a\"\nuser = \"b\"\n").unwrap_err();
        assert!(e.to_string().starts_with("steps[0]"), "{e}");
        let e = parse_toml("from = \"x\"\n[[steps]]\nexpose = 80\n").unwrap_err();
        assert!(e.to_string().contains("unknown step \"expose\""), "{e}");
        let e = parse_toml("[[steps]]\nrun = \"a\"\n").unwrap_err();
        assert!(e.to_string().contains("no base image"), "{e}");
        let e = parse_toml("from = \"x\"\n[[steps]]\ncopy = [\"../etc/passwd\", \"/x\"]\n")
            .unwrap_err();
        assert!(e.to_string().contains("escapes the build context"), "{e}");
        let e =
            parse_toml("from = \"x\"\nnetwork = true\n[[steps]]\napt_install = [\"-o=evil\"]\n")
                .unwrap_err();
        assert!(e.to_string().contains("not a package name"), "{e}");
    }

    #[test]
    fn dockerfiles_parse_and_unknown_instructions_name_the_line() {
        let s = parse_dockerfile(
            "# comment\nFROM test/base:1\nRUN echo a \\\n  && echo b\nCOPY [\"f\", \"/g\"]\nENV A=1 B=\"two words\"\nENV C three\nWORKDIR /w\nUSER nobody\nRUN [\"/bin/true\"]\n",
            false,
        )
        .unwrap();
        assert_eq!(s.from, "test/base:1");
        assert_eq!(
            s.steps[0],
            (
                "Dockerfile line 3".into(),
                Step::Run("echo a  && echo b".into())
            )
        );
        assert_eq!(
            s.steps[2].1,
            Step::Env(vec![
                ("A".into(), "1".into()),
                ("B".into(), "two words".into())
            ])
        );
        assert_eq!(s.steps[3].1, Step::Env(vec![("C".into(), "three".into())]));
        assert_eq!(s.steps[6].1, Step::RunArgv(vec!["/bin/true".into()]));
        let e = parse_dockerfile("FROM x\nRUN a\nEXPOSE 80\n", false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Dockerfile line 3: unsupported instruction EXPOSE (supported: FROM, RUN, COPY, ENV, WORKDIR, USER)"
        );
        let e = parse_dockerfile("RUN a\n", false).unwrap_err();
        assert!(
            e.to_string()
                .contains("line 1: the first instruction must be FROM"),
            "{e}"
        );
        let e = parse_dockerfile("FROM x\nCOPY --chown=1 a b\n", false).unwrap_err();
        assert!(
            e.to_string()
                .contains("line 2: COPY --chown=1 is not supported"),
            "{e}"
        );
        let e = parse_dockerfile("FROM x\nCOPY /etc/passwd /x\n", false).unwrap_err();
        assert!(e.to_string().contains("escapes the build context"), "{e}");
    }

    #[test]
    fn copy_hashes_and_stages() {
        let dir = std::env::temp_dir().join(format!("sandlot-build-unit-{}", std::process::id()));
        let ctx = dir.join("ctx");
        fs::create_dir_all(ctx.join("app/sub")).unwrap();
        fs::write(ctx.join("app/a.txt"), "a").unwrap();
        fs::write(ctx.join("app/sub/b.txt"), "b").unwrap();
        fs::write(ctx.join("top.txt"), "t").unwrap();
        let h1 = hash_copy_sources(&ctx, "s", &["app".into()]).unwrap();
        fs::write(ctx.join("app/sub/b.txt"), "B").unwrap();
        let h2 = hash_copy_sources(&ctx, "s", &["app".into()]).unwrap();
        assert_ne!(h1, h2);
        let e = hash_copy_sources(&ctx, "steps[1]", &["missing".into()]).unwrap_err();
        assert!(
            e.to_string()
                .contains("missing is not in the build context"),
            "{e}"
        );
        let layer = dir.join("layer");
        fs::create_dir_all(&layer).unwrap();
        stage_copy(&ctx, "s", &["app".into()], "/opt/app", None, &layer).unwrap();
        stage_copy(&ctx, "s", &["top.txt".into()], "rel/", Some("/w"), &layer).unwrap();
        assert_eq!(
            fs::read_to_string(layer.join("opt/app/sub/b.txt")).unwrap(),
            "B"
        );
        assert_eq!(
            fs::read_to_string(layer.join("w/rel/top.txt")).unwrap(),
            "t"
        );
        let k1 = step_key(&Digest::of(b"p"), &Step::Run("x".into()), false, None);
        let k2 = step_key(&Digest::of(b"p"), &Step::Run("x".into()), true, None);
        let k3 = step_key(&Digest::of(b"q"), &Step::Run("x".into()), false, None);
        assert!(k1 != k2 && k1 != k3);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_copy_keeps_the_owner_and_mode_of_the_directories_the_base_has() {
        use std::os::unix::fs::PermissionsExt;
        let dir =
            std::env::temp_dir().join(format!("sandlot-build-inherit-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let (top, bottom, layer, host) = (
            dir.join("top"),
            dir.join("bottom"),
            dir.join("layer"),
            dir.join("host"),
        );
        for d in [&top, &bottom, &layer, &host] {
            fs::create_dir_all(d).unwrap();
        }
        // The bottom layer has home/user/work (0700) and a link `opt -> host`; the
        // top one home (0711) only.
        fs::create_dir_all(bottom.join("home/user/work")).unwrap();
        fs::set_permissions(
            bottom.join("home/user/work"),
            fs::Permissions::from_mode(0o700),
        )
        .unwrap();
        fs::create_dir(top.join("home")).unwrap();
        fs::set_permissions(top.join("home"), fs::Permissions::from_mode(0o711)).unwrap();
        fs::set_permissions(&host, fs::Permissions::from_mode(0o777)).unwrap();
        std::os::unix::fs::symlink(&host, bottom.join("opt")).unwrap();
        for d in ["home/user/work", "opt/app"] {
            fs::create_dir_all(layer.join(d)).unwrap();
        }
        let mode = |p: &str| fs::metadata(layer.join(p)).unwrap().permissions().mode() & 0o7777;
        inherit_dirs(
            &layer,
            "work/f",
            Some("/home/user"),
            &[top.clone(), bottom.clone()],
        )
        .unwrap();
        assert_eq!(mode("home"), 0o711);
        assert_eq!(mode("home/user/work"), 0o700);
        // A directory the topmost layer with an entry lacks is the next one's.
        assert_eq!(
            mode("home/user"),
            fs::metadata(bottom.join("home/user"))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        );
        // A link in the base is not followed to what it names.
        inherit_dirs(&layer, "/opt/app/", None, &[top, bottom]).unwrap();
        assert_ne!(mode("opt"), 0o777);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Found by probing builds: a copy through a linked directory of the context
    /// (`d -> /host/dir`, `copy d/secret`) copied a host file into the image.
    #[test]
    fn copies_never_go_through_a_linked_directory() {
        let dir = std::env::temp_dir().join(format!("sandlot-build-link-{}", std::process::id()));
        let host = dir.join("host");
        fs::create_dir_all(&host).unwrap();
        fs::write(host.join("secret"), "host data").unwrap();
        let ctx = dir.join("ctx");
        fs::create_dir_all(&ctx).unwrap();
        std::os::unix::fs::symlink(&host, ctx.join("d")).unwrap();
        let layer = dir.join("layer");
        fs::create_dir_all(&layer).unwrap();
        let e = hash_copy_sources(&ctx, "steps[1]", &["d/secret".into()]).unwrap_err();
        assert!(e.to_string().contains("symbolic link d"), "{e}");
        let e = stage_copy(&ctx, "steps[1]", &["d/secret".into()], "/x", None, &layer).unwrap_err();
        assert!(e.to_string().contains("symbolic link d"), "{e}");
        assert!(!layer.join("x").exists());
        // The link itself is copied as a link, as before.
        stage_copy(&ctx, "s", &["d".into()], "/d", None, &layer).unwrap();
        assert!(fs::symlink_metadata(layer.join("d"))
            .unwrap()
            .file_type()
            .is_symlink());
        fs::remove_dir_all(&dir).unwrap();
    }

    /// The attack: a context whose first source puts a link in the layer being
    /// built (`a/etc -> /etc`) and whose second source has files under the same
    /// path (`b/etc/cron.d/x`), copied by one step (`COPY a b /`). The daemon,
    /// as root, used to follow the link: it changed the modes of `/etc` and
    /// `/etc/cron.d` and wrote `/etc/cron.d/x`. A link to a host file
    /// (`c/passwd -> /etc/passwd`) followed by a file of the same name
    /// (`d/passwd`) overwrote the host file.
    #[test]
    fn a_copy_never_writes_through_a_link_an_earlier_source_put_in_the_layer() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("sandlot-build-dest-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mode = |p: &Path| fs::symlink_metadata(p).unwrap().mode() & 0o7777;
        let chmod =
            |p: &Path, m: u32| fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
        // The "host": stands in for /etc.
        let host = dir.join("host");
        fs::create_dir_all(host.join("cron.d")).unwrap();
        fs::write(host.join("passwd"), "host data").unwrap();
        chmod(&host, 0o750);
        chmod(&host.join("cron.d"), 0o755);
        chmod(&host.join("passwd"), 0o644);
        let ctx = dir.join("ctx");
        fs::create_dir_all(ctx.join("a")).unwrap();
        std::os::unix::fs::symlink(&host, ctx.join("a/etc")).unwrap();
        fs::create_dir_all(ctx.join("b/etc/cron.d")).unwrap();
        fs::write(ctx.join("b/etc/cron.d/x"), "* * * * * root planted").unwrap();
        chmod(&ctx.join("b/etc"), 0o777);
        chmod(&ctx.join("b/etc/cron.d"), 0o777);
        fs::create_dir_all(ctx.join("c")).unwrap();
        std::os::unix::fs::symlink(host.join("passwd"), ctx.join("c/passwd")).unwrap();
        fs::create_dir_all(ctx.join("d")).unwrap();
        fs::write(ctx.join("d/passwd"), "planted").unwrap();
        chmod(&ctx.join("d/passwd"), 0o666);
        let host_untouched = || {
            assert!(!host.join("cron.d/x").exists());
            assert_eq!(
                fs::read_to_string(host.join("passwd")).unwrap(),
                "host data"
            );
            assert_eq!(
                (
                    mode(&host),
                    mode(&host.join("cron.d")),
                    mode(&host.join("passwd"))
                ),
                (0o750, 0o755, 0o644)
            );
        };
        let layer = |n: &str| {
            let l = dir.join(n);
            fs::create_dir_all(&l).unwrap();
            l
        };

        let l1 = layer("l1");
        let e =
            stage_copy(&ctx, "steps[1]", &["a".into(), "b".into()], "/", None, &l1).unwrap_err();
        assert!(
            e.to_string()
                .contains("goes through /etc, a symbolic link this copy put in the image"),
            "{e}"
        );
        host_untouched();
        // The same with the link itself a source (`COPY a/etc b /`).
        let l2 = layer("l2");
        let e = stage_copy(
            &ctx,
            "steps[1]",
            &["a/etc".into(), "b".into()],
            "/",
            None,
            &l2,
        )
        .unwrap_err();
        assert!(e.to_string().contains("goes through /etc"), "{e}");
        host_untouched();
        // A file after a link of the same name replaces the link in the layer.
        let l3 = layer("l3");
        stage_copy(&ctx, "steps[1]", &["c".into(), "d".into()], "/", None, &l3).unwrap();
        host_untouched();
        assert!(fs::symlink_metadata(l3.join("passwd")).unwrap().is_file());
        assert_eq!(fs::read_to_string(l3.join("passwd")).unwrap(), "planted");
        assert_eq!(mode(&l3.join("passwd")), 0o666);
        fs::remove_dir_all(&dir).unwrap();
    }
}
