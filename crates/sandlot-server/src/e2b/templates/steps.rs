//! E2B's build steps as Sandlot's: the build body's types, their translation into
//! a native build spec, and copy sources matched against a build's uploads.

use super::*;

/// One step of E2B's build body.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct E2bStep {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub args: Vec<String>,
    pub files_hash: Option<String>,
    #[serde(default)]
    pub force: bool,
}

/// E2B's build body (`TemplateBuildStartV2`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct E2bBuild {
    pub from_image: Option<String>,
    pub from_template: Option<String>,
    pub from_image_registry: Option<Value>,
    #[serde(default)]
    pub force: bool,
    #[serde(default)]
    pub steps: Vec<E2bStep>,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
}

/// Native steps translated from E2B's, each with the E2B step it belongs to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Translated {
    pub steps: Vec<(String, Step)>,
    pub step_names: Vec<String>,
    /// The first native step E2B's `force` runs again.
    pub fresh_from: Option<usize>,
}

impl Translated {
    fn push(&mut self, name: &str, step: Step) {
        self.steps.push((format!("step {name}"), step));
        self.step_names.push(name.to_string());
    }
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `..` anywhere, or nothing at all: refused before anything runs.
fn escapes(p: &str) -> bool {
    Path::new(p).components().any(|c| c == Component::ParentDir)
}

/// The user or `user:group` a copy's files get (names or ids).
fn valid_owner(o: &str) -> bool {
    !o.is_empty()
        && o.len() <= 64
        && o.split(':').count() <= 2
        && o.split(':').all(|p| {
            !p.is_empty()
                && !p.starts_with('-')
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        })
}

/// What a copy source names among the uploads: `(hash, src)` to its paths, each
/// with whether it is a directory (`None`: not uploaded).
pub type Sources<'a> = dyn Fn(&str, &str) -> Option<Vec<(String, bool)>> + 'a;

/// Translates E2B's steps onto native ones. `user` and `workdir` are the base's;
/// `sources(hash, src)` lists the uploaded paths `src` names (itself, or what its
/// wildcards match) and whether each is a directory (`None`:
/// it was not uploaded). Bad input is a 400 naming the step and the problem.
pub fn translate(
    body: &E2bBuild,
    mut user: Option<String>,
    mut workdir: String,
    sources: &Sources<'_>,
    prelude: Vec<Step>,
) -> RestResult<Translated> {
    let mut out = Translated::default();
    for s in prelude {
        match &s {
            Step::User(u) => user = Some(u.clone()),
            Step::Workdir(w) => workdir = w.clone(),
            _ => {}
        }
        out.push("base", s);
    }
    if body.force {
        out.fresh_from = Some(0);
    }
    for (i, s) in body.steps.iter().enumerate() {
        // Step 0 is the base (`from_*`), as the SDK counts its stack traces.
        let name = (i + 1).to_string();
        let field = format!("steps[{i}]");
        let first = out.steps.len();
        if s.force && out.fresh_from.is_none() {
            out.fresh_from = Some(first);
        }
        let arg = |n: usize| s.args.get(n).map(String::as_str).unwrap_or("");
        match s.kind.as_str() {
            "RUN" => {
                let cmd = arg(0);
                if cmd.trim().is_empty() {
                    return Err(bad(format!("{field}: RUN needs a command")));
                }
                match arg(1) {
                    "" => out.push(&name, Step::Run(cmd.to_string())),
                    u if valid_owner(u) && !u.contains(':') => out.push(
                        &name,
                        Step::RunAs {
                            user: u.to_string(),
                            command: cmd.to_string(),
                        },
                    ),
                    u => return Err(bad(format!("{field}: RUN user {u:?} is not a user name"))),
                }
            }
            "COPY" => {
                let (src, dest, owner, mode) = (arg(0), arg(1), arg(2), arg(3));
                let hash = s.files_hash.as_deref().unwrap_or("");
                if !valid_hash(hash) {
                    return Err(bad(format!(
                        "{field}: COPY needs the filesHash of its uploaded files"
                    )));
                }
                if src.len() > MAX_COPY_SOURCE {
                    return Err(bad(format!(
                        "{field}: copy source is {} bytes long, more than {MAX_COPY_SOURCE}",
                        src.len()
                    )));
                }
                if src.split('/').any(|c| c.len() > MAX_COPY_SOURCE_NAME) {
                    return Err(bad(format!(
                        "{field}: copy source {src:?} has a component longer than {MAX_COPY_SOURCE_NAME} bytes"
                    )));
                }
                let src_path = Path::new(src);
                if src.is_empty() || src_path.is_absolute() || escapes(src) {
                    return Err(bad(format!(
                        "{field}: copy source {src:?} must be a path inside the build's files (relative, no '..')"
                    )));
                }
                if src.contains(['[', '{', '\\']) {
                    return Err(bad(format!(
                        "{field}: copy source {src:?}: of wildcards only * and ? are supported"
                    )));
                }
                if dest.is_empty() || escapes(dest) || dest.contains('\0') {
                    return Err(bad(format!(
                        "{field}: copy destination {dest:?} must be a path without '..'"
                    )));
                }
                let found = match sources(hash, src) {
                    Some(f) if f.len() > MAX_COPY_MATCHES => {
                        return Err(bad(format!(
                            "{field}: copy source {src:?} matches more than {MAX_COPY_MATCHES} uploaded paths (copy their directory instead)"
                        )))
                    }
                    Some(f) if !f.is_empty() => f,
                    Some(_) => {
                        return Err(bad(format!(
                            "{field}: copy source {src:?} matches no uploaded file"
                        )))
                    }
                    None => {
                        return Err(bad(format!(
                            "{field}: copy source {src:?}: its files were not uploaded (filesHash {hash})"
                        )))
                    }
                };
                if !mode.is_empty()
                    && (mode.len() > 4 || !mode.bytes().all(|b| (b'0'..=b'7').contains(&b)))
                {
                    return Err(bad(format!(
                        "{field}: copy mode {mode:?} is not an octal mode"
                    )));
                }
                if !owner.is_empty() && !valid_owner(owner) {
                    return Err(bad(format!(
                        "{field}: copy user {owner:?} is not a user or user:group"
                    )));
                }
                out.push(
                    &name,
                    Step::Copy {
                        src: found.iter().map(|(p, _)| format!("{hash}/{p}")).collect(),
                        dest: dest.to_string(),
                    },
                );
                // Where the files landed, as the native copy puts them.
                let abs = if dest.starts_with('/') {
                    dest.to_string()
                } else {
                    format!("{}/{dest}", workdir.trim_end_matches('/'))
                };
                let into_dir = dest.ends_with('/') || found.len() > 1;
                let mut targets: Vec<String> = Vec::new();
                let mut seen = HashSet::new();
                for (p, dir) in &found {
                    let t = match Path::new(p).file_name() {
                        Some(f) if !dir && into_dir => {
                            format!("{}/{}", abs.trim_end_matches('/'), f.to_string_lossy())
                        }
                        _ => abs.clone(),
                    };
                    if seen.insert(t.clone()) {
                        targets.push(t);
                    }
                }
                let target = targets.iter().map(|t| quote(t)).collect::<Vec<_>>().join(" ");
                // The files belong to the step's user (the image's, when it is
                // not root) unless the step names one.
                let owner = match (owner, user.as_deref()) {
                    ("", Some(u)) if u != "root" && u != "0" => u.to_string(),
                    (o, _) => o.to_string(),
                };
                let mut fix = Vec::new();
                if !owner.is_empty() {
                    fix.push(format!("chown -R {} {target}", quote(&owner)));
                }
                if !mode.is_empty() {
                    fix.push(format!("chmod -R {mode} {target}"));
                }
                if !fix.is_empty() {
                    out.push(
                        &name,
                        Step::RunAs {
                            user: "root".into(),
                            command: fix.join(" && "),
                        },
                    );
                }
            }
            "ENV" => {
                if s.args.is_empty() || s.args.len() % 2 != 0 {
                    return Err(bad(format!(
                        "{field}: ENV takes NAME, VALUE pairs"
                    )));
                }
                let kv = s
                    .args
                    .chunks(2)
                    .map(|p| (p[0].clone(), p[1].clone()))
                    .collect();
                out.push(&name, Step::Env(kv));
            }
            "WORKDIR" => {
                let w = arg(0);
                if w.is_empty() || w.contains('\0') {
                    return Err(bad(format!("{field}: WORKDIR needs a path")));
                }
                let abs = if w.starts_with('/') {
                    w.to_string()
                } else {
                    format!("{}/{w}", workdir.trim_end_matches('/'))
                };
                workdir = super::super::resolve_path(&abs, "root").map_err(|e| bad(format!("{field}: {e}")))?;
                out.push(&name, Step::Workdir(workdir.clone()));
            }
            "USER" => {
                let u = arg(0);
                if !valid_owner(u) {
                    return Err(bad(format!("{field}: USER {u:?} is not a user name")));
                }
                user = Some(u.to_string());
                out.push(&name, Step::User(u.to_string()));
            }
            other => {
                return Err(bad(format!(
                    "{field}.type: unknown step type {other:?} (supported: RUN, COPY, ENV, WORKDIR, USER)"
                )))
            }
        }
    }
    Ok(out)
}

/// Whether `name` matches `pattern` (`*`: any run of bytes, `?`: one): two
/// cursors that go back to the last `*` on a mismatch, so at most
/// `pattern.len() × name.len()` steps in constant space, however many `*`.
pub(super) fn wildcard(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    // The last `*` seen and the name position it is tried to cover up to.
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(&c) if c == b'?' || c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    star = Some((sp, sn + 1));
                    p = sp + 1;
                    n = sn + 1;
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// The paths under an upload's directory `root` that `src` names (with `*` and
/// `?` in any component), sorted, each with whether it is a directory; `None`:
/// the upload is not there. A directory is listed only when it is one, and no
/// path is looked up through a link (a link is a file here: the copy takes it
/// as a link). Past
/// [`MAX_COPY_MATCHES`] paths on the way the listing stops and the paths so far
/// come back (more than the caller takes).
pub(super) fn uploaded(root: &Path, src: &str) -> Option<Vec<(String, bool)>> {
    if !root.is_dir() {
        return None;
    }
    let real_dir = |rel: &Path| {
        sandlot_store::link_on_the_way(root, rel, true).is_none()
            && std::fs::symlink_metadata(root.join(rel)).is_ok_and(|m| m.is_dir())
    };
    let mut found = vec![PathBuf::new()];
    for c in Path::new(src).components() {
        let Component::Normal(c) = c else { continue };
        let pat = c.to_string_lossy();
        let mut next = Vec::new();
        for base in &found {
            if next.len() > MAX_COPY_MATCHES {
                break;
            }
            if !pat.contains(['*', '?']) {
                let p = base.join(c);
                // A path through a link is not there: a host path behind it is
                // never looked up, so the answer never tells whether it exists.
                if sandlot_store::link_on_the_way(root, &p, false).is_none()
                    && std::fs::symlink_metadata(root.join(&p)).is_ok()
                {
                    next.push(p);
                }
                continue;
            }
            if !real_dir(base) {
                continue;
            }
            let Ok(rd) = std::fs::read_dir(root.join(base)) else {
                continue;
            };
            for e in rd.flatten() {
                if next.len() > MAX_COPY_MATCHES {
                    break;
                }
                let n = e.file_name();
                // As shells and Docker do, `*` does not match a leading dot.
                if n.as_encoded_bytes().first() == Some(&b'.') && !pat.starts_with('.') {
                    continue;
                }
                if wildcard(pat.as_bytes(), n.as_encoded_bytes()) {
                    next.push(base.join(n));
                }
            }
        }
        found = next;
        if found.len() > MAX_COPY_MATCHES {
            break;
        }
    }
    let mut out: Vec<(String, bool)> = found
        .into_iter()
        .filter(|p| !p.as_os_str().is_empty())
        .map(|p| {
            let dir = real_dir(&p);
            (p.to_string_lossy().into_owned(), dir)
        })
        .collect();
    out.sort();
    Some(out)
}
