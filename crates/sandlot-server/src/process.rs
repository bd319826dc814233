//! Processes started through the API. Each has a supervisor task that holds the
//! agent's exec channel and hands the output, with back-pressure, to the first
//! reader from offset 0:
//!
//! * parked (default): output is read ahead into a small buffer; beyond it the
//!   process blocks, as on a pipe, until a reader arrives or `exec_grace` passes;
//! * streaming: events go to that reader through a bounded channel;
//! * released (`background`, after the grace, or when the reader went away): the
//!   supervisor lets go of its channel, so the agent never blocks the process and
//!   keeps its most recent output, and its exit status, for re-attach from any
//!   offset (readers then use their own agent channels). The exit status is then
//!   learnt by the sandbox's exit poller ([`poll_exits`]). A process whose stdin is
//!   still open keeps its channel (stdin lives on it) and is drained instead.
//!
//! Once the exit has been delivered through an agent channel (the supervisor's, or
//! a reader's own: [`keep_output_of`]) the agent forgets the process; the daemon
//! then keeps its most recent output ([`TAIL_BUDGET`]) with the entry for the
//! retention window, for readers that come back ([`ProcEntry::replay_kept`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use sandlot_guest::client::{Process, ProcessEvent, ProcessStdin};
use sandlot_proto::api::{ProcessExit, ProcessView};
use tokio::sync::{mpsc, oneshot, watch, Mutex as AsyncMutex};
use tokio::time::Instant;

use crate::sandbox::Counters;
use crate::timefmt::rfc3339;

/// Bytes of output a parked supervisor reads ahead.
const PARK_BUDGET: usize = 256 * 1024;
/// Finished processes remembered per sandbox (at least; see [`PRUNE_SLACK`]).
const MAX_FINISHED: usize = 1000;
/// Inserts between two scans for finished processes to forget.
const PRUNE_SLACK: usize = 64;
/// Bytes of the most recent output kept, so that a reader can re-attach at any
/// offset inside them after the exit was delivered (the agent forgets a process
/// once its exit is delivered).
const TAIL_BUDGET: usize = 256 * 1024;
/// Tells the output kept of a process by one channel from that of another.
static KEEP_SERIAL: AtomicU64 = AtomicU64::new(0);

/// One item of a process's output as the API streams it.
#[derive(Debug, Clone)]
pub enum OutEvent {
    Stdout(u64, Bytes),
    Stderr(u64, Bytes),
    Exit(ProcessExit),
}

enum SupCmd {
    /// Stream from offset 0: accepted when nothing was dropped yet and nobody else
    /// streams. The supervisor makes the channel (room for `capacity` events more
    /// than it parked), fills it with the parked events and hands it over.
    Subscribe {
        capacity: usize,
        reply: oneshot::Sender<Option<mpsc::Receiver<OutEvent>>>,
    },
}

/// Output of a finished process kept after its exit was delivered.
struct Kept {
    tail: Tail,
    serial: u64,
}

/// What the daemon knows of a process.
pub struct ProcEntry {
    pub id: u64,
    pub pid: i32,
    pub argv: Vec<String>,
    pub tag: Option<String>,
    pub pty: bool,
    pub background: bool,
    pub started_at_ms: i64,
    pub stdin: AsyncMutex<Option<ProcessStdin>>,
    stdin_open: AtomicBool,
    exit: watch::Receiver<Option<ProcessExit>>,
    exit_tx: watch::Sender<Option<ProcessExit>>,
    /// No supervisor channel: the exit poller watches it.
    released: AtomicBool,
    cmd: mpsc::Sender<SupCmd>,
    /// How long output is kept after the exit was delivered.
    retention: Duration,
    kept: Mutex<Option<Kept>>,
}

impl ProcEntry {
    pub fn exit(&self) -> Option<ProcessExit> {
        *self.exit.borrow()
    }

    /// Waits for the exit status (None if the supervisor ended without one, e.g. the
    /// sandbox went away).
    pub async fn wait(&self) -> Option<ProcessExit> {
        let mut rx = self.exit.clone();
        let r = rx.wait_for(|e| e.is_some()).await.map(|v| *v);
        match r {
            Ok(v) => v,
            Err(_) => *rx.borrow(),
        }
    }

