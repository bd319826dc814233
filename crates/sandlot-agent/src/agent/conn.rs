//! One connection: the handshake, reading and dispatching frames, writing queued
//! frames, and tearing down its channels when it goes away.

use std::collections::HashMap;
use std::rc::Rc;

use bytes::Bytes;
use sandlot_proto::guest::{
    parse_data, parse_eof, parse_window, stream, ErrorBody, ErrorCode, FrameKind, Hello, ProcessId,
    PtySize, Reply, Request, AGENT_CAPABILITIES, FIRST_PROCESS, MAX_WINDOW,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;

use super::process::no_such;
use super::{
    spawn_task, Agent, Chan, Conn, OutBuf, Shared, MAX_CHANNELS_PER_CONN, STDIN_WINDOW,
    WRITE_WINDOW,
};
use sandlot_guest::wire::{self, Frame, FrameReader};

/// Reasons to close a connection.
fn protocol(msg: impl Into<String>) -> ErrorBody {
    ErrorBody::new(ErrorCode::Protocol, msg)
}

/// Serves one connection until it closes.
pub(crate) async fn serve<R, W>(agent: Shared, rd: R, wr: W)
where
    R: AsyncRead + Unpin + 'static,
    W: AsyncWrite + Unpin + 'static,
{
    let (id, reader_wake, writer_wake) = {
        let mut a = agent.borrow_mut();
        let id = a.next_conn;
        a.next_conn += 1;
        let mut out = OutBuf::new();
        let hello = Hello::current(sandlot_guest::software(), AGENT_CAPABILITIES);
        wire::put_json(&mut out.buf, FrameKind::Hello, 0, "hello", &hello).expect("hello encodes");
        let reader = Rc::new(Notify::new());
        let writer = out.writer.clone();
        a.conns.insert(
            id,
            Conn {
                out,
                chans: HashMap::new(),
                reader: reader.clone(),
                closing: false,
                ready: false,
            },
        );
        (id, reader, writer)
    };
    let writer = spawn_task(write_loop(agent.clone(), id, wr, writer_wake));
    read_loop(&agent, id, rd, &reader_wake).await;
    // Let the writer flush (a GOAWAY, last replies), then forget the connection.
    {
        let mut a = agent.borrow_mut();
        if let Some(c) = a.conns.get_mut(&id) {
            c.closing = true;
            c.out.writer.notify_one();
        }
    }
    let _ = writer.await;
    agent.borrow_mut().drop_conn(id);
}

async fn read_loop<R: AsyncRead + Unpin>(agent: &Shared, id: u64, rd: R, wake: &Notify) {
    let mut fr = FrameReader::new(rd);
    loop {
        // Back-pressure: read nothing while our output to this peer is backed up.
        loop {
            let (closing, full) = match agent.borrow().conns.get(&id) {
                Some(c) => (c.closing, c.out.full()),
                None => return,
            };
            if closing {
                return;
            }
            if !full {
                break;
            }
            wake.notified().await;
        }
        let frame = tokio::select! {
            f = fr.next() => f,
            _ = wake.notified() => continue,
        };
        let res = match frame {
            Ok(Some(f)) => agent.borrow_mut().on_frame(id, f),
            Ok(None) => return,
            Err(e) => Err(protocol(e.to_string())),
        };
        if let Err(body) = res {
            agent.borrow_mut().close_conn(id, &body);
            return;
        }
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(agent: Shared, id: u64, mut wr: W, wake: Rc<Notify>) {
    loop {
        // Let every task that is ready queue its frames first: one write for all.
        tokio::task::yield_now().await;
        let next = {
            let mut a = agent.borrow_mut();
            let Some(c) = a.conns.get_mut(&id) else {
                break;
            };
            if c.out.buf.is_empty() {
                if c.closing {
                    break;
                }
                None
            } else {
                let b = c.out.buf.split().freeze();
                c.out.inflight = b.len();
                Some(b)
            }
        };
        let Some(buf) = next else {
            wake.notified().await;
            continue;
        };
        if let Err(e) = wr.write_all(&buf).await {
            let mut a = agent.borrow_mut();
            if let Some(c) = a.conns.get_mut(&id) {
                if e.kind() != std::io::ErrorKind::BrokenPipe
                    && e.kind() != std::io::ErrorKind::ConnectionReset
                {
                    super::log!("writing to connection {id}: {e}");
                }
                c.closing = true;
                c.out.buf.clear();
                c.out.inflight = 0;
                c.reader.notify_one();
            }
            return;
        }
        let mut a = agent.borrow_mut();
        if let Some(c) = a.conns.get_mut(&id) {
            c.out.inflight = 0;
            c.reader.notify_one();
        }
        a.pump_blocked(id);
    }
    let _ = wr.shutdown().await;
}

fn parse_hello(f: &Frame) -> Result<Hello, ErrorBody> {
    if f.kind != FrameKind::Hello {
        return Err(protocol(format!(
            "the first frame must be HELLO, got {:?}",
            f.kind
        )));
    }
    serde_json::from_slice(&f.payload).map_err(|e| protocol(format!("invalid HELLO: {e}")))
}

impl Agent {
    /// Queues GOAWAY and stops reading; the connection closes once flushed.
    pub fn close_conn(&mut self, id: u64, body: &ErrorBody) {
        if let Some(c) = self.conns.get_mut(&id) {
            if !c.closing {
                c.out.goaway(body);
                c.closing = true;
                c.reader.notify_one();
            }
        }
        self.drop_channels(id);
    }

    /// Ends every operation of a connection: its processes keep running, file
    /// operations stop (their drop cleans up temporary files and watches).
    fn drop_channels(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let chans: Vec<(u32, Chan)> = c.chans.drain().collect();
        c.out.blocked.clear();
        for (chan, ch) in chans {
            if let Chan::Proc(sub) = ch {
                self.unsubscribe(id, chan, sub.proc);
            }
        }
    }

    /// Forgets a connection: its processes keep running, its operations stop.
    pub fn drop_conn(&mut self, id: u64) {
        self.drop_channels(id);
        self.conns.remove(&id);
    }

    /// Handles one frame. `Err`: a protocol violation that closes the connection.
    pub fn on_frame(&mut self, conn: u64, f: Frame) -> Result<(), ErrorBody> {
        let ready = match self.conns.get(&conn) {
            Some(c) => c.ready,
            None => return Ok(()),
        };
        if !ready {
            let peer = parse_hello(&f)?;
            let ours = Hello::current(sandlot_guest::software(), AGENT_CAPABILITIES);
            ours.negotiate(&peer)
                .map_err(|m| ErrorBody::new(ErrorCode::UnsupportedVersion, m))?;
            if let Some(c) = self.conns.get_mut(&conn) {
                c.ready = true;
            }
            return Ok(());
        }
        let chan = f.channel;
        match f.kind {
            FrameKind::Request => {
                if chan == 0 {
                    return Err(protocol("REQUEST on channel 0"));
                }
                let c = self.conns.get_mut(&conn).expect("checked");
                if c.chans.contains_key(&chan) {
                    return Err(protocol(format!(
                        "REQUEST on channel {chan}, which is open"
                    )));
                }
                if c.chans.len() >= MAX_CHANNELS_PER_CONN {
                    c.out.error(
                        chan,
                        ErrorBody::new(
                            ErrorCode::Limit,
                            format!("at most {MAX_CHANNELS_PER_CONN} open channels per connection"),
                        ),
                    );
                    return Ok(());
                }
                match serde_json::from_slice::<Request>(&f.payload) {
                    Ok(req) => self.on_request(conn, chan, req),
                    Err(e) => c.out.error(
                        chan,
                        ErrorBody::new(ErrorCode::BadRequest, format!("invalid request: {e}")),
                    ),
                }
                Ok(())
            }
            FrameKind::Data => {
                let (s, data) =
                    parse_data(chan, &f.payload).map_err(|e| protocol(e.to_string()))?;
                if s != stream::INPUT {
                    return Err(protocol(format!(
                        "DATA from the client on stream {s} of channel {chan}; only stream 0 carries client data"
                    )));
                }
                let data = f.payload.slice(f.payload.len() - data.len()..);
                self.on_input(conn, chan, data)
                    .map_err(|m| protocol(format!("channel {chan}: {m}")))
            }
            FrameKind::Eof => {
                let s = parse_eof(chan, &f.payload).map_err(|e| protocol(e.to_string()))?;
                if s != stream::INPUT {
                    return Err(protocol(format!(
                        "EOF from the client on stream {s} of channel {chan}"
                    )));
                }
                match self.conns.get(&conn).and_then(|c| c.chans.get(&chan)) {
                    Some(Chan::Proc(_)) => self
                        .stdin_eof(conn, chan)
                        .map_err(|m| protocol(format!("channel {chan}: {m}"))),
                    Some(Chan::Write(_)) => {
                        self.write_eof(conn, chan);
                        Ok(())
                    }
                    Some(_) => Err(protocol(format!("channel {chan} takes no input"))),
                    None => Ok(()),
                }
            }
            FrameKind::Window => {
                let (s, inc) =
                    parse_window(chan, &f.payload).map_err(|e| protocol(e.to_string()))?;
                self.on_window(conn, chan, s, inc)
            }
            FrameKind::Cancel => {
                self.cancel(conn, chan);
                Ok(())
            }
            FrameKind::Hello => Err(protocol("second HELLO")),
            FrameKind::Reply | FrameKind::End | FrameKind::GoAway => Err(protocol(format!(
                "{:?} frames are sent by the agent only",
                f.kind
            ))),
        }
    }

    fn on_input(&mut self, conn: u64, chan: u32, data: Bytes) -> Result<(), String> {
        match self.conns.get(&conn).and_then(|c| c.chans.get(&chan)) {
            Some(Chan::Proc(_)) => self.stdin_data(conn, chan, data),
            Some(Chan::Write(_)) => self.write_data(conn, chan, &data),
            Some(_) => Err("this channel takes no input".into()),
            // Ended meanwhile (e.g. a failed write): ignore.
            None => Ok(()),
        }
    }

    fn on_window(&mut self, conn: u64, chan: u32, s: u8, inc: u32) -> Result<(), ErrorBody> {
        let Some(c) = self.conns.get_mut(&conn) else {
            return Ok(());
        };
        let Some(ch) = c.chans.get_mut(&chan) else {
            return Ok(());
        };
        let inc = u64::from(inc);
        let credit = match (ch, s) {
            (Chan::Proc(sub), stream::OUTPUT) => &mut sub.credit[0],
            (Chan::Proc(sub), stream::STDERR) => &mut sub.credit[1],
            (Chan::Read(r), stream::OUTPUT) => &mut r.credit,
            (Chan::List(l), stream::OUTPUT) => &mut l.credit,
            (Chan::Watch(w), stream::OUTPUT) => &mut w.credit,
            _ => {
                return Err(protocol(format!(
                    "WINDOW for stream {s} of channel {chan}, which does not send on it"
                )))
            }
        };
        *credit += inc;
        if *credit > MAX_WINDOW {
            return Err(protocol(format!(
                "credit on stream {s} of channel {chan} exceeds {MAX_WINDOW}"
            )));
        }
        self.pump(conn, chan);
        Ok(())
    }

    fn cancel(&mut self, conn: u64, chan: u32) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let Some(ch) = c.chans.remove(&chan) else {
            return;
        };
        c.out.end(chan);
        if let Chan::Proc(sub) = ch {
            self.unsubscribe(conn, chan, sub.proc);
        }
    }

    fn on_request(&mut self, conn: u64, chan: u32, req: Request) {
        let op = req.op();
        let res: Result<(), ErrorBody> = match req {
            Request::Ping {} => self.reply_end(conn, chan, Reply::Ok),
            Request::Exec(e) => self.exec(&e).map(|id| {
                let p = &self.procs[&id];
                let (pid, pty) = (p.pid, p.master.is_some());
                let stdin = p.stdin.is_some();
                self.out(conn).reply(
                    chan,
                    &Reply::Started {
                        id: ProcessId(id),
                        pid,
                        pty,
                        stdin,
                    },
                );
                if e.detached {
                    self.out(conn).end(chan);
                } else {
                    self.subscribe(conn, chan, id, [Some(0), Some(0)]);
                    if stdin {
                        self.grant_stdin(conn, chan, STDIN_WINDOW);
                    }
                    self.pump_sub(conn, chan);
                }
            }),
            Request::Attach(a) => {
                let id = a.id.0;
                match self.procs.get(&id) {
                    // The first command that never started answers with its
                    // reason, word for word what an exec of it would have said.
                    None => match self.first_failed.clone() {
                        Some(why) if a.id == FIRST_PROCESS => {
                            self.out(conn).error(chan, why);
                            Ok(())
                        }
                        _ => Err(no_such(id)),
                    },
                    Some(p) => {
                        let (pid, pty) = (p.pid, p.master.is_some());
                        let (from, stdin) = self
                            .subscribe(conn, chan, id, [a.stdout_from, a.stderr_from])
                            .expect("process and connection exist");
                        self.out(conn).reply(
                            chan,
                            &Reply::Attached {
                                id: a.id,
                                pid,
                                pty,
                                stdin,
                                stdout_from: from[0],
                                stderr_from: from[1],
                            },
                        );
                        if stdin {
                            self.grant_stdin(conn, chan, STDIN_WINDOW);
                        }
                        self.pump_sub(conn, chan);
                        Ok(())
                    }
                }
            }
            Request::ListProcesses {} => {
                let all = self.list_processes();
                let out = self.out(conn);
                for batch in all.chunks(256) {
                    out.reply(
                        chan,
                        &Reply::Processes {
                            processes: batch.to_vec(),
                        },
                    );
                }
                if all.is_empty() {
                    out.reply(chan, &Reply::Processes { processes: vec![] });
                }
                out.end(chan);
                Ok(())
            }
            Request::Signal(s) => self
                .signal(s.id.0, s.signal)
                .and_then(|()| self.reply_end(conn, chan, Reply::Ok)),
            Request::Resize(r) => self
                .resize(
                    r.id.0,
                    PtySize {
                        rows: r.rows,
                        cols: r.cols,
                    },
                )
                .and_then(|()| self.reply_end(conn, chan, Reply::Ok)),
            Request::Shutdown {} => {
                let _ = self.reply_end(conn, chan, Reply::Ok);
                self.begin_shutdown();
                Ok(())
            }
            Request::RelieveMemory {} => {
                let victim = super::relieve::relieve();
                self.reply_end(conn, chan, Reply::Relieved { victim })
            }
            Request::Quiesce {} => {
                let _ = self.reply_end(conn, chan, Reply::Ok);
                self.quiesce.notify_one();
                Ok(())
            }
            Request::Stat(r) => self
                .stat(&r)
                .and_then(|stat| self.reply_end(conn, chan, Reply::Stat { stat })),
            Request::Mkdir(r) => self
                .mkdir(&r)
                .and_then(|()| self.reply_end(conn, chan, Reply::Ok)),
            Request::Remove(r) => self
                .remove(&r)
                .and_then(|()| self.reply_end(conn, chan, Reply::Ok)),
            Request::Rename(r) => self
                .rename(&r)
                .and_then(|()| self.reply_end(conn, chan, Reply::Ok)),
            Request::ReadFile(r) => self.open_read(&r).map(|(stat, rs)| {
                let c = self.conns.get_mut(&conn).expect("live");
                c.out.reply(chan, &Reply::Stat { stat });
                c.chans.insert(chan, Chan::Read(rs));
                self.pump_read(conn, chan);
            }),
            Request::WriteFile(r) => self.open_write(&r).map(|mut ws| {
                ws.credit = u64::from(WRITE_WINDOW);
                let c = self.conns.get_mut(&conn).expect("live");
                c.out.reply(chan, &Reply::Ready);
                c.out.window(chan, stream::INPUT, WRITE_WINDOW);
                c.chans.insert(chan, Chan::Write(ws));
            }),
            Request::ListDir(r) => self.open_list(&r).map(|(stat, ls)| {
                let c = self.conns.get_mut(&conn).expect("live");
                c.out.reply(chan, &Reply::Stat { stat });
                c.chans.insert(chan, Chan::List(ls));
                self.pump_list(conn, chan);
            }),
            Request::Configure(c) => self
                .configure(c)
                .and_then(|()| self.reply_end(conn, chan, Reply::Ok)),
            Request::Watch(r) => self.open_watch(conn, chan, &r).map(|()| {
                self.out(conn).reply(chan, &Reply::Watching);
            }),
        };
        if let Err(mut body) = res {
            if !body.message.starts_with(op) {
                body.message = format!("{op}: {}", body.message);
            }
            self.out(conn).error(chan, body);
        }
    }

    fn out(&mut self, conn: u64) -> &mut OutBuf {
        &mut self
            .conns
            .get_mut(&conn)
            .expect("connection of a live request")
            .out
    }

    fn reply_end(&mut self, conn: u64, chan: u32, r: Reply) -> Result<(), ErrorBody> {
        let out = self.out(conn);
        out.reply(chan, &r);
        out.end(chan);
        Ok(())
    }
}
