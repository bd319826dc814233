//! The client commands, over the API through `sandlot-client`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use bytes::Bytes;
use sandlot_client::stream::Output;
use sandlot_client::{Client, CreateSandbox, ExecBody, ListFilter, PtySize, Sandbox};
use serde_json::Value;

use super::render::{human_bytes, human_secs, table};
use super::ApiCommand;
use crate::spec_flags::key_value as kv;
use crate::EXIT_SANDLOT_ERROR;

/// Where the daemon is and who we are.
#[derive(Debug, Clone, clap::Args)]
pub struct Conn {
    /// Daemon address: unix:///path.sock, /path.sock or HOST:PORT.
    #[arg(long, env = "SANDLOT_URL", default_value = sandlot_client::DEFAULT_HOST, global = true)]
    pub host: String,
    /// Bearer token (required over TCP).
    #[arg(long, env = "SANDLOT_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// On the operator socket: act as this tenant.
    #[arg(long, global = true)]
    pub tenant: Option<String>,
}

impl Conn {
    pub fn client(&self) -> anyhow::Result<Client> {
        Ok(Client::new(&self.address(), self.token.clone())?.with_tenant(self.tenant.clone()))
    }

    /// The daemon address in effect (`--host`, `SANDLOT_URL`, or the old
    /// `SANDLOT_HOST`).
    pub fn address(&self) -> String {
        // `SANDLOT_HOST` is the old name of `SANDLOT_URL`; still honoured.
        match std::env::var("SANDLOT_HOST") {
            Ok(h)
                if self.host == sandlot_client::DEFAULT_HOST
                    && std::env::var_os("SANDLOT_URL").is_none() =>
            {
                h
            }
            _ => self.host.clone(),
        }
    }
}

use sandlot_proto::api::lifecycle::OnExpiry;

/// `kill` or `pause` (`--on-idle`, `--on-timeout`).
fn parse_on_expiry(s: &str) -> Result<OnExpiry, String> {
    OnExpiry::parse(s).ok_or_else(|| format!("{s:?}: expected kill or pause"))
}

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// A name, usable instead of the id.
    #[arg(long)]
    pub name: Option<String>,
    /// Tag KEY=VALUE. Repeatable.
    #[arg(long = "tag", value_name = "K=V")]
    pub tags: Vec<String>,
    /// Metadata KEY=VALUE. Repeatable.
    #[arg(long = "meta", value_name = "K=V")]
    pub meta: Vec<String>,
    /// Stop after this long without exec or file activity, e.g. 2m.
    #[arg(long)]
    pub idle_timeout: Option<String>,
    /// What the idle timeout does: kill (the default) or pause.
    #[arg(long, value_name = "kill|pause", value_parser = parse_on_expiry)]
    pub on_idle: Option<OnExpiry>,
    /// What the lifetime timeout does: kill (the default) or pause.
    #[arg(long, value_name = "kill|pause", value_parser = parse_on_expiry)]
    pub on_timeout: Option<OnExpiry>,
    /// Exec, file, code and port calls on it while paused resume it first.
    #[arg(long)]
    pub auto_resume: bool,
    #[command(flatten)]
    pub spec_flags: crate::spec_flags::SpecFlags,
    /// A JSON create body (spec plus name, tags, ...); flags override it.
    #[arg(long, value_name = "FILE")]
    pub spec: Option<PathBuf>,
    #[command(flatten)]
    pub network: super::net_cmd::PolicyFlags,
    /// Mount a named volume: NAME:DST[:ro|rw] (default rw). Repeatable.
    #[arg(long = "volume", value_name = "NAME:DST[:ro]")]
    pub volumes: Vec<String>,
    /// Inject a named secret as a file (NAME:/run/secrets/FILE) or a variable
    /// (NAME:ENV_VAR). Repeatable.
    #[arg(long = "secret", value_name = "NAME:DST|ENV")]
    pub secrets: Vec<String>,
    /// Print the sandbox as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct LsArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// States to show (comma-separated): creating, running, stopping, stopped.
    #[arg(long)]
    pub state: Option<String>,
    /// Include stopped sandboxes.
    #[arg(short, long)]
    pub all: bool,
    /// Only sandboxes with tag KEY=VALUE (or KEY). Repeatable.
    #[arg(long = "tag", value_name = "K=V")]
    pub tags: Vec<String>,
    #[arg(long)]
    pub json: bool,
    /// Only ids, one a line.
    #[arg(short, long)]
    pub quiet: bool,
}

