//! A stock of things made ahead of time by a background thread: the common part of
//! [`crate::cgroup_stock::CgroupStock`] and [`crate::netns::NetnsStock`].
//!
//! The thread keeps `want` items ready; [`Stock::take`] hands one out (never twice)
//! and wakes the thread to make a replacement. A failed make is retried after a
//! second: a host that refuses is served by the caller's own path, which reports the
//! error itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// The nice value of stock threads (the daemon's request threads run at 0).
const STOCK_NICE: i32 = 10;

pub(crate) struct Stock<T: Send + 'static> {
    shared: Arc<Shared<T>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Shared<T> {
    want: usize,
    ready: Mutex<Vec<T>>,
    wake: Condvar,
    stop: AtomicBool,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, Vec<T>> {
        self.ready.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<T: Send + 'static> Stock<T> {
    /// Starts the thread `name`, which keeps `want` items made by `make` (`None`:
    /// the make failed). `None` for `want` 0 or if the thread cannot start.
    pub(crate) fn start(
        name: &str,
        want: usize,
        mut make: impl FnMut() -> Option<T> + Send + 'static,
    ) -> Option<Stock<T>> {
        if want == 0 {
            return None;
        }
        let shared = Arc::new(Shared {
            want,
            ready: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // Refilling is background work: requests come first (a burst of
                // creates otherwise shares the CPUs with the refills it triggers).
                let _ = crate::sys::nice_this_thread(STOCK_NICE);
                loop {
                    {
                        let mut ready = s.lock();
                        while ready.len() >= s.want && !s.stop.load(Ordering::SeqCst) {
                            ready = s.wake.wait(ready).unwrap_or_else(|e| e.into_inner());
                        }
                    }
                    if s.stop.load(Ordering::SeqCst) {
                        return;
                    }
                    match make() {
                        Some(item) => s.lock().push(item),
                        None => std::thread::sleep(Duration::from_secs(1)),
                    }
                }
            })
            .ok()?;
        Some(Stock {
            shared,
            thread: Some(thread),
        })
    }

    /// An item, or `None` if the stock is empty right now.
    pub(crate) fn take(&self) -> Option<T> {
        let item = self.shared.lock().pop();
        self.shared.wake.notify_one();
        item
    }

    /// Items ready now.
    pub(crate) fn ready(&self) -> usize {
        self.shared.lock().len()
    }

    /// Stops the thread (waiting for a make in progress) and returns what is left.
    pub(crate) fn stop(&mut self) -> Vec<T> {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.shared.lock())
    }
}

impl<T: Send + 'static> Drop for Stock<T> {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn wait_ready<T: Send>(s: &Stock<T>, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while s.ready() < n {
            assert!(std::time::Instant::now() < deadline, "never reached {n}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Refills yield the CPU to the request threads (a burst's creates wait for it).
    #[test]
    fn stock_threads_run_at_a_lower_priority_than_their_caller() {
        // SAFETY: getpriority has no pointers; errno is not consulted (values are
        // checked against the expected ones instead).
        let nice = || unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let caller = nice();
        let mut s = Stock::start("test-nice", 1, move || Some(nice())).unwrap();
        wait_ready(&s, 1);
        let in_thread = s.take().unwrap();
        drop(s.stop());
        assert_eq!(in_thread, STOCK_NICE.max(caller), "caller at {caller}");
        assert_eq!(nice(), caller, "the caller's own priority changed");
    }

    #[test]
    fn keeps_want_items_hands_each_out_once_and_returns_the_rest() {
        let made = Arc::new(AtomicUsize::new(0));
        let m = made.clone();
        let mut s = Stock::start("test-stock", 3, move || {
            Some(m.fetch_add(1, Ordering::SeqCst))
        })
        .unwrap();
        wait_ready(&s, 3);
        let a = s.take().unwrap();
        let b = s.take().unwrap();
        assert_ne!(a, b);
        wait_ready(&s, 3);
        assert_eq!(made.load(Ordering::SeqCst), 5, "refilled, not over-made");
        let mut left = s.stop();
        left.sort();
        assert_eq!(left.len(), 3);
        assert!(!left.contains(&a) && !left.contains(&b));
        assert!(s.take().is_none());
    }

    #[test]
    fn none_when_not_wanted_and_failures_are_retried() {
        assert!(Stock::start("test-stock", 0, || Some(1)).is_none());
        let tries = Arc::new(AtomicUsize::new(0));
        let t = tries.clone();
        // Fails once, then succeeds (after the one-second pause).
        let s = Stock::start("test-stock", 1, move || {
            (t.fetch_add(1, Ordering::SeqCst) > 0).then_some(7)
        })
        .unwrap();
        wait_ready(&s, 1);
        assert_eq!(s.take(), Some(7));
        assert!(tries.load(Ordering::SeqCst) >= 2);
    }
}
