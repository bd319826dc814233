//! Network slots: a network namespace with a veth pair, addresses, a default route
//! and its nftables set element, built ahead of time by a background thread so that
//! creating a sandbox only claims one. Teardown is asynchronous (a worker deletes
//! the namespace, which takes the veth with it) and names are never reused within
//! a daemon's life.

use std::collections::{BTreeSet, VecDeque};
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use sandlot_proto::spec::Cidr;
use serde::{Deserialize, Serialize};

use crate::nfnl::SetElements;
use crate::nft::{TableSpec, SLOT_SET};
use crate::rtnl::{NetlinkError, Rtnl, LOOPBACK_INDEX};
use crate::NetError;

/// Where `ip netns` keeps its named namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// Name of the veth end inside the sandbox.
pub const INNER_IF: &str = "eth0";

/// One slot: namespace `name`, host-side veth `name`, a /30 of the slot subnet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    pub name: String,
    pub index: u32,
    pub host_ip: Ipv4Addr,
    pub sandbox_ip: Ipv4Addr,
}

/// Address plan of the slot subnet: slot `i` owns the /30 at `base + 4i`.
#[derive(Debug, Clone, Copy)]
pub struct AddressPlan {
    base: u32,
    slots: u32,
}

impl AddressPlan {
    pub fn new(subnet: Cidr) -> Result<AddressPlan, NetError> {
        let std::net::IpAddr::V4(a) = subnet.addr else {
            return Err(NetError::Config("network.subnet must be IPv4".into()));
        };
        if subnet.len > 28 {
            return Err(NetError::Config(format!(
                "network.subnet {subnet} is too small (at most /28)"
            )));
        }
        Ok(AddressPlan {
            base: u32::from(a),
            slots: 1 << ((32 - subnet.len as u32) - 2),
        })
    }

    pub fn capacity(&self) -> u32 {
        self.slots
    }

    /// (host side, sandbox side) of slot `i`.
    pub fn addrs(&self, i: u32) -> (Ipv4Addr, Ipv4Addr) {
        let n = self.base + 4 * i;
        (Ipv4Addr::from(n + 1), Ipv4Addr::from(n + 2))
    }
}

/// Which end of a slot a step acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The host's network namespace (the daemon's).
    Host,
    /// The slot's own namespace.
    Slot,
}

/// One step of building a slot once its namespace exists (planned as data by
/// [`build_plan`], applied in order by the pool over rtnetlink).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotStep {
    /// The veth pair: `host` in the host, `peer` inside the slot.
    Veth {
        host: String,
        peer: String,
    },
    /// IPv6 off on the host end before it comes up: otherwise the kernel gives it
    /// a link-local address and multicast and prefix routes, and every one of
    /// those routes is added to (and removed from) a list that holds one per slot.
    HostIpv6Off {
        dev: String,
    },
    Address {
        side: Side,
        dev: String,
        addr: Ipv4Addr,
        prefix: u8,
    },
    Up {
        side: Side,
        dev: String,
    },
    /// Inside the slot: the default route through the host end.
    DefaultRoute {
        via: Ipv4Addr,
    },
}

/// The steps that wire `slot` up after its namespace is created (pure).
pub fn build_plan(slot: &Slot) -> Vec<SlotStep> {
    let n = &slot.name;
    vec![
        SlotStep::Veth {
            host: n.clone(),
            peer: INNER_IF.into(),
        },
        SlotStep::HostIpv6Off { dev: n.clone() },
        SlotStep::Address {
            side: Side::Host,
            dev: n.clone(),
            addr: slot.host_ip,
            prefix: 30,
        },
        SlotStep::Up {
            side: Side::Host,
            dev: n.clone(),
        },
        SlotStep::Address {
            side: Side::Slot,
            dev: INNER_IF.into(),
            addr: slot.sandbox_ip,
            prefix: 30,
        },
        SlotStep::Up {
            side: Side::Slot,
            dev: INNER_IF.into(),
        },
        SlotStep::Up {
            side: Side::Slot,
            dev: "lo".into(),
        },
        SlotStep::DefaultRoute { via: slot.host_ip },
    ]
}

