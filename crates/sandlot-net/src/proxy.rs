//! The transparent TCP proxy. Every TCP connection a slot opens is redirected here
//! by the nftables table; the proxy recovers the address the sandbox dialled
//! (`SO_ORIGINAL_DST`), then:
//!
//! * a CIDR rule (or `open` mode, where no deny rule names the address and port):
//!   connect there, unless the operator's ceiling forbids the address; in `open`
//!   mode with deny name rules, first read the SNI or `Host` (within
//!   [`SCREEN_TIMEOUT`]) and refuse a denied name, or a TLS or HTTP opening that
//!   does not name its server (only a connection that sends nothing goes on
//!   unnamed);
//! * otherwise, with name rules: read the TLS ClientHello's SNI or the HTTP `Host`,
//!   check the name and port, resolve the name itself and connect to *its* address
//!   (so dialling an allowed IP with a denied name, forging DNS, or fronting a denied
//!   name behind an allowed one's address fails);
//! * otherwise refuse (connection reset).
//!
//! Each attempt is reported with its bytes once it ends. A policy change re-checks
//! open connections and cuts those no longer allowed, and those admitted without a
//! name when a deny name rule they were not screened against arrives.

use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::policy::Policy;
use crate::sniff::{self, Sniffed};
use crate::{now_ms, Attached, AuditEvent, Decision, EventKind, Shared};

const SNIFF_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connection of an `open` sandbox with deny name rules has to name a
/// server. One that sent nothing by then goes on unnamed (protocols where the
/// server speaks first wait this); one that began a TLS or HTTP opening is reset.
pub const SCREEN_TIMEOUT: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn serve(l: TcpListener, shared: Arc<Shared>) {
    loop {
        let (s, peer) = match l.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors (EMFILE, ENFILE): back off rather than spin.
                tracing::debug!("egress proxy accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Some(sb) = shared.sandbox_at(peer.ip()) else {
            continue;
        };
        let admitted = match shared.conns.admit(&sb.sandbox, &sb.tenant()) {
            Ok(a) => a,
            Err(r) => {
                let dest = rustix::net::sockopt::ip_original_dst(&s)
                    .ok()
                    .map(|a| (IpAddr::V4(*a.ip()), a.port()));
                reset(&s);
                shared.refused(&sb, EventKind::Tcp, r, dest);
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let _open = shared.stats.open_connection();
            handle(&shared, sb, s).await;
            drop(admitted);
        });
    }
}

/// How a connection was allowed; re-checked when the policy changes.
#[derive(Debug, Clone)]
enum Grant {
    /// By address; with the name the first bytes gave, when the proxy read them.
    /// `under` is the policy that admitted it.
    Addr {
        ip: IpAddr,
        port: u16,
        name: Option<String>,
        under: Arc<Policy>,
    },
    /// By the name its first bytes gave, connected to `ip` (the name's address).
    Name { name: String, port: u16, ip: IpAddr },
}

impl Grant {
    fn still_allowed(&self, p: &Policy) -> bool {
        match self {
            // Never name-checked: a deny name rule it was not screened against
            // cuts it (it may be talking to that name).
            Grant::Addr {
                ip,
                port,
                name: None,
                under,
            } => p.allows_addr(*ip, *port) && !p.denies_names_beyond(under),
            Grant::Addr {
                ip,
                port,
                name: Some(n),
                ..
            } => p.allows_named_addr(*ip, *port, n),
            // Still admitted by its name, or now allowed outright by its name and
            // address (a loosened policy does not cut it).
            Grant::Name { name, port, ip } => {
                p.admits_by_name(name, *port) || p.allows_named_addr(*ip, *port, name)
            }
        }
    }
}

fn reset(s: &TcpStream) {
    // A zero linger makes close send RST: the sandbox sees "connection reset".
    let _ = rustix::net::sockopt::set_socket_linger(s, Some(Duration::ZERO));
}

