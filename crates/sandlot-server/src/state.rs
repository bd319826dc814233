//! State shared by every request: configuration, database, runtime, live sandboxes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::ServerConfig;
use crate::metrics::Metrics;
use crate::process::SupervisorSettings;
use crate::sandbox::SandboxHandle;
use crate::store::Store;

pub struct AppState {
    pub cfg: Arc<ServerConfig>,
    pub store: Arc<Store>,
    /// The isolation backends: the daemon's only way to sandboxes.
    pub backends: crate::isolation::Backends,
    pub metrics: Metrics,
    pub pools: crate::pool::Pools,
    /// Admission of cold creates (`runtime.max_concurrent_creates`).
    pub create_slots: tokio::sync::Semaphore,
    /// Pool claims in flight (as many as cold creates). A burst of claims is then
    /// served first come, first served instead of all at once: the first callers
    /// get their sandboxes early instead of all of them late.
    pub claim_slots: tokio::sync::Semaphore,
    /// Images, volumes, secrets (see `images.rs`).
    pub images: Arc<crate::images::Images>,
    live: Mutex<HashMap<String, Arc<SandboxHandle>>>,
    shutting_down: AtomicBool,
    /// Network egress service (see `network.rs`), set once at start.
    pub net: crate::network::NetSlot,
    /// Memory stores (`memory.rs`).
    pub memory: Arc<crate::memory::Memories>,
    /// Sandbox ports published on the host (see `ports.rs`).
    pub published: crate::ports::Published,
    /// Virtual filesystem collections and sessions (see `vfs.rs`).
    pub vfs: crate::vfs::VfsService,
    /// Collections mounted into sandboxes (see `collection_mount.rs`).
    pub collection_mounts: crate::collection_mount::CollectionMounts,
    /// Host clean-ups still running for sandboxes already recorded as stopped.
    pub teardowns: Teardowns,
    /// How the open-file limit is shared out (see `inbound.rs`).
    pub descriptors: crate::inbound::DescriptorPlan,
    /// Caps and timeouts of the TCP listeners (`[connections]`).
    pub inbound: Arc<crate::inbound::Inbound>,
    /// The descriptors sandboxes' egress (proxy, resolver) may hold, all together.
    pub egress_descriptors: Arc<sandlot_net::admission::Budget>,
    /// Builds in flight per tenant (`images.max_builds_per_tenant`), the staging of
    /// their contexts included.
    pub builds: Arc<sandlot_net::admission::KeyedCount<String>>,
    /// The last answer of `GET /v1/tenants` (`services/tenants.rs`).
    pub tenants: crate::services::tenants::Cache,
    /// What the code runs of each tenant's sandboxes hold of the daemon's
    /// memory at once (`code/output.rs`).
    pub code_output: crate::code::output::TenantPools,
}

/// The host clean-ups that run after a sandbox is recorded as stopped (its
/// cgroups, run directory, network slot, image and mount references), by sandbox,
/// so that a graceful shutdown can wait for all of them and a request that needs
/// a stopped sandbox's references gone (the removal of the image it used) for
/// its own. One that a crash interrupts is finished by the next start's
/// reconcile.
#[derive(Default)]
pub struct Teardowns {
    /// Id (a sandbox's, or one of its checkpoints') → the clean-ups running that
    /// release it (one, but counted all the same).
    running: Mutex<HashMap<String, usize>>,
    /// Clean-ups running.
    pending: std::sync::atomic::AtomicUsize,
    /// Clean-ups ended since the daemon started.
    ended_count: std::sync::atomic::AtomicU64,
    /// Told whenever a clean-up ends.
    ended: tokio::sync::Notify,
}

/// One running clean-up; dropping it marks it done.
pub struct TeardownGuard<'a> {
    of: &'a Teardowns,
    ids: Vec<String>,
}

