//! The interactive half of `sandlot run`: stream a command's I/O between the local
//! terminal (or pipes) and the guest agent, forward signals, enforce the lifetime.

use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use sandlot_guest::client::{ClientError, GuestClient, ProcessEvent};
use sandlot_guest::proto::{AttachRequest, ErrorCode, ExecRequest, ProcessId, PtySize};
use tokio::io::AsyncWriteExt;
use tokio::signal::unix::{signal, SignalKind};

use crate::run::{exit_code, RunArgs};

/// Exit code of a lifetime kill: the command died of SIGKILL.
const EXIT_KILLED: i32 = 128 + 9;

/// Puts a terminal in raw mode and restores it when dropped.
struct RawMode {
    saved: rustix::termios::Termios,
}

impl RawMode {
    fn enter() -> Option<RawMode> {
        let fd = std::io::stdin();
        let saved = rustix::termios::tcgetattr(fd.as_fd()).ok()?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(fd.as_fd(), rustix::termios::OptionalActions::Now, &raw).ok()?;
        Some(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin().as_fd(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}

fn local_window() -> Option<PtySize> {
    for fd in [std::io::stdin().as_fd(), std::io::stdout().as_fd()] {
        if let Ok(ws) = rustix::termios::tcgetwinsize(fd) {
            if ws.ws_row > 0 && ws.ws_col > 0 {
                return Some(PtySize {
                    rows: ws.ws_row,
                    cols: ws.ws_col,
                });
            }
        }
    }
    None
}

/// Maps a failure to start the command to the shell's conventions: 127 when the
/// program does not exist, 126 when it cannot be run.
fn spawn_failure(e: &ClientError) -> Option<i32> {
    match e {
        ClientError::Remote {
            code: ErrorCode::NotFound,
            ..
        } => Some(127),
        ClientError::Remote {
            code: ErrorCode::PermissionDenied | ErrorCode::SpawnFailed | ErrorCode::InvalidUser,
            ..
        } => Some(126),
        _ => None,
    }
}

/// The request that starts the command of `a`: with its input, and a terminal of
/// the local window's size for `-t`.
pub fn command_request(a: &RunArgs) -> ExecRequest {
    let mut req = ExecRequest::new(a.command.clone());
    req.stdin = true;
    if a.tty {
        req.pty = Some(local_window().unwrap_or_default());
    }
    req
}

/// How the session gets to its command.
pub enum Start {
    /// Starts it now.
    Exec(ExecRequest),
    /// The agent started it as it started ([`sandlot_proto::guest::FIRST_PROCESS`]):
    /// attach from its first byte.
    Attach(ProcessId),
}

/// Runs the command of `a` in the sandbox whose agent listens on `socket`: starts
/// it or attaches to it (`start`), streams its input and output, forwards signals
/// and window changes, and ends it at `lifetime`.
pub async fn session(
    socket: &Path,
    a: &RunArgs,
    start: Start,
    lifetime: Option<Duration>,
    tr: &crate::run::RunTrace,
) -> anyhow::Result<i32> {
    let client = GuestClient::connect(socket)
        .await
        .context("connect to the sandbox agent")?;
    tr.mark("agent connected");
    let started = match start {
        Start::Exec(req) => client.exec(req).await,
        Start::Attach(id) => {
            client
                .attach_with(AttachRequest {
                    id,
                    stdout_from: Some(0),
                    stderr_from: Some(0),
                })
                .await
        }
    };
    let mut proc = match started {
        Ok(p) => p,
        Err(e) => {
            if let Some(code) = spawn_failure(&e) {
                eprintln!("sandlot: {e}");
                return Ok(code);
            }
            return Err(e).context("start the command");
        }
    };
    let id = proc.id();
    tr.mark("command started");
    let _raw = if a.tty { RawMode::enter() } else { None };

    // stdin -> process; tokio reads stdin on a blocking thread, which the caller's
    // runtime abandons at exit.
    let mut sink = proc.take_stdin();
    let stdin_task = tokio::spawn(async move {
        if let Some(s) = sink.as_mut() {
            let mut input = tokio::io::stdin();
            let _ = tokio::io::copy(&mut input, s).await;
            s.close();
        }
    });

    let mut sigs = Vec::new();
    for (kind, num) in [
        (SignalKind::interrupt(), libc_sig::SIGINT),
        (SignalKind::terminate(), libc_sig::SIGTERM),
        (SignalKind::hangup(), libc_sig::SIGHUP),
        (SignalKind::quit(), libc_sig::SIGQUIT),
    ] {
        sigs.push((signal(kind).context("install signal handler")?, num));
    }
    let (sig_tx, mut sig_rx) = tokio::sync::mpsc::channel::<i32>(8);
    for (mut s, num) in sigs {
        let tx = sig_tx.clone();
        tokio::spawn(async move {
            while s.recv().await.is_some() {
                if tx.send(num).await.is_err() {
                    break;
                }
            }
        });
    }
    let mut winch = signal(SignalKind::window_change()).context("install SIGWINCH handler")?;
    let deadline = async {
        match lifetime {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);

    let mut out = tokio::io::stdout();
    let mut err = tokio::io::stderr();
    let mut status = None;
    loop {
        tokio::select! {
            ev = proc.next_event() => match ev.context("stream the command's output")? {
                Some(ProcessEvent::Stdout(b)) => {
                    if out.write_all(&b).await.is_err() || out.flush().await.is_err() {
                        // Our reader went away (e.g. `| head`): behave like SIGPIPE.
                        stdin_task.abort();
                        return Ok(128 + libc_sig::SIGPIPE);
                    }
                }
                Some(ProcessEvent::Stderr(b)) => {
                    let _ = err.write_all(&b).await;
                    let _ = err.flush().await;
                }
                Some(ProcessEvent::Exit(st)) => {
                    tr.mark("command exited");
                    status = Some(st)
                }
                None => break,
            },
            Some(sig) = sig_rx.recv() => {
                let _ = client.signal(id, sig).await;
            }
            _ = winch.recv(), if a.tty => {
                if let Some(ws) = local_window() {
                    let _ = client.resize(id, ws.rows, ws.cols).await;
                }
            }
            _ = &mut deadline => {
                stdin_task.abort();
                drop(_raw);
                eprintln!(
                    "sandlot: sandbox lifetime of {} exceeded; everything in it was killed",
                    a.spec_flags.timeout.map(|t| t.to_string()).unwrap_or_default()
                );
                return Ok(EXIT_KILLED);
            }
        }
    }
    stdin_task.abort();
    let st = match status {
        Some(s) => s,
        None => proc.wait().await.context("wait for the command")?,
    };
    Ok(exit_code(st.code, st.signal))
}

/// One `/bin/true` through the agent; returns its exit code (benchmarks).
pub async fn exec_true(socket: &Path) -> anyhow::Result<i32> {
    let client = GuestClient::connect(socket)
        .await
        .context("connect to the sandbox agent")?;
    let out = client
        .exec(ExecRequest::new(["/bin/true"]))
        .await?
        .output()
        .await?;
    Ok(exit_code(out.status.code, out.status.signal))
}

/// Signal numbers (Linux, all architectures Sandlot supports).
mod libc_sig {
    pub const SIGHUP: i32 = 1;
    pub const SIGINT: i32 = 2;
    pub const SIGQUIT: i32 = 3;
    pub const SIGPIPE: i32 = 13;
    pub const SIGTERM: i32 = 15;
}
