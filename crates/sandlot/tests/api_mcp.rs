//! The MCP front door, driven with rmcp's client over both transports: `sandlot
//! mcp` on stdio and the daemon's `/mcp` (streamable HTTP, a tenant's token). The
//! tools act with the caller's token only: another tenant's sandbox is not found,
//! a session answers only the token that opened it, and no token is 401.

mod api_support;

use std::path::{Path, PathBuf};

use api_support::{block_on_within, Daemon};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, UnixSocketHttpClient};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

type McpClient = RunningService<RoleClient, ()>;

/// The tools every front door lists.
const TOOLS: &[&str] = &[
    "create_sandbox",
    "list_sandboxes",
    "delete_sandbox",
    "run_command",
    "read_file",
    "write_file",
    "list_files",
    "run_code",
    "vfs_shell",
    "memory_search",
    "memory_view",
    "memory_create",
    "memory_edit",
    "snapshot_sandbox",
];

/// A Unix socket in `dir` whose connections are relayed to the daemon's TCP
/// listener: rmcp's HTTP client speaks to a socket path, the daemon's `/mcp` is on
/// TCP, and the bytes in between are untouched.
fn relay(dir: &Path, port: u16) -> PathBuf {
    let path = dir.join(format!("mcp-relay-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let l = tokio::net::UnixListener::bind(&path).unwrap();
    tokio::spawn(async move {
        while let Ok((mut u, _)) = l.accept().await {
            tokio::spawn(async move {
                if let Ok(mut t) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                    let _ = tokio::io::copy_bidirectional(&mut u, &mut t).await;
                }
            });
        }
    });
    path
}

/// An MCP client of the daemon's `/mcp` as the holder of `token`.
async fn http_client(d: &Daemon, token: &str) -> McpClient {
    let sock = relay(&d.dir, d.port);
    let uri = format!("http://127.0.0.1:{}/mcp", d.port);
    let http = UnixSocketHttpClient::new(sock.to_str().unwrap(), &uri);
    let cfg = StreamableHttpClientTransportConfig::with_uri(uri).auth_header(token);
    ().serve(StreamableHttpClientTransport::with_client(http, cfg))
        .await
        .expect("an MCP session over /mcp")
}

/// Spawns `sandlot mcp` with the daemon's TCP address and `token`: its output and
/// input as async pipes.
fn spawn_stdio(
    d: &Daemon,
    token: &str,
) -> (
    tokio::net::unix::pipe::Receiver,
    tokio::net::unix::pipe::Sender,
    std::process::Child,
) {
    use std::os::fd::OwnedFd;
    let mut child = std::process::Command::new(api_support::sandlot())
        .arg("mcp")
        .env("SANDLOT_URL", format!("127.0.0.1:{}", d.port))
        .env("SANDLOT_TOKEN", token)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn sandlot mcp");
    let out = tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(
        child.stdout.take().unwrap(),
    ))
    .unwrap();
    let inp =
        tokio::net::unix::pipe::Sender::from_owned_fd(OwnedFd::from(child.stdin.take().unwrap()))
            .unwrap();
    (out, inp, child)
}

/// An MCP client of `sandlot mcp` (stdio) run with the daemon's TCP address and
/// `token` in its environment, as an agent's configuration starts it.
async fn stdio_client(d: &Daemon, token: &str) -> (McpClient, std::process::Child) {
    let (out, inp, child) = spawn_stdio(d, token);
    let c = ().serve((out, inp)).await.expect("an MCP session over stdio");
    (c, child)
}

async fn call<H: rmcp::ClientHandler>(
    c: &RunningService<RoleClient, H>,
    tool: &str,
    args: Value,
) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    c.call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{tool}: the call failed at the protocol level: {e}"))
}

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text of a successful call.
async fn ok(c: &McpClient, tool: &str, args: Value) -> String {
    let r = call(c, tool, args).await;
    assert_ne!(r.is_error, Some(true), "{tool} failed: {}", text(&r));
    text(&r)
}

/// The text of a call that must be a tool error (not a protocol error).
async fn tool_error(c: &McpClient, tool: &str, args: Value) -> String {
    let r = call(c, tool, args).await;
    assert_eq!(r.is_error, Some(true), "{tool} should fail: {}", text(&r));
    text(&r)
}

