//! Inbound traffic to sandboxes (see `docs/networking.md`, "Inbound"): dialling a
//! port inside a sandbox's own network namespace, and raw TCP ports published on
//! the host (table `published_ports`, re-established after a daemon restart for
//! the sandboxes that survived it).
//!
//! The daemon reaches a sandbox port the same way whatever the network mode: the
//! sandbox's instance makes a socket inside the sandbox's network
//! ([`sandlot_runtime::Instance::port_sockets`]; the namespace backend's enters its
//! network namespace on a short-lived thread), and tokio connects it. The
//! connection then goes to the sandbox's loopback, so a server bound to
//! 127.0.0.1 inside is reachable; nothing in the host's network is opened.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::params;
use sandlot_proto::api::ports::{PublishPort, PublishedPort};
use sandlot_runtime::PortSockets;
use serde::Deserialize;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::sandbox::SandboxHandle;
use crate::state::AppState;
use crate::store::now_ms;

/// How long dialling a sandbox port may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Operator configuration of inbound traffic (`[ports]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct PortsConfig {
    /// Host addresses published ports may listen on; the first is the default.
    /// Empty: publishing raw TCP ports is disabled (the HTTP proxy still works).
    pub bind_addresses: Vec<IpAddr>,
    /// Lowest host port a published port may use.
    pub host_port_min: u16,
    /// Highest host port a published port may use.
    pub host_port_max: u16,
    /// Published ports one tenant may have at once (all its sandboxes together).
    pub max_published_per_tenant: u32,
    /// Whether a sandbox may ask for public ports (`ports.public`: host-name URLs
    /// reach its ports without a credential). Default true; see
    /// `docs/threat-model.md` ("Public ports").
    pub allow_public: bool,
}

impl Default for PortsConfig {
    fn default() -> Self {
        PortsConfig {
            bind_addresses: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
            host_port_min: 40000,
            host_port_max: 44999,
            max_published_per_tenant: 16,
            allow_public: true,
        }
    }
}

impl PortsConfig {
    /// Checks values serde cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.host_port_min == 0 || self.host_port_min > self.host_port_max {
            return Err(format!(
                "ports.host_port_min {} and ports.host_port_max {}: need 1 <= min <= max",
                self.host_port_min, self.host_port_max
            ));
        }
        Ok(())
    }
}

/// Create-time check of a spec's public ports: 400 naming `ports.public` when the
/// operator forbids them.
pub fn admit_public(cfg: &PortsConfig, spec: &sandlot_proto::spec::SandboxSpec) -> ApiResult<()> {
    if spec.ports.public && !cfg.allow_public {
        return Err(ApiError::invalid(
            "ports.public",
            "the operator does not allow public sandbox ports ([ports] allow_public = false): ports are reached with the sandbox's traffic access token or the API key",
        ));
    }
    Ok(())
}

/// Whether `port` of a sandbox whose recorded spec is `spec` answers without a
/// credential: the sandbox asked for it, the operator allows it (checked again on
/// every request, so forbidding it later takes effect at once), and the port is
/// not one that controls the sandbox (`NEVER_PUBLIC_PORTS`).
pub fn is_public(cfg: &PortsConfig, spec: &serde_json::Value, port: u16) -> bool {
    let ports: sandlot_proto::spec::PortsSpec = spec
        .get("ports")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default();
    cfg.allow_public && ports.is_public(port)
}

/// Why a sandbox port could not be dialled.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("nothing is listening on port {port} in the sandbox (connection refused on 127.0.0.1 and ::1)")]
    Refused { port: u16 },
    #[error("port {port} in the sandbox did not accept a connection within {}s", DIAL_TIMEOUT.as_secs())]
    Timeout { port: u16 },
    #[error("the sandbox's PID 1 is gone")]
    Gone,
    #[error("dial port {port} in the sandbox: {source}")]
    Io {
        port: u16,
        #[source]
        source: io::Error,
    },
}