impl Teardowns {
    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A sandbox's clean-up begins. `ids`: the sandbox's id first, then those of
    /// what the clean-up releases on its behalf and is known by elsewhere (its
    /// checkpoints, which hold image leases under their own ids).
    pub fn begin(&self, ids: Vec<String>) -> TeardownGuard<'_> {
        let mut running = self.running();
        for id in &ids {
            *running.entry(id.clone()).or_default() += 1;
        }
        self.pending.fetch_add(1, Ordering::SeqCst);
        TeardownGuard { of: self, ids }
    }

    /// Clean-ups running, one per sandbox.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }

    /// How many clean-ups have ended: a caller that saw a sandbox's reference
    /// and finds this changed since knows it may be gone.
    pub fn ended(&self) -> u64 {
        self.ended_count.load(Ordering::SeqCst)
    }

    /// Whether a clean-up running releases one of `ids`.
    pub fn any_running(&self, ids: &[String]) -> bool {
        let running = self.running();
        ids.iter().any(|id| running.contains_key(id))
    }

    /// Waits until no clean-up runs, for at most `timeout`; false if some still do.
    pub async fn wait_idle(&self, timeout: std::time::Duration) -> bool {
        self.wait_until(timeout, |_| self.pending() == 0).await
    }

    /// Waits until none of sandboxes `ids` is being cleaned up, for at most
    /// `timeout`; false if one still is. An id that is no sandbox's, or of one
    /// still running, is not waited for.
    pub async fn wait_for(&self, ids: &[String], timeout: std::time::Duration) -> bool {
        self.wait_until(timeout, |r| !ids.iter().any(|id| r.contains_key(id)))
            .await
    }

    async fn wait_until(
        &self,
        timeout: std::time::Duration,
        done: impl Fn(&HashMap<String, usize>) -> bool,
    ) -> bool {
        let wait = async {
            loop {
                // Registered before the check: an end between the two still wakes it.
                let ended = self.ended.notified();
                if done(&self.running()) {
                    return;
                }
                ended.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }
}

impl Drop for TeardownGuard<'_> {
    fn drop(&mut self) {
        {
            let mut running = self.of.running();
            for id in &self.ids {
                if let Some(n) = running.get_mut(id) {
                    *n -= 1;
                    if *n == 0 {
                        running.remove(id);
                    }
                }
            }
            self.of.pending.fetch_sub(1, Ordering::SeqCst);
            self.of.ended_count.fetch_add(1, Ordering::SeqCst);
        }
        self.of.ended.notify_waiters();
    }
}

