//! The tools: their descriptions and schemas (`list`), and what each does over
//! the API's client (`call`).

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use rmcp::model::{ProgressNotificationParam, Tool, ToolAnnotations};
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use sandlot_client::code::RunCodeBody;
use sandlot_client::stream::Output;
use sandlot_client::vfs::OpenSession;
use sandlot_client::{encode_path as enc, Client, ExecBody, ListFilter, Sandbox};
use schemars::JsonSchema;
use serde_json::{json, Value};

use crate::args::{self, parse, BadArgument};
use crate::output::CappedOutput;

/// Why a tool call failed; the text a model sees.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("no such tool")]
    UnknownTool,
    #[error("{0}")]
    BadArgument(#[from] BadArgument),
    #[error("{}", api_message(.0))]
    Api(#[from] sandlot_client::Error),
    #[error("cancelled: the command was killed")]
    Cancelled,
}

/// A client error as a model should see it: the API's 4xx message (which names the
/// field and what is allowed) as is, a 5xx with its code and request id only.
fn api_message(e: &sandlot_client::Error) -> String {
    match e {
        sandlot_client::Error::Api { status, body } if status.is_server_error() => format!(
            "the daemon could not do it ({} {}); request id {} (quote it to the operator)",
            status.as_u16(),
            body.code,
            body.request_id
        ),
        sandlot_client::Error::Api { status, body } => {
            let mut m = format!("{} ({} {}", body.message, status.as_u16(), body.code);
            if let Some(f) = &body.field {
                let _ = write!(m, ", field `{f}`");
            }
            m.push(')');
            m
        }
        other => other.to_string(),
    }
}

fn tool<T: JsonSchema + 'static>(name: &'static str, description: &'static str) -> Tool {
    let schema = rmcp::handler::server::common::schema_for_input::<T>()
        .unwrap_or_else(|e| panic!("the arguments of {name} have no object schema: {e}"));
    Tool::new(name, description, schema)
}

fn read_only(t: Tool) -> Tool {
    t.annotate(ToolAnnotations::new().read_only(true))
}

/// Every tool, with its description and the schema of its arguments.
pub fn list() -> Vec<Tool> {
    vec![
        tool::<args::CreateSandboxArgs>(
            "create_sandbox",
            "Create an isolated Linux sandbox (a container-like machine) and return its id. \
             Choose the image, CPUs, memory, the outbound network allow-list and the lifetime. \
             Use the id with the other tools; delete the sandbox when done.",
        ),
        read_only(tool::<args::ListSandboxesArgs>(
            "list_sandboxes",
            "List your sandboxes: id, name, state, image, when each expires.",
        )),
        tool::<args::SandboxArg>(
            "delete_sandbox",
            "Stop and delete a sandbox with every process and file in it. Cannot be undone.",
        )
        .annotate(ToolAnnotations::new().destructive(true).idempotent(true)),
        tool::<args::RunCommandArgs>(
            "run_command",
            "Run a command in a sandbox and wait for it: a shell command line (`command`) or a \
             program with arguments (`argv`). Returns the exit code, stdout and stderr; long \
             output keeps its start and end, with a marker saying how many bytes were left out. \
             The command is killed after `timeout` (default 60 s).",
        ),
        read_only(tool::<args::ReadFileArgs>(
            "read_file",
            "Read a file of a sandbox. Text is returned as is; use `base64` for binary files. \
             Long files are cut at `max_bytes` with a marker saying how much was left out.",
        )),
        tool::<args::WriteFileArgs>(
            "write_file",
            "Write a file in a sandbox (parent directories are created, an existing file is \
             replaced): text, or base64 for binary content.",
        ),
        read_only(tool::<args::ListFilesArgs>(
            "list_files",
            "List a directory of a sandbox: kind, size and path of each entry, to `depth` levels.",
        )),
        tool::<args::RunCodeArgs>(
            "run_code",
            "Run Python code in a stateful code context of a sandbox (like a notebook cell: \
             variables and imports persist between runs). Returns stdout, stderr, the value of \
             the last expression and the error with its traceback if it raised.",
        ),
        tool::<args::VfsShellArgs>(
            "vfs_shell",
            "Run a read-only shell command line (ls, cat, grep -r, find, head, wc) over the \
             documents of a collection. Returns stdout, stderr, the exit code and the working \
             directory.",
        ),
        read_only(tool::<args::MemorySearchArgs>(
            "memory_search",
            "Search a memory store (Markdown memories) by meaning and words; returns the best \
             hits with path, title and a snippet.",
        )),
        read_only(tool::<args::MemoryViewArgs>(
            "memory_view",
            "Read one memory of a memory store by its path or id: its fields and Markdown text.",
        )),
        tool::<args::MemoryCreateArgs>(
            "memory_create",
            "Add a memory (a Markdown note with a title, tags and a folder) to a memory store; \
             returns its path and id.",
        ),
        tool::<args::MemoryEditArgs>(
            "memory_edit",
            "Change a memory of a memory store: its title, body or tags. Each change is a \
             commit in the store's history.",
        ),
        tool::<args::SnapshotArgs>(
            "snapshot_sandbox",
            "Save a sandbox's files as an image (optionally tagged) that new sandboxes can be \
             created from with create_sandbox's `image`.",
        ),
    ]
}