/// Applies `steps` with a netlink socket in the host and one inside the slot;
/// `host_conf` is the host's `/proc/sys/net/ipv6/conf` (`None`: no IPv6).
fn apply_plan(
    steps: &[SlotStep],
    host: &mut Rtnl,
    inside: &mut Rtnl,
    slot_ns: std::os::fd::BorrowedFd<'_>,
    host_conf: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<(), NetError> {
    for step in steps {
        match step {
            SlotStep::Veth { host: h, peer } => host.create_veth(h, peer, slot_ns)?,
            SlotStep::HostIpv6Off { dev } => {
                if let Some(conf) = host_conf {
                    write_sysctl_at(conf, &format!("{dev}/disable_ipv6"), "1").map_err(|e| {
                        NetError::Io {
                            what: format!("turn IPv6 off on interface {dev}"),
                            source: e,
                        }
                    })?;
                }
            }
            SlotStep::Address {
                side,
                dev,
                addr,
                prefix,
            } => {
                let s = if *side == Side::Host {
                    &mut *host
                } else {
                    &mut *inside
                };
                let i = s.link_index(dev)?;
                s.add_addr(i, *addr, *prefix)?;
            }
            SlotStep::Up { side, dev } => {
                let s = if *side == Side::Host {
                    &mut *host
                } else {
                    &mut *inside
                };
                let i = if dev == "lo" {
                    LOOPBACK_INDEX
                } else {
                    s.link_index(dev)?
                };
                s.set_up(i)?;
            }
            SlotStep::DefaultRoute { via } => inside.add_default_route(*via)?,
        }
    }
    Ok(())
}

/// Makes `/run/netns` a shared mount point, as `ip netns add` does, so that the
/// namespaces bound under it (and their later removal) propagate to mount
/// namespaces copied from the host's. Daemons starting together take turns (an
/// exclusive `flock` on `/run/lock/sandlot/netns-dir.lock`): two that both found it
/// no mount point each bound it onto itself, stacking two mounts.
fn prepare_netns_dir() -> Result<(), NetError> {
    use rustix::fs::{flock, FlockOperation};
    use rustix::mount::{mount_bind_recursive, mount_change, MountPropagationFlags as P};
    let io = |what: &str, e: rustix::io::Errno| NetError::Io {
        what: format!("{what} {NETNS_DIR}"),
        source: e.into(),
    };
    let lock_path = std::path::Path::new(crate::subnet::LOCK_DIR).join("netns-dir.lock");
    let lock_io = |what: &str, e: std::io::Error| NetError::Io {
        what: format!("{what} {}", lock_path.display()),
        source: e,
    };
    std::fs::create_dir_all(crate::subnet::LOCK_DIR).map_err(|e| lock_io("create", e))?;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| lock_io("open", e))?;
    // Released when `lock` is closed, at the end of this function.
    flock(&lock, FlockOperation::LockExclusive).map_err(|e| lock_io("lock", e.into()))?;
    std::fs::create_dir_all(NETNS_DIR).map_err(|e| NetError::Io {
        what: format!("create {NETNS_DIR}"),
        source: e,
    })?;
    match mount_change(NETNS_DIR, P::SHARED | P::REC) {
        Ok(()) => Ok(()),
        // Not a mount point yet: bind it onto itself first.
        Err(rustix::io::Errno::INVAL) => {
            mount_bind_recursive(NETNS_DIR, NETNS_DIR).map_err(|e| io("bind", e))?;
            mount_change(NETNS_DIR, P::SHARED | P::REC).map_err(|e| io("make shared", e))
        }
        Err(e) => Err(io("make shared", e)),
    }
}