impl AppState {
    pub fn new(
        cfg: ServerConfig,
        store: Store,
        backends: crate::isolation::Backends,
        images: crate::images::Images,
        descriptors: crate::inbound::DescriptorPlan,
        helper_exe: std::path::PathBuf,
    ) -> AppState {
        let pools = crate::pool::Pools::new(&cfg.pools);
        let create_slots = tokio::sync::Semaphore::new(cfg.runtime.create_concurrency());
        let claim_slots = tokio::sync::Semaphore::new(cfg.runtime.create_concurrency());
        let vfs = crate::vfs::VfsService::new(&cfg.data_dir, cfg.vfs.clone());
        let collection_mounts =
            crate::collection_mount::CollectionMounts::new(&cfg.data_dir, helper_exe);
        let inbound = crate::inbound::Inbound::new(&cfg.connections, descriptors.inbound);
        let egress_descriptors = sandlot_net::admission::Budget::new(descriptors.egress);
        let builds = sandlot_net::admission::KeyedCount::new(cfg.images.max_builds_per_tenant);
        AppState {
            builds,
            tenants: Default::default(),
            code_output: Default::default(),
            descriptors,
            inbound,
            egress_descriptors,
            vfs,
            collection_mounts,
            pools,
            create_slots,
            claim_slots,
            memory: Arc::new(crate::memory::Memories::new(&cfg.data_dir)),
            images: Arc::new(images),
            cfg: Arc::new(cfg),
            store: Arc::new(store),
            backends,
            metrics: Metrics::default(),
            live: Mutex::new(HashMap::new()),
            shutting_down: AtomicBool::new(false),
            net: std::sync::OnceLock::new(),
            published: crate::ports::Published::default(),
            teardowns: Teardowns::default(),
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<SandboxHandle>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn register(&self, h: Arc<SandboxHandle>) {
        self.live().insert(h.id.clone(), h);
        self.tenants.invalidate();
    }

    pub fn unregister(&self, id: &str) {
        self.live().remove(id);
        self.tenants.invalidate();
    }

    pub fn handle(&self, id: &str) -> Option<Arc<SandboxHandle>> {
        self.live().get(id).cloned()
    }

    pub fn live_ids(&self) -> Vec<String> {
        self.live().keys().cloned().collect()
    }

    pub fn all_live(&self) -> Vec<Arc<SandboxHandle>> {
        self.live().values().cloned().collect()
    }

    pub fn supervisor_settings(&self) -> SupervisorSettings {
        SupervisorSettings {
            grace: self.cfg.limits.exec_grace.duration(),
            retention: self.cfg.limits.finished_retention.duration(),
        }
    }

    pub fn set_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::Teardowns;

    fn ids(of: &[&str]) -> Vec<String> {
        of.iter().map(|s| s.to_string()).collect()
    }

    #[tokio::test]
    async fn a_wait_for_sandboxes_ends_when_their_clean_ups_do_and_not_before() {
        let t = Teardowns::default();
        let a = t.begin(ids(&["a", "cp-a1"]));
        let b = t.begin(ids(&["b"]));
        assert_eq!(t.pending(), 2, "one per sandbox, whatever it releases");
        assert!(t.any_running(&ids(&["c", "cp-a1"])));
        assert!(!t.any_running(&ids(&["c"])), "c is no clean-up's");
        // Ids with no clean-up running are not waited for.
        assert!(t.wait_for(&ids(&["c"]), Duration::ZERO).await);
        assert!(
            !t.wait_for(&ids(&["cp-a1"]), Duration::from_millis(20))
                .await
        );
        let of_a = ids(&["cp-a1"]);
        let waiting = t.wait_for(&of_a, Duration::from_secs(30));
        let end_a = async {
            tokio::task::yield_now().await;
            drop(a);
        };
        let (done, ()) = tokio::join!(waiting, end_a);
        assert!(done, "a's clean-up ended, its checkpoint's with it");
        assert!(!t.any_running(&ids(&["a", "cp-a1"])));
        assert_eq!(t.ended(), 1);
        // b's still runs: the daemon as a whole is not idle.
        assert_eq!(t.pending(), 1);
        assert!(!t.wait_idle(Duration::from_millis(20)).await);
        drop(b);
        assert!(t.wait_idle(Duration::ZERO).await);
    }

    #[tokio::test]
    async fn two_clean_ups_of_one_sandbox_are_both_waited_for() {
        let t = Teardowns::default();
        let first = t.begin(ids(&["a"]));
        let second = t.begin(ids(&["a"]));
        drop(first);
        assert!(!t.wait_for(&ids(&["a"]), Duration::from_millis(20)).await);
        drop(second);
        assert!(t.wait_for(&ids(&["a"]), Duration::ZERO).await);
        assert_eq!(t.pending(), 0);
    }

    /// Clean-ups ending on other threads while waiters check and park: no end
    /// is missed (a missed one would hold a waiter until its 30 s timeout).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_end_of_a_clean_up_is_missed_by_a_waiter_on_another_thread() {
        let t = Arc::new(Teardowns::default());
        for round in 0..300 {
            let id = format!("s{round}");
            let guard_ids = ids(&[&id]);
            let ender = {
                let t = t.clone();
                let (began_tx, began_rx) = std::sync::mpsc::channel();
                let h = std::thread::spawn(move || {
                    let g = t.begin(guard_ids);
                    began_tx.send(()).unwrap();
                    // Ends at varying points of the waiter's check and park.
                    for _ in 0..(round % 7) * 50 {
                        std::hint::spin_loop();
                    }
                    drop(g);
                });
                began_rx.recv().unwrap();
                h
            };
            assert!(
                t.wait_for(&ids(&[&id]), Duration::from_secs(30)).await,
                "round {round}"
            );
            ender.join().unwrap();
        }
        assert!(t.wait_idle(Duration::ZERO).await);
    }
}
