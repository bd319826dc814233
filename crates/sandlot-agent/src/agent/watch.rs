//! Filesystem watches: inotify, optionally recursive, streamed as NDJSON
//! [`WatchEvent`] records with byte credit like any other output.
//!
//! Back-pressure: while a client does not consume events, the agent stops reading
//! the inotify descriptor; the kernel queue then overflows and the client receives
//! one `overflow` record instead of the agent buffering without bound.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use super::keyed_poll::Polled;
use bytes::BytesMut;
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use sandlot_proto::guest::{
    stream, ErrorBody, ErrorCode, WatchEvent, WatchEventKind, WatchRequest, DATA_CHUNK,
};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::users::User;
use super::{spawn_task, Agent, Chan, Shared};

/// An inotify instance, wrapped for the reactor.
pub(crate) struct InotifyFd(pub OwnedFd);

/// An inotify watch descriptor.
type WatchDescriptor = i32;

/// One inotify event, owned.
struct InotifyEvent {
    wd: WatchDescriptor,
    mask: ReadFlags,
    cookie: u32,
    name: Option<OsString>,
}

/// Bytes of inotify events taken per read.
const EVENT_BUFFER: usize = 4096;

/// A buffer for inotify events, aligned for the kernel's `struct inotify_event`.
#[repr(C, align(8))]
struct EventBuffer([MaybeUninit<u8>; EVENT_BUFFER]);

impl InotifyFd {
    fn add_watch(&self, path: &Path, mask: WatchFlags) -> io::Result<WatchDescriptor> {
        Ok(inotify::add_watch(&self.0, path, mask)?)
    }

    fn rm_watch(&self, wd: WatchDescriptor) -> io::Result<()> {
        Ok(inotify::remove_watch(&self.0, wd)?)
    }

    /// The events one read returns (`Err(WouldBlock)` when there are none).
    fn read_events(&self) -> io::Result<Vec<InotifyEvent>> {
        let mut buf = EventBuffer([MaybeUninit::uninit(); EVENT_BUFFER]);
        let mut reader = inotify::Reader::new(&self.0, &mut buf.0);
        let mut events = Vec::new();
        loop {
            // The first call reads; the rest take the events that read returned.
            let ev = reader.next()?;
            events.push(InotifyEvent {
                wd: ev.wd(),
                mask: ev.events(),
                cookie: ev.cookie(),
                name: ev
                    .file_name()
                    .map(|n| OsString::from_vec(n.to_bytes().to_vec())),
            });
            if reader.is_buffer_empty() {
                return Ok(events);
            }
        }
    }
}

/// A channel streaming the events of one watch.
pub(crate) struct WatchStream {
    fd: Rc<Polled<InotifyFd>>,
    wds: HashMap<WatchDescriptor, PathBuf>,
    root: PathBuf,
    recursive: bool,
    user: User,
    pending: BytesMut,
    pub credit: u64,
    /// The watched root is gone: finish after sending what is pending.
    finished: bool,
    /// Wakes the reader task when pending drained below the threshold.
    room: Rc<Notify>,
    task: Option<JoinHandle<()>>,
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

fn mask() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::MODIFY
        | WatchFlags::ATTRIB
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::DONT_FOLLOW
        | WatchFlags::EXCL_UNLINK
}

/// Adds watches on `dir` and, when `recursive`, every directory below it. With
/// `report`, records a `create` event for every entry found (for directories that
/// appeared before their watch was in place).
fn add_tree(
    ino: &InotifyFd,
    wds: &mut HashMap<WatchDescriptor, PathBuf>,
    dir: &Path,
    recursive: bool,
    report: Option<&mut Vec<WatchEvent>>,
) -> io::Result<()> {
    let wd = ino.add_watch(dir, mask())?;
    wds.insert(wd, dir.to_path_buf());
    if !recursive {
        return Ok(());
    }
    let mut report = report;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
            if let Some(r) = report.as_deref_mut() {
                r.push(event(WatchEventKind::Create, &p, None, is_dir));
            }
            if is_dir {
                if let Ok(wd) = ino.add_watch(&p, mask()) {
                    wds.insert(wd, p.clone());
                    stack.push(p);
                }
            }
        }
    }
    Ok(())
}

