//! Privileged end-to-end tests of inbound traffic (issue 4): the authenticated
//! HTTP/WebSocket proxy `/v1/sandboxes/{id}/ports/{port}/...` and raw TCP ports
//! published on the host. Every byte stays on loopback (the host's, or the
//! sandbox's own, reached inside its network namespace).
//!
//! Run: `cargo test -p sandlot --no-default-features --test api_ports` (root).

mod api_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use api_support::{rt, Daemon};
use sandlot_client::{Client, CreateSandbox, ExecBody, PublishPort};

/// The application run inside the sandbox: echoes the request (method, path,
/// headers) as JSON, hashes uploaded bodies (chunked or sized), streams a large
/// answer, answers its own 404, and is a minimal WebSocket echo server (the
/// Python standard library has none).
pub const APP: &str = r#"
import base64, hashlib, json, sys, zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                n = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if n == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""): pass
                    return bytes(out)
                out += self.rfile.read(n)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def reply(self, code, data, ctype="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.startswith("/ws"):
            return self.websocket()
        if self.path.startswith("/big"):
            n = int(self.path.split("=")[1])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"x" * 65536
            left = n
            while left:
                c = chunk[:min(left, len(chunk))]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(c), c))
                left -= len(c)
            self.wfile.write(b"0\r\n\r\n")
            return
        if self.path.startswith("/missing"):
            return self.reply(404, b"app says: no such page", "text/plain")
        self.echo(b"")

    def do_POST(self):
        data = self.body()
        self.reply(200, json.dumps({"len": len(data), "crc32": zlib.crc32(data),
            "te": self.headers.get("Transfer-Encoding")}).encode())

    def do_DELETE(self):
        self.echo(self.body())

    def echo(self, data):
        self.reply(200, json.dumps({"method": self.command, "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()}, "body": data.decode()}).encode())

    def websocket(self):
        key = self.headers["Sec-WebSocket-Key"]
        acc = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", acc)
        self.end_headers()
        self.wfile.flush()
        r, w = self.rfile, self.wfile
        while True:
            h = r.read(2)
            if len(h) < 2: return
            op, n = h[0] & 0x0F, h[1] & 0x7F
            if n == 126: n = int.from_bytes(r.read(2), "big")
            elif n == 127: n = int.from_bytes(r.read(8), "big")
            mask = r.read(4) if h[1] & 0x80 else b"\0\0\0\0"
            p = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(n)))
            if op == 8:
                w.write(b"\x88\x00"); w.flush(); return
            out = b"echo:" + p
            if len(out) < 126: hdr = bytes([0x80 | op, len(out)])
            elif len(out) < 65536: hdr = bytes([0x80 | op, 126]) + len(out).to_bytes(2, "big")
            else: hdr = bytes([0x80 | op, 127]) + len(out).to_bytes(8, "big")
            w.write(hdr + out); w.flush()

ThreadingHTTPServer.allow_reuse_address = True
ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()
"#;

/// Starts the app inside the sandbox on `bind:port` and waits until it answers.
pub async fn start_app(c: &Client, id: &str, bind: &str, port: u16) {
    c.write_file_bytes(id, "/tmp/app.py", APP.as_bytes().to_vec())
        .await
        .unwrap();
    c.exec(
        id,
        &ExecBody {
            argv: vec![
                "python3".into(),
                "/tmp/app.py".into(),
                bind.into(),
                port.to_string(),
            ],
            background: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let probe = format!(
        "import socket,time\nfor i in range(200):\n    try:\n        socket.create_connection(('{bind}',{port}),1).close(); break\n    except OSError: time.sleep(0.05)\nelse: raise SystemExit(1)"
    );
    let o = c.run(id, &["python3", "-c", &probe]).await.unwrap();
    assert_eq!(o.exit.code, Some(0), "the app did not start in the sandbox");
}

/// A raw HTTP/1.1 exchange over TCP (the test controls every header): status,
/// lower-cased headers, body (de-chunked).
pub struct Raw {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Raw {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
}

fn read_head(s: &mut TcpStream) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut buf = Vec::new();
    let mut b = [0u8; 4096];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = s.read(&mut b).unwrap();
        assert!(
            n > 0,
            "connection closed in the head: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&b[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let rest = buf[end + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, rest)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let i = b.windows(2).position(|w| w == b"\r\n").unwrap();
        let n = usize::from_str_radix(
            std::str::from_utf8(&b[..i])
                .unwrap()
                .split(';')
                .next()
                .unwrap()
                .trim(),
            16,
        )
        .unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + n]);
        b = &b[i + 2 + n + 2..];
    }
}

/// Sends `head` (request line and headers, without the final blank line) with
/// `Connection: close`, then `body`, and reads the whole answer.
pub fn raw(addr: &str, head: &str, body: &[u8]) -> Raw {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(format!("{head}\r\nConnection: close\r\n\r\n").as_bytes())
        .unwrap();
    s.write_all(body).unwrap();
    let (status, headers, mut rest) = read_head(&mut s);
    s.read_to_end(&mut rest).unwrap();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked { dechunk(&rest) } else { rest };
    Raw {
        status,
        headers,
        body,
    }
}

fn ws_frame(op: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x80 | op];
    let n = payload.len();
    if n < 126 {
        f.push(0x80 | n as u8);
    } else if n < 65536 {
        f.push(0x80 | 126);
        f.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        f.push(0x80 | 127);
        f.extend_from_slice(&(n as u64).to_be_bytes());
    }
    let mask = [0x12, 0x34, 0x56, 0x78];
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

fn ws_read(s: &mut TcpStream, pending: &mut Vec<u8>) -> (u8, Vec<u8>) {
    let need = |s: &mut TcpStream, pending: &mut Vec<u8>, n: usize| {
        let mut b = [0u8; 65536];
        while pending.len() < n {
            let k = s.read(&mut b).unwrap();
            assert!(k > 0, "websocket closed early");
            pending.extend_from_slice(&b[..k]);
        }
    };
    need(s, pending, 2);
    let op = pending[0] & 0x0F;
    let (mut n, mut off) = ((pending[1] & 0x7F) as usize, 2);
    if n == 126 {
        need(s, pending, 4);
        n = u16::from_be_bytes([pending[2], pending[3]]) as usize;
        off = 4;
    } else if n == 127 {
        need(s, pending, 10);
        n = u64::from_be_bytes(pending[2..10].try_into().unwrap()) as usize;
        off = 10;
    }
    need(s, pending, off + n);
    let p = pending[off..off + n].to_vec();
    pending.drain(..off + n);
    (op, p)
}

fn create(c: &Client) -> String {
    rt().block_on(c.create_sandbox(&CreateSandbox::default()))
        .unwrap()
        .id
}

fn api_err(e: sandlot_client::Error) -> (u16, String) {
    (e.status().map_or(0, |s| s.as_u16()), e.to_string())
}

fn listening(addr: &str) -> bool {
    TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(2)).is_ok()
}

