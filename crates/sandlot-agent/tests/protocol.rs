//! The wire protocol at the byte level: handshake and versioning, malformed and
//! oversized frames, flow-control violations. Every bad input closes only the
//! offending connection, with a GOAWAY naming the problem, never a hang or a crash.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::TestAgent;
use sandlot_guest::client::{ClientError, ErrorBody, ErrorCode, GuestClient, Hello};
use sandlot_proto::guest::{FrameHeader, FrameKind, HEADER_LEN, MAX_PAYLOAD};

fn frame(kind: FrameKind, chan: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = FrameHeader::encode(kind, chan, payload.len()).to_vec();
    v.extend_from_slice(payload);
    v
}

fn hello_with(version: u32, min_version: u32) -> Vec<u8> {
    let mut h = Hello::current("test", &[]);
    h.version = version;
    h.min_version = min_version;
    frame(FrameKind::Hello, 0, &serde_json::to_vec(&h).unwrap())
}

struct Raw(UnixStream);

impl Raw {
    fn connect(a: &TestAgent) -> Raw {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let s = loop {
            match UnixStream::connect(&a.socket) {
                Ok(s) => break s,
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("connect: {e}"),
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        Raw(s)
    }

    fn send(&mut self, b: &[u8]) {
        // The agent may already have closed; later reads tell.
        let _ = self.0.write_all(b);
    }

    /// Next frame, or None on EOF. Panics on a timeout (a hang).
    fn read(&mut self) -> Option<(FrameKind, u32, Vec<u8>)> {
        let mut h = [0u8; HEADER_LEN];
        match self.0.read_exact(&mut h) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
            Err(e) => panic!("reading from the agent: {e} (a hang?)"),
        }
        let hd = FrameHeader::decode(&h, MAX_PAYLOAD).expect("agent frames are valid");
        let mut p = vec![0u8; hd.payload_len];
        self.0.read_exact(&mut p).unwrap();
        Some((hd.kind, hd.channel, p))
    }

    /// Reads the agent's hello.
    fn expect_hello(&mut self) -> Hello {
        let (k, _, p) = self.read().expect("agent hello");
        assert_eq!(k, FrameKind::Hello);
        serde_json::from_slice(&p).unwrap()
    }

    /// Reads until GOAWAY, then expects the connection to close.
    fn expect_goaway(&mut self) -> ErrorBody {
        loop {
            match self.read() {
                Some((FrameKind::GoAway, 0, p)) => {
                    let body: ErrorBody = serde_json::from_slice(&p).unwrap();
                    assert!(self.read().is_none(), "connection stays open after GOAWAY");
                    return body;
                }
                Some(_) => continue,
                None => panic!("connection closed without GOAWAY"),
            }
        }
    }
}

async fn agent_still_serves(a: &TestAgent) {
    let c = a.client().await;
    c.ping().await.expect("agent still serves new connections");
}

#[tokio::test]
async fn handshake_announces_versions_and_capabilities() {
    let a = TestAgent::start();
    let c = a.client().await;
    let h = c.agent_hello();
    assert_eq!(h.protocol, "sandlot-guest");
    assert_eq!(c.protocol_version(), 1);
    assert!(h.software.starts_with("sandlot-guest "));
    for cap in ["exec", "pty", "files", "watch"] {
        assert!(h.capabilities.iter().any(|c| c == cap), "{cap}");
    }
    a.finish(&c).await;
}

#[tokio::test]
async fn unsupported_versions_are_refused_cleanly() {
    let a = TestAgent::start();
    let mut r = Raw::connect(&a);
    r.send(&hello_with(99, 90));
    let h = r.expect_hello();
    assert_eq!(h.version, 1);
    let g = r.expect_goaway();
    assert_eq!(g.code, ErrorCode::UnsupportedVersion);
    assert!(g.message.contains("90..=99"), "{}", g.message);
    // The client refuses an agent it cannot speak to.
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let fake_agent = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let mut theirs = theirs;
        theirs.write_all(&hello_with(7, 5)).await.unwrap();
        // Keep the stream open until the client gives up.
        tokio::time::sleep(Duration::from_secs(1)).await;
    });
    let e = GuestClient::from_stream(ours).await.unwrap_err();
    assert!(matches!(e, ClientError::UnsupportedVersion(_)), "{e}");
    assert!(e.to_string().contains("5..=7"), "{e}");
    fake_agent.abort();
    let c = a.client().await;
    a.finish(&c).await;
}

