//! The agent's own epoll instance, through which it waits on its processes'
//! pipes and terminals and on its file watches: each descriptor is registered
//! under a key (a slot and the slot's generation), never under an address.
//!
//! Why the reactor's own registrations are not used for them: gVisor's kernel
//! (its 20221219 release at least) can save in a checkpoint an epoll
//! registration that was deleted long before, when a live registration's list
//! links still point at it (`ReadEvents` leaves the edge-triggered entries it
//! reported linked to each other), and a restore marks every registration it
//! loaded ready (`epollInterest.afterLoad`). A deleted registration of a closed
//! pipe, or of an inotify descriptor with unread events, then reads as ready,
//! and the restored epoll reports it with the `epoll_event.data` it was
//! registered with. Tokio's reactor takes that data for the address of its
//! registration, freed long ago: the agent, PID 1, crashed and the restored
//! sandbox with it, the more likely the more the agent had run. Here such an
//! event names a slot whose generation has moved on, and is dropped. The
//! reactor's registration of this epoll instance is never deleted; sockets stay
//! with the reactor, since a closed socket reads as not ready and a resurrected
//! registration of one reports nothing. Dropped events are counted and logged.
//!
//! The task reading the events yields to the agent's other tasks after every
//! batch that had events: a process making events without pause (a stream of
//! changes under a watched directory, one-byte writes to a pipe) would otherwise
//! keep it running, and PID 1 serving nothing else. If that task ends (it never
//! should), the agent learns it through its [`Fatal`] and ends: the sandbox ends
//! with it, rather than its pipes and watches waiting for ever.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::rc::Rc;

use rustix::event::epoll::{self, EventData, EventFlags};
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::{Fatal, OwnsFd};

/// Readiness bits of a slot.
const READ: u8 = 1;
const WRITE: u8 = 2;

/// Events taken per `epoll_wait`.
const EVENTS: usize = 32;

/// What every descriptor is watched for (edge-triggered, as the reactor does).
const INTEREST: EventFlags = EventFlags::IN
    .union(EventFlags::OUT)
    .union(EventFlags::RDHUP)
    .union(EventFlags::ET);

/// The readiness an event's mask gives: readable on input, a hang-up or an
/// error; writable on room, a hang-up or an error (a write then says which).
fn readiness(events: u32) -> u8 {
    let events = EventFlags::from_bits_retain(events);
    let mut r = 0;
    if events.intersects(
        EventFlags::IN | EventFlags::PRI | EventFlags::RDHUP | EventFlags::HUP | EventFlags::ERR,
    ) {
        r |= READ;
    }
    if events.intersects(EventFlags::OUT | EventFlags::HUP | EventFlags::ERR) {
        r |= WRITE;
    }
    r
}

/// One registered descriptor's place: its generation moves on when it is freed,
/// so that a key handed out before names nothing.
#[derive(Debug)]
struct Slot {
    generation: u32,
    in_use: bool,
    ready: u8,
    notify: Rc<Notify>,
}

/// The slots, and the free ones to reuse.
#[derive(Debug, Default)]
struct Slots {
    entries: Vec<Slot>,
    free: Vec<u32>,
}

fn key(index: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index)
}

impl Slots {
    /// A free slot, taken: its index and key.
    fn take(&mut self) -> (u32, u64) {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.entries.push(Slot {
                    generation: 0,
                    in_use: false,
                    ready: 0,
                    notify: Rc::new(Notify::new()),
                });
                u32::try_from(self.entries.len() - 1).expect("fewer than 2^32 descriptors")
            }
        };
        let slot = &mut self.entries[index as usize];
        slot.in_use = true;
        slot.ready = 0;
        (index, key(index, slot.generation))
    }

    /// Frees slot `index`: keys of it handed out so far name nothing from now on.
    fn release(&mut self, index: u32) {
        if let Some(slot) = self.entries.get_mut(index as usize) {
            if slot.in_use {
                slot.in_use = false;
                slot.ready = 0;
                slot.generation = slot.generation.wrapping_add(1);
                self.free.push(index);
            }
        }
    }

    /// The slot `key` names, if it is still the one it was handed out for.
    fn named(&mut self, key: u64) -> Option<&mut Slot> {
        let (index, generation) = ((key & 0xffff_ffff) as usize, (key >> 32) as u32);
        self.entries
            .get_mut(index)
            .filter(|s| s.in_use && s.generation == generation)
    }

    /// Records an event; the slot's waiters to wake, if the key is current.
    fn record(&mut self, key: u64, events: u32) -> Option<Rc<Notify>> {
        let slot = self.named(key)?;
        slot.ready |= readiness(events);
        Some(slot.notify.clone())
    }
}