    pub fn view(&self) -> ProcessView {
        let exit = self.exit();
        ProcessView {
            id: self.id,
            pid: self.pid,
            argv: self.argv.clone(),
            tag: self.tag.clone(),
            pty: self.pty,
            stdin: self.stdin_open.load(Ordering::Relaxed) && exit.is_none(),
            background: self.background,
            started_at: rfc3339(self.started_at_ms),
            state: if exit.is_some() { "exited" } else { "running" }.to_string(),
            exit,
        }
    }

    /// Records the exit status (the first one wins).
    pub fn set_exit(&self, x: ProcessExit) {
        self.exit_tx.send_if_modified(|e| {
            if e.is_none() {
                *e = Some(x);
                true
            } else {
                false
            }
        });
    }

    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::Relaxed)
    }

    pub fn mark_stdin_closed(&self) {
        self.stdin_open.store(false, Ordering::Relaxed);
    }

    /// Subscribes from offset 0 if the supervisor still has all output.
    pub async fn subscribe_from_start(&self, capacity: usize) -> Option<mpsc::Receiver<OutEvent>> {
        let (reply, rx) = oneshot::channel();
        if self
            .cmd
            .send(SupCmd::Subscribe { capacity, reply })
            .await
            .is_err()
        {
            // A process that ended before its first reader came: its supervisor
            // has gone, keeping the output (from offset 0, nobody having read it)
            // and the exit.
            return self.replay_kept((0, 0), capacity).map(|(_, rx)| rx);
        }
        rx.await.ok()?
    }

    /// After the exit was delivered: the output kept from the given offsets, then
    /// the exit, and where each stream actually starts; `None` when nothing is kept
    /// (any more) or output before the offsets has been dropped.
    pub fn replay_kept(
        &self,
        from: (u64, u64),
        capacity: usize,
    ) -> Option<((u64, u64), mpsc::Receiver<OutEvent>)> {
        let exit = self.exit()?;
        let (at, events) = {
            let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            let tail = &kept.as_ref()?.tail;
            let at = (from.0.min(tail.end.0), from.1.min(tail.end.1));
            (at, tail.from(from)?)
        };
        let (tx, rx) = mpsc::channel(capacity.max(1));
        replay(events, Some(exit), tx);
        Some((at, rx))
    }

    /// Keeps `tail`, the latest output of a process whose exit was just delivered,
    /// for the retention window, unless what is kept already reaches as far back.
    /// Returns its serial when kept (see [`ProcEntry::keep_more`]).
    fn keep(self: &Arc<Self>, tail: Tail) -> Option<u64> {
        let serial = KEEP_SERIAL.fetch_add(1, Ordering::Relaxed);
        {
            let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(k) = kept.as_ref() {
                if k.tail.start.0 <= tail.start.0 && k.tail.start.1 <= tail.start.1 {
                    return None;
                }
            }
            *kept = Some(Kept { tail, serial });
        }
        // Forgotten after the window (or with the entry, whichever comes first).
        let entry = Arc::downgrade(self);
        let retention = self.retention;
        tokio::spawn(async move {
            tokio::time::sleep(retention).await;
            if let Some(e) = entry.upgrade() {
                let mut kept = e.kept.lock().unwrap_or_else(|e| e.into_inner());
                if kept.as_ref().is_some_and(|k| k.serial == serial) {
                    *kept = None;
                }
            }
        });
        Some(serial)
    }

    /// Output that descendants wrote after the exit, seen by the channel whose
    /// output is kept under `serial`.
    fn keep_more(&self, serial: u64, ev: &OutEvent) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = kept.as_mut().filter(|k| k.serial == serial) {
            k.tail.push(ev);
        }
    }
}

/// Makes a reader's own agent channel to a process of this daemon record what it
/// streams (the latest [`TAIL_BUDGET`] bytes): when the exit reaches it, the agent
/// forgets the process, so the daemon keeps that output (as the supervisor does for
/// its channel; of two, the one reaching further back is kept).
pub fn keep_output_of(p: &mut Process, entry: &Arc<ProcEntry>) {
    let weak = Arc::downgrade(entry);
    let mut tail = Tail::starting_at(p.offsets());
    // After the exit: the serial of the output kept, if this channel's was.
    let mut after_exit: Option<Option<u64>> = None;
    p.observe(Box::new(move |ev, (so, se)| {
        let Some(entry) = weak.upgrade() else {
            return;
        };
        let out = match out_event(ev.clone(), (so, se)) {
            OutEvent::Exit(x) => {
                entry.set_exit(x);
                after_exit = Some(entry.keep(std::mem::take(&mut tail)));
                return;
            }
            out => out,
        };
        match after_exit {
            None => tail.push(&out),
            Some(Some(serial)) => entry.keep_more(serial, &out),
            Some(None) => {}
        }
    }));
}

