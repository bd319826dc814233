//! A process as seen by the client: one merged, ordered event stream of output
//! chunks and the exit status, plus stdin, signals and terminal resizing.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use sandlot_proto::guest::{stream, ExitStatus, ProcessId, Reply};
use tokio::io::AsyncWrite;

use super::{unexpected, Channel, ClientError, Event, GuestClient, InputSink, OUTPUT_WINDOW};

/// One item of a process's event stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessEvent {
    /// Bytes from stdout (or from the terminal, for a pty process).
    Stdout(Bytes),
    Stderr(Bytes),
    /// The process ended. Everything it wrote before ending came before this event;
    /// descendants that still hold its output may add more after it.
    Exit(ExitStatus),
}

/// Collected output of a process, up to its exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Sees each event [`Process::next_event`] returns, with the offsets of the next
/// stdout and stderr bytes after it (see [`Process::observe`]).
pub type EventObserver = Box<dyn FnMut(&ProcessEvent, (u64, u64)) + Send + Sync>;

/// A started or attached process.
///
/// Events come in the order the agent produced them; output is flow-controlled:
/// the agent sends more only as [`Process::next_event`] consumes it, so a process
/// whose output is not read blocks once the buffers (about 1.3 MiB per stream) fill.
/// Dropping a `Process` detaches from it; the process keeps running and can be
/// re-attached with [`GuestClient::attach`].
pub struct Process {
    client: GuestClient,
    id: ProcessId,
    pid: i32,
    pty: bool,
    chan: Option<Channel>,
    stdin: Option<ProcessStdin>,
    /// Next byte offset of stdout and stderr.
    offsets: [u64; 2],
    consumed: [u32; 2],
    status: Option<ExitStatus>,
    detached: bool,
    observer: Option<EventObserver>,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process")
            .field("id", &self.id)
            .field("pid", &self.pid)
            .field("pty", &self.pty)
            .field("status", &self.status)
            .finish()
    }
}

impl Process {
    pub(crate) fn streaming(
        client: GuestClient,
        chan: Channel,
        id: ProcessId,
        pid: i32,
        pty: bool,
        stdin: Option<InputSink>,
        offsets: [u64; 2],
    ) -> Process {
        Process {
            client,
            id,
            pid,
            pty,
            chan: Some(chan),
            stdin: stdin.map(|sink| ProcessStdin { sink }),
            offsets,
            consumed: [0; 2],
            status: None,
            detached: false,
            observer: None,
        }
    }

    pub(crate) fn detached(client: GuestClient, id: ProcessId, pid: i32, pty: bool) -> Process {
        Process {
            client,
            id,
            pid,
            pty,
            chan: None,
            stdin: None,
            offsets: [0; 2],
            consumed: [0; 2],
            status: None,
            detached: true,
            observer: None,
        }
    }

    /// The agent's id of the process (for attach, signal, listings).
    pub fn id(&self) -> ProcessId {
        self.id
    }

    /// Its pid inside the sandbox's pid namespace (also its process group and
    /// session id). The host-side pid is known to the runtime, not the agent.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// It runs on a pseudo-terminal.
    pub fn is_pty(&self) -> bool {
        self.pty
    }

    /// Offsets of the next stdout and stderr bytes this handle will deliver (the
    /// values to re-attach from after a disconnection).
    pub fn offsets(&self) -> (u64, u64) {
        (self.offsets[0], self.offsets[1])
    }

