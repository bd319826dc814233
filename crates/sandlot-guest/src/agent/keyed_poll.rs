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
//! registration of one reports nothing.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::rc::Rc;

use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

use super::OwnsFd;

/// Readiness bits of a slot.
const READ: u8 = 1;
const WRITE: u8 = 2;

/// Events taken per `epoll_wait`.
const EVENTS: usize = 32;

/// What every descriptor is watched for (edge-triggered, as the reactor does).
const INTEREST: u32 = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;

/// The readiness an event's mask gives: readable on input, a hang-up or an
/// error; writable on room, a hang-up or an error (a write then says which).
fn readiness(events: u32) -> u8 {
    let has = |bits: libc::c_int| events & bits as u32 != 0;
    let mut r = 0;
    if has(libc::EPOLLIN | libc::EPOLLPRI | libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) {
        r |= READ;
    }
    if has(libc::EPOLLOUT | libc::EPOLLHUP | libc::EPOLLERR) {
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
}

impl KeyedPoll {
    /// Makes the epoll instance, registers it with the reactor for good and
    /// starts the task that reads its events. Needs the agent's `LocalSet`.
    pub fn start() -> io::Result<Rc<KeyedPoll>> {
        // SAFETY: epoll_create1 takes no pointers.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: epoll_create1 returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let poll = Rc::new(KeyedPoll {
            epoll: super::register(fd, tokio::io::Interest::READABLE)?,
            slots: RefCell::new(Slots::default()),
        });
        super::spawn_task(drive(poll.clone()));
        Ok(poll)
    }

    /// Watches `t` (non-blocking) for input and room.
    pub fn register<T: OwnsFd>(self: &Rc<Self>, t: T) -> io::Result<Polled<T>> {
        let (index, key) = self.slots.borrow_mut().take();
        let mut ev = libc::epoll_event {
            events: INTEREST,
            u64: key,
        };
        // SAFETY: `ev` is valid for the call; both descriptors are open (`t` owns
        // its own).
        let r = unsafe {
            libc::epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                t.as_raw_fd(),
                &mut ev,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            self.slots.borrow_mut().release(index);
            return Err(e);
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

    /// Takes the events ready now; false when there were none.
    fn read_events(&self) -> io::Result<bool> {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; EVENTS];
        // SAFETY: `events` is valid for EVENTS entries for the call; no timeout.
        let n = unsafe {
            libc::epoll_wait(
                self.epoll.as_raw_fd(),
                events.as_mut_ptr(),
                EVENTS as libc::c_int,
                0,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut woken = Vec::new();
        {
            let mut slots = self.slots.borrow_mut();
            for ev in &events[..n as usize] {
                // Copied out: the struct is packed.
                let (key, mask) = (ev.u64, ev.events);
                if let Some(n) = slots.record(key, mask) {
                    woken.push(n);
                }
            }
        }
        for n in woken {
            n.notify_waiters();
        }
        Ok(n > 0)
    }
}

/// Reads the keyed epoll's events whenever it is readable, for the agent's life.
async fn drive(poll: Rc<KeyedPoll>) {
    loop {
        let Ok(mut guard) = poll.epoll.readable().await else {
            super::log!("the keyed epoll left the reactor");
            return;
        };
        match poll.read_events() {
            Ok(true) => {}
            Ok(false) => guard.clear_ready(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                super::log!("epoll_wait on the keyed epoll: {e}");
                guard.clear_ready();
            }
        }
    }
}

/// A descriptor registered with the [`KeyedPoll`]; unregistered when dropped.
pub(crate) struct Polled<T: AsRawFd> {
    inner: T,
    index: u32,
    poll: Rc<KeyedPoll>,
}

/// A readiness [`Polled::readable`] or [`Polled::writable`] found.
pub(crate) struct ReadyGuard<'a, T: AsRawFd> {
    polled: &'a Polled<T>,
    bit: u8,
}

/// The operation would block: the readiness was cleared.
#[derive(Debug)]
pub(crate) struct WouldBlock;

impl<T: AsRawFd> Polled<T> {
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

impl<T: AsRawFd> ReadyGuard<'_, T> {
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

impl<T: AsRawFd> Drop for Polled<T> {
    fn drop(&mut self) {
        // SAFETY: EPOLL_CTL_DEL reads no event (a null pointer is allowed); both
        // descriptors are open (`inner` closes after this).
        unsafe {
            libc::epoll_ctl(
                self.poll.epoll.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                self.inner.as_raw_fd(),
                std::ptr::null_mut(),
            );
        }
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
        assert!(s.record(old, libc::EPOLLIN as u32).is_some());
        s.release(i);
        assert!(s.record(old, libc::EPOLLHUP as u32).is_none());
        let (j, new) = s.take();
        assert_eq!(i, j);
        assert_ne!(old, new);
        assert!(s.record(old, libc::EPOLLHUP as u32).is_none());
        // The reused slot starts with no readiness of its former owner.
        assert_eq!(s.named(new).map(|s| s.ready), Some(0));
        assert!(s.record(new, libc::EPOLLIN as u32).is_some());
        assert_eq!(s.named(new).map(|s| s.ready), Some(READ));
        // A key of a slot never handed out, or an address-like value, names nothing.
        assert!(s.record(0x5585_2f1e_0b80, libc::EPOLLHUP as u32).is_none());
        // Freeing twice moves the generation once.
        s.release(j);
        s.release(j);
        assert_eq!(s.free.len(), 1);
    }

    #[test]
    fn hang_ups_and_errors_wake_readers_and_writers() {
        assert_eq!(readiness(libc::EPOLLIN as u32), READ);
        assert_eq!(readiness(libc::EPOLLOUT as u32), WRITE);
        assert_eq!(readiness(libc::EPOLLHUP as u32), READ | WRITE);
        assert_eq!(readiness(libc::EPOLLERR as u32), READ | WRITE);
        assert_eq!(readiness(libc::EPOLLRDHUP as u32), READ);
        assert_eq!(readiness(0), 0);
    }

    #[test]
    fn a_pipe_s_input_and_its_end_reach_its_reader_through_the_keyed_epoll() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async {
            let poll = KeyedPoll::start().unwrap();
            let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
            super::super::set_nonblocking(&r).unwrap();
            let r = poll.register(r).unwrap();
            nix::unistd::write(&w, b"hi").unwrap();
            let mut buf = [0u8; 8];
            let mut g = r.readable().await;
            let n = g
                .try_io(|f| nix::unistd::read(f.get_ref(), &mut buf).map_err(io::Error::from))
                .unwrap()
                .unwrap();
            assert_eq!(&buf[..n], b"hi");
            // Drained: the next read would block, and clears the readiness.
            let mut g = r.readable().await;
            assert!(g
                .try_io(|f| nix::unistd::read(f.get_ref(), &mut buf).map_err(io::Error::from))
                .is_err());
            drop(w);
            let mut g = r.readable().await;
            let n = g
                .try_io(|f| nix::unistd::read(f.get_ref(), &mut buf).map_err(io::Error::from))
                .unwrap()
                .unwrap();
            assert_eq!(n, 0);
        });
    }
}
