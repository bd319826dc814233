//! The web console's serving side over the fake backend
//! (`sandlot_runtime::process_backend`), without root: `/ui` is served on the TCP
//! listener without a token, with its types and security headers; every API call
//! still needs one; a WebSocket carries it as the `sandlot.bearer.TOKEN`
//! subprotocol, which the server never echoes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use sandlot_runtime::process_backend::ProcessBackend;
use sandlot_server::auth::Transport;
use sandlot_server::state::AppState;
use serde_json::{json, Value};
use tower::ServiceExt;

struct Fixture {
    dir: PathBuf,
    state: Arc<AppState>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fixture(name: &str) -> Fixture {
    let dir = std::env::temp_dir().join(format!("sandlot-console-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_sandlot"));
    let backend = Arc::new(
        ProcessBackend::new(vec![exe.clone().into(), "__agent".into()], dir.join("run")).unwrap(),
    );
    let cfg = sandlot_server::ServerConfig {
        data_dir: dir.join("data"),
        socket: dir.join("sandlot.sock"),
        ..Default::default()
    };
    let state = sandlot_server::open_state(cfg, backend, exe).unwrap();
    Fixture { dir, state }
}

/// What one request answered: status, headers, body.
struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .map_or("", |v| v.to_str().unwrap_or(""))
    }
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

impl Fixture {
    async fn call(
        &self,
        transport: Transport,
        method: Method,
        uri: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Answer {
        let app = sandlot_server::routes::router(self.state.clone(), transport);
        let mut req = Request::builder().method(method).uri(uri);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = req
            .header("content-type", "application/json")
            .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
            .unwrap();
        let resp = app.oneshot(req).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = axum::body::to_bytes(resp.into_body(), 16 << 20)
            .await
            .unwrap()
            .to_vec();
        Answer {
            status,
            headers,
            body,
        }
    }

    /// A token of `tenant`, made by the operator (the Unix socket).
    async fn token(&self, tenant: &str) -> String {
        let a = self
            .call(
                Transport::Unix,
                Method::POST,
                "/v1/tokens",
                None,
                Some(json!({ "tenant": tenant })),
            )
            .await;
        assert_eq!(a.status, StatusCode::CREATED, "{}", a.json());
        a.json()["token"].as_str().unwrap().to_string()
    }
}

fn assert_console_headers(a: &Answer, what: &str) {
    let csp = a.header("content-security-policy");
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(
            csp.split(';').any(|d| d.trim() == directive),
            "{what}: the policy {csp:?} lacks {directive:?}"
        );
    }
    assert!(!csp.contains("unsafe-eval"), "{what}: {csp}");
    assert_eq!(a.header("x-content-type-options"), "nosniff", "{what}");
    assert_eq!(a.header("x-frame-options"), "DENY", "{what}");
    assert_eq!(a.header("referrer-policy"), "no-referrer", "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_served_without_a_token_with_its_types_and_security_headers() {
    let f = fixture("assets");
    for (path, ty, needle) in [
        (
            "/ui/",
            "text/html; charset=utf-8",
            "<title>Sandlot console</title>",
        ),
        (
            "/ui/src/app.js",
            "text/javascript; charset=utf-8",
            "sandboxesPage",
        ),
        (
            "/ui/src/dom.js",
            "text/javascript; charset=utf-8",
            "createTextNode",
        ),
        (
            "/ui/src/style.css",
            "text/css; charset=utf-8",
            "prefers-color-scheme",
        ),
        (
            "/ui/vendor/xterm.js",
            "text/javascript; charset=utf-8",
            "Terminal",
        ),
        (
            "/ui/vendor/addon-fit.js",
            "text/javascript; charset=utf-8",
            "FitAddon",
        ),
        ("/ui/vendor/xterm.css", "text/css; charset=utf-8", ".xterm"),
        ("/ui/favicon.svg", "image/svg+xml", "<svg"),
    ] {
        let a = f.call(Transport::Tcp, Method::GET, path, None, None).await;
        assert_eq!(a.status, StatusCode::OK, "{path}");
        assert_eq!(a.header("content-type"), ty, "{path}");
        assert!(
            String::from_utf8_lossy(&a.body).contains(needle),
            "{path} lacks {needle:?}"
        );
        assert_console_headers(&a, path);
    }
    // The page loads no inline script: every <script> names a file under /ui/.
    let index = f
        .call(Transport::Tcp, Method::GET, "/ui/", None, None)
        .await;
    let html = String::from_utf8(index.body).unwrap();
    for script in html.split("<script").skip(1) {
        let tag_end = script.find('>').unwrap();
        assert!(
            script[..tag_end].contains("src=\"/ui/"),
            "inline script: {script}"
        );
        assert!(
            script[tag_end + 1..].starts_with("</script>"),
            "inline script: {script}"
        );
    }

    let a = f.call(Transport::Tcp, Method::GET, "/ui", None, None).await;
    assert_eq!(a.status, StatusCode::PERMANENT_REDIRECT);
    assert_eq!(a.header("location"), "/ui/");
    assert_console_headers(&a, "/ui");
    // Another method is refused, with the same headers.
    let a = f
        .call(Transport::Tcp, Method::POST, "/ui/src/app.js", None, None)
        .await;
    assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_console_headers(&a, "POST /ui/src/app.js");
    for missing in ["/ui/nope.js", "/ui/src/../../Cargo.toml", "/ui/src/"] {
        let a = f
            .call(Transport::Tcp, Method::GET, missing, None, None)
            .await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{missing}");
        assert_console_headers(&a, missing);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_call_the_console_makes_needs_a_token() {
    let f = fixture("token");
    let token = f.token("acme").await;
    for path in [
        "/v1/health",
        "/v1/sandboxes",
        "/v1/images",
        "/v1/sandboxes/sb-x/network/log",
    ] {
        let a = f.call(Transport::Tcp, Method::GET, path, None, None).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(a.json()["error"]["code"], "unauthorized", "{path}");
    }
    let a = f
        .call(
            Transport::Tcp,
            Method::GET,
            "/v1/health",
            Some(&token),
            None,
        )
        .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["tenant"], "acme");
    // The console is the TCP listener's only: the operator's socket has no /ui.
    let a = f
        .call(Transport::Unix, Method::GET, "/ui/", None, None)
        .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
}

/// One WebSocket handshake to `path` offering `protocols`: the status line and the
/// response's headers (lower-case names), and the stream for what follows.
fn handshake(
    addr: SocketAddr,
    path: &str,
    protocols: &str,
) -> (String, Vec<(String, String)>, TcpStream) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Protocol: {protocols}\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':').unwrap();
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    if status.starts_with("HTTP/1.1 101") {
        assert!(r.buffer().is_empty(), "the server spoke before the client");
    }
    (status, headers, s)
}