    /// The exit status, once [`Process::next_event`] has delivered it.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.status
    }

    /// Takes the stdin writer (present if the exec asked for `stdin` or a pty, or the
    /// attached process still has stdin open). Dropping it closes stdin.
    pub fn take_stdin(&mut self) -> Option<ProcessStdin> {
        self.stdin.take()
    }

    /// Writes to stdin, waiting for flow-control credit.
    pub async fn write_stdin(&mut self, data: &[u8]) -> Result<(), ClientError> {
        match &mut self.stdin {
            Some(s) => s.write(data).await,
            None => Err(ClientError::Io(io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!("process {}: stdin is not open on this handle", self.id),
            ))),
        }
    }

    /// Closes stdin (for a terminal: sends the EOF character, ^D).
    pub fn close_stdin(&mut self) {
        if let Some(mut s) = self.stdin.take() {
            s.close();
        }
    }

    /// Has `f` see every event [`Process::next_event`] returns from now on (and the
    /// offsets after it), whoever consumes them; it replaces an earlier observer.
    pub fn observe(&mut self, f: EventObserver) {
        self.observer = Some(f);
    }

    /// The next output chunk or the exit status; `Ok(None)` once the stream is over
    /// (the process exited and its output is closed).
    pub async fn next_event(&mut self) -> Result<Option<ProcessEvent>, ClientError> {
        let ev = self.receive().await?;
        if let (Some(ev), Some(f)) = (&ev, self.observer.as_mut()) {
            f(ev, (self.offsets[0], self.offsets[1]));
        }
        Ok(ev)
    }

    async fn receive(&mut self) -> Result<Option<ProcessEvent>, ClientError> {
        if self.detached {
            return Err(ClientError::Detached(self.id));
        }
        let Some(ch) = &mut self.chan else {
            return Ok(None);
        };
        loop {
            match ch.recv().await? {
                Event::Data(s, b) => {
                    let i = (s - 1) as usize;
                    // The first offset came from the agent (an attach's reply).
                    self.offsets[i] =
                        self.offsets[i].checked_add(b.len() as u64).ok_or_else(|| {
                            ClientError::Protocol(format!(
                                "process {}: stream {s} runs past offset {}",
                                self.id,
                                u64::MAX
                            ))
                        })?;
                    self.consumed[i] += b.len() as u32;
                    if self.consumed[i] >= OUTPUT_WINDOW / 4 {
                        ch.grant(s, self.consumed[i]);
                        self.consumed[i] = 0;
                    }
                    return Ok(Some(if s == stream::OUTPUT {
                        ProcessEvent::Stdout(b)
                    } else {
                        ProcessEvent::Stderr(b)
                    }));
                }
                Event::Reply(Reply::Exit { status, .. }) => {
                    self.status = Some(status);
                    return Ok(Some(ProcessEvent::Exit(status)));
                }
                Event::Reply(Reply::Error(e)) => {
                    return Err(ClientError::remote("process", e));
                }
                Event::Reply(other) => return Err(unexpected("process", &other)),
                Event::Eof => continue,
                Event::End => {
                    self.chan = None;
                    return Ok(None);
                }
            }
        }
    }

    /// Waits for the exit status, discarding output.
    pub async fn wait(&mut self) -> Result<ExitStatus, ClientError> {
        if let Some(s) = self.status {
            return Ok(s);
        }
        loop {
            match self.next_event().await? {
                Some(ProcessEvent::Exit(s)) => return Ok(s),
                Some(_) => {}
                None => {
                    return Err(ClientError::Protocol(format!(
                        "process {}: stream ended without an exit status",
                        self.id
                    )))
                }
            }
        }
    }

    /// Collects stdout and stderr up to the exit status.
    pub async fn output(mut self) -> Result<Output, ClientError> {
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        loop {
            match self.next_event().await? {
                Some(ProcessEvent::Stdout(b)) => stdout.extend_from_slice(&b),
                Some(ProcessEvent::Stderr(b)) => stderr.extend_from_slice(&b),
                Some(ProcessEvent::Exit(status)) => {
                    return Ok(Output {
                        status,
                        stdout,
                        stderr,
                    })
                }
                None => {
                    return Err(ClientError::Protocol(format!(
                        "process {}: stream ended without an exit status",
                        self.id
                    )))
                }
            }
        }
    }

    /// Sends `sig` to the process group.
    pub async fn signal(&self, sig: i32) -> Result<(), ClientError> {
        self.client.signal(self.id, sig).await
    }

    /// Changes the terminal size (pty processes only).
    pub async fn resize(&self, rows: u16, cols: u16) -> Result<(), ClientError> {
        self.client.resize(self.id, rows, cols).await
    }
}

/// Writes a process's stdin. Implements [`AsyncWrite`]; shutting it down or
/// dropping it closes stdin.
pub struct ProcessStdin {
    sink: InputSink,
}

impl std::fmt::Debug for ProcessStdin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessStdin").finish_non_exhaustive()
    }
}

impl ProcessStdin {
    /// Writes all of `data`, waiting for flow-control credit.
    pub async fn write(&mut self, data: &[u8]) -> Result<(), ClientError> {
        self.sink.write_all(data).await.map_err(ClientError::Io)
    }

    /// Closes stdin.
    pub fn close(&mut self) {
        self.sink.close();
    }
}

impl AsyncWrite for ProcessStdin {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().sink.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().sink.close();
        Poll::Ready(Ok(()))
    }
}