/// The most recent output of a process, bounded by [`TAIL_BUDGET`].
#[derive(Default, Clone)]
struct Tail {
    events: VecDeque<OutEvent>,
    bytes: usize,
    /// Per stream, the first offset still held.
    start: (u64, u64),
    /// Per stream, the offset after the last byte held.
    end: (u64, u64),
}

impl Tail {
    /// An empty tail of output that continues at these offsets.
    fn starting_at(at: (u64, u64)) -> Tail {
        Tail {
            start: at,
            end: at,
            ..Tail::default()
        }
    }

    fn push(&mut self, ev: &OutEvent) {
        match ev {
            OutEvent::Exit(_) => return,
            OutEvent::Stdout(o, b) => self.end.0 = self.end.0.max(o + b.len() as u64),
            OutEvent::Stderr(o, b) => self.end.1 = self.end.1.max(o + b.len() as u64),
        }
        self.bytes += ev_len(ev);
        self.events.push_back(ev.clone());
        // Exactly the last TAIL_BUDGET bytes: the oldest chunk kept may be cut.
        while self.bytes > TAIL_BUDGET {
            let excess = self.bytes - TAIL_BUDGET;
            let (o, b, start) = match self.events.front_mut() {
                Some(OutEvent::Stdout(o, b)) => (o, b, &mut self.start.0),
                Some(OutEvent::Stderr(o, b)) => (o, b, &mut self.start.1),
                _ => break,
            };
            if b.len() > excess {
                *b = b.slice(excess..);
                *o += excess as u64;
                *start = *o;
                self.bytes -= excess;
            } else {
                *start = *o + b.len() as u64;
                self.bytes -= b.len();
                self.events.pop_front();
            }
        }
    }

    /// The held events from `from` on (the first chunk of each stream cut at the
    /// offset), or `None` when output before `from` has been dropped already.
    fn from(&self, from: (u64, u64)) -> Option<Vec<OutEvent>> {
        if from.0 < self.start.0 || from.1 < self.start.1 {
            return None;
        }
        let cut = |off: u64, b: &Bytes, at: u64| -> Option<(u64, Bytes)> {
            let end = off + b.len() as u64;
            if end <= at {
                None
            } else if off >= at {
                Some((off, b.clone()))
            } else {
                Some((at, b.slice((at - off) as usize..)))
            }
        };
        Some(
            self.events
                .iter()
                .filter_map(|ev| match ev {
                    OutEvent::Stdout(o, b) => {
                        cut(*o, b, from.0).map(|(o, b)| OutEvent::Stdout(o, b))
                    }
                    OutEvent::Stderr(o, b) => {
                        cut(*o, b, from.1).map(|(o, b)| OutEvent::Stderr(o, b))
                    }
                    OutEvent::Exit(_) => None,
                })
                .collect(),
        )
    }
}

/// The processes of one sandbox.
#[derive(Default)]
pub struct ProcTable {
    procs: BTreeMap<u64, Arc<ProcEntry>>,
    /// The table size at which the next prune runs (see [`ProcTable::insert`]).
    prune_at: usize,
    /// Scans for finished processes so far.
    scans: u64,
}

impl ProcTable {
    pub fn get(&self, id: u64) -> Option<Arc<ProcEntry>> {
        self.procs.get(&id).cloned()
    }

    pub fn all(&self) -> Vec<Arc<ProcEntry>> {
        self.procs.values().cloned().collect()
    }

