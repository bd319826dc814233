//! The daemon's router and sandbox owner over the fake backend
//! (`sandlot_runtime::process_backend`): every sandbox is `sandlot __agent` as a
//! plain process, so these tests need no root. Requests go to the router itself
//! (`tower::ServiceExt::oneshot`), no listener involved.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use base64::Engine;
use sandlot_runtime::process_backend::ProcessBackend;
use sandlot_runtime::Backend;
use sandlot_server::auth::Transport;
use sandlot_server::state::AppState;
use serde_json::{json, Value};
use tower::ServiceExt;

/// A directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The daemon's state over a fake backend in a temporary directory.
struct Fixture {
    _dir: TempDir,
    state: Arc<AppState>,
    backend: Arc<ProcessBackend>,
}

fn fixture(name: &str) -> Fixture {
    let dir = std::env::temp_dir().join(format!("sandlot-router-{name}-{}", std::process::id()));
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
    let state = sandlot_server::open_state(cfg, backend.clone(), exe).unwrap();
    Fixture {
        _dir: TempDir(dir),
        state,
        backend,
    }
}

impl Fixture {
    /// One request to a fresh router (the operator's transport); the status and
    /// the body, parsed as JSON when it is.
    async fn call(&self, method: Method, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
        let (status, bytes) = self
            .call_raw(method, uri, body.map(|b| b.to_string().into()))
            .await;
        let v = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, v)
    }

    async fn call_raw(
        &self,
        method: Method,
        uri: &str,
        body: Option<Vec<u8>>,
    ) -> (StatusCode, Vec<u8>) {
        let app = sandlot_server::routes::router(self.state.clone(), Transport::Unix);
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", "application/json")
            .body(body.map(Body::from).unwrap_or_else(Body::empty))
            .unwrap();
        let resp = app.oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 64 << 20)
            .await
            .unwrap();
        (status, bytes.to_vec())
    }

    async fn create(&self, spec: Value) -> String {
        let (st, v) = self.call(Method::POST, "/v1/sandboxes", Some(spec)).await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
        assert_eq!(v["state"], "running", "{v}");
        v["id"].as_str().unwrap().to_string()
    }

    /// Runs `argv` to its end through the NDJSON exec stream: (exit code,
    /// stdout, stderr).
    async fn exec(&self, id: &str, argv: &[&str]) -> (Option<i64>, String, String) {
        let (st, body) = self
            .call_raw(
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec?stream=ndjson"),
                Some(json!({ "argv": argv }).to_string().into()),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let (mut out, mut err, mut code) = (Vec::new(), Vec::new(), None);
        let b64 = base64::engine::general_purpose::STANDARD;
        for line in body.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let v: Value = serde_json::from_slice(line).unwrap();
            match v["type"].as_str().unwrap() {
                "stdout" => out.extend(b64.decode(v["data"].as_str().unwrap()).unwrap()),
                "stderr" => err.extend(b64.decode(v["data"].as_str().unwrap()).unwrap()),
                "exit" => code = v["exit"]["code"].as_i64(),
                "error" => panic!("exec of {argv:?}: {v}"),
                _ => {}
            }
        }
        (
            code,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    async fn delete(&self, id: &str) -> Value {
        let (st, v) = self
            .call(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        v
    }

    /// Waits for the host clean-ups and checks that no agent process and no
    /// socket directory is left.
    async fn finish(self, pids: &[i32]) {
        assert!(
            self.state
                .teardowns
                .wait_idle(Duration::from_secs(20))
                .await,
            "teardowns still pending"
        );
        assert_eq!(self.backend.host_traces(""), Vec::<PathBuf>::new());
        for pid in pids {
            assert!(
                !Path::new(&format!("/proc/{pid}")).exists(),
                "agent {pid} is still there"
            );
        }
    }

    async fn agent_pid(&self, id: &str) -> i32 {
        let (_, v) = self
            .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
            .await;
        self.state
            .handle(id)
            .map(|h| h.inst.pid())
            .unwrap_or_else(|| panic!("sandbox {id} is not live: {v}"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_exec_and_delete_through_the_router() {
    let f = fixture("lifecycle");
    let id = f
        .create(
            json!({ "env": { "GREETING": "hello" }, "workdir": "/tmp", "tags": { "team": "a" } }),
        )
        .await;
    let pid = f.agent_pid(&id).await;
    // The spec's environment and working directory reach the agent's processes.
    let (code, out, _) = f
        .exec(
            &id,
            &[
                "/bin/sh",
                "-c",
                "echo $GREETING; pwd; echo oops >&2; exit 3",
            ],
        )
        .await;
    assert_eq!((code, out.as_str()), (Some(3), "hello\n/tmp\n"));
    // Listed, and found by tag.
    let (st, v) = f.call(Method::GET, "/v1/sandboxes?tag=team=a", None).await;
    assert_eq!(st, StatusCode::OK);
    let ids: Vec<&str> = v["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![id.as_str()]);
    let rec = f.delete(&id).await;
    assert_eq!(rec["state"], "stopped", "{rec}");
    assert_eq!(rec["end_reason"], "deleted", "{rec}");
    assert_eq!(rec["usage"]["exec_count"], 1, "{rec}");
    // Deleting again is idempotent; the sandbox takes no more work.
    let again = f.delete(&id).await;
    assert_eq!(again["state"], "stopped");
    let (st, v) = f
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({ "argv": ["true"] })),
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    f.finish(&[pid]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_round_trip_through_the_router() {
    let f = fixture("files");
    let id = f.create(json!({})).await;
    let pid = f.agent_pid(&id).await;
    let dir = f._dir.0.join("files");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("a/b.txt");
    let uri = |route: &str, path: &Path| {
        format!(
            "/v1/sandboxes/{id}/{route}?path={}",
            path.to_string_lossy().replace('/', "%2F")
        )
    };
    let (st, body) = f
        .call_raw(Method::PUT, &uri("files", &p), Some(b"contents\n".to_vec()))
        .await;
    assert_eq!(
        st,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&body)
    );
    let (st, body) = f.call_raw(Method::GET, &uri("files", &p), None).await;
    assert_eq!((st, body.as_slice()), (StatusCode::OK, &b"contents\n"[..]));
    let (st, v) = f.call(Method::GET, &uri("files/stat", &p), None).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        (v["kind"].as_str(), v["size"].as_u64()),
        (Some("file"), Some(9))
    );
    let (st, v) = f
        .call(Method::GET, &uri("files/list", &p.with_file_name("")), None)
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        v["entries"][0]["path"].as_str(),
        Some(p.to_str().unwrap()),
        "{v}"
    );
    let (st, _) = f.call(Method::DELETE, &uri("files", &p), None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    // A missing file is a 404 naming the path, from the agent through the router.
    let (st, v) = f.call(Method::GET, &uri("files", &p), None).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["error"]["code"], "not_found", "{v}");
    f.delete(&id).await;
    f.finish(&[pid]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_4xx_naming_the_problem() {
    let f = fixture("errors");
    // Strict bodies: an unknown field and a value out of range name the field.
    let (st, v) = f
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({ "imgae": "host" })),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("imgae"),
        "{v}"
    );
    let (st, v) = f
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({ "resources": { "memory": "1K" } })),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["field"], "resources.memory", "{v}");
    // gVisor's own kernel counts under the limit: below 32M a gVisor sandbox is
    // refused naming the field, before the backend is asked (this host's fake
    // has no gVisor, so 32M goes on to be refused as unavailable instead).
    let (st, v) = f
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({ "isolation": "gvisor", "resources": { "memory": "24M" } })),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["field"], "resources.memory", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at least 32M"),
        "{v}"
    );
    let (st, v) = f
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({ "isolation": "gvisor", "resources": { "memory": "32M" } })),
        )
        .await;
    assert_ne!(v["error"]["field"], "resources.memory", "{st} {v}");
    assert!(st.is_client_error() || st.is_server_error(), "{st} {v}");
    // No such sandbox, no such route.
    let (st, v) = f.call(Method::GET, "/v1/sandboxes/sb-nope", None).await;
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (st, _) = f.call(Method::GET, "/v1/nowhere", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    // A command that cannot start is the caller's problem, named.
    let id = f.create(json!({})).await;
    let pid = f.agent_pid(&id).await;
    let (st, v) = f
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({ "argv": ["no-such-program-xyz"] })),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "spawn_failed", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no-such-program-xyz"),
        "{v}"
    );
    f.delete(&id).await;
    // What the backend cannot do fails the create with an opaque 500 (the backend's
    // account, with its host paths, goes to the log only), and nothing is left.
    let (st, v) = f
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({ "mounts": [{ "type": "tmpfs", "target": "/scratch" }] })),
        )
        .await;
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR, "{v}");
    assert_eq!(v["error"]["code"], "internal", "{v}");
    assert!(v["error"]["request_id"].is_string(), "{v}");
    assert!(!v.to_string().contains("/tmp/"), "{v}");
    let (_, v) = f.call(Method::GET, "/v1/sandboxes?state=all", None).await;
    let failed: Vec<&Value> = v["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["end_reason"] == "create_failed")
        .collect();
    assert_eq!(failed.len(), 1, "{v}");
    f.finish(&[pid]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_ends_a_sandbox_at_its_timeout_and_when_its_agent_dies() {
    let f = fixture("owner");
    // Lifetime: the owner stops it on its own.
    // Long enough that a slow create still finds it running for the look below.
    let id = f.create(json!({ "timeout": "3s" })).await;
    let timed_pid = f.agent_pid(&id).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    let rec = loop {
        let (_, v) = f
            .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
            .await;
        if v["state"] == "stopped" {
            break v;
        }
        assert!(Instant::now() < deadline, "not stopped at its timeout: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(rec["end_reason"], "timeout", "{rec}");
    // PID 1 (here the agent) dying ends the sandbox, with its exit status.
    let id = f.create(json!({})).await;
    let pid = f.agent_pid(&id).await;
    // SAFETY: kill has no pointer arguments; `pid` is our own child.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(15);
    let rec = loop {
        let (_, v) = f
            .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
            .await;
        if v["state"] == "stopped" {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "not stopped after its agent died: {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(rec["end_reason"], "exited", "{rec}");
    assert_eq!(rec["exit"]["signal"], 9, "{rec}");
    f.finish(&[timed_pid, pid]).await;
}