/// Lists the tools, creates a sandbox, runs `echo hi`, writes then reads a file,
/// lists it, and deletes the sandbox; the sandbox is the caller's tenant's.
async fn sandbox_round_trip(c: &McpClient, d: &Daemon, tenant: &str) {
    let tools = c.list_all_tools().await.unwrap();
    let mut names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    names.sort();
    let mut want: Vec<String> = TOOLS.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(names, want);
    let run = tools.iter().find(|t| t.name == "run_command").unwrap();
    assert!(
        run.input_schema["properties"]["argv"].is_object(),
        "run_command's schema names its arguments: {:?}",
        run.input_schema
    );

    let created: Value =
        serde_json::from_str(&ok(c, "create_sandbox", json!({"timeout": "5m"})).await).unwrap();
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["state"], "running");
    let rec = block_on_operator(d, &id).await;
    assert_eq!(
        rec.tenant, tenant,
        "the sandbox belongs to the caller's tenant"
    );

    let out = ok(
        c,
        "run_command",
        json!({"sandbox": id, "command": "echo hi"}),
    )
    .await;
    assert!(out.starts_with("exit_code: 0\n"), "{out}");
    assert!(out.contains("stdout:\nhi\n"), "{out}");
    let out = ok(
        c,
        "run_command",
        json!({"sandbox": id, "argv": ["sh", "-c", "echo oops >&2; exit 3"]}),
    )
    .await;
    assert!(
        out.starts_with("exit_code: 3\n") && out.contains("stderr:\noops\n"),
        "{out}"
    );

    let w = ok(
        c,
        "write_file",
        json!({"sandbox": id, "path": "/tmp/mcp/note.txt", "content": "from mcp\n"}),
    )
    .await;
    assert!(w.contains("wrote 9 bytes"), "{w}");
    assert_eq!(
        ok(
            c,
            "read_file",
            json!({"sandbox": id, "path": "/tmp/mcp/note.txt"})
        )
        .await,
        "from mcp\n"
    );
    // The same file as a resource.
    let uri = format!("sandlot://sandboxes/{id}/files/tmp/mcp/note.txt");
    let res = c
        .read_resource(rmcp::model::ReadResourceRequestParams::new(uri.clone()))
        .await
        .unwrap();
    match &res.contents[..] {
        [rmcp::model::ResourceContents::TextResourceContents { text, uri: u, .. }] => {
            assert_eq!((text.as_str(), u.as_str()), ("from mcp\n", uri.as_str()));
        }
        other => panic!("{other:?}"),
    }
    let templates = c.list_all_resource_templates().await.unwrap();
    assert!(
        templates
            .iter()
            .any(|t| t.uri_template.starts_with("sandlot://sandboxes/")),
        "{templates:?}"
    );
    let listing = ok(c, "list_files", json!({"sandbox": id, "path": "/tmp/mcp"})).await;
    assert!(listing.contains("/tmp/mcp/note.txt"), "{listing}");

    let listed = ok(c, "list_sandboxes", json!({})).await;
    assert!(listed.contains(&id), "{listed}");
    let del = ok(c, "delete_sandbox", json!({"sandbox": id})).await;
    assert!(del.contains(&id), "{del}");
    assert_eq!(block_on_operator(d, &id).await.state.as_str(), "stopped");
}

/// The sandbox as the operator sees it.
async fn block_on_operator(d: &Daemon, id: &str) -> sandlot_client::Sandbox {
    d.client().get_sandbox(id).await.unwrap()
}

#[test]
fn mcp_over_http_creates_runs_writes_reads_and_deletes_a_sandbox() {
    let d = Daemon::start(None);
    let token = d.token("alpha");
    block_on_within(120, "the HTTP round trip", async {
        let c = http_client(&d, &token).await;
        sandbox_round_trip(&c, &d, "alpha").await;
        c.cancel().await.unwrap();
    });
}

#[test]
fn mcp_over_stdio_creates_runs_writes_reads_and_deletes_a_sandbox() {
    let d = Daemon::start(None);
    let token = d.token("beta");
    block_on_within(120, "the stdio round trip", async {
        let (c, mut child) = stdio_client(&d, &token).await;
        sandbox_round_trip(&c, &d, "beta").await;
        c.cancel().await.unwrap();
        // Its standard input closed, `sandlot mcp` ends by itself.
        let st = api_support::wait_exit(&mut child, std::time::Duration::from_secs(20));
        let st = st.unwrap_or_else(|| {
            let _ = child.kill();
            panic!("sandlot mcp did not end when its input closed")
        });
        assert!(st.success(), "{st}");
    });
}

