//! The daemon's descriptors and its TCP listeners (`listen`, `[e2b] listen`,
//! `metrics_listen`, published ports): who may hold how many, and for how long.
//!
//! The open-file limit is split once at start ([`DescriptorPlan`]): a reserve that
//! TCP clients and sandboxes' egress never touch (the operator's Unix socket,
//! sandboxes' own descriptors, creates, the database), a budget for inbound TCP
//! connections and one for the egress proxy and resolver. However many
//! connections TCP clients or sandboxes open, the operator's socket and creates
//! keep descriptors.
//!
//! An inbound connection is admitted under a per-address cap and the inbound
//! budget ([`Inbound::admit`]); one over a cap gets a `503` and is closed. An
//! admitted HTTP connection must send a whole request head within
//! `connections.header_timeout` of connecting (or of its first byte after a
//! request), and is closed after `connections.idle_timeout` without a request in
//! flight. A request in flight (an output stream, a long poll) or an upgraded
//! connection (a WebSocket) is never cut by these timers.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use axum::serve::IncomingStream;
use futures_util::task::AtomicWaker;
use sandlot_net::admission::{address_key, Budget, BudgetLease, KeyLease, KeyedCount};
use sandlot_proto::units::Seconds;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Operator settings (`[connections]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct ConnectionsSection {
    /// How long a TCP client has to send a whole request head, from connecting
    /// or from the first byte of a request on a kept-alive connection.
    pub header_timeout: Seconds,
    /// A kept-alive TCP connection with no request in flight for this long is
    /// closed.
    pub idle_timeout: Seconds,
    /// Connections one client address (an IPv6 client: its /64) may hold on the
    /// TCP listeners together.
    pub max_per_address: usize,
    /// Connections all clients together may hold on the TCP listeners (one to a
    /// published port counts twice: it holds the connection into the sandbox
    /// too). 0: a quarter of what the open-file limit leaves after `reserve`.
    pub max_total: usize,
    /// Descriptors that TCP clients and sandboxes' egress never get: kept for the
    /// operator's socket, the sandboxes themselves, creates and the database. 0:
    /// half the open-file limit.
    pub reserve: usize,
}

impl Default for ConnectionsSection {
    fn default() -> Self {
        ConnectionsSection {
            header_timeout: Seconds::secs(15),
            idle_timeout: Seconds::secs(60),
            max_per_address: 512,
            max_total: 0,
            reserve: 0,
        }
    }
}

impl ConnectionsSection {
    /// Checks values serde cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.header_timeout.0.is_zero() || self.idle_timeout.0.is_zero() {
            return Err(
                "connections.header_timeout and connections.idle_timeout must be positive".into(),
            );
        }
        if self.max_per_address == 0 {
            return Err("connections.max_per_address must be at least 1".into());
        }
        Ok(())
    }
}

/// How the daemon's open-file limit is shared out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorPlan {
    /// The soft open-file limit (after raising it to the hard one).
    pub limit: usize,
    /// Never given to TCP clients or egress.
    pub reserve: usize,
    /// For inbound TCP connections (`connections.max_total`).
    pub inbound: usize,
    /// For the egress proxy (two per connection) and DNS queries in flight.
    pub egress: usize,
    /// What the operator should know (a setting that did not fit, a small limit).
    pub warnings: Vec<String>,
}

impl DescriptorPlan {
    /// Shares `limit` out by `cfg`. Pure.
    pub fn new(limit: usize, cfg: &ConnectionsSection) -> DescriptorPlan {
        let mut warnings = Vec::new();
        let reserve = match cfg.reserve {
            0 => limit / 2,
            r if r >= limit => {
                warnings.push(format!(
                    "connections.reserve {r} is not below the open-file limit {limit}: using {}",
                    limit / 2
                ));
                limit / 2
            }
            r => r,
        };
        let free = limit - reserve;
        let inbound = match cfg.max_total {
            0 => free / 4,
            m if m > free => {
                warnings.push(format!(
                    "connections.max_total {m} is more than the open-file limit {limit} leaves \
                     after connections.reserve {reserve}: using {free}"
                ));
                free
            }
            m => m,
        };
        let egress = free - inbound;
        if egress < 64 || inbound < 16 {
            warnings.push(format!(
                "the open-file limit {limit} leaves {inbound} descriptors for TCP clients and \
                 {egress} for sandboxes' egress: raise the hard limit (LimitNOFILE=) or lower \
                 connections.reserve"
            ));
        }
        DescriptorPlan {
            limit,
            reserve,
            inbound,
            egress,
            warnings,
        }
    }
}

/// Which TCP listener a connection came in on (a metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerKind {
    Api,
    E2b,
    Ports,
    /// `metrics_listen`: a scraper's, without a token.
    Metrics,
}

impl ListenerKind {
    const ALL: [ListenerKind; 4] = [
        ListenerKind::Api,
        ListenerKind::E2b,
        ListenerKind::Ports,
        ListenerKind::Metrics,
    ];

    /// The HTTP listeners, which the header and idle timeouts apply to.
    const HTTP: [ListenerKind; 3] = [ListenerKind::Api, ListenerKind::E2b, ListenerKind::Metrics];

    pub fn as_str(self) -> &'static str {
        match self {
            ListenerKind::Api => "api",
            ListenerKind::E2b => "e2b",
            ListenerKind::Ports => "ports",
            ListenerKind::Metrics => "metrics",
        }
    }
}

/// Why an inbound connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InboundRefusal {
    /// Its client address holds `connections.max_per_address`.
    Address { held: usize, cap: usize },
    /// The inbound budget (`connections.max_total`) is taken.
    Total { cap: usize },
}

/// What an admitted inbound connection holds until it is dropped.
#[derive(Debug)]
pub struct InboundPass {
    _address: KeyLease<IpAddr>,
    _budget: BudgetLease,
    _open: OpenGauge,
}

#[derive(Debug)]
struct OpenGauge(Arc<InboundStats>, ListenerKind);

impl Drop for OpenGauge {
    fn drop(&mut self) {
        self.0.open[self.1 as usize].fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counters per listener, for `/metrics`.
#[derive(Debug, Default)]
pub struct InboundStats {
    open: [AtomicI64; 4],
    refused_address: [AtomicU64; 4],
    refused_total: [AtomicU64; 4],
    header_timeouts: [AtomicU64; 4],
    idle_timeouts: [AtomicU64; 4],
}

/// Admission and timeouts of the daemon's TCP listeners.
#[derive(Debug)]
pub struct Inbound {
    per_address: Arc<KeyedCount<IpAddr>>,
    budget: Arc<Budget>,
    header_timeout: Duration,
    idle_timeout: Duration,
    stats: Arc<InboundStats>,
}

impl Inbound {
    pub fn new(cfg: &ConnectionsSection, budget: usize) -> Arc<Inbound> {
        Arc::new(Inbound {
            per_address: KeyedCount::new(cfg.max_per_address),
            budget: Budget::new(budget),
            header_timeout: cfg.header_timeout.0,
            idle_timeout: cfg.idle_timeout.0,
            stats: Arc::new(InboundStats::default()),
        })
    }

    /// Admits a connection from `peer` on `kind` holding `descriptors` of the
    /// inbound budget, or says which cap refused it (counted).
    pub fn admit(
        &self,
        kind: ListenerKind,
        peer: IpAddr,
        descriptors: usize,
    ) -> Result<InboundPass, InboundRefusal> {
        let k = kind as usize;
        let address = match self.per_address.try_take(&address_key(peer)) {
            Ok(l) => l,
            Err(held) => {
                self.stats.refused_address[k].fetch_add(1, Ordering::Relaxed);
                return Err(InboundRefusal::Address {
                    held,
                    cap: self.per_address.cap(),
                });
            }
        };
        let Some(budget) = self.budget.try_take(descriptors) else {
            self.stats.refused_total[k].fetch_add(1, Ordering::Relaxed);
            return Err(InboundRefusal::Total {
                cap: self.budget.cap(),
            });
        };
        self.stats.open[k].fetch_add(1, Ordering::Relaxed);
        Ok(InboundPass {
            _address: address,
            _budget: budget,
            _open: OpenGauge(self.stats.clone(), kind),
        })
    }

    /// Binds `l` to these limits for axum's server.
    pub fn listener(self: &Arc<Self>, l: TcpListener, kind: ListenerKind) -> AdmittedListener {
        AdmittedListener {
            l,
            kind,
            inbound: self.clone(),
        }
    }

    /// Prometheus text of the counters.
    pub fn render(&self, o: &mut String) {
        use std::fmt::Write;
        let s = &self.stats;
        let _ = writeln!(
            o,
            "# HELP sandlot_tcp_connections_open Connections open on the daemon's TCP listeners.\n\
             # TYPE sandlot_tcp_connections_open gauge"
        );
        for k in ListenerKind::ALL {
            let _ = writeln!(
                o,
                "sandlot_tcp_connections_open{{listener=\"{}\"}} {}",
                k.as_str(),
                s.open[k as usize].load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            o,
            "# HELP sandlot_tcp_connections_refused_total Connections refused by a cap (connections.max_per_address, connections.max_total).\n\
             # TYPE sandlot_tcp_connections_refused_total counter"
        );
        for k in ListenerKind::ALL {
            for (limit, v) in [("address", &s.refused_address), ("total", &s.refused_total)] {
                let _ = writeln!(
                    o,
                    "sandlot_tcp_connections_refused_total{{listener=\"{}\",limit=\"{limit}\"}} {}",
                    k.as_str(),
                    v[k as usize].load(Ordering::Relaxed)
                );
            }
        }
        let _ = writeln!(
            o,
            "# HELP sandlot_tcp_connections_timed_out_total Connections closed by connections.header_timeout or connections.idle_timeout.\n\
             # TYPE sandlot_tcp_connections_timed_out_total counter"
        );
        for k in ListenerKind::HTTP {
            for (t, v) in [("header", &s.header_timeouts), ("idle", &s.idle_timeouts)] {
                let _ = writeln!(
                    o,
                    "sandlot_tcp_connections_timed_out_total{{listener=\"{}\",timeout=\"{t}\"}} {}",
                    k.as_str(),
                    v[k as usize].load(Ordering::Relaxed)
                );
            }
        }
    }

    /// Descriptors of the inbound budget held now, and its size.
    pub fn descriptors(&self) -> (usize, usize) {
        (self.budget.used(), self.budget.cap())
    }
}

/// A refused client's answer, written without waiting (a client that does not
/// read gets nothing): the connection is closed right after.
fn refusal_answer(r: InboundRefusal) -> Vec<u8> {
    let message = match r {
        InboundRefusal::Address { held, .. } => format!(
            "too many connections from your address ({held} open); close some or try again later"
        ),
        InboundRefusal::Total { .. } => {
            "the daemon has too many connections open; try again later".to_string()
        }
    };
    let rid = crate::routes::request_id();
    let body = serde_json::json!({"error": {"code": "unavailable", "message": message,
        "request_id": rid}})
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\nx-request-id: {rid}\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Accepts `l`'s connections under the inbound caps, in axum's accept loop. An
/// error (out of descriptors) backs off instead of spinning.
pub async fn accept_admitted(
    l: &TcpListener,
    inbound: &Inbound,
    kind: ListenerKind,
    descriptors: usize,
) -> (TcpStream, SocketAddr, InboundPass) {
    loop {
        let (s, peer) = match l.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(listener = kind.as_str(), "accept: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        match inbound.admit(kind, peer.ip(), descriptors) {
            Ok(pass) => return (s, peer, pass),
            Err(r) => {
                tracing::debug!(listener = kind.as_str(), %peer, ?r, "connection refused");
                if kind != ListenerKind::Ports {
                    let _ = s.try_write(&refusal_answer(r));
                }
            }
        }
    }
}

/// A TCP listener whose connections are admitted and timed by an [`Inbound`].
pub struct AdmittedListener {
    l: TcpListener,
    kind: ListenerKind,
    inbound: Arc<Inbound>,
}

impl axum::serve::Listener for AdmittedListener {
    type Io = TrackedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TrackedStream, SocketAddr) {
        let (s, peer, pass) = accept_admitted(&self.l, &self.inbound, self.kind, 1).await;
        let _ = s.set_nodelay(true);
        let conn = Arc::new(ConnState::new());
        tokio::spawn(watch(conn.clone(), self.inbound.clone(), self.kind));
        (
            TrackedStream {
                inner: s,
                conn,
                _pass: pass,
            },
            peer,
        )
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.l.local_addr()
    }
}

/// What the watchdog of one connection knows of it.
#[derive(Debug)]
struct ConnState {
    base: Instant,
    /// Requests whose response is not yet sent to its end.
    in_flight: AtomicUsize,
    /// Requests served to their end.
    served: AtomicU64,
    /// When the last request ended (ms since `base`).
    idle_since: AtomicU64,
    /// When the first byte of the next request head arrived (ms since `base`
    /// plus one; 0: none yet).
    head_since: AtomicU64,
    upgraded: AtomicBool,
    closed: AtomicBool,
    /// Set by the watchdog: reads see end of stream, writes fail.
    killed: AtomicBool,
    reader: AtomicWaker,
    /// Wakes the watchdog when its deadline may have moved or the connection closed.
    changed: Notify,
}

/// Which deadline a connection is under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    Header,
    Idle,
}

/// When a connection must have made progress by, and which timer that is; `None`
/// while a request is in flight or after an upgrade. Pure: times in ms since the
/// connection's start.
pub fn conn_deadline(
    in_flight: usize,
    upgraded: bool,
    served: u64,
    idle_since: u64,
    head_since: Option<u64>,
    header: Duration,
    idle: Duration,
) -> Option<(u64, Timer)> {
    if upgraded || in_flight > 0 {
        return None;
    }
    let ms = |d: Duration| d.as_millis() as u64;
    Some(match head_since {
        Some(h) => (h + ms(header), Timer::Header),
        // A new connection owes its first request head at once.
        None if served == 0 => (idle_since + ms(header), Timer::Header),
        None => (idle_since + ms(idle), Timer::Idle),
    })
}

impl ConnState {
    fn new() -> ConnState {
        ConnState {
            base: Instant::now(),
            in_flight: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
            upgraded: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            killed: AtomicBool::new(false),
            reader: AtomicWaker::new(),
            changed: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    fn deadline(&self, header: Duration, idle: Duration) -> Option<(u64, Timer)> {
        let h = self.head_since.load(Ordering::Acquire);
        conn_deadline(
            self.in_flight.load(Ordering::Acquire),
            self.upgraded.load(Ordering::Acquire),
            self.served.load(Ordering::Acquire),
            self.idle_since.load(Ordering::Acquire),
            (h > 0).then(|| h - 1),
            header,
            idle,
        )
    }

    fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_since.store(0, Ordering::Release);
    }

    fn request_ended(&self) {
        self.idle_since.store(self.now_ms(), Ordering::Release);
        self.served.fetch_add(1, Ordering::AcqRel);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.changed.notify_one();
    }

    fn bytes_read(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0
            && self
                .head_since
                .compare_exchange(0, self.now_ms() + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            self.changed.notify_one();
        }
    }
}

/// Closes the connection when its deadline passes.
async fn watch(conn: Arc<ConnState>, inbound: Arc<Inbound>, kind: ListenerKind) {
    let (header, idle) = (inbound.header_timeout, inbound.idle_timeout);
    loop {
        if conn.closed.load(Ordering::Acquire) {
            return;
        }
        match conn.deadline(header, idle) {
            None => conn.changed.notified().await,
            Some((at, timer)) => {
                let when = conn.base + Duration::from_millis(at);
                tokio::select! {
                    _ = conn.changed.notified() => {}
                    _ = tokio::time::sleep_until(when) => {
                        // Still the same deadline (nothing happened meanwhile)?
                        if conn.deadline(header, idle) == Some((at, timer))
                            && !conn.closed.load(Ordering::Acquire)
                        {
                            let c = match timer {
                                Timer::Header => &inbound.stats.header_timeouts,
                                Timer::Idle => &inbound.stats.idle_timeouts,
                            };
                            c[kind as usize].fetch_add(1, Ordering::Relaxed);
                            conn.killed.store(true, Ordering::Release);
                            conn.reader.wake();
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// An admitted connection: its descriptors are counted until it is dropped, its
/// reads tell the watchdog when a request starts arriving, and the watchdog can
/// end it (reads then see end of stream, which makes the server close it).
pub struct TrackedStream {
    inner: TcpStream,
    conn: Arc<ConnState>,
    _pass: InboundPass,
}

impl Drop for TrackedStream {
    fn drop(&mut self) {
        self.conn.closed.store(true, Ordering::Release);
        self.conn.changed.notify_one();
    }
}

impl AsyncRead for TrackedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let me = self.get_mut();
        if me.conn.killed.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        me.conn.reader.register(cx.waker());
        let before = buf.filled().len();
        let r = Pin::new(&mut me.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            me.conn.bytes_read();
        }
        r
    }
}

impl AsyncWrite for TrackedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let me = self.get_mut();
        if me.conn.killed.load(Ordering::Acquire) {
            return Poll::Ready(Err(std::io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut me.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let me = self.get_mut();
        if me.conn.killed.load(Ordering::Acquire) {
            return Poll::Ready(Err(std::io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut me.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The connection of a request on a TCP listener: its peer, and its state for
/// [`track`].
#[derive(Clone)]
pub struct ConnInfo {
    pub peer: SocketAddr,
    conn: Arc<ConnState>,
}

impl Connected<IncomingStream<'_, AdmittedListener>> for ConnInfo {
    fn connect_info(stream: IncomingStream<'_, AdmittedListener>) -> Self {
        ConnInfo {
            peer: *stream.remote_addr(),
            conn: stream.io().conn.clone(),
        }
    }
}

/// Middleware of the TCP routers: counts the request as in flight until its
/// response body has been sent (or dropped), marks upgraded connections, and
/// gives handlers the peer address as `ConnectInfo<SocketAddr>`.
pub async fn track(mut req: Request, next: Next) -> Response {
    let Some(info) = req.extensions().get::<ConnectInfo<ConnInfo>>().cloned() else {
        return next.run(req).await;
    };
    req.extensions_mut().insert(ConnectInfo(info.0.peer));
    let conn = info.0.conn;
    conn.request_started();
    let guard = InFlight(conn.clone());
    let resp = next.run(req).await;
    if resp.status() == axum::http::StatusCode::SWITCHING_PROTOCOLS {
        conn.upgraded.store(true, Ordering::Release);
    }
    resp.map(|b| {
        Body::new(TrackedBody {
            inner: b,
            _guard: guard,
        })
    })
}

/// A request in flight until dropped.
struct InFlight(Arc<ConnState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_ended();
    }
}

/// A response body that keeps its request in flight until it is done.
struct TrackedBody {
    inner: Body,
    _guard: InFlight,
}

impl http_body::Body for TrackedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `app` on `l` under `inbound`'s caps and timeouts until `stop`.
pub fn serve(
    inbound: &Arc<Inbound>,
    l: TcpListener,
    kind: ListenerKind,
    app: axum::Router,
    stop: impl Future<Output = ()> + Send + 'static,
) -> impl Future<Output = std::io::Result<()>> + Send {
    let app = app
        .layer(axum::middleware::from_fn(track))
        .into_make_service_with_connect_info::<ConnInfo>();
    std::future::IntoFuture::into_future(
        axum::serve(inbound.listener(l, kind), app).with_graceful_shutdown(stop),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conns(max_per_address: usize, max_total: usize, reserve: usize) -> ConnectionsSection {
        ConnectionsSection {
            max_per_address,
            max_total,
            reserve,
            ..Default::default()
        }
    }

    #[test]
    fn the_open_file_limit_is_shared_out_with_a_reserve_tcp_clients_never_get() {
        let p = DescriptorPlan::new(20_000, &ConnectionsSection::default());
        assert_eq!((p.reserve, p.inbound, p.egress), (10_000, 2_500, 7_500));
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
        assert_eq!(p.reserve + p.inbound + p.egress, p.limit);
        let p = DescriptorPlan::new(1024, &conns(8, 100, 300));
        assert_eq!((p.reserve, p.inbound, p.egress), (300, 100, 624));
        // Settings that do not fit are cut down, with a warning naming them.
        let p = DescriptorPlan::new(1024, &conns(8, 5000, 2000));
        assert_eq!((p.reserve, p.inbound, p.egress), (512, 512, 0));
        assert!(
            p.warnings[0].contains("connections.reserve 2000"),
            "{:?}",
            p.warnings
        );
        assert!(
            p.warnings[1].contains("connections.max_total 5000"),
            "{:?}",
            p.warnings
        );
        assert!(p.warnings[2].contains("LimitNOFILE"), "{:?}", p.warnings);
    }

    #[test]
    fn inbound_connections_are_capped_per_address_and_in_total() {
        let i = Inbound::new(&conns(2, 0, 0), 5);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let a1 = i.admit(ListenerKind::Api, a, 1).unwrap();
        let a2 = i.admit(ListenerKind::E2b, a, 1).unwrap();
        assert_eq!(
            i.admit(ListenerKind::Api, a, 1).unwrap_err(),
            InboundRefusal::Address { held: 2, cap: 2 },
            "one address, all listeners together"
        );
        let b1 = i.admit(ListenerKind::Ports, b, 2).unwrap();
        assert_eq!(
            i.admit(ListenerKind::Api, b, 2).unwrap_err(),
            InboundRefusal::Total { cap: 5 }
        );
        assert_eq!(i.descriptors(), (4, 5));
        let mut t = String::new();
        i.render(&mut t);
        assert!(
            t.contains("sandlot_tcp_connections_open{listener=\"api\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("sandlot_tcp_connections_open{listener=\"ports\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains(
                "sandlot_tcp_connections_refused_total{listener=\"api\",limit=\"address\"} 1\n"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "sandlot_tcp_connections_refused_total{listener=\"api\",limit=\"total\"} 1\n"
            ),
            "{t}"
        );
        drop((a1, a2, b1));
        assert_eq!(i.descriptors(), (0, 5));
        let mut t = String::new();
        i.render(&mut t);
        assert!(
            t.contains("sandlot_tcp_connections_open{listener=\"api\"} 0\n"),
            "{t}"
        );
        let r = String::from_utf8(refusal_answer(InboundRefusal::Total { cap: 5 })).unwrap();
        assert!(r.starts_with("HTTP/1.1 503 "), "{r}");
        let body = r.split("\r\n\r\n").nth(1).unwrap();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "unavailable");
        assert!(
            r.contains(&format!("content-length: {}\r\n", body.len())),
            "{r}"
        );
    }

    #[test]
    fn a_connection_owes_a_request_head_then_may_idle_and_never_times_out_mid_request() {
        let (h, i) = (Duration::from_secs(15), Duration::from_secs(60));
        // A new connection that sends nothing: the header timer from the start.
        assert_eq!(
            conn_deadline(0, false, 0, 0, None, h, i),
            Some((15_000, Timer::Header))
        );
        // Bytes of a head arrived at 2s: 15s from them.
        assert_eq!(
            conn_deadline(0, false, 0, 0, Some(2_000), h, i),
            Some((17_000, Timer::Header))
        );
        // A request in flight (a stream, a long poll), or an upgrade: no timer.
        assert_eq!(conn_deadline(1, false, 0, 0, None, h, i), None);
        assert_eq!(conn_deadline(0, true, 3, 9_000, None, h, i), None);
        // Kept alive after a request that ended at 9s: idle until 69s.
        assert_eq!(
            conn_deadline(0, false, 1, 9_000, None, h, i),
            Some((69_000, Timer::Idle))
        );
        // ... unless the next head starts arriving.
        assert_eq!(
            conn_deadline(0, false, 1, 9_000, Some(10_000), h, i),
            Some((25_000, Timer::Header))
        );
    }
}