#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub conn: Conn,
    pub sandbox: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
#[command(trailing_var_arg = true)]
pub struct ExecArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Allocate a pseudo-terminal.
    #[arg(short = 't', long)]
    pub tty: bool,
    /// Forward this terminal's stdin (default when -t is given).
    #[arg(short = 'i', long)]
    pub interactive: bool,
    #[arg(short, long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    #[arg(short, long)]
    pub workdir: Option<String>,
    #[arg(short, long)]
    pub user: Option<String>,
    /// Kill the command after this long, e.g. 30s.
    #[arg(long)]
    pub timeout: Option<String>,
    /// Start in the background and print the process id (see `sandlot logs`).
    #[arg(short, long)]
    pub detach: bool,
    /// Print output and exit as JSON lines (NDJSON events).
    #[arg(long)]
    pub json: bool,
    pub sandbox: String,
    #[arg(required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct ShellArgs {
    #[command(flatten)]
    pub conn: Conn,
    #[arg(short, long)]
    pub user: Option<String>,
    pub sandbox: String,
    /// The shell (default: bash if present, else sh).
    pub command: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct CpArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// LOCAL or SANDBOX:/path (`-` is stdin/stdout for files).
    pub src: String,
    /// LOCAL or SANDBOX:/path.
    pub dst: String,
}