    /// Adds a process. Finished processes beyond [`MAX_FINISHED`] are forgotten,
    /// oldest first; the scan that finds them runs once per [`PRUNE_SLACK`] inserts
    /// (not on every exec: with a thousand finished entries it cost about 0.1 ms of
    /// daemon CPU per exec), so up to `MAX_FINISHED + PRUNE_SLACK` may be held.
    fn insert(&mut self, e: Arc<ProcEntry>) {
        self.procs.insert(e.id, e);
        if self.procs.len() < self.prune_at.max(MAX_FINISHED + PRUNE_SLACK) {
            return;
        }
        self.scans += 1;
        let finished: Vec<u64> = self
            .procs
            .values()
            .filter(|p| p.exit().is_some())
            .map(|p| p.id)
            .collect();
        if finished.len() > MAX_FINISHED {
            for id in &finished[..finished.len() - MAX_FINISHED] {
                self.procs.remove(id);
            }
        }
        self.prune_at = self.procs.len() + PRUNE_SLACK;
    }
}

/// Settings of supervisors.
#[derive(Debug, Clone, Copy)]
pub struct SupervisorSettings {
    pub grace: Duration,
    pub retention: Duration,
}

/// Registers a freshly started process and spawns its supervisor.
#[allow(clippy::too_many_arguments)]
pub fn supervise(
    table: &std::sync::Mutex<ProcTable>,
    mut p: Process,
    argv: Vec<String>,
    tag: Option<String>,
    background: bool,
    counters: Arc<Counters>,
    settings: SupervisorSettings,
    span: tracing::Span,
    wake_poller: Arc<tokio::sync::Notify>,
) -> Arc<ProcEntry> {
    let stdin = p.take_stdin();
    let (exit_tx, exit_rx) = watch::channel(None);
    let (cmd_tx, cmd_rx) = mpsc::channel(4);
    let entry = Arc::new(ProcEntry {
        id: p.id().0,
        pid: p.pid(),
        argv,
        tag,
        pty: p.is_pty(),
        background,
        started_at_ms: crate::store::now_ms(),
        stdin_open: AtomicBool::new(stdin.is_some()),
        stdin: AsyncMutex::new(stdin),
        exit: exit_rx,
        exit_tx,
        released: AtomicBool::new(false),
        cmd: cmd_tx,
        retention: settings.retention,
        kept: Mutex::new(None),
    });
    table
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(entry.clone());
    let sup = Supervisor {
        p: Some(p),
        entry: entry.clone(),
        cmd: cmd_rx,
        counters,
        settings,
        mode: if background {
            Mode::Draining
        } else {
            Mode::Parked
        },
        buf: VecDeque::new(),
        buf_bytes: 0,
        tail: Tail::default(),
        dropped_any: background,
        saw_exit: false,
        kept_serial: None,
        wake_poller,
    };
    tokio::spawn(tracing::Instrument::instrument(sup.run(), span));
    entry
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Parked,
    Streaming,
    Draining,
}

struct Supervisor {
    p: Option<Process>,
    entry: Arc<ProcEntry>,
    cmd: mpsc::Receiver<SupCmd>,
    wake_poller: Arc<tokio::sync::Notify>,
    counters: Arc<Counters>,
    settings: SupervisorSettings,
    mode: Mode,
    buf: VecDeque<OutEvent>,
    buf_bytes: usize,
    /// The latest output, whatever the mode (for re-attach after the exit).
    tail: Tail,
    dropped_any: bool,
    /// The exit came through our channel (so the agent forgets the process).
    saw_exit: bool,
    /// The serial of the output kept when the exit came (see [`ProcEntry::keep`]):
    /// kept before the exit is passed on, so that a reader who got the exit and
    /// re-attaches at once finds it.
    kept_serial: Option<u64>,
}

impl Supervisor {
    fn stdin_open(&self) -> bool {
        self.entry.stdin_open.load(Ordering::Relaxed) && self.entry.exit().is_none()
    }

    /// Lets go of the agent channel: the agent keeps the output and the exit status
    /// for re-attach, and the exit poller reports the exit.
    fn release(&mut self) {
        // Events that already arrived (an exit the agent already delivered to us)
        // are recorded first.
        while let Some(p) = self.p.as_mut() {
            match futures_util::FutureExt::now_or_never(p.next_event()) {
                Some(Ok(Some(ev))) => {
                    self.convert(ev);
                }
                _ => break,
            }
        }
        self.p = None;
        self.entry.released.store(true, Ordering::Relaxed);
        self.wake_poller.notify_one();
    }

