//! What a tenant is told when its requests fail, over TCP: each error names the
//! problem (the field, the line, the port) and never a host path of the daemon.

mod api_support;

use api_support::{http, Daemon};
use serde_json::{json, Value};

/// A tenant sends bad input to every part of the API it can reach (collections and
/// their uploads, sandboxes and their mounts, images, volumes, secrets, files,
/// ports, network, the E2B front door): no answer shows the daemon's data or run
/// directory (nor the host paths the operator allows), and the errors about the
/// tenant's own mounts name the field.
#[test]
fn a_tenants_errors_never_show_the_daemons_paths() {
    struct RemoveOnDrop(std::path::PathBuf);
    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let allowed = std::env::temp_dir().join(format!("sandlot-allowed-{}", std::process::id()));
    std::fs::create_dir_all(&allowed).unwrap();
    let _allowed_dir = RemoveOnDrop(allowed.clone());
    let e2b_port = api_support::free_port();
    let d = Daemon::start(Some(&format!(
        "[mounts]\nallowed_host_paths = [\"{}\"]\n[e2b]\nlisten = \"127.0.0.1:{e2b_port}\"\n",
        allowed.display()
    )));
    let token = d.token("acme");
    let mut answers: Vec<(String, u16, String)> = Vec::new();
    let mut call = |method: &str, path: &str, ctype: &str, body: &[u8]| -> (u16, Value) {
        let (st, b) = d.tcp_raw(&token, method, path, ctype, body);
        answers.push((format!("{method} {path}"), st, b.clone()));
        (st, serde_json::from_str(&b).unwrap_or(Value::Null))
    };
    let json = "application/json";
    let jsonl = "application/x-ndjson";

    // Collections: uploads are staged under the data directory while they are read.
    let (st, v) = call("POST", "/v1/vfs?name=rows", jsonl, b"not json\n");
    assert_eq!(st, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("the upload, line 1"), "{v}");
    let (st, v) = call(
        "POST",
        "/v1/vfs?name=latin1",
        jsonl,
        b"{\"path\": \"a\xe9\"}\n",
    );
    assert_eq!(st, 400, "{v}");
    let good = b"{\"path\": \"kb/a.md\", \"chunk\": 0, \"text\": \"first\\n\"}\n";
    let (st, v) = call("POST", "/v1/vfs?name=kb", jsonl, good);
    assert_eq!(st, 201, "{v}");
    let (st, v) = call("POST", "/v1/vfs/kb/ingest", jsonl, b"{\"path\": 5}\n");
    assert_eq!(st, 400, "{v}");
    let (st, v) = call("POST", "/v1/vfs?name=t", "application/x-tar", &[7u8; 1024]);
    assert_eq!(st, 400, "{v}");
    let (st, _) = call(
        "POST",
        "/v1/vfs",
        json,
        br#"{"name": "d", "source": {"kind": "dir", "path": "/srv"}}"#,
    );
    assert_eq!(st, 403);
    let (st, _) = call(
        "POST",
        "/v1/vfs/nope/sessions",
        json,
        br#"{"principal": "a"}"#,
    );
    assert_eq!(st, 404);

    // Sandboxes: mounts of host paths that are not there name the field only.
    let missing = allowed.join("missing").display().to_string();
    for (spec, field) in [
        (
            json!({"mounts": [{"type": "tmpfs", "target": "/t"}, {"type": "bind", "source": missing, "target": "/m"}]}),
            "mounts[1].source",
        ),
        (json!({"rootfs": missing}), "rootfs"),
        (
            json!({"mounts": [{"type": "bind", "source": "/etc", "target": "/e"}]}),
            "mounts[0].source",
        ),
        (
            json!({"volumes": [{"name": "nope", "target": "/v"}]}),
            "volumes[0].name",
        ),
        (
            json!({"secrets": [{"name": "nope", "env": "X"}]}),
            "secrets[0].name",
        ),
        (json!({"image": "nope:1"}), "image"),
        (
            json!({"mounts": [{"type": "collection", "collection": "nope", "target": "/c"}]}),
            "mounts[0].collection",
        ),
    ] {
        let (st, v) = call("POST", "/v1/sandboxes", json, spec.to_string().as_bytes());
        assert_eq!(
            (st, v["error"]["field"].as_str()),
            (400, Some(field)),
            "{spec}: {v}"
        );
    }
    let (st, v) = call("POST", "/v1/sandboxes", json, b"{}");
    assert_eq!(st, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let sb = format!("/v1/sandboxes/{id}");

    // Images, volumes, secrets.
    for (method, path, body) in [
        ("GET", "/v1/images/nope:1".to_string(), ""),
        ("GET", "/v1/images/export?ref=nope".to_string(), ""),
        ("GET", "/v1/images/diff?a=nope&b=host".to_string(), ""),
        ("POST", "/v1/images/import".to_string(), "x"),
        ("POST", "/v1/images/build?file=x".to_string(), "x"),
        (
            "POST",
            "/v1/images/pull".to_string(),
            r#"{"reference": "x"}"#,
        ),
        // A snapshot of its `host` sandbox is valid: a bad tag is the error.
        ("POST", format!("{sb}/snapshot"), r#"{"tag": "Not A Tag!"}"#),
        ("POST", "/v1/volumes".to_string(), r#"{"name": "../v"}"#),
        (
            "POST",
            "/v1/volumes".to_string(),
            r#"{"name": "v", "size_limit": "1K"}"#,
        ),
        ("DELETE", "/v1/volumes/nope".to_string(), ""),
        (
            "POST",
            "/v1/secrets".to_string(),
            r#"{"name": "a/b", "value": "v"}"#,
        ),
        ("DELETE", "/v1/secrets/nope".to_string(), ""),
    ] {
        let (st, v) = call(method, &path, json, body.as_bytes());
        assert!((400..500).contains(&st), "{method} {path}: {st} {v}");
    }

    // Files, processes, ports and network of its own sandbox.
    for (method, path, ctype, body) in [
        ("GET", format!("{sb}/files?path=/nope"), json, &b""[..]),
        ("GET", format!("{sb}/files/list?path=/nope"), json, b""),
        (
            "PUT",
            format!("{sb}/files/tar?path=/tmp/t"),
            "application/x-tar",
            &[7u8; 1024],
        ),
        (
            "PUT",
            format!("{sb}/files?path=/proc/nope/x"),
            "application/octet-stream",
            b"x",
        ),
        (
            "POST",
            format!("{sb}/exec"),
            json,
            br#"{"argv": ["surely-not-a-program"]}"#,
        ),
        (
            "POST",
            format!("{sb}/exec"),
            json,
            br#"{"argv": ["true"], "cwd": "/nope"}"#,
        ),
        ("GET", format!("{sb}/processes/99/output"), json, b""),
        ("GET", format!("{sb}/ports/9/"), json, b""),
        ("GET", format!("{sb}/ports/0x10/"), json, b""),
        (
            "POST",
            format!("{sb}/ports"),
            json,
            br#"{"port": 8000, "bind": "10.0.0.1"}"#,
        ),
        ("PUT", format!("{sb}/network"), json, br#"{"mode": "open"}"#),
        ("GET", format!("{sb}/network/log?after=x"), json, b""),
    ] {
        let (st, v) = call(method, &path, ctype, body);
        assert!((400..=504).contains(&st), "{method} {path}: {st} {v}");
    }

    // The E2B front door, with the same token as its API key.
    let e2b = |method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]| {
        let mut h = vec![("X-API-Key", token.as_str()), ("Content-Type", json)];
        h.extend_from_slice(headers);
        http(e2b_port, method, path, &h, body)
    };
    let mut e2b_answers = Vec::new();
    let (st, b) = e2b("POST", "/v2/sandboxes", &[], br#"{"templateID": "nope"}"#);
    assert_eq!(st, 404, "{b}");
    e2b_answers.push(b);
    let (st, b) = e2b("POST", "/v2/sandboxes", &[], br#"{"templateID": "base"}"#);
    assert_eq!(st, 201, "{b}");
    let created: Value = serde_json::from_str(&b).unwrap();
    let (eid, access) = (
        created["sandboxID"].as_str().unwrap().to_string(),
        created["envdAccessToken"].as_str().unwrap().to_string(),
    );
    let envd = [
        ("E2b-Sandbox-Id", eid.as_str()),
        ("X-Access-Token", access.as_str()),
    ];
    for (method, path, body) in [
        ("GET", "/files?path=/nope", &b""[..]),
        (
            "POST",
            "/filesystem.Filesystem/Stat",
            br#"{"path": "/nope"}"#,
        ),
        (
            "POST",
            "/filesystem.Filesystem/ListDir",
            br#"{"path": "/proc/nope"}"#,
        ),
    ] {
        let (st, b) = e2b(method, path, &envd, body);
        assert!((400..500).contains(&st), "{path}: {st} {b}");
        e2b_answers.push(b);
    }

    // The operator's allowed host paths are not the tenant's to read either.
    let data = d.data_dir().display().to_string();
    let dir = d.dir.display().to_string();
    let allowed_dir = allowed.display().to_string();
    let shown: Vec<_> = answers
        .iter()
        .map(|(what, _, b)| (what.as_str(), b.as_str()))
        .chain(e2b_answers.iter().map(|b| ("e2b", b.as_str())))
        .filter(|(_, b)| {
            [&dir, &data, &allowed_dir, "/run/sandlot"]
                .iter()
                .any(|p| b.contains(p))
        })
        .collect();
    assert!(
        shown.is_empty(),
        "answers show the daemon's paths: {shown:#?}"
    );
    // The operator has the whole story, under the request id.
    assert!(
        d.log().contains("vfs/uploads/acme/rows.jsonl"),
        "the daemon log names the staged upload"
    );
}

/// A tenant probes the host's file system through the errors of requests that name
/// host paths (a collection's source, a bind mount), directly and through links
/// planted in a directory the operator allows (which a sandbox with a writable bind
/// of it can do): whether a path outside the allowed directories exists must not
/// change the answer. (`/etc/passwd` was 403 and `/etc/nope` 400 "No such file or
/// directory"; a link to an existing host file was "not allowed" and one to a
/// missing file "does not exist".)
#[test]
fn a_tenant_cannot_probe_which_host_paths_exist() {
    let allowed = std::env::temp_dir().join(format!("sandlot-probe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&allowed);
    std::fs::create_dir_all(allowed.join("inside")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", allowed.join("to-passwd")).unwrap();
    std::os::unix::fs::symlink("/etc/nope-not-here", allowed.join("to-nothing")).unwrap();
    std::os::unix::fs::symlink("../../etc", allowed.join("up-to-etc")).unwrap();
    std::os::unix::fs::symlink("../../nope-not-here", allowed.join("up-to-nothing")).unwrap();
    std::os::unix::fs::symlink("inside", allowed.join("to-inside")).unwrap();
    let d = Daemon::start(Some(&format!(
        "[mounts]\nallowed_host_paths = [\"{a}\"]\n[vfs]\nallowed_source_paths = [\"{a}\"]\n",
        a = allowed.display()
    )));
    let token = d.token("acme");
    let answer = |path: &str, body: String| -> (u16, String) {
        let (st, b) = d.tcp_raw(&token, "POST", path, "application/json", body.as_bytes());
        let v: Value = serde_json::from_str(&b).unwrap_or(Value::Null);
        (st, v["error"]["message"].as_str().unwrap_or(&b).to_string())
    };
    let source = |p: &str| {
        let (st, m) = answer(
            "/v1/vfs",
            json!({"name": "probe", "source": {"kind": "dir", "path": p}}).to_string(),
        );
        (st, m.replace(p, "PATH"))
    };
    let bind = |p: &str| {
        answer(
            "/v1/sandboxes",
            json!({"mounts": [{"type": "bind", "source": p, "target": "/m"}]}).to_string(),
        )
    };
    let a = allowed.display().to_string();
    for (exists, missing) in [
        ("/etc/passwd".to_string(), "/etc/nope-not-here".to_string()),
        ("/root".to_string(), "/nope-not-here/x".to_string()),
        (format!("{a}/to-passwd"), format!("{a}/to-nothing")),
        (format!("{a}/up-to-etc"), format!("{a}/up-to-nothing")),
    ] {
        let (e, m) = (source(&exists), source(&missing));
        assert_eq!(e, m, "collection source {exists} and {missing}");
        assert_eq!(e.0, 403, "{exists}: {e:?}");
        let (e, m) = (bind(&exists), bind(&missing));
        assert_eq!(e, m, "bind mount of {exists} and {missing}");
        assert_eq!(e.0, 400, "{exists}: {e:?}");
    }
    // Inside the allowed directory, a missing path is still said to be missing, and
    // a link that stays inside is followed.
    let (st, m) = source(&format!("{a}/inside/nope"));
    assert_eq!(st, 400, "{m}");
    let (st, m) = bind(&format!("{a}/inside/nope"));
    assert_eq!(st, 400, "{m}");
    assert!(m.contains("does not exist"), "{m}");
    let (st, m) = source(&format!("{a}/to-inside"));
    assert_eq!(st, 201, "{m}");
    let _ = std::fs::remove_dir_all(&allowed);
}
