//! Privileged end-to-end tests of inbound traffic: the authenticated
//! HTTP/WebSocket proxy `/v1/sandboxes/{id}/ports/{port}/...` and raw TCP ports
//! published on the host. Every byte stays on loopback (the host's, or the
//! sandbox's own, reached inside its network namespace).
//!
//! Run: `cargo test -p sandlot --no-default-features --test api_ports` (root).

mod api_support;
mod ports_app;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use api_support::{rt, Daemon};
use ports_app::{crc32, dechunk, raw, read_head, start_app, ws_frame, ws_read};
use sandlot_client::{Client, CreateSandbox, PublishPort};

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

/// The host port ranges these tests publish in. They lie below the kernel's
/// ephemeral range (32768 and up by default), so no listener that another test
/// bound to port 0 can hold one of them, and inside the ports that
/// `api_support::free_port` never draws for other tests' servers.
const PUBLISH_RANGE: (u16, u16) = (31100, 31199);
const CLI_RANGE: (u16, u16) = (31200, 31299);
const _: () = assert!(
    *api_support::PUBLISHING_TESTS_PORTS.start() <= PUBLISH_RANGE.0
        && CLI_RANGE.1 <= *api_support::PUBLISHING_TESTS_PORTS.end()
);

/// A port of `range` on 127.0.0.1 that nothing listens on now, other than `not`.
fn free_port(range: (u16, u16), not: &[u16]) -> u16 {
    (range.0..=range.1)
        .filter(|p| !not.contains(p))
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port in the test's range")
}