#[test]
fn bad_tool_arguments_are_tool_errors_naming_the_argument() {
    let d = Daemon::start(None);
    let token = d.token("alpha");
    block_on_within(120, "the bad arguments", async {
        let c = http_client(&d, &token).await;
        let e = tool_error(&c, "run_command", json!({"command": "ls"})).await;
        assert_eq!(e, "missing argument `sandbox`");
        let e = tool_error(
            &c,
            "run_command",
            json!({"sandbox": "x", "command": "ls", "argv": ["ls"]}),
        )
        .await;
        assert!(
            e.contains("`command`") && e.contains("`argv`") && e.contains("not both"),
            "{e}"
        );
        let e = tool_error(
            &c,
            "read_file",
            json!({"sandbox": "x", "path": "/", "colour": "red"}),
        )
        .await;
        assert!(e.starts_with("unknown argument `colour`"), "{e}");
        let e = tool_error(
            &c,
            "run_command",
            json!({"sandbox": "x", "argv": ["ls"], "max_output_bytes": 0}),
        )
        .await;
        assert!(e.contains("`max_output_bytes`"), "{e}");
        // A sandbox argument is one name: a `/` would make it another route.
        let e = tool_error(
            &c,
            "delete_sandbox",
            json!({"sandbox": "x/contexts/default"}),
        )
        .await;
        assert!(e.starts_with("invalid argument `sandbox`"), "{e}");
        // The API's own 400 comes through with the field it names and what is allowed.
        let e = tool_error(&c, "create_sandbox", json!({"memory": "1K"})).await;
        assert!(
            e.contains("resources.memory") && e.contains("400 bad_request"),
            "{e}"
        );
        // A sandbox that does not exist.
        let e = tool_error(
            &c,
            "run_command",
            json!({"sandbox": "sb-nope", "command": "true"}),
        )
        .await;
        assert!(e.contains("404 not_found"), "{e}");
        // A path in the sandbox that does not exist: the API's message, no host path.
        let created: Value =
            serde_json::from_str(&ok(&c, "create_sandbox", json!({})).await).unwrap();
        let id = created["id"].as_str().unwrap();
        let e = tool_error(
            &c,
            "read_file",
            json!({"sandbox": id, "path": "/no/such/file"}),
        )
        .await;
        assert!(
            e.contains("404") && !e.contains(&d.dir.display().to_string()),
            "{e}"
        );
        // The session survives every error.
        let out = ok(
            &c,
            "run_command",
            json!({"sandbox": id, "command": "echo still here"}),
        )
        .await;
        assert!(out.contains("still here"), "{out}");
        ok(&c, "delete_sandbox", json!({"sandbox": id})).await;
        c.cancel().await.unwrap();
    });
}

#[test]
fn long_output_is_cut_with_a_marker_saying_how_much_was_left_out() {
    let d = Daemon::start(None);
    let token = d.token("alpha");
    block_on_within(120, "the long output", async {
        let c = http_client(&d, &token).await;
        let created: Value =
            serde_json::from_str(&ok(&c, "create_sandbox", json!({})).await).unwrap();
        let id = created["id"].as_str().unwrap();
        let out = ok(
            &c,
            "run_command",
            json!({"sandbox": id, "command": "head -c 100000 /dev/zero | tr '\\0' x; echo; echo END", "max_output_bytes": 1000}),
        )
        .await;
        assert!(
            out.contains("[... 99005 bytes left out of 100005 ...]"),
            "{}",
            &out[..out.len().min(300)]
        );
        assert!(out.contains("END\n"), "the end of the output is kept");
        assert!(out.len() < 1200, "{} bytes handed back", out.len());
        ok(&c, "delete_sandbox", json!({"sandbox": id})).await;
        c.cancel().await.unwrap();
    });
}