type Args = serde_json::Map<String, Value>;

/// Runs tool `name`; the text handed back to the model.
pub async fn call(
    client: &Client,
    name: &str,
    a: Args,
    ctx: &RequestContext<RoleServer>,
    vfs_sessions: &Mutex<HashSet<String>>,
) -> Result<String, ToolError> {
    for (arg, v) in &a {
        if let ("sandbox" | "store" | "collection" | "session" | "context", Value::String(v)) =
            (arg.as_str(), v)
        {
            args::one_name(arg, v)?;
        }
    }
    match name {
        "create_sandbox" => create_sandbox(client, parse(a)?).await,
        "list_sandboxes" => list_sandboxes(client, parse(a)?).await,
        "delete_sandbox" => {
            let a: args::SandboxArg = parse(a)?;
            let s = client.delete_sandbox(&a.sandbox).await?;
            Ok(format!("deleted sandbox {}", s.id))
        }
        "run_command" => run_command(client, parse(a)?, ctx).await,
        "read_file" => read_file(client, parse(a)?).await,
        "write_file" => write_file(client, parse(a)?).await,
        "list_files" => list_files(client, parse(a)?).await,
        "run_code" => run_code(client, parse(a)?).await,
        "vfs_shell" => vfs_shell(client, parse(a)?, vfs_sessions).await,
        "memory_search" => {
            let a: args::MemorySearchArgs = parse(a)?;
            let body = serde_json::to_value(&a).unwrap_or_default();
            let path = format!("/v1/memory/{}/search", enc(&a.store));
            let v = client.call_json("POST", &path, Some(&body)).await?;
            Ok(pretty(&v))
        }
        "memory_view" => {
            let a: args::MemoryViewArgs = parse(a)?;
            let path = format!("/v1/memory/{}/memories/{}", enc(&a.store), enc(&a.key));
            let v = client.call_json("GET", &path, None).await?;
            Ok(pretty(&v))
        }
        "memory_create" => {
            let a: args::MemoryCreateArgs = parse(a)?;
            let body = serde_json::to_value(&a).unwrap_or_default();
            let path = format!("/v1/memory/{}/memories", enc(&a.store));
            let v = client.call_json("POST", &path, Some(&body)).await?;
            Ok(pretty(&v))
        }
        "memory_edit" => {
            let a: args::MemoryEditArgs = parse(a)?;
            a.check()?;
            let body = serde_json::to_value(&a).unwrap_or_default();
            let path = format!("/v1/memory/{}/memories/{}", enc(&a.store), enc(&a.key));
            let v = client.call_json("PATCH", &path, Some(&body)).await?;
            Ok(if v.is_null() {
                format!("edited {}", a.key)
            } else {
                pretty(&v)
            })
        }
        "snapshot_sandbox" => {
            let a: args::SnapshotArgs = parse(a)?;
            let body = json!({ "tag": a.tag });
            let path = format!("/v1/sandboxes/{}/snapshot", enc(&a.sandbox));
            let v = client.call_json("POST", &path, Some(&body)).await?;
            Ok(pretty(&v))
        }
        _ => Err(ToolError::UnknownTool),
    }
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// What a model needs of a sandbox.
fn summary(s: &Sandbox) -> Value {
    let mut v = json!({
        "id": s.id,
        "state": s.state.as_str(),
        "image": s.spec.get("image"),
        "created_at": s.created_at,
        "expires_at": s.expires_at,
    });
    if let Some(n) = &s.name {
        v["name"] = json!(n);
    }
    if let Some(r) = &s.end_reason {
        v["end_reason"] = json!(r);
    }
    v
}

async fn create_sandbox(c: &Client, a: args::CreateSandboxArgs) -> Result<String, ToolError> {
    let s = c.create_sandbox(&a.body()?).await?;
    Ok(pretty(&summary(&s)))
}

async fn list_sandboxes(c: &Client, a: args::ListSandboxesArgs) -> Result<String, ToolError> {
    let f = ListFilter {
        states: if a.include_stopped {
            vec!["all".into()]
        } else {
            Vec::new()
        },
        ..Default::default()
    };
    let l = c.list_sandboxes(&f).await?;
    Ok(pretty(&Value::Array(l.iter().map(summary).collect())))
}

/// How often a long command reports progress (when the caller asked for it).
const PROGRESS_EVERY: Duration = Duration::from_secs(2);
/// The default exec timeout of `run_command`.
const DEFAULT_COMMAND_TIMEOUT_SECS: u64 = 60;
/// The longest `run_command` timeout: a call holds its output buffers in the
/// daemon while it runs.
pub const MAX_COMMAND_TIMEOUT_SECS: u64 = 3600;

async fn run_command(
    c: &Client,
    a: args::RunCommandArgs,
    ctx: &RequestContext<RoleServer>,
) -> Result<String, ToolError> {
    let argv = a.argv()?;
    let limit = a.output_limit()?;
    if let Some(t) = &a.timeout {
        match t.seconds() {
            Some(s) if s <= MAX_COMMAND_TIMEOUT_SECS as f64 => {}
            Some(_) => {
                return Err(BadArgument(format!(
                    "invalid argument `timeout`: the most a command may run through MCP is {MAX_COMMAND_TIMEOUT_SECS} s (1h)"
                ))
                .into())
            }
            None => {
                return Err(BadArgument(
                    "invalid argument `timeout`: expected seconds, or a number with ms, s, m, h or d".into(),
                )
                .into())
            }
        }
    }
    let body = ExecBody {
        argv,
        env: a.env.clone(),
        cwd: a.cwd.clone(),
        timeout: Some(
            a.timeout
                .as_ref()
                .map(args::Duration::to_json)
                .unwrap_or(json!(DEFAULT_COMMAND_TIMEOUT_SECS)),
        ),
        ..Default::default()
    };
    let (process, mut stream) = c.exec_stream(&a.sandbox, &body).await?;
    let mut stdout = CappedOutput::new(limit);
    let mut stderr = CappedOutput::new(limit);
    let progress = ctx.meta.get_progress_token();
    let started = Instant::now();
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
    let exit = loop {
        tokio::select! {
            ev = stream.next() => match ev? {
                Some(Output::Stdout(_, d)) => stdout.push(&d),
                Some(Output::Stderr(_, d)) => stderr.push(&d),
                Some(Output::Exit(e)) => break Some(e),
                None => break None,
            },
            () = ctx.ct.cancelled() => {
                // The caller gave up (notifications/cancelled): end the command.
                let _ = c.signal(&a.sandbox, process.id, "KILL").await;
                return Err(ToolError::Cancelled);
            }
            _ = tick.tick(), if progress.is_some() => {
                if let Some(token) = &progress {
                    let secs = started.elapsed().as_secs_f64();
                    let p = ProgressNotificationParam::new(token.clone(), secs.floor())
                        .with_message(format!(
                            "running for {secs:.0} s; {} bytes of stdout, {} of stderr so far",
                            stdout.total(),
                            stderr.total()
                        ));
                    let _ = ctx.peer.notify_progress(p).await;
                }
            }
        }
    };
    let mut out = String::new();
    match exit {
        Some(e) if e.timed_out => {
            let _ = writeln!(
                out,
                "timed_out: true (the command was killed at its timeout)"
            );
        }
        Some(e) => match (e.code, e.signal) {
            (Some(code), _) => {
                let _ = writeln!(out, "exit_code: {code}");
            }
            (None, Some(sig)) => {
                let _ = writeln!(out, "killed by signal {sig}");
            }
            (None, None) => out.push_str("exit: unknown\n"),
        },
        None => out.push_str("exit: unknown (the output stream ended early)\n"),
    }
    let _ = write!(
        out,
        "stdout:\n{}\nstderr:\n{}",
        stdout.render(),
        stderr.render()
    );
    Ok(out)
}

/// Bytes `read_file` hands back by default, and at most.
const DEFAULT_READ_BYTES: u32 = 256 * 1024;
pub const MAX_READ_BYTES: u32 = 1024 * 1024;

async fn read_file(c: &Client, a: args::ReadFileArgs) -> Result<String, ToolError> {
    let limit = match a.max_bytes.unwrap_or(DEFAULT_READ_BYTES) {
        n @ 1..=MAX_READ_BYTES => n as usize,
        n => {
            return Err(BadArgument(format!(
                "invalid argument `max_bytes`: {n} is out of range (1..={MAX_READ_BYTES})"
            ))
            .into())
        }
    };
    let (data, total) = read_capped(c, &a.sandbox, &a.path, limit).await?;
    let mut text = if a.base64 {
        base64::engine::general_purpose::STANDARD.encode(&data)
    } else {
        String::from_utf8_lossy(&data).into_owned()
    };
    let left_out = total - data.len() as u64;
    if left_out > 0 {
        let _ = write!(text, "\n[... {left_out} bytes left out of {total} ...]");
    }
    Ok(text)
}

/// The first `limit` bytes of a sandbox's file, and its whole size.
pub async fn read_capped(
    c: &Client,
    sandbox: &str,
    path: &str,
    limit: usize,
) -> Result<(Vec<u8>, u64), ToolError> {
    let mut s = c.read_file(sandbox, path).await?;
    let size_hint = s.size_hint;
    let mut data = Vec::new();
    let mut seen = 0u64;
    while let Some(chunk) = s.chunk().await? {
        seen += chunk.len() as u64;
        let room = limit.saturating_sub(data.len());
        data.extend_from_slice(&chunk[..room.min(chunk.len())]);
        if data.len() >= limit && size_hint.is_some() {
            break;
        }
    }
    Ok((data, size_hint.unwrap_or(seen).max(seen)))
}

async fn write_file(c: &Client, a: args::WriteFileArgs) -> Result<String, ToolError> {
    let bytes = a.bytes()?;
    let mode = a.mode()?;
    let body = futures_util::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(bytes))]);
    let r = c.write_file(&a.sandbox, &a.path, mode, body).await?;
    Ok(format!("wrote {} bytes to {}", r.bytes, r.path))
}