/// Listening TCP sockets on the host with a port in `range`.
fn listeners_in(range: (u16, u16)) -> Vec<String> {
    let ss = std::process::Command::new("ss")
        .args(["-Htln"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&ss.stdout)
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(3)
                .and_then(|local| local.rsplit(':').next())
                .and_then(|p| p.parse::<u16>().ok())
                .is_some_and(|p| (range.0..=range.1).contains(&p))
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn http_and_websocket_proxy_reach_a_loopback_server_in_mode_none() {
    http_and_websocket_proxy_reach_a_loopback_server_in_mode_none_on(
        &api_support::suite_isolation(),
    );
}

#[test]
fn http_and_websocket_proxy_reach_a_loopback_server_in_mode_none_on_gvisor() {
    http_and_websocket_proxy_reach_a_loopback_server_in_mode_none_on("gvisor");
}

/// On the namespace backend and on gVisor: the same API, the same answers.
fn http_and_websocket_proxy_reach_a_loopback_server_in_mode_none_on(isolation: &str) {
    let d = Daemon::start_isolated(None, isolation);
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
    // In a browser the application's documents would be sandboxed: they share
    // the API's (and the web console's) origin.
    assert!(
        r.header("content-security-policy")
            .is_some_and(|v| v.starts_with("sandbox ") && !v.contains("allow-same-origin")),
        "{:?}",
        r.header("content-security-policy")
    );
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

/// A client forges `X-Real-IP` (which applications behind nginx trust) and names
/// the port with a sign or leading zeros: the application sees the real peer, and
/// only the plain decimal port reaches it.
#[test]
fn forged_client_addresses_and_odd_port_spellings_stop_at_the_proxy() {
    let d = Daemon::start(None);
    let ta = d.token("alpha");
    let a = d.tcp(Some(&ta));
    let api = format!("127.0.0.1:{}", d.port);
    let id = create(&a);
    rt().block_on(start_app(&a, &id, "127.0.0.1", 8002));
    let auth = format!("Authorization: Bearer {ta}");
    let r = raw(
        &api,
        &format!("GET /v1/sandboxes/{id}/ports/8002/ HTTP/1.1\r\nHost: x\r\n{auth}\r\nX-Real-IP: 6.6.6.6\r\nX-Forwarded-For: 6.6.6.6"),
        b"",
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let h = &r.json()["headers"];
    assert_eq!(h["x-real-ip"], "127.0.0.1", "{h}");
    assert_eq!(h["x-forwarded-for"], "127.0.0.1", "{h}");
    for bad in ["+8002", "%2B8002", "08002", "008002", "-0", "8002%20"] {
        let r = raw(
            &api,
            &format!("GET /v1/sandboxes/{id}/ports/{bad}/ HTTP/1.1\r\nHost: x\r\n{auth}"),
            b"",
        );
        assert_eq!(r.status, 400, "{bad}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["error"]["field"], "port", "{bad}");
        let r = raw(
            &api,
            &format!("DELETE /v1/sandboxes/{id}/ports/{bad} HTTP/1.1\r\nHost: x\r\n{auth}"),
            b"",
        );
        assert_eq!(r.status, 400, "unpublish {bad}");
    }
}

/// An HTTP/1.0 application answers an HTTP/1.1 client: the client gets the
/// proxy's own HTTP/1.1 status line (and a framed body), not the application's.
#[test]
fn an_http_1_0_application_answers_http_1_1_clients_in_http_1_1() {
    let d = Daemon::start(None);
    let ta = d.token("alpha");
    let a = d.tcp(Some(&ta));
    let id = create(&a);
    rt().block_on(start_app(&a, &id, "127.0.0.1", 8000));
    let mut s = TcpStream::connect(("127.0.0.1", d.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET /v1/sandboxes/{id}/ports/8000/http10 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ta}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let text = String::from_utf8_lossy(&all);
    assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
    let (_, headers, rest) = read_head(&mut std::io::Cursor::new(all.clone()));
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked { dechunk(&rest) } else { rest };
    assert_eq!(body, b"an HTTP/1.0 answer");
}

#[test]
fn published_tcp_port_forwards_until_unpublished_or_deleted() {
    let (lo, hi) = PUBLISH_RANGE;
    let mut d = Daemon::start(Some(&format!(
        "[ports]\nbind_addresses = [\"127.0.0.1\"]\nhost_port_min = {lo}\nhost_port_max = {hi}\nmax_published_per_tenant = 2\n",
    )));
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
    assert!((lo..=hi).contains(&p.host_port), "{p:?}");
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
        s == 400 && m.starts_with("host_port:") && m.contains(&format!("{lo}-{hi}")),
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
    let chosen = free_port(PUBLISH_RANGE, &[p.host_port]);
    let p2 = rt()
        .block_on(a.publish_port(&id, &pubreq(8002, Some(chosen.into()), None)))
        .unwrap();
    assert_eq!(p2.host_port, chosen);
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
    let again = free_port(PUBLISH_RANGE, &[]);
    rt().block_on(a.publish_port(&id2, &pubreq(9000, Some(again.into()), None)))
        .unwrap();
    rt().block_on(a.delete_sandbox(&id2)).unwrap();
    assert!(!listening(&format!("127.0.0.1:{again}")));
    // No process of the daemon's sandboxes, and no listener in the range, is left.
    let left = listeners_in(PUBLISH_RANGE);
    assert!(left.is_empty(), "listeners left:\n{}", left.join("\n"));
}

#[test]
fn cli_publishes_lists_and_unpublishes() {
    let (lo, hi) = CLI_RANGE;
    let d = Daemon::start(Some(&format!(
        "[ports]\nhost_port_min = {lo}\nhost_port_max = {hi}\n"
    )));
    let c = d.client();
    let id = create(&c);
    rt().block_on(start_app(&c, &id, "0.0.0.0", 8000));
    let hp = free_port(CLI_RANGE, &[]);
    let addr = format!("127.0.0.1:{hp}");
    let (code, out, err) = d.cli(&[
        "port",
        "publish",
        &id,
        "8000",
        "--host-port",
        &hp.to_string(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&addr), "{out}");
    assert_eq!(raw(&addr, "GET /cli HTTP/1.1\r\nHost: x", b"").status, 200);
    let (code, out, _) = d.cli(&["port", "ls", &id]);
    assert_eq!(code, 0);
    assert!(out.contains("8000") && out.contains(&addr), "{out}");
    let (code, out, _) = d.cli(&["port", "ls", &id, "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["host_port"], hp);
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
    assert!(!listening(&addr));
    rt().block_on(c.delete_sandbox(&id)).unwrap();
}
