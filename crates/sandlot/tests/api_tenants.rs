//! Tenant isolation over TCP: tokens, 401 without one, and another tenant's
//! sandbox is 404 for every operation (never 403).

mod api_support;

use api_support::{rt, Daemon};
use sandlot_client::{CreateSandbox, ExecBody, ListFilter};

#[test]
fn tenants_see_and_touch_only_their_own_sandboxes() {
    let d = Daemon::start(None);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the operator socket must be root-only");
    let ta = d.token("alpha");
    let tb = d.token("beta");
    let a = d.tcp(Some(&ta));
    let b = d.tcp(Some(&tb));
    rt().block_on(async {
        assert_eq!(a.health().await.unwrap().tenant, "alpha");
        let sa = a.create_sandbox(&CreateSandbox::default()).await.unwrap();
        assert_eq!(sa.tenant, "alpha");
        let sb = b
            .create_sandbox(&CreateSandbox::from(sandlot_client::CreateSandboxRequest {
                name: Some("bee".into()),
                ..Default::default()
            }))
            .await
            .unwrap();
        // Listings are per tenant.
        let la = a.list_sandboxes(&ListFilter::default()).await.unwrap();
        assert_eq!(
            la.iter().map(|s| s.id.clone()).collect::<Vec<_>>(),
            vec![sa.id.clone()]
        );
        let lb = b
            .list_sandboxes(&ListFilter {
                states: vec!["all".into()],
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(
            lb.iter().map(|s| s.id.clone()).collect::<Vec<_>>(),
            vec![sb.id.clone()]
        );
        // Every route on the other tenant's sandbox is 404 not_found.
        let id = &sb.id;
        let not_found = |e: sandlot_client::Error| {
            assert_eq!(
                (e.status().map(|s| s.as_u16()), e.code()),
                (Some(404), Some("not_found")),
                "{e}"
            );
        };
        not_found(a.get_sandbox(id).await.unwrap_err());
        not_found(a.get_sandbox("bee").await.unwrap_err());
        not_found(
            a.exec(
                id,
                &ExecBody {
                    argv: vec!["true".into()],
                    ..Default::default()
                },
            )
            .await
            .unwrap_err(),
        );
        not_found(a.read_file(id, "/etc/hostname").await.err().unwrap());
        not_found(
            a.write_file_bytes(id, "/tmp/x", b"x".to_vec())
                .await
                .unwrap_err(),
        );
        not_found(a.stat(id, "/").await.unwrap_err());
        not_found(a.list_dir(id, "/", 1).await.unwrap_err());
        not_found(a.set_timeout(id, serde_json::json!(60)).await.unwrap_err());
        not_found(a.list_processes(id).await.unwrap_err());
        not_found(a.events(id).await.unwrap_err());
        not_found(a.delete_sandbox(id).await.unwrap_err());
        not_found(a.attach_ws(id, 1, 0, 0).await.err().unwrap());
        // ... and it is untouched.
        assert_eq!(
            b.get_sandbox(id).await.unwrap().state,
            sandlot_client::SandboxState::Running
        );
        // The operator (Unix socket) sees both.
        let all = d
            .client()
            .list_sandboxes(&ListFilter::default())
            .await
            .unwrap();
        assert_eq!(all.len(), 2);
        // No token, a bad token, a revoked token: 401.
        let e = d
            .tcp(None)
            .list_sandboxes(&ListFilter::default())
            .await
            .unwrap_err();
        assert_eq!(
            (e.status().unwrap().as_u16(), e.code()),
            (401, Some("unauthorized"))
        );
        let e = d.tcp(Some("sl_bogus")).health().await.unwrap_err();
        assert_eq!(e.code(), Some("unauthorized"));
    });
    let list = std::process::Command::new(api_support::sandlot())
        .args(["token", "list", "--json", "--data-dir"])
        .arg(d.data_dir())
        .output()
        .unwrap();
    let toks: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let beta_id = toks
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tenant"] == "beta")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        !String::from_utf8_lossy(&list.stdout).contains(&tb),
        "token list must not show secrets"
    );
    let o = std::process::Command::new(api_support::sandlot())
        .args(["token", "revoke", &beta_id, "--data-dir"])
        .arg(d.data_dir())
        .output()
        .unwrap();
    assert!(o.status.success());
    let e = rt().block_on(b.health()).unwrap_err();
    assert_eq!(e.code(), Some("unauthorized"));
}

/// `/metrics` counts every tenant's sandboxes, creates and errors: a tenant's token
/// (and the operator acting as a tenant) is refused, the operator's socket and the
/// scraper's `metrics_listen` address see it all, and the latter serves nothing else.
#[test]
fn a_tenant_cannot_read_the_metrics_of_every_tenant() {
    let mport = api_support::free_port();
    let d = Daemon::start(Some(&format!("metrics_listen = \"127.0.0.1:{mport}\"\n")));
    let ta = d.token("alpha");
    let tb = d.token("beta");
    let b = d.tcp(Some(&tb));
    rt().block_on(async {
        b.create_sandbox(&CreateSandbox::default()).await.unwrap();
        // The attack: alpha reads how many sandboxes beta runs.
        let (st, body) = d.tcp_raw(&ta, "GET", "/metrics", "text/plain", b"");
        assert_eq!(st, 403, "{body}");
        assert!(body.contains("permission_denied"), "{body}");
        assert!(!body.contains("sandlot_sandboxes_live"), "{body}");
        let e = d
            .client()
            .with_tenant(Some("alpha".into()))
            .metrics()
            .await
            .unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(403), "{e}");
        // The operator sees everything.
        let m = d.client().metrics().await.unwrap();
        assert!(m.contains("sandlot_sandboxes_live 1\n"), "{m}");
    });
    let (st, m) = api_support::http(mport, "GET", "/metrics", &[], b"");
    assert_eq!(st, 200);
    assert!(m.contains("sandlot_sandboxes_live 1\n"), "{m}");
    let (st, _) = api_support::http(mport, "GET", "/v1/sandboxes", &[], b"");
    assert_eq!(st, 404, "the metrics address serves nothing but /metrics");
}

