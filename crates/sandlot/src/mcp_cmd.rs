//! `sandlot mcp`: the MCP server on standard input and output, for a local agent
//! (Claude Desktop, Cursor, an Agents SDK `MCPServerStdio`). Its tools act with the
//! daemon address and token of the other client commands (`SANDLOT_URL`,
//! `SANDLOT_TOKEN`). Standard output carries the protocol only.
//!
//! The operator's Unix socket grants operator rights, which a model's tools must
//! not get by accident: an address that is a Unix socket (the default when
//! `SANDLOT_URL` is unset) is refused unless `--operator` is given.

use anyhow::Context;

use crate::api_cmd::client_cmds::Conn;

#[derive(Debug, clap::Args)]
pub struct McpArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Serve over the daemon's Unix socket, with the operator's rights.
    #[arg(long)]
    pub operator: bool,
}

/// Why `sandlot mcp` does not start.
#[derive(Debug, thiserror::Error)]
pub enum McpCmdError {
    #[error(
        "sandlot mcp: refusing to serve over the operator socket {0} (its tools would have \
         the operator's rights): set SANDLOT_URL to the daemon's HOST:PORT and SANDLOT_TOKEN \
         to a tenant token, or pass --operator to mean it"
    )]
    OperatorSocket(String),
}

/// Whether a daemon address names a Unix socket (the operator's).
fn is_unix_socket(address: &str) -> bool {
    address.starts_with("unix://") || address.starts_with('/')
}

pub fn run(a: McpArgs) -> anyhow::Result<i32> {
    let address = a.conn.address();
    if is_unix_socket(&address) && !a.operator {
        return Err(McpCmdError::OperatorSocket(address).into());
    }
    let client = a.conn.client()?;
    // Several threads: the client keeps its connections for reuse only there, and a
    // long command must not hold back the session's other requests.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start the async runtime")?;
    rt.block_on(sandlot_mcp::serve_stdio(client))
        .context("serve MCP on standard input and output")?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::is_unix_socket;

    #[test]
    fn unix_socket_addresses_are_told_from_tcp_ones() {
        assert!(is_unix_socket("unix:///run/sandlot/sandlot.sock"));
        assert!(is_unix_socket("/run/sandlot/sandlot.sock"));
        assert!(!is_unix_socket("127.0.0.1:7777"));
        assert!(!is_unix_socket("http://127.0.0.1:7777"));
    }
}
