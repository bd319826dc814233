//! The transparent TCP proxy. Every TCP connection a slot opens is redirected here
//! by the nftables table; the proxy recovers the address the sandbox dialled
//! (`SO_ORIGINAL_DST`), then:
//!
//! * a CIDR rule (or `open` mode) that covers that address and port: connect there,
//!   unless the operator's ceiling forbids the address;
//! * otherwise, with name rules: read the TLS ClientHello's SNI or the HTTP `Host`,
//!   check the name and port, resolve the name itself and connect to *its* address
//!   (so dialling an allowed IP with a denied name, forging DNS, or fronting a denied
//!   name behind an allowed one's address fails);
//! * otherwise refuse (connection reset).
//!
//! Each attempt is reported with its bytes once it ends. A policy change re-checks
//! open connections and cuts those no longer allowed.

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
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn serve(l: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((s, peer)) = l.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let Some(sb) = shared.sandbox_at(peer.ip()) else {
                return;
            };
            handle(&shared, sb, s).await;
        });
    }
}

/// How a connection was allowed; re-checked when the policy changes.
#[derive(Debug, Clone)]
enum Grant {
    Addr(IpAddr, u16),
    Name(String, u16),
}

impl Grant {
    fn still_allowed(&self, p: &Policy) -> bool {
        match self {
            Grant::Addr(ip, port) => p.allows_addr(*ip, *port),
            Grant::Name(n, port) => p.allows_name(n, *port),
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
    let (grant, targets) = if policy.allows_addr(oip, port) {
        if let Some(why) = shared.ceiling.denies(oip, &locals) {
            ev.reason = format!("{oip} is off limits: {why}");
            reset(&client);
            shared.record(ev);
            return;
        }
        (Grant::Addr(oip, port), vec![SocketAddr::new(oip, port)])
    } else if policy.has_names() {
        let name = match read_name(&mut client, &mut first).await {
            Ok(n) => n,
            Err(why) => {
                ev.reason = why;
                reset(&client);
                shared.record(ev);
                return;
            }
        };
        ev.name = Some(name.clone());
        if !policy.allows_name(&name, port) {
            ev.reason = format!("no rule allows {name}:{port}");
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
        (Grant::Name(name, port), ok)
    } else {
        ev.reason = format!("no rule allows {oip}:{port}");
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
    ev.decision = Decision::Allowed;
    let _ = up.set_nodelay(true);
    let _ = client.set_nodelay(true);
    if !first.is_empty() && up.write_all(&first).await.is_err() {
        ev.decision = Decision::Failed;
        ev.reason = format!("write to {at} failed");
        shared.record(ev);
        return;
    }
    let out = Arc::new(AtomicU64::new(first.len() as u64));
    let inn = Arc::new(AtomicU64::new(0));
    let mut gen = sb.generation.subscribe();
    let relay = relay(client, up, out.clone(), inn.clone());
    tokio::pin!(relay);
    ev.reason = match &grant {
        Grant::Addr(..) => format!("address rule ({})", policy.mode.as_str()),
        Grant::Name(n, p) => format!("name rule {n}:{p}"),
    };
    loop {
        tokio::select! {
            _ = &mut relay => break,
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

/// Reads until the first bytes name a destination.
async fn read_name(client: &mut TcpStream, buf: &mut Vec<u8>) -> Result<String, String> {
    let deadline = tokio::time::Instant::now() + SNIFF_TIMEOUT;
    let mut chunk = [0u8; 4096];
    loop {
        match sniff::sniff(buf) {
            Sniffed::Tls { sni, .. } => return Ok(sni.to_ascii_lowercase()),
            Sniffed::Http { host, header_end } => {
                *buf = sniff::force_connection_close(buf, header_end);
                return Ok(host);
            }
            Sniffed::TlsNoSni => return Err("TLS without a server name (SNI)".into()),
            Sniffed::BadHttp(why) => return Err(format!("HTTP refused: {why}")),
            Sniffed::Unknown => {
                return Err("neither TLS with a server name nor HTTP with a Host header".into())
            }
            Sniffed::NeedMore => {}
        }
        if buf.len() >= sniff::MAX_PEEK {
            return Err("no server name in the first 16 KiB".into());
        }
        match tokio::time::timeout_at(deadline, client.read(&mut chunk)).await {
            Ok(Ok(0)) => return Err("closed before naming a server".into()),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Ok(Err(e)) => return Err(format!("read: {e}")),
            Err(_) => return Err("sent no TLS ClientHello or HTTP request within 5s".into()),
        }
    }
}

async fn relay(client: TcpStream, up: TcpStream, out: Arc<AtomicU64>, inn: Arc<AtomicU64>) {
    let (mut cr, mut cw) = client.into_split();
    let (mut ur, mut uw) = up.into_split();
    let a = async {
        let mut b = vec![0u8; 16 * 1024];
        loop {
            match cr.read(&mut b).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if uw.write_all(&b[..n]).await.is_err() {
                        break;
                    }
                    out.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        }
        let _ = uw.shutdown().await;
    };
    let b = async {
        let mut b = vec![0u8; 16 * 1024];
        loop {
            match ur.read(&mut b).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if cw.write_all(&b[..n]).await.is_err() {
                        break;
                    }
                    inn.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        }
        let _ = cw.shutdown().await;
    };
    tokio::join!(a, b);
}