#[test]
fn another_tenants_sandbox_is_not_found_through_mcp() {
    let d = Daemon::start(None);
    let ta = d.token("alpha");
    let tb = d.token("beta");
    block_on_within(120, "the tenant checks", async {
        let a = d.tcp(Some(&ta));
        let sa = a.create_sandbox(&Default::default()).await.unwrap();
        let id = sa.id.as_str();
        let mut children = Vec::new();
        for (name, c) in [
            ("http", http_client(&d, &tb).await),
            ("stdio", {
                let (c, child) = stdio_client(&d, &tb).await;
                children.push(child);
                c
            }),
        ] {
            let listed = ok(&c, "list_sandboxes", json!({"include_stopped": true})).await;
            assert!(!listed.contains(id), "{name}: {listed}");
            let uri = format!("sandlot://sandboxes/{id}/files/etc/hostname");
            let e = c
                .read_resource(rmcp::model::ReadResourceRequestParams::new(uri))
                .await
                .unwrap_err();
            assert!(e.to_string().contains("404 not_found"), "{name}: {e}");
            for (tool, args) in [
                ("run_command", json!({"sandbox": id, "command": "true"})),
                ("read_file", json!({"sandbox": id, "path": "/etc/hostname"})),
                (
                    "write_file",
                    json!({"sandbox": id, "path": "/tmp/x", "content": "x"}),
                ),
                ("list_files", json!({"sandbox": id, "path": "/"})),
                ("snapshot_sandbox", json!({"sandbox": id})),
                ("delete_sandbox", json!({"sandbox": id})),
            ] {
                let e = tool_error(&c, tool, args).await;
                assert!(e.contains("404 not_found"), "{name} {tool}: {e}");
            }
            c.cancel().await.unwrap();
        }
        for mut ch in children {
            let _ = ch.kill();
            let _ = ch.wait();
        }
        let still = a.get_sandbox(id).await.unwrap();
        assert_eq!(
            still.state.as_str(),
            "running",
            "tenant A's sandbox is untouched"
        );
        a.delete_sandbox(id).await.unwrap();
    });
}

/// A raw HTTP request to `/mcp`: (status, headers lowercased, body).
fn raw_mcp(
    d: &Daemon,
    method: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", d.port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut head = format!(
        "{method} /mcp HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let out = String::from_utf8_lossy(&buf).into_owned();
    let (h, b) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (
        h[9..12].parse().unwrap(),
        h.to_ascii_lowercase(),
        b.to_string(),
    )
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"test","version":"0"}}}"#;

#[test]
fn mcp_without_a_valid_token_is_401() {
    let d = Daemon::start(None);
    let accept = ("Accept", "application/json, text/event-stream");
    let json = ("Content-Type", "application/json");
    let (status, _, body) = raw_mcp(&d, "POST", &[accept, json], INITIALIZE);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("unauthorized"), "{body}");
    let (status, _, _) = raw_mcp(
        &d,
        "POST",
        &[accept, json, ("Authorization", "Bearer sl_not_a_token")],
        INITIALIZE,
    );
    assert_eq!(status, 401);
    // The operator's socket has no /mcp (its callers are the operator).
    let (status, _) = d.raw("POST", "/mcp", INITIALIZE);
    assert_eq!(status, 404);
}

#[test]
fn an_mcp_session_answers_only_the_token_that_opened_it() {
    let d = Daemon::start(None);
    let ta = format!("Bearer {}", d.token("alpha"));
    let tb = format!("Bearer {}", d.token("beta"));
    let ta2 = format!("Bearer {}", d.token("alpha"));
    let accept = ("Accept", "application/json, text/event-stream");
    let json = ("Content-Type", "application/json");
    let (status, head, body) = raw_mcp(
        &d,
        "POST",
        &[accept, json, ("Authorization", &ta)],
        INITIALIZE,
    );
    assert_eq!(status, 200, "{body}");
    let sid = head
        .lines()
        .find_map(|l| l.strip_prefix("mcp-session-id: "))
        .expect("a session id")
        .trim()
        .to_string();
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    // Another tenant's token, and another token of the same tenant, with that
    // session id: as if the session did not exist.
    for other in [&tb, &ta2] {
        let (status, _, body) = raw_mcp(
            &d,
            "POST",
            &[
                accept,
                json,
                ("Authorization", other),
                ("Mcp-Session-Id", &sid),
            ],
            list,
        );
        assert_eq!(status, 404, "{body}");
        let (status, _, _) = raw_mcp(
            &d,
            "DELETE",
            &[("Authorization", other), ("Mcp-Session-Id", &sid)],
            "",
        );
        assert_eq!(status, 404);
    }
    // The opener still has it, and ends it.
    let (status, _, body) = raw_mcp(
        &d,
        "DELETE",
        &[("Authorization", &ta), ("Mcp-Session-Id", &sid)],
        "",
    );
    assert!((200..300).contains(&status), "{status} {body}");
    // rmcp itself no longer has it: the id is still recorded as the opener's
    // until the next initialize, so this request reaches rmcp, which answers 404.
    let (status, _, _) = raw_mcp(
        &d,
        "POST",
        &[
            accept,
            json,
            ("Authorization", &ta),
            ("Mcp-Session-Id", &sid),
        ],
        list,
    );
    assert_eq!(status, 404, "an ended session is gone");
}

