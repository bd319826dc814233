//! Shared by the inbound tests: the application run inside a sandbox
//! (HTTP echo, body checksums, streamed answers, a WebSocket echo server) and a
//! raw HTTP/1.1 and WebSocket client that controls every byte it sends.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use sandlot_client::{Client, ExecBody};

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
        if self.path.startswith("/http10"):
            # An HTTP/1.0 server: no length, the body ends with the connection.
            self.wfile.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nan HTTP/1.0 answer")
            self.close_connection = True
            return
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

pub fn read_head(s: &mut impl Read) -> (u16, Vec<(String, String)>, Vec<u8>) {
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

pub fn dechunk(mut b: &[u8]) -> Vec<u8> {
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

pub fn ws_frame(op: u8, payload: &[u8]) -> Vec<u8> {
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

pub fn ws_read(s: &mut TcpStream, pending: &mut Vec<u8>) -> (u8, Vec<u8>) {
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

/// CRC-32 (IEEE), the checksum of Python's `zlib.crc32`.
pub fn crc32(data: &[u8]) -> u32 {
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