/// Creates the named namespace `/run/netns/NAME` (what `ip netns add` does, in a
/// thread of this process), sets the slot sysctls in it, and returns a netlink
/// socket inside it.
fn create_namespace(name: &str) -> Result<Rtnl, NetError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = format!("{NETNS_DIR}/{name}");
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o000)
        .open(&path)
        .map_err(|e| NetError::Io {
            what: format!("create {path}"),
            source: e,
        })?;
    sandlot_runtime::netns::in_new_network_namespace(|| -> Result<Rtnl, NetError> {
        rustix::mount::mount_bind("/proc/thread-self/ns/net", path.as_str()).map_err(|e| {
            NetError::Io {
                what: format!("bind the new network namespace at {path}"),
                source: e.into(),
            }
        })?;
        write_slot_sysctls(name)?;
        Ok(Rtnl::open()?)
    })
    .map_err(|e| NetError::Io {
        what: format!("create network namespace {name}"),
        source: e,
    })?
}

/// Sysctls set inside each slot's namespace: binding ports below 1024 needs no
/// capability (the sandbox's root has none over this namespace), and IPv6 is off.
/// Paths are under `/proc/sys/net`. Writing `all/disable_ipv6` also sets
/// `default` (the kernel copies it), so the veth end made later starts without
/// IPv6.
///
/// Each lookup under `/proc/sys` compares against one entry per live network
/// namespace with that name, so these are few and share one open `net` directory.
pub const SLOT_SYSCTLS: &[(&str, &str)] = &[
    ("ipv4/ip_unprivileged_port_start", "0"),
    ("ipv6/conf/all/disable_ipv6", "1"),
];

/// Deletes a named network namespace as `ip netns del` does (detach its bind
/// mount under `/run/netns`, remove the file), without a process per slot: at
/// teardown of hundreds of slots the `ip` processes were most of the time. The
/// kernel frees the namespace, and the veth pair in it, once nothing holds it.
pub fn delete_netns(name: &str) -> Result<(), NetError> {
    let p = format!("{NETNS_DIR}/{name}");
    let io = |what: &str, source: std::io::Error| NetError::Io {
        what: format!("{what} {p}"),
        source,
    };
    match rustix::mount::unmount(p.as_str(), rustix::mount::UnmountFlags::DETACH) {
        Ok(()) => {}
        // Not mounted (a half-built slot): removing the file is all that is left.
        Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(io("unmount", e.into())),
    }
    match std::fs::remove_file(&p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io("remove", e)),
    }
}

/// Opens a slot's namespace (the fd a sandbox's init joins).
pub fn open_netns(name: &str) -> Result<OwnedFd, NetError> {
    let p = format!("{NETNS_DIR}/{name}");
    std::fs::File::open(&p)
        .map(OwnedFd::from)
        .map_err(|e| NetError::Io {
            what: format!("open {p}"),
            source: e,
        })
}

/// Writes the slot sysctls; the calling thread is inside the slot's namespace.
fn write_slot_sysctls(name: &str) -> Result<(), NetError> {
    let net = open_dir("/proc/sys/net").map_err(|e| NetError::Io {
        what: format!("open /proc/sys/net in netns {name}"),
        source: e,
    })?;
    for (k, v) in SLOT_SYSCTLS {
        if let Err(e) = write_sysctl_at(net.as_fd(), k, v) {
            // IPv6 may be compiled out; then there is nothing to disable.
            if !k.contains("ipv6") {
                return Err(NetError::Io {
                    what: format!("write /proc/sys/net/{k} in netns {name}"),
                    source: e,
                });
            }
        }
    }
    Ok(())
}