#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    #[command(flatten)]
    pub conn: Conn,
    pub sandbox: String,
    /// Process id (from `exec -d` or `sandlot inspect`); omit to list processes.
    pub process: Option<u64>,
    /// Byte offset to resume from (both streams).
    #[arg(long, default_value_t = 0)]
    pub from: u64,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct RmArgs {
    #[command(flatten)]
    pub conn: Conn,
    #[arg(required = true)]
    pub sandboxes: Vec<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct TimeoutArgs {
    #[command(flatten)]
    pub conn: Conn,
    pub sandbox: String,
    /// Remaining lifetime from now, e.g. 30m.
    pub timeout: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct PauseArgs {
    #[command(flatten)]
    pub conn: Conn,
    pub sandbox: String,
    #[arg(long)]
    pub json: bool,
}

/// Renders a client error once: message, code and request id.
pub(super) fn report(e: &anyhow::Error) -> i32 {
    match e.downcast_ref::<sandlot_client::Error>() {
        Some(sandlot_client::Error::Api { body, .. }) => {
            let rid = if body.request_id.is_empty() {
                String::new()
            } else {
                format!(", request {}", body.request_id)
            };
            eprintln!("sandlot: {} ({}{rid})", body.message, body.code);
        }
        _ => eprintln!("sandlot: {e:#}"),
    }
    EXIT_SANDLOT_ERROR
}

pub fn run(cmd: ApiCommand) -> anyhow::Result<i32> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let r = rt.block_on(async move {
        match cmd {
            ApiCommand::Create(a) => create(*a).await,
            ApiCommand::Ls(a) => ls(a).await,
            ApiCommand::Inspect(a) => inspect(a).await,
            ApiCommand::Exec(a) => exec(a).await,
            ApiCommand::Shell(a) => shell(a).await,
            ApiCommand::RunCode(a) => super::code_cmd::run(a).await,
            ApiCommand::Cp(a) => cp(a).await,
            ApiCommand::Logs(a) => logs(a).await,
            ApiCommand::Rm(a) => rm(a).await,
            ApiCommand::Timeout(a) => timeout(a).await,
            ApiCommand::Pause(a) => pause(a, true).await,
            ApiCommand::Resume(a) => pause(a, false).await,
            ApiCommand::Checkpoint(c) => super::checkpoint_cmd::run(c).await,
            ApiCommand::Fork(a) => super::checkpoint_cmd::fork(a).await,
            ApiCommand::Snapshot(c) => super::snapshot_cmd::run(c).await,
            ApiCommand::Net(n) => super::net_cmd::run(n).await,
            ApiCommand::Port(c) => super::port_cmd::run(c).await,
            _ => unreachable!("dispatched in api_cmd::run"),
        }
    });
    // Let tasks holding stdin readers go without waiting for them.
    rt.shutdown_background();
    match r {
        Ok(code) => Ok(code),
        Err(e) => Ok(report(&e)),
    }
}

pub(crate) fn num_or_str(s: &str) -> Value {
    match s.parse::<f64>() {
        Ok(n) => Value::from(n),
        Err(_) => Value::from(s),
    }
}

fn create_body(a: &CreateArgs) -> anyhow::Result<CreateSandbox> {
    let mut body = CreateSandbox::default();
    let (mut tags, mut metadata) = (BTreeMap::new(), BTreeMap::new());
    if let Some(p) = &a.spec {
        let mut m = crate::spec_flags::read_object(p)?;
        if let Some(Value::String(n)) = m.remove("name") {
            body.request.name = Some(n);
        }
        for (key, dst) in [("tags", &mut tags), ("metadata", &mut metadata)] {
            if let Some(Value::Object(t)) = m.remove(key) {
                for (k, v) in t {
                    dst.insert(
                        k,
                        v.as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| v.to_string()),
                    );
                }
            }
        }
        body.spec = m;
    }
    if a.name.is_some() {
        body.request.name = a.name.clone();
    }
    for t in &a.tags {
        let (k, v) = kv(t, "--tag")?;
        tags.insert(k, v);
    }
    for t in &a.meta {
        let (k, v) = kv(t, "--meta")?;
        metadata.insert(k, v);
    }
    if let Some(t) = &a.idle_timeout {
        body.spec.insert("idle_timeout".into(), num_or_str(t));
    }
    if !tags.is_empty() {
        body.request.tags = Some(tags);
    }
    if !metadata.is_empty() {
        body.request.metadata = Some(metadata);
    }
    // A flag overrides the --spec file's field of the same name.
    if let Some(p) = a.on_idle {
        body.spec.remove("on_idle");
        body.request.on_idle = Some(p);
    }
    if let Some(p) = a.on_timeout {
        body.spec.remove("on_timeout");
        body.request.on_timeout = Some(p);
    }
    if a.auto_resume {
        body.spec.remove("auto_resume");
        body.request.auto_resume = Some(true);
    }
    a.spec_flags.apply(&mut body.spec)?;
    for (flags, key, parse) in [
        (
            &a.volumes,
            "volumes",
            crate::spec_flags::volume_flag as fn(&str) -> _,
        ),
        (&a.secrets, "secrets", crate::spec_flags::secret_flag),
    ] {
        for f in flags {
            let v = parse(f)?;
            let list = body
                .spec
                .entry(key)
                .or_insert_with(|| Value::Array(Vec::new()));
            match list.as_array_mut() {
                Some(l) => l.push(v),
                None => *list = Value::Array(vec![v]),
            }
        }
    }
    if let Some(n) = a.network.to_value()? {
        body.spec.insert("network".into(), n);
    }
    Ok(body)
}

async fn create(a: CreateArgs) -> anyhow::Result<i32> {
    let c = a.conn.client()?;
    let sb = c.create_sandbox(&create_body(&a)?).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&sb)?);
    } else {
        println!("{}", sb.id);
    }
    Ok(0)
}

fn tag_filter(tags: &[String]) -> Vec<(String, Option<String>)> {
    tags.iter()
        .map(|t| match t.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (t.clone(), None),
        })
        .collect()
}

