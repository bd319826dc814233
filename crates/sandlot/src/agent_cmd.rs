//! `sandlot __agent --listen PATH [--lifeline-stdin]`: the guest agent on a Unix
//! socket, as a plain process, for backends whose sandbox starts the agent itself
//! (the fake backend of the daemon's tests, `sandlot_runtime::process_backend`).
//!
//! The agent's process defaults (`sandlot_runtime::plan::AgentSetup`: environment,
//! user, working directory) come as one JSON line on standard input, never on the
//! command line (they may hold secrets). With `--lifeline-stdin`, standard input
//! stays open after that line and its end ends the agent and everything it started.
//!
//! With `--pid1` (PID 1 of a gVisor sandbox), once the agent listens its standard
//! output and error become `/dev/null`: they were `runsc`'s, a file on the host,
//! which a sandbox process could otherwise fill through `/proc/1/fd/2`.

use std::io::BufRead;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;

use sandlot_runtime::plan::AgentSetup;

/// The hidden argument that selects this entry.
pub const AGENT_ARG: &str = "__agent";

/// Runs the agent; never returns.
pub fn main() -> ! {
    let code = match run(std::env::args().skip(2).collect()) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sandlot {AGENT_ARG}: {e}");
            crate::EXIT_SANDLOT_ERROR
        }
    };
    std::process::exit(code)
}

fn run(args: Vec<String>) -> Result<(), String> {
    let mut listen = None;
    let mut lifeline_stdin = false;
    let mut pid1 = false;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--listen" => listen = Some(it.next().ok_or("--listen needs a path")?),
            "--lifeline-stdin" => lifeline_stdin = true,
            "--pid1" => pid1 = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let listen = listen.ok_or("--listen PATH is required")?;
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| format!("read the agent setup from standard input: {e}"))?;
    let setup: AgentSetup = serde_json::from_str(&line)
        .map_err(|e| format!("the agent setup on standard input: {e}"))?;
    let lifeline = if lifeline_stdin {
        Some(take_stdin().map_err(|e| format!("take standard input as the lifeline: {e}"))?)
    } else {
        None
    };
    let _ = std::fs::remove_file(&listen);
    let listener = UnixListener::bind(&listen).map_err(|e| format!("bind {listen}: {e}"))?;
    if pid1 {
        confine_pid1().map_err(|e| format!("--pid1: {e}"))?;
    }
    let cfg = sandlot_agent::AgentConfig {
        env: setup.env,
        default_user: setup.default_user,
        default_cwd: setup.default_cwd,
        lifeline,
        ..Default::default()
    };
    sandlot_agent::run_agent(listener, cfg).map_err(|e| e.to_string())
}

/// Standard output and error on `/dev/null`. (Not made non-dumpable: gVisor's
/// `/proc` does not keep the sandbox's processes from the agent's descriptors for
/// it.)
fn confine_pid1() -> std::io::Result<()> {
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
    rustix::stdio::dup2_stdout(&null)?;
    rustix::stdio::dup2_stderr(&null)?;
    Ok(())
}

/// Moves standard input to a new close-on-exec descriptor and puts `/dev/null` in
/// its place, so that no process the agent starts holds the lifeline open.
fn take_stdin() -> std::io::Result<OwnedFd> {
    let stdin = std::io::stdin();
    let fd = rustix::io::fcntl_dupfd_cloexec(stdin.as_fd(), 3)?;
    let null = std::fs::File::open("/dev/null")?;
    rustix::stdio::dup2_stdin(&null)?;
    Ok(fd)
}

/// `sandlot __port-relay PORT`, run inside a sandbox whose ports the host cannot
/// reach with a socket of its own (gVisor's network stack): connects to PORT on
/// the sandbox's loopback (127.0.0.1, then ::1), writes `+` once connected, and
/// relays standard input to the connection and the connection to standard output
/// until the connection ends. Nothing listening: exit code
/// `sandlot_runtime::PORT_RELAY_REFUSED`, nothing written.
pub fn port_relay_main() -> ! {
    use std::io::{Read, Write};
    use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpStream};
    let port: Option<u16> = std::env::args().nth(2).and_then(|p| p.parse().ok());
    let Some(port) = port.filter(|p| *p > 0) else {
        eprintln!(
            "usage: sandlot {} PORT",
            sandlot_runtime::gvisor::bundle::PORT_RELAY_ARG
        );
        std::process::exit(2);
    };
    let connect = |ip: std::net::IpAddr| TcpStream::connect(SocketAddr::new(ip, port));
    let sock = match connect(Ipv4Addr::LOCALHOST.into()) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            match connect(Ipv6Addr::LOCALHOST.into()) {
                Ok(s) => s,
                Err(_) => std::process::exit(sandlot_runtime::PORT_RELAY_REFUSED),
            }
        }
        Err(e) => {
            eprintln!("connect to port {port}: {e}");
            std::process::exit(4);
        }
    };
    let _ = sock.set_nodelay(true);
    // The relay blocks on its pipes, whatever mode they were handed over in.
    let _ = rustix::io::ioctl_fionbio(std::io::stdin(), false);
    let _ = rustix::io::ioctl_fionbio(std::io::stdout(), false);
    let mut out = std::io::stdout().lock();
    if out.write_all(b"+").and_then(|()| out.flush()).is_err() {
        std::process::exit(4);
    }
    let mut up = match sock.try_clone() {
        Ok(s) => s,
        Err(_) => std::process::exit(4),
    };
    // A plain read and write loop in each direction: `std::io::copy` would
    // splice between the pipe and the socket, which gVisor's kernel (Debian 12's
    // release) answers as end of file while the pipe is empty.
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 64 * 1024];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
                Ok(n) => {
                    if up.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = up.shutdown(Shutdown::Write);
    });
    let mut down = sock;
    let mut buf = [0u8; 64 * 1024];
    loop {
        match down.read(&mut buf) {
            Ok(0) => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("read port {port}: {e}");
                break;
            }
            Ok(n) => {
                if out.write_all(&buf[..n]).and_then(|()| out.flush()).is_err() {
                    break;
                }
            }
        }
    }
    std::process::exit(0)
}