/// `sandlot token ...` goes through the daemon named by `SANDLOT_URL`: the token is
/// in the database the daemon reads and works at once; revoked, it is refused.
/// Tokens are the operator's: a tenant (its token, or the operator acting as one)
/// cannot make more.
#[test]
fn tokens_are_managed_through_the_daemon_and_work_at_once() {
    let d = Daemon::start(None);
    let (code, out, err) = d.cli(&["token", "create", "--tenant", "alpha", "--name", "ci"]);
    assert_eq!(code, 0, "{err}");
    let secret = out.trim().to_string();
    assert!(secret.starts_with("sl_"), "{out}");
    let (code, listed, err) = d.cli(&["token", "list", "--json"]);
    assert_eq!(code, 0, "{err}");
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let mine = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "ci")
        .unwrap()
        .clone();
    assert_eq!(mine["tenant"], "alpha");
    assert!(!listed.to_string().contains(&secret), "never the secret");
    let alpha = d.tcp(Some(&secret));
    rt().block_on(async {
        alpha.list_sandboxes(&ListFilter::default()).await.unwrap();
        // The attack: a tenant mints a token for another tenant.
        let e = alpha
            .call_json(
                "POST",
                "/v1/tokens",
                Some(&serde_json::json!({"tenant": "beta"})),
            )
            .await
            .unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(403), "{e}");
        let e = alpha
            .call_json("GET", "/v1/tokens", None)
            .await
            .unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(403), "{e}");
        let as_tenant = d.client().with_tenant(Some("alpha".into()));
        let e = as_tenant
            .call_json(
                "POST",
                "/v1/tokens",
                Some(&serde_json::json!({"tenant": "beta"})),
            )
            .await
            .unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(403), "{e}");
        let e = d
            .client()
            .call_json(
                "POST",
                "/v1/tokens",
                Some(&serde_json::json!({"tenant": "no/such"})),
            )
            .await
            .unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(400), "{e}");
    });
    let id = mine["id"].as_str().unwrap();
    let (code, _, err) = d.cli(&["token", "revoke", id]);
    assert_eq!(code, 0, "{err}");
    rt().block_on(async {
        let e = alpha
            .list_sandboxes(&ListFilter::default())
            .await
            .unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(401), "{e}");
    });
    let (code, _, err) = d.cli(&["token", "revoke", id]);
    assert_ne!(code, 0);
    assert!(err.contains("no active token"), "{err}");
}

/// `--data-dir` (or `SANDLOT_DATA_DIR`) works on a data directory's database
/// directly, but only one a daemon made: a directory no daemon used gets no new,
/// empty database (the running daemon would never read it), and a token written
/// while no daemon runs says when it takes effect.
#[test]
fn a_token_command_never_creates_a_database_no_daemon_uses() {
    let mut d = Daemon::start(None);
    let unused = d.dir.join("unused");
    std::fs::create_dir_all(&unused).unwrap();
    for args in [
        vec!["token", "create", "--tenant", "alpha"],
        vec!["token", "list"],
    ] {
        let mut args = args.clone();
        args.extend(["--data-dir", unused.to_str().unwrap()]);
        let (code, _, err) = d.cli(&args);
        assert_ne!(code, 0, "{args:?}");
        assert!(err.contains("no daemon has used"), "{err}");
        assert!(
            std::fs::read_dir(&unused).unwrap().next().is_none(),
            "nothing created by {args:?}"
        );
    }
    // The daemon's own directory, while it runs: no note, and the token works.
    let data = d.data_dir();
    let o = std::process::Command::new(api_support::sandlot())
        .args(["token", "create", "--tenant", "alpha"])
        .env("SANDLOT_DATA_DIR", &data)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!String::from_utf8_lossy(&o.stderr).contains("no daemon is running"));
    let first = String::from_utf8(o.stdout).unwrap().trim().to_string();
    // With the daemon stopped: written, and the note says when it takes effect.
    d.terminate();
    let (code, out, err) = d.cli(&[
        "token",
        "create",
        "--tenant",
        "beta",
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("no daemon is running"), "{err}");
    let second = out.trim().to_string();
    d.spawn();
    rt().block_on(async {
        for t in [&first, &second] {
            d.tcp(Some(t))
                .list_sandboxes(&ListFilter::default())
                .await
                .unwrap();
        }
    });
}