/// The agent's keyed epoll instance (see the module's documentation).
pub(crate) struct KeyedPoll {
    epoll: AsyncFd<OwnedFd>,
    slots: RefCell<Slots>,
    /// Events dropped so far because their key named no current slot.
    stale: Cell<u64>,
}

impl KeyedPoll {
    /// Makes the epoll instance, registers it with the reactor for good and
    /// starts the task that reads its events; `fatal` is raised if that task
    /// ends. Needs the agent's `LocalSet`.
    pub fn start(fatal: Rc<Fatal>) -> io::Result<Rc<KeyedPoll>> {
        Self::start_driven(fatal).map(|(poll, _task)| poll)
    }

    /// [`KeyedPoll::start`], with the task reading the events.
    fn start_driven(fatal: Rc<Fatal>) -> io::Result<(Rc<KeyedPoll>, JoinHandle<()>)> {
        let fd = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let poll = Rc::new(KeyedPoll {
            epoll: super::register(fd, tokio::io::Interest::READABLE)?,
            slots: RefCell::new(Slots::default()),
            stale: Cell::new(0),
        });
        let task = super::spawn_task(drive_or_raise(poll.clone(), fatal));
        Ok((poll, task))
    }

    /// Watches `t` (non-blocking) for input and room.
    pub fn register<T: OwnsFd>(self: &Rc<Self>, t: T) -> io::Result<Polled<T>> {
        let (index, key) = self.slots.borrow_mut().take();
        if let Err(e) = epoll::add(self.epoll.get_ref(), &t, EventData::new_u64(key), INTEREST) {
            self.slots.borrow_mut().release(index);
            return Err(e.into());
        }
        Ok(Polled {
            inner: t,
            index,
            poll: self.clone(),
        })
    }

    fn ready(&self, index: u32) -> (u8, Rc<Notify>) {
        let slots = self.slots.borrow();
        let slot = &slots.entries[index as usize];
        (slot.ready, slot.notify.clone())
    }

    fn clear(&self, index: u32, bit: u8) {
        if let Some(slot) = self.slots.borrow_mut().entries.get_mut(index as usize) {
            slot.ready &= !bit;
        }
    }

    /// Takes the events ready now; how many there were.
    fn read_events(&self) -> io::Result<usize> {
        let none = epoll::Event {
            flags: EventFlags::empty(),
            data: EventData::new_u64(0),
        };
        let mut events = [none; EVENTS];
        // No timeout: only what is ready now.
        let now = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let n = epoll::wait(self.epoll.get_ref(), &mut events[..], Some(&now))?;
        let mut woken = Vec::new();
        let mut stale = 0u64;
        {
            let mut slots = self.slots.borrow_mut();
            for &ev in &events[..n] {
                // Copied out: the struct is packed.
                let (data, flags) = (ev.data, ev.flags);
                let (key, mask) = (data.u64(), flags.bits());
                match slots.record(key, mask) {
                    Some(n) => woken.push(n),
                    None => stale += 1,
                }
            }
        }
        if stale > 0 {
            let total = self.stale.get() + stale;
            self.stale.set(total);
            super::log!(
                "dropped {stale} event(s) of the keyed epoll whose key names no current \
                 slot ({total} so far)"
            );
        }
        for n in woken {
            n.notify_waiters();
        }
        Ok(n)
    }
}

/// Runs [`drive`]; whenever it ends (an error, a panic, the task dropped, even
/// before it first ran), raises `fatal`, since every pipe, terminal and watch
/// would wait for ever.
fn drive_or_raise(poll: Rc<KeyedPoll>, fatal: Rc<Fatal>) -> impl std::future::Future<Output = ()> {
    /// Raises its `Fatal` when dropped unless disarmed.
    struct Alarm(Option<Rc<Fatal>>);
    impl Drop for Alarm {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f.raise("the task reading the keyed epoll ended".into());
            }
        }
    }
    // Made outside the future, so that dropping it unpolled raises too.
    let mut alarm = Alarm(Some(fatal));
    async move {
        let e = drive(poll).await;
        if let Some(f) = alarm.0.take() {
            f.raise(format!("the keyed epoll: {e}"));
        }
    }
}

