//! Counted admission of things that hold the daemon's descriptors: connections of
//! the egress proxy and DNS queries in flight (this crate), connections of the
//! daemon's TCP listeners (`sandlot-server`). Pure bookkeeping, no I/O.
//!
//! A [`Budget`] is a share of the daemon's open-file limit, counted in
//! descriptors; a [`KeyedCount`] caps what one key (a sandbox, a tenant, a client
//! address) holds at once. A lease gives back what it took when it is dropped, so
//! whatever path a connection ends by, its count goes with it.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A number of descriptors that holders take from and give back.
#[derive(Debug)]
pub struct Budget {
    cap: usize,
    used: AtomicUsize,
}

impl Budget {
    pub fn new(cap: usize) -> Arc<Budget> {
        Arc::new(Budget {
            cap,
            used: AtomicUsize::new(0),
        })
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Descriptors held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `n` descriptors, or none if that would pass the cap.
    pub fn try_take(self: &Arc<Self>, n: usize) -> Option<BudgetLease> {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            if cur + n > self.cap {
                return None;
            }
            match self
                .used
                .compare_exchange_weak(cur, cur + n, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    return Some(BudgetLease {
                        budget: self.clone(),
                        n,
                    })
                }
                Err(now) => cur = now,
            }
        }
    }
}

/// Descriptors taken from a [`Budget`], given back on drop.
#[derive(Debug)]
pub struct BudgetLease {
    budget: Arc<Budget>,
    n: usize,
}

impl Drop for BudgetLease {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.n, Ordering::AcqRel);
    }
}

/// How many things each key holds, each under one cap. Keys holding nothing are
/// forgotten, so the map is as large as the number of keys holding something.
#[derive(Debug)]
pub struct KeyedCount<K: Eq + Hash> {
    cap: usize,
    held: Mutex<HashMap<K, usize>>,
}

impl<K: Eq + Hash + Clone> KeyedCount<K> {
    pub fn new(cap: usize) -> Arc<KeyedCount<K>> {
        Arc::new(KeyedCount {
            cap,
            held: Mutex::new(HashMap::new()),
        })
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// What `key` holds now.
    pub fn held(&self, key: &K) -> usize {
        self.lock().get(key).copied().unwrap_or(0)
    }

    /// Keys holding something now.
    pub fn keys(&self) -> usize {
        self.lock().len()
    }

    /// What all keys hold together.
    pub fn total(&self) -> usize {
        self.lock().values().sum()
    }

    /// One more for `key`, or `Err(held)` when it holds its cap already.
    pub fn try_take(self: &Arc<Self>, key: &K) -> Result<KeyLease<K>, usize> {
        let mut m = self.lock();
        let n = m.entry(key.clone()).or_insert(0);
        if *n >= self.cap {
            let held = *n;
            if held == 0 {
                m.remove(key);
            }
            return Err(held);
        }
        *n += 1;
        Ok(KeyLease {
            count: self.clone(),
            key: key.clone(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, usize>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One thing held by a key of a [`KeyedCount`], given back on drop.
#[derive(Debug)]
pub struct KeyLease<K: Eq + Hash + Clone> {
    count: Arc<KeyedCount<K>>,
    key: K,
}

impl<K: Eq + Hash + Clone> Drop for KeyLease<K> {
    fn drop(&mut self) {
        let mut m = self.count.lock();
        if let Some(n) = m.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.key);
            }
        }
    }
}

/// The key of a client address for per-address caps: an IPv4 address, or the /64
/// of an IPv6 one (one host usually has a whole /64). IPv4-mapped IPv6 addresses
/// count as their IPv4 address.
pub fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// Which limit refused a connection or query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The sandbox holds its cap.
    Sandbox { held: usize, cap: usize },
    /// The sandbox's tenant holds its cap (all its sandboxes together).
    Tenant { held: usize, cap: usize },
    /// The daemon's descriptors for this kind of connection are all taken.
    Host { cap: usize },
}

impl Refusal {
    /// The label of the refusal in metrics.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Sandbox { .. } => "sandbox",
            Refusal::Tenant { .. } => "tenant",
            Refusal::Host { .. } => "host",
        }
    }
}

/// What an admitted connection or query holds until it is dropped.
#[derive(Debug)]
pub struct Admitted {
    _sandbox: KeyLease<String>,
    _tenant: KeyLease<String>,
    _budget: BudgetLease,
}