    async fn run(mut self) {
        let grace_end = Instant::now() + self.settings.grace;
        let mut consumer: Option<mpsc::Sender<OutEvent>> = None;
        let mut ended = false;
        loop {
            if ended {
                break;
            }
            if self.mode == Mode::Draining && !self.stdin_open() {
                if self.entry.exit().is_none() {
                    self.release();
                    break;
                }
                if self.saw_exit {
                    break;
                }
                // A reader learnt the exit first: drain our channel up to it, so
                // that the output kept is whole.
            }
            let can_read = match self.mode {
                Mode::Parked => self.buf_bytes < PARK_BUDGET,
                Mode::Streaming | Mode::Draining => true,
            };
            tokio::select! {
                biased;
                c = self.cmd.recv() => match c {
                    Some(SupCmd::Subscribe { capacity, reply }) => {
                        if consumer.is_none() && !self.dropped_any && self.mode != Mode::Draining {
                            // The reader only gets the channel once this arm is done,
                            // so the parked events must fit without waiting for it.
                            let (tx, rx) = mpsc::channel(capacity.max(1) + self.buf.len());
                            for ev in self.buf.drain(..) {
                                tx.try_send(ev).expect("the channel has room for every parked event");
                            }
                            self.buf_bytes = 0;
                            if reply.send(Some(rx)).is_ok() {
                                consumer = Some(tx);
                                self.mode = Mode::Streaming;
                            } else {
                                // The reader gave up: what it was handed is lost.
                                self.dropped_any = true;
                                self.mode = Mode::Draining;
                            }
                        } else {
                            let _ = reply.send(None);
                        }
                    }
                    None => ended = true,
                },
                ev = async { self.p.as_mut().expect("held while reading").next_event().await }, if can_read => match ev {
                    Ok(Some(ev)) => {
                        let ev = self.convert(ev);
                        match self.mode {
                            Mode::Parked => {
                                self.buf_bytes += ev_len(&ev);
                                self.buf.push_back(ev);
                            }
                            Mode::Streaming => {
                                let tx = consumer.as_ref().expect("streaming has a consumer");
                                if tx.send(ev).await.is_err() {
                                    consumer = None;
                                    self.dropped_any = true;
                                    self.mode = Mode::Draining;
                                }
                            }
                            Mode::Draining => {}
                        }
                    }
                    Ok(None) => ended = true,
                    Err(e) => {
                        tracing::debug!(process = self.entry.id, "process stream ended: {e}");
                        ended = true;
                    }
                },
                _ = tokio::time::sleep_until(grace_end), if self.mode == Mode::Parked => {
                    self.mode = Mode::Draining;
                    self.buf.clear();
                    self.buf_bytes = 0;
                    self.dropped_any = true;
                },
                _ = async { consumer.as_ref().expect("checked").closed().await }, if consumer.is_some() => {
                    consumer = None;
                    self.dropped_any = true;
                    self.mode = Mode::Draining;
                },
            }
        }
        drop(consumer);
    }

    fn convert(&mut self, ev: ProcessEvent) -> OutEvent {
        let (so, se) = self.p.as_ref().map(|p| p.offsets()).unwrap_or_default();
        match ev {
            ProcessEvent::Stdout(b) => {
                self.counters.add_stdout(b.len());
                let ev = OutEvent::Stdout(so - b.len() as u64, b);
                self.tail.push(&ev);
                if let Some(serial) = self.kept_serial {
                    self.entry.keep_more(serial, &ev);
                }
                ev
            }
            ProcessEvent::Stderr(b) => {
                self.counters.add_stderr(b.len());
                let ev = OutEvent::Stderr(se - b.len() as u64, b);
                self.tail.push(&ev);
                if let Some(serial) = self.kept_serial {
                    self.entry.keep_more(serial, &ev);
                }
                ev
            }
            ProcessEvent::Exit(st) => {
                let x = process_exit(&st, (so, se));
                // The exit came through our channel (also when it is among the last
                // events `release` takes), so the agent forgets the process: its
                // latest output is kept for re-attach (from offset 0 too, when
                // nobody read it yet) for a while, before anyone learns the exit.
                // Otherwise the agent keeps it until a reader gets the exit, and
                // that reader's channel keeps it then (`keep_output_of`).
                self.kept_serial = self.entry.keep(self.tail.clone());
                self.entry.set_exit(x);
                self.saw_exit = true;
                OutEvent::Exit(x)
            }
        }
    }
}

