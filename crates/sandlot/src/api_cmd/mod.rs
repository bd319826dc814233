//! `sandlot serve`, `sandlot token ...` and the API client commands (`create`, `ls`,
//! `inspect`, `exec`, `shell`, `run-code`, `cp`, `logs`, `rm`, `timeout`), plus `completions`.
//! The API benchmark is `sandlot bench platform` (`crate::bench`).
//!
//! Exit codes: 0 on success; for `exec` and `shell`, the command's own code (128 +
//! signal when killed, 124 when its timeout expired); 126 when the command could not
//! be started, 127 when it was not found; 125 when Sandlot itself failed (the
//! daemon refused the request, or could not be reached) and for usage errors.

use std::path::PathBuf;

use anyhow::Context;
use sandlot_server::config::LogFormat;
use sandlot_server::ServerConfig;

mod checkpoint_cmd;
pub(crate) mod client_cmds;
mod code_cmd;
mod image_cmd;
mod net_cmd;
mod port_cmd;
mod render;
mod snapshot_cmd;
mod sparse_out;

/// The daemon and the API client commands.
// Parsed once per process: boxing the large variants would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, clap::Subcommand)]
pub enum ApiCommand {
    /// Run the daemon: the HTTP API on a Unix socket (and optionally TCP).
    Serve(ServeArgs),
    /// Manage API tokens (each belongs to a tenant), through the daemon's operator socket.
    #[command(subcommand)]
    Token(TokenCmd),
    /// Create a sandbox and print its id.
    Create(Box<client_cmds::CreateArgs>),
    /// List sandboxes.
    Ls(client_cmds::LsArgs),
    /// Show a sandbox.
    Inspect(client_cmds::InspectArgs),
    /// Run a command in a sandbox, streaming its output; exits with its code.
    Exec(client_cmds::ExecArgs),
    /// An interactive shell (PTY) in a sandbox.
    Shell(client_cmds::ShellArgs),
    /// Run code in a sandbox's code context (stateful; `-` reads it from stdin).
    RunCode(code_cmd::RunCodeArgs),
    /// Copy files or directories: `cp LOCAL SB:/path` or `cp SB:/path LOCAL`.
    Cp(client_cmds::CpArgs),
    /// Output of a process, from the start or an offset (re-attach).
    Logs(client_cmds::LogsArgs),
    /// Stop and remove sandboxes.
    Rm(client_cmds::RmArgs),
    /// Set a sandbox's remaining lifetime (e.g. `sandlot timeout SB 30m`).
    Timeout(client_cmds::TimeoutArgs),
    /// Pause a sandbox: its memory and files are saved (gVisor), or its files only
    /// (namespace backend), and nothing of it runs until `sandlot resume`.
    Pause(client_cmds::PauseArgs),
    /// Start a paused sandbox again from what its pause saved.
    Resume(client_cmds::PauseArgs),
    /// A sandbox's checkpoints: create, list, restore, delete.
    #[command(subcommand)]
    Checkpoint(checkpoint_cmd::CheckpointCmd),
    /// New sandboxes that continue from a checkpoint of a sandbox (a fresh one by
    /// default); prints their ids.
    Fork(checkpoint_cmd::ForkArgs),
    /// Snapshots: saved states of a sandbox that outlive it (create, ls,
    /// inspect, rm, start).
    #[command(subcommand)]
    Snapshot(snapshot_cmd::SnapshotCmd),
    /// Images: ls, inspect, rm, prune, import, export, diff, snapshot.
    #[command(subcommand)]
    Image(image_cmd::ImageCmd),
    /// Named persistent volumes.
    #[command(subcommand)]
    Volume(image_cmd::VolumeCmd),
    /// Named secrets (values are never shown).
    #[command(subcommand)]
    Secret(image_cmd::SecretCmd),
    /// A sandbox's network policy and egress audit log (`net log ID`).
    #[command(subcommand)]
    Net(net_cmd::NetCmd),
    /// Inbound: the proxy URL of a sandbox port, and TCP ports published on the host.
    #[command(subcommand)]
    Port(port_cmd::PortCmd),
    /// Print a shell completion script.
    Completions(CompletionsArgs),
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Data directory (SQLite database).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Operator configuration (TOML; unknown keys warn).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Also listen on TCP (every request needs a bearer token), e.g. 127.0.0.1:7070.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,
    /// Also serve the E2B-compatible API (REST and envd) here, e.g. 127.0.0.1:49983
    /// (see docs/e2b-compat.md).
    #[arg(long, value_name = "ADDR")]
    pub e2b_listen: Option<std::net::SocketAddr>,
    /// Also serve `GET /metrics` (only) here, without authentication, for a
    /// Prometheus scraper, e.g. 127.0.0.1:9464 (the metrics cover every tenant).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The operator's Unix socket (root only).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Prefix of this daemon's sandbox ids (default sb-; `id_prefix` in the config).
    /// Two daemons on one host need different prefixes: each takes every sandbox,
    /// cgroup and network namespace of its prefix for its own.
    #[arg(long, value_name = "PREFIX")]
    pub id_prefix: Option<String>,
    /// Keep N sandboxes of the default shape (no spec fields but env, workdir, user,
    /// timeout) started ahead of time, so that creating one only claims it. Other
    /// shapes: `[[pools]]` in the config file.
    #[arg(long, value_name = "N")]
    pub pool_size: Option<usize>,
    /// Log format on stderr: text or json (one object per line, a request's lines
    /// carrying its request_id; `log_format` in the config). Level: SANDLOT_LOG.
    #[arg(long, value_name = "FORMAT", value_parser = ["text", "json"])]
    pub log_format: Option<String>,
}