async fn handle(shared: &Shared, sb: Arc<Attached>, mut client: TcpStream) {
    let Ok(orig) = rustix::net::sockopt::ip_original_dst(&client) else {
        reset(&client);
        return;
    };
    let (oip, port) = (IpAddr::V4(*orig.ip()), orig.port());
    let mut ev = AuditEvent {
        sandbox: sb.sandbox.clone(),
        at_ms: now_ms(),
        kind: EventKind::Tcp,
        name: None,
        addr: Some(oip),
        port: Some(port),
        decision: Decision::Denied,
        reason: String::new(),
        bytes_out: 0,
        bytes_in: 0,
    };
    let policy = sb.policy();
    let locals = shared.locals.get();
    let mut first = Vec::new();
    let (mut grant, targets) = if policy.allows_addr(oip, port) {
        if let Some(why) = shared.ceiling.denies(oip, &locals) {
            ev.reason = format!("{oip} is off limits: {why}");
            reset(&client);
            shared.record(ev);
            return;
        }
        let mut named = None;
        if policy.screens_names() {
            match read_name(&mut client, &mut first, SCREEN_TIMEOUT).await {
                Named::Name(n) => {
                    ev.name = Some(n.clone());
                    if !policy.allows_named_addr(oip, port, &n) {
                        ev.reason = format!("a deny rule names {n}:{port}");
                        reset(&client);
                        shared.record(ev);
                        return;
                    }
                    named = Some(n);
                }
                // No name to check: the address decides (a literal address
                // reaches a denied name's server).
                Named::Unnamed(_) => {}
                Named::Refused(why) => {
                    ev.reason = why;
                    reset(&client);
                    shared.record(ev);
                    return;
                }
            }
        }
        (
            Grant::Addr {
                ip: oip,
                port,
                name: named,
                under: policy.clone(),
            },
            vec![SocketAddr::new(oip, port)],
        )
    } else if policy.has_names() {
        let name = match read_name(&mut client, &mut first, SNIFF_TIMEOUT).await {
            Named::Name(n) => n,
            Named::Unnamed(why) | Named::Refused(why) => {
                ev.reason = why;
                reset(&client);
                shared.record(ev);
                return;
            }
        };
        ev.name = Some(name.clone());
        if !policy.admits_by_name(&name, port) {
            ev.reason = if policy.mode == sandlot_proto::spec::NetworkMode::Open {
                format!("a deny rule names {oip}:{port}")
            } else {
                format!("no rule allows {name}:{port}")
            };
            reset(&client);
            shared.record(ev);
            return;
        }
        let addrs = match crate::resolver::resolve_a(&shared.upstream, &name).await {
            Ok(a) => a,
            Err(e) => {
                ev.decision = Decision::Failed;
                ev.reason = e;
                reset(&client);
                shared.record(ev);
                return;
            }
        };
        let mut ok = Vec::new();
        let mut why = String::new();
        for a in addrs {
            match shared.ceiling.denies(IpAddr::V4(a), &locals) {
                None => ok.push(SocketAddr::V4(SocketAddrV4::new(a, port))),
                Some(w) => why = format!("{name} resolves to {a}, off limits: {w}"),
            }
        }
        if ok.is_empty() {
            ev.reason = why;
            reset(&client);
            shared.record(ev);
            return;
        }
        (
            Grant::Name {
                name,
                port,
                ip: oip,
            },
            ok,
        )
    } else {
        ev.reason = if policy.mode == sandlot_proto::spec::NetworkMode::Open {
            format!("a deny rule names {oip}:{port}")
        } else {
            format!("no rule allows {oip}:{port}")
        };
        reset(&client);
        shared.record(ev);
        return;
    };
    let mut upstream = None;
    let mut err = String::new();
    for t in &targets {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(t)).await {
            Ok(Ok(s)) => {
                upstream = Some((s, *t));
                break;
            }
            Ok(Err(e)) => err = format!("connect {t}: {e}"),
            Err(_) => err = format!("connect {t}: timed out"),
        }
    }
    let Some((mut up, at)) = upstream else {
        ev.decision = Decision::Failed;
        ev.reason = err;
        reset(&client);
        shared.record(ev);
        return;
    };
    ev.addr = Some(at.ip());
    if let Grant::Name { ip, .. } = &mut grant {
        *ip = at.ip();
    }
    ev.decision = Decision::Allowed;
    let _ = up.set_nodelay(true);
    let _ = client.set_nodelay(true);
    if !first.is_empty() && up.write_all(&first).await.is_err() {
        ev.decision = Decision::Failed;
        ev.reason = format!("write to {at} failed");
        shared.record(ev);
        return;
    }
    // The sniffed opening (up to 64 KiB and its spare room) is not kept for the
    // connection's life.
    let out = Arc::new(AtomicU64::new(first.len() as u64));
    drop(first);
    let inn = Arc::new(AtomicU64::new(0));
    let mut gen = sb.generation.subscribe();
    let relay = relay(client, up, out.clone(), inn.clone(), shared.timeouts);
    tokio::pin!(relay);
    ev.reason = match &grant {
        Grant::Addr { .. } => format!("address rule ({})", policy.mode.as_str()),
        Grant::Name { name, port, .. } => format!("name rule {name}:{port}"),
    };
    loop {
        tokio::select! {
            end = &mut relay => {
                if let Some(why) = shared.stats.relay_ended(end, &shared.timeouts) {
                    ev.reason.push_str("; closed: ");
                    ev.reason.push_str(&why);
                }
                break;
            }
            changed = gen.changed() => {
                let revoked = changed.is_err()
                    || shared.sandbox_at(IpAddr::V4(sb.slot.sandbox_ip)).is_none()
                    || !grant.still_allowed(&sb.policy());
                if revoked {
                    ev.reason.push_str("; cut: the policy no longer allows it");
                    break;
                }
            }
        }
    }
    ev.bytes_out = out.load(Ordering::Relaxed);
    ev.bytes_in = inn.load(Ordering::Relaxed);
    shared.record(ev);
}