/// A client that keeps the progress notifications it is sent.
#[derive(Clone, Default)]
struct ProgressRecorder(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl rmcp::ClientHandler for ProgressRecorder {
    async fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) {
        self.0
            .lock()
            .unwrap()
            .push(params.message.unwrap_or_default());
    }
}

#[test]
fn a_long_command_reports_progress_and_a_cancelled_call_kills_it() {
    use rmcp::model::{CallToolRequest, ClientRequest};
    use rmcp::service::PeerRequestOptions;
    let d = Daemon::start(None);
    let token = d.token("alpha");
    block_on_within(120, "the cancelled command", async {
        let api = d.tcp(Some(&token));
        let sb = api.create_sandbox(&Default::default()).await.unwrap();
        let (out, inp, mut child) = spawn_stdio(&d, &token);
        let progress = ProgressRecorder::default();
        let c = progress.clone().serve((out, inp)).await.unwrap();
        let Value::Object(args) =
            json!({"sandbox": sb.id, "argv": ["sleep", "300"], "timeout": 600})
        else {
            unreachable!()
        };
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new("run_command").with_arguments(args),
        ));
        let handle = c
            .peer()
            .send_cancellable_request(request, PeerRequestOptions::no_options())
            .await
            .unwrap();
        let running = |want: &'static str| {
            let api = api.clone();
            let id = sb.id.clone();
            move || {
                let api = api.clone();
                let id = id.clone();
                async move {
                    api.list_processes(&id)
                        .await
                        .unwrap()
                        .iter()
                        .any(|p| p.argv == ["sleep", "300"] && p.state == want)
                }
            }
        };
        api_support::eventually(30, "the command to run", running("running")).await;
        api_support::eventually(30, "a progress notification", || {
            let p = progress.clone();
            async move { !p.0.lock().unwrap().is_empty() }
        })
        .await;
        let first = progress.0.lock().unwrap()[0].clone();
        assert!(first.starts_with("running for "), "{first}");
        handle
            .cancel(Some("the agent gave up".into()))
            .await
            .unwrap();
        api_support::eventually(30, "the command to be killed", running("exited")).await;
        let p = api.list_processes(&sb.id).await.unwrap();
        let sleep = p.iter().find(|p| p.argv == ["sleep", "300"]).unwrap();
        assert_eq!(sleep.exit.as_ref().and_then(|e| e.signal), Some(9));
        // The session goes on.
        let r = call(
            &c,
            "run_command",
            json!({"sandbox": sb.id, "command": "echo after"}),
        )
        .await;
        assert!(text(&r).contains("after"), "{}", text(&r));
        c.cancel().await.unwrap();
        let _ = api_support::wait_exit(&mut child, std::time::Duration::from_secs(20));
        let _ = child.kill();
        let _ = child.wait();
        api.delete_sandbox(&sb.id).await.unwrap();
    });
}