/// Sends retained output and the exit to one reader. A slow reader must not hold
/// up the others: each gets its own task.
fn replay(events: Vec<OutEvent>, exit: Option<ProcessExit>, tx: mpsc::Sender<OutEvent>) {
    tokio::spawn(async move {
        for ev in events.into_iter().chain(exit.map(OutEvent::Exit)) {
            if tx.send(ev).await.is_err() {
                break;
            }
        }
    });
}

fn ev_len(e: &OutEvent) -> usize {
    match e {
        OutEvent::Stdout(_, b) | OutEvent::Stderr(_, b) => b.len(),
        OutEvent::Exit(_) => 64,
    }
}

/// The API's exit record of an agent's exit status, with the streams' end offsets.
pub fn process_exit(
    st: &sandlot_guest::client::ExitStatus,
    (stdout_end, stderr_end): (u64, u64),
) -> ProcessExit {
    ProcessExit {
        code: st.code,
        signal: st.signal,
        core_dumped: st.core_dumped,
        timed_out: st.timed_out,
        stdout_end,
        stderr_end,
    }
}

/// Converts an attached process's events (a reader from an arbitrary offset).
pub fn convert_attached(p: &Process, ev: ProcessEvent) -> OutEvent {
    out_event(ev, p.offsets())
}

/// An agent event as the API streams it, given the streams' offsets after it.
fn out_event(ev: ProcessEvent, (so, se): (u64, u64)) -> OutEvent {
    match ev {
        ProcessEvent::Stdout(b) => OutEvent::Stdout(so - b.len() as u64, b),
        ProcessEvent::Stderr(b) => OutEvent::Stderr(se - b.len() as u64, b),
        ProcessEvent::Exit(st) => OutEvent::Exit(process_exit(&st, (so, se))),
    }
}

