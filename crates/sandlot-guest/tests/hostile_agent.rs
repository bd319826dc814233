//! The client against a hostile agent: a scripted task speaking the guest protocol
//! over an in-memory stream, lying in every way a sandbox process that took the
//! agent's socket could. Each test is an attack that must fail: the client refuses
//! it (closing the connection or failing the operation) and never buffers without
//! bound, hangs or panics. No root needed: no agent process runs.
//!
//! Waiting is on tokio's paused clock: a test that checks that something does not
//! happen gives it a virtual minute, which passes only once every task is idle.

use std::time::Duration;

use sandlot_guest::client::{
    AttachRequest, ClientError, ErrorCode, GuestClient, Hello, ListDirRequest, ProcessId,
    ReadFileRequest, WriteFileRequest,
};
use sandlot_proto::guest::{
    encode_window, stream, FrameHeader, FrameKind, Reply, Request, HEADER_LEN, MAX_PAYLOAD,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};

/// A virtual minute: far longer than any legitimate exchange in these tests.
const A_WHILE: Duration = Duration::from_secs(60);

/// The agent's end of the connection, driven frame by frame by the test.
struct Fake {
    rd: ReadHalf<DuplexStream>,
    wr: WriteHalf<DuplexStream>,
}

impl Fake {
    /// Sends a frame. The client may have closed the connection already (it
    /// refused an earlier frame): what it took is what the test checks.
    async fn send(&mut self, kind: FrameKind, chan: u32, payload: &[u8]) {
        let mut v = FrameHeader::encode(kind, chan, payload.len()).to_vec();
        v.extend_from_slice(payload);
        let _ = self.wr.write_all(&v).await;
    }

    async fn reply(&mut self, chan: u32, r: &Reply) {
        self.send(FrameKind::Reply, chan, &serde_json::to_vec(r).unwrap())
            .await;
    }

    async fn data(&mut self, chan: u32, s: u8, bytes: &[u8]) {
        let mut p = vec![s];
        p.extend_from_slice(bytes);
        self.send(FrameKind::Data, chan, &p).await;
    }

    /// The next frame from the client, None once it closed the connection.
    async fn recv(&mut self) -> Option<(FrameKind, u32, Vec<u8>)> {
        let mut h = [0u8; HEADER_LEN];
        self.rd.read_exact(&mut h).await.ok()?;
        let hd = FrameHeader::decode(&h, MAX_PAYLOAD).expect("client frames are valid");
        let mut p = vec![0u8; hd.payload_len];
        self.rd.read_exact(&mut p).await.ok()?;
        Some((hd.kind, hd.channel, p))
    }

    /// The next request: its channel and body.
    async fn request(&mut self) -> (u32, Request) {
        loop {
            let (k, c, p) = self.recv().await.expect("a request");
            if k == FrameKind::Request {
                return (c, serde_json::from_slice(&p).unwrap());
            }
        }
    }

    /// Waits for the client to grant credit on `chan`, and returns how much.
    async fn window(&mut self, chan: u32) -> Option<u64> {
        loop {
            let (k, c, p) = self.recv().await?;
            match k {
                FrameKind::Window if c == chan => {
                    return Some(u64::from(u32::from_be_bytes([p[1], p[2], p[3], p[4]])))
                }
                FrameKind::Cancel if c == chan => return None,
                _ => {}
            }
        }
    }
}

/// A client connected to a fake agent that has answered the handshake.
async fn connect() -> (GuestClient, Fake) {
    connect_with(Hello::current("hostile", &[])).await
}

async fn connect_with(hello: Hello) -> (GuestClient, Fake) {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (rd, wr) = tokio::io::split(b);
    let mut fake = Fake { rd, wr };
    let agent = tokio::spawn(async move {
        let (k, _, _) = fake.recv().await.expect("client hello");
        assert_eq!(k, FrameKind::Hello);
        fake.send(FrameKind::Hello, 0, &serde_json::to_vec(&hello).unwrap())
            .await;
        fake
    });
    let client = GuestClient::from_stream(a).await.expect("handshake");
    (client, agent.await.unwrap())
}