fn open_dir(path: &str) -> std::io::Result<OwnedFd> {
    use rustix::fs::{open, Mode, OFlags};
    Ok(open(
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Writes `value` to the sysctl file `rel` under the directory `dir`.
fn write_sysctl_at(dir: BorrowedFd<'_>, rel: &str, value: &str) -> std::io::Result<()> {
    use rustix::fs::{openat, Mode, OFlags};
    let fd = openat(dir, rel, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())?;
    rustix::io::write(&fd, value.as_bytes())?;
    Ok(())
}

/// Names of slot namespaces and host links starting with `prefix`.
pub fn existing(prefix: &str) -> (Vec<String>, Vec<String>) {
    let ns = std::fs::read_dir(NETNS_DIR)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default();
    let links = std::fs::read_dir("/sys/class/net")
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default();
    (ns, links)
}

struct PoolState {
    ready: VecDeque<Slot>,
    /// Indices of slots that exist (ready, claimed, or being torn down).
    used: BTreeSet<u32>,
    next_index: u32,
    counter: u32,
    stopping: bool,
    /// Slots being built or torn down right now.
    busy: usize,
    last_error: Option<String>,
}

struct PoolInner {
    prefix: String,
    plan: AddressPlan,
    target: usize,
    table: TableSpec,
    /// The host's `/proc/sys/net/ipv6/conf` (`None` without IPv6), opened once:
    /// looking up its path per slot would cost as much as the write.
    host_ipv6_conf: Option<OwnedFd>,
    /// The `NETLINK_NETFILTER` socket for the slot set's elements, kept open across
    /// builds and teardowns. When such a socket closes, the kernel flushes the
    /// nf_tables destroy work (an RCU grace period, 8 ms on the CI machine) while
    /// holding the table commit mutex, which creating any veth also takes: a socket
    /// per operation stalled every slot build and the teardowns behind it.
    set: Mutex<Option<SetElements>>,
    state: Mutex<PoolState>,
    cv: Condvar,
    teardown: Mutex<Option<mpsc::Sender<Slot>>>,
}

/// How long a claim waits, with every address in use, for slots being torn down
/// or built (each takes milliseconds) to give one back.
pub const EXHAUSTED_WAIT: Duration = Duration::from_secs(2);

/// The pool of pre-built slots.
#[derive(Clone)]
pub struct SlotPool {
    inner: Arc<PoolInner>,
}

impl SlotPool {
    /// Starts the builder and teardown threads. `keep` are slots of sandboxes that
    /// survived a daemon restart; every other slot with `prefix` is deleted.
    pub fn start(
        prefix: &str,
        plan: AddressPlan,
        target: usize,
        table: TableSpec,
        keep: &[Slot],
    ) -> SlotPool {
        let (ns, links) = existing(prefix);
        let max_seen = ns
            .iter()
            .chain(links.iter())
            .filter_map(|n| u32::from_str_radix(&n[prefix.len()..], 16).ok())
            .max();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(0);
        // Past every name still around, and past names of a previous run (time-based).
        let counter = max_seen.map_or(0, |m| m + 1).max((now & 0xffff) << 8) & 0xffffff;
        let (tx, rx) = mpsc::channel::<Slot>();
        let inner = Arc::new(PoolInner {
            prefix: prefix.to_string(),
            plan,
            target,
            table,
            host_ipv6_conf: open_dir("/proc/sys/net/ipv6/conf").ok(),
            set: Mutex::new(None),
            state: Mutex::new(PoolState {
                ready: VecDeque::new(),
                used: keep.iter().map(|s| s.index).collect(),
                next_index: 0,
                counter,
                stopping: false,
                busy: 0,
                last_error: None,
            }),
            cv: Condvar::new(),
            teardown: Mutex::new(Some(tx)),
        });
        let pool = SlotPool { inner };
        // Leftovers no sandbox claims.
        let kept: BTreeSet<&str> = keep.iter().map(|s| s.name.as_str()).collect();
        for n in ns.iter().filter(|n| !kept.contains(n.as_str())) {
            tracing::info!(netns = %n, "deleting a leftover network slot");
            if let Err(e) = delete_netns(n) {
                tracing::warn!(netns = %n, "delete a leftover network slot: {e}");
            }
        }
        if let Err(e) = prepare_netns_dir() {
            tracing::warn!("{e}");
        }
        let stray: Vec<&String> = links
            .iter()
            .filter(|l| !kept.contains(l.as_str()) && !ns.contains(l))
            .collect();
        if !stray.is_empty() {
            match Rtnl::open() {
                Ok(mut rt) => {
                    for l in stray {
                        if let Err(e) = rt.delete_link(l) {
                            tracing::warn!(link = %l, "delete a leftover slot interface: {e}");
                        }
                    }
                }
                Err(e) => tracing::warn!("delete leftover slot interfaces: {e}"),
            }
        }
        {
            let p = pool.clone();
            std::thread::Builder::new()
                .name("net-teardown".into())
                .spawn(move || {
                    // Whatever queued up meanwhile is torn down as one batch: one
                    // nf_tables transaction for all of its set elements (a process per slot was
                    // most of the cost of tearing down hundreds of sandboxes).
                    while let Ok(first) = rx.recv() {
                        let mut batch = vec![first];
                        batch.extend(rx.try_iter().take(511));
                        p.destroy_batch(&batch);
                        let mut st = p.lock();
                        for slot in &batch {
                            st.used.remove(&slot.index);
                        }
                        st.busy -= batch.len();
                        p.inner.cv.notify_all();
                    }
                })
                .expect("spawn teardown thread");
        }
        if target > 0 {
            let p = pool.clone();
            std::thread::Builder::new()
                .name("net-pool".into())
                .spawn(move || p.fill())
                .expect("spawn pool thread");
        }
        pool
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves a name and an index.
    fn reserve(&self, st: &mut PoolState) -> Result<Slot, NetError> {
        let cap = self.inner.plan.capacity();
        let mut idx = None;
        for k in 0..cap {
            let i = (st.next_index + k) % cap;
            if !st.used.contains(&i) {
                idx = Some(i);
                break;
            }
        }
        let index = idx.ok_or(NetError::Exhausted)?;
        st.next_index = (index + 1) % cap;
        st.used.insert(index);
        let name = format!("{}{:06x}", self.inner.prefix, st.counter);
        st.counter = (st.counter + 1) & 0xffffff;
        let (host_ip, sandbox_ip) = self.inner.plan.addrs(index);
        st.busy += 1;
        Ok(Slot {
            name,
            index,
            host_ip,
            sandbox_ip,
        })
    }

    /// Runs `f` on the slot set's kept socket, opening it first if needed. A
    /// socket that failed other than by a kernel refusal is not reused.
    fn with_set(
        &self,
        f: impl FnOnce(&mut SetElements) -> Result<(), NetlinkError>,
    ) -> Result<(), NetlinkError> {
        let mut kept = self.inner.set.lock().unwrap_or_else(|e| e.into_inner());
        let set = match kept.as_mut() {
            Some(s) => s,
            None => kept.insert(SetElements::open(&self.inner.table.table, SLOT_SET)?),
        };
        let r = f(set);
        if matches!(r, Err(ref e) if e.errno().is_none()) {
            *kept = None;
        }
        r
    }

    /// Builds a slot; on failure removes what was built.
    fn build(&self, slot: &Slot) -> Result<(), NetError> {
        let r = (|| {
            let mut inside = create_namespace(&slot.name)?;
            let ns = open_netns(&slot.name)?;
            let mut host = Rtnl::open()?;
            apply_plan(
                &build_plan(slot),
                &mut host,
                &mut inside,
                ns.as_fd(),
                self.inner.host_ipv6_conf.as_ref().map(|f| f.as_fd()),
            )?;
            self.with_set(|set| set.add(&[(slot.name.clone(), slot.sandbox_ip)]))?;
            Ok(())
        })();
        if r.is_err() {
            let _ = delete_netns(&slot.name);
        }
        r
    }

    fn destroy(&self, slot: &Slot) {
        self.destroy_batch(std::slice::from_ref(slot));
    }

    /// Removes the set elements of `slots` in one nf_tables transaction, then their
    /// namespaces.
    fn destroy_batch(&self, slots: &[Slot]) {
        let entries: Vec<_> = slots
            .iter()
            .map(|s| (s.name.clone(), s.sandbox_ip))
            .collect();
        let all = self.with_set(|set| set.delete(&entries));
        if let Err(e) = all {
            // One missing element fails the whole transaction (e.g. a slot whose
            // build failed half-way): fall back to one per slot.
            if e.errno().is_none() {
                tracing::warn!("delete the rules of {} network slots: {e}", entries.len());
            } else {
                tracing::debug!("delete the rules of {} network slots: {e}", entries.len());
            }
            for e in &entries {
                if let Err(err) = self.with_set(|set| set.delete(std::slice::from_ref(e))) {
                    tracing::debug!(netns = %e.0, "delete the rules of a network slot: {err}");
                }
            }
        }
        for slot in slots {
            self.delete_namespace(slot);
        }
    }

    fn delete_namespace(&self, slot: &Slot) {
        // Deleting the namespace destroys the veth pair with it (asynchronously in
        // the kernel, without the synchronous cost of `ip link del`).
        if let Err(e) = delete_netns(&slot.name) {
            tracing::warn!(netns = %slot.name, "delete network slot: {e}");
        }
    }

    fn fill(&self) {
        loop {
            let slot = {
                let mut st = self.lock();
                while !st.stopping && st.ready.len() >= self.inner.target {
                    st = self.inner.cv.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                if st.stopping {
                    return;
                }
                match self.reserve(&mut st) {
                    Ok(s) => s,
                    Err(e) => {
                        st.last_error = Some(e.to_string());
                        drop(st);
                        std::thread::sleep(Duration::from_secs(1));
                        continue;
                    }
                }
            };
            let r = self.build(&slot);
            let mut st = self.lock();
            if r.is_ok() && st.stopping {
                // Built while the pool was stopping: it goes straight to teardown,
                // still counted busy until the worker has deleted it.
                drop(st);
                self.send(slot);
                return;
            }
            st.busy -= 1;
            match r {
                Ok(()) => {
                    st.last_error = None;
                    st.ready.push_back(slot);
                }
                Err(e) => {
                    tracing::warn!("build network slot {}: {e}", slot.name);
                    st.used.remove(&slot.index);
                    st.last_error = Some(e.to_string());
                    drop(st);
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            }
            self.inner.cv.notify_all();
        }
    }

    /// Takes a ready slot, or builds one now if the pool is empty. With every
    /// address of the subnet in use, it waits (at most [`EXHAUSTED_WAIT`]) while
    /// slots are being torn down or built: a slot released just before gives its
    /// address back once its teardown ends, and the builder may have taken that
    /// address for a ready slot. A cold create holds the daemon's create permit
    /// meanwhile, so the wait is short and happens only at capacity.
    pub fn claim(&self) -> Result<Slot, NetError> {
        let slot = {
            let deadline = Instant::now() + EXHAUSTED_WAIT;
            let mut st = self.lock();
            loop {
                if st.stopping {
                    return Err(NetError::Stopping);
                }
                if let Some(s) = st.ready.pop_front() {
                    self.inner.cv.notify_all();
                    return Ok(s);
                }
                match self.reserve(&mut st) {
                    Ok(slot) => break slot,
                    Err(NetError::Exhausted) if st.busy > 0 => {
                        st = self.wait_until(st, deadline).ok_or(NetError::Exhausted)?;
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let r = self.build(&slot);
        let mut st = self.lock();
        st.busy -= 1;
        if r.is_err() {
            st.used.remove(&slot.index);
        }
        self.inner.cv.notify_all();
        r.map(|()| slot)
    }

    /// Hands a slot to the teardown worker.
    pub fn release(&self, slot: Slot) {
        self.lock().busy += 1;
        self.send(slot);
    }

    /// Sends a slot already counted busy to the teardown worker.
    fn send(&self, slot: Slot) {
        let tx = self
            .inner
            .teardown
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        match tx {
            Some(tx) => {
                if let Err(mpsc::SendError(slot)) = tx.send(slot) {
                    self.destroy(&slot);
                    self.destroyed_here();
                }
            }
            None => {
                self.destroy(&slot);
                self.destroyed_here();
            }
        }
    }

    /// Counts a slot destroyed on this thread (no teardown worker) as done.
    fn destroyed_here(&self) {
        let mut st = self.lock();
        st.busy -= 1;
        self.inner.cv.notify_all();
    }

    /// Number of ready slots.
    pub fn ready(&self) -> usize {
        self.lock().ready.len()
    }

    /// Waits until `n` slots are ready (or `timeout` passes).
    pub fn wait_ready(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        while st.ready.len() < n {
            match self.wait_until(st, deadline) {
                Some(next) => st = next,
                None => return false,
            }
        }
        true
    }

    /// Waits for the pool's state to change, at most until `deadline`; `None`
    /// once it has passed.
    fn wait_until<'a>(
        &self,
        st: std::sync::MutexGuard<'a, PoolState>,
        deadline: Instant,
    ) -> Option<std::sync::MutexGuard<'a, PoolState>> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        Some(
            self.inner
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0,
        )
    }

    /// Stops building, deletes the ready slots and waits (bounded) for pending
    /// teardowns.
    pub fn stop(&self, timeout: Duration) {
        let ready: Vec<Slot> = {
            let mut st = self.lock();
            st.stopping = true;
            self.inner.cv.notify_all();
            st.ready.drain(..).collect()
        };
        for s in ready {
            self.release(s);
        }
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        while st.busy > 0 {
            let pending = st.busy;
            match self.wait_until(st, deadline) {
                Some(next) => st = next,
                None => {
                    tracing::warn!(pending, "network slots still being built or torn down");
                    break;
                }
            }
        }
    }

    pub fn last_error(&self) -> Option<String> {
        self.lock().last_error.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_disjoint_slash_30s() {
        let p = AddressPlan::new(Cidr::parse("100.96.0.0/16").unwrap()).unwrap();
        assert_eq!(p.capacity(), 16384);
        assert_eq!(
            p.addrs(0),
            (Ipv4Addr::new(100, 96, 0, 1), Ipv4Addr::new(100, 96, 0, 2))
        );
        assert_eq!(
            p.addrs(1),
            (Ipv4Addr::new(100, 96, 0, 5), Ipv4Addr::new(100, 96, 0, 6))
        );
        assert_eq!(p.addrs(16383).1, Ipv4Addr::new(100, 96, 255, 254));
        assert!(AddressPlan::new(Cidr::parse("10.0.0.0/30").unwrap()).is_err());
        assert!(AddressPlan::new(Cidr::parse("fd00::/64").unwrap()).is_err());
    }

    #[test]
    fn build_plan_wires_the_veth_first_and_routes_last() {
        let s = Slot {
            name: "snab12cd00000a".into(),
            index: 2,
            host_ip: Ipv4Addr::new(100, 96, 0, 9),
            sandbox_ip: Ipv4Addr::new(100, 96, 0, 10),
        };
        let p = build_plan(&s);
        assert_eq!(
            p[0],
            SlotStep::Veth {
                host: s.name.clone(),
                peer: "eth0".into()
            }
        );
        assert!(p.contains(&SlotStep::Address {
            side: Side::Host,
            dev: s.name.clone(),
            addr: s.host_ip,
            prefix: 30
        }));
        assert!(p.contains(&SlotStep::Address {
            side: Side::Slot,
            dev: "eth0".into(),
            addr: s.sandbox_ip,
            prefix: 30
        }));
        // Both ends and the slot's loopback come up before the route is added.
        let route = p.len() - 1;
        assert_eq!(p[route], SlotStep::DefaultRoute { via: s.host_ip });
        for dev in [s.name.as_str(), "eth0", "lo"] {
            let up = p
                .iter()
                .position(|x| matches!(x, SlotStep::Up { dev: d, .. } if d == dev))
                .unwrap();
            assert!(up < route);
        }
        assert!(s.name.len() <= 15, "interface names are at most 15 bytes");
        // IPv6 is off on the host end before it comes up (up is when the kernel
        // would add its addresses and routes).
        let off = p
            .iter()
            .position(|x| {
                x == &SlotStep::HostIpv6Off {
                    dev: s.name.clone(),
                }
            })
            .expect("the host end's IPv6 is turned off");
        let host_up = p
            .iter()
            .position(|x| {
                matches!(
                    x,
                    SlotStep::Up {
                        side: Side::Host,
                        ..
                    }
                )
            })
            .unwrap();
        assert!(0 < off && off < host_up, "{p:?}");
    }
}