#[test]
fn run_code_keeps_state_and_vfs_shell_browses_a_collection_through_mcp() {
    use api_support::vfs::{acl, body, tar_of};
    use sandlot_client::vfs::UploadFormat;
    let d = Daemon::start(None);
    let ta = d.token("alpha");
    let tb = d.token("beta");
    block_on_within(180, "code and collections", async {
        let a = d.tcp(Some(&ta));
        let files = [
            ("docs/guide.md", "the rate limit is 10 a second\n"),
            ("internal/secret.md", "hunter2\n"),
        ];
        a.create_collection_upload("kb", UploadFormat::Tar, &acl(), body(tar_of(&files)))
            .await
            .unwrap();
        let c = http_client(&d, &ta).await;
        let out = ok(
            &c,
            "vfs_shell",
            json!({"collection": "kb", "command": "grep -r 'rate limit' /"}),
        )
        .await;
        assert!(
            out.starts_with("exit_code: 0\n") && out.contains("the rate limit is 10"),
            "{out}"
        );
        // The default principal sees public documents only (the ACL of the API).
        let out = ok(
            &c,
            "vfs_shell",
            json!({"collection": "kb", "command": "cat /internal/secret.md"}),
        )
        .await;
        assert!(!out.contains("hunter2"), "{out}");
        // A kept session keeps its working directory.
        let out = ok(
            &c,
            "vfs_shell",
            json!({"collection": "kb", "command": "cd /docs", "keep_session": true}),
        )
        .await;
        let sid = out
            .lines()
            .find_map(|l| l.strip_prefix("session: "))
            .expect("the kept session's id")
            .to_string();
        let out = ok(
            &c,
            "vfs_shell",
            json!({"collection": "kb", "command": "pwd", "session": sid}),
        )
        .await;
        assert!(out.contains("stdout:\n/docs\n"), "{out}");
        // Another tenant's collection is not found.
        let b = http_client(&d, &tb).await;
        let e = tool_error(
            &b,
            "vfs_shell",
            json!({"collection": "kb", "command": "ls /"}),
        )
        .await;
        assert!(e.contains("404 not_found"), "{e}");
        b.cancel().await.unwrap();

        // The model cannot widen its view: no principal or groups of its own ...
        for widen in [
            json!({"collection": "kb", "command": "cat /internal/secret.md", "principal": "alice", "groups": ["eng"]}),
            json!({"collection": "kb", "command": "cat /internal/secret.md", "groups": ["eng"]}),
        ] {
            let e = tool_error(&c, "vfs_shell", widen).await;
            assert!(e.starts_with("unknown argument"), "{e}");
        }
        // ... nor a session it did not open (here one opened through the API with
        // every document in view).
        let wide = a
            .open_vfs_session(
                "kb",
                &sandlot_client::vfs::OpenSession {
                    principal: "root".into(),
                    groups: vec!["eng".into()],
                    version: None,
                    all_access: true,
                    scratch: false,
                    scratch_max_bytes: None,
                },
            )
            .await
            .unwrap();
        let e = tool_error(
            &c,
            "vfs_shell",
            json!({"collection": "kb", "command": "cat /internal/secret.md", "session": wide.id}),
        )
        .await;
        assert!(
            e.contains("invalid argument `session`") && !e.contains("hunter2"),
            "{e}"
        );

        let created: Value =
            serde_json::from_str(&ok(&c, "create_sandbox", json!({})).await).unwrap();
        let id = created["id"].as_str().unwrap();
        let out = ok(
            &c,
            "run_code",
            json!({"sandbox": id, "code": "x = 6 * 7\nprint('side')\nx"}),
        )
        .await;
        assert!(
            out.starts_with("status: ok\n") && out.contains("result: 42") && out.contains("side"),
            "{out}"
        );
        let out = ok(&c, "run_code", json!({"sandbox": id, "code": "x + 1"})).await;
        assert!(out.contains("result: 43"), "the context kept x: {out}");
        let out = ok(&c, "run_code", json!({"sandbox": id, "code": "1 / 0"})).await;
        assert!(
            out.starts_with("status: error\n") && out.contains("ZeroDivisionError"),
            "{out}"
        );
        ok(&c, "delete_sandbox", json!({"sandbox": id})).await;
        c.cancel().await.unwrap();
    });
}

/// The session id of an answer's head.
fn session_of(head: &str) -> String {
    head.lines()
        .find_map(|l| l.strip_prefix("mcp-session-id: "))
        .expect("a session id")
        .trim()
        .to_string()
}

const ACCEPT: (&str, &str) = ("Accept", "application/json, text/event-stream");
const JSON: (&str, &str) = ("Content-Type", "application/json");