/// Reports the exit of released processes (no supervisor channel) by polling the
/// agent's process list, which keeps undelivered exit statuses, every 200 ms while
/// any is pending. Ends when `stop` resolves or the agent is gone.
pub async fn poll_exits(
    guest: sandlot_guest::client::GuestClient,
    table: Arc<std::sync::Mutex<ProcTable>>,
    wake: Arc<tokio::sync::Notify>,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    loop {
        let pending: Vec<Arc<ProcEntry>> = table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .all()
            .into_iter()
            .filter(|e| e.is_released() && e.exit().is_none())
            .collect();
        if pending.is_empty() {
            tokio::select! {
                _ = wake.notified() => continue,
                _ = &mut stop => return,
            }
        }
        // An agent that never answers must not hold this task (and with it the
        // sandbox's connection) past the sandbox's end.
        let list = tokio::select! {
            l = guest.list_processes() => l,
            _ = &mut stop => return,
        };
        let Ok(list) = list else {
            return;
        };
        for e in pending {
            if let Some(x) = list.iter().find(|i| i.id.0 == e.id).and_then(|i| {
                i.exit
                    .map(|st| process_exit(&st, (i.stdout.produced, i.stderr.produced)))
            }) {
                e.set_exit(x);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
            _ = &mut stop => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(ev: &OutEvent) -> (char, u64, Vec<u8>) {
        match ev {
            OutEvent::Stdout(o, b) => ('o', *o, b.to_vec()),
            OutEvent::Stderr(o, b) => ('e', *o, b.to_vec()),
            OutEvent::Exit(_) => ('x', 0, vec![]),
        }
    }

    fn entry(id: u64, finished: bool) -> Arc<ProcEntry> {
        let (exit_tx, exit) = watch::channel(finished.then_some(ProcessExit {
            code: Some(0),
            signal: None,
            core_dumped: false,
            timed_out: false,
            stdout_end: 0,
            stderr_end: 0,
        }));
        Arc::new(ProcEntry {
            id,
            pid: 1,
            argv: vec!["true".into()],
            tag: None,
            pty: false,
            background: false,
            started_at_ms: 0,
            stdin: AsyncMutex::new(None),
            stdin_open: AtomicBool::new(false),
            exit,
            exit_tx,
            released: AtomicBool::new(false),
            cmd: mpsc::channel(1).0,
            retention: Duration::from_secs(60),
            kept: Mutex::new(None),
        })
    }

    /// The attack: an agent that answers the handshake and then nothing. The exit
    /// poller's process list must not outlive the sandbox's stop.
    #[tokio::test]
    async fn the_exit_poller_ends_at_the_stop_even_if_the_agent_never_answers() {
        use sandlot_proto::guest::{FrameHeader, FrameKind, Hello};
        use tokio::io::AsyncWriteExt;
        let (a, mut b) = tokio::io::duplex(64 * 1024);
        let hello = serde_json::to_vec(&Hello::current("silent", &[])).unwrap();
        b.write_all(&FrameHeader::encode(FrameKind::Hello, 0, hello.len()))
            .await
            .unwrap();
        b.write_all(&hello).await.unwrap();
        let guest = sandlot_guest::client::GuestClient::from_stream(a)
            .await
            .unwrap();
        let table = Arc::new(std::sync::Mutex::new(ProcTable::default()));
        let e = entry(1, false);
        e.released.store(true, Ordering::Relaxed);
        table.lock().unwrap().insert(e);
        let poller = poll_exits(
            guest,
            table,
            Arc::new(tokio::sync::Notify::new()),
            std::future::ready(()),
        );
        assert!(
            futures_util::FutureExt::now_or_never(poller).is_some(),
            "the exit poller waited on a silent agent after its stop"
        );
        drop(b);
    }

    /// Regression (the exec round trip): every insert scanned the whole table.
    /// Forgetting the oldest finished processes now happens in batches; running ones
    /// are never forgotten and the newest finished ones are kept.
    #[test]
    fn finished_processes_are_forgotten_in_batches_oldest_first() {
        let mut t = ProcTable::default();
        // A long-running process first, then many short ones.
        t.insert(entry(0, false));
        let n = 3 * MAX_FINISHED as u64;
        let mut sizes = Vec::new();
        for id in 1..=n {
            t.insert(entry(id, true));
            sizes.push(t.procs.len());
        }
        let max = *sizes.iter().max().unwrap();
        assert!(max <= 1 + MAX_FINISHED + PRUNE_SLACK, "held {max}");
        assert!(
            t.procs.len() > MAX_FINISHED,
            "forgot too many: {}",
            t.procs.len()
        );
        assert!(t.get(0).is_some(), "a running process was forgotten");
        assert!(t.get(n).is_some() && t.get(n - MAX_FINISHED as u64 + 1).is_some());
        assert!(t.get(1).is_none(), "the oldest finished process was kept");
        // Scans are rare: one per PRUNE_SLACK inserts once the table is full.
        let bound = (n as usize - MAX_FINISHED) / PRUNE_SLACK + 1;
        assert!(
            t.scans >= 1 && t.scans as usize <= bound,
            "{} scans for {n} inserts (at most {bound})",
            t.scans
        );
    }

    #[test]
    fn tail_replays_from_any_held_offset_and_cuts_the_first_chunk() {
        let mut t = Tail::default();
        t.push(&OutEvent::Stdout(0, Bytes::from_static(b"hello")));
        t.push(&OutEvent::Stderr(0, Bytes::from_static(b"err")));
        t.push(&OutEvent::Stdout(5, Bytes::from_static(b"world")));
        let got: Vec<_> = t.from((3, 3)).unwrap().iter().map(out).collect();
        assert_eq!(
            got,
            vec![('o', 3, b"lo".to_vec()), ('o', 5, b"world".to_vec())]
        );
        assert_eq!(t.from((10, 3)).unwrap().len(), 0);
    }

    #[test]
    fn tail_forgets_the_oldest_output_beyond_its_budget() {
        let mut t = Tail::default();
        let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
        for i in 0..5u64 {
            t.push(&OutEvent::Stdout(i * 65536, chunk.clone()));
        }
        assert!(t.bytes <= TAIL_BUDGET);
        assert_eq!(t.start, (65536, 0));
        assert!(t.from((0, 0)).is_none());
        assert_eq!(t.from((65536, 0)).unwrap().len(), 4);
    }

    async fn drain(mut rx: mpsc::Receiver<OutEvent>) -> Vec<(char, u64, Vec<u8>)> {
        let mut v = Vec::new();
        while let Some(ev) = rx.recv().await {
            v.push(out(&ev));
        }
        v
    }

    /// A command fast enough to end before the exec route subscribes (its
    /// supervisor gone, the output kept): the first reader still gets the output
    /// and the exit, not a refusal (an NDJSON exec of `echo` was a rare 500).
    #[tokio::test]
    async fn a_process_that_ended_before_its_first_reader_still_streams_from_the_start() {
        let e = entry(9, true);
        let mut t = Tail::starting_at((0, 0));
        t.push(&OutEvent::Stdout(0, Bytes::from_static(b"hi\n")));
        assert!(e.keep(t).is_some());
        let rx = e.subscribe_from_start(4).await.expect("a reader");
        let mut got = Vec::new();
        let mut rx = rx;
        while let Some(ev) = rx.recv().await {
            got.push(ev);
        }
        assert!(
            matches!(&got[0], OutEvent::Stdout(0, b) if &b[..] == b"hi\n"),
            "{got:?}"
        );
        assert!(matches!(got.last(), Some(OutEvent::Exit(_))), "{got:?}");
    }

    /// Output kept after the exit was delivered replays any number of times, from
    /// any offset it covers, prefers what reaches further back, and is dropped after
    /// the retention window.
    #[tokio::test]
    async fn kept_output_replays_until_the_retention_window_ends() {
        let (exit_tx, exit) = watch::channel(None);
        let e = Arc::new(ProcEntry {
            retention: Duration::from_millis(300),
            exit,
            exit_tx,
            ..Arc::into_inner(entry(7, false)).unwrap()
        });
        let tail = |from: u64| {
            let mut t = Tail::starting_at((from, 0));
            t.push(&OutEvent::Stdout(
                from,
                Bytes::copy_from_slice(&b"FIFTH\n"[from as usize..]),
            ));
            t
        };
        assert!(e.keep(tail(0)).is_some());
        // Not replayed before the exit is known.
        assert!(e.replay_kept((0, 0), 4).is_none());
        e.set_exit(ProcessExit {
            code: Some(4),
            signal: None,
            core_dumped: false,
            timed_out: false,
            stdout_end: 6,
            stderr_end: 0,
        });
        // A channel that started later keeps nothing more.
        assert!(e.keep(tail(2)).is_none());
        for _ in 0..2 {
            let (at, rx) = e.replay_kept((0, 0), 4).unwrap();
            assert_eq!(at, (0, 0));
            assert_eq!(
                drain(rx).await,
                vec![('o', 0, b"FIFTH\n".to_vec()), ('x', 0, vec![])]
            );
        }
        let (at, rx) = e.replay_kept((3, 0), 4).unwrap();
        assert_eq!(at, (3, 0));
        assert_eq!(
            drain(rx).await,
            vec![('o', 3, b"TH\n".to_vec()), ('x', 0, vec![])]
        );
        let (at, rx) = e.replay_kept((100, 5), 4).unwrap();
        assert_eq!((at, drain(rx).await.len()), ((6, 0), 1));
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(e.replay_kept((0, 0), 4).is_none(), "kept beyond the window");
    }

    #[test]
    fn tail_keeps_exactly_its_budget_of_the_latest_output() {
        let mut t = Tail::starting_at((100, 7));
        t.push(&OutEvent::Stderr(7, Bytes::from_static(b"err")));
        let chunk = Bytes::from(vec![b'x'; 100 * 1024]);
        for i in 0..3u64 {
            t.push(&OutEvent::Stdout(100 + i * 102_400, chunk.clone()));
        }
        // 300 KiB + 3 bytes written: the stderr chunk went, the first stdout one
        // was cut to what fits.
        assert_eq!(t.bytes, TAIL_BUDGET);
        assert_eq!(t.end, (100 + 307_200, 10));
        assert_eq!(t.start, (100 + 307_200 - TAIL_BUDGET as u64, 10));
        let got: Vec<_> = t.from(t.start).unwrap().iter().map(out).collect();
        assert_eq!(got[0].1, t.start.0);
        assert_eq!(
            got.iter().map(|g| g.2.len()).sum::<usize>(),
            TAIL_BUDGET,
            "{:?}",
            got.iter()
                .map(|g| (g.0, g.1, g.2.len()))
                .collect::<Vec<_>>()
        );
        assert!(t.from((t.start.0 - 1, 10)).is_none());
    }
}
