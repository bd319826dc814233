//! `sandlot checkpoint create|list|restore|delete|diff` and `sandlot fork`: saved
//! states of a sandbox, and new sandboxes that continue from one.

use sandlot_client::checkpoint::{Checkpoint, CreateCheckpoint, ForkRequest};

use super::client_cmds::Conn;

#[derive(Debug, clap::Subcommand)]
pub enum CheckpointCmd {
    /// Take a checkpoint of a sandbox; prints its id.
    Create(CreateArgs),
    /// List a sandbox's checkpoints, oldest first.
    #[command(alias = "ls")]
    List(ListArgs),
    /// Restore a sandbox in place to one of its checkpoints.
    Restore(CheckpointArgs),
    /// Delete a checkpoint.
    #[command(alias = "rm")]
    Delete(CheckpointArgs),
    /// The files that differ from one checkpoint to another (`+` added, `~`
    /// changed, `-` removed).
    Diff(DiffArgs),
}

#[derive(Debug, clap::Args)]
pub struct DiffArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Sandbox id or name.
    pub id: String,
    /// The checkpoint diffed from.
    pub from: String,
    /// The checkpoint diffed to.
    pub to: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Sandbox id or name.
    pub id: String,
    /// A name for the checkpoint.
    #[arg(long)]
    pub name: Option<String>,
    /// Leave the sandbox paused after the checkpoint (`sandlot resume` starts it).
    #[arg(long)]
    pub paused: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub conn: Conn,
    pub id: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct CheckpointArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Sandbox id or name.
    pub id: String,
    /// Checkpoint id.
    pub checkpoint: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct ForkArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Sandbox id or name.
    pub id: String,
    /// How many sandboxes.
    #[arg(long, default_value_t = 1)]
    pub count: u32,
    /// Fork from this checkpoint (default: a fresh one of the running sandbox).
    #[arg(long)]
    pub checkpoint: Option<String>,
    #[arg(long)]
    pub json: bool,
}

fn line(c: &Checkpoint) -> String {
    format!(
        "{}\t{}\t{}\t{}\t{}\t{}",
        c.id,
        c.name.as_deref().unwrap_or("-"),
        c.parent.as_deref().unwrap_or("-"),
        c.created_at,
        c.kind.as_str(),
        c.size
    )
}

pub async fn run(cmd: CheckpointCmd) -> anyhow::Result<i32> {
    match cmd {
        CheckpointCmd::Create(a) => {
            let req = CreateCheckpoint {
                name: a.name,
                leave_running: !a.paused,
            };
            let c = a.conn.client()?.create_checkpoint(&a.id, &req).await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&c)?);
            } else {
                println!("{}", c.id);
            }
        }
        CheckpointCmd::List(a) => {
            let all = a.conn.client()?.list_checkpoints(&a.id).await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else {
                println!("ID\tNAME\tPARENT\tCREATED\tKIND\tSIZE");
                for c in &all {
                    println!("{}", line(c));
                }
            }
        }
        CheckpointCmd::Restore(a) => {
            let r = a
                .conn
                .client()?
                .restore_checkpoint(&a.id, &a.checkpoint)
                .await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!(
                    "{} restored to {} ({})",
                    r.sandbox.id,
                    r.checkpoint,
                    match r.kind {
                        sandlot_client::api::PauseKind::Memory => "processes, memory and files",
                        sandlot_client::api::PauseKind::Filesystem =>
                            "files; processes started afresh",
                    }
                );
            }
        }
        CheckpointCmd::Diff(a) => {
            let d = a
                .conn
                .client()?
                .diff_checkpoints(&a.id, &a.from, &a.to)
                .await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&d)?);
            } else {
                for (mark, paths) in [("+", &d.added), ("~", &d.changed), ("-", &d.removed)] {
                    for p in paths {
                        let p = super::render::printable(p.trim_start_matches('/'));
                        println!("{mark} /{p}");
                    }
                }
            }
        }
        CheckpointCmd::Delete(a) => {
            a.conn
                .client()?
                .delete_checkpoint(&a.id, &a.checkpoint)
                .await?;
        }
    }
    Ok(0)
}

pub async fn fork(a: ForkArgs) -> anyhow::Result<i32> {
    let req = ForkRequest {
        count: a.count,
        checkpoint: a.checkpoint,
    };
    let f = a.conn.client()?.fork_sandbox(&a.id, &req).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&f)?);
    } else {
        for s in &f.sandboxes {
            println!("{}", s.id);
        }
        if f.kind == sandlot_client::api::PauseKind::Filesystem {
            eprintln!(
                "sandlot: the forks have the sandbox's files; their processes started afresh"
            );
        }
    }
    Ok(0)
}