async fn ls(a: LsArgs) -> anyhow::Result<i32> {
    let c = a.conn.client()?;
    let mut states: Vec<String> = a
        .state
        .iter()
        .flat_map(|s| s.split(',').map(str::to_string))
        .collect();
    if a.all && states.is_empty() {
        states.push("all".into());
    }
    let list = c
        .list_sandboxes(&ListFilter {
            states,
            tags: tag_filter(&a.tags),
            name: None,
        })
        .await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    if a.quiet {
        for s in &list {
            println!("{}", s.id);
        }
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.name.clone().unwrap_or_else(|| "-".into()),
                s.tenant.clone(),
                s.state.as_str().to_string()
                    + &s.end_reason
                        .as_ref()
                        .map(|r| format!(" ({r})"))
                        .unwrap_or_default(),
                s.created_at.clone(),
                human_secs(s.usage.wall_seconds),
                s.tags
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(","),
            ]
        })
        .collect();
    table(
        &["ID", "NAME", "TENANT", "STATE", "CREATED", "UP", "TAGS"],
        &rows,
    );
    Ok(0)
}

fn print_sandbox(s: &Sandbox) {
    let u = &s.usage;
    let mut lines = vec![
        ("id", s.id.clone()),
        ("name", s.name.clone().unwrap_or_else(|| "-".into())),
        ("tenant", s.tenant.clone()),
        ("state", s.state.as_str().into()),
        ("created", s.created_at.clone()),
        ("expires", s.expires_at.clone()),
        (
            "idle timeout",
            s.idle_timeout.map(human_secs).unwrap_or_else(|| "-".into()),
        ),
        (
            "lifecycle",
            format!(
                "on idle {}, on timeout {}{}",
                s.on_idle.as_str(),
                s.on_timeout.as_str(),
                if s.auto_resume { ", auto-resume" } else { "" }
            ),
        ),
    ];
    if let Some(r) = &s.end_reason {
        lines.push((
            "ended",
            format!("{} ({r})", s.ended_at.clone().unwrap_or_default()),
        ));
    }
    if let Some(e) = &s.error {
        lines.push(("error", e.clone()));
    }
    lines.push((
        "tags",
        s.tags
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", "),
    ));
    lines.push((
        "usage",
        format!(
            "cpu {:.2}s, memory {} (peak {}), up {}, {} execs, stdout {} B, stderr {} B, stdin {} B",
            u.cpu_seconds,
            human_bytes(u.memory_bytes),
            human_bytes(u.memory_peak_bytes),
            human_secs(u.wall_seconds),
            u.exec_count,
            u.stdout_bytes,
            u.stderr_bytes,
            u.stdin_bytes
        ),
    ));
    lines.push(("spec", s.spec.to_string()));
    for (k, v) in lines {
        println!("{:<13} {}", format!("{k}:"), super::render::printable(&v));
    }
}

async fn inspect(a: InspectArgs) -> anyhow::Result<i32> {
    let s = a.conn.client()?.get_sandbox(&a.sandbox).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print_sandbox(&s);
    }
    Ok(0)
}

fn exit_code(x: &sandlot_client::ProcessExit) -> i32 {
    if x.timed_out {
        return 124;
    }
    x.shell_code()
}

/// Exit code for a failed start (`spawn_failed`): 127 when not found, else 126.
fn start_failure(e: &sandlot_client::Error) -> Option<i32> {
    match e {
        sandlot_client::Error::Api { body, .. } if body.code == "spawn_failed" => {
            eprintln!("sandlot: {}", body.message);
            Some(
                if body.message.contains("not found") || body.message.contains("No such file") {
                    127
                } else {
                    126
                },
            )
        }
        _ => None,
    }
}

async fn exec(a: ExecArgs) -> anyhow::Result<i32> {
    let c = a.conn.client()?;
    let mut env = std::collections::BTreeMap::new();
    for e in &a.env {
        let (k, v) = kv(e, "--env")?;
        env.insert(k, v);
    }
    let interactive = a.interactive || a.tty;
    let body = ExecBody {
        argv: a.command.clone(),
        env,
        cwd: a.workdir.clone(),
        user: a.user.clone(),
        pty: a.tty.then(terminal_size),
        timeout: a.timeout.as_deref().map(num_or_str),
        stdin: interactive,
        tag: None,
        background: a.detach,
    };
    if a.detach {
        let p = match c.exec(&a.sandbox, &body).await {
            Ok(p) => p,
            Err(e) => return start_failure(&e).map(Ok).unwrap_or(Err(e.into())),
        };
        if a.json {
            println!("{}", serde_json::to_string(&p)?);
        } else {
            println!("{}", p.id);
        }
        return Ok(0);
    }
    if interactive {
        return interactive_session(&c, &a.sandbox, &body, a.tty).await;
    }
    let (_, mut s) = match c.exec_stream(&a.sandbox, &body).await {
        Ok(v) => v,
        Err(e) => return start_failure(&e).map(Ok).unwrap_or(Err(e.into())),
    };
    stream_output(&mut s, a.json).await
}

