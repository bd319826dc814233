//! The tools' arguments: typed structs (their JSON schemas are what `tools/list`
//! shows), strict parsing whose errors name the argument, and the checks the API
//! cannot make (which of two arguments, the output budget).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// A bad argument: the message names it and says what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadArgument(pub String);

fn bad(msg: impl Into<String>) -> BadArgument {
    BadArgument(msg.into())
}

/// Parses a tool's arguments strictly: an unknown argument, a missing one or one
/// of the wrong type is an error naming it.
pub fn parse<T: DeserializeOwned>(
    args: serde_json::Map<String, serde_json::Value>,
) -> Result<T, BadArgument> {
    serde_path_to_error::deserialize(serde_json::Value::Object(args)).map_err(|e| {
        let path = e.path().to_string();
        let msg = e.into_inner().to_string();
        if let Some(rest) = msg.strip_prefix("missing field `") {
            let name = rest.split('`').next().unwrap_or_default();
            return bad(format!("missing argument `{name}`"));
        }
        if let Some(rest) = msg.strip_prefix("unknown field `") {
            let name = rest.split('`').next().unwrap_or_default();
            let allowed = rest.split_once("expected ").map(|(_, a)| a).unwrap_or("");
            return bad(format!(
                "unknown argument `{name}` (the arguments are {allowed})"
            ));
        }
        if path == "." {
            bad(format!("invalid arguments: {msg}"))
        } else {
            bad(format!("invalid argument `{path}`: {msg}"))
        }
    })
}

/// Checks that `value` of argument `arg` names one thing (a sandbox, a store, a
/// collection, a session, a context): it becomes one segment of an API path, so a
/// `/` in it would name another route.
pub fn one_name(arg: &str, value: &str) -> Result<(), BadArgument> {
    if value.is_empty() || value.contains('/') || value == "." || value == ".." {
        return Err(bad(format!(
            "invalid argument `{arg}`: {value:?} is not an id or a name (no `/`, not empty)"
        )));
    }
    Ok(())
}

/// Seconds, or a duration like `"90s"`, `"10m"`, `"1h"`.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Duration {
    Seconds(f64),
    Text(String),
}

impl Duration {
    /// Its length in seconds, if it is a number or a number with a unit (ms, s,
    /// m, h, d); anything else is left to the API to judge.
    pub fn seconds(&self) -> Option<f64> {
        match self {
            Duration::Seconds(s) => Some(*s),
            Duration::Text(t) => {
                let t = t.trim();
                let split = t
                    .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                    .unwrap_or(t.len());
                let n: f64 = t[..split].parse().ok()?;
                let unit = match t[split..].trim() {
                    "ms" => 0.001,
                    "" | "s" => 1.0,
                    "m" => 60.0,
                    "h" => 3600.0,
                    "d" => 86400.0,
                    _ => return None,
                };
                Some(n * unit)
            }
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Duration::Seconds(s) => serde_json::json!(s),
            Duration::Text(t) => serde_json::json!(t),
        }
    }
}

/// Bytes, or a size like `"512M"`, `"2G"`.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Size {
    Bytes(u64),
    Text(String),
}

impl Size {
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Size::Bytes(b) => serde_json::json!(b),
            Size::Text(t) => serde_json::json!(t),
        }
    }
}

/// Arguments of `create_sandbox`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxArgs {
    /// Image to start from: "host" (the host's programs, read-only, with a writable
    /// layer on top; the default) or an image of the daemon's store ("python:3.12").
    #[serde(default)]
    pub image: Option<String>,
    /// CPUs the sandbox may use (e.g. 1, 0.5). Default: the operator's.
    #[serde(default)]
    pub cpus: Option<f64>,
    /// Memory limit: bytes or a size like "512M", "2G". Default: the operator's.
    #[serde(default)]
    pub memory: Option<Size>,
    /// Domain names ("pypi.org", "*.github.com") and CIDR ranges ("10.1.0.0/16")
    /// the sandbox may connect out to. An empty list: no network. Absent: the
    /// operator's default policy.
    #[serde(default)]
    pub network_allow: Option<Vec<String>>,
    /// Lifetime: seconds or "10m", "1h". The sandbox is deleted when it ends.
    #[serde(default)]
    pub timeout: Option<Duration>,
    /// A name to refer to the sandbox by (unique among your live sandboxes).
    #[serde(default)]
    pub name: Option<String>,
    /// Environment variables of every process in the sandbox.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