fn is_protocol(e: &ClientError) -> bool {
    matches!(e, ClientError::Protocol(_) | ClientError::Closed(_))
}

#[tokio::test(start_paused = true)]
async fn a_silent_agent_fails_the_handshake_instead_of_hanging() {
    let (a, _b) = tokio::io::duplex(64 * 1024);
    let r = tokio::time::timeout(A_WHILE, GuestClient::from_stream(a)).await;
    assert!(
        matches!(r, Ok(Err(_))),
        "the handshake with an agent that never answers did not fail on its own"
    );
}

#[tokio::test(start_paused = true)]
async fn a_silent_agent_socket_fails_connect_instead_of_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    // Bound and listening, never accepting nor answering: the kernel completes the
    // connection from its backlog.
    let _listener = tokio::net::UnixListener::bind(&path).unwrap();
    let r = tokio::time::timeout(A_WHILE, GuestClient::connect(&path)).await;
    assert!(
        matches!(r, Ok(Err(_))),
        "connecting to an agent that never answers did not fail on its own"
    );
}

#[tokio::test]
async fn a_hello_with_a_huge_software_string_is_refused() {
    let (a, b) = tokio::io::duplex(4 << 20);
    let (rd, wr) = tokio::io::split(b);
    let mut fake = Fake { rd, wr };
    let mut hello = Hello::current("x".repeat(512 * 1024), &[]);
    hello.software.push_str("\nforged log line");
    let agent = tokio::spawn(async move {
        fake.recv().await.expect("client hello");
        fake.send(FrameKind::Hello, 0, &serde_json::to_vec(&hello).unwrap())
            .await;
        fake
    });
    let r = GuestClient::from_stream(a).await;
    let _fake = agent.await.unwrap();
    assert!(
        matches!(&r, Err(ClientError::Protocol(_))),
        "{:?}",
        r.map(|_| ())
    );
}

#[tokio::test]
async fn a_second_reply_to_a_ping_closes_the_connection() {
    let (client, mut fake) = connect().await;
    let agent = tokio::spawn(async move {
        let (c, r) = fake.request().await;
        assert_eq!(r, Request::Ping {});
        // Replies are not flow-controlled: a flood of them would pile up unread.
        for _ in 0..1000 {
            fake.reply(c, &Reply::Ok).await;
        }
        fake.send(FrameKind::End, c, &[]).await;
        fake
    });
    let r = client.ping().await;
    let _fake = agent.await.unwrap();
    let e = r.expect_err("a ping answered a thousand times succeeded");
    assert!(is_protocol(&e), "{e}");
    assert!(client.ping().await.is_err(), "the connection stayed open");
}

#[tokio::test]
async fn a_process_list_longer_than_an_agent_tracks_is_refused() {
    let (client, mut fake) = connect().await;
    let agent = tokio::spawn(async move {
        let (c, r) = fake.request().await;
        assert_eq!(r, Request::ListProcesses {});
        let info = serde_json::json!({
            "id": 1, "pid": 2, "argv": ["x"], "uid": 0, "gid": 0, "pty": false,
            "started_at_ms": 0,
            "stdout": {"retained_from": 0, "produced": 0, "eof": false},
            "stderr": {"retained_from": 0, "produced": 0, "eof": false},
            "stdin_open": false, "attached": 0
        });
        let batch = serde_json::json!({
            "type": "processes",
            "processes": vec![info; 1000],
        });
        let batch = serde_json::to_vec(&batch).unwrap();
        // 100,000 processes: more than an agent ever tracks (16,384 + 1,024).
        for _ in 0..100 {
            fake.send(FrameKind::Reply, c, &batch).await;
        }
        fake.send(FrameKind::End, c, &[]).await;
        fake
    });
    let r = client.list_processes().await;
    drop(agent);
    let e = r.expect_err("a list of 100,000 processes was accepted");
    assert!(is_protocol(&e), "{e}");
}

