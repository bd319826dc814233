//! `sandlot port ...`: inbound traffic to a sandbox. The URL of the daemon's
//! authenticated HTTP/WebSocket proxy to a sandbox port, and raw TCP ports
//! published on the daemon's host.

use anyhow::Context;
use sandlot_client::PublishPort;

use super::client_cmds::Conn;
use super::render;

#[derive(Debug, clap::Subcommand)]
pub enum PortCmd {
    /// List the sandbox's published TCP ports.
    Ls(LsArgs),
    /// Publish a TCP port of the sandbox on the daemon's host; prints host:port.
    Publish(PublishArgs),
    /// Stop publishing a port (the host listener and its connections close).
    Unpublish(UnpublishArgs),
    /// Print the URL of the authenticated HTTP/WebSocket proxy to a sandbox port.
    Url(UrlArgs),
}

#[derive(Debug, clap::Args)]
pub struct LsArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Sandbox id or name.
    pub id: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct PublishArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Sandbox id or name.
    pub id: String,
    /// The port inside the sandbox (reached on its loopback).
    pub port: u32,
    /// The host port (default: a free one from the operator's range).
    #[arg(long, value_name = "PORT")]
    pub host_port: Option<u32>,
    /// The host address to listen on (default: the operator's first allowed one).
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct UnpublishArgs {
    #[command(flatten)]
    pub conn: Conn,
    pub id: String,
    pub port: u16,
}

#[derive(Debug, clap::Args)]
pub struct UrlArgs {
    #[command(flatten)]
    pub conn: Conn,
    pub id: String,
    pub port: u16,
}

pub async fn run(cmd: PortCmd) -> anyhow::Result<i32> {
    match cmd {
        PortCmd::Ls(a) => {
            let ports = a.conn.client()?.list_ports(&a.id).await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&ports)?);
            } else {
                let rows: Vec<Vec<String>> = ports
                    .iter()
                    .map(|p| vec![p.port.to_string(), p.address.clone(), p.created_at.clone()])
                    .collect();
                render::table(&["PORT", "PUBLISHED AT", "SINCE"], &rows);
            }
        }
        PortCmd::Publish(a) => {
            let p = a
                .conn
                .client()?
                .publish_port(
                    &a.id,
                    &PublishPort {
                        port: a.port,
                        host_port: a.host_port,
                        bind: a.bind.clone(),
                    },
                )
                .await
                .with_context(|| format!("publish port {} of {}", a.port, a.id))?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&p)?);
            } else {
                println!("{}", p.address);
            }
        }
        PortCmd::Unpublish(a) => {
            a.conn.client()?.unpublish_port(&a.id, a.port).await?;
            eprintln!("unpublished port {} of {}", a.port, a.id);
        }
        PortCmd::Url(a) => {
            let c = a.conn.client()?;
            // A sandbox the caller cannot see is an error, not a URL.
            let sb = c.get_sandbox(&a.id).await?;
            match c.port_url(&sb.id, a.port) {
                Some(u) => println!("{u}"),
                None => {
                    let path = sandlot_client::ports::proxy_path(&sb.id, a.port);
                    if let sandlot_client::Target::Unix(sock) = c.target() {
                        eprintln!(
                            "the daemon is on a Unix socket: curl --unix-socket {} http://localhost{path}",
                            sock.display()
                        );
                    }
                    println!("{path}");
                }
            }
        }
    }
    Ok(0)
}
