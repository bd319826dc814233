//! Network egress for Sandlot sandboxes, enforced outside the sandbox.
//!
//! A sandbox with network mode `allow` or `open` runs in a network namespace that
//! the daemon built (a *slot*, see [`slots`]) and that the sandbox's user namespace
//! does not own, so root inside cannot change its addresses, routes or rules. The
//! only ways out of a slot are the daemon's DNS resolver ([`resolver`]) and its
//! transparent TCP proxy ([`proxy`]); the nftables table of the daemon ([`nft`])
//! redirects DNS and TCP to them and drops everything else. Both check the
//! sandbox's [`policy::Policy`] on every query and connection and report each to
//! an [`AuditSink`]. See `docs/networking.md`.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use sandlot_proto::spec::{Cidr, NetworkMode, NetworkSpec, SpecError};
use sandlot_proto::units::Seconds;
use serde::{Deserialize, Serialize};

pub mod admission;
pub mod audit_rate;
pub mod dns;
pub mod nfnl;
pub mod nft;
pub mod policy;
pub mod proxy;
pub mod resolver;
pub mod rtnl;
pub mod slots;
pub mod sniff;
pub mod subnet;

use admission::{Budget, EgressCaps, Refusal};
use policy::{Ceiling, Policy};
use proxy::{RelayEnd, RelayTimeouts};
use slots::{AddressPlan, Slot, SlotPool};

/// Errors of the network layer.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("{cmd}: {message}")]
    Command { cmd: String, message: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("network config: {0}")]
    Config(String),
    #[error("no free network slot addresses (network.subnet is full)")]
    Exhausted,
    #[error("the network service is stopping")]
    Stopping,
    #[error("sandbox {0} has no network slot")]
    NotAttached(String),
    #[error(transparent)]
    Netlink(#[from] rtnl::NetlinkError),
}

/// Operator settings (`[network]` in the daemon's TOML).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct NetConfig {
    /// Network of sandboxes whose create request has no `network`.
    pub default: NetworkSpec,
    /// The most a sandbox may ask for: `none`, `allow` or `open`.
    pub ceiling: NetworkMode,
    /// Resolvers the daemon forwards allowed queries to (`IP:PORT`). Empty: the
    /// `nameserver` lines of the host's `/etc/resolv.conf`.
    pub upstream_dns: Vec<SocketAddr>,
    /// Private ranges (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7, ...) that
    /// sandboxes may reach when their policy allows. Link-local, metadata, loopback,
    /// the host's own addresses and other sandboxes are never reachable.
    pub allow_private: Vec<String>,
    /// IPv4 subnet the slots' /30s are carved from, or `"auto"` (the default): the
    /// first /16 of `100.96.0.0/11` that no other daemon on the host holds or routes
    /// (see [`subnet`]).
    pub subnet: String,
    /// Slots kept built ahead of time.
    pub pool_size: usize,
    /// TCP connections one sandbox may have open through the proxy at once (each
    /// holds two of the daemon's descriptors); more are reset and logged.
    pub max_connections_per_sandbox: usize,
    /// The same for all the sandboxes of one tenant together.
    pub max_connections_per_tenant: usize,
    /// DNS queries of one sandbox the resolver works on at once; more are answered
    /// REFUSED and logged.
    pub max_dns_per_sandbox: usize,
    /// The same for all the sandboxes of one tenant together.
    pub max_dns_per_tenant: usize,
    /// A proxied connection with no byte either way for this long is closed.
    pub idle_timeout: Seconds,
    /// Once one side of a proxied connection has closed, the other direction is
    /// closed when it has been silent this long.
    pub half_close_timeout: Seconds,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            default: NetworkSpec::default(),
            ceiling: NetworkMode::Open,
            upstream_dns: Vec::new(),
            allow_private: Vec::new(),
            subnet: subnet::AUTO.into(),
            pool_size: 4,
            max_connections_per_sandbox: 256,
            max_connections_per_tenant: 1024,
            max_dns_per_sandbox: 32,
            max_dns_per_tenant: 128,
            idle_timeout: Seconds::secs(15 * 60),
            half_close_timeout: Seconds::secs(30),
        }
    }
}

