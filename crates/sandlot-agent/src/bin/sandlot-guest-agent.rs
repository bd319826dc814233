//! Runs the guest agent on a Unix socket: for debugging, tests and benchmarks, and
//! as the init of a future VM guest.
//!
//! `sandlot-guest-agent --listen PATH [--user U] [--cwd DIR] [--env K=V]...
//!  [--retention BYTES] [--lifeline-fd N]`

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::process::ExitCode;

use sandlot_agent::{run_agent, AgentConfig};

fn usage() -> ExitCode {
    eprintln!(
        "usage: sandlot-guest-agent --listen PATH [--user U] [--cwd DIR] [--env K=V]... \
         [--retention BYTES] [--lifeline-fd N]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut cfg = AgentConfig::default();
    let mut listen = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| match args.next() {
            Some(v) => Ok(v),
            None => {
                eprintln!("sandlot-guest-agent: {name} needs a value");
                Err(())
            }
        };
        let r: Result<(), ()> = (|| {
            match a.as_str() {
                "--listen" => listen = Some(val("--listen")?),
                "--user" => cfg.default_user = val("--user")?,
                "--cwd" => cfg.default_cwd = Some(val("--cwd")?),
                "--env" => {
                    let kv = val("--env")?;
                    let Some((k, v)) = kv.split_once('=') else {
                        eprintln!("sandlot-guest-agent: --env {kv:?}: expected K=V");
                        return Err(());
                    };
                    cfg.env.push((k.to_string(), v.to_string()));
                }
                "--retention" => {
                    let v = val("--retention")?;
                    cfg.output_retention = v.parse().map_err(|_| {
                        eprintln!("sandlot-guest-agent: --retention {v:?}: expected bytes");
                    })?;
                }
                "--lifeline-fd" => {
                    let v = val("--lifeline-fd")?;
                    let fd: i32 = v.parse().map_err(|_| {
                        eprintln!("sandlot-guest-agent: --lifeline-fd {v:?}: expected a number");
                    })?;
                    if rustix::io::fcntl_getfd(
                        // SAFETY: only probes whether the number is an open descriptor.
                        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
                    )
                    .is_err()
                    {
                        eprintln!(
                            "sandlot-guest-agent: --lifeline-fd {fd}: not an open descriptor"
                        );
                        return Err(());
                    }
                    // SAFETY: the descriptor was inherited for this purpose and is
                    // owned by nothing else in this process.
                    cfg.lifeline = Some(unsafe { OwnedFd::from_raw_fd(fd) });
                }
                _ => {
                    eprintln!("sandlot-guest-agent: unknown argument {a:?}");
                    return Err(());
                }
            }
            Ok(())
        })();
        if r.is_err() {
            return usage();
        }
    }
    let Some(path) = listen else {
        return usage();
    };
    let _ = std::fs::remove_file(&path);
    let listener = match UnixListener::bind(&path) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("sandlot-guest-agent: binding {path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run_agent(listener, cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandlot-guest-agent: {e}");
            ExitCode::FAILURE
        }
    }
}