/// What a connection's first bytes say about its destination.
enum Named {
    /// The TLS server name or HTTP `Host`, lowercase.
    Name(String),
    /// Nothing names a server (not TLS or HTTP, TLS without SNI, nothing sent
    /// before the deadline or the close); why.
    Unnamed(String),
    /// An opening the proxy cannot vouch for: HTTP that could name two hosts, a
    /// TLS or HTTP opening cut short by the deadline, the size bound or a close,
    /// or the read failed.
    Refused(String),
}

/// Reads until the first bytes name a destination, or `wait` has passed. Once
/// bytes that begin a TLS ClientHello or an HTTP request have arrived, only their
/// name lets the connection go on: running out of time or room, or a close before
/// the opening is complete, refuses it.
async fn read_name(client: &mut TcpStream, buf: &mut Vec<u8>, wait: Duration) -> Named {
    let deadline = tokio::time::Instant::now() + wait;
    let mut chunk = [0u8; 4096];
    loop {
        match sniff::sniff(buf) {
            Sniffed::Tls { sni, .. } => return Named::Name(sni.to_ascii_lowercase()),
            Sniffed::Http { host, header_end } => {
                *buf = sniff::force_connection_close(buf, header_end);
                return Named::Name(host);
            }
            Sniffed::TlsNoSni => return Named::Unnamed("TLS without a server name (SNI)".into()),
            Sniffed::Refused(why) => return Named::Refused(format!("refused: {why}")),
            Sniffed::Unknown => {
                return Named::Unnamed(
                    "neither TLS with a server name nor HTTP with a Host header".into(),
                )
            }
            Sniffed::NeedMore => {}
        }
        let cut_short =
            |what: &str| Named::Refused(format!("a TLS or HTTP opening named no server: {what}"));
        match tokio::time::timeout_at(deadline, client.read(&mut chunk)).await {
            Ok(Ok(0)) if buf.is_empty() => {
                return Named::Unnamed("closed before sending anything".into())
            }
            Ok(Ok(0)) => return cut_short("it ended"),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Ok(Err(e)) => return Named::Refused(format!("read: {e}")),
            Err(_) if buf.is_empty() => {
                return Named::Unnamed(format!(
                    "sent nothing within {}s (the server may speak first)",
                    wait.as_secs()
                ))
            }
            Err(_) => return cut_short(&format!("still incomplete after {}s", wait.as_secs())),
        }
    }
}

/// How long a relayed connection may stay quiet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayTimeouts {
    /// No byte either way for this long: both sides are closed.
    pub idle: Duration,
    /// Once one side has closed its sending half, the other direction is closed
    /// when it has been silent this long.
    pub half_closed: Duration,
}

/// How a relay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayEnd {
    /// Both sides closed their sending halves.
    Closed,
    /// A side reset the connection or a write failed: both were closed at once.
    Broken,
    /// Neither side sent anything for [`RelayTimeouts::idle`].
    Idle,
    /// One side had closed and the other was silent for
    /// [`RelayTimeouts::half_closed`].
    HalfClosed,
}

/// When a relay that was last active at `last` must end, and why: the idle bound,
/// or the shorter half-close bound once one side has closed (`fin`).
pub fn relay_deadline(
    last: tokio::time::Instant,
    fin: bool,
    t: &RelayTimeouts,
) -> (tokio::time::Instant, RelayEnd) {
    if fin && t.half_closed < t.idle {
        (last + t.half_closed, RelayEnd::HalfClosed)
    } else {
        (last + t.idle, RelayEnd::Idle)
    }
}