#[test]
fn parallel_initializes_never_open_more_sessions_than_the_cap_and_an_ended_one_frees_its_slot() {
    let d = Daemon::start(None);
    let ta = format!("Bearer {}", d.token("alpha"));
    let answers: Vec<(u16, String, String)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..40)
            .map(|_| {
                s.spawn(|| {
                    raw_mcp(
                        &d,
                        "POST",
                        &[ACCEPT, JSON, ("Authorization", &ta)],
                        INITIALIZE,
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let opened: Vec<String> = answers
        .iter()
        .filter(|a| a.0 == 200)
        .map(|a| session_of(&a.1))
        .collect();
    assert_eq!(opened.len(), 32, "the cap is 32 sessions a tenant");
    for (status, _, body) in answers.iter().filter(|a| a.0 != 200) {
        assert_eq!(*status, 429, "{body}");
        assert!(
            body.contains("quota_exceeded") && body.contains("32 MCP sessions"),
            "{body}"
        );
    }
    // A request that opens no session is not held back by the cap: rmcp answers it.
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let (status, _, body) = raw_mcp(&d, "POST", &[ACCEPT, JSON, ("Authorization", &ta)], list);
    assert_ne!(status, 429, "{body}");
    // Another tenant has its own cap.
    let tb = format!("Bearer {}", d.token("beta"));
    let (status, _, body) = raw_mcp(
        &d,
        "POST",
        &[ACCEPT, JSON, ("Authorization", &tb)],
        INITIALIZE,
    );
    assert_eq!(status, 200, "{body}");
    // The owner ends one; rmcp no longer has it (its own 404 for the id), and its
    // slot is free again because rmcp says it is gone.
    let auth = ("Authorization", ta.as_str());
    let (status, _, body) = raw_mcp(&d, "DELETE", &[auth, ("Mcp-Session-Id", &opened[0])], "");
    assert!((200..300).contains(&status), "{status} {body}");
    let (status, _, _) = raw_mcp(
        &d,
        "POST",
        &[ACCEPT, JSON, auth, ("Mcp-Session-Id", &opened[0])],
        list,
    );
    assert_eq!(status, 404, "an ended session is gone");
    let (status, _, body) = raw_mcp(&d, "POST", &[ACCEPT, JSON, auth], INITIALIZE);
    assert_eq!(status, 200, "the ended session's slot is free: {body}");
    let (status, _, body) = raw_mcp(&d, "POST", &[ACCEPT, JSON, auth], INITIALIZE);
    assert_eq!(status, 429, "{body}");
}

/// Sends a tool call as a cancellable request; its handle.
async fn start_call(
    c: &McpClient,
    tool: &str,
    args: Value,
) -> rmcp::service::RequestHandle<RoleClient> {
    use rmcp::model::{CallToolRequest, ClientRequest};
    use rmcp::service::PeerRequestOptions;
    let Value::Object(args) = args else {
        unreachable!()
    };
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(
        CallToolRequestParams::new(tool.to_string()).with_arguments(args),
    ));
    c.peer()
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
        .unwrap()
}

#[test]
fn over_http_only_my_session_cancels_my_call_and_a_cancelled_shell_command_dies_whole() {
    let d = Daemon::start(None);
    let token = d.token("alpha");
    let bearer = format!("Bearer {token}");
    block_on_within(180, "cancellation over /mcp", async {
        let api = d.tcp(Some(&token));
        let sb = api.create_sandbox(&Default::default()).await.unwrap();
        let c = http_client(&d, &token).await;
        let waiting = start_call(
            &c,
            "run_command",
            json!({"sandbox": sb.id,
                   "command": "while [ ! -e /tmp/go ]; do sleep 0.1; done; echo finished"}),
        )
        .await;
        // Another session of the same token cancels every request id it can guess.
        let (status, head, body) = raw_mcp(
            &d,
            "POST",
            &[ACCEPT, JSON, ("Authorization", &bearer)],
            INITIALIZE,
        );
        assert_eq!(status, 200, "{body}");
        let other = session_of(&head);
        let hdrs = [
            ACCEPT,
            JSON,
            ("Authorization", bearer.as_str()),
            ("Mcp-Session-Id", other.as_str()),
            ("Mcp-Protocol-Version", "2025-06-18"),
        ];
        let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        let (status, _, body) = raw_mcp(&d, "POST", &hdrs, initialized);
        assert!((200..300).contains(&status), "{status} {body}");
        for id in 0..8 {
            let cancel = format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id}}}}}"#
            );
            let (status, _, body) = raw_mcp(&d, "POST", &hdrs, &cancel);
            assert!((200..300).contains(&status), "{status} {body}");
        }
        api.exec(
            &sb.id,
            &sandlot_client::ExecBody {
                argv: vec!["touch".into(), "/tmp/go".into()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let r = waiting.await_response().await.unwrap();
        let rmcp::model::ServerResult::CallToolResult(r) = r else {
            panic!("not a tool result: {r:?}")
        };
        let out = text(&r);
        assert!(
            out.starts_with("exit_code: 0\n") && out.contains("finished"),
            "{out}"
        );

        // My own cancel ends a shell command line with what it started.
        let handle = start_call(
            &c,
            "run_command",
            json!({"sandbox": sb.id,
                   "command": "sleep 300 & echo $! > /tmp/pid; wait"}),
        )
        .await;
        let alive = "kill -0 $(cat /tmp/pid) 2>/dev/null && echo alive || echo dead";
        api_support::eventually(30, "the command to start", || {
            let c = &c;
            let id = sb.id.clone();
            async move {
                ok(c, "run_command", json!({"sandbox": id, "command": alive}))
                    .await
                    .contains("alive")
            }
        })
        .await;
        handle
            .cancel(Some("the agent gave up".into()))
            .await
            .unwrap();
        api_support::eventually(30, "the background sleep to be killed", || {
            let c = &c;
            let id = sb.id.clone();
            async move {
                ok(c, "run_command", json!({"sandbox": id, "command": alive}))
                    .await
                    .contains("dead")
            }
        })
        .await;
        c.cancel().await.unwrap();
        api.delete_sandbox(&sb.id).await.unwrap();
    });
}