/// Caps of one kind of egress work (proxied connections, or DNS queries in
/// flight): per sandbox, per tenant, and descriptors from the daemon's budget.
#[derive(Debug)]
pub struct EgressCaps {
    pub per_sandbox: Arc<KeyedCount<String>>,
    pub per_tenant: Arc<KeyedCount<String>>,
    /// Descriptors one admission takes from `budget`.
    pub descriptors: usize,
    pub budget: Arc<Budget>,
}

impl EgressCaps {
    pub fn new(
        per_sandbox: usize,
        per_tenant: usize,
        descriptors: usize,
        budget: Arc<Budget>,
    ) -> EgressCaps {
        EgressCaps {
            per_sandbox: KeyedCount::new(per_sandbox),
            per_tenant: KeyedCount::new(per_tenant),
            descriptors,
            budget,
        }
    }

    /// Admits one more for `sandbox` of `tenant`, or says which limit refused it.
    /// Nothing is held after a refusal.
    pub fn admit(&self, sandbox: &str, tenant: &str) -> Result<Admitted, Refusal> {
        let s = self
            .per_sandbox
            .try_take(&sandbox.to_string())
            .map_err(|held| Refusal::Sandbox {
                held,
                cap: self.per_sandbox.cap(),
            })?;
        let t = self
            .per_tenant
            .try_take(&tenant.to_string())
            .map_err(|held| Refusal::Tenant {
                held,
                cap: self.per_tenant.cap(),
            })?;
        let b = self
            .budget
            .try_take(self.descriptors)
            .ok_or(Refusal::Host {
                cap: self.budget.cap(),
            })?;
        Ok(Admitted {
            _sandbox: s,
            _tenant: t,
            _budget: b,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_never_passes_its_cap_and_leases_give_back() {
        let b = Budget::new(5);
        let a = b.try_take(2).unwrap();
        let c = b.try_take(3).unwrap();
        assert!(b.try_take(1).is_none());
        assert_eq!(b.used(), 5);
        drop(a);
        assert_eq!(b.used(), 3);
        assert!(b.try_take(3).is_none(), "2 free, 3 asked");
        let d = b.try_take(2).unwrap();
        drop((c, d));
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn keyed_counts_cap_each_key_and_forget_idle_keys() {
        let k = KeyedCount::<&str>::new(2);
        let a1 = k.try_take(&"a").unwrap();
        let a2 = k.try_take(&"a").unwrap();
        assert_eq!(k.try_take(&"a").unwrap_err(), 2);
        let b1 = k.try_take(&"b").unwrap();
        assert_eq!((k.held(&"a"), k.held(&"b"), k.keys()), (2, 1, 2));
        drop(a1);
        let a3 = k.try_take(&"a").unwrap();
        drop((a2, a3, b1));
        assert_eq!(k.keys(), 0, "keys holding nothing are forgotten");
        let z = KeyedCount::<&str>::new(0);
        assert_eq!(z.try_take(&"x").unwrap_err(), 0);
        assert_eq!(z.keys(), 0, "a refused key is not remembered");
    }

    #[test]
    fn egress_caps_refuse_by_sandbox_then_tenant_then_host_and_hold_nothing_after() {
        let budget = Budget::new(10);
        let caps = EgressCaps::new(2, 3, 2, budget.clone());
        let s1a = caps.admit("s1", "t").unwrap();
        let s1b = caps.admit("s1", "t").unwrap();
        assert_eq!(
            caps.admit("s1", "t").unwrap_err(),
            Refusal::Sandbox { held: 2, cap: 2 }
        );
        let s2a = caps.admit("s2", "t").unwrap();
        assert_eq!(
            caps.admit("s2", "t").unwrap_err(),
            Refusal::Tenant { held: 3, cap: 3 }
        );
        // The sandbox's count taken before the tenant refused is given back.
        assert_eq!(caps.per_sandbox.held(&"s2".to_string()), 1);
        assert_eq!(budget.used(), 6);
        let o1 = caps.admit("o1", "other").unwrap();
        let o2 = caps.admit("o2", "other").unwrap();
        assert_eq!(budget.used(), 10);
        assert_eq!(
            caps.admit("o3", "other").unwrap_err(),
            Refusal::Host { cap: 10 }
        );
        assert_eq!(caps.per_tenant.held(&"other".to_string()), 2);
        drop((s1a, s1b, s2a, o1, o2));
        assert_eq!(budget.used(), 0);
        assert_eq!((caps.per_sandbox.keys(), caps.per_tenant.keys()), (0, 0));
        assert_eq!(Refusal::Tenant { held: 1, cap: 1 }.label(), "tenant");
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(address_key(a), address_key(b));
        assert_ne!(address_key(a), address_key(c));
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        assert_eq!(address_key(v4), v4);
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(address_key(mapped), v4);
    }
}
