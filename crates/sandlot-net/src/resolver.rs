//! The daemon's DNS resolver for sandboxes: answers only names the sandbox's policy
//! allows (others get NXDOMAIN), never passes on HTTPS/SVCB records (they carry
//! Encrypted Client Hello keys), forwards allowed queries to the operator's upstream,
//! and reports every query. Every DNS packet a slot sends, to any address, is
//! redirected here by the nftables table.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

use crate::dns::{self, qtype, rcode};
use crate::{now_ms, AuditEvent, Decision, EventKind, NetError, Shared};

const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(3);

/// Binds UDP and TCP on one free port of every address.
pub async fn bind() -> Result<(UdpSocket, TcpListener), NetError> {
    let mut last = None;
    for _ in 0..32 {
        let udp = UdpSocket::bind("0.0.0.0:0")
            .await
            .map_err(|e| NetError::Io {
                what: "bind the resolver (udp)".into(),
                source: e,
            })?;
        let port = udp.local_addr().map(|a| a.port()).unwrap_or(0);
        match TcpListener::bind(("0.0.0.0", port)).await {
            Ok(t) => return Ok((udp, t)),
            Err(e) => last = Some(e),
        }
    }
    Err(NetError::Io {
        what: "bind the resolver (tcp, same port as udp)".into(),
        source: last.unwrap_or_else(|| std::io::Error::other("no port")),
    })
}

pub async fn serve_udp(sock: UdpSocket, shared: Arc<Shared>) {
    let sock = Arc::new(sock);
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, from)) = sock.recv_from(&mut buf).await else {
            continue;
        };
        let Some(sb) = shared.sandbox_at(from.ip()) else {
            continue;
        };
        let q = buf[..n].to_vec();
        let admitted = match shared.dns.admit(&sb.sandbox, &sb.tenant()) {
            Ok(a) => a,
            Err(r) => {
                // Answered at once from this socket: a refusal costs no descriptor.
                if let Ok(parsed) = dns::parse_query(&q) {
                    let _ =
                        sock.try_send_to(&dns::empty_response(&q, &parsed, rcode::REFUSED), from);
                }
                shared.refused(&sb, EventKind::Dns, r, None);
                continue;
            }
        };
        let (sock, shared) = (sock.clone(), shared.clone());
        tokio::spawn(async move {
            if let Some(r) = answer(&shared, from.ip(), &q).await {
                let _ = sock.send_to(&r, from).await;
            }
            drop(admitted);
        });
    }
}

