//! `sandlot snapshot create|ls|inspect|rm|start`: saved states of a sandbox that
//! belong to its tenant and outlive it.

use sandlot_client::snapshot::{CreateSnapshot, Snapshot, StartFromSnapshot};

use super::client_cmds::{report, Conn};
use super::render::{human_bytes, table};
use crate::EXIT_SANDLOT_ERROR;

#[derive(Debug, clap::Subcommand)]
pub enum SnapshotCmd {
    /// Take a snapshot of a sandbox (a fresh checkpoint, or `--checkpoint CP`
    /// promoted out of it); prints its id.
    Create(CreateArgs),
    /// The caller's snapshots, oldest first.
    #[command(alias = "ls")]
    List(ListArgs),
    /// One snapshot.
    Inspect(SnapshotArgs),
    /// Delete snapshots, freeing their disk.
    #[command(alias = "delete")]
    Rm(RmArgs),
    /// Start a new sandbox from a snapshot; prints its id.
    Start(StartArgs),
}

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Sandbox id or name.
    pub id: String,
    /// A name for the snapshot (1 to 64 characters, not unique).
    #[arg(long)]
    pub name: Option<String>,
    /// Promote this checkpoint of the sandbox instead of taking a fresh one.
    #[arg(long)]
    pub checkpoint: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Only the snapshots of this sandbox.
    #[arg(long, value_name = "ID")]
    pub sandbox: Option<String>,
    /// Only the snapshots of this name.
    #[arg(long)]
    pub name: Option<String>,
    /// Only the ids, one per line.
    #[arg(short, long)]
    pub quiet: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct SnapshotArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Snapshot id.
    pub snapshot: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct RmArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Snapshot ids.
    #[arg(required = true)]
    pub snapshots: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct StartArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Snapshot id.
    pub snapshot: String,
    /// Lifetime of the new sandbox in seconds (default: the lifetime the
    /// snapshot's sandbox was created with).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<u64>,
    #[arg(long)]
    pub json: bool,
}

/// What a snapshot keeps, in words.
fn keeps(s: &Snapshot) -> &'static str {
    if s.memory {
        "processes, memory and files"
    } else {
        "files; processes start afresh"
    }
}

fn row(s: &Snapshot) -> Vec<String> {
    vec![
        s.id.clone(),
        s.name.clone().unwrap_or_else(|| "-".into()),
        s.sandbox_id.clone(),
        s.created_at.clone(),
        s.kind.as_str().to_string(),
        human_bytes(s.size),
    ]
}

pub async fn run(cmd: SnapshotCmd) -> anyhow::Result<i32> {
    match cmd {
        SnapshotCmd::Create(a) => {
            let req = CreateSnapshot {
                name: a.name,
                checkpoint: a.checkpoint,
            };
            let s = a.conn.client()?.create_snapshot(&a.id, &req).await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                println!("{}", s.id);
                eprintln!("sandlot: snapshot {} keeps {}", s.id, keeps(&s));
            }
        }
        SnapshotCmd::List(a) => {
            let all = a
                .conn
                .client()?
                .list_snapshots(a.sandbox.as_deref(), a.name.as_deref())
                .await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else if a.quiet {
                for s in &all {
                    println!("{}", s.id);
                }
            } else {
                let rows: Vec<Vec<String>> = all.iter().map(row).collect();
                table(&["ID", "NAME", "SANDBOX", "CREATED", "KIND", "SIZE"], &rows);
            }
        }
        SnapshotCmd::Inspect(a) => {
            let s = a.conn.client()?.get_snapshot(&a.snapshot).await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                let [id, name, sandbox, created, kind, size] =
                    <[String; 6]>::try_from(row(&s)).expect("six columns");
                for (k, v) in [
                    ("id", id),
                    ("name", name),
                    ("sandbox", sandbox),
                    ("created", created),
                    ("kind", kind),
                    ("keeps", keeps(&s).to_string()),
                    ("size", size),
                ] {
                    println!("{k:<9}{v}");
                }
            }
        }
        SnapshotCmd::Rm(a) => {
            let c = a.conn.client()?;
            let mut failed = 0;
            for sn in &a.snapshots {
                match c.delete_snapshot(sn).await {
                    Ok(()) => println!("{sn}"),
                    Err(e) => {
                        failed += 1;
                        report(&e.into());
                    }
                }
            }
            if failed > 0 {
                return Ok(EXIT_SANDLOT_ERROR);
            }
        }
        SnapshotCmd::Start(a) => {
            let req = StartFromSnapshot { timeout: a.timeout };
            let s = a
                .conn
                .client()?
                .start_from_snapshot(&a.snapshot, &req)
                .await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                println!("{}", s.id);
            }
        }
    }
    Ok(0)
}
