//! A sandbox process that keeps state in its memory (a counter of the
//! connections it served), and the helpers the checkpoint and snapshot tests
//! share to drive it.

use sandlot_client::{Client, ExecBody};
use serde_json::json;

use super::{eventually, spec_body};

/// Counts the connections it serves (in its memory) and answers each with the
/// count and its pid.
pub const COUNTER: &str = r#"
import os, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 7000))
s.listen(8)
with open("/tmp/ready", "w") as f:
    f.write("ok")
n = 0
while True:
    c, _ = s.accept()
    n += 1
    c.sendall(f"{n} {os.getpid()}\n".encode())
    c.close()
"#;

pub const PROBE: &str = r#"import socket; s = socket.create_connection(("127.0.0.1", 7000)); print(s.recv(100).decode(), end="")"#;

pub fn on(isolation: &str) -> sandlot_client::CreateSandbox {
    spec_body(json!({ "isolation": isolation }))
}

pub async fn sh(c: &Client, id: &str, script: &str) -> String {
    let o = c.run(id, &["/bin/sh", "-c", script]).await.unwrap();
    assert_eq!(
        o.exit.code,
        Some(0),
        "{script}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

pub async fn start_counter(c: &Client, id: &str) {
    c.write_file_bytes(id, "/tmp/counter.py", COUNTER.as_bytes().to_vec())
        .await
        .unwrap();
    c.exec(
        id,
        &ExecBody {
            argv: vec!["python3".into(), "/tmp/counter.py".into()],
            background: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    eventually(20, "the counter to listen", || {
        let (c, id) = (c.clone(), id.to_string());
        async move {
            c.run(&id, &["/bin/cat", "/tmp/ready"])
                .await
                .is_ok_and(|o| o.stdout == b"ok")
        }
    })
    .await;
}

/// (count, pid) the counter answers.
pub async fn probe(c: &Client, id: &str) -> (u64, String) {
    let out = c.run(id, &["python3", "-c", PROBE]).await.unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut f = text.split_whitespace();
    match (f.next().and_then(|n| n.parse().ok()), f.next()) {
        (Some(n), Some(pid)) => (n, pid.into()),
        _ => panic!(
            "the counter answered {text:?} ({})",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Where the daemon keeps checkpoints' and snapshots' copies.
pub fn copies(d: &super::Daemon) -> std::path::PathBuf {
    d.data_dir().join("sandbox-checkpoints")
}

/// Entries of `dir` (none if it is missing).
pub fn entries(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}