/// The time of a relay's last transfer, as milliseconds since its start.
struct LastActive {
    start: tokio::time::Instant,
    ms: AtomicU64,
}

impl LastActive {
    fn touch(&self) {
        self.ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    fn get(&self) -> tokio::time::Instant {
        self.start + Duration::from_millis(self.ms.load(Ordering::Relaxed))
    }
}

/// Copies one direction until end of stream (`Ok`) or an error (`Err`), counting
/// bytes and noting the time of each transfer in `last`.
async fn pump(
    r: &mut tokio::net::tcp::OwnedReadHalf,
    w: &mut tokio::net::tcp::OwnedWriteHalf,
    count: &AtomicU64,
    last: &LastActive,
) -> Result<(), ()> {
    let mut b = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut b).await {
            Ok(0) => break,
            Ok(n) => {
                last.touch();
                w.write_all(&b[..n]).await.map_err(|_| ())?;
                count.fetch_add(n as u64, Ordering::Relaxed);
                last.touch();
            }
            Err(_) => return Err(()),
        }
    }
    // Pass the end of stream on; the other direction goes on (half-close).
    let _ = w.shutdown().await;
    Ok(())
}

/// Relays bytes both ways until both sides have closed, either side breaks, the
/// connection is idle for `t.idle`, or one side has closed and the other stays
/// silent for `t.half_closed`. Both sockets are closed when it returns: a relay
/// never outlives its sandbox's side, nor waits for ever on a silent upstream.
async fn relay(
    client: TcpStream,
    up: TcpStream,
    out: Arc<AtomicU64>,
    inn: Arc<AtomicU64>,
    t: RelayTimeouts,
) -> RelayEnd {
    let (mut cr, mut cw) = client.into_split();
    let (mut ur, mut uw) = up.into_split();
    let last = LastActive {
        start: tokio::time::Instant::now(),
        ms: AtomicU64::new(0),
    };
    let end = {
        let a = pump(&mut cr, &mut uw, &out, &last);
        let b = pump(&mut ur, &mut cw, &inn, &last);
        tokio::pin!(a, b);
        let (mut a_done, mut b_done) = (false, false);
        loop {
            if a_done && b_done {
                break RelayEnd::Closed;
            }
            let (deadline, why) = relay_deadline(last.get(), a_done || b_done, &t);
            tokio::select! {
                r = &mut a, if !a_done => match r {
                    Ok(()) => a_done = true,
                    Err(()) => break RelayEnd::Broken,
                },
                r = &mut b, if !b_done => match r {
                    Ok(()) => b_done = true,
                    Err(()) => break RelayEnd::Broken,
                },
                _ = tokio::time::sleep_until(deadline) => {
                    // Activity since the deadline was computed moves it.
                    if relay_deadline(last.get(), a_done || b_done, &t).0 <= tokio::time::Instant::now() {
                        break why;
                    }
                }
            }
        }
    };
    if end == RelayEnd::Broken {
        // Pass a reset on rather than a clean end of stream.
        if let (Ok(c), Ok(u)) = (cr.reunite(cw), ur.reunite(uw)) {
            reset(&c);
            reset(&u);
        }
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connected pair on loopback: (the outside end, the proxy's end).
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let outside = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (inside, _) = l.accept().await.unwrap();
        (outside, inside)
    }

    /// A relay between two loopback pairs: (the sandbox's end, the server's end,
    /// the relay).
    async fn relay_of(
        t: RelayTimeouts,
    ) -> (TcpStream, TcpStream, tokio::task::JoinHandle<RelayEnd>) {
        let (sandbox, client) = pair().await;
        let (server, up) = pair().await;
        let counts = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let task = tokio::spawn(relay(client, up, counts.0, counts.1, t));
        (sandbox, server, task)
    }

    #[tokio::test]
    async fn a_relay_ends_when_one_side_has_closed_and_the_other_stays_silent() {
        let (mut sandbox, mut server, task) = relay_of(RelayTimeouts {
            idle: Duration::from_secs(60),
            half_closed: Duration::from_millis(300),
        })
        .await;
        sandbox.write_all(b"hello").await.unwrap();
        // The sandbox's process goes away: its end closes.
        drop(sandbox);
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(
            got, b"hello",
            "bytes and then the end of stream are passed on"
        );
        // The server never answers nor closes: the relay does not wait for it.
        let end = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the relay lingered")
            .unwrap();
        assert_eq!(end, RelayEnd::HalfClosed);
        // The proxy's upstream socket is closed too: the server's writes now meet a
        // reset.
        let _ = server.write_all(b"late").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            server.write_all(b"later").await.is_err(),
            "the upstream side is still open"
        );
    }

    #[tokio::test]
    async fn a_relay_lives_while_bytes_flow_and_ends_when_both_sides_fall_silent() {
        let (mut sandbox, mut server, task) = relay_of(RelayTimeouts {
            idle: Duration::from_millis(400),
            half_closed: Duration::from_millis(400),
        })
        .await;
        // Twice the idle bound of steady traffic.
        for _ in 0..8 {
            sandbox.write_all(b"x").await.unwrap();
            let mut b = [0u8; 1];
            server.read_exact(&mut b).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(!task.is_finished(), "cut while bytes flowed");
        let end = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("an idle relay was kept")
            .unwrap();
        assert_eq!(end, RelayEnd::Idle);
        let mut b = [0u8; 8];
        let closed = tokio::time::timeout(Duration::from_secs(2), sandbox.read(&mut b))
            .await
            .expect("the sandbox's side is still open");
        assert_eq!(closed.unwrap_or(0), 0, "the sandbox's side is closed");
    }

    fn open(deny: &[&str], allow: &[&str]) -> Arc<Policy> {
        use sandlot_proto::spec::{AllowRule, NetworkMode, NetworkSpec};
        let s = NetworkSpec {
            mode: NetworkMode::Open,
            allow: allow.iter().map(|d| AllowRule::domain(d)).collect(),
            deny: deny.iter().map(|d| AllowRule::domain(d)).collect(),
        };
        s.validate().unwrap();
        Arc::new(Policy::compile(&s))
    }

    #[test]
    fn a_connection_admitted_unnamed_is_cut_by_a_new_deny_name_rule() {
        let ip: IpAddr = "203.0.113.9".parse().unwrap();
        let unnamed = |under: Arc<Policy>| Grant::Addr {
            ip,
            port: 443,
            name: None,
            under,
        };
        // Admitted under plain `open`: a deny name rule arrives.
        let g = unnamed(open(&[], &[]));
        assert!(g.still_allowed(&open(&[], &[])));
        assert!(!g.still_allowed(&open(&["denied.test"], &[])));
        // Admitted unnamed while that rule already held (the server speaks first):
        // kept while the rules stay, cut when another deny name rule arrives.
        let g = unnamed(open(&["denied.test"], &[]));
        assert!(g.still_allowed(&open(&["denied.test"], &[])));
        assert!(g.still_allowed(&open(&[], &[])));
        assert!(!g.still_allowed(&open(&["denied.test", "other.test"], &[])));
        // A named connection is judged by its name.
        let g = Grant::Addr {
            ip,
            port: 443,
            name: Some("fine.test".into()),
            under: open(&[], &[]),
        };
        assert!(g.still_allowed(&open(&["denied.test"], &[])));
        assert!(!g.still_allowed(&open(&["fine.test"], &[])));
    }

    #[test]
    fn loosening_the_policy_keeps_a_connection_granted_by_name() {
        let g = Grant::Name {
            name: "api.corp.test".into(),
            port: 443,
            ip: "203.0.113.9".parse().unwrap(),
        };
        assert!(g.still_allowed(&open(&["*.corp.test"], &["api.corp.test"])));
        assert!(g.still_allowed(&open(&[], &[])), "switched to plain open");
        assert!(!g.still_allowed(&open(&["api.corp.test"], &[])));
    }

    #[test]
    fn a_half_closed_relay_ends_sooner_than_an_idle_one() {
        let t = RelayTimeouts {
            idle: Duration::from_secs(900),
            half_closed: Duration::from_secs(30),
        };
        let now = tokio::time::Instant::now();
        assert_eq!(
            relay_deadline(now, false, &t),
            (now + Duration::from_secs(900), RelayEnd::Idle)
        );
        assert_eq!(
            relay_deadline(now, true, &t),
            (now + Duration::from_secs(30), RelayEnd::HalfClosed)
        );
        // A half-close bound above the idle bound never extends it.
        let t = RelayTimeouts {
            idle: Duration::from_secs(10),
            half_closed: Duration::from_secs(60),
        };
        assert_eq!(
            relay_deadline(now, true, &t),
            (now + Duration::from_secs(10), RelayEnd::Idle)
        );
    }
}