#[test]
fn a_tool_call_whose_http_response_is_dropped_is_cancelled() {
    use std::io::Write;
    let d = Daemon::start(None);
    let token = d.token("alpha");
    let bearer = format!("Bearer {token}");
    block_on_within(180, "a dropped call", async {
        let api = d.tcp(Some(&token));
        let sb = api.create_sandbox(&Default::default()).await.unwrap();
        let (status, head, body) = raw_mcp(
            &d,
            "POST",
            &[ACCEPT, JSON, ("Authorization", &bearer)],
            INITIALIZE,
        );
        assert_eq!(status, 200, "{body}");
        let sid = session_of(&head);
        let hdrs = [
            ACCEPT,
            JSON,
            ("Authorization", bearer.as_str()),
            ("Mcp-Session-Id", sid.as_str()),
            ("Mcp-Protocol-Version", "2025-06-18"),
        ];
        let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        raw_mcp(&d, "POST", &hdrs, initialized);
        let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
            "name": "run_command",
            "arguments": {"sandbox": sb.id, "argv": ["sleep", "301"], "timeout": 600}}})
        .to_string();
        let mut s = std::net::TcpStream::connect(("127.0.0.1", d.port)).unwrap();
        let mut req = format!(
            "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n",
            call.len()
        );
        for (k, v) in hdrs {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(&call);
        s.write_all(req.as_bytes()).unwrap();
        let sleep = |want: &'static str| {
            let api = api.clone();
            let id = sb.id.clone();
            move || {
                let api = api.clone();
                let id = id.clone();
                async move {
                    api.list_processes(&id)
                        .await
                        .unwrap()
                        .iter()
                        .any(|p| p.argv == ["sleep", "301"] && p.state == want)
                }
            }
        };
        api_support::eventually(30, "the command to run", sleep("running")).await;
        drop(s);
        api_support::eventually(30, "the command to be killed", sleep("exited")).await;
        api.delete_sandbox(&sb.id).await.unwrap();
    });
}

#[test]
fn a_session_has_at_most_eight_tool_calls_in_flight_and_a_long_timeout_is_refused() {
    let d = Daemon::start(None);
    let token = d.token("alpha");
    block_on_within(180, "calls in flight", async {
        let api = d.tcp(Some(&token));
        let sb = api.create_sandbox(&Default::default()).await.unwrap();
        let c = http_client(&d, &token).await;
        let e = tool_error(
            &c,
            "run_command",
            json!({"sandbox": sb.id, "command": "yes", "timeout": "100h"}),
        )
        .await;
        assert!(e.contains("timeout") && e.contains("3600"), "{e}");
        let mut handles = Vec::new();
        for _ in 0..8 {
            handles.push(
                start_call(
                    &c,
                    "run_command",
                    json!({"sandbox": sb.id, "argv": ["sleep", "302"]}),
                )
                .await,
            );
        }
        api_support::eventually(30, "eight commands to run", || {
            let api = api.clone();
            let id = sb.id.clone();
            async move {
                let p = api.list_processes(&id).await.unwrap();
                p.iter()
                    .filter(|p| p.argv == ["sleep", "302"] && p.state == "running")
                    .count()
                    == 8
            }
        })
        .await;
        let e = tool_error(
            &c,
            "run_command",
            json!({"sandbox": sb.id, "command": "echo ninth"}),
        )
        .await;
        assert!(
            e.contains("too many tool calls in flight in this session (the most is 8)"),
            "{e}"
        );
        for h in handles {
            h.cancel(None).await.unwrap();
        }
        api_support::eventually(30, "the calls to end", || {
            let c = &c;
            let id = sb.id.clone();
            async move {
                let r = call(
                    c,
                    "run_command",
                    json!({"sandbox": id, "command": "echo ninth"}),
                )
                .await;
                r.is_error != Some(true)
            }
        })
        .await;
        c.cancel().await.unwrap();
        api.delete_sandbox(&sb.id).await.unwrap();
    });
}

#[test]
fn sandlot_mcp_without_an_address_refuses_the_operator_socket() {
    let out = std::process::Command::new(api_support::sandlot())
        .arg("mcp")
        .env_remove("SANDLOT_URL")
        .env_remove("SANDLOT_HOST")
        .env_remove("SANDLOT_TOKEN")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run sandlot mcp");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("operator socket")
            && err.contains("SANDLOT_URL")
            && err.contains("SANDLOT_TOKEN")
            && err.contains("--operator"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "stdout carries the protocol only");
}
