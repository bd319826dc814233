//! Operator tokens over TCP: the operator's view of every tenant, short of what
//! stays on the Unix socket (minting and revoking operator tokens, pulls and
//! pushes); `GET /v1/tenants` is the operator's; a tenant's token reaches none
//! of it; a revoked operator token is refused.

mod api_support;

use api_support::{rt, Daemon};
use sandlot_client::{CreateSandbox, ListFilter};

/// `sandlot token create --operator` through the socket: (id, secret).
fn operator_token(d: &Daemon) -> (String, String) {
    let (code, out, err) = d.cli(&[
        "token",
        "create",
        "--operator",
        "--name",
        "console",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["kind"], "operator", "{v}");
    assert!(
        v.get("e2b_api_key").is_none(),
        "no E2B key for an operator token: {v}"
    );
    (
        v["id"].as_str().unwrap().to_string(),
        v["token"].as_str().unwrap().to_string(),
    )
}

fn status(e: &sandlot_client::Error) -> Option<u16> {
    e.status().map(|s| s.as_u16())
}

#[test]
fn an_operator_token_over_tcp_sees_every_tenants_sandboxes_and_the_tenants() {
    let d = Daemon::start(Some("[tenants.gamma]\nmax_sandboxes = 3\n"));
    let a = d.tcp(Some(&d.token("alpha")));
    let b = d.tcp(Some(&d.token("beta")));
    let (_, secret) = operator_token(&d);
    let op = d.tcp(Some(&secret));
    rt().block_on(async {
        let sa = a.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let sb = b.create_sandbox(&CreateSandbox::default()).await.unwrap();
        assert_eq!(op.health().await.unwrap().tenant, "*");
        let mut seen: Vec<String> = op
            .list_sandboxes(&ListFilter::default())
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
        seen.sort();
        let mut both = vec![sa.id.clone(), sb.id.clone()];
        both.sort();
        assert_eq!(
            seen, both,
            "the operator token sees every tenant's sandboxes"
        );
        op.get_sandbox(&sb.id).await.unwrap();

        let tenants = op.call_json("GET", "/v1/tenants", None).await.unwrap();
        let by_name = |n: &str| {
            tenants["tenants"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["name"] == n)
                .unwrap_or_else(|| panic!("{n} missing from {tenants}"))
                .clone()
        };
        let alpha = by_name("alpha");
        assert_eq!(alpha["usage"]["sandboxes_live"], 1, "{alpha}");
        assert_eq!(alpha["usage"]["active_tokens"], 1, "{alpha}");
        assert_eq!(alpha["configured"], false, "{alpha}");
        let gamma = by_name("gamma");
        assert_eq!(gamma["configured"], true, "{gamma}");
        assert_eq!(gamma["quota"]["max_sandboxes"], 3, "{gamma}");
        assert_eq!(gamma["usage"]["sandboxes_live"], 0, "{gamma}");
        assert!(
            !tenants.to_string().contains("\"*\""),
            "the operator token names no tenant: {tenants}"
        );

        // The operator token acting as a tenant sees that tenant only.
        let as_alpha = d.tcp(Some(&secret)).with_tenant(Some("alpha".into()));
        let only: Vec<String> = as_alpha
            .list_sandboxes(&ListFilter::default())
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(only, vec![sa.id.clone()]);
        let e = as_alpha.get_sandbox(&sb.id).await.unwrap_err();
        assert_eq!(status(&e), Some(404), "{e}");
        let e = as_alpha
            .call_json("GET", "/v1/tenants", None)
            .await
            .unwrap_err();
        assert_eq!(status(&e), Some(403), "{e}");

        // The attack: a tenant's token lists the tenants, or lists and mints tokens.
        let e = a.call_json("GET", "/v1/tenants", None).await.unwrap_err();
        assert_eq!(
            (status(&e), e.code()),
            (Some(403), Some("forbidden")),
            "{e}"
        );
        for body in [
            serde_json::json!({"tenant": "alpha"}),
            serde_json::json!({"operator": true}),
        ] {
            let e = a
                .call_json("POST", "/v1/tokens", Some(&body))
                .await
                .unwrap_err();
            assert_eq!(status(&e), Some(403), "{body}: {e}");
        }
        // A tenant header from a tenant's token changes nothing.
        let e = a
            .with_tenant(Some("beta".into()))
            .get_sandbox(&sb.id)
            .await
            .unwrap_err();
        assert_eq!(status(&e), Some(404), "{e}");

        op.delete_sandbox(&sa.id).await.unwrap();
        op.delete_sandbox(&sb.id).await.unwrap();
    });
}

#[test]
fn an_operator_token_manages_tenant_tokens_but_never_operator_tokens() {
    let d = Daemon::start(None);
    let (op_id, secret) = operator_token(&d);
    let (other_id, _) = operator_token(&d);
    let op = d.tcp(Some(&secret));
    rt().block_on(async {
        // A tenant token, made and revoked over TCP by the operator token.
        let made = op
            .call_json(
                "POST",
                "/v1/tokens",
                Some(&serde_json::json!({"tenant": "alpha", "name": "from the console"})),
            )
            .await
            .unwrap();
        assert_eq!(made["kind"], "tenant", "{made}");
        let alpha = d.tcp(Some(made["token"].as_str().unwrap()));
        assert_eq!(alpha.health().await.unwrap().tenant, "alpha");
        let listed = op.call_json("GET", "/v1/tokens", None).await.unwrap();
        let kinds: Vec<(String, String)> = listed["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["id"].as_str().unwrap().into(),
                    t["kind"].as_str().unwrap().into(),
                )
            })
            .collect();
        assert!(
            kinds.contains(&(op_id.clone(), "operator".into())),
            "{listed}"
        );
        assert!(
            kinds.contains(&(made["id"].as_str().unwrap().into(), "tenant".into())),
            "{listed}"
        );
        let id = made["id"].as_str().unwrap();
        op.call_json("DELETE", &format!("/v1/tokens/{id}"), None)
            .await
            .unwrap();
        let e = alpha.health().await.unwrap_err();
        assert_eq!(status(&e), Some(401), "{e}");

        // The attack: a stolen operator token makes itself a successor, or
        // revokes the operator's other tokens.
        let e = op
            .call_json(
                "POST",
                "/v1/tokens",
                Some(&serde_json::json!({"operator": true})),
            )
            .await
            .unwrap_err();
        assert_eq!(
            (status(&e), e.code()),
            (Some(403), Some("permission_denied")),
            "{e}"
        );
        let e = op
            .call_json("DELETE", &format!("/v1/tokens/{other_id}"), None)
            .await
            .unwrap_err();
        assert_eq!(status(&e), Some(403), "{e}");
        // Nor has the daemon connect where it names.
        let e = op
            .call_json(
                "POST",
                "/v1/images/pull",
                Some(&serde_json::json!({"reference": "127.0.0.1:9/x:y"})),
            )
            .await
            .unwrap_err();
        assert_eq!(
            (status(&e), e.code()),
            (Some(403), Some("forbidden")),
            "{e}"
        );
        // Still only the two operator tokens, both live.
        let listed = d
            .client()
            .call_json("GET", "/v1/tokens", None)
            .await
            .unwrap();
        let live_ops = listed["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["kind"] == "operator" && t["revoked_at"].is_null())
            .count();
        assert_eq!(live_ops, 2, "{listed}");
    });
    // The socket revokes it; from then on it is refused.
    let (code, _, err) = d.cli(&["token", "revoke", &op_id]);
    assert_eq!(code, 0, "{err}");
    rt().block_on(async {
        let e = op.list_sandboxes(&ListFilter::default()).await.unwrap_err();
        assert_eq!(status(&e), Some(401), "{e}");
        let e = op.call_json("GET", "/v1/tenants", None).await.unwrap_err();
        assert_eq!(status(&e), Some(401), "{e}");
    });
    let (code, listed, err) = d.cli(&["token", "list"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        listed
            .lines()
            .any(|l| l.contains(&op_id) && l.contains("operator") && l.contains("revoked")),
        "{listed}"
    );
}

/// The front doors made for tenants take tenants' tokens only: `/mcp` (its tools
/// and sessions are an agent's, per tenant) and E2B's API key.
#[test]
fn mcp_and_the_e2b_front_door_refuse_an_operator_token() {
    let e2b = api_support::free_port();
    let d = Daemon::start(Some(&format!("[e2b]\nlisten = \"127.0.0.1:{e2b}\"\n")));
    let (_, secret) = operator_token(&d);
    let (st, body) = api_support::http(
        d.port,
        "GET",
        "/mcp",
        &[("Authorization", &format!("Bearer {secret}"))],
        b"",
    );
    assert_eq!(st, 403, "{body}");
    assert!(body.contains("not an operator token"), "{body}");
    // E2B's list of sandboxes: a tenant's key works, the operator token does not.
    let tenant = d.token("acme");
    for (key, want) in [(tenant.as_str(), 200), (secret.as_str(), 401)] {
        let (st, body) = api_support::http(e2b, "GET", "/sandboxes", &[("X-API-Key", key)], b"");
        assert_eq!(st, want, "{body}");
    }
    let e2b_shaped = format!("e2b_{}", secret.trim_start_matches("sl_"));
    let (st, body) =
        api_support::http(e2b, "GET", "/sandboxes", &[("X-API-Key", &e2b_shaped)], b"");
    assert_eq!(st, 401, "{body}");
}

/// `--data-dir` writes the daemon's database directly (root on the host, as the
/// socket is): an operator token made there is the operator's at once, and is
/// listed as one.
#[test]
fn an_operator_token_written_with_data_dir_is_the_operators() {
    let d = Daemon::start(None);
    let o = std::process::Command::new(api_support::sandlot())
        .args(["token", "create", "--operator", "--json"])
        .env("SANDLOT_DATA_DIR", d.data_dir())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["kind"].as_str(), v["tenant"].as_str()),
        (Some("operator"), Some("*")),
        "{v}"
    );
    assert!(v.get("e2b_api_key").is_none(), "{v}");
    let op = d.tcp(v["token"].as_str());
    rt().block_on(async {
        assert_eq!(op.health().await.unwrap().tenant, "*");
        op.call_json("GET", "/v1/tenants", None).await.unwrap();
    });
}