/// One masked client frame (mask key zero: the payload goes as is).
fn client_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mut f = vec![0x80 | opcode, 0x80 | payload.len() as u8, 0, 0, 0, 0];
    f.extend_from_slice(payload);
    f
}

/// One server frame: (opcode, payload).
fn server_frame(s: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut h = [0u8; 2];
    s.read_exact(&mut h).unwrap();
    let len = match h[1] & 0x7f {
        126 => {
            let mut b = [0u8; 2];
            s.read_exact(&mut b).unwrap();
            u64::from(u16::from_be_bytes(b))
        }
        127 => {
            let mut b = [0u8; 8];
            s.read_exact(&mut b).unwrap();
            u64::from_be_bytes(b)
        }
        n => u64::from(n),
    };
    let mut p = vec![0u8; usize::try_from(len).unwrap()];
    s.read_exact(&mut p).unwrap();
    (h[0] & 0x0f, p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_authenticates_with_the_bearer_subprotocol_which_is_never_echoed() {
    let f = fixture("ws");
    let token = f.token("acme").await;
    let other = f.token("other").await;
    let a = f
        .call(
            Transport::Tcp,
            Method::POST,
            "/v1/sandboxes",
            Some(&token),
            Some(json!({})),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.json());
    let id = a.json()["id"].as_str().unwrap().to_string();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = sandlot_server::routes::router(f.state.clone(), Transport::Tcp);
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    let path = format!("/v1/sandboxes/{id}/exec/ws");
    let (tok, oth) = (token.clone(), other.clone());
    let out = tokio::task::spawn_blocking(move || {
        // Without a token, and with the subprotocol on a plain request: 401.
        let (st, _, _) = handshake(addr, &path, "sandlot.v1");
        assert!(st.starts_with("HTTP/1.1 401"), "{st}");
        let mut s = TcpStream::connect(addr).unwrap();
        write!(
            s,
            "GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
             Sec-WebSocket-Protocol: sandlot.bearer.{tok}\r\n\r\n"
        )
        .unwrap();
        let mut plain = String::new();
        s.read_to_string(&mut plain).unwrap();
        assert!(plain.starts_with("HTTP/1.1 401"), "{plain}");
        // Nor with `Upgrade: websocket` on a request that is no handshake (a POST,
        // or without `Connection: upgrade`).
        for head in [
            "POST /v1/tokens HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, close\r\nUpgrade: websocket\r\nContent-Length: 0\r\n",
            "GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nConnection: close\r\nUpgrade: websocket\r\n",
        ] {
            let mut s = TcpStream::connect(addr).unwrap();
            write!(s, "{head}Sec-WebSocket-Protocol: sandlot.bearer.{tok}\r\n\r\n").unwrap();
            let mut answer = String::new();
            s.read_to_string(&mut answer).unwrap();
            assert!(answer.starts_with("HTTP/1.1 401"), "{head}: {answer}");
        }
        // Another tenant's token: the sandbox is not found.
        let (st, _, _) = handshake(addr, &path, &format!("sandlot.v1, sandlot.bearer.{oth}"));
        assert!(st.starts_with("HTTP/1.1 404"), "{st}");
        // The owner's token: upgraded, `sandlot.v1` selected, the token not echoed.
        let (st, headers, mut s) =
            handshake(addr, &path, &format!("sandlot.v1, sandlot.bearer.{tok}"));
        assert!(st.starts_with("HTTP/1.1 101"), "{st}");
        let selected: Vec<&str> = headers
            .iter()
            .filter(|(k, _)| k == "sec-websocket-protocol")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(selected, ["sandlot.v1"]);
        assert!(!headers.iter().any(|(_, v)| v.contains(&tok)));
        let body = json!({ "argv": ["sh", "-c", "echo hi"] }).to_string();
        s.write_all(&client_frame(1, body.as_bytes())).unwrap();
        let mut stdout = Vec::new();
        loop {
            let (op, p) = server_frame(&mut s);
            match op {
                2 if p.first() == Some(&1) => stdout.extend_from_slice(&p[1..]),
                1 if serde_json::from_slice::<Value>(&p).unwrap()["type"] == "exit" => break,
                8 => break,
                _ => {}
            }
        }
        String::from_utf8(stdout).unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out, "hi\n");
    server.abort();
    let a = f
        .call(
            Transport::Tcp,
            Method::DELETE,
            &format!("/v1/sandboxes/{id}"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(f.state.teardowns.wait_idle(Duration::from_secs(20)).await);
}