fn event(kind: WatchEventKind, path: &Path, from: Option<&Path>, dir: bool) -> WatchEvent {
    WatchEvent {
        kind,
        path: Some(path.to_string_lossy().into_owned()),
        from: from.map(|f| f.to_string_lossy().into_owned()),
        dir,
    }
}

impl Agent {
    /// Sets up a watch for channel `chan` of `conn`.
    pub fn open_watch(&mut self, conn: u64, chan: u32, r: &WatchRequest) -> Result<(), ErrorBody> {
        if !r.path.starts_with('/') || r.path.contains('\0') {
            return Err(ErrorBody::new(
                ErrorCode::BadRequest,
                format!("watch: path {:?} must be absolute", r.path),
            ));
        }
        let user = super::files::user_for(self, "watch", r.user.as_deref())?;
        let root = PathBuf::from(&r.path);
        let ino = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
            .map(InotifyFd)
            .map_err(|e| {
                let e = io::Error::from(e);
                ErrorBody::new(ErrorCode::Io, format!("watch: inotify_init: {e}"))
            })?;
        let mut wds = HashMap::new();
        let recursive = r.recursive;
        self.fs
            .run(&user, || {
                let m = std::fs::metadata(&root)?;
                add_tree(&ino, &mut wds, &root, recursive && m.is_dir(), None)
            })
            .map_err(|e| {
                ErrorBody::new(super::files::code_of(&e), format!("watch {}: {e}", r.path))
            })?;
        let fd = Rc::new(
            self.keyed_poll()
                .and_then(|p| p.register(ino))
                .map_err(|e| ErrorBody::new(ErrorCode::Io, format!("watch: {e}")))?,
        );
        let room = Rc::new(Notify::new());
        let task = spawn_task(watch_task(
            self.shared(),
            conn,
            chan,
            fd.clone(),
            room.clone(),
        ));
        let c = self
            .conns
            .get_mut(&conn)
            .expect("request came from this connection");
        c.chans.insert(
            chan,
            Chan::Watch(WatchStream {
                fd,
                wds,
                root,
                recursive,
                user,
                pending: BytesMut::new(),
                credit: 0,
                finished: false,
                room,
                task: Some(task),
            }),
        );
        Ok(())
    }

