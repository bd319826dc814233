//! The API through a real daemon: sandbox lifecycle, validation of every field,
//! error shapes, quotas, timeouts and idle timeouts, metrics, and the CLI.

mod api_support;

use std::time::Duration;

use api_support::{event_kinds, eventually, rt, Daemon};
use sandlot_client::{CreateSandbox, ExecBody, ListFilter, SandboxState};
use serde_json::json;

fn body(v: serde_json::Value) -> CreateSandbox {
    let serde_json::Value::Object(spec) = v else {
        panic!("a JSON object")
    };
    CreateSandbox {
        spec,
        ..Default::default()
    }
}

#[test]
fn lifecycle_filters_and_errors() {
    lifecycle_filters_and_errors_on(&api_support::suite_isolation());
}

#[test]
fn lifecycle_filters_and_errors_on_gvisor() {
    lifecycle_filters_and_errors_on("gvisor");
}

/// On the namespace backend and on gVisor: the same API, the same answers.
fn lifecycle_filters_and_errors_on(isolation: &str) {
    let d = Daemon::start_isolated(None, isolation);
    let c = d.client();
    rt().block_on(async {
        let req = body(json!({"resources": {"memory": "256M"}, "timeout": "2m"}))
            .with_name("alpha")
            .with_tag("user", "u1")
            .with_metadata("purpose", "test");
        let sb = c.create_sandbox(&req).await.unwrap();
        assert_eq!(sb.state, SandboxState::Running);
        assert!(sb.id.starts_with(&d.prefix));
        assert_eq!(sb.spec["resources"]["memory"], json!(256 << 20));
        // By id and by name.
        assert_eq!(c.get_sandbox(&sb.id).await.unwrap().id, sb.id);
        assert_eq!(c.get_sandbox("alpha").await.unwrap().id, sb.id);
        // A second live sandbox may not take the name.
        let e = c.create_sandbox(&req).await.unwrap_err();
        assert_eq!(
            (e.status().unwrap().as_u16(), e.code()),
            (409, Some("conflict"))
        );
        // Filters.
        let other = CreateSandbox::default().with_tag("user", "u2");
        let sb2 = c.create_sandbox(&other).await.unwrap();
        let f = |tags: Vec<(&str, Option<&str>)>| ListFilter {
            tags: tags
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.map(String::from)))
                .collect(),
            ..Default::default()
        };
        let l = c
            .list_sandboxes(&f(vec![("user", Some("u1"))]))
            .await
            .unwrap();
        assert_eq!(
            l.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            vec![sb.id.as_str()]
        );
        assert_eq!(
            c.list_sandboxes(&f(vec![("user", None)]))
                .await
                .unwrap()
                .len(),
            2
        );
        // Exec and its metering.
        let out = c
            .run(&sb.id, &["sh", "-c", "echo hi; echo err >&2; exit 3"])
            .await
            .unwrap();
        assert_eq!(
            (out.stdout.as_slice(), out.stderr.as_slice(), out.exit.code),
            (&b"hi\n"[..], &b"err\n"[..], Some(3))
        );
        let got = c.get_sandbox(&sb.id).await.unwrap();
        assert_eq!(got.usage.exec_count, 1);
        assert_eq!((got.usage.stdout_bytes, got.usage.stderr_bytes), (3, 4));
        assert!(got.usage.memory_peak_bytes > 0 && got.usage.cpu_seconds >= 0.0);
        // Delete; then it is stopped, listed only with state=stopped, refuses work (409).
        let del = c.delete_sandbox(&sb.id).await.unwrap();
        assert_eq!(
            (del.state, del.end_reason.as_deref()),
            (SandboxState::Stopped, Some("deleted"))
        );
        assert!(del.usage.wall_seconds > 0.0);
        let live: Vec<String> = c
            .list_sandboxes(&ListFilter::default())
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(live, vec![sb2.id.clone()]);
        let stopped = c
            .list_sandboxes(&ListFilter {
                states: vec!["stopped".into()],
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(stopped.iter().any(|s| s.id == sb.id));
        let e = c.run(&sb.id, &["true"]).await.unwrap_err();
        assert_eq!(
            (e.status().unwrap().as_u16(), e.code()),
            (409, Some("conflict"))
        );
        // Idempotent delete; unknown ids are 404 in the one error shape.
        assert_eq!(
            c.delete_sandbox(&sb.id).await.unwrap().state,
            SandboxState::Stopped
        );
        let e = c.get_sandbox("sb-nope").await.unwrap_err();
        match &e {
            sandlot_client::Error::Api { status, body } => {
                assert_eq!(status.as_u16(), 404);
                assert_eq!(body.code, "not_found");
                assert!(body.request_id.starts_with("req_"), "{body:?}");
            }
            other => panic!("{other:?}"),
        }
        // Events record the life.
        assert_eq!(
            event_kinds(&c, &sb.id).await,
            ["created", "started", "stopped"]
        );
        // A command that does not exist.
        let e = c
            .exec(
                &sb2.id,
                &ExecBody {
                    argv: vec!["/nonexistent".into()],
                    ..Default::default()
                },
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some("spawn_failed"), "{e}");
        // Metrics.
        let m = c.metrics().await.unwrap();
        assert!(m.contains("sandlot_sandboxes_live 1\n"), "{m}");
        assert!(
            m.contains("sandlot_sandbox_create_seconds_count 2\n"),
            "{m}"
        );
        assert!(
            m.contains("sandlot_http_errors_total{code=\"not_found\"}"),
            "{m}"
        );
        assert!(m.contains("sandlot_exec_total 1\n"), "{m}");
        // Delete by name: the live sandbox goes; the name then finds nothing.
        let named = c
            .create_sandbox(&CreateSandbox::from(sandlot_client::CreateSandboxRequest {
                name: Some("beta".into()),
                ..Default::default()
            }))
            .await
            .unwrap();
        let del = c.delete_sandbox("beta").await.unwrap();
        assert_eq!(
            (del.id.as_str(), del.state, del.end_reason.as_deref()),
            (named.id.as_str(), SandboxState::Stopped, Some("deleted"))
        );
        let e = c.delete_sandbox("beta").await.unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(404), "{e}");
    });
}