impl NetConfig {
    /// Checks values serde cannot; errors name the key.
    pub fn validate(&self) -> Result<(), NetError> {
        self.default
            .validate()
            .map_err(|e| NetError::Config(format!("network.default.{e}")))?;
        if self.default.mode > self.ceiling {
            return Err(NetError::Config(format!(
                "network.default mode {:?} is above network.ceiling {:?}",
                self.default.mode.as_str(),
                self.ceiling.as_str()
            )));
        }
        for (i, c) in self.allow_private.iter().enumerate() {
            Cidr::parse(c)
                .map_err(|e| NetError::Config(format!("network.allow_private[{i}]: {e}")))?;
        }
        if self.subnet != subnet::AUTO {
            let s = Cidr::parse(&self.subnet).map_err(|e| {
                NetError::Config(format!(
                    "network.subnet: {e} (or \"{}\" to let the daemon choose)",
                    subnet::AUTO
                ))
            })?;
            AddressPlan::new(s)?;
        }
        if self.pool_size > 256 {
            return Err(NetError::Config("network.pool_size: at most 256".into()));
        }
        for (k, v) in [
            (
                "max_connections_per_sandbox",
                self.max_connections_per_sandbox,
            ),
            (
                "max_connections_per_tenant",
                self.max_connections_per_tenant,
            ),
            ("max_dns_per_sandbox", self.max_dns_per_sandbox),
            ("max_dns_per_tenant", self.max_dns_per_tenant),
        ] {
            if v == 0 {
                return Err(NetError::Config(format!("network.{k}: must be at least 1")));
            }
        }
        if self.idle_timeout.0.is_zero() || self.half_close_timeout.0.is_zero() {
            return Err(NetError::Config(
                "network.idle_timeout and network.half_close_timeout must be positive".into(),
            ));
        }
        Ok(())
    }

    fn upstreams(&self) -> Vec<SocketAddr> {
        if !self.upstream_dns.is_empty() {
            return self.upstream_dns.clone();
        }
        std::fs::read_to_string("/etc/resolv.conf")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().strip_prefix("nameserver"))
            .filter_map(|a| a.trim().parse::<IpAddr>().ok())
            .filter(|a| !a.is_loopback())
            .map(|a| SocketAddr::new(a, 53))
            .collect()
    }
}

/// What a sandbox's egress attempt was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Dns,
    Tcp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Allowed,
    Denied,
    /// Allowed by policy but it failed (upstream unreachable, refused, timed out).
    Failed,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Denied => "denied",
            Decision::Failed => "failed",
        }
    }
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Dns => "dns",
            EventKind::Tcp => "tcp",
        }
    }
}

/// One DNS query or TCP connection attempt of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEvent {
    pub sandbox: String,
    /// Milliseconds since the Unix epoch.
    pub at_ms: i64,
    pub kind: EventKind,
    /// The name asked (DNS) or presented (TLS SNI, HTTP Host).
    pub name: Option<String>,
    /// Destination address (TCP: the one the sandbox dialled, or the one the proxy
    /// connected to when allowed).
    pub addr: Option<IpAddr>,
    pub port: Option<u16>,
    pub decision: Decision,
    /// Why (`no rule allows denied.test:443`, `qtype TXT`, ...).
    pub reason: String,
    /// Bytes from the sandbox / to the sandbox.
    pub bytes_out: u64,
    pub bytes_in: u64,
}

/// Where audit events go (the daemon writes them to SQLite).
pub trait AuditSink: Send + Sync {
    fn record(&self, ev: AuditEvent);
}

pub use sandlot_proto::clock::now_ms;

/// A sandbox with a slot.
pub struct Attached {
    pub sandbox: String,
    /// The sandbox's tenant: its connections and queries count against the
    /// tenant's caps too (a pooled sandbox gets it when claimed).
    tenant: RwLock<String>,
    pub slot: Slot,
    spec: RwLock<NetworkSpec>,
    policy: RwLock<Arc<Policy>>,
    /// Bumped on every policy change; open connections re-check themselves.
    pub generation: tokio::sync::watch::Sender<u64>,
    refusals: RefusalLog,
}

