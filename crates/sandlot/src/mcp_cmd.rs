//! `sandlot mcp`: the MCP server on standard input and output, for a local agent
//! (Claude Desktop, Cursor, an Agents SDK `MCPServerStdio`). Its tools act with the
//! daemon address and token of the other client commands (`SANDLOT_URL`,
//! `SANDLOT_TOKEN`). Standard output carries the protocol only.

use anyhow::Context;

use crate::api_cmd::client_cmds::Conn;

#[derive(Debug, clap::Args)]
pub struct McpArgs {
    #[command(flatten)]
    pub conn: Conn,
}

pub fn run(a: McpArgs) -> anyhow::Result<i32> {
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
