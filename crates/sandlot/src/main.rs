//! The `sandlot` binary: CLI and (later) the daemon.
//!
//! Exit codes: the command's own for `run`; 125 when Sandlot itself fails (bad input,
//! runtime error); 126/127 when the command cannot be started / is not found.

use clap::{Parser, Subcommand};

mod api_cmd;
mod bench;
#[cfg(feature = "memory")]
mod memory_cmd;
#[cfg(feature = "memory")]
mod memory_output;
#[cfg(feature = "memory")]
mod memory_remote;
mod run;
mod run_session;
mod spec_flags;
mod vfs_cmd;

#[derive(Debug, Parser)]
#[command(
    name = "sandlot",
    version,
    about = "Secure, ephemeral sandboxes for AI agents"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run one command in a fresh sandbox, without a daemon.
    Run(run::RunArgs),
    /// Measure Sandlot against its peers (see docs/benchmarks.md).
    Bench(bench::BenchArgs),
    /// Daemon and API client commands (serve, create, ls, exec, ...).
    #[command(flatten)]
    Api(api_cmd::ApiCommand),
    /// Virtual read-only filesystems over document collections.
    Vfs(vfs_cmd::VfsArgs),
    /// Semantic memory stores: Markdown files in git with offline search.
    #[cfg(feature = "memory")]
    Memory(memory_cmd::MemoryArgs),
}

/// Exit code when Sandlot itself fails, as opposed to the command it runs.
pub const EXIT_SANDLOT_ERROR: i32 = 125;

fn main() {
    // The sandbox init helper is exec'd by the runtime with a fixed argv.
    if std::env::args_os().nth(1).is_some_and(|a| a == "__init") {
        sandlot_runtime::init::main(run::agent_main);
    }
    // The daemon's fork server, which forks those helpers (see sandlot_runtime::zygote).
    if std::env::args_os().nth(1).is_some_and(|a| a == "__zygote") {
        sandlot_runtime::zygote::main(run::agent_main);
    }
    // The daemon's server of one collection mount (see sandlot_server::collection_mount).
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == sandlot_server::collection_mount::SERVE_ARG)
    {
        sandlot_server::collection_mount::serve_main();
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                e.exit();
            }
            // One line, like every other error of ours.
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            eprintln!(
                "sandlot: {} (see --help)",
                first.trim_start_matches("error: ")
            );
            std::process::exit(EXIT_SANDLOT_ERROR);
        }
    };
    let res = match cli.cmd {
        Cmd::Run(a) => run::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Api(a) => api_cmd::run(a),
        Cmd::Vfs(a) => vfs_cmd::run(a),
        #[cfg(feature = "memory")]
        Cmd::Memory(a) => memory_cmd::run(a),
    };
    match res {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("sandlot: {e:#}");
            std::process::exit(EXIT_SANDLOT_ERROR);
        }
    }
}