impl Attached {
    pub fn policy(&self) -> Arc<Policy> {
        self.policy
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
    pub fn spec(&self) -> NetworkSpec {
        self.spec.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub fn tenant(&self) -> String {
        self.tenant
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
    pub fn set_tenant(&self, tenant: &str) {
        *self.tenant.write().unwrap_or_else(|e| e.into_inner()) = tenant.to_string();
    }
}

/// What a sandbox's runtime needs to use its slot.
pub struct Attachment {
    pub netns: OwnedFd,
    pub nameserver: IpAddr,
    pub slot: Slot,
}

/// The host's own addresses (cached briefly): never a destination.
pub struct LocalAddrs {
    cache: RwLock<(Instant, Vec<IpAddr>)>,
}

impl LocalAddrs {
    fn new() -> LocalAddrs {
        LocalAddrs {
            cache: RwLock::new((Instant::now() - Duration::from_secs(60), Vec::new())),
        }
    }

    /// Local IPv4 addresses from `/proc/net/fib_trie` (entries `/32 host LOCAL`).
    pub fn parse_fib_trie(text: &str) -> Vec<IpAddr> {
        let mut out = Vec::new();
        let mut last: Option<IpAddr> = None;
        for l in text.lines() {
            let t = l.trim_start_matches([' ', '|', '+', '-']);
            if let Ok(a) = t.trim().parse::<IpAddr>() {
                last = Some(a);
            } else if l.contains("/32 host LOCAL") {
                if let Some(a) = last {
                    if !out.contains(&a) {
                        out.push(a);
                    }
                }
            }
        }
        out
    }

    pub fn get(&self) -> Vec<IpAddr> {
        {
            let c = self.cache.read().unwrap_or_else(|e| e.into_inner());
            if c.0.elapsed() < Duration::from_secs(1) {
                return c.1.clone();
            }
        }
        let v = LocalAddrs::parse_fib_trie(
            &std::fs::read_to_string("/proc/net/fib_trie").unwrap_or_default(),
        );
        *self.cache.write().unwrap_or_else(|e| e.into_inner()) = (Instant::now(), v.clone());
        v
    }
}

/// State shared by the resolver and the proxy.
pub struct Shared {
    by_addr: RwLock<HashMap<Ipv4Addr, Arc<Attached>>>,
    pub ceiling: Ceiling,
    pub locals: LocalAddrs,
    pub upstream: Vec<SocketAddr>,
    pub audit: Arc<dyn AuditSink>,
    /// Proxied connections: two descriptors each.
    pub conns: EgressCaps,
    /// DNS queries in flight: one descriptor each (the upstream socket).
    pub dns: EgressCaps,
    pub timeouts: RelayTimeouts,
    pub stats: EgressStats,
    /// Each sandbox's budget of audit entries ([`audit_rate`]).
    pub audit_budget: std::sync::Mutex<audit_rate::AuditBudgets>,
}

impl Shared {
    /// The sandbox a packet from `ip` belongs to.
    pub fn sandbox_at(&self, ip: IpAddr) -> Option<Arc<Attached>> {
        let IpAddr::V4(v4) = ip else { return None };
        self.by_addr
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&v4)
            .cloned()
    }

    /// Counts a connection or query a cap refused, and logs it in the sandbox's
    /// audit log (at most one entry a second per kind, naming how many refusals
    /// it stands for).
    pub fn refused(
        &self,
        sb: &Attached,
        kind: EventKind,
        why: Refusal,
        dest: Option<(IpAddr, u16)>,
    ) {
        self.stats.refused(kind, why);
        let now = now_ms();
        let Some(skipped) = sb.refusals.note(kind, now) else {
            return;
        };
        let (what, setting) = match kind {
            EventKind::Tcp => ("open connections", "connections"),
            EventKind::Dns => ("DNS queries in flight", "dns"),
        };
        let mut reason = match why {
            Refusal::Sandbox { held, cap } => format!(
                "limit: the sandbox has {held} {what} (network.max_{setting}_per_sandbox = {cap})"
            ),
            Refusal::Tenant { held, cap } => format!(
                "limit: the tenant's sandboxes have {held} {what} (network.max_{setting}_per_tenant = {cap})"
            ),
            Refusal::Host { .. } => {
                format!("limit: the host has no descriptors left for {what}")
            }
        };
        if skipped > 0 {
            reason.push_str(&format!(
                "; {skipped} more refused in the second before, not logged one by one"
            ));
        }
        self.record(AuditEvent {
            sandbox: sb.sandbox.clone(),
            at_ms: now,
            kind,
            name: None,
            addr: dest.map(|d| d.0),
            port: dest.map(|d| d.1),
            decision: Decision::Denied,
            reason,
            bytes_out: 0,
            bytes_in: 0,
        });
    }

    /// Writes an audit entry, within the sandbox's budget of entries ([`audit_rate`]):
    /// past it, the entry is counted and left out, and the next one written says how
    /// many were.
    pub fn record(&self, mut ev: AuditEvent) {
        let admitted = self
            .audit_budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .admit(&ev.sandbox, ev.at_ms);
        match admitted {
            None => {
                self.stats.audit_dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Some(0) => {}
            Some(n) => ev.reason.push_str(&format!(
                "; {n} earlier entries of this sandbox were not logged (audit rate limit)"
            )),
        }
        tracing::debug!(
            sandbox = %ev.sandbox,
            kind = ev.kind.as_str(),
            name = ev.name.as_deref().unwrap_or(""),
            addr = ?ev.addr,
            port = ?ev.port,
            decision = ev.decision.as_str(),
            "egress: {}",
            ev.reason
        );
        self.audit.record(ev);
    }
}

/// Which cap refusals of one sandbox make it into its audit log: the first, and
/// then at most one a second per kind; the others are counted and the next entry
/// says how many there were. A sandbox that retries in a loop would otherwise
/// write an entry per attempt. (Metrics count every refusal.)
#[derive(Debug, Default)]
pub struct RefusalLog {
    /// Per kind (TCP, DNS): when the last entry was written (ms since the epoch).
    last_ms: [AtomicI64; 2],
    /// Per kind: refusals since that entry that were not logged.
    skipped: [AtomicU64; 2],
}

impl RefusalLog {
    /// Notes a refusal at `now_ms`: `Some(n)` if it is to be logged, standing
    /// for `n` earlier refusals that were not.
    pub fn note(&self, kind: EventKind, now_ms: i64) -> Option<u64> {
        let i = kind as usize;
        let last = self.last_ms[i].load(Ordering::Relaxed);
        if last != 0 && now_ms - last < 1000 {
            self.skipped[i].fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if self.last_ms[i]
            .compare_exchange(last, now_ms, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            // Another refusal of the same instant is being logged.
            self.skipped[i].fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.skipped[i].swap(0, Ordering::AcqRel))
    }
}

/// Counters of the egress limits, for the daemon's metrics.
#[derive(Debug, Default)]
pub struct EgressStats {
    open: AtomicI64,
    /// [kind (TCP, DNS)][limit (sandbox, tenant, host)].
    refused: [[AtomicU64; 3]; 2],
    closed_idle: AtomicU64,
    closed_half: AtomicU64,
    /// Audit entries left out by the per-sandbox rate limit.
    audit_dropped: AtomicU64,
}

/// An open proxied connection, counted until dropped.
pub struct OpenConnection<'a>(&'a EgressStats);

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl EgressStats {
    pub fn open_connection(&self) -> OpenConnection<'_> {
        self.open.fetch_add(1, Ordering::Relaxed);
        OpenConnection(self)
    }

    fn refused(&self, kind: EventKind, why: Refusal) {
        let j = match why {
            Refusal::Sandbox { .. } => 0,
            Refusal::Tenant { .. } => 1,
            Refusal::Host { .. } => 2,
        };
        self.refused[kind as usize][j].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts how a relay ended; the words for the audit log when a timeout
    /// closed it.
    pub fn relay_ended(&self, end: RelayEnd, t: &RelayTimeouts) -> Option<String> {
        match end {
            RelayEnd::Idle => {
                self.closed_idle.fetch_add(1, Ordering::Relaxed);
                Some(format!(
                    "idle for {}s (network.idle_timeout)",
                    t.idle.as_secs_f64()
                ))
            }
            RelayEnd::HalfClosed => {
                self.closed_half.fetch_add(1, Ordering::Relaxed);
                Some(format!(
                    "one side had closed and the other was silent for {}s (network.half_close_timeout)",
                    t.half_closed.as_secs_f64()
                ))
            }
            RelayEnd::Broken => Some("reset".into()),
            RelayEnd::Closed => None,
        }
    }
}

/// What the egress limits hold and have refused, for `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressSnapshot {
    pub connections_open: i64,
    pub dns_in_flight: usize,
    /// `(kind, limit, count)`: kind `tcp`|`dns`, limit `sandbox`|`tenant`|`host`.
    pub refused: Vec<(&'static str, &'static str, u64)>,
    pub closed_idle: u64,
    pub closed_half_closed: u64,
    /// Audit entries left out by the per-sandbox rate limit.
    pub audit_dropped: u64,
    /// Descriptors of the egress budget held now, and its size.
    pub descriptors_held: usize,
    pub descriptors_cap: usize,
}

/// Names derived from the daemon's id prefix: slot names (`sn` + 6 hex digits of a
/// hash of the prefix) and the nftables table (`sandlot_<that>`).
pub fn slot_prefix(id_prefix: &str) -> String {
    // FNV-1a: stable across builds and platforms.
    let mut h: u32 = 0x811c9dc5;
    for b in id_prefix.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x01000193);
    }
    format!("sn{:06x}", h & 0xffffff)
}