#[derive(Debug, clap::Subcommand)]
pub enum TokenCmd {
    /// Create a token for a tenant, or an operator token; prints the secret once.
    Create {
        /// The tenant the token acts as.
        #[arg(
            long,
            required_unless_present = "operator",
            conflicts_with = "operator"
        )]
        tenant: Option<String>,
        /// An operator token: every tenant, over TCP too (the web console's
        /// operator page). Only the daemon's Unix socket mints one.
        #[arg(long)]
        operator: bool,
        /// A label for listings.
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        at: TokenDb,
        #[arg(long)]
        json: bool,
    },
    /// List tokens (never their secrets).
    List {
        #[command(flatten)]
        at: TokenDb,
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by id.
    Revoke {
        id: String,
        #[command(flatten)]
        at: TokenDb,
    },
}

/// Where tokens are managed: through the daemon (its operator socket), or with
/// `--data-dir` in the database of a data directory a daemon has used.
#[derive(Debug, clap::Args)]
pub struct TokenDb {
    /// The daemon's operator socket: unix:///path.sock or /path.sock (tokens are
    /// the operator's).
    #[arg(long, env = "SANDLOT_URL", default_value = sandlot_client::DEFAULT_HOST)]
    host: String,
    /// Work on this data directory's database directly instead of through the
    /// daemon (e.g. before `sandlot serve` runs). Refused when no daemon ever used
    /// it: nothing is created.
    #[arg(long, value_name = "DIR", env = "SANDLOT_DATA_DIR")]
    data_dir: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    pub shell: clap_complete::Shell,
}

pub fn run(cmd: ApiCommand) -> anyhow::Result<i32> {
    if !matches!(cmd, ApiCommand::Serve(_)) {
        // Found by probing: `sandlot image ls | head -3` panicked on the closed pipe.
        let _ = sandlot_runtime::default_sigpipe();
    }
    match cmd {
        ApiCommand::Serve(a) => serve(a),
        ApiCommand::Token(t) => token(t),
        ApiCommand::Completions(a) => {
            let mut cmd = <crate::Cli as clap::CommandFactory>::command();
            clap_complete::generate(a.shell, &mut cmd, "sandlot", &mut std::io::stdout());
            Ok(0)
        }
        ApiCommand::Image(c) => image_cmd::run_image(c),
        ApiCommand::Volume(c) => image_cmd::run_volume(c),
        ApiCommand::Secret(c) => image_cmd::run_secret(c),
        other => client_cmds::run(other),
    }
}