    /// Turns a batch of inotify events into records.
    fn on_watch_events(&mut self, conn: u64, chan: u32, evs: Vec<InotifyEvent>) {
        let Agent { conns, fs, .. } = self;
        let Some(Chan::Watch(ws)) = conns.get_mut(&conn).and_then(|c| c.chans.get_mut(&chan))
        else {
            return;
        };
        let mut out: Vec<WatchEvent> = Vec::new();
        // Pending MOVED_FROM by cookie, resolved within the batch.
        let mut moved_from: Vec<(u32, PathBuf, bool)> = Vec::new();
        for ev in evs {
            let m = ev.mask;
            if m.contains(ReadFlags::QUEUE_OVERFLOW) {
                out.push(WatchEvent {
                    kind: WatchEventKind::Overflow,
                    path: None,
                    from: None,
                    dir: false,
                });
                continue;
            }
            let Some(base) = ws.wds.get(&ev.wd).cloned() else {
                continue;
            };
            if m.contains(ReadFlags::IGNORED) {
                ws.wds.remove(&ev.wd);
                if base == ws.root {
                    ws.finished = true;
                }
                continue;
            }
            let is_dir = m.contains(ReadFlags::ISDIR);
            let path = match &ev.name {
                Some(n) => base.join(n),
                None => base.clone(),
            };
            if m.intersects(ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF) {
                if base == ws.root {
                    out.push(event(WatchEventKind::Delete, &ws.root, None, is_dir));
                    ws.finished = true;
                }
                continue;
            }
            if m.contains(ReadFlags::CREATE) {
                out.push(event(WatchEventKind::Create, &path, None, is_dir));
                if is_dir && ws.recursive {
                    let (ino, wds) = (ws.fd.get_ref(), &mut ws.wds);
                    let _ = fs.run(&ws.user, || add_tree(ino, wds, &path, true, Some(&mut out)));
                }
            } else if m.intersects(ReadFlags::MODIFY | ReadFlags::ATTRIB) {
                out.push(event(WatchEventKind::Modify, &path, None, is_dir));
            } else if m.contains(ReadFlags::DELETE) {
                out.push(event(WatchEventKind::Delete, &path, None, is_dir));
            } else if m.contains(ReadFlags::MOVED_FROM) {
                moved_from.push((ev.cookie, path, is_dir));
            } else if m.contains(ReadFlags::MOVED_TO) {
                if let Some(pos) = moved_from.iter().position(|(c, _, _)| *c == ev.cookie) {
                    let (_, from, _) = moved_from.remove(pos);
                    if is_dir {
                        // Watches below the moved directory keep working; fix paths.
                        for p in ws.wds.values_mut() {
                            if let Ok(rest) = p.strip_prefix(&from) {
                                *p = path.join(rest);
                            }
                        }
                    }
                    out.push(event(WatchEventKind::Rename, &path, Some(&from), is_dir));
                } else {
                    out.push(event(WatchEventKind::Create, &path, None, is_dir));
                    if is_dir && ws.recursive {
                        let (ino, wds) = (ws.fd.get_ref(), &mut ws.wds);
                        let _ =
                            fs.run(&ws.user, || add_tree(ino, wds, &path, true, Some(&mut out)));
                    }
                }
            }
        }
        // Moved out of the tree: a deletion as far as the watch can tell.
        for (_, from, is_dir) in moved_from {
            if is_dir {
                let gone: Vec<WatchDescriptor> = ws
                    .wds
                    .iter()
                    .filter(|(_, p)| p.starts_with(&from))
                    .map(|(wd, _)| *wd)
                    .collect();
                for wd in gone {
                    let _ = ws.fd.get_ref().rm_watch(wd);
                    ws.wds.remove(&wd);
                }
            }
            out.push(event(WatchEventKind::Delete, &from, None, is_dir));
        }
        for e in out {
            if let Ok(mut line) = serde_json::to_vec(&e) {
                line.push(b'\n');
                ws.pending.extend_from_slice(&line);
            }
        }
        self.pump_watch(conn, chan);
    }

    pub fn pump_watch(&mut self, conn_id: u64, chan: u32) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let Some(Chan::Watch(ws)) = conn.chans.get_mut(&chan) else {
            return;
        };
        while !ws.pending.is_empty() && ws.credit > 0 {
            let room = conn.out.room();
            if room == 0 {
                conn.out.block(chan);
                return;
            }
            let n = ws
                .pending
                .len()
                .min(ws.credit as usize)
                .min(DATA_CHUNK)
                .min(room);
            let chunk = ws.pending.split_to(n);
            conn.out.data(chan, stream::OUTPUT, &chunk);
            ws.credit -= n as u64;
        }
        if ws.pending.len() < DATA_CHUNK {
            ws.room.notify_one();
        }
        if ws.finished && ws.pending.is_empty() {
            conn.chans.remove(&chan);
            conn.out.eof(chan, stream::OUTPUT);
            conn.out.end(chan);
        }
    }

    /// Whether the watch task may read more events (None: the watch is gone).
    fn watch_room(&self, conn: u64, chan: u32) -> Option<bool> {
        match self.conns.get(&conn)?.chans.get(&chan)? {
            Chan::Watch(ws) => Some(!ws.finished && ws.pending.len() < DATA_CHUNK),
            _ => None,
        }
    }
}

async fn watch_task(
    agent: Shared,
    conn: u64,
    chan: u32,
    fd: Rc<Polled<InotifyFd>>,
    room: Rc<Notify>,
) {
    loop {
        loop {
            match agent.borrow().watch_room(conn, chan) {
                None => return,
                Some(true) => break,
                Some(false) => {}
            }
            room.notified().await;
        }
        let mut g = fd.readable().await;
        let res = g.try_io(|f| f.get_ref().read_events());
        match res {
            Ok(Ok(evs)) => agent.borrow_mut().on_watch_events(conn, chan, evs),
            Ok(Err(e)) => {
                super::log!("reading inotify events: {e}");
                return;
            }
            Err(_would_block) => {}
        }
    }
}