/// The network service of one daemon.
pub struct NetService {
    cfg: NetConfig,
    prefix: String,
    table: nft::TableSpec,
    pool: SlotPool,
    shared: Arc<Shared>,
    by_id: RwLock<HashMap<String, Arc<Attached>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The slot subnet, locked host-wide for as long as the service lives.
    _subnet: subnet::HeldSubnet,
}

/// A sandbox that survived a daemon restart, with its slot.
#[derive(Debug, Clone)]
pub struct Survivor {
    pub sandbox: String,
    pub tenant: String,
    pub slot: Slot,
    pub spec: NetworkSpec,
}

impl NetService {
    /// Binds the resolver and proxy, writes the nftables table (keeping the slots
    /// of `survivors`), deletes every other leftover slot of this prefix, and starts
    /// filling the pool. `descriptors` is the share of the daemon's open-file limit
    /// that proxied connections and DNS queries of all sandboxes together may hold.
    /// Call from a Tokio runtime.
    pub async fn start(
        mut cfg: NetConfig,
        id_prefix: &str,
        audit: Arc<dyn AuditSink>,
        survivors: Vec<Survivor>,
        descriptors: Arc<Budget>,
    ) -> Result<NetService, NetError> {
        cfg.validate()?;
        let prefix = slot_prefix(id_prefix);
        let held = subnet::choose(
            &cfg.subnet,
            &prefix,
            survivors.first().map(|s| s.slot.host_ip),
            &std::fs::read_to_string("/proc/net/route").unwrap_or_default(),
            std::path::Path::new(subnet::LOCK_DIR),
        )?;
        let subnet = held.cidr;
        cfg.subnet = subnet.to_string();
        let plan = AddressPlan::new(subnet)?;
        let allow_private = cfg
            .allow_private
            .iter()
            .filter_map(|c| Cidr::parse(c).ok())
            .collect();
        let upstream = cfg.upstreams();
        if upstream.is_empty() {
            tracing::warn!("no upstream DNS (network.upstream_dns, /etc/resolv.conf): sandboxes cannot resolve names");
        }
        let shared = Arc::new(Shared {
            by_addr: RwLock::new(HashMap::new()),
            ceiling: Ceiling::new(subnet, allow_private),
            locals: LocalAddrs::new(),
            upstream,
            audit,
            conns: EgressCaps::new(
                cfg.max_connections_per_sandbox,
                cfg.max_connections_per_tenant,
                2,
                descriptors.clone(),
            ),
            dns: EgressCaps::new(
                cfg.max_dns_per_sandbox,
                cfg.max_dns_per_tenant,
                1,
                descriptors,
            ),
            timeouts: RelayTimeouts {
                idle: cfg.idle_timeout.0,
                half_closed: cfg.half_close_timeout.0,
            },
            stats: EgressStats::default(),
            audit_budget: std::sync::Mutex::new(audit_rate::AuditBudgets::default()),
        });
        let io = |what: &str| {
            let what = what.to_string();
            move |source| NetError::Io { what, source }
        };
        let proxy_l = tokio::net::TcpListener::bind("0.0.0.0:0")
            .await
            .map_err(io("bind the egress proxy"))?;
        let proxy_port = proxy_l.local_addr().map_err(io("proxy address"))?.port();
        let (dns_udp, dns_tcp) = resolver::bind().await?;
        let dns_port = dns_udp.local_addr().map_err(io("resolver address"))?.port();
        let table = nft::TableSpec {
            table: format!("sandlot_{prefix}"),
            if_prefix: prefix.clone(),
            proxy_port,
            dns_port,
        };
        let keep: Vec<(String, Ipv4Addr)> = survivors
            .iter()
            .map(|s| (s.slot.name.clone(), s.slot.sandbox_ip))
            .collect();
        let nftc = nft::Nft::default();
        let tcmds = table.create(&keep);
        tokio::task::spawn_blocking(move || nftc.apply(&tcmds))
            .await
            .map_err(|e| NetError::Config(e.to_string()))??;
        let kept_slots: Vec<Slot> = survivors.iter().map(|s| s.slot.clone()).collect();
        let pool = {
            let (p, t, n, k) = (prefix.clone(), table.clone(), cfg.pool_size, kept_slots);
            tokio::task::spawn_blocking(move || SlotPool::start(&p, plan, n, t, &k))
                .await
                .map_err(|e| NetError::Config(e.to_string()))?
        };
        let svc = NetService {
            tasks: vec![
                tokio::spawn(proxy::serve(proxy_l, shared.clone())),
                tokio::spawn(resolver::serve_udp(dns_udp, shared.clone())),
                tokio::spawn(resolver::serve_tcp(dns_tcp, shared.clone())),
            ],
            cfg,
            prefix,
            table,
            pool,
            shared,
            by_id: RwLock::new(HashMap::new()),
            _subnet: held,
        };
        for s in survivors {
            svc.register(&s.sandbox, &s.tenant, s.slot, &s.spec);
        }
        tracing::info!(
            prefix = %svc.prefix,
            subnet = %svc.cfg.subnet,
            proxy_port,
            dns_port,
            "network egress service started"
        );
        Ok(svc)
    }

