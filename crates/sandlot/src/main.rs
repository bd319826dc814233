//! The `sandlot` binary: the CLI, the daemon (`sandlot serve`, from
//! `sandlot-server`), the benchmark harness (`sandlot bench`) and the hidden entries
//! the runtime and the daemon start it as (`__init`, `__zygote`, `__vfs-serve`).
//!
//! Exit codes: the command's own for `run`; 125 when Sandlot itself fails (bad input,
//! runtime error); 126/127 when the command cannot be started / is not found.

#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};

mod agent_cmd;
mod api_cmd;
mod bench;
mod mcp_cmd;
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
    /// Serve the MCP tools (sandboxes, files, code, collections, memory) on stdio.
    Mcp(mcp_cmd::McpArgs),
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
    // The launcher of a gVisor sandbox (see sandlot_runtime::gvisor::launch).
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == sandlot_runtime::gvisor::launch::LAUNCH_ARG)
    {
        sandlot_runtime::gvisor::launch::main();
    }
    // A port relay inside a gVisor sandbox (see agent_cmd).
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == sandlot_runtime::gvisor::bundle::PORT_RELAY_ARG)
    {
        agent_cmd::port_relay_main();
    }
    // The guest agent as a plain process (see agent_cmd).
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == agent_cmd::AGENT_ARG)
    {
        agent_cmd::main();
    }
    // The confined server of one collection mount in a sandbox (sandlot_vfs::mount_helper).
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == sandlot_vfs::mount_helper::SERVE_ARG)
    {
        sandlot_vfs::mount_helper::serve_main();
    }
    // `sandlot run` first, parsed against its own arguments alone.
    if let Some(a) = parse_run_alone(std::env::args_os()) {
        match run::run(a) {
            Ok(code) => std::process::exit(code),
            Err(e) => {
                eprintln!("sandlot: {e:#}");
                std::process::exit(EXIT_SANDLOT_ERROR);
            }
        }
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
            // One line, like every other error of ours; 125 as well, because `run`,
            // `exec` and `shell` pass the command's own codes (2 included) through.
            eprintln!(
                "sandlot: {} (see --help)",
                usage_error_line(&e.render().to_string())
            );
            std::process::exit(EXIT_SANDLOT_ERROR);
        }
    };
    let res = match cli.cmd {
        Cmd::Run(a) => run::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Api(a) => api_cmd::run(a),
        Cmd::Vfs(a) => vfs_cmd::run(a),
        Cmd::Mcp(a) => mcp_cmd::run(a),
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

/// `sandlot run ARGS` parsed against the `run` subcommand alone: building the whole
/// command tree (every API, `vfs`, `memory` and `bench` command) costs the CLI's
/// start about 0.35 ms of CPU and 180 page faults that `run` never uses. `None` for
/// anything else, and for what this parse does not take (`--help`, a usage error):
/// the full parse then answers it as usual.
fn parse_run_alone(args: impl IntoIterator<Item = std::ffi::OsString>) -> Option<run::RunArgs> {
    let mut args = args.into_iter().skip(1).peekable();
    if args.peek()? != "run" {
        return None;
    }
    let cmd = <run::RunArgs as clap::Args>::augment_args(clap::Command::new("run"));
    let matches = cmd.try_get_matches_from(args).ok()?;
    <run::RunArgs as clap::FromArgMatches>::from_arg_matches(&matches).ok()
}

/// clap's usage error as one line: its first paragraph, with the list lines that
/// follow a colon (the missing arguments) joined after it, and its tips (a similar
/// subcommand or flag for a typo: "did you mean").
fn usage_error_line(rendered: &str) -> String {
    let mut lines = rendered
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim);
    let first = lines
        .next()
        .unwrap_or("invalid arguments")
        .trim_start_matches("error: ");
    let rest: Vec<&str> = lines.collect();
    let mut line = if rest.is_empty() {
        first.to_string()
    } else {
        format!("{} {}", first, rest.join(", "))
    };
    for tip in rendered
        .lines()
        .filter_map(|l| l.trim().strip_prefix("tip: "))
    {
        line.push_str("; ");
        line.push_str(tip);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn usage_error(args: &[&str]) -> String {
        let e = Cli::try_parse_from(args).expect_err("a usage error");
        usage_error_line(&e.render().to_string())
    }

    #[test]
    fn usage_errors_name_the_missing_arguments_on_one_line() {
        let msg = usage_error(&["sandlot", "exec"]);
        assert_eq!(
            msg,
            "the following required arguments were not provided: <SANDBOX>, <CMD>..."
        );
        let msg = usage_error(&["sandlot", "exec", "sb-1", "--bogus"]);
        assert!(
            msg.starts_with("unexpected argument '--bogus' found"),
            "{msg}"
        );
        assert!(!msg.contains('\n'), "{msg}");
        let msg = usage_error(&["sandlot", "run", "--memory"]);
        assert!(msg.contains("'--memory <MEMORY>'"), "{msg}");
        // A negative number is the flag's value, and its parser says what is wrong
        // (it was "unexpected argument '-1' found").
        let msg = usage_error(&["sandlot", "run", "--timeout", "-1", "--", "true"]);
        assert!(msg.contains("'--timeout <TIMEOUT>'"), "{msg}");
        assert!(msg.contains("\"-1\" is not a duration"), "{msg}");
        let msg = usage_error(&["sandlot", "create", "--memory", "-5"]);
        assert!(msg.contains("\"-5\" is not a size"), "{msg}");
    }

    /// The `run` subcommand alone parses what the whole CLI parses, and leaves
    /// help and usage errors to it.
    #[test]
    fn run_alone_parses_what_the_full_cli_parses() {
        let os = |v: &[&str]| v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        for argv in [
            &["sandlot", "run", "--image", "host", "--", "/bin/true"][..],
            &[
                "sandlot", "run", "-t", "--memory", "256M", "sh", "-c", "ls -l",
            ],
            &[
                "sandlot",
                "run",
                "--env",
                "A=1",
                "--id",
                "x1",
                "--timeout",
                "5s",
                "true",
            ],
            &["sandlot", "run", "--", "printf", "--", "-x"],
        ] {
            let alone = parse_run_alone(os(argv)).unwrap_or_else(|| panic!("{argv:?}"));
            let Cmd::Run(full) = Cli::try_parse_from(argv).unwrap().cmd else {
                panic!("{argv:?}: not run");
            };
            assert_eq!(format!("{alone:?}"), format!("{full:?}"), "{argv:?}");
        }
        for argv in [
            &["sandlot", "run", "--help"][..],
            &["sandlot", "run"],
            &["sandlot", "run", "--memory"],
            &["sandlot", "run", "--version"],
            &["sandlot", "exec", "sb-1", "true"],
            &["sandlot"],
        ] {
            assert!(parse_run_alone(os(argv)).is_none(), "{argv:?}");
        }
    }

    /// Errors and docs tell operators to use `serve --id-prefix`: `--help` shows it.
    #[test]
    fn serve_help_shows_the_id_prefix() {
        let mut cmd = <Cli as clap::CommandFactory>::command();
        let serve = cmd.find_subcommand_mut("serve").expect("serve");
        let help = serve.render_help().to_string();
        assert!(help.contains("--id-prefix <PREFIX>"), "{help}");
    }

    /// A typo of a subcommand or a flag names what was probably meant.
    #[test]
    fn typos_get_a_did_you_mean() {
        let msg = usage_error(&["sandlot", "craete"]);
        assert!(msg.starts_with("unrecognized subcommand 'craete'"), "{msg}");
        assert!(
            msg.contains("similar subcommand") && msg.contains("'create'"),
            "{msg}"
        );
        let msg = usage_error(&["sandlot", "create", "--memroy", "1G"]);
        assert!(
            msg.contains("similar argument") && msg.contains("'--memory'"),
            "{msg}"
        );
        let msg = usage_error(&["sandlot", "image", "inpsect"]);
        assert!(msg.contains("'inspect'"), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
    }

    /// The shipped systemd unit runs a command line this binary takes, and the
    /// example operator config it names parses without a warning and validates.
    #[test]
    fn the_packaged_unit_and_example_config_are_what_the_daemon_takes() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging");
        let unit = std::fs::read_to_string(root.join("sandlot.service")).unwrap();
        let exec = unit
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .expect("an ExecStart line");
        let mut argv: Vec<&str> = exec.split_whitespace().collect();
        assert_eq!(argv[0], "/usr/local/bin/sandlot", "{exec}");
        argv[0] = "sandlot";
        let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{exec}: {e}"));
        let Cmd::Api(api_cmd::ApiCommand::Serve(serve)) = cli.cmd else {
            panic!("{exec}: not `sandlot serve`");
        };
        assert_eq!(
            serve.config.as_deref(),
            Some(std::path::Path::new("/etc/sandlot/sandlot.toml"))
        );
        let path = root.join("sandlot.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let (cfg, warnings) =
            sandlot_server::ServerConfig::from_toml(&text, &path).unwrap_or_else(|e| panic!("{e}"));
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(cfg.log_format, sandlot_server::config::LogFormat::Json);
        assert_eq!(cfg.listen, Some("127.0.0.1:7070".parse().unwrap()));
    }
}