async fn stream_output(s: &mut sandlot_client::OutputStream, json: bool) -> anyhow::Result<i32> {
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    let mut code = None;
    if json {
        while let Some(ev) = s.next_event().await? {
            if let sandlot_client::StreamEvent::Exit { exit } = &ev {
                code = Some(exit_code(exit));
            }
            println!("{}", serde_json::to_string(&ev)?);
        }
    } else {
        while let Some(ev) = s.next().await? {
            match ev {
                Output::Stdout(_, b) => {
                    out.write_all(&b)?;
                    out.flush()?;
                }
                Output::Stderr(_, b) => {
                    err.write_all(&b)?;
                    err.flush()?;
                }
                Output::Exit(x) => code = Some(exit_code(&x)),
            }
        }
    }
    match code {
        Some(c) => Ok(c),
        None => bail!("the output stream ended without an exit status (the sandbox stopped?)"),
    }
}

fn terminal_size() -> PtySize {
    match rustix::termios::tcgetwinsize(std::io::stdout()) {
        Ok(w) if w.ws_row > 0 && w.ws_col > 0 => PtySize {
            rows: w.ws_row,
            cols: w.ws_col,
        },
        _ => PtySize { rows: 24, cols: 80 },
    }
}

/// Puts the terminal in raw mode until dropped.
struct RawMode(Option<rustix::termios::Termios>);

impl RawMode {
    fn enable() -> RawMode {
        let stdin = std::io::stdin();
        match rustix::termios::tcgetattr(&stdin) {
            Ok(orig) => {
                let mut raw = orig.clone();
                raw.make_raw();
                let _ =
                    rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw);
                RawMode(Some(orig))
            }
            Err(_) => RawMode(None),
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            let _ = rustix::termios::tcsetattr(
                std::io::stdin(),
                rustix::termios::OptionalActions::Now,
                t,
            );
        }
    }
}

/// Stdin forwarded over a WebSocket, output to this terminal; window size changes
/// follow the terminal.
async fn interactive_session(
    c: &Client,
    sandbox: &str,
    body: &ExecBody,
    tty: bool,
) -> anyhow::Result<i32> {
    use tokio::io::AsyncReadExt;
    let mut ws = match c.exec_ws(sandbox, body).await {
        Ok(w) => w,
        Err(e) => return start_failure(&e).map(Ok).unwrap_or(Err(e.into())),
    };
    // The first message says whether it started.
    match ws.next_event().await {
        Ok(Some(sandlot_client::StreamEvent::Started { .. })) => {}
        Ok(other) => bail!("unexpected first message {other:?}"),
        Err(e) => return start_failure(&e).map(Ok).unwrap_or(Err(e.into())),
    }
    let _raw = tty.then(RawMode::enable);
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; 16 * 1024];
    let mut stdin_open = true;
    let mut winch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())?;
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    loop {
        tokio::select! {
            n = stdin.read(&mut buf), if stdin_open => match n {
                Ok(0) | Err(_) => {
                    stdin_open = false;
                    ws.close_stdin().await?;
                }
                Ok(n) => ws.write_stdin(&buf[..n]).await?,
            },
            _ = winch.recv(), if tty => {
                let s = terminal_size();
                ws.resize(s.rows, s.cols).await?;
            }
            ev = ws.next() => match ev? {
                Some(Output::Stdout(_, b)) => {
                    out.write_all(&b)?;
                    out.flush()?;
                }
                Some(Output::Stderr(_, b)) => {
                    err.write_all(&b)?;
                    err.flush()?;
                }
                Some(Output::Exit(x)) => {
                    // Drain what descendants still print, then stop.
                    while let Ok(Ok(Some(Output::Stdout(_, b)))) = tokio::time::timeout(std::time::Duration::from_millis(50), ws.next()).await {
                        out.write_all(&b)?;
                    }
                    out.flush()?;
                    return Ok(exit_code(&x));
                }
                None => bail!("the session ended without an exit status (the sandbox stopped?)"),
            },
        }
    }
}