    pub fn config(&self) -> &NetConfig {
        &self.cfg
    }

    /// Slot and table name prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn table(&self) -> &nft::TableSpec {
        &self.table
    }

    pub fn pool(&self) -> &SlotPool {
        &self.pool
    }

    /// Checks a spec against the operator's ceiling; errors name the field.
    pub fn check(&self, spec: &NetworkSpec) -> Result<(), SpecError> {
        spec.validate()?;
        if spec.mode > self.cfg.ceiling {
            return Err(SpecError::new(
                "network.mode",
                format!(
                    "mode {:?} is above the operator's ceiling {:?}",
                    spec.mode.as_str(),
                    self.cfg.ceiling.as_str()
                ),
            ));
        }
        for (i, r) in spec.allow.iter().enumerate() {
            if let Some(c) = r.cidr.as_deref().and_then(|c| Cidr::parse(c).ok()) {
                if let Some(why) = self.shared.ceiling.denies(c.addr, &[]) {
                    return Err(SpecError::new(
                        format!("network.allow[{i}].cidr"),
                        format!("{c} is off limits: {why}"),
                    ));
                }
            }
        }
        Ok(())
    }

    fn register(&self, id: &str, tenant: &str, slot: Slot, spec: &NetworkSpec) -> Arc<Attached> {
        let a = Arc::new(Attached {
            sandbox: id.to_string(),
            tenant: RwLock::new(tenant.to_string()),
            refusals: RefusalLog::default(),
            slot: slot.clone(),
            spec: RwLock::new(spec.clone()),
            policy: RwLock::new(Arc::new(Policy::compile(spec))),
            generation: tokio::sync::watch::channel(0).0,
        });
        self.shared
            .audit_budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .open(id);
        self.shared
            .by_addr
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(slot.sandbox_ip, a.clone());
        self.by_id
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string(), a.clone());
        a
    }

    /// Claims a slot for sandbox `id` of `tenant` (blocking: builds one if the pool
    /// is empty).
    pub fn attach(
        &self,
        id: &str,
        tenant: &str,
        spec: &NetworkSpec,
    ) -> Result<Attachment, NetError> {
        let slot = self.pool.claim()?;
        let netns = match slots::open_netns(&slot.name) {
            Ok(f) => f,
            Err(e) => {
                self.pool.release(slot);
                return Err(e);
            }
        };
        self.register(id, tenant, slot.clone(), spec);
        Ok(Attachment {
            netns,
            nameserver: IpAddr::V4(slot.host_ip),
            slot,
        })
    }

    /// What the egress limits hold and have refused.
    pub fn stats(&self) -> EgressSnapshot {
        let sh = &self.shared;
        let st = &sh.stats;
        let mut refused = Vec::new();
        for (i, kind) in [EventKind::Dns, EventKind::Tcp].into_iter().enumerate() {
            for (j, limit) in ["sandbox", "tenant", "host"].into_iter().enumerate() {
                refused.push((
                    kind.as_str(),
                    limit,
                    st.refused[i][j].load(Ordering::Relaxed),
                ));
            }
        }
        EgressSnapshot {
            connections_open: st.open.load(Ordering::Relaxed),
            dns_in_flight: sh.dns.per_tenant.total(),
            refused,
            closed_idle: st.closed_idle.load(Ordering::Relaxed),
            closed_half_closed: st.closed_half.load(Ordering::Relaxed),
            audit_dropped: st.audit_dropped.load(Ordering::Relaxed),
            descriptors_held: sh.conns.budget.used(),
            descriptors_cap: sh.conns.budget.cap(),
        }
    }

    /// The sandbox's current network spec.
    pub fn spec(&self, id: &str) -> Option<NetworkSpec> {
        self.attached(id).map(|a| a.spec())
    }

    pub fn attached(&self, id: &str) -> Option<Arc<Attached>> {
        self.by_id
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    /// Replaces a running sandbox's policy: new queries and connections see it at
    /// once, and open connections it no longer allows are cut.
    pub fn set_policy(&self, id: &str, spec: &NetworkSpec) -> Result<(), NetError> {
        let a = self
            .attached(id)
            .ok_or_else(|| NetError::NotAttached(id.to_string()))?;
        *a.spec.write().unwrap_or_else(|e| e.into_inner()) = spec.clone();
        *a.policy.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Policy::compile(spec));
        a.generation.send_modify(|g| *g += 1);
        Ok(())
    }

    /// Releases the sandbox's slot (torn down in the background).
    pub fn detach(&self, id: &str) {
        let a = self
            .by_id
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        if let Some(a) = a {
            self.shared
                .by_addr
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&a.slot.sandbox_ip);
            self.shared
                .audit_budget
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .close(id);
            a.generation.send_modify(|g| *g += 1);
            self.pool.release(a.slot.clone());
        }
    }

    /// Stops the service: deletes the pool's unclaimed slots, waits for teardowns,
    /// and removes the nftables table unless sandboxes still hold slots (their
    /// rules must keep holding while the daemon is down).
    pub fn shutdown(&self, timeout: Duration) {
        for t in &self.tasks {
            t.abort();
        }
        self.pool.stop(timeout);
        let live = self.by_id.read().unwrap_or_else(|e| e.into_inner()).len();
        if live == 0 {
            if let Err(e) = nft::Nft::default().apply(&self.table.delete()) {
                tracing::warn!("delete nftables table {}: {e}", self.table.table);
            }
        } else {
            tracing::info!(
                live,
                "network slots of live sandboxes and their rules are kept"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_short_stable_and_distinct() {
        let a = slot_prefix("sb-");
        assert_eq!(a, slot_prefix("sb-"));
        assert_ne!(a, slot_prefix("sc-"));
        assert_eq!(a.len(), 8);
        assert!(a.len() + 6 <= 15);
    }

    #[test]
    fn fib_trie_local_addresses() {
        let t = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 10.99.0.0\n        /16 link UNICAST\n     |-- 10.99.0.1\n        /32 host LOCAL\nLocal:\n     |-- 127.0.0.1\n        /32 host LOCAL\n     |-- 10.99.0.1\n        /32 host LOCAL\n";
        assert_eq!(
            LocalAddrs::parse_fib_trie(t),
            vec![
                "10.99.0.1".parse::<IpAddr>().unwrap(),
                "127.0.0.1".parse().unwrap()
            ]
        );
    }

    #[test]
    fn cap_refusals_are_logged_at_most_once_a_second_per_kind_with_the_count() {
        let l = RefusalLog::default();
        assert_eq!(
            l.note(EventKind::Tcp, 10_000),
            Some(0),
            "the first is logged"
        );
        assert_eq!(l.note(EventKind::Tcp, 10_100), None);
        assert_eq!(l.note(EventKind::Tcp, 10_999), None);
        // Another kind has its own second.
        assert_eq!(l.note(EventKind::Dns, 10_500), Some(0));
        assert_eq!(
            l.note(EventKind::Tcp, 11_000),
            Some(2),
            "the next entry counts the ones not logged"
        );
        assert_eq!(l.note(EventKind::Tcp, 20_000), Some(0));
    }

    #[test]
    fn relay_ends_are_counted_and_timeouts_named() {
        let s = EgressStats::default();
        let t = RelayTimeouts {
            idle: Duration::from_secs(900),
            half_closed: Duration::from_millis(1500),
        };
        assert_eq!(s.relay_ended(RelayEnd::Closed, &t), None);
        let why = s.relay_ended(RelayEnd::HalfClosed, &t).unwrap();
        assert!(why.contains("1.5s (network.half_close_timeout)"), "{why}");
        let why = s.relay_ended(RelayEnd::Idle, &t).unwrap();
        assert!(why.contains("900s (network.idle_timeout)"), "{why}");
        assert_eq!(
            (
                s.closed_idle.load(Ordering::Relaxed),
                s.closed_half.load(Ordering::Relaxed)
            ),
            (1, 1)
        );
        {
            let _a = s.open_connection();
            let _b = s.open_connection();
            assert_eq!(s.open.load(Ordering::Relaxed), 2);
        }
        assert_eq!(s.open.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn config_is_checked() {
        assert!(NetConfig::default().validate().is_ok());
        let c = NetConfig {
            ceiling: NetworkMode::None,
            default: NetworkSpec {
                mode: NetworkMode::Open,
                ..NetworkSpec::default()
            },
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("ceiling"));
        let c = NetConfig {
            allow_private: vec!["10.0.0.1/8".into()],
            ..Default::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("allow_private[0]"));
        let c = NetConfig {
            subnet: "fd00::/64".into(),
            ..Default::default()
        };
        assert!(c.validate().is_err());
        let c = NetConfig {
            max_dns_per_tenant: 0,
            ..Default::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("network.max_dns_per_tenant"));
        let c = NetConfig {
            half_close_timeout: Seconds::secs(0),
            ..Default::default()
        };
        assert!(c.validate().is_err());
    }
}