impl DialError {
    /// The API error of a failed dial (502 nothing listening, 504 timeout, 409 gone).
    pub fn to_api(&self, sandbox: &str) -> ApiError {
        match self {
            DialError::Refused { .. } => {
                ApiError::of(ErrorCode::BadGateway, format!("sandbox {sandbox}: {self}"))
            }
            DialError::Timeout { .. } => ApiError::of(
                ErrorCode::GatewayTimeout,
                format!("sandbox {sandbox}: {self}"),
            ),
            DialError::Gone => ApiError::conflict(format!("sandbox {sandbox} is stopping")),
            DialError::Io { .. } => {
                ApiError::of(ErrorCode::BadGateway, format!("sandbox {sandbox}: {self}"))
            }
        }
    }
}

/// Sockets inside the sandbox's network (IPv4, and IPv6 when it has it), made
/// by its instance on a thread of the backend's.
async fn sockets_in(inst: &dyn sandlot_runtime::Instance) -> io::Result<PortSockets> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    inst.port_sockets(Box::new(move |r| {
        let _ = tx.send(r);
    }));
    rx.await
        .map_err(|_| io::Error::other("the dialling thread ended without an answer"))?
}

/// A connection to a port of a sandbox: a TCP socket inside its network, or a
/// relay process in the sandbox ([`sandlot_runtime::PortAccess::Relay`]).
pub enum PortStream {
    Tcp(TcpStream),
    Relay(tokio::io::DuplexStream),
}

impl PortStream {
    /// `TCP_NODELAY` on a socket of our own (a relay sets it inside).
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        match self {
            PortStream::Tcp(s) => s.set_nodelay(on),
            PortStream::Relay(_) => Ok(()),
        }
    }
}