#[tokio::test]
async fn a_listing_record_without_a_newline_is_cut_at_its_bound() {
    let (client, mut fake) = connect().await;
    let agent = tokio::spawn(async move {
        let (c, r) = fake.request().await;
        assert!(matches!(r, Request::ListDir(_)), "{r:?}");
        let stat = serde_json::json!({"type": "stat", "stat": {
            "path": "/d", "kind": "dir", "size": 0, "mode": 493, "uid": 0, "gid": 0,
            "mtime": 0, "mtime_nsec": 0}});
        fake.send(FrameKind::Reply, c, &serde_json::to_vec(&stat).unwrap())
            .await;
        // One record that never ends, sent as fast as the client grants credit.
        let mut credit = 0u64;
        let mut sent = 0u64;
        let chunk = vec![b'x'; 64 * 1024];
        while sent < 64 << 20 {
            while credit < chunk.len() as u64 {
                match fake.window(c).await {
                    Some(n) => credit += n,
                    None => return sent,
                }
            }
            fake.data(c, stream::OUTPUT, &chunk).await;
            credit -= chunk.len() as u64;
            sent += chunk.len() as u64;
        }
        fake.send(FrameKind::End, c, &[]).await;
        sent
    });
    let mut l = client
        .list_dir_stream(ListDirRequest::new("/d", 1))
        .await
        .expect("listing opened");
    let r = l.next_entry().await;
    drop(l);
    let sent = agent.await.unwrap();
    assert!(r.is_err(), "an endless record was accepted");
    // The client stopped granting once the record passed its bound (2 MiB).
    assert!(
        sent <= (2 << 20) + 2 * 256 * 1024,
        "the client took {sent} bytes of one record"
    );
}

#[tokio::test]
async fn a_download_longer_than_asked_is_refused() {
    let (client, mut fake) = connect().await;
    let agent = tokio::spawn(async move {
        let (c, r) = fake.request().await;
        assert!(matches!(r, Request::ReadFile(_)), "{r:?}");
        let stat = serde_json::json!({"type": "stat", "stat": {
            "path": "/f", "kind": "file", "size": 10, "mode": 420, "uid": 0, "gid": 0,
            "mtime": 0, "mtime_nsec": 0}});
        fake.send(FrameKind::Reply, c, &serde_json::to_vec(&stat).unwrap())
            .await;
        fake.data(c, stream::OUTPUT, b"0123456789").await;
        fake.data(c, stream::OUTPUT, b"other data").await;
        fake.send(FrameKind::Eof, c, &[stream::OUTPUT]).await;
        fake.send(FrameKind::End, c, &[]).await;
        fake
    });
    let dl = client
        .read_file(ReadFileRequest {
            path: "/f".into(),
            offset: 0,
            length: Some(10),
            user: None,
        })
        .await
        .expect("download opened");
    let r = dl.read_to_end().await;
    let _fake = agent.await.unwrap();
    let e = r.expect_err("20 bytes delivered for a 10-byte read");
    assert!(is_protocol(&e), "{e}");
}

#[tokio::test]
async fn data_after_eof_closes_the_connection() {
    let (client, mut fake) = connect().await;
    let agent = tokio::spawn(async move {
        let (c, _) = fake.request().await;
        let stat = serde_json::json!({"type": "stat", "stat": {
            "path": "/f", "kind": "file", "size": 1, "mode": 420, "uid": 0, "gid": 0,
            "mtime": 0, "mtime_nsec": 0}});
        fake.send(FrameKind::Reply, c, &serde_json::to_vec(&stat).unwrap())
            .await;
        fake.data(c, stream::OUTPUT, b"a").await;
        fake.send(FrameKind::Eof, c, &[stream::OUTPUT]).await;
        fake.data(c, stream::OUTPUT, b"smuggled").await;
        fake.send(FrameKind::End, c, &[]).await;
        fake
    });
    let r = client.read_file_to_vec("/f").await;
    let _fake = agent.await.unwrap();
    let e = r.expect_err("DATA after EOF was delivered");
    assert!(is_protocol(&e), "{e}");
}