impl CreateSandboxArgs {
    /// The API's create body.
    pub fn body(&self) -> Result<sandlot_client::CreateSandbox, BadArgument> {
        let mut spec = serde_json::Map::new();
        if let Some(i) = &self.image {
            spec.insert("image".into(), i.clone().into());
        }
        let mut res = serde_json::Map::new();
        if let Some(c) = self.cpus {
            if !(c.is_finite() && c > 0.0) {
                return Err(bad("invalid argument `cpus`: must be a positive number"));
            }
            res.insert("cpus".into(), serde_json::json!(c));
        }
        if let Some(m) = &self.memory {
            res.insert("memory".into(), m.to_json());
        }
        if !res.is_empty() {
            spec.insert("resources".into(), res.into());
        }
        if let Some(allow) = &self.network_allow {
            spec.insert("network".into(), network_policy(allow)?);
        }
        if let Some(t) = &self.timeout {
            spec.insert("timeout".into(), t.to_json());
        }
        if !self.env.is_empty() {
            spec.insert(
                "env".into(),
                serde_json::to_value(&self.env).unwrap_or_default(),
            );
        }
        Ok(sandlot_client::CreateSandbox {
            request: sandlot_client::CreateSandboxRequest {
                name: self.name.clone(),
                ..Default::default()
            },
            spec,
        })
    }
}

/// The network policy allowing `allow` (names and CIDR ranges); none when empty.
pub fn network_policy(allow: &[String]) -> Result<serde_json::Value, BadArgument> {
    if allow.is_empty() {
        return Ok(serde_json::json!({"mode": "none"}));
    }
    let mut rules = Vec::new();
    for (i, a) in allow.iter().enumerate() {
        let a = a.trim();
        if a.is_empty() {
            return Err(bad(format!("invalid argument `network_allow[{i}]`: empty")));
        }
        let is_cidr = a.contains('/')
            && a.chars()
                .all(|c| c.is_ascii_hexdigit() || ".:/".contains(c));
        rules.push(if is_cidr {
            serde_json::json!({ "cidr": a })
        } else {
            serde_json::json!({ "domain": a })
        });
    }
    Ok(serde_json::json!({"mode": "allow", "allow": rules}))
}

/// Arguments naming one sandbox.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxArg {
    /// The sandbox's id (or its name).
    pub sandbox: String,
}

/// Arguments of `list_sandboxes`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSandboxesArgs {
    /// Include stopped sandboxes (default: live ones only).
    #[serde(default)]
    pub include_stopped: bool,
}

/// Output kept per stream by default (stdout and stderr each).
pub const DEFAULT_OUTPUT_BYTES: u32 = 32 * 1024;
/// The most a caller may ask for per stream.
pub const MAX_OUTPUT_BYTES: u32 = 1024 * 1024;

/// Arguments of `run_command`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommandArgs {
    /// The sandbox's id (or its name).
    pub sandbox: String,
    /// A shell command line, run with `/bin/sh -c` (pipes, redirections, `&&`).
    /// Give either `command` or `argv`.
    #[serde(default)]
    pub command: Option<String>,
    /// The program and its arguments, run without a shell. Give either `command` or
    /// `argv`.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// Working directory (default: the sandbox's).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables of this command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Kill the command after this long: seconds or "5m". Default 60 s.
    #[serde(default)]
    pub timeout: Option<Duration>,
    /// Bytes of stdout and of stderr each to hand back (default 32768, at most
    /// 1048576). Past it, the start and the end are kept and a marker says how many
    /// bytes were left out.
    #[serde(default)]
    pub max_output_bytes: Option<u32>,
}