impl tokio::io::AsyncRead for PortStream {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            PortStream::Tcp(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            PortStream::Relay(s) => std::pin::Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for PortStream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        match self.get_mut() {
            PortStream::Tcp(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            PortStream::Relay(s) => std::pin::Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            PortStream::Tcp(s) => std::pin::Pin::new(s).poll_flush(cx),
            PortStream::Relay(s) => std::pin::Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            PortStream::Tcp(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            PortStream::Relay(s) => std::pin::Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Connects to `port` on the loopback of the sandbox (127.0.0.1, then ::1), the
/// way its instance says.
pub async fn dial(h: &SandboxHandle, port: u16) -> Result<PortStream, DialError> {
    match h.inst.port_access() {
        sandlot_runtime::PortAccess::Sockets => dial_tcp(h, port).await.map(PortStream::Tcp),
        sandlot_runtime::PortAccess::Relay(argv) => relay(h, argv, port).await,
    }
}

/// How much of a relayed connection may be in flight between the daemon's two
/// ends of it.
const RELAY_BUFFER: usize = 256 * 1024;

/// Starts `argv PORT` in the sandbox through its agent and makes its standard
/// input and output one connection.
async fn relay(h: &SandboxHandle, argv: Vec<String>, port: u16) -> Result<PortStream, DialError> {
    use sandlot_guest::client::{ExecRequest, ProcessEvent};
    use tokio::io::AsyncWriteExt;
    let io_err = |source| DialError::Io { port, source };
    let mut req = ExecRequest::new(argv.into_iter().chain([port.to_string()]));
    req.stdin = true;
    req.tag = Some("sandlot:port-relay".into());
    let mut p = match h.guest.exec(req).await {
        Ok(p) => p,
        Err(_) if h.is_stopping() => return Err(DialError::Gone),
        Err(e) => return Err(io_err(io::Error::other(e.to_string()))),
    };
    let first = match tokio::time::timeout(DIAL_TIMEOUT, p.next_event()).await {
        Err(_) => {
            let _ = p.signal(libc::SIGKILL).await;
            return Err(DialError::Timeout { port });
        }
        Ok(Ok(Some(ProcessEvent::Stdout(b)))) if b.first() == Some(&b'+') => b.slice(1..),
        Ok(Ok(Some(ProcessEvent::Exit(st))))
            if st.code == Some(sandlot_runtime::PORT_RELAY_REFUSED) =>
        {
            return Err(DialError::Refused { port })
        }
        Ok(other) => {
            let _ = p.signal(libc::SIGKILL).await;
            return Err(io_err(io::Error::other(format!(
                "the relay in the sandbox did not connect: {other:?}"
            ))));
        }
    };
    let (ours, theirs) = tokio::io::duplex(RELAY_BUFFER);
    tokio::spawn(
        async move {
            let Some(mut stdin) = p.take_stdin() else {
                return;
            };
            let (mut rd, mut wr) = tokio::io::split(theirs);
            let to_sandbox = async {
                let _ = tokio::io::copy(&mut rd, &mut stdin).await;
                let _ = stdin.shutdown().await;
            };
            let from_sandbox = async {
                let mut ok = wr.write_all(&first).await.is_ok();
                while ok {
                    match p.next_event().await {
                        Ok(Some(ProcessEvent::Stdout(b))) => ok = wr.write_all(&b).await.is_ok(),
                        Ok(Some(ProcessEvent::Stderr(_))) => {}
                        _ => break,
                    }
                }
                let _ = wr.shutdown().await;
                if !ok {
                    // Our end is gone: so is the connection.
                    let _ = p.signal(libc::SIGKILL).await;
                }
            };
            tokio::join!(to_sandbox, from_sandbox);
        }
        .in_current_span(),
    );
    Ok(PortStream::Relay(ours))
}

/// Connects to `port` on the sandbox's loopback through sockets made in its
/// network.
async fn dial_tcp(h: &SandboxHandle, port: u16) -> Result<TcpStream, DialError> {
    let io_err = |source| DialError::Io { port, source };
    let PortSockets { v4, v6 } =
        sockets_in(&*h.inst)
            .await
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ESRCH) => DialError::Gone,
                _ => io_err(e),
            })?;
    let attempt = |fd: OwnedFd, addr: SocketAddr| async move {
        let sock = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(fd));
        match tokio::time::timeout(DIAL_TIMEOUT, sock.connect(addr)).await {
            Ok(r) => r.map_err(Some),
            Err(_) => Err(None),
        }
    };
    let refused = |e: &io::Error| e.kind() == io::ErrorKind::ConnectionRefused;
    match attempt(v4, SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await {
        Ok(s) => return Ok(s),
        Err(None) => return Err(DialError::Timeout { port }),
        Err(Some(e)) if !refused(&e) => return Err(io_err(e)),
        Err(Some(_)) => {}
    }
    let Some(v6) = v6 else {
        return Err(DialError::Refused { port });
    };
    match attempt(v6, SocketAddr::from((Ipv6Addr::LOCALHOST, port))).await {
        Ok(s) => Ok(s),
        Err(None) => Err(DialError::Timeout { port }),
        // No IPv6 loopback in the namespace counts as nothing listening there.
        Err(Some(e))
            if refused(&e)
                || matches!(
                    e.raw_os_error(),
                    Some(libc::EADDRNOTAVAIL | libc::ENETUNREACH)
                ) =>
        {
            Err(DialError::Refused { port })
        }
        Err(Some(e)) => Err(io_err(e)),
    }
}

/// Parses a sandbox port (path segment or body field): 1 to 65535.
/// A port as a path segment: plain decimal, 1 to 65535, no sign, no leading zero
/// (`+8002`, `08002` and `0x1f42` name no port: `u64::from_str` took the first).
pub fn parse_port_segment(field: &str, raw: &str) -> ApiResult<u16> {
    let plain = !raw.is_empty()
        && raw.len() <= 5
        && raw.bytes().all(|b| b.is_ascii_digit())
        && !raw.starts_with('0');
    match raw.parse::<u16>() {
        Ok(p) if plain => Ok(p),
        _ => Err(ApiError::invalid(
            field,
            format!("{raw:?} is not a TCP port (1 to 65535, in plain decimal)"),
        )),
    }
}

pub fn parse_port(field: &str, v: u64) -> ApiResult<u16> {
    match u16::try_from(v) {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(ApiError::invalid(
            field,
            format!("{v} is not a TCP port (1 to 65535)"),
        )),
    }
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS published_ports (
    sandbox_id TEXT NOT NULL,
    port INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    bind TEXT NOT NULL,
    host_port INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (sandbox_id, port)
);
";

struct Entry {
    tenant: String,
    info: PublishedPort,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// The published ports of the live sandboxes.
#[derive(Default)]
pub struct Published {
    by_sandbox: Mutex<HashMap<String, Vec<Entry>>>,
}

impl Published {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Entry>>> {
        self.by_sandbox.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The published ports of a sandbox, by sandbox port.
    pub fn list(&self, sandbox: &str) -> Vec<PublishedPort> {
        let mut v: Vec<PublishedPort> = self
            .lock()
            .get(sandbox)
            .map(|es| es.iter().map(|e| e.info.clone()).collect())
            .unwrap_or_default();
        v.sort_by_key(|p| p.port);
        v
    }

    fn tenant_count(&self, tenant: &str) -> usize {
        self.lock()
            .values()
            .flatten()
            .filter(|e| e.tenant == tenant)
            .count()
    }

    fn take(&self, sandbox: &str, port: Option<u16>) -> Vec<Entry> {
        let mut m = self.lock();
        let Some(es) = m.get_mut(sandbox) else {
            return Vec::new();
        };
        let taken = match port {
            Some(p) => match es.iter().position(|e| e.info.port == p) {
                Some(i) => vec![es.remove(i)],
                None => Vec::new(),
            },
            None => std::mem::take(es),
        };
        if es.is_empty() {
            m.remove(sandbox);
        }
        taken
    }
}

fn address(ip: IpAddr, port: u16) -> String {
    SocketAddr::new(ip, port).to_string()
}

/// Creates the table of published ports.
pub fn init_schema(state: &AppState) -> Result<(), rusqlite::Error> {
    state.store.lock().execute_batch(SCHEMA)
}

/// The host address and port a publish request asks for, checked against the
/// operator's configuration (400 naming the field).
fn admit(cfg: &PortsConfig, req: &PublishPort) -> ApiResult<(u16, IpAddr, Option<u16>)> {
    let port = parse_port("port", u64::from(req.port))?;
    if cfg.bind_addresses.is_empty() {
        return Err(ApiError::conflict(
            "publishing TCP ports is disabled on this daemon (ports.bind_addresses is empty); \
             use the HTTP proxy /v1/sandboxes/{id}/ports/{port}/",
        ));
    }
    let allowed = cfg
        .bind_addresses
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let bind = match &req.bind {
        None => cfg.bind_addresses[0],
        Some(b) => {
            let ip: IpAddr = b
                .trim()
                .parse()
                .map_err(|_| ApiError::invalid("bind", format!("{b:?} is not an IP address")))?;
            if !cfg.bind_addresses.contains(&ip) {
                return Err(ApiError::invalid(
                    "bind",
                    format!("{ip} is not allowed by the operator (allowed: {allowed})"),
                ));
            }
            ip
        }
    };
    let host_port = match req.host_port {
        None => None,
        Some(hp) => {
            let hp = parse_port("host_port", u64::from(hp))?;
            if hp < cfg.host_port_min || hp > cfg.host_port_max {
                return Err(ApiError::invalid(
                    "host_port",
                    format!(
                        "{hp} is outside the operator's range {}-{}",
                        cfg.host_port_min, cfg.host_port_max
                    ),
                ));
            }
            Some(hp)
        }
    };
    Ok((port, bind, host_port))
}

/// Binds `bind:host_port`, or the first free port of the range from a random
/// starting point.
async fn listen(cfg: &PortsConfig, bind: IpAddr, host_port: Option<u16>) -> ApiResult<TcpListener> {
    if let Some(hp) = host_port {
        return TcpListener::bind((bind, hp)).await.map_err(|e| {
            if e.kind() == io::ErrorKind::AddrInUse {
                ApiError::conflict(format!("host port {} is in use", address(bind, hp)))
            } else {
                ApiError::invalid("bind", format!("listen on {}: {e}", address(bind, hp)))
            }
        });
    }
    let span = u32::from(cfg.host_port_max - cfg.host_port_min) + 1;
    let start = u32::from_str_radix(&crate::auth::random_hex(4), 16).unwrap_or(0) % span;
    for i in 0..span {
        let hp = cfg.host_port_min + ((start + i) % span) as u16;
        match TcpListener::bind((bind, hp)).await {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
            Err(e) => {
                return Err(ApiError::invalid(
                    "bind",
                    format!("listen on {}: {e}", address(bind, hp)),
                ))
            }
        }
    }
    Err(ApiError::unavailable(format!(
        "no free host port on {bind} in the range {}-{}",
        cfg.host_port_min, cfg.host_port_max
    )))
}

/// Publishes a port of a live sandbox on the host.
pub async fn publish(
    state: &Arc<AppState>,
    h: &Arc<SandboxHandle>,
    req: &PublishPort,
) -> ApiResult<PublishedPort> {
    let cfg = &state.cfg.ports;
    let (port, bind, host_port) = admit(cfg, req)?;
    let check = |state: &AppState| -> ApiResult<()> {
        if let Some(p) = state.published.list(&h.id).iter().find(|p| p.port == port) {
            return Err(ApiError::conflict(format!(
                "port {port} of sandbox {} is already published at {}",
                h.id, p.address
            )));
        }
        let max = cfg.max_published_per_tenant as usize;
        if state.published.tenant_count(&h.tenant) >= max {
            return Err(ApiError::quota(format!(
                "tenant {} already has {max} published ports (ports.max_published_per_tenant)",
                h.tenant
            )));
        }
        Ok(())
    };
    check(state)?;
    let listener = listen(cfg, bind, host_port).await?;
    let now = now_ms();
    let started = start(state, h, port, listener, now).map_err(ApiError::internal)?;
    // Checked again under the table lock in `insert`: two racing requests.
    let info = insert(state, h, started, now)?;
    let _ = state.store.add_event(
        &h.id,
        "port",
        &format!("port {port} published at {}", info.address),
    );
    Ok(info)
}

/// Starts the accept loop of a bound listener (not yet in the table).
fn start(
    state: &Arc<AppState>,
    h: &Arc<SandboxHandle>,
    port: u16,
    listener: TcpListener,
    created_at: i64,
) -> io::Result<(PublishedPort, watch::Sender<bool>, JoinHandle<()>)> {
    let local = listener.local_addr()?;
    let info = PublishedPort {
        port,
        host: local.ip().to_string(),
        host_port: local.port(),
        address: local.to_string(),
        created_at: crate::timefmt::rfc3339(created_at),
    };
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(
        accept_loop(state.clone(), h.clone(), port, listener, rx).instrument(h.span.clone()),
    );
    Ok((info, stop, task))
}

fn insert(
    state: &AppState,
    h: &SandboxHandle,
    (info, stop, task): (PublishedPort, watch::Sender<bool>, JoinHandle<()>),
    created_at: i64,
) -> ApiResult<PublishedPort> {
    let refuse = |stop: watch::Sender<bool>, e: ApiError| {
        let _ = stop.send(true);
        Err(e)
    };
    {
        let mut m = state.published.lock();
        let all = m.values().flatten();
        let tenant_count = all.filter(|e| e.tenant == h.tenant).count();
        let es = m.entry(h.id.clone()).or_default();
        if let Some(e) = es.iter().find(|e| e.info.port == info.port) {
            let msg = format!(
                "port {} of sandbox {} is already published at {}",
                info.port, h.id, e.info.address
            );
            drop(m);
            return refuse(stop, ApiError::conflict(msg));
        }
        let max = state.cfg.ports.max_published_per_tenant as usize;
        if tenant_count >= max {
            drop(m);
            return refuse(
                stop,
                ApiError::quota(format!(
                    "tenant {} already has {max} published ports (ports.max_published_per_tenant)",
                    h.tenant
                )),
            );
        }
        es.push(Entry {
            tenant: h.tenant.clone(),
            info: info.clone(),
            stop,
            task,
        });
    }
    state
        .metrics
        .ports
        .published
        .fetch_add(1, Ordering::Relaxed);
    let saved = state.store.lock().execute(
        "INSERT OR REPLACE INTO published_ports (sandbox_id, port, tenant, bind, host_port, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![h.id, info.port, h.tenant, info.host, info.host_port, created_at],
    );
    if let Err(e) = saved {
        tracing::error!("record published port: {e}");
    }
    // A teardown that started before the entry was in the table would miss it.
    if h.is_stopping() {
        for e in state.published.take(&h.id, Some(info.port)) {
            let _ = e.stop.send(true);
            state
                .metrics
                .ports
                .published
                .fetch_sub(1, Ordering::Relaxed);
        }
        forget(state, &h.id, Some(info.port));
        return Err(ApiError::conflict(format!("sandbox {} is stopping", h.id)));
    }
    Ok(info)
}

fn forget(state: &AppState, sandbox: &str, port: Option<u16>) {
    let c = state.store.lock();
    let r = match port {
        Some(p) => c.execute(
            "DELETE FROM published_ports WHERE sandbox_id = ?1 AND port = ?2",
            params![sandbox, p],
        ),
        None => c.execute(
            "DELETE FROM published_ports WHERE sandbox_id = ?1",
            params![sandbox],
        ),
    };
    if let Err(e) = r {
        tracing::error!(sandbox_id = sandbox, "forget published ports: {e}");
    }
}

/// Stops publishing `port` (or every port) of a sandbox; returns when the host
/// listeners are closed. Open connections are closed too.
pub async fn unpublish(state: &AppState, sandbox: &str, port: Option<u16>) -> usize {
    let taken = state.published.take(sandbox, port);
    let n = taken.len();
    for e in taken {
        let _ = e.stop.send(true);
        let _ = e.task.await;
        state
            .metrics
            .ports
            .published
            .fetch_sub(1, Ordering::Relaxed);
        tracing::info!(port = e.info.port, address = %e.info.address, "port unpublished");
    }
    forget(state, sandbox, port);
    n
}

async fn accept_loop(
    state: Arc<AppState>,
    h: Arc<SandboxHandle>,
    port: u16,
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        // Admitted under the daemon's inbound caps (per client address, total),
        // holding two descriptors: the client's and the one into the sandbox.
        let (client, peer, pass) = tokio::select! {
            _ = async { stop.wait_for(|s| *s).await.is_ok() } => break,
            c = crate::inbound::accept_admitted(
                &listener,
                &state.inbound,
                crate::inbound::ListenerKind::Ports,
                2,
            ) => c,
        };
        let (state, h, mut stop) = (state.clone(), h.clone(), stop.clone());
        tokio::spawn(
            async move {
                let _pass = pass;
                let m = &state.metrics.ports;
                m.tcp_connections.fetch_add(1, Ordering::Relaxed);
                let _active = h.active();
                let mut up = match dial(&h, port).await {
                    Ok(s) => s,
                    Err(e) => {
                        m.dial_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(%peer, "published port: {e}");
                        return;
                    }
                };
                let mut client = client;
                let _ = client.set_nodelay(true);
                let _ = up.set_nodelay(true);
                tokio::select! {
                    _ = async { stop.wait_for(|s| *s).await.is_ok() } => {}
                    r = tokio::io::copy_bidirectional(&mut client, &mut up) => {
                        if let Ok((to_sb, from_sb)) = r {
                            m.bytes_to_sandbox.fetch_add(to_sb, Ordering::Relaxed);
                            m.bytes_from_sandbox.fetch_add(from_sb, Ordering::Relaxed);
                        }
                    }
                }
            }
            .in_current_span(),
        );
    }
    drop(listener);
}

/// On sandbox teardown: every published port of it goes away.
pub async fn close_sandbox(state: &AppState, sandbox: &str) {
    if unpublish(state, sandbox, None).await > 0 {
        tracing::info!("published ports closed");
    }
}

/// On daemon start (after reconciliation): re-publishes the ports of the
/// sandboxes that survived the restart on the same host address and port, and
/// forgets the others. A port that can no longer be bound is dropped, with a
/// sandbox event saying so.
pub async fn restore(state: &Arc<AppState>) {
    if let Err(e) = init_schema(state) {
        tracing::error!("create the published ports table: {e}");
        return;
    }
    let rows: Vec<(String, u16, String, u16, i64)> = {
        let c = state.store.lock();
        let st =
            c.prepare("SELECT sandbox_id, port, bind, host_port, created_at FROM published_ports");
        match st {
            Ok(mut st) => st
                .query_map([], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                })
                .map(|rows| rows.flatten().collect())
                .unwrap_or_default(),
            Err(e) => {
                tracing::error!("read published ports: {e}");
                return;
            }
        }
    };
    for (id, port, bind, host_port, created_at) in rows {
        let Some(h) = state.handle(&id) else {
            forget(state, &id, None);
            continue;
        };
        let r = async {
            let ip: IpAddr = bind.parse().map_err(|_| format!("bad address {bind:?}"))?;
            if !state.cfg.ports.bind_addresses.contains(&ip) {
                return Err(format!("{ip} is no longer an allowed bind address"));
            }
            let l = TcpListener::bind((ip, host_port))
                .await
                .map_err(|e| format!("listen on {}: {e}", address(ip, host_port)))?;
            let started = start(state, &h, port, l, created_at).map_err(|e| e.to_string())?;
            insert(state, &h, started, created_at).map_err(|e| e.message.clone())
        }
        .await;
        match r {
            Ok(info) => {
                tracing::info!(sandbox_id = %id, port, address = %info.address, "published port restored")
            }
            Err(why) => {
                tracing::warn!(sandbox_id = %id, port, "published port dropped after restart: {why}");
                forget(state, &id, Some(port));
                let _ = state.store.add_event(
                    &id,
                    "port",
                    &format!("port {port} no longer published after a daemon restart: {why}"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_segment_is_plain_decimal() {
        for (raw, port) in [("1", 1), ("8002", 8002), ("65535", 65535)] {
            assert_eq!(parse_port_segment("port", raw).unwrap(), port, "{raw}");
        }
        for raw in [
            "", "0", "+8002", "-1", "08002", "00", "0x1f42", "65536", "99999999", " 80", "80 ",
            "8e3", "8_0", "１",
        ] {
            let e = parse_port_segment("port", raw).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("port"), "{raw:?}");
        }
    }

    fn req(port: u32, host_port: Option<u32>, bind: Option<&str>) -> PublishPort {
        PublishPort {
            port,
            host_port,
            bind: bind.map(str::to_string),
        }
    }

    #[test]
    fn admission_names_the_field() {
        let cfg = PortsConfig::default();
        let field = |r: PublishPort| admit(&cfg, &r).unwrap_err().field.unwrap();
        assert_eq!(field(req(0, None, None)), "port");
        assert_eq!(field(req(70000, None, None)), "port");
        assert_eq!(field(req(80, Some(80), None)), "host_port");
        assert_eq!(field(req(80, Some(0), None)), "host_port");
        assert_eq!(field(req(80, None, Some("0.0.0.0"))), "bind");
        assert_eq!(field(req(80, None, Some("nope"))), "bind");
        let e = admit(&cfg, &req(80, None, Some("0.0.0.0"))).unwrap_err();
        assert!(e.message.contains("allowed: 127.0.0.1"), "{}", e.message);
        let (p, b, hp) = admit(&cfg, &req(8000, Some(40001), None)).unwrap();
        assert_eq!(
            (p, b, hp),
            (8000, IpAddr::V4(Ipv4Addr::LOCALHOST), Some(40001))
        );
    }

    #[test]
    fn publishing_can_be_disabled() {
        let cfg = PortsConfig {
            bind_addresses: vec![],
            ..Default::default()
        };
        let e = admit(&cfg, &req(80, None, None)).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::CONFLICT);
        assert!(e.message.contains("disabled"), "{}", e.message);
    }

    #[test]
    fn public_ports_need_the_sandbox_and_the_operator_and_never_control_ports() {
        let public = serde_json::json!({"ports": {"public": true}});
        let private = serde_json::json!({"image": "host"});
        let allowed = PortsConfig::default();
        assert!(allowed.allow_public, "allowed by default");
        assert!(is_public(&allowed, &public, 8000));
        assert!(!is_public(&allowed, &public, 49983), "envd");
        assert!(!is_public(&allowed, &public, 49999), "code interpreter");
        assert!(!is_public(&allowed, &private, 8000));
        let forbidden = PortsConfig {
            allow_public: false,
            ..PortsConfig::default()
        };
        assert!(!is_public(&forbidden, &public, 8000));
        let mut spec = sandlot_proto::spec::SandboxSpec::default();
        admit_public(&forbidden, &spec).unwrap();
        spec.ports.public = true;
        admit_public(&allowed, &spec).unwrap();
        let e = admit_public(&forbidden, &spec).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        assert_eq!(e.field.as_deref(), Some("ports.public"));
    }

    #[test]
    fn config_range_is_checked() {
        let mut c = PortsConfig::default();
        assert!(c.check().is_ok());
        c.host_port_min = 50000;
        c.host_port_max = 40000;
        assert!(c.check().unwrap_err().contains("host_port_min"));
    }

    #[test]
    fn addresses_bracket_ipv6() {
        assert_eq!(address(IpAddr::V6(Ipv6Addr::LOCALHOST), 80), "[::1]:80");
        assert_eq!(address(IpAddr::V4(Ipv4Addr::LOCALHOST), 80), "127.0.0.1:80");
    }
}