/// Reads the keyed epoll's events whenever it is readable; returns only on an
/// error that leaves it unusable.
async fn drive(poll: Rc<KeyedPoll>) -> io::Error {
    loop {
        let mut guard = match poll.epoll.readable().await {
            Ok(g) => g,
            Err(e) => return io::Error::new(e.kind(), format!("left the reactor: {e}")),
        };
        match poll.read_events() {
            Ok(0) => guard.clear_ready(),
            Ok(_) => {
                // More may be ready: the readiness stays set (no edge is lost),
                // and the other tasks run before the next look.
                drop(guard);
                tokio::task::yield_now().await;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // EBADF, EFAULT or EINVAL: nothing a retry mends.
            Err(e) => return io::Error::new(e.kind(), format!("epoll_wait: {e}")),
        }
    }
}

/// A descriptor registered with the [`KeyedPoll`]; unregistered when dropped.
pub(crate) struct Polled<T: AsFd + AsRawFd> {
    inner: T,
    index: u32,
    poll: Rc<KeyedPoll>,
}

/// A readiness [`Polled::readable`] or [`Polled::writable`] found.
pub(crate) struct ReadyGuard<'a, T: AsFd + AsRawFd> {
    polled: &'a Polled<T>,
    bit: u8,
}

/// The operation would block: the readiness was cleared.
#[derive(Debug)]
pub(crate) struct WouldBlock;

impl<T: AsFd + AsRawFd> Polled<T> {
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// Waits until the descriptor may have input (or has hung up).
    pub async fn readable(&self) -> ReadyGuard<'_, T> {
        self.ready(READ).await
    }

    /// Waits until the descriptor may have room (or has hung up).
    pub async fn writable(&self) -> ReadyGuard<'_, T> {
        self.ready(WRITE).await
    }

    async fn ready(&self, bit: u8) -> ReadyGuard<'_, T> {
        loop {
            let (ready, notify) = self.poll.ready(self.index);
            if ready & bit != 0 {
                return ReadyGuard { polled: self, bit };
            }
            let notified = notify.notified();
            tokio::pin!(notified);
            // Enabled before the second look, so that no event is missed between.
            notified.as_mut().enable();
            if self.poll.ready(self.index).0 & bit != 0 {
                return ReadyGuard { polled: self, bit };
            }
            notified.await;
        }
    }
}

impl<T: AsFd + AsRawFd> ReadyGuard<'_, T> {
    /// Runs `f`; its `WouldBlock` clears the readiness and is `Err(WouldBlock)`.
    pub fn try_io<R>(
        &mut self,
        f: impl FnOnce(&Polled<T>) -> io::Result<R>,
    ) -> Result<io::Result<R>, WouldBlock> {
        match f(self.polled) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.polled.poll.clear(self.polled.index, self.bit);
                Err(WouldBlock)
            }
            r => Ok(r),
        }
    }
}

impl<T: AsFd + AsRawFd> Drop for Polled<T> {
    fn drop(&mut self) {
        // Both descriptors are open (`inner` closes after this).
        let _ = epoll::delete(self.poll.epoll.get_ref(), &self.inner);
        self.poll.slots.borrow_mut().release(self.index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_slot_s_old_key_names_nothing_even_once_the_slot_is_reused() {
        let mut s = Slots::default();
        let (i, old) = s.take();
        assert!(s.record(old, EventFlags::IN.bits()).is_some());
        s.release(i);
        assert!(s.record(old, EventFlags::HUP.bits()).is_none());
        let (j, new) = s.take();
        assert_eq!(i, j);
        assert_ne!(old, new);
        assert!(s.record(old, EventFlags::HUP.bits()).is_none());
        // The reused slot starts with no readiness of its former owner.
        assert_eq!(s.named(new).map(|s| s.ready), Some(0));
        assert!(s.record(new, EventFlags::IN.bits()).is_some());
        assert_eq!(s.named(new).map(|s| s.ready), Some(READ));
        // A key of a slot never handed out, or an address-like value, names nothing.
        assert!(s.record(0x5585_2f1e_0b80, EventFlags::HUP.bits()).is_none());
        // Freeing twice moves the generation once.
        s.release(j);
        s.release(j);
        assert_eq!(s.free.len(), 1);
    }

    #[test]
    fn hang_ups_and_errors_wake_readers_and_writers() {
        assert_eq!(readiness(EventFlags::IN.bits()), READ);
        assert_eq!(readiness(EventFlags::OUT.bits()), WRITE);
        assert_eq!(readiness(EventFlags::HUP.bits()), READ | WRITE);
        assert_eq!(readiness(EventFlags::ERR.bits()), READ | WRITE);
        assert_eq!(readiness(EventFlags::RDHUP.bits()), READ);
        assert_eq!(readiness(0), 0);
    }

    /// Runs `f` on a current-thread runtime inside a `LocalSet`, as the agent does.
    fn on_agent_loop<F: std::future::Future<Output = ()>>(f: F) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        tokio::task::LocalSet::new().block_on(&rt, f);
    }

    /// Waits, failing the test after a generous while (a lost wake-up hangs it).
    async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(std::time::Duration::from_secs(20), f)
            .await
            .unwrap_or_else(|_| panic!("{what}: no wake-up"))
    }