impl RunCommandArgs {
    /// The program and arguments to run.
    pub fn argv(&self) -> Result<Vec<String>, BadArgument> {
        match (&self.command, &self.argv) {
            (Some(_), Some(_)) => Err(bad(
                "give either `command` (a shell command line) or `argv` (a program and its arguments), not both",
            )),
            (None, None) => Err(bad(
                "missing argument: give `command` (a shell command line) or `argv` (a program and its arguments)",
            )),
            (Some(c), None) if c.trim().is_empty() => {
                Err(bad("invalid argument `command`: empty"))
            }
            (Some(c), None) => Ok(vec!["/bin/sh".into(), "-c".into(), c.clone()]),
            (None, Some(a)) if a.first().is_none_or(|p| p.is_empty()) => Err(bad(
                "invalid argument `argv`: needs at least the program (argv[0])",
            )),
            (None, Some(a)) => Ok(a.clone()),
        }
    }

    /// The bytes of each stream to hand back.
    pub fn output_limit(&self) -> Result<usize, BadArgument> {
        output_limit(self.max_output_bytes)
    }
}

pub fn output_limit(v: Option<u32>) -> Result<usize, BadArgument> {
    match v.unwrap_or(DEFAULT_OUTPUT_BYTES) {
        n if (1..=MAX_OUTPUT_BYTES).contains(&n) => Ok(n as usize),
        n => Err(bad(format!(
            "invalid argument `max_output_bytes`: {n} is out of range (1..={MAX_OUTPUT_BYTES})"
        ))),
    }
}

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// The sandbox's id (or its name).
    pub sandbox: String,
    /// Absolute path in the sandbox.
    pub path: String,
    /// Bytes to hand back (default 262144, at most 1048576); a longer file is cut
    /// with a marker saying how many bytes were left out.
    #[serde(default)]
    pub max_bytes: Option<u32>,
    /// Hand the content back base64-encoded (for binary files).
    #[serde(default)]
    pub base64: bool,
}

/// Arguments of `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// The sandbox's id (or its name).
    pub sandbox: String,
    /// Absolute path in the sandbox; missing parent directories are created, an
    /// existing file is replaced.
    pub path: String,
    /// The file's content (text, or base64 with `base64: true`).
    pub content: String,
    /// `content` is base64-encoded.
    #[serde(default)]
    pub base64: bool,
    /// Permission bits in octal, e.g. "755" (default 644).
    #[serde(default)]
    pub mode: Option<String>,
}

impl WriteFileArgs {
    pub fn bytes(&self) -> Result<Vec<u8>, BadArgument> {
        if !self.base64 {
            return Ok(self.content.as_bytes().to_vec());
        }
        use base64::Engine;
        base64::engine::general_purpose::STANDARD
            .decode(self.content.trim())
            .map_err(|e| bad(format!("invalid argument `content`: not base64 ({e})")))
    }

    pub fn mode(&self) -> Result<Option<u32>, BadArgument> {
        self.mode
            .as_deref()
            .map(|m| {
                u32::from_str_radix(m.trim_start_matches("0o"), 8)
                    .ok()
                    .filter(|m| *m <= 0o7777)
                    .ok_or_else(|| {
                        bad(format!(
                            "invalid argument `mode`: {m:?} is not octal permission bits (e.g. \"644\", \"755\")"
                        ))
                    })
            })
            .transpose()
    }
}

/// Arguments of `list_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFilesArgs {
    /// The sandbox's id (or its name).
    pub sandbox: String,
    /// Absolute path of a directory in the sandbox.
    pub path: String,
    /// Levels to list: 1 (default) the directory's entries, 2 their children too,
    /// ... at most 8.
    #[serde(default)]
    pub depth: Option<u32>,
}

impl ListFilesArgs {
    pub fn depth(&self) -> Result<u32, BadArgument> {
        match self.depth.unwrap_or(1) {
            d @ 1..=8 => Ok(d),
            d => Err(bad(format!(
                "invalid argument `depth`: {d} is out of range (1..=8)"
            ))),
        }
    }
}

/// Arguments of `run_code`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeArgs {
    /// The sandbox's id (or its name); its image needs Python 3 with ipykernel
    /// for the default context.
    pub sandbox: String,
    /// The code (a notebook cell): the value of its last expression is handed back.
    pub code: String,
    /// The code context (a stateful interpreter: variables and imports persist
    /// between runs). Default "default", the sandbox's Python context.
    #[serde(default)]
    pub context: Option<String>,
    /// Interrupt the run after this long: seconds or "30s". Default 300 s.
    #[serde(default)]
    pub timeout: Option<Duration>,
}