/// Every operator route, as a tenant's token over TCP, an operator token over
/// TCP and the Unix socket each meet it: the operator's routes admit the
/// operator token and the socket; the socket's (the shared image namespace,
/// pulls and pushes, operator tokens) admit the socket only. The requests are
/// ones the socket answers without lasting effect (no such image, bad body).
#[test]
fn each_operator_route_admits_exactly_the_credentials_its_rule_names() {
    let d = Daemon::start(None);
    let tenant = d.token("alpha");
    let (_, op) = operator_token(&d);
    // (method, path, body, tenant token, operator token, socket)
    let table: &[(&str, &str, &str, u16, u16, u16)] = &[
        ("GET", "/v1/tenants", "", 403, 200, 200),
        ("GET", "/metrics", "", 403, 200, 200),
        ("GET", "/v1/tokens", "", 403, 200, 200),
        ("POST", "/v1/tokens", r#"{"tenant":"alpha"}"#, 403, 201, 201),
        ("POST", "/v1/tokens", r#"{"operator":true}"#, 403, 403, 201),
        ("DELETE", "/v1/tokens/tok_nosuch", "", 403, 404, 404),
        ("DELETE", "/v1/images/nosuch:1", "", 403, 403, 404),
        ("POST", "/v1/images/prune", "", 403, 403, 200),
        ("POST", "/v1/images/import", "", 403, 403, 400),
        ("POST", "/v1/images/pull", "{}", 403, 403, 400),
        ("POST", "/v1/images/nosuch:1/push", "{}", 403, 403, 400),
        ("POST", "/v1/images/build?tag=shared:1", "", 400, 403, 400),
        (
            "POST",
            "/v1/sandboxes/sb_nosuch/snapshot",
            r#"{"tag":"shared:1"}"#,
            404,
            403,
            404,
        ),
    ];
    let mut wrong = Vec::new();
    for &(method, path, body, as_tenant, as_operator_token, as_socket) in table {
        let ct = if path.contains("import") || path.contains("build") {
            "application/x-tar"
        } else {
            "application/json"
        };
        let got = (
            d.tcp_raw(&tenant, method, path, ct, body.as_bytes()).0,
            d.tcp_raw(&op, method, path, ct, body.as_bytes()).0,
            d.raw(method, path, body).0,
        );
        if got != (as_tenant, as_operator_token, as_socket) {
            wrong.push(format!(
                "{method} {path}: got {got:?}, want {:?}",
                (as_tenant, as_operator_token, as_socket)
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The refusals name the rule, never "operator means the Unix socket".
    let (_, body) = d.tcp_raw(&op, "POST", "/v1/images/import", "application/x-tar", b"");
    assert!(body.contains("Unix socket only"), "{body}");
    assert!(body.contains("forbidden"), "{body}");
    let (_, body) = d.tcp_raw(&tenant, "GET", "/v1/tenants", "application/json", b"");
    assert!(body.contains("or an operator token"), "{body}");
}

/// Tokens record who minted them, and revoking an operator token revokes every
/// token it minted: a leaked operator token leaves no tenant token behind.
#[test]
fn revoking_an_operator_token_revokes_the_tokens_it_minted() {
    let d = Daemon::start(None);
    let (op_id, secret) = operator_token(&d);
    let op = d.tcp(Some(&secret));
    rt().block_on(async {
        let made = op
            .call_json(
                "POST",
                "/v1/tokens",
                Some(&serde_json::json!({"tenant": "alpha"})),
            )
            .await
            .unwrap();
        assert_eq!(made["created_by"], op_id.as_str(), "{made}");
        let by_socket = d
            .client()
            .call_json(
                "POST",
                "/v1/tokens",
                Some(&serde_json::json!({"tenant": "alpha"})),
            )
            .await
            .unwrap();
        assert_eq!(by_socket["created_by"], "socket", "{by_socket}");
        let minted = d.tcp(Some(made["token"].as_str().unwrap()));
        let kept = d.tcp(Some(by_socket["token"].as_str().unwrap()));
        assert_eq!(minted.health().await.unwrap().tenant, "alpha");

        d.client()
            .call_json("DELETE", &format!("/v1/tokens/{op_id}"), None)
            .await
            .unwrap();
        let e = minted.health().await.unwrap_err();
        assert_eq!(status(&e), Some(401), "{e}");
        assert_eq!(kept.health().await.unwrap().tenant, "alpha");
        let listed = d
            .client()
            .call_json("GET", "/v1/tokens", None)
            .await
            .unwrap();
        let row = listed["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == made["id"])
            .cloned()
            .unwrap();
        assert_eq!(row["created_by"], op_id.as_str(), "{row}");
        assert!(!row["revoked_at"].is_null(), "{row}");
    });
}

/// An operator token's builds meet the network ceiling like a tenant's: only
/// the socket's own builds are above it.
#[test]
fn an_operator_token_build_is_held_to_the_network_ceiling() {
    let d = Daemon::start(Some("[network]\nceiling = \"allow\"\n"));
    let (_, op) = operator_token(&d);
    let ctx = api_support::vfs::tar_of(&[("Dockerfile", "FROM scratch\nRUN true\n")]);
    let (code, body) = d.tcp_raw(
        &op,
        "POST",
        "/v1/images/build?network=true",
        "application/x-tar",
        &ctx,
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("above the operator's ceiling"), "{body}");
}
