//! A process's stdin: bytes from any attached channel, written in arrival order
//! with credit returned as the pipe (or terminal) accepts them.

use std::collections::VecDeque;
use std::io;
use std::rc::Rc;

use bytes::Bytes;
use rustix::io::Errno;
use sandlot_proto::guest::stream;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::{Afd, Agent, Chan, Shared};

/// The write side of a process's stdin.
pub(crate) struct StdinPipe {
    pub fd: Afd,
    /// Chunks waiting to be written, with the channel to credit when they are.
    pub queue: VecDeque<(u64, u32, Bytes)>,
    pub eof_requested: bool,
    pub wake: Rc<Notify>,
    pub task: Option<JoinHandle<()>>,
    pub tty: bool,
}

impl Agent {
    /// Queues stdin bytes from a subscriber. Returns false on a credit violation.
    pub fn stdin_data(&mut self, conn: u64, chan: u32, data: Bytes) -> Result<(), String> {
        let Agent { conns, procs, .. } = self;
        let Some(c) = conns.get_mut(&conn) else {
            return Ok(());
        };
        let Some(Chan::Proc(sub)) = c.chans.get_mut(&chan) else {
            return Ok(());
        };
        if sub.stdin_eof {
            return Err("DATA on stream 0 after EOF".into());
        }
        let n = data.len() as u64;
        if n > sub.stdin_credit {
            return Err(format!(
                "{n} bytes of stdin exceed the granted credit of {}",
                sub.stdin_credit
            ));
        }
        sub.stdin_credit -= n;
        match procs.get_mut(&sub.proc).and_then(|p| p.stdin.as_mut()) {
            Some(si) if !si.eof_requested => {
                si.queue.push_back((conn, chan, data));
                si.wake.notify_one();
            }
            _ => {
                // Stdin is closed: discard, but give the credit back so that the
                // writer does not hang.
                sub.stdin_credit += n;
                c.out.window(chan, stream::INPUT, n as u32);
            }
        }
        Ok(())
    }

    pub fn stdin_eof(&mut self, conn: u64, chan: u32) -> Result<(), String> {
        let Agent { conns, procs, .. } = self;
        let Some(Chan::Proc(sub)) = conns.get_mut(&conn).and_then(|c| c.chans.get_mut(&chan))
        else {
            return Ok(());
        };
        if sub.stdin_eof {
            return Err("second EOF on stream 0".into());
        }
        sub.stdin_eof = true;
        if let Some(si) = procs.get_mut(&sub.proc).and_then(|p| p.stdin.as_mut()) {
            si.eof_requested = true;
            si.wake.notify_one();
        }
        Ok(())
    }

    /// Writes queued stdin until the pipe is full (`Err(WouldBlock)`) or the queue is
    /// empty; credits the sending channels for what was written.
    fn write_stdin(&mut self, id: u64) -> io::Result<()> {
        loop {
            let Some(si) = self.procs.get_mut(&id).and_then(|p| p.stdin.as_mut()) else {
                return Ok(());
            };
            let Some((conn, chan, data)) = si.queue.front_mut() else {
                return Ok(());
            };
            let (conn, chan) = (*conn, *chan);
            let n = match rustix::io::write(si.fd.get_ref(), data) {
                Ok(n) => n,
                Err(Errno::INTR) => continue,
                Err(Errno::AGAIN) => return Err(io::ErrorKind::WouldBlock.into()),
                Err(e) => return Err(e.into()),
            };
            bytes::Buf::advance(data, n);
            if data.is_empty() {
                si.queue.pop_front();
            }
            self.credit_stdin(conn, chan, n as u32);
        }
    }

    fn credit_stdin(&mut self, conn: u64, chan: u32, n: u32) {
        if n == 0 {
            return;
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            if let Some(Chan::Proc(sub)) = c.chans.get_mut(&chan) {
                if !sub.stdin_eof {
                    sub.stdin_credit += u64::from(n);
                    c.out.window(chan, stream::INPUT, n);
                }
            }
        }
    }

    /// Closes stdin: on error, or once EOF was requested and the queue drained.
    fn close_stdin(&mut self, id: u64, broken: bool) {
        let Some(p) = self.procs.get_mut(&id) else {
            return;
        };
        let Some(mut si) = p.stdin.take() else {
            return;
        };
        if si.tty && !broken {
            // A terminal has no half-close: send the EOF character instead.
            let _ = rustix::io::write(si.fd.get_ref(), b"\x04");
        }
        si.task = None;
        let queued: Vec<(u64, u32, usize)> = si
            .queue
            .drain(..)
            .map(|(c, ch, d)| (c, ch, d.len()))
            .collect();
        for (c, ch, n) in queued {
            self.credit_stdin(c, ch, n as u32);
        }
    }
}

pub(super) async fn stdin_task(agent: Shared, id: u64, fd: Afd, wake: Rc<Notify>) {
    loop {
        let (has_data, eof) = match agent.borrow().procs.get(&id).and_then(|p| p.stdin.as_ref()) {
            Some(si) => (!si.queue.is_empty(), si.eof_requested),
            None => return,
        };
        if !has_data {
            if eof {
                agent.borrow_mut().close_stdin(id, false);
                return;
            }
            wake.notified().await;
            continue;
        }
        let mut g = fd.writable().await;
        match g.try_io(|_| agent.borrow_mut().write_stdin(id)) {
            Ok(Ok(())) | Err(_) => {}
            Ok(Err(_)) => {
                // EPIPE: the process closed its stdin or exited.
                agent.borrow_mut().close_stdin(id, true);
                return;
            }
        }
    }
}
