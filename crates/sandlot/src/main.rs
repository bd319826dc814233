//! The `sandlot` binary: CLI and (later) the daemon.

use clap::{Parser, Subcommand};

mod memory_cmd;
mod vfs_cmd;

#[derive(Debug, Parser)]
#[command(name = "sandlot", version, about = "Secure, ephemeral sandboxes for AI agents")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Virtual read-only filesystems over document collections.
    Vfs(vfs_cmd::VfsArgs),
    /// Semantic memory stores: Markdown files in git with offline search.
    Memory(memory_cmd::MemoryArgs),
}

fn main() {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Vfs(a) => vfs_cmd::run(a),
        Cmd::Memory(a) => memory_cmd::run(a),
    };
    match res {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("sandlot: {e:#}");
            std::process::exit(1);
        }
    }
}