async fn list_files(c: &Client, a: args::ListFilesArgs) -> Result<String, ToolError> {
    let depth = a.depth()?;
    let l = c.list_dir(&a.sandbox, &a.path, depth).await?;
    let mut out = String::new();
    for e in &l.entries {
        let _ = write!(
            out,
            "{:<7} {:>10}  {}",
            e.info.kind, e.info.size, e.info.path
        );
        if let Some(t) = &e.info.symlink_target {
            let _ = write!(out, " -> {t}");
        }
        if let Some(err) = &e.error {
            let _ = write!(out, "  (unreadable: {err})");
        }
        out.push('\n');
    }
    if l.entries.is_empty() {
        let _ = writeln!(out, "(empty directory {})", l.path);
    }
    if l.truncated {
        out.push_str(
            "[... the listing stopped at the daemon's entry limit: list a deeper directory ...]\n",
        );
    }
    Ok(out)
}

/// Text of a run's streams handed back, per stream.
const CODE_OUTPUT_BYTES: usize = 64 * 1024;

async fn run_code(c: &Client, a: args::RunCodeArgs) -> Result<String, ToolError> {
    let ctx = a
        .context
        .as_deref()
        .unwrap_or(sandlot_client::code::DEFAULT_CONTEXT);
    let req = RunCodeBody {
        code: a.code.clone(),
        timeout: a.timeout.as_ref().map(args::Duration::to_json),
        env: Default::default(),
    };
    let x = c.run_code(&a.sandbox, ctx, &req).await?;
    let cap = |chunks: &[String]| {
        let mut o = CappedOutput::new(CODE_OUTPUT_BYTES);
        for ch in chunks {
            o.push(ch.as_bytes());
        }
        o.render()
    };
    let mut out = format!(
        "status: {}\n",
        serde_json::to_value(x.status)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    );
    if x.restarted {
        out.push_str(
            "note: the interpreter was restarted before this run; earlier state is lost\n",
        );
    }
    let _ = write!(
        out,
        "stdout:\n{}\nstderr:\n{}\n",
        cap(&x.stdout),
        cap(&x.stderr)
    );
    for r in &x.results {
        let label = if r.is_main_result {
            "result"
        } else {
            "display"
        };
        match r.data.get("text/plain").and_then(Value::as_str) {
            Some(t) => {
                let _ = writeln!(out, "{label}: {t}");
            }
            None => {
                let kinds: Vec<&str> = r.data.keys().map(String::as_str).collect();
                let _ = writeln!(out, "{label}: ({})", kinds.join(", "));
            }
        }
    }
    if let Some(e) = &x.error {
        let _ = write!(out, "error: {}: {}\n{}", e.name, e.value, e.traceback);
    }
    if x.truncated {
        out.push_str("\n[... output past the daemon's per-run cap was left out ...]");
    }
    Ok(out)
}