async fn shell(a: ShellArgs) -> anyhow::Result<i32> {
    let c = a.conn.client()?;
    let argv = if a.command.is_empty() {
        let has_bash = c.stat(&a.sandbox, "/bin/bash").await.is_ok();
        vec![
            if has_bash { "/bin/bash" } else { "/bin/sh" }.to_string(),
            "-l".to_string(),
        ]
    } else {
        a.command.clone()
    };
    let body = ExecBody {
        argv,
        user: a.user.clone(),
        pty: Some(terminal_size()),
        stdin: true,
        ..Default::default()
    };
    interactive_session(&c, &a.sandbox, &body, true).await
}

/// `SANDBOX:/path` → (sandbox, path); a local path otherwise.
fn remote(s: &str) -> Option<(&str, &str)> {
    let (sb, p) = s.split_once(':')?;
    (!sb.is_empty() && !sb.contains('/') && p.starts_with('/')).then_some((sb, p))
}

/// Reads a local file as a stream of chunks (bounded memory).
pub(crate) fn file_stream(
    f: tokio::fs::File,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + Sync + 'static {
    futures_util::stream::unfold(f, |mut f| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 256 * 1024];
        match f.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Bytes::from(buf)), f))
            }
            Err(e) => Some((Err(e), f)),
        }
    })
}

/// Writes into the channel of a [`tar_stream`].
pub(crate) struct ChannelWriter(tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>);

impl Write for ChannelWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .blocking_send(Ok(Bytes::copy_from_slice(b)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "upload stopped"))?;
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A tar archive that `add` fills (symbolic links archived as links), built in a thread
/// and streamed; an error ends the stream.
pub(crate) fn tar_stream<F>(
    add: F,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + Sync + 'static
where
    F: FnOnce(&mut tar::Builder<std::io::BufWriter<ChannelWriter>>) -> std::io::Result<()>
        + Send
        + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    std::thread::spawn(move || {
        let w = ChannelWriter(tx.clone());
        let mut b = tar::Builder::new(std::io::BufWriter::with_capacity(256 * 1024, w));
        b.follow_symlinks(false);
        let r = add(&mut b).and_then(|_| b.into_inner().map(|_| ()));
        if let Err(e) = r {
            let _ = tx.blocking_send(Err(e));
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) })
}