/// Arguments of `vfs_shell`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VfsShellArgs {
    /// The document collection.
    pub collection: String,
    /// A shell command line over the collection's documents: ls, cat, grep -r,
    /// find, head, wc, ... (read-only).
    pub command: String,
    /// The session to run it in (its working directory persists). Absent: a new
    /// session is opened for this command and closed after it, unless
    /// `keep_session` is set.
    #[serde(default)]
    pub session: Option<String>,
    /// Keep the new session open and hand its id back, for later commands.
    #[serde(default)]
    pub keep_session: bool,
}

/// Arguments of `memory_search`.
#[derive(Debug, serde::Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemorySearchArgs {
    /// The memory store.
    #[serde(skip_serializing)]
    pub store: String,
    /// What to look for (words or a question).
    pub text: String,
    /// Hits to hand back (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Only memories with all of these tags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Only memories under this folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folder: Option<String>,
}

/// Arguments of `memory_view`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryViewArgs {
    /// The memory store.
    pub store: String,
    /// The memory's path in the store ("notes/setup.md") or its id.
    pub key: String,
}

/// Arguments of `memory_create`.
#[derive(Debug, serde::Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryCreateArgs {
    /// The memory store.
    #[serde(skip_serializing)]
    pub store: String,
    /// The memory's title.
    pub title: String,
    /// Its Markdown body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// The folder to put it in ("projects/alpha").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folder: Option<String>,
    /// Tags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Its type ("fact", "decision", ...).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// Arguments of `memory_edit`.
#[derive(Debug, serde::Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryEditArgs {
    /// The memory store.
    #[serde(skip_serializing)]
    pub store: String,
    /// The memory's path in the store or its id.
    #[serde(skip_serializing)]
    pub key: String,
    /// A new title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// A new Markdown body (replaces the old one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// Tags to add.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add_tags: Vec<String>,
    /// Tags to remove.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove_tags: Vec<String>,
}

impl MemoryEditArgs {
    pub fn check(&self) -> Result<(), BadArgument> {
        if self.title.is_none()
            && self.body.is_none()
            && self.add_tags.is_empty()
            && self.remove_tags.is_empty()
        {
            return Err(bad(
                "nothing to change: give at least one of `title`, `body`, `add_tags`, `remove_tags`",
            ));
        }
        Ok(())
    }
}