    fn read(f: &Polled<OwnedFd>, buf: &mut [u8]) -> io::Result<usize> {
        Ok(rustix::io::read(f.get_ref(), buf)?)
    }

    #[test]
    fn a_pipe_s_input_and_its_end_reach_its_reader_through_the_keyed_epoll() {
        on_agent_loop(async {
            let poll = KeyedPoll::start(Rc::new(Fatal::default())).unwrap();
            let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
            super::super::set_nonblocking(&r).unwrap();
            let r = poll.register(r).unwrap();
            rustix::io::write(&w, b"hi").unwrap();
            let mut buf = [0u8; 8];
            let mut g = within("input", r.readable()).await;
            let n = g.try_io(|f| read(f, &mut buf)).unwrap().unwrap();
            assert_eq!(&buf[..n], b"hi");
            // Drained: the next read would block, and clears the readiness.
            let mut g = within("input still ready", r.readable()).await;
            assert!(g.try_io(|f| read(f, &mut buf)).is_err());
            drop(w);
            let mut g = within("the end", r.readable()).await;
            let n = g.try_io(|f| read(f, &mut buf)).unwrap().unwrap();
            assert_eq!(n, 0);
        });
    }

    /// What a restored gVisor kernel does: an event under the key of a slot
    /// freed since (and now reused) reaches the keyed epoll.
    #[test]
    fn an_event_under_a_released_key_is_dropped_and_wakes_no_live_slot() {
        on_agent_loop(async {
            let poll = KeyedPoll::start(Rc::new(Fatal::default())).unwrap();
            // A descriptor registered, then dropped: its key is released.
            let (gone, _gone_w) =
                rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
            let gone = poll.register(gone).unwrap();
            let (index, old_key) = {
                let slots = poll.slots.borrow();
                let slot = &slots.entries[gone.index as usize];
                (gone.index, key(gone.index, slot.generation))
            };
            drop(gone);
            // The live descriptor takes the freed slot.
            let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
            super::super::set_nonblocking(&r).unwrap();
            let live = poll.register(r).unwrap();
            assert_eq!(live.index, index);
            let (ready, notify) = poll.ready(index);
            assert_eq!(ready, 0);
            let woken = notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // Another pipe's end, dup'd, registered under the released key, and
            // made readable.
            let (other, other_w) =
                rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
            let dup = rustix::io::dup(&other).unwrap();
            epoll::add(
                poll.epoll.get_ref(),
                &dup,
                EventData::new_u64(old_key),
                INTEREST,
            )
            .unwrap();
            rustix::io::write(&other_w, b"x").unwrap();
            within("the stale event read", async {
                while poll.stale.get() == 0 {
                    tokio::task::yield_now().await;
                }
            })
            .await;
            assert_eq!(poll.stale.get(), 1);
            // The live slot learnt nothing and its waiters were not woken.
            assert_eq!(poll.ready(index).0, 0);
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(std::future::Future::poll(woken.as_mut(), &mut cx).is_pending());
            // It still hears its own descriptor.
            rustix::io::write(&w, b"live").unwrap();
            let mut buf = [0u8; 8];
            let mut g = within("the live input", live.readable()).await;
            let n = g.try_io(|f| read(f, &mut buf)).unwrap().unwrap();
            assert_eq!(&buf[..n], b"live");
            epoll::delete(poll.epoll.get_ref(), &dup).unwrap();
            drop((other, other_w, dup));
        });
    }

    #[test]
    fn the_agent_is_told_when_the_task_reading_the_keyed_epoll_ends() {
        on_agent_loop(async {
            let fatal = Rc::new(Fatal::default());
            let (_poll, task) = KeyedPoll::start_driven(fatal.clone()).unwrap();
            task.abort();
            let why = within("the fatal error", fatal.raised()).await;
            assert!(why.contains("keyed epoll"), "{why}");
        });
    }
}