#[test]
fn bad_bodies_name_each_field() {
    let d = Daemon::start(Some("[limits]\nmax_timeout = \"1h\"\n"));
    let cases: &[(&str, &str)] = &[
        (r#"{"imagee": "host"}"#, "imagee"),
        (r#"{"image": "ubuntu"}"#, "image"),
        (r#"{"rootfs": "rel/dir"}"#, "rootfs"),
        (
            r#"{"mounts": [{"type": "bind", "source": "/tmp", "target": "rel"}]}"#,
            "mounts[0].target",
        ),
        (
            r#"{"mounts": [{"type": "bind", "source": "tmp", "target": "/x"}]}"#,
            "mounts[0].source",
        ),
        (
            r#"{"mounts": [{"type": "bind", "source": "/nonexistent-sandlot-src", "target": "/x"}]}"#,
            "mounts[0].source",
        ),
        (
            r#"{"mounts": [{"type": "nfs", "target": "/x"}]}"#,
            "mounts[0].type",
        ),
        (
            r#"{"mounts": [{"type": "bind", "source": "/tmp"}]}"#,
            "mounts[0].target",
        ),
        (r#"{"env": {"1X": "a"}}"#, "env.1X"),
        (r#"{"env": {"A": 5}}"#, "env.A"),
        (r#"{"workdir": "tmp"}"#, "workdir"),
        (r#"{"user": "nobody!"}"#, "user"),
        (r#"{"hostname": "bad host"}"#, "hostname"),
        (r#"{"resources": {"memory": "1K"}}"#, "resources.memory"),
        (r#"{"resources": {"memory": "lots"}}"#, "resources.memory"),
        (r#"{"resources": {"cpus": 0}}"#, "resources.cpus"),
        (r#"{"resources": {"pids": 1}}"#, "resources.pids"),
        (r#"{"resources": {"disk": "1K"}}"#, "resources.disk"),
        (r#"{"resources": {"mem": "1G"}}"#, "resources.mem"),
        (r#"{"timeout": 0}"#, "timeout"),
        (r#"{"timeout": "2h"}"#, "timeout"),
        (r#"{"network": {"mode": "host"}}"#, "network.mode"),
        (r#"{"name": "bad name"}"#, "name"),
        (r#"{"name": 5}"#, "name"),
        (r#"{"tags": {"k": 1}}"#, "tags.k"),
        (r#"{"tags": {"bad key": "v"}}"#, "tags"),
        (r#"{"metadata": []}"#, "metadata"),
        (r#"{"idle_timeout": "soon"}"#, "idle_timeout"),
        (r#"{"idle_timeout": "2h"}"#, "idle_timeout"),
    ];
    for (b, field) in cases {
        let (st, v) = d.raw("POST", "/v1/sandboxes", b);
        assert_eq!(st, 400, "{b}: {v}");
        assert_eq!(v["error"]["code"], "bad_request", "{b}: {v}");
        assert_eq!(v["error"]["field"], *field, "{b}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().starts_with(field),
            "{b}: {v}"
        );
        assert!(
            v["error"]["request_id"]
                .as_str()
                .unwrap()
                .starts_with("req_"),
            "{b}: {v}"
        );
    }
    let (st, v) = d.raw("POST", "/v1/sandboxes", "{not json");
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{v}"
    );
    let big = format!(r#"{{"metadata": {{"a": "{}"}}}}"#, "x".repeat(2 << 20));
    let (st, v) = d.raw("POST", "/v1/sandboxes", &big);
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (413, Some("payload_too_large")),
        "{v}"
    );
    let (st, v) = d.raw("GET", "/v1/openapi.json", "");
    assert_eq!(st, 200);
    assert!(v["paths"]["/v1/sandboxes"].is_object(), "{v}");
    let (st, v) = d.raw("GET", "/v1/nothing", "");
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{v}"
    );
    let (st, v) = d.raw("PATCH", "/v1/sandboxes", "");
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (405, Some("method_not_allowed")),
        "{v}"
    );
    // Exec bodies are strict too, on a live sandbox.
    let c = d.client();
    let sb = rt()
        .block_on(c.create_sandbox(&CreateSandbox::default()))
        .unwrap();
    let p = format!("/v1/sandboxes/{}/exec", sb.id);
    for (b, field) in [
        (r#"{"argv": []}"#, "argv"),
        (r#"{"argv": ["ls"], "bogus": 1}"#, "bogus"),
        (r#"{"argv": ["ls"], "cwd": "rel"}"#, "cwd"),
        (r#"{"argv": ["ls"], "pty": {"rows": 0, "cols": 80}}"#, "pty"),
        (r#"{"argv": ["ls"], "timeout": "x"}"#, "timeout"),
        (r#"{"argv": "ls"}"#, "argv"),
        // A missing field is named too (it was "body").
        (r#"{}"#, "argv"),
        (r#"{"cwd": "/tmp"}"#, "argv"),
    ] {
        let (st, v) = d.raw("POST", &p, b);
        assert_eq!(st, 400, "{b}: {v}");
        assert_eq!(v["error"]["field"], field, "{b}: {v}");
    }
    let (_, v) = d.raw("POST", &p, "{}");
    assert_eq!(v["error"]["message"], "argv: required but missing", "{v}");
    let (st, v) = d.raw(
        "POST",
        &format!("/v1/sandboxes/{}/timeout", sb.id),
        r#"{"timeout": "5h"}"#,
    );
    assert_eq!(
        (st, v["error"]["field"].as_str()),
        (400, Some("timeout")),
        "{v}"
    );
}

#[test]
fn quotas_answer_429() {
    let d = Daemon::start(Some(
        "[quotas]\nmax_sandboxes = 2\nmax_memory = \"1G\"\n[tenants.big]\nmax_sandboxes = 3\n",
    ));
    let c = d.client();
    rt().block_on(async {
        let m = |mem: &str| body(json!({"resources": {"memory": mem}}));
        c.create_sandbox(&m("512M")).await.unwrap();
        let e = c.create_sandbox(&m("600M")).await.unwrap_err();
        assert_eq!(
            (e.status().unwrap().as_u16(), e.code()),
            (429, Some("quota_exceeded")),
            "{e}"
        );
        c.create_sandbox(&m("256M")).await.unwrap();
        let e = c.create_sandbox(&m("64M")).await.unwrap_err();
        assert_eq!(e.code(), Some("quota_exceeded"));
        assert!(e.to_string().contains("quota is 2"), "{e}");
        // Another tenant has its own quota.
        let big = d.client().with_tenant(Some("big".into()));
        for _ in 0..3 {
            big.create_sandbox(&m("64M")).await.unwrap();
        }
        assert_eq!(
            big.create_sandbox(&m("64M")).await.unwrap_err().code(),
            Some("quota_exceeded")
        );
    });
}

#[test]
fn lifetime_and_idle_timeouts_are_enforced() {
    let d = Daemon::start(None);
    let c = d.client();
    let extended_id = rt().block_on(async {
        let short = c
            .create_sandbox(&body(json!({"timeout": "2s"})))
            .await
            .unwrap();
        // Long enough that a slow create still leaves it time to be extended.
        let extended = c
            .create_sandbox(&body(json!({"timeout": "5s"})))
            .await
            .unwrap();
        let ext = c.set_timeout(&extended.id, json!("30s")).await.unwrap();
        assert!(ext.expires_at > extended.expires_at);
        let idle_req = CreateSandbox::from(sandlot_client::CreateSandboxRequest {
            idle_timeout: Some(Some(sandlot_proto::units::Seconds::secs(3))),
            ..Default::default()
        });
        let idle = c.create_sandbox(&idle_req).await.unwrap();
        let busy = c.create_sandbox(&idle_req).await.unwrap();
        // Activity keeps `busy` alive past its idle timeout (a command every
        // 0.7 s for 4.2 s; a stall of over 2 s would end it).
        for _ in 0..6 {
            c.run(&busy.id, &["true"]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
        let s = c.get_sandbox(&busy.id).await.unwrap();
        assert_eq!(s.state, SandboxState::Running, "{s:?}");
        for (id, reason) in [
            (&short.id, "timeout"),
            (&idle.id, "idle_timeout"),
            (&busy.id, "idle_timeout"),
        ] {
            eventually(15, &format!("{id} to stop ({reason})"), || async {
                c.get_sandbox(id).await.unwrap().state == SandboxState::Stopped
            })
            .await;
            let s = c.get_sandbox(id).await.unwrap();
            assert_eq!(s.end_reason.as_deref(), Some(reason), "{s:?}");
        }
        assert_eq!(
            c.get_sandbox(&extended.id).await.unwrap().state,
            SandboxState::Running
        );
        extended.id
    });
    // The torn-down sandboxes left nothing (only the extended one, still running, has
    // a run directory and cgroups; all is checked again at shutdown). Their host
    // clean-up runs right after the record says stopped, so give it a moment.
    let stray = || -> Vec<String> {
        d.leftovers()
            .into_iter()
            .filter(|l| !l.contains(&extended_id))
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !stray().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = stray();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn cli_commands_and_exit_codes() {
    let d = Daemon::start(None);
    let (code, id, err) = d.cli(&[
        "create", "--name", "cli1", "--tag", "team=a", "--memory", "128M",
    ]);
    assert_eq!(code, 0, "{err}");
    let id = id.trim().to_string();
    let (code, out, _) = d.cli(&["ls"]);
    assert_eq!(code, 0);
    assert!(
        out.contains(&id) && out.contains("team=a") && out.starts_with("ID"),
        "{out}"
    );
    let (code, out, _) = d.cli(&["ls", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["id"], id.as_str());
    let (code, out, _) = d.cli(&[
        "exec",
        "cli1",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 7",
    ]);
    assert_eq!((code, out.as_str()), (7, "out\n"));
    let (code, _, err) = d.cli(&["exec", &id, "--", "/no/such/program"]);
    assert_eq!(code, 127, "{err}");
    let (code, _, _) = d.cli(&["exec", &id, "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(code, 128 + 15);
    let (code, _, _) = d.cli(&["exec", "--timeout", "1s", &id, "--", "sleep", "30"]);
    assert_eq!(code, 124);
    // Files both ways.
    let local = d.dir.join("in.txt");
    std::fs::write(&local, b"payload\n").unwrap();
    let (code, _, err) = d.cli(&[
        "cp",
        local.to_str().unwrap(),
        &format!("{id}:/home/user/x/in.txt"),
    ]);
    assert_eq!(code, 0, "{err}");
    let back = d.dir.join("back.txt");
    let (code, _, err) = d.cli(&[
        "cp",
        &format!("{id}:/home/user/x/in.txt"),
        back.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(&back).unwrap(), b"payload\n");
    // Directories go as tar.
    let tree = d.dir.join("tree");
    std::fs::create_dir_all(tree.join("a/b")).unwrap();
    std::fs::write(tree.join("a/b/f"), b"deep").unwrap();
    let (code, _, err) = d.cli(&["cp", tree.to_str().unwrap(), &format!("{id}:/srv/tree")]);
    assert_eq!(code, 0, "{err}");
    let out_tree = d.dir.join("tree-back");
    let (code, _, err) = d.cli(&["cp", &format!("{id}:/srv/tree"), out_tree.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(out_tree.join("a/b/f")).unwrap(), b"deep");
    // Found by probing: a copy out kept set-id bits, so a sandbox could plant a
    // set-id program in the tree of whoever copied it (root, here). Permission
    // bits come along, set-id bits never; a single file keeps its bits too.
    let (code, _, err) = d.cli(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "mkdir -p /srv/suid && cp /bin/true /srv/suid/t && chmod 6755 /srv/suid/t \
         && chmod 2775 /srv/suid && cp /bin/true /srv/one && chmod 4755 /srv/one",
    ]);
    assert_eq!(code, 0, "{err}");
    let suid_back = d.dir.join("suid-back");
    let (code, _, err) = d.cli(&[
        "cp",
        &format!("{id}:/srv/suid"),
        suid_back.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let one_back = d.dir.join("one-back");
    let (code, _, err) = d.cli(&["cp", &format!("{id}:/srv/one"), one_back.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&suid_back.join("t")), 0o755);
    assert_eq!(mode(&one_back), 0o755);
    // Background process and logs.
    let (code, pid, err) = d.cli(&["exec", "-d", &id, "--", "sh", "-c", "echo bg-output"]);
    assert_eq!(code, 0, "{err}");
    std::thread::sleep(Duration::from_millis(300));
    let (code, out, err) = d.cli(&["logs", &id, pid.trim()]);
    assert_eq!((code, out.as_str()), (0, "bg-output\n"), "{err}");
    let (code, out, _) = d.cli(&["timeout", &id, "10m"]);
    assert!(code == 0 && out.contains("expires at"), "{out}");
    let (code, out, _) = d.cli(&["inspect", &id]);
    assert!(
        code == 0 && out.contains("state:") && out.contains("running"),
        "{out}"
    );
    // Errors: one line, exit 125.
    let (code, _, err) = d.cli(&["inspect", "nope"]);
    assert_eq!(code, 125);
    assert!(
        err.starts_with("sandlot: no sandbox nope (not_found, request req_"),
        "{err}"
    );
    let (code, out, _) = d.cli(&["rm", &id]);
    assert_eq!((code, out.trim()), (0, id.as_str()));
    let (code, out, _) = d.cli(&["completions", "bash"]);
    assert!(
        code == 0 && out.contains("_sandlot"),
        "{}",
        &out[..out.len().min(200)]
    );
}

/// SDK request: a create whose answer was lost can be retried with the same
/// `Idempotency-Key` without making a second sandbox.
#[test]
fn idempotency_key_makes_create_retry_safe() {
    let d = Daemon::start(Some("[quotas]\nmax_sandboxes = 2\n"));
    let c = d.client();
    rt().block_on(async {
        let req = body(json!({"tags": {"run": "a"}}));
        // Concurrent first tries and a later retry: one sandbox.
        let (a, b) = tokio::join!(
            c.create_sandbox_with_key(&req, "key-1"),
            c.create_sandbox_with_key(&req, "key-1")
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a.id, b.id);
        let again = c.create_sandbox_with_key(&req, "key-1").await.unwrap();
        assert_eq!(again.id, a.id);
        let live = c.list_sandboxes(&ListFilter::default()).await.unwrap();
        assert_eq!(live.len(), 1, "{live:?}");
        // The same key with another body is refused; a bad key names the header.
        let e = c
            .create_sandbox_with_key(&body(json!({"tags": {"run": "b"}})), "key-1")
            .await
            .unwrap_err();
        assert_eq!(
            (e.status().map(|s| s.as_u16()), e.code()),
            (Some(422), Some("idempotency_mismatch")),
            "{e}"
        );
        let e = c
            .create_sandbox_with_key(&req, "has space")
            .await
            .unwrap_err();
        assert!(e.to_string().contains("Idempotency-Key"), "{e}");
        // A failed create forgets its key: the retry tries again.
        c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let other = body(json!({"tags": {"run": "c"}}));
        let e = c
            .create_sandbox_with_key(&other, "key-2")
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some("quota_exceeded"), "{e}");
        c.delete_sandbox(&a.id).await.unwrap();
        let made = c.create_sandbox_with_key(&other, "key-2").await.unwrap();
        assert_ne!(made.id, a.id);
        // A deleted sandbox's key still answers with it (no second create).
        let replay = c.create_sandbox_with_key(&req, "key-1").await.unwrap();
        assert_eq!((&replay.id, replay.state), (&a.id, SandboxState::Stopped));
    });
}

/// The processes of sandbox `id` still in its cgroups (empty once PID 1 and its
/// pid namespace are gone, or once the cgroups themselves are).
fn cgroup_processes(d: &Daemon, id: &str) -> Vec<String> {
    d.leftovers()
        .iter()
        .filter(|p| p.starts_with("/sys/fs/cgroup") && p.ends_with(id))
        .flat_map(|p| {
            std::fs::read_to_string(format!("{p}/cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// DELETE answers once nothing of the sandbox runs any more, with its final record;
/// the host's side goes right after, off the request path; a graceful stop of the
/// daemon right after a burst of deletes leaves nothing behind.
#[test]
fn delete_returns_once_dead_and_cleanup_follows() {
    let mut d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        // A background process that would outlive a sloppy stop.
        let bg = ExecBody {
            argv: vec!["sleep".into(), "600".into()],
            ..Default::default()
        };
        c.exec(&sb.id, &bg).await.unwrap();
        assert!(!cgroup_processes(&d, &sb.id).is_empty());
        let gone = c.delete_sandbox(&sb.id).await.unwrap();
        assert_eq!(gone.state, SandboxState::Stopped, "{gone:?}");
        assert_eq!(gone.end_reason.as_deref(), Some("deleted"));
        assert_eq!(cgroup_processes(&d, &sb.id), Vec::<String>::new());
        eventually(10, "the deleted sandbox's host side to go", || async {
            !d.leftovers().iter().any(|p| p.contains(&sb.id))
        })
        .await;
        assert_eq!(
            event_kinds(&c, &sb.id).await,
            ["created", "started", "stopped"]
        );

        // A burst of deletes, then at once a graceful stop of the daemon.
        let mut ids = Vec::new();
        for _ in 0..6 {
            ids.push(
                c.create_sandbox(&CreateSandbox::default())
                    .await
                    .unwrap()
                    .id,
            );
        }
        let deletes: Vec<_> = ids
            .iter()
            .map(|id| {
                let c = c.clone();
                let id = id.clone();
                tokio::spawn(async move { c.delete_sandbox(&id).await })
            })
            .collect();
        for t in deletes {
            assert_eq!(t.await.unwrap().unwrap().state, SandboxState::Stopped);
        }
    });
    d.terminate();
    // No waiting here: the daemon exits only after its clean-ups are done.
    let left = d.leftovers();
    assert!(left.is_empty(), "left after a graceful stop: {left:?}");
}

/// A sandbox with network `none` joins a loopback-only network namespace
/// the daemon made ahead of time (`runtime.netns_stock`) instead of creating one on
/// the create path; it behaves as before: only `lo`, up, and a server may listen on
/// a port below 1024, here even as the unprivileged user. With the stock off, PID 1
/// creates its own namespace (`CLONE_NEWNET`).
#[test]
fn none_sandboxes_join_a_stocked_loopback_namespace() {
    let probe = "cat /proc/sys/net/ipv4/ip_unprivileged_port_start; \
                 tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; \
                 python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 80)); s.listen(); \
                 c=socket.create_connection((\"127.0.0.1\", 80)); print(\"low port ok\")'";
    let run = |d: &Daemon, user: &str| {
        let c = d.client();
        rt().block_on(async {
            let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
            let p = c
                .exec(
                    &sb.id,
                    &ExecBody {
                        argv: vec!["/bin/sh".into(), "-c".into(), probe.into()],
                        user: Some(user.into()),
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            let out = c
                .output(&sb.id, p.id, 0, 0)
                .await
                .unwrap()
                .collect()
                .await
                .unwrap();
            c.delete_sandbox(&sb.id).await.unwrap();
            (
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
    };
    let stock_metric = |d: &Daemon, want: &'static str| {
        let c = d.client();
        rt().block_on(eventually(20, want, || {
            let c = c.clone();
            async move { c.metrics().await.is_ok_and(|t| t.contains(want)) }
        }));
    };
    let d = Daemon::start(None);
    stock_metric(&d, "sandlot_runtime_stock_ready{kind=\"netns\"} 4\n");
    let (out, err) = run(&d, "user");
    assert_eq!(out, "0\nlo\nlow port ok\n", "{err}");
    let (out, err) = run(&d, "root");
    assert_eq!(out, "0\nlo\nlow port ok\n", "{err}");
    drop(d);

    let d = Daemon::start(Some("[runtime]\nnetns_stock = 0\n"));
    stock_metric(&d, "sandlot_runtime_stock_ready{kind=\"netns\"} 0\n");
    let (out, err) = run(&d, "root");
    assert_eq!(out, "1024\nlo\nlow port ok\n", "{err}");
}

/// Found by probing: `sandlot image ls | head -3` panicked ("failed printing to
/// stdout: Broken pipe"), and `sandlot exec ... | head -1` failed with "sandlot:
/// Broken pipe". A closed pipe now ends the command quietly, as it ends other Unix
/// tools (status 141, SIGPIPE).
#[test]
fn a_closed_pipe_ends_the_cli_quietly() {
    let d = Daemon::start(None);
    let id = rt()
        .block_on(d.client().create_sandbox(&CreateSandbox::default()))
        .unwrap()
        .id;
    let o = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "'{}' exec {id} -- seq 1 300000 | head -1; exit ${{PIPESTATUS[0]}}",
            api_support::sandlot().display()
        ))
        .env("SANDLOT_URL", format!("unix://{}", d.socket.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "1\n");
    assert!(err.is_empty(), "{err}");
    assert_eq!(o.status.code(), Some(141), "{err}");
}

/// The CPU files of cgroup `name` under `parent`: (v2 `cpu.max` or v1
/// `cpu.cfs_quota_us`, v2 `cpu.weight` or v1 `cpu.shares`) of the cgroup and of the
/// parent, read from whichever hierarchy has the cpu controller.
fn cpu_files(parent: &str, name: &str) -> (String, String) {
    let read = |p: std::path::PathBuf| {
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .trim()
            .to_string()
    };
    let v1 = std::path::Path::new("/sys/fs/cgroup/cpu").join(parent);
    if v1.is_dir() {
        (
            read(v1.join(name).join("cpu.cfs_quota_us")),
            read(v1.join("cpu.shares")),
        )
    } else {
        let v2 = std::path::Path::new("/sys/fs/cgroup").join(parent);
        (
            read(v2.join(name).join("cpu.max")),
            read(v2.join("cpu.weight")),
        )
    }
}

/// A sandbox whose spec asks for no CPU quota gets the operator's default
/// (`runtime.default_cpus`, else half the host's CPUs), and the sandboxes' parent
/// cgroup weighs what the operator set against the daemon and the rest of the host.
/// Found by a review: a sandbox without `cpus` had no limit at all, and a fork bomb
/// in one pushed the host's load to 44.
#[test]
fn sandboxes_without_a_cpu_limit_get_the_operators_default() {
    let parent = format!("sandlot-cputest-{}", std::process::id());
    let v1 = std::path::Path::new("/sys/fs/cgroup/cpu").is_dir();
    let mut d = Daemon::start(Some(&format!(
        "[runtime]\ncgroup_parent = \"{parent}\"\ndefault_cpus = 0.5\nmax_cpus = 2\ncgroup_cpu_weight = 25\n"
    )));
    let c = d.client();
    let (plain, sized) = rt().block_on(async {
        let plain = c
            .create_sandbox(&CreateSandbox::default())
            .await
            .unwrap()
            .id;
        let body = api_support::spec_body(json!({"resources": {"cpus": 1.5}}));
        let sized = c.create_sandbox(&body).await.unwrap().id;
        (plain, sized)
    });
    // A spec cannot ask its way past the quota: above the operator's ceiling is
    // refused (`cpus: 1024` had no quota at all), and nothing is created.
    let refused = rt().block_on(async {
        let body = api_support::spec_body(json!({"resources": {"cpus": 1024}}));
        c.create_sandbox(&body).await.unwrap_err()
    });
    let msg = refused.to_string();
    assert!(
        msg.contains("resources.cpus") && msg.contains("ceiling of 2"),
        "{msg}"
    );
    let live = rt()
        .block_on(c.list_sandboxes(&sandlot_client::ListFilter {
            states: vec!["all".into()],
            ..Default::default()
        }))
        .unwrap();
    assert_eq!(live.len(), 2, "{live:?}");
    let (quota, weight) = cpu_files(&parent, &plain);
    let (asked, _) = cpu_files(&parent, &sized);
    if v1 {
        assert_eq!((quota.as_str(), weight.as_str()), ("50000", "256"));
        assert_eq!(asked, "150000");
    } else {
        assert_eq!((quota.as_str(), weight.as_str()), ("50000 100000", "25"));
        assert_eq!(asked, "150000 100000");
    }
    // Busy loops in it are throttled to that half core (four of them for two
    // seconds: on a host busy with other work they still ask for more than it).
    let burn = "for i in 1 2 3 4; do timeout 2 sh -c 'while :; do :; done' & done; wait";
    let out = rt()
        .block_on(c.run(&plain, &["/bin/sh", "-c", burn]))
        .unwrap();
    assert_eq!(out.exit.code, Some(0));
    let stat = if v1 {
        std::path::Path::new("/sys/fs/cgroup/cpu")
            .join(&parent)
            .join(&plain)
    } else {
        std::path::Path::new("/sys/fs/cgroup")
            .join(&parent)
            .join(&plain)
    };
    let stat = std::fs::read_to_string(stat.join("cpu.stat")).unwrap();
    let throttled: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("nr_throttled "))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(throttled > 0, "{stat}");
    d.shutdown();
    assert!(!std::path::Path::new("/sys/fs/cgroup/cpu")
        .join(&parent)
        .exists());
    assert!(!std::path::Path::new("/sys/fs/cgroup")
        .join(&parent)
        .exists());

    // Without a setting: half the host's CPUs, at least one.
    let mut d = Daemon::start(Some(&format!("[runtime]\ncgroup_parent = \"{parent}\"\n")));
    let c = d.client();
    let id = rt()
        .block_on(c.create_sandbox(&CreateSandbox::default()))
        .unwrap()
        .id;
    let cpus = std::thread::available_parallelism().unwrap().get();
    let want = ((cpus / 2).max(1) * 100_000).to_string();
    let (quota, weight) = cpu_files(&parent, &id);
    assert_eq!(quota.split_whitespace().next(), Some(want.as_str()));
    assert_eq!(weight, if v1 { "512" } else { "50" });
    d.shutdown();
}

/// A working directory that does not exist yet is made when the sandbox starts,
/// as Docker does for `-w`: a spec's `workdir` (a cold create, and a pool claim
/// that configures it), and `sandlot create -w`; it belongs to the sandbox's user,
/// so the user's commands run and write there (they used to fail, exit 127).
#[test]
fn a_missing_working_directory_is_made_for_the_sandbox_user() {
    let d = Daemon::start(Some("[[pools]]\nname = \"p\"\nsize = 1\n"));
    let c = d.client();
    rt().block_on(async {
        let check = |id: String, dir: &'static str, owner: &'static str| {
            let c = c.clone();
            async move {
                let o = c
                    .run(
                        &id,
                        &["sh", "-c", "pwd && stat -c %u . && touch made && echo ok"],
                    )
                    .await
                    .unwrap();
                assert_eq!(
                    String::from_utf8_lossy(&o.stdout),
                    format!("{dir}\n{owner}\nok\n"),
                    "{}",
                    String::from_utf8_lossy(&o.stderr)
                );
                assert_eq!(o.exit.code, Some(0));
            }
        };
        // Cold (a shape no pool serves).
        let sb = c
            .create_sandbox(&body(
                json!({"workdir": "/work/deep", "user": "user", "resources": {"memory": "256M"}}),
            ))
            .await
            .unwrap();
        check(sb.id, "/work/deep", "1000").await;
        // A pool claim: its agent is configured with the workdir.
        eventually(30, "the pool to be ready", || async {
            c.metrics()
                .await
                .is_ok_and(|m| m.contains("sandlot_pool_ready{pool=\"p\"} 1"))
        })
        .await;
        let sb = c
            .create_sandbox(&body(json!({"workdir": "/srv/app", "user": "user"})))
            .await
            .unwrap();
        let m = c.metrics().await.unwrap();
        assert!(
            m.contains("sandlot_pool_hits_total{pool=\"p\"} 1"),
            "a claim: {m}"
        );
        check(sb.id, "/srv/app", "1000").await;
    });
    let (code, id, err) = d.cli(&["create", "-w", "/work"]);
    assert_eq!(code, 0, "{err}");
    rt().block_on(check_cli(&c, id.trim()));
}

async fn check_cli(c: &sandlot_client::Client, id: &str) {
    let o = c.run(id, &["pwd"]).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "/work\n");
}

/// The operator's defaults fill what a create body leaves out, never what it
/// gives, even when what it gives is the spec's own default: an absent
/// `network` is the operator's, `{}` is mode `none`, `null` is refused naming
/// the field; an absent `idle_timeout` is the operator's, `null` is none.
#[test]
fn the_operators_defaults_fill_only_what_the_create_body_leaves_out() {
    let mut d = Daemon::start_isolated(
        Some(
            "[network]\nceiling = \"allow\"\npool_size = 0\n\
             default = { mode = \"allow\", allow = [{ domain = \"example.com\" }] }\n\
             [limits]\ndefault_idle_timeout = \"10m\"\n",
        ),
        "namespace",
    );
    let c = d.client();
    rt().block_on(async {
        let absent = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        assert_eq!(absent.spec["network"]["mode"], "allow", "{}", absent.spec);
        assert_eq!(
            absent.spec["network"]["allow"][0]["domain"], "example.com",
            "{}",
            absent.spec
        );
        assert_eq!(absent.idle_timeout, Some(600.0));
        let given = c
            .create_sandbox(&body(json!({"network": {}, "idle_timeout": null})))
            .await
            .unwrap();
        assert_eq!(given.spec["network"]["mode"], "none", "{}", given.spec);
        assert_eq!(given.idle_timeout, None);
        for (bad, field) in [
            (json!({"network": null}), "network"),
            (json!({"network": {"mode": "open"}}), "network.mode"),
            (json!({"idle_timeout": 0}), "idle_timeout"),
        ] {
            let e = c.create_sandbox(&body(bad.clone())).await.unwrap_err();
            let sandlot_client::Error::Api { status, body: e } = e else {
                panic!("{bad}: {e}")
            };
            assert_eq!(status.as_u16(), 400, "{bad}: {}", e.message);
            assert_eq!(e.field.as_deref(), Some(field), "{bad}: {}", e.message);
        }
        for sb in [absent, given] {
            c.delete_sandbox(&sb.id).await.unwrap();
        }
    });
    d.shutdown();
}