/// The principal of the `vfs_shell` sessions: it sees a collection's public
/// documents only. A model cannot choose another (nor groups, nor all access).
pub const VFS_PRINCIPAL: &str = "mcp";

/// A read-only shell session of a collection, as MCP's principal, at its
/// current version.
pub fn read_only_session() -> OpenSession {
    OpenSession {
        principal: VFS_PRINCIPAL.into(),
        groups: Vec::new(),
        version: None,
        all_access: false,
        scratch: false,
        scratch_max_bytes: None,
    }
}

fn known(sessions: &Mutex<HashSet<String>>) -> std::sync::MutexGuard<'_, HashSet<String>> {
    sessions.lock().unwrap_or_else(|e| e.into_inner())
}

async fn vfs_shell(
    c: &Client,
    a: args::VfsShellArgs,
    sessions: &Mutex<HashSet<String>>,
) -> Result<String, ToolError> {
    let (sid, opened) = match &a.session {
        Some(s) if known(sessions).contains(s) => (s.clone(), false),
        Some(s) => {
            return Err(BadArgument(format!(
                "invalid argument `session`: {s:?} is not a session vfs_shell opened in this MCP session"
            ))
            .into())
        }
        None => {
            let s = c
                .open_vfs_session(&a.collection, &read_only_session())
                .await?;
            (s.id, true)
        }
    };
    let r = c.vfs_run(&a.collection, &sid, &a.command).await;
    if opened && !a.keep_session {
        let _ = c.close_vfs_session(&a.collection, &sid).await;
    } else if opened {
        known(sessions).insert(sid.clone());
    }
    let r = r?;
    let mut out = format!("exit_code: {}\ncwd: {}\n", r.exit_code, r.cwd);
    if opened && a.keep_session || a.session.is_some() {
        let _ = writeln!(out, "session: {sid}");
    }
    let _ = write!(out, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    if r.truncated {
        out.push_str("\n[... output was cut at the session's limit ...]");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(status: u16, message: &str) -> sandlot_client::Error {
        sandlot_client::Error::Api {
            status: http::StatusCode::from_u16(status).unwrap(),
            body: serde_json::from_value(json!({
                "code": if status >= 500 { "internal" } else { "bad_request" },
                "message": message,
                "request_id": "req-1",
                "field": "argv[0]",
            }))
            .unwrap(),
        }
    }

    #[test]
    fn a_server_error_shows_its_code_and_request_id_only() {
        let m = api_message(&api_error(
            500,
            "open /var/lib/sandlot/x: permission denied",
        ));
        assert_eq!(
            m,
            "the daemon could not do it (500 internal); request id req-1 (quote it to the operator)"
        );
    }

    #[test]
    fn a_client_error_shows_its_message_and_field() {
        let m = api_message(&api_error(400, "argv[0] is empty"));
        assert_eq!(m, "argv[0] is empty (400 bad_request, field `argv[0]`)");
    }

    #[test]
    fn vfs_shell_takes_no_principal_or_groups() {
        for extra in [json!({"principal": "alice"}), json!({"groups": ["eng"]})] {
            let mut a = json!({"collection": "kb", "command": "ls /"});
            a.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            let e = parse::<args::VfsShellArgs>(a.as_object().unwrap().clone()).unwrap_err();
            assert!(e.0.starts_with("unknown argument"), "{}", e.0);
        }
    }
}