fn serve(a: ServeArgs) -> anyhow::Result<i32> {
    let (mut cfg, warnings) = match &a.config {
        Some(p) => ServerConfig::load(p)?,
        None => (ServerConfig::default(), Vec::new()),
    };
    match a.log_format.as_deref() {
        Some("json") => cfg.log_format = LogFormat::Json,
        Some(_) => cfg.log_format = LogFormat::Text,
        None => {}
    }
    init_logging(cfg.log_format);
    for w in warnings {
        tracing::warn!("{w}");
    }
    if let Some(d) = a.data_dir {
        cfg.data_dir = d;
    }
    if let Some(s) = a.socket {
        cfg.socket = s;
    }
    if let Some(l) = a.listen {
        cfg.listen = Some(l);
    }
    if let Some(l) = a.e2b_listen {
        cfg.e2b.listen = Some(l);
    }
    if let Some(l) = a.metrics_listen {
        cfg.metrics_listen = Some(l);
    }
    if let Some(p) = a.id_prefix {
        cfg.id_prefix = p;
    }
    if let Some(n) = a.pool_size {
        // The shape of a create naming nothing: of the operator's default isolation.
        let default_shape = sandlot_proto::spec::SandboxSpec {
            isolation: cfg.isolation.default,
            ..Default::default()
        };
        cfg.pools.retain(|p| p.spec != default_shape);
        cfg.pools.push(sandlot_server::pool::PoolConfig {
            name: Some("default".into()),
            size: n,
            spec: default_shape,
            ..Default::default()
        });
    }
    cfg.validate()?;
    let exe = std::env::current_exe().context("find the sandlot binary")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    rt.block_on(async move {
        // Installed before anything else: a stop signal that arrives while the
        // daemon is still starting (its socket may already accept) is kept and
        // ends it gracefully once started, instead of killing it half-way.
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).context("install a SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("install a SIGINT handler")?;
        let shutdown = async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            tracing::info!("shutting down (sandboxes keep running)");
        };
        sandlot_server::serve(cfg, exe, shutdown)
            .await
            .map_err(anyhow::Error::from)
    })?;
    Ok(0)
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("SANDLOT_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal;
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => fmt.with_ansi(std::io::stderr().is_terminal()).try_init(),
        // The request span (and any other) on every line: `span` is the innermost,
        // `spans` all of them, outermost first.
        LogFormat::Json => fmt
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
}

fn token(t: TokenCmd) -> anyhow::Result<i32> {
    let at = match &t {
        TokenCmd::Create { at, .. } | TokenCmd::List { at, .. } | TokenCmd::Revoke { at, .. } => at,
    };
    match at.data_dir.clone() {
        Some(dir) => token_in_database(&dir, t),
        None => {
            let client = client_cmds::Conn {
                host: at.host.clone(),
                token: None,
                tenant: None,
            }
            .client()?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("start the async runtime")?;
            rt.block_on(token_through_daemon(&client, t))
        }
    }
}

/// One row of `token list`.
fn token_row(t: &serde_json::Value) -> Vec<String> {
    let s = |k: &str| t[k].as_str().unwrap_or("").to_string();
    vec![
        s("id"),
        s("kind"),
        s("tenant"),
        s("name"),
        s("created_at"),
        t["created_by"].as_str().unwrap_or("-").to_string(),
        t["last_used_at"].as_str().unwrap_or("-").to_string(),
        if t["revoked_at"].is_string() {
            "revoked"
        } else {
            "active"
        }
        .into(),
    ]
}

const TOKEN_COLUMNS: [&str; 8] = [
    "ID",
    "KIND",
    "TENANT",
    "NAME",
    "CREATED",
    "MADE BY",
    "LAST USED",
    "STATUS",
];

fn print_new_token(v: &serde_json::Value, json: bool) {
    if json {
        println!("{v}");
    } else {
        println!("{}", v["token"].as_str().unwrap_or(""));
        if v["kind"] == "operator" {
            eprintln!(
                "operator token {} (every tenant; shown once; store it now)",
                v["id"].as_str().unwrap_or("")
            );
            return;
        }
        eprintln!(
            "token {} for tenant {} (shown once; store it now; for E2B's SDKs, `e2b_` in place of `sl_` is the same key)",
            v["id"].as_str().unwrap_or(""),
            v["tenant"].as_str().unwrap_or("")
        );
    }
}