async fn cp(a: CpArgs) -> anyhow::Result<i32> {
    let c = a.conn.client()?;
    match (remote(&a.src), remote(&a.dst)) {
        (None, Some((sb, path))) => {
            let local = Path::new(&a.src);
            if a.src == "-" {
                let f = tokio::fs::File::from_std(std::fs::File::open("/dev/stdin")?);
                c.write_file(sb, path, None, file_stream(f)).await?;
            } else if local.is_dir() {
                let dir = local.to_path_buf();
                let r = c
                    .tar_upload(sb, path, tar_stream(move |b| b.append_dir_all(".", &dir)))
                    .await?;
                for s in &r.skipped {
                    eprintln!("sandlot: skipped {s}");
                }
            } else {
                let meta =
                    std::fs::metadata(local).with_context(|| format!("{}", local.display()))?;
                use std::os::unix::fs::PermissionsExt;
                let f = tokio::fs::File::open(local).await?;
                c.write_file(
                    sb,
                    path,
                    Some(meta.permissions().mode() & 0o7777),
                    file_stream(f),
                )
                .await?;
            }
            Ok(0)
        }
        (Some((sb, path)), None) => {
            let st = c.stat(sb, path).await?;
            if st.kind == "dir" {
                let dest = PathBuf::from(&a.dst);
                std::fs::create_dir_all(&dest)
                    .with_context(|| format!("create {}", dest.display()))?;
                let mut s = c.tar_download(sb, path).await?;
                let (tx, rx) = std::sync::mpsc::sync_channel::<Bytes>(4);
                let unpack = std::thread::spawn(move || -> std::io::Result<()> {
                    struct R(std::sync::mpsc::Receiver<Bytes>, Bytes);
                    impl std::io::Read for R {
                        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                            while self.1.is_empty() {
                                match self.0.recv() {
                                    Ok(b) => self.1 = b,
                                    Err(_) => return Ok(0),
                                }
                            }
                            let n = buf.len().min(self.1.len());
                            buf[..n].copy_from_slice(&self.1[..n]);
                            self.1 = self.1.slice(n..);
                            Ok(n)
                        }
                    }
                    // Permission bits come along, set-id bits never: the sandbox's
                    // files must not become set-id programs of the user running cp.
                    // Each file's blocks of zeros become holes again (the archive
                    // carries them as zeros).
                    // Directories last, deepest first, as `Archive::unpack` does (a
                    // read-only one must not keep its files out).
                    let mut ar = tar::Archive::new(R(rx, Bytes::new()));
                    ar.set_preserve_permissions(false);
                    let mut dirs = Vec::new();
                    for e in ar.entries()? {
                        let mut e = e?;
                        let ty = e.header().entry_type();
                        if ty.is_dir() {
                            dirs.push(e);
                            continue;
                        }
                        // Where `unpack_in` puts it: the plain components, under `dest`.
                        let rel: PathBuf = e
                            .path()?
                            .components()
                            .filter(|c| matches!(c, std::path::Component::Normal(_)))
                            .collect();
                        if e.unpack_in(&dest)? && ty.is_file() {
                            super::sparse_out::punch_zero_blocks(&dest.join(rel))?;
                        }
                    }
                    dirs.sort_by(|a, b| b.path_bytes().cmp(&a.path_bytes()));
                    for mut d in dirs {
                        d.unpack_in(&dest)?;
                    }
                    Ok(())
                });
                while let Some(chunk) = s.chunk().await? {
                    if tx.send(chunk).is_err() {
                        break;
                    }
                }
                drop(tx);
                unpack
                    .join()
                    .map_err(|_| anyhow::anyhow!("unpacking panicked"))??;
            } else {
                let mut s = c.read_file(sb, path).await?;
                if a.dst == "-" {
                    let mut out = std::io::stdout().lock();
                    while let Some(chunk) = s.chunk().await? {
                        out.write_all(&chunk)?;
                    }
                    out.flush()?;
                    return Ok(0);
                }
                let mut dest = PathBuf::from(&a.dst);
                if dest.is_dir() {
                    dest = dest.join(Path::new(path).file_name().unwrap_or_default());
                }
                let f = std::fs::File::create(&dest)
                    .with_context(|| format!("create {}", dest.display()))?;
                // Blocks of zeros stay holes: a sparse file stays sparse here.
                let mut out = super::sparse_out::SparseFile::new(f);
                while let Some(chunk) = s.chunk().await? {
                    out.write_all(&chunk)?;
                }
                let f = out.finish()?;
                // The file's permission bits, as a directory copy keeps them (an
                // executable stays executable); set-id bits never.
                use std::os::unix::fs::PermissionsExt;
                f.set_permissions(std::fs::Permissions::from_mode(st.mode & 0o777))
                    .with_context(|| format!("chmod {}", dest.display()))?;
            }
            Ok(0)
        }
        _ => bail!("exactly one of SRC and DST must be SANDBOX:/absolute/path"),
    }
}