/// Arguments of `snapshot_sandbox`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotArgs {
    /// The sandbox's id (or its name).
    pub sandbox: String,
    /// Tag the image ("myenv:v1"), to create sandboxes from it later.
    #[serde(default)]
    pub tag: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn a_duration_is_read_as_seconds_when_it_has_a_known_unit() {
        let d = |v: serde_json::Value| serde_json::from_value::<Duration>(v).unwrap().seconds();
        assert_eq!(d(json!(90)), Some(90.0));
        assert_eq!(d(json!("100h")), Some(360000.0));
        assert_eq!(d(json!("2m")), Some(120.0));
        assert_eq!(d(json!("1500ms")), Some(1.5));
        assert_eq!(d(json!("1 fortnight")), None);
    }

    #[test]
    fn a_missing_argument_is_named() {
        let e = parse::<RunCommandArgs>(obj(json!({"command": "ls"}))).unwrap_err();
        assert_eq!(e.0, "missing argument `sandbox`");
    }

    #[test]
    fn an_unknown_argument_is_named_with_the_allowed_ones() {
        let e = parse::<SandboxArg>(obj(json!({"sandbox": "a", "sandbox_id": "b"}))).unwrap_err();
        assert!(e.0.starts_with("unknown argument `sandbox_id`"), "{}", e.0);
        assert!(e.0.contains("`sandbox`"), "{}", e.0);
    }

    #[test]
    fn an_argument_of_the_wrong_type_is_named() {
        let e =
            parse::<RunCommandArgs>(obj(json!({"sandbox": "a", "argv": ["ls", 3]}))).unwrap_err();
        assert!(e.0.starts_with("invalid argument `argv[1]`"), "{}", e.0);
    }

    #[test]
    fn run_command_takes_exactly_one_of_command_and_argv() {
        let both: RunCommandArgs = parse(obj(
            json!({"sandbox": "a", "command": "ls", "argv": ["ls"]}),
        ))
        .unwrap();
        assert!(both.argv().unwrap_err().0.contains("not both"));
        let neither: RunCommandArgs = parse(obj(json!({"sandbox": "a"}))).unwrap();
        assert!(neither.argv().unwrap_err().0.contains("`command`"));
        let empty: RunCommandArgs = parse(obj(json!({"sandbox": "a", "argv": []}))).unwrap();
        assert!(empty.argv().unwrap_err().0.contains("`argv`"));
        let shell: RunCommandArgs =
            parse(obj(json!({"sandbox": "a", "command": "echo hi | wc -c"}))).unwrap();
        assert_eq!(shell.argv().unwrap(), ["/bin/sh", "-c", "echo hi | wc -c"]);
    }

    #[test]
    fn a_name_with_a_slash_is_refused_before_it_becomes_a_path() {
        assert!(one_name("sandbox", "sb-1a2b").is_ok());
        for v in ["", ".", "..", "sb-1/contexts/default", "../tokens"] {
            let e = one_name("sandbox", v).unwrap_err();
            assert!(
                e.0.starts_with("invalid argument `sandbox`"),
                "{v}: {}",
                e.0
            );
        }
    }

    #[test]
    fn the_output_budget_is_bounded() {
        assert_eq!(output_limit(None).unwrap(), DEFAULT_OUTPUT_BYTES as usize);
        assert!(output_limit(Some(0))
            .unwrap_err()
            .0
            .contains("`max_output_bytes`"));
        assert!(output_limit(Some(MAX_OUTPUT_BYTES + 1)).is_err());
        assert_eq!(output_limit(Some(10)).unwrap(), 10);
    }

    #[test]
    fn create_maps_onto_the_api_spec() {
        let a: CreateSandboxArgs = parse(obj(json!({
            "image": "python:3.12", "cpus": 0.5, "memory": "512M",
            "network_allow": ["pypi.org", "10.1.0.0/16"], "timeout": "10m"
        })))
        .unwrap();
        let body = serde_json::to_value(a.body().unwrap()).unwrap();
        assert_eq!(
            body,
            json!({
                "image": "python:3.12",
                "resources": {"cpus": 0.5, "memory": "512M"},
                "network": {"mode": "allow", "allow": [{"domain": "pypi.org"}, {"cidr": "10.1.0.0/16"}]},
                "timeout": "10m"
            })
        );
        let none: CreateSandboxArgs = parse(obj(json!({"network_allow": []}))).unwrap();
        assert_eq!(
            serde_json::to_value(none.body().unwrap()).unwrap(),
            json!({"network": {"mode": "none"}})
        );
        let bad_cpus: CreateSandboxArgs = parse(obj(json!({"cpus": -1}))).unwrap();
        assert!(bad_cpus.body().unwrap_err().0.contains("`cpus`"));
    }

    #[test]
    fn write_file_modes_and_base64_are_checked() {
        let w = |v| parse::<WriteFileArgs>(obj(v)).unwrap();
        let a = w(
            json!({"sandbox": "a", "path": "/x", "content": "aGk=", "base64": true, "mode": "755"}),
        );
        assert_eq!(a.bytes().unwrap(), b"hi");
        assert_eq!(a.mode().unwrap(), Some(0o755));
        let b =
            w(json!({"sandbox": "a", "path": "/x", "content": "%%", "base64": true, "mode": "9"}));
        assert!(b.bytes().unwrap_err().0.contains("`content`"));
        assert!(b.mode().unwrap_err().0.contains("`mode`"));
    }

    #[test]
    fn every_tool_schema_is_an_object_naming_its_arguments() {
        for t in crate::tools::list() {
            let s = &t.input_schema;
            assert_eq!(s.get("type"), Some(&json!("object")), "{}", t.name);
            assert!(
                t.description.as_deref().is_some_and(|d| d.len() > 40),
                "{} needs a description a model can use",
                t.name
            );
        }
    }
}