async fn token_through_daemon(c: &sandlot_client::Client, t: TokenCmd) -> anyhow::Result<i32> {
    match t {
        TokenCmd::Create {
            tenant,
            operator,
            name,
            json,
            ..
        } => {
            let body = if operator {
                serde_json::json!({"operator": true, "name": name})
            } else {
                serde_json::json!({"tenant": tenant, "name": name})
            };
            let v = c.call_json("POST", "/v1/tokens", Some(&body)).await?;
            print_new_token(&v, json);
        }
        TokenCmd::List { json, .. } => {
            let v = c.call_json("GET", "/v1/tokens", None).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v["tokens"])?);
            } else {
                let rows: Vec<Vec<String>> = v["tokens"]
                    .as_array()
                    .map(|a| a.iter().map(token_row).collect())
                    .unwrap_or_default();
                render::table(&TOKEN_COLUMNS, &rows);
            }
        }
        TokenCmd::Revoke { id, .. } => {
            c.call_json("DELETE", &format!("/v1/tokens/{id}"), None)
                .await?;
            eprintln!("revoked {id}");
        }
    }
    Ok(0)
}

/// `--data-dir`: the data directory's database, written directly. Only one a
/// daemon has made (a token in a database no daemon reads would be refused by the
/// daemon that runs); a note when no daemon runs on it now.
fn token_in_database(dir: &std::path::Path, t: TokenCmd) -> anyhow::Result<i32> {
    use sandlot_server::store::Store;
    let db = dir.join("sandlot.db");
    if !db.is_file() {
        anyhow::bail!(
            "{} does not exist: no daemon has used {} (nothing was created). Leave out \
             --data-dir (and SANDLOT_DATA_DIR) to manage tokens through the running daemon \
             (SANDLOT_URL), or start `sandlot serve --data-dir {}` once first",
            db.display(),
            dir.display(),
            dir.display()
        );
    }
    let writes = !matches!(t, TokenCmd::List { .. });
    if writes && !sandlot_server::daemon_running_on(dir) {
        eprintln!(
            "sandlot: note: no daemon is running on {}; this takes effect when `sandlot serve --data-dir {}` starts",
            dir.display(),
            dir.display()
        );
    }
    let store = Store::open(&db)?;
    let at = sandlot_server::timefmt::rfc3339;
    let view = |t: &sandlot_server::store::TokenRecord| {
        serde_json::json!({
            "id": t.id, "kind": t.kind.as_str(), "tenant": t.tenant, "name": t.name,
            "created_at": at(t.created_at),
            "last_used_at": t.last_used_at.map(at),
            "revoked_at": t.revoked_at.map(at),
            "created_by": t.created_by,
        })
    };
    match t {
        TokenCmd::Create {
            tenant,
            operator,
            name,
            json,
            ..
        } => {
            let (mut rec, secret, hash) = match tenant {
                _ if operator => sandlot_server::auth::new_operator_token(name),
                Some(tenant) if sandlot_server::config::valid_tenant(&tenant) => {
                    sandlot_server::auth::new_token(&tenant, name)
                }
                tenant => anyhow::bail!(
                    "--tenant {:?}: {}",
                    tenant.unwrap_or_default(),
                    sandlot_server::config::TENANT_RULE
                ),
            };
            // Written by root on the host, as the socket's would be.
            rec.created_by = Some(sandlot_server::auth::CREATED_BY_SOCKET.to_string());
            store.insert_token(&rec, &hash)?;
            let mut v = view(&rec);
            if let Some(k) = sandlot_server::auth::e2b_api_key(&secret)
                .filter(|_| rec.kind == sandlot_server::store::TokenKind::Tenant)
            {
                v["e2b_api_key"] = serde_json::Value::String(k);
            }
            v["token"] = serde_json::Value::String(secret);
            print_new_token(&v, json);
        }
        TokenCmd::List { json, .. } => {
            let toks: Vec<serde_json::Value> = store.list_tokens()?.iter().map(view).collect();
            if json {
                println!("{}", serde_json::to_string_pretty(&toks)?);
            } else {
                let rows: Vec<Vec<String>> = toks.iter().map(token_row).collect();
                render::table(&TOKEN_COLUMNS, &rows);
            }
        }
        TokenCmd::Revoke { id, .. } => {
            // Root on the host, as the socket: any token, with what it minted.
            match store.revoke_token(&id, true)? {
                sandlot_server::store::Revoke::Revoked { minted: 0 } => {
                    eprintln!("revoked {id}")
                }
                sandlot_server::store::Revoke::Revoked { minted } => {
                    eprintln!("revoked {id} and the {minted} tokens it minted")
                }
                _ => anyhow::bail!("no active token {id}"),
            }
        }
    }
    Ok(0)
}

/// Nanoseconds of the clock, for unique temporary names.
pub(crate) fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}
