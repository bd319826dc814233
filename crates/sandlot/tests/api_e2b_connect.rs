//! The E2B front door's Connect-RPC envelopes, attacked with raw frames: a frame
//! flagged as the end of the stream (Connect's `0x02`, gRPC-Web's trailers `0x80`)
//! is never run as a request, and a compressed frame is `unimplemented`. Needs root.

mod api_support;

use api_support::{http, rt, Daemon};
use sandlot_client::ExecBody;
use serde_json::{json, Value};

/// One Connect envelope: flags, 4-byte big-endian length, the message.
fn frame(flags: u8, msg: &Value) -> Vec<u8> {
    let payload = serde_json::to_vec(msg).unwrap();
    let mut f = vec![flags];
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(&payload);
    f
}

/// The error object of a Connect stream's end-of-stream frame, if it has one.
fn stream_error(body: &str) -> Option<Value> {
    let i = body.find("{\"error\"")?;
    let v: Value = serde_json::Deserializer::from_str(&body[i..])
        .into_iter::<Value>()
        .next()?
        .ok()?;
    Some(v["error"].clone())
}

struct Front {
    port: u16,
    key: String,
    sandbox: String,
    access: String,
}

impl Front {
    /// A streaming call of envd (`application/connect+json`) with `body`.
    fn stream(&self, method: &str, body: &[u8]) -> (u16, String) {
        http(
            self.port,
            "POST",
            &format!("/process.Process/{method}"),
            &[
                ("X-API-Key", &self.key),
                ("E2b-Sandbox-Id", &self.sandbox),
                ("X-Access-Token", &self.access),
                ("Content-Type", "application/connect+json"),
            ],
            body,
        )
    }
}

impl Front {
    /// A unary call of envd's `filesystem.Filesystem` (`application/json`).
    fn filesystem(&self, method: &str, body: &Value) -> (u16, Value) {
        let (st, b) = http(
            self.port,
            "POST",
            &format!("/filesystem.Filesystem/{method}"),
            &[
                ("X-API-Key", &self.key),
                ("E2b-Sandbox-Id", &self.sandbox),
                ("X-Access-Token", &self.access),
                ("Content-Type", "application/json"),
            ],
            &serde_json::to_vec(body).unwrap(),
        );
        (st, serde_json::from_str(&b).unwrap_or(Value::String(b)))
    }
}

fn start(config_port: u16) -> (Daemon, Front) {
    let d = Daemon::start(Some(&format!(
        "[e2b]\nlisten = \"127.0.0.1:{config_port}\"\n"
    )));
    let key = d.token("acme");
    let (st, b) = http(
        config_port,
        "POST",
        "/v2/sandboxes",
        &[("X-API-Key", &key), ("Content-Type", "application/json")],
        br#"{"templateID": "base"}"#,
    );
    assert_eq!(st, 201, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    let front = Front {
        port: config_port,
        key,
        sandbox: v["sandboxID"].as_str().unwrap().to_string(),
        access: v["envdAccessToken"].as_str().unwrap().to_string(),
    };
    (d, front)
}

/// `Start` whose only frame is flagged as the end of the stream, and `StreamInput`
/// whose input comes in such a frame: neither runs anything.
#[test]
fn an_end_of_stream_frame_is_never_run_as_a_request() {
    let (d, f) = start(api_support::free_port());
    let c = d.tcp(Some(&f.key));
    for flags in [0x02u8, 0x80, 0x82] {
        let marker = format!("/tmp/ran-{flags:02x}");
        let req = json!({"process": {"cmd": "/bin/sh", "args": ["-c", format!("touch {marker}")]}});
        let (st, body) = f.stream("Start", &frame(flags, &req));
        assert_eq!(st, 200, "{body}");
        let e = stream_error(&body).unwrap_or_else(|| panic!("flags {flags:#04x}: {body}"));
        assert_eq!(e["code"], "invalid_argument", "{e}");
        let ran = rt().block_on(c.stat(&f.sandbox, &marker));
        assert!(
            ran.is_err(),
            "a frame flagged {flags:#04x} was run as Start"
        );
    }

    // A process reading its stdin; input in an end-of-stream frame is not input.
    let p = rt()
        .block_on(c.exec(
            &f.sandbox,
            &ExecBody {
                argv: vec!["cat".into()],
                stdin: true,
                background: true,
                ..Default::default()
            },
        ))
        .unwrap();
    let sel = json!({"pid": p.pid});
    let mut body = frame(0, &json!({"start": {"process": sel}}));
    body.extend(frame(
        0,
        &json!({"data": {"process": sel, "input": {"stdin": "b2sK"}}}),
    ));
    body.extend(frame(
        0x80,
        &json!({"data": {"process": sel, "input": {"stdin": "cHduZWQK"}}}),
    ));
    let (st, out) = f.stream("StreamInput", &body);
    assert_eq!(st, 200, "{out}");
    assert!(stream_error(&out).is_none(), "{out}");
    // Frames after the end of the stream are refused, not read.
    let mut after = frame(0, &json!({"start": {"process": sel}}));
    after.extend(frame(0x02, &json!({})));
    after.extend(frame(
        0,
        &json!({"data": {"process": sel, "input": {"stdin": "cHduZWQK"}}}),
    ));
    let (_, out) = f.stream("StreamInput", &after);
    assert_eq!(
        stream_error(&out).unwrap()["code"],
        "invalid_argument",
        "{out}"
    );
    let output = rt().block_on(async {
        c.close_stdin(&f.sandbox, p.id).await.unwrap();
        c.wait(&f.sandbox, p.id, 30.0).await.unwrap();
        c.output(&f.sandbox, p.id, 0, 0)
            .await
            .unwrap()
            .collect()
            .await
            .unwrap()
    });
    assert_eq!(String::from_utf8_lossy(&output.stdout), "ok\n");
}

/// A compressed frame (flag `0x01`) is a feature this server does not have:
/// `unimplemented`, as for a compressed body, never `internal`.
#[test]
fn a_compressed_frame_is_unimplemented() {
    let (_d, f) = start(api_support::free_port());
    let req = json!({"process": {"cmd": "/bin/true"}});
    let (st, body) = f.stream("Start", &frame(0x01, &req));
    assert_eq!(st, 200, "{body}");
    let e = stream_error(&body).unwrap_or_else(|| panic!("{body}"));
    assert_eq!(e["code"], "unimplemented", "{e}");
}

/// Polled watchers (`CreateWatcher`) each keep a task and its events in the
/// daemon until removed: a sandbox has at most 16 at once, the next is refused
/// naming the bound, and removing one makes room.
#[test]
fn a_sandbox_keeps_a_bounded_number_of_polled_watchers() {
    let (_d, f) = start(api_support::free_port());
    let mut ids = Vec::new();
    for _ in 0..16 {
        let (st, v) = f.filesystem("CreateWatcher", &json!({"path": "/tmp"}));
        assert_eq!(st, 200, "{v}");
        ids.push(v["watcherId"].as_str().unwrap().to_string());
    }
    let (st, v) = f.filesystem("CreateWatcher", &json!({"path": "/tmp"}));
    assert_eq!(
        (st, v["code"].as_str()),
        (429, Some("resource_exhausted")),
        "{v}"
    );
    assert!(v["message"].as_str().unwrap().contains("remove one"), "{v}");
    let (st, v) = f.filesystem("RemoveWatcher", &json!({"watcherId": ids[0]}));
    assert_eq!(st, 200, "{v}");
    let (st, v) = f.filesystem("CreateWatcher", &json!({"path": "/tmp"}));
    assert_eq!(st, 200, "{v}");
}