#[tokio::test]
async fn a_second_eof_on_a_stream_closes_the_connection() {
    let (client, mut fake) = connect().await;
    let agent = tokio::spawn(async move {
        let (c, _) = fake.request().await;
        let stat = serde_json::json!({"type": "stat", "stat": {
            "path": "/f", "kind": "file", "size": 0, "mode": 420, "uid": 0, "gid": 0,
            "mtime": 0, "mtime_nsec": 0}});
        fake.send(FrameKind::Reply, c, &serde_json::to_vec(&stat).unwrap())
            .await;
        // Each EOF would be queued on the channel: a flood of them is unbounded.
        for _ in 0..1000 {
            fake.send(FrameKind::Eof, c, &[stream::OUTPUT]).await;
        }
        fake.send(FrameKind::End, c, &[]).await;
        fake
    });
    let r = client.read_file_to_vec("/f").await;
    let _fake = agent.await.unwrap();
    let e = r.expect_err("a thousand EOFs were accepted");
    assert!(is_protocol(&e), "{e}");
}

#[tokio::test]
async fn an_attach_offset_at_the_end_of_u64_is_a_protocol_error() {
    let (client, mut fake) = connect().await;
    let agent = tokio::spawn(async move {
        let (c, r) = fake.request().await;
        assert!(matches!(r, Request::Attach(_)), "{r:?}");
        let attached = Reply::Attached {
            id: ProcessId(1),
            pid: 2,
            pty: false,
            stdin: false,
            stdout_from: u64::MAX - 1,
            stderr_from: 0,
        };
        fake.reply(c, &attached).await;
        fake.data(c, stream::OUTPUT, b"wraps around").await;
        fake
    });
    let mut p = client
        .attach_with(AttachRequest {
            id: ProcessId(1),
            stdout_from: Some(0),
            stderr_from: Some(0),
        })
        .await
        .expect("attached");
    let r = p.next_event().await;
    let _fake = agent.await.unwrap();
    let e = r.expect_err("output past offset 2^64 was delivered");
    assert!(is_protocol(&e), "{e}");
}

#[tokio::test(start_paused = true)]
async fn an_agent_that_grants_credit_but_never_reads_holds_the_uploader() {
    let (client, mut fake) = connect().await;
    let agent = tokio::spawn(async move {
        let (c, r) = fake.request().await;
        assert!(matches!(r, Request::WriteFile(_)), "{r:?}");
        fake.reply(c, &Reply::Ready).await;
        // Credit for 16 GiB, and then the agent stops reading its socket.
        for _ in 0..8 {
            fake.send(
                FrameKind::Window,
                c,
                &encode_window(stream::INPUT, (1 << 31) - 1),
            )
            .await;
        }
        (c, fake)
    });
    let mut up = client
        .write_file(WriteFileRequest::new("/f"))
        .await
        .expect("upload opened");
    let (c, mut fake) = agent.await.unwrap();
    let big = vec![7u8; 64 << 20];
    let r = tokio::time::timeout(A_WHILE, up.write(&big)).await;
    assert!(
        r.is_err(),
        "64 MiB were taken from the uploader while the agent read nothing"
    );
    // The upload is abandoned; the client's CANCEL comes after all it had queued.
    drop(up);
    let mut queued = 0usize;
    loop {
        let (k, ch, p) = fake.recv().await.expect("the client's CANCEL");
        if (k, ch) == (FrameKind::Cancel, c) {
            break;
        }
        queued += p.len() + HEADER_LEN;
    }
    assert!(queued <= 2 << 20, "the client queued {queued} bytes");
    drop(client);
}

#[tokio::test(start_paused = true)]
async fn channels_the_agent_never_ends_are_bounded() {
    let (client, mut fake) = connect().await;
    // The agent reads every request and answers none, not even a CANCEL.
    let agent = tokio::spawn(async move { while fake.recv().await.is_some() {} });
    for _ in 0..4096 {
        let r = tokio::time::timeout(Duration::from_millis(1), client.ping()).await;
        assert!(r.is_err(), "a silent agent answered");
    }
    let r = tokio::time::timeout(A_WHILE, client.ping()).await;
    match r {
        Ok(Err(e)) => assert_eq!(e.code(), Some(ErrorCode::Limit), "{e}"),
        Ok(Ok(())) => panic!("a silent agent answered"),
        Err(_) => panic!("a 4,097th operation was opened on a silent agent"),
    }
    drop(client);
    agent.await.unwrap();
}