#[tokio::test]
async fn malformed_frames_close_only_that_connection() {
    let a = TestAgent::start();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "oversized",
            {
                let mut v = hello_with(1, 1);
                v.extend_from_slice(&FrameHeader::encode(FrameKind::Data, 1, MAX_PAYLOAD + 1));
                v
            },
            "exceeds the maximum",
        ),
        (
            "huge length",
            {
                let mut v = hello_with(1, 1);
                v.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 1]);
                v
            },
            "exceeds the maximum",
        ),
        (
            "unknown kind",
            {
                let mut v = hello_with(1, 1);
                v.extend_from_slice(&[0, 0, 0, 5, 77, 0, 0, 0, 1]);
                v
            },
            "unknown frame kind 77",
        ),
        (
            "too short",
            {
                let mut v = hello_with(1, 1);
                v.extend_from_slice(&[0, 0, 0, 2, 2, 0, 0, 0, 1]);
                v
            },
            "shorter than",
        ),
        (
            "not hello first",
            frame(FrameKind::Request, 1, br#"{"op":"ping"}"#),
            "first frame must be HELLO",
        ),
        (
            "http garbage",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            "exceeds the maximum",
        ),
        (
            "bad hello json",
            frame(FrameKind::Hello, 0, b"{nope"),
            "invalid HELLO",
        ),
        (
            "second hello",
            [hello_with(1, 1), hello_with(1, 1)].concat(),
            "second HELLO",
        ),
        (
            "request on channel 0",
            [
                hello_with(1, 1),
                frame(FrameKind::Request, 0, br#"{"op":"ping"}"#),
            ]
            .concat(),
            "channel 0",
        ),
        (
            "agent-only frame",
            [hello_with(1, 1), frame(FrameKind::End, 3, b"")].concat(),
            "sent by the agent only",
        ),
        (
            "zero window",
            [
                hello_with(1, 1),
                frame(
                    FrameKind::Request,
                    3,
                    br#"{"op":"exec","argv":["sleep","5"]}"#,
                ),
                frame(FrameKind::Window, 3, &[1, 0, 0, 0, 0]),
            ]
            .concat(),
            "increment 0",
        ),
        (
            "stdin beyond credit",
            [
                hello_with(1, 1),
                frame(
                    FrameKind::Request,
                    3,
                    br#"{"op":"exec","argv":["cat"],"stdin":true}"#,
                ),
                frame(
                    FrameKind::Data,
                    3,
                    &[vec![0u8], vec![b'x'; 300 * 1024]].concat(),
                ),
            ]
            .concat(),
            "exceed the granted credit",
        ),
        (
            "data on an output stream",
            [
                hello_with(1, 1),
                frame(FrameKind::Request, 3, br#"{"op":"exec","argv":["true"]}"#),
                frame(FrameKind::Data, 3, b"\x01abc"),
            ]
            .concat(),
            "only stream 0",
        ),
    ];
    for (name, bytes, needle) in cases {
        let mut r = Raw::connect(&a);
        r.send(&bytes);
        let g = r.expect_goaway();
        assert!(
            matches!(g.code, ErrorCode::Protocol),
            "{name}: code {:?} ({})",
            g.code,
            g.message
        );
        assert!(g.message.contains(needle), "{name}: {:?}", g.message);
    }
    // A connection cut in the middle of a frame is just dropped.
    {
        let mut r = Raw::connect(&a);
        let mut v = hello_with(1, 1);
        v.extend_from_slice(&frame(FrameKind::Request, 1, br#"{"op":"ping"}"#)[..10]);
        r.send(&v);
    }
    agent_still_serves(&a).await;
    let c = a.client().await;
    a.finish(&c).await;
}

#[tokio::test]
async fn invalid_requests_fail_their_channel_only() {
    let a = TestAgent::start();
    let mut r = Raw::connect(&a);
    r.send(&hello_with(1, 1));
    r.expect_hello();
    let bad = [
        (
            1u32,
            &br#"{"op":"exec","argv":["true"],"bogus":1}"#[..],
            "bogus",
        ),
        (2, br#"{"op":"teleport"}"#, "teleport"),
        (3, b"not json", "invalid request"),
        (4, br#"{"op":"exec","argv":[]}"#, "argv"),
        (5, br#"{"op":"stat","path":"relative"}"#, "absolute"),
    ];
    for (chan, body, _) in &bad {
        r.send(&frame(FrameKind::Request, *chan, body));
    }
    r.send(&frame(FrameKind::Request, 9, br#"{"op":"ping"}"#));
    let mut errors = std::collections::HashMap::new();
    let mut ended = std::collections::HashSet::new();
    let mut pong = false;
    while ended.len() < bad.len() + 1 {
        let (k, ch, p) = r.read().expect("connection stays open");
        match k {
            FrameKind::Reply => {
                let v: serde_json::Value = serde_json::from_slice(&p).unwrap();
                if ch == 9 {
                    assert_eq!(v["type"], "ok");
                    pong = true;
                } else {
                    assert_eq!(v["type"], "error", "{v}");
                    errors.insert(ch, v);
                }
            }
            FrameKind::End => {
                ended.insert(ch);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(pong);
    for (chan, _, needle) in &bad {
        let v = &errors[chan];
        assert_eq!(v["code"], "bad_request", "{v}");
        assert!(v["message"].as_str().unwrap().contains(needle), "{v}");
    }
    drop(r);
    let c = a.client().await;
    a.finish(&c).await;
}

#[tokio::test]
async fn many_connections_at_once_and_reconnects() {
    let a = TestAgent::start();
    let mut clients = Vec::new();
    for _ in 0..20 {
        clients.push(a.client().await);
    }
    let mut tasks = Vec::new();
    for c in &clients {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let o = c
                .exec(common::sh("echo $$"))
                .await
                .unwrap()
                .output()
                .await
                .unwrap();
            assert!(o.status.success());
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    drop(clients);
    let c = a.client().await;
    c.ping().await.unwrap();
    a.finish(&c).await;
}

/// The exchange of docs/protocol.md §9, byte for byte where the document is exact.
#[tokio::test]
async fn documented_example_exchange() {
    let a = TestAgent::start();
    let mut r = Raw::connect(&a);
    r.send(&hello_with(1, 1));
    r.expect_hello();
    let req = br#"{"op":"exec","argv":["echo","hi"]}"#;
    let mut bytes = frame(FrameKind::Request, 1, req);
    assert_eq!(&bytes[..9], &[0, 0, 0, 0x27, 2, 0, 0, 0, 1]);
    bytes.extend_from_slice(&[0, 0, 0, 0x0a, 6, 0, 0, 0, 1, 1, 0, 4, 0, 0]);
    bytes.extend_from_slice(&[0, 0, 0, 0x0a, 6, 0, 0, 0, 1, 2, 0, 4, 0, 0]);
    r.send(&bytes);
    let mut seen = Vec::new();
    loop {
        let (k, ch, p) = r.read().expect("frames until END");
        assert_eq!(ch, 1);
        match k {
            FrameKind::Reply => {
                let v: serde_json::Value = serde_json::from_slice(&p).unwrap();
                seen.push(v["type"].as_str().unwrap().to_string());
                if v["type"] == "exit" {
                    assert_eq!(v["status"]["code"], 0);
                    assert_eq!(v["stdout_end"], 3);
                    assert_eq!(v["stderr_end"], 0);
                }
            }
            FrameKind::Data => {
                assert_eq!(p, b"\x01hi\n");
                seen.push("data".into());
            }
            FrameKind::Eof => seen.push(format!("eof{}", p[0])),
            FrameKind::End => {
                assert!(p.is_empty());
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(seen[0], "started");
    let pos = |s: &str| seen.iter().position(|x| x == s).unwrap();
    assert!(pos("data") < pos("exit"), "{seen:?}");
    assert!(pos("data") < pos("eof1"), "{seen:?}");
    assert!(seen.contains(&"eof2".to_string()));
    drop(r);
    let c = a.client().await;
    a.finish(&c).await;
}

/// A quiesced agent closes its connections and its socket, its processes run on,
/// and it listens again at the same path on `SIGUSR1`, with those processes and
/// their output still there.
#[tokio::test]
async fn a_quiesced_agent_listens_again_on_sigusr1_with_its_processes() {
    let a = TestAgent::start();
    let c = a.client().await;
    let p = c
        .exec(sandlot_guest::client::ExecRequest::new([
            "sh",
            "-c",
            "echo before; sleep 1; echo after",
        ]))
        .await
        .unwrap();
    a.track(&p);
    let id = p.id();
    let usr1 = || {
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(a.pid()).unwrap(),
            rustix::process::Signal::USR1,
        )
        .unwrap()
    };
    // A signal before the quiesce neither ends the agent nor answers it later.
    usr1();
    tokio::time::sleep(Duration::from_millis(50)).await;
    c.ping().await.unwrap();
    c.quiesce().await.unwrap();
    // Both the connection and the listening socket are gone.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while c.ping().await.is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the connection stayed open"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        UnixStream::connect(&a.socket).is_err(),
        "the agent still listens"
    );
    usr1();
    let c2 = a.client().await;
    let procs = c2.list_processes().await.unwrap();
    assert_eq!(procs.iter().map(|p| p.id).collect::<Vec<_>>(), vec![id]);
    let p2 = c2
        .attach_with(sandlot_proto::guest::AttachRequest {
            id,
            stdout_from: Some(0),
            stderr_from: Some(0),
        })
        .await
        .unwrap();
    let o = p2.output().await.unwrap();
    assert_eq!(o.stdout, b"before\nafter\n");
    a.finish(&c2).await;
}