#[test]
fn issue4_http_and_websocket_proxy_reach_a_loopback_server_in_mode_none() {
    let d = Daemon::start(None);
    let ta = d.token("alpha");
    let tb = d.token("beta");
    let a = d.tcp(Some(&ta));
    let _ = &tb;
    let api = format!("127.0.0.1:{}", d.port);
    let id = create(&a);
    rt().block_on(start_app(&a, &id, "127.0.0.1", 8000));
    let auth = format!("Authorization: Bearer {ta}");
    let base = format!("/v1/sandboxes/{id}/ports/8000");

    // GET with a query string: path and query reach the app; the Sandlot token
    // does not; the forwarding headers are set (client-forged ones replaced).
    let r = raw(
        &api,
        &format!("GET {base}/some/page?x=1&y=%20z HTTP/1.1\r\nHost: sandlot.example:7070\r\n{auth}\r\nX-Forwarded-For: 6.6.6.6\r\nX-App: kept"),
        b"",
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let j = r.json();
    assert_eq!(j["method"], "GET");
    assert_eq!(j["path"], "/some/page?x=1&y=%20z");
    let h = &j["headers"];
    assert!(h.get("authorization").is_none(), "the token leaked: {h}");
    assert_eq!(h["x-app"], "kept");
    assert_eq!(h["x-forwarded-for"], "127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h["x-forwarded-host"], "sandlot.example:7070");
    assert_eq!(h["x-forwarded-prefix"], base);
    assert_eq!(h["host"], "localhost:8000");

    // The port root, and the redirect that adds its slash.
    let r = raw(
        &api,
        &format!("GET {base}/ HTTP/1.1\r\nHost: x\r\n{auth}"),
        b"",
    );
    assert_eq!((r.status, r.json()["path"].clone()), (200, "/".into()));
    let r = raw(
        &api,
        &format!("GET {base}?q=1 HTTP/1.1\r\nHost: x\r\n{auth}"),
        b"",
    );
    assert_eq!(r.status, 308);
    assert_eq!(r.header("location"), Some(format!("{base}/?q=1").as_str()));

    // Other methods with bodies.
    let r = raw(
        &api,
        &format!("DELETE {base}/thing HTTP/1.1\r\nHost: x\r\n{auth}\r\nContent-Length: 5"),
        b"hello",
    );
    assert_eq!(
        (r.json()["method"].clone(), r.json()["body"].clone()),
        ("DELETE".into(), "hello".into())
    );

    // A 16 MiB POST body, streamed in chunks (no length), arrives whole.
    let mut s = TcpStream::connect(&api).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "POST {base}/upload HTTP/1.1\r\nHost: x\r\n{auth}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n").unwrap();
    let chunk: Vec<u8> = (0..65536u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut all = Vec::new();
    for _ in 0..256 {
        write!(s, "{:x}\r\n", chunk.len()).unwrap();
        s.write_all(&chunk).unwrap();
        s.write_all(b"\r\n").unwrap();
        all.extend_from_slice(&chunk);
    }
    s.write_all(b"0\r\n\r\n").unwrap();
    let (status, _, mut rest) = read_head(&mut s);
    s.read_to_end(&mut rest).unwrap();
    assert_eq!(status, 200);
    let body = String::from_utf8_lossy(&rest).into_owned();
    let j: serde_json::Value = serde_json::from_str(&body)
        .unwrap_or_else(|_| serde_json::from_slice(&dechunk(&rest)).unwrap());
    assert_eq!(j["len"], all.len());
    assert_eq!(j["crc32"], crc32(&all));

    // A 32 MiB streamed answer arrives whole.
    let r = raw(
        &api,
        &format!("GET {base}/big?n=33554432 HTTP/1.1\r\nHost: x\r\n{auth}"),
        b"",
    );
    assert_eq!((r.status, r.body.len()), (200, 33554432));

    // The app's own 404 is passed through, not turned into an API error.
    let r = raw(
        &api,
        &format!("GET {base}/missing HTTP/1.1\r\nHost: x\r\n{auth}"),
        b"",
    );
    assert_eq!(
        (r.status, r.body.as_slice()),
        (404, &b"app says: no such page"[..])
    );

    // WebSocket: upgrade passed through, messages both ways, small and large.
    let mut s = TcpStream::connect(&api).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {base}/ws HTTP/1.1\r\nHost: x\r\n{auth}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").unwrap();
    let (status, headers, mut pending) = read_head(&mut s);
    assert_eq!(status, 101);
    assert!(
        headers.contains(&(
            "sec-websocket-accept".into(),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=".into()
        )),
        "{headers:?}"
    );
    for msg in [b"hi".to_vec(), vec![b'z'; 200_000]] {
        s.write_all(&ws_frame(2, &msg)).unwrap();
        let (op, p) = ws_read(&mut s, &mut pending);
        assert_eq!(op, 2);
        assert_eq!(p, [b"echo:".as_slice(), &msg].concat());
    }
    s.write_all(&ws_frame(1, "héllo".as_bytes())).unwrap();
    assert_eq!(
        ws_read(&mut s, &mut pending),
        (1, "echo:héllo".as_bytes().to_vec())
    );
    s.write_all(&ws_frame(8, b"")).unwrap();
    assert_eq!(ws_read(&mut s, &mut pending).0, 8);
    drop(s);

    // Errors: no token (401), another tenant (404), bad ports (400 naming the
    // field), nothing listening (502 naming the port).
    let r = raw(&api, &format!("GET {base}/ HTTP/1.1\r\nHost: x"), b"");
    assert_eq!(r.status, 401);
    let r = raw(
        &api,
        &format!("GET {base}/ HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {tb}"),
        b"",
    );
    assert_eq!(r.status, 404, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["error"]["code"], "not_found");
    for bad in ["0", "65536", "http"] {
        let r = raw(
            &api,
            &format!("GET /v1/sandboxes/{id}/ports/{bad}/ HTTP/1.1\r\nHost: x\r\n{auth}"),
            b"",
        );
        assert_eq!(r.status, 400, "{bad}");
        assert_eq!(r.json()["error"]["field"], "port", "{bad}");
    }
    let r = raw(
        &api,
        &format!("GET /v1/sandboxes/{id}/ports/8001/ HTTP/1.1\r\nHost: x\r\n{auth}"),
        b"",
    );
    assert_eq!(r.status, 502);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains("port 8001") && msg.contains("nothing is listening"),
        "{msg}"
    );

    // Through the Rust client.
    let resp = rt()
        .block_on(a.proxy_request(&id, 8000, "GET", "/via/client?k=v", vec![]))
        .unwrap();
    assert_eq!(resp.status(), 200);
    let j: serde_json::Value = serde_json::from_slice(resp.body()).unwrap();
    assert_eq!(j["path"], "/via/client?k=v");
    assert_eq!(
        a.port_url(&id, 8000).unwrap(),
        format!("http://{api}{base}/")
    );

    // Metrics count the traffic.
    let m = rt().block_on(d.client().metrics()).unwrap();
    let val = |name: &str| -> u64 {
        m.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing:\n{m}"))
    };
    assert!(val("sandlot_port_http_requests_total ") >= 8);
    assert_eq!(val("sandlot_port_upgrades_total "), 1);
    assert!(val("sandlot_port_bytes_total{direction=\"in\"} ") >= 16 << 20);
    assert!(val("sandlot_port_bytes_total{direction=\"out\"} ") >= 32 << 20);

    // A stopped sandbox: 409 (the operator still sees it).
    rt().block_on(a.delete_sandbox(&id)).unwrap();
    let r = raw(
        &api,
        &format!("GET {base}/ HTTP/1.1\r\nHost: x\r\n{auth}"),
        b"",
    );
    assert_eq!(r.status, 409, "{}", String::from_utf8_lossy(&r.body));
}

#[test]
fn issue4_published_tcp_port_forwards_until_unpublished_or_deleted() {
    let mut d = Daemon::start(Some(
        "[ports]\nbind_addresses = [\"127.0.0.1\"]\nhost_port_min = 47100\nhost_port_max = 47199\nmax_published_per_tenant = 2\n",
    ));
    let ta = d.token("alpha");
    let tb = d.token("beta");
    let a = d.tcp(Some(&ta));
    let b = d.tcp(Some(&tb));
    let id = create(&a);
    rt().block_on(start_app(&a, &id, "127.0.0.1", 8000));
    let get = |addr: &str| raw(addr, "GET /tcp HTTP/1.1\r\nHost: x", b"");

    let p = rt()
        .block_on(a.publish_port(
            &id,
            &PublishPort {
                port: 8000,
                ..Default::default()
            },
        ))
        .unwrap();
    assert_eq!(p.port, 8000);
    assert_eq!(p.host, "127.0.0.1");
    assert!((47100..=47199).contains(&p.host_port), "{p:?}");
    assert_eq!(p.address, format!("127.0.0.1:{}", p.host_port));
    let r = get(&p.address);
    assert_eq!((r.status, r.json()["path"].clone()), (200, "/tcp".into()));
    assert_eq!(rt().block_on(a.list_ports(&id)).unwrap(), vec![p.clone()]);

    // Refusals, each naming the problem.
    let e =
        |r: Result<sandlot_client::PublishedPort, sandlot_client::Error>| api_err(r.unwrap_err());
    let pubreq = |port, host_port, bind: Option<&str>| PublishPort {
        port,
        host_port,
        bind: bind.map(str::to_string),
    };
    let (s, m) = e(rt().block_on(a.publish_port(&id, &pubreq(8000, None, None))));
    assert!(s == 409 && m.contains("already published"), "{s} {m}");
    let (s, m) = e(rt().block_on(a.publish_port(&id, &pubreq(0, None, None))));
    assert!(s == 400 && m.starts_with("port:"), "{s} {m}");
    let (s, m) = e(rt().block_on(a.publish_port(&id, &pubreq(70000, None, None))));
    assert!(s == 400 && m.starts_with("port:"), "{s} {m}");
    let (s, m) = e(rt().block_on(a.publish_port(&id, &pubreq(8001, None, Some("0.0.0.0")))));
    assert!(
        s == 400 && m.starts_with("bind:") && m.contains("allowed: 127.0.0.1"),
        "{s} {m}"
    );
    let (s, m) = e(rt().block_on(a.publish_port(&id, &pubreq(8001, Some(8080), None))));
    assert!(
        s == 400 && m.starts_with("host_port:") && m.contains("47100-47199"),
        "{s} {m}"
    );
    let (s, _) = e(rt().block_on(b.publish_port(&id, &pubreq(8001, None, None))));
    assert_eq!(s, 404);
    let (s, m) = api_err(
        rt().block_on(a.call_json(
            "POST",
            &format!("/v1/sandboxes/{id}/ports"),
            Some(&serde_json::json!({"port": 1, "hostport": 2})),
        ))
        .unwrap_err(),
    );
    assert!(s == 400 && m.contains("hostport"), "{s} {m}");
    // A chosen host port; then the tenant's limit (2).
    let p2 = rt()
        .block_on(a.publish_port(&id, &pubreq(8002, Some(47150), None)))
        .unwrap();
    assert_eq!(p2.host_port, 47150);
    let (s, m) = e(rt().block_on(a.publish_port(&id, &pubreq(8003, None, None))));
    assert!(
        s == 429 && m.contains("max_published_per_tenant"),
        "{s} {m}"
    );
    // Nothing listens on 8002 inside: the connection is accepted, then closed.
    let mut c = TcpStream::connect(&p2.address).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(c.read(&mut buf).unwrap_or(0), 0);

    // Unpublish: the listener is closed when the call returns.
    rt().block_on(a.unpublish_port(&id, 8002)).unwrap();
    assert!(!listening(&p2.address), "{} still accepts", p2.address);
    let (s, _) = api_err(rt().block_on(a.unpublish_port(&id, 8002)).unwrap_err());
    assert_eq!(s, 404);
    assert_eq!(rt().block_on(a.list_ports(&id)).unwrap().len(), 1);

    // A daemon restart re-establishes the published port of the surviving sandbox.
    d.terminate();
    assert!(!listening(&p.address));
    d.spawn();
    // Answered once the daemon serves (ports are restored before it does).
    rt().block_on(d.client().health()).unwrap();
    assert_eq!(get(&p.address).status, 200, "{}", d.log());
    assert_eq!(rt().block_on(a.list_ports(&id)).unwrap(), vec![p.clone()]);

    // An open connection and the listener go away with the sandbox.
    let mut open = TcpStream::connect(&p.address).unwrap();
    open.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    rt().block_on(a.delete_sandbox(&id)).unwrap();
    let t = Instant::now();
    assert_eq!(open.read(&mut buf).unwrap_or(0), 0);
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(
        !listening(&p.address),
        "{} still accepts after delete",
        p.address
    );
    assert!(rt().block_on(a.list_ports(&id)).unwrap().is_empty());
    // The tenant's budget is free again.
    let id2 = create(&a);
    rt().block_on(a.publish_port(&id2, &pubreq(9000, Some(47100), None)))
        .unwrap();
    rt().block_on(a.delete_sandbox(&id2)).unwrap();
    assert!(!listening("127.0.0.1:47100"));
    // No process of the daemon's sandboxes, and no listener in the range, is left.
    let ss = std::process::Command::new("ss")
        .args(["-Htln"])
        .output()
        .unwrap();
    let ss = String::from_utf8_lossy(&ss.stdout);
    assert!(!ss.contains(":471"), "listeners left:\n{ss}");
}

#[test]
fn issue4_cli_publishes_lists_and_unpublishes() {
    let d = Daemon::start(Some(
        "[ports]\nhost_port_min = 47200\nhost_port_max = 47299\n",
    ));
    let c = d.client();
    let id = create(&c);
    rt().block_on(start_app(&c, &id, "0.0.0.0", 8000));
    let (code, out, err) = d.cli(&["port", "publish", &id, "8000", "--host-port", "47222"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("127.0.0.1:47222"), "{out}");
    assert_eq!(
        raw("127.0.0.1:47222", "GET /cli HTTP/1.1\r\nHost: x", b"").status,
        200
    );
    let (code, out, _) = d.cli(&["port", "ls", &id]);
    assert_eq!(code, 0);
    assert!(
        out.contains("8000") && out.contains("127.0.0.1:47222"),
        "{out}"
    );
    let (code, out, _) = d.cli(&["port", "ls", &id, "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["host_port"], 47222);
    let (code, out, err) = d.cli(&["port", "url", &id, "8000"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.trim()
            .ends_with(&format!("/v1/sandboxes/{id}/ports/8000/")),
        "{out}"
    );
    let (code, _, err) = d.cli(&["port", "publish", &id, "0"]);
    assert_ne!(code, 0);
    assert!(err.contains("port"), "{err}");
    let (code, _, err) = d.cli(&["port", "unpublish", &id, "8000"]);
    assert_eq!(code, 0, "{err}");
    assert!(!listening("127.0.0.1:47222"));
    rt().block_on(c.delete_sandbox(&id)).unwrap();
}

/// CRC-32 (IEEE), the checksum of Python's `zlib.crc32`.
fn crc32(data: &[u8]) -> u32 {
    let table: Vec<u32> = (0..256u32)
        .map(|n| {
            (0..8).fold(n, |c, _| {
                if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                }
            })
        })
        .collect();
    !data.iter().fold(!0u32, |c, &b| {
        table[((c ^ b as u32) & 0xFF) as usize] ^ (c >> 8)
    })
}

#[test]
fn crc32_known_answer() {
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
}