pub async fn serve_tcp(l: TcpListener, shared: Arc<Shared>) {
    loop {
        let (s, from) = match l.accept().await {
            Ok(c) => c,
            Err(_) => {
                // Out of descriptors: back off rather than spin.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // Only sandboxes: anything else is closed at once instead of holding a
        // descriptor for the read timeout.
        let Some(sb) = shared.sandbox_at(from.ip()) else {
            continue;
        };
        // A TCP query holds its connection and an upstream socket: counted as a
        // proxied connection.
        let admitted = match shared.conns.admit(&sb.sandbox, &sb.tenant()) {
            Ok(a) => a,
            Err(r) => {
                shared.refused(&sb, EventKind::Tcp, r, Some((from.ip(), 53)));
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(30), tcp_conn(s, from, &shared)).await;
            drop(admitted);
        });
    }
}

async fn tcp_conn(mut s: TcpStream, from: SocketAddr, shared: &Shared) -> std::io::Result<()> {
    loop {
        let len = s.read_u16().await? as usize;
        let mut q = vec![0u8; len];
        s.read_exact(&mut q).await?;
        let Some(r) = answer(shared, from.ip(), &q).await else {
            return Ok(());
        };
        s.write_u16(r.len() as u16).await?;
        s.write_all(&r).await?;
    }
}

/// The answer to `query` from sandbox address `src` (None: not a sandbox, dropped).
pub async fn answer(shared: &Shared, src: IpAddr, query: &[u8]) -> Option<Vec<u8>> {
    let sb = shared.sandbox_at(src)?;
    let ev = |name: Option<String>, decision, reason: String, out: usize, inn: usize| AuditEvent {
        sandbox: sb.sandbox.clone(),
        at_ms: now_ms(),
        kind: EventKind::Dns,
        name,
        addr: None,
        port: Some(53),
        decision,
        reason,
        bytes_out: out as u64,
        bytes_in: inn as u64,
    };
    let q = match dns::parse_query(query) {
        Ok(q) => q,
        Err(e) => {
            let r = dns::formerr(query);
            shared.record(ev(None, Decision::Denied, e.to_string(), query.len(), 0));
            return r;
        }
    };
    let t = dns::qtype_name(q.qtype);
    let policy = sb.policy();
    if !policy.resolves(&q.name) {
        let r = dns::empty_response(query, &q, rcode::NXDOMAIN);
        shared.record(ev(
            Some(q.name.clone()),
            Decision::Denied,
            format!("{t}: no rule allows this name"),
            query.len(),
            r.len(),
        ));
        return Some(r);
    }
    if q.qtype == qtype::HTTPS || q.qtype == qtype::SVCB {
        let r = dns::empty_response(query, &q, rcode::NOERROR);
        shared.record(ev(
            Some(q.name.clone()),
            Decision::Denied,
            format!("{t}: withheld (would carry Encrypted Client Hello keys)"),
            query.len(),
            r.len(),
        ));
        return Some(r);
    }
    match forward(&shared.upstream, query).await {
        Some(r) => {
            shared.record(ev(
                Some(q.name.clone()),
                Decision::Allowed,
                t,
                query.len(),
                r.len(),
            ));
            Some(r)
        }
        None => {
            let r = dns::empty_response(query, &q, rcode::SERVFAIL);
            shared.record(ev(
                Some(q.name.clone()),
                Decision::Failed,
                format!("{t}: no upstream answered"),
                query.len(),
                r.len(),
            ));
            Some(r)
        }
    }
}

/// Sends `query` to each upstream in turn (UDP) until one answers.
pub async fn forward(upstream: &[SocketAddr], query: &[u8]) -> Option<Vec<u8>> {
    for u in upstream {
        let bind = if u.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
        let Ok(s) = UdpSocket::bind(bind).await else {
            continue;
        };
        if s.connect(u).await.is_err() || s.send(query).await.is_err() {
            continue;
        }
        let mut buf = vec![0u8; 4096];
        let deadline = tokio::time::Instant::now() + UPSTREAM_TIMEOUT;
        loop {
            match tokio::time::timeout_at(deadline, s.recv(&mut buf)).await {
                Ok(Ok(n)) if n >= 2 && buf[..2] == query[..2] => {
                    buf.truncate(n);
                    return Some(buf);
                }
                Ok(Ok(_)) => continue,
                _ => break,
            }
        }
    }
    None
}

/// The A records of `name`, asked of the upstream resolvers.
pub async fn resolve_a(upstream: &[SocketAddr], name: &str) -> Result<Vec<Ipv4Addr>, String> {
    let q = dns::build_query(query_id(), name, qtype::A)
        .map_err(|_| format!("{name:?} cannot be asked of a resolver"))?;
    let r = forward(upstream, &q)
        .await
        .ok_or_else(|| format!("no upstream resolver answered for {name}"))?;
    match dns::parse_a_answer(&r, &q) {
        Some((0, v)) if !v.is_empty() => Ok(v),
        Some((0, _)) => Err(format!("{name} has no IPv4 address")),
        Some((c, _)) => Err(format!("resolving {name}: rcode {c}")),
        None => Err(format!("resolving {name}: malformed answer")),
    }
}

/// A query id no one off the path can predict (from the standard library's
/// randomly keyed hasher, fed the time).
fn query_id() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_i64(now_ms());
    h.finish() as u16
}