async fn logs(a: LogsArgs) -> anyhow::Result<i32> {
    let c = a.conn.client()?;
    let Some(pid) = a.process else {
        let ps = c.list_processes(&a.sandbox).await?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&ps)?);
            return Ok(0);
        }
        let rows: Vec<Vec<String>> = ps
            .iter()
            .map(|p| {
                vec![
                    p.id.to_string(),
                    p.pid.to_string(),
                    p.state.clone(),
                    p.exit
                        .map(|x| x.shell_code().to_string())
                        .unwrap_or_else(|| "-".into()),
                    p.started_at.clone(),
                    p.argv.join(" "),
                ]
            })
            .collect();
        table(&["ID", "PID", "STATE", "EXIT", "STARTED", "COMMAND"], &rows);
        return Ok(0);
    };
    let mut s = c.output(&a.sandbox, pid, a.from, a.from).await?;
    stream_output(&mut s, a.json).await
}

async fn rm(a: RmArgs) -> anyhow::Result<i32> {
    let c = a.conn.client()?;
    let mut failed = 0;
    for id in &a.sandboxes {
        match c.delete_sandbox(id).await {
            Ok(s) if a.json => println!("{}", serde_json::to_string(&s)?),
            Ok(s) => println!("{}", s.id),
            Err(e) => {
                failed += 1;
                report(&e.into());
            }
        }
    }
    Ok(if failed > 0 { EXIT_SANDLOT_ERROR } else { 0 })
}

/// `sandlot pause` (`pause`) and `sandlot resume`.
async fn pause(a: PauseArgs, pause: bool) -> anyhow::Result<i32> {
    let c = a.conn.client()?;
    let s = if pause {
        c.pause_sandbox(&a.sandbox).await?
    } else {
        c.resume_sandbox(&a.sandbox).await?
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        match s.pause {
            Some(kind) => println!("{} {} (kept: {})", s.id, s.state.as_str(), kind.as_str()),
            None => println!("{} {}", s.id, s.state.as_str()),
        }
    }
    Ok(0)
}

async fn timeout(a: TimeoutArgs) -> anyhow::Result<i32> {
    let s = a
        .conn
        .client()?
        .set_timeout(&a.sandbox, num_or_str(&a.timeout))
        .await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        println!("{} expires at {}", s.id, s.expires_at);
    }
    Ok(0)
}

#[cfg(test)]
mod create_body_tests {
    use super::*;
    use clap::Parser;
    use sandlot_client::CreateSandboxRequest;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        create: CreateArgs,
    }

    fn body(spec: Option<&Value>, flags: &[&str]) -> Value {
        let dir = std::env::temp_dir().join(format!("sandlot-create-body-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("spec-{}.json", flags.len()));
        let mut argv = vec!["sandlot".to_string()];
        if let Some(s) = spec {
            std::fs::write(&file, s.to_string()).unwrap();
            argv.extend(["--spec".to_string(), file.display().to_string()]);
        }
        argv.extend(flags.iter().map(|f| f.to_string()));
        let cli = Cli::try_parse_from(argv).unwrap();
        let b = serde_json::to_value(create_body(&cli.create).unwrap()).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        b
    }

    #[test]
    fn the_cli_sends_a_spec_files_fields_with_its_flags_over_them() {
        let spec = serde_json::json!({"name": "f", "tags": {"a": "1", "n": 2},
            "metadata": {"m": "x"}, "idle_timeout": "1m", "on_idle": "pause", "image": "host"});
        let b = body(Some(&spec), &[]);
        assert_eq!(
            b,
            serde_json::json!({"name": "f", "tags": {"a": "1", "n": "2"}, "metadata": {"m": "x"},
                "idle_timeout": "1m", "on_idle": "pause", "image": "host"})
        );
        let b = body(
            Some(&spec),
            &[
                "--name",
                "g",
                "--tag",
                "b=2",
                "--idle-timeout",
                "30",
                "--on-idle",
                "kill",
                "--auto-resume",
            ],
        );
        assert_eq!(b["name"], "g");
        assert_eq!(b["tags"], serde_json::json!({"a": "1", "n": "2", "b": "2"}));
        assert_eq!(b["idle_timeout"], serde_json::json!(30.0));
        assert_eq!(b["on_idle"], "kill");
        assert_eq!(b["auto_resume"], true);
        // Whatever the CLI sends is a create request the daemon reads.
        serde_json::from_value::<CreateSandboxRequest>(b).unwrap();
        assert_eq!(body(None, &[]), serde_json::json!({}));
    }
}
