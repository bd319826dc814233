//! Privileged: E2B's network options (`allow_internet_access`, `network.allowOut`
//! and `denyOut`, `allowPublicTraffic`, `update_network`) through the E2B front
//! door, proven against
//! the simulated internet of `net_world/` (no traffic leaves this test's network
//! namespaces).
//!
//! Run: `cargo test -p sandlot --no-default-features --test net_e2b` (root).

mod net_world;

use std::process::Command;

use net_world::{rt, NetDaemon, World, HOST_ADDR};
use sandlot_client::Client;
use serde_json::{json, Value};

const E2B_PORT: u16 = 7991;

/// A call to the E2B listener, made from inside the daemon's namespace.
fn e2b(world: &World, key: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &world.host_ns, "curl", "-sS", "-m", "60"])
        .args(["-o", "-", "-w", "\n%{http_code}", "-X", method])
        .args(["-H", &format!("X-API-Key: {key}")]);
    if let Some(b) = body {
        cmd.args(["-H", "Content-Type: application/json", "--data-binary"])
            .arg(b.to_string());
    }
    let o = cmd
        .arg(format!("http://{HOST_ADDR}:{E2B_PORT}{path}"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = out.rsplit_once('\n').expect("curl wrote a status");
    // Not JSON (curl could not connect, an empty 204): what curl said, for messages.
    let v = serde_json::from_str(body)
        .unwrap_or_else(|_| Value::String(format!("{body}{}", String::from_utf8_lossy(&o.stderr))));
    (code.trim().parse().unwrap_or(0), v)
}

/// `curl` of `url` inside the sandbox: its exit code and what it printed.
async fn curl(c: &Client, id: &str, url: &str) -> (i32, String) {
    let o = c
        .run(id, &["/bin/sh", "-c", &format!("curl -sS -m 6 {url}")])
        .await
        .unwrap();
    (
        o.exit.code.unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

fn start(world: &World) -> (NetDaemon, String) {
    start_with(world, "")
}

fn start_with(world: &World, extra: &str) -> (NetDaemon, String) {
    let d = NetDaemon::start(
        world,
        &format!("[e2b]\nlisten = \"{HOST_ADDR}:{E2B_PORT}\"\ndomain = \"sandlot.test\"\n{extra}"),
    );
    let o = Command::new(env!("CARGO_BIN_EXE_sandlot"))
        .args(["token", "create", "--tenant", "acme", "--data-dir"])
        .arg(d.dir.join("data"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    (d, String::from_utf8(o.stdout).unwrap().trim().to_string())
}

fn create(world: &World, key: &str, body: Value) -> String {
    let (st, v) = e2b(world, key, "POST", "/v2/sandboxes", Some(body));
    assert_eq!(st, 201, "{v}");
    v["sandboxID"].as_str().unwrap().to_string()
}

/// Deny-all with an allow list reaches exactly the listed name and address;
/// `allow_internet_access=false` reaches nothing; `true` reaches the world.
/// Updating a running sandbox's rules holds at once, and get_info tells them.
#[test]
fn e2b_network_options_become_egress_policies() {
    let world = World::new();
    let (d, key) = start(&world);
    let c = d.client();
    rt().block_on(async {
        let listed = create(
            &world,
            &key,
            json!({"templateID": "base", "network": {"denyOut": ["0.0.0.0/0"], "allowOut": ["allowed.test", "10.99.1.30"]}}),
        );
        let (code, out) = curl(&c, &listed, "http://allowed.test/").await;
        assert_eq!(code, 0, "allowed by name: {out}");
        let (code, out) = curl(&c, &listed, "http://10.99.1.30/").await;
        assert_eq!(code, 0, "allowed by address: {out}");
        let (code, _) = curl(&c, &listed, "http://denied.test/").await;
        assert_ne!(code, 0, "a name not listed is denied");
        let (code, _) = curl(&c, &listed, "http://10.99.1.20/").await;
        assert_ne!(code, 0, "an address not listed is denied");
        let (st, info) = e2b(&world, &key, "GET", &format!("/sandboxes/{listed}"), None);
        assert_eq!(st, 200, "{info}");
        assert_eq!(info["allowInternetAccess"], false);
        assert_eq!(
            info["network"],
            json!({"allowOut": ["allowed.test", "10.99.1.30"], "denyOut": ["0.0.0.0/0"]})
        );

        let closed = create(&world, &key, json!({"allow_internet_access": false}));
        let (code, _) = curl(&c, &closed, "http://allowed.test/").await;
        assert_ne!(code, 0, "allow_internet_access=false reaches nothing");

        let open = create(&world, &key, json!({"allow_internet_access": true}));
        let (code, out) = curl(&c, &open, "http://denied.test/").await;
        assert_eq!(code, 0, "allow_internet_access=true reaches the world: {out}");

        // update_network: the open sandbox is restricted to one name at once...
        let (st, v) = e2b(
            &world,
            &key,
            "PUT",
            &format!("/sandboxes/{open}/network"),
            Some(json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["allowed.test"]})),
        );
        assert_eq!(st, 204, "{v}");
        let (code, _) = curl(&c, &open, "http://denied.test/").await;
        assert_ne!(code, 0, "denied after the update");
        let (code, out) = curl(&c, &open, "http://allowed.test/").await;
        assert_eq!(code, 0, "still allowed after the update: {out}");
        // ...and an update without rules clears them.
        let (st, v) = e2b(&world, &key, "PUT", &format!("/sandboxes/{open}/network"), Some(json!({})));
        assert_eq!(st, 204, "{v}");
        let (code, out) = curl(&c, &open, "http://denied.test/").await;
        assert_eq!(code, 0, "open again: {out}");

        // A bad entry is a 400 naming it.
        let (st, v) = e2b(
            &world,
            &key,
            "POST",
            "/v2/sandboxes",
            Some(json!({"network": {"denyOut": ["10.99.1.20", "10.99.1.21/24"]}})),
        );
        assert_eq!(st, 400, "{v}");
        assert!(v["message"].as_str().unwrap().contains("network.denyOut[1]"), "{v}");
        let (st, v) = e2b(
            &world,
            &key,
            "PUT",
            &format!("/sandboxes/{open}/network"),
            Some(json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["*.com"]})),
        );
        assert_eq!(st, 400, "{v}");
        assert!(v["message"].as_str().unwrap().contains("network.allowOut[0]"), "{v}");

        // A sandbox created without a network (the operator's default is loopback
        // only) cannot be given rules later: a 409 saying why.
        let none = create(&world, &key, json!({}));
        let (st, v) = e2b(&world, &key, "PUT", &format!("/sandboxes/{none}/network"), Some(json!({})));
        assert_eq!(st, 409, "{v}");
        let (st, info) = e2b(&world, &key, "GET", &format!("/sandboxes/{none}"), None);
        assert_eq!(st, 200, "{info}");
        assert_eq!(info["allowInternetAccess"], false);

        for id in [listed, closed, open, none] {
            let (st, v) = e2b(&world, &key, "DELETE", &format!("/sandboxes/{id}"), None);
            assert_eq!(st, 204, "{v}");
        }
    });
    drop(c);
    drop(d);
}

/// A GET of `path` on the E2B listener with `Host: host` and no credential: the
/// status and the body.
fn get_by_host(world: &World, host: &str, path: &str) -> (u16, String) {
    let o = Command::new("ip")
        .args(["netns", "exec", &world.host_ns, "curl", "-sS", "-m", "30"])
        .args([
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            "-H",
            &format!("Host: {host}"),
        ])
        .arg(format!("http://{HOST_ADDR}:{E2B_PORT}{path}"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = out.rsplit_once('\n').expect("curl wrote a status");
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// A deny list with the rest open: a denied CIDR and a denied name are refused
/// (by DNS, and by the HTTP Host when the sandbox resolves the name itself) while
/// other destinations are reached; an `allowOut` name wins over a denied wildcard
/// and a denied CIDR; a literal address of a denied name is not stopped (a name
/// deny stops names). Updates take deny lists, and get_info tells them.
#[test]
fn e2b_deny_list_refuses_what_it_names_and_leaves_the_rest_open() {
    let world = World::new();
    let (d, key) = start(&world);
    let c = d.client();
    rt().block_on(async {
        let id = create(
            &world,
            &key,
            json!({"network": {"denyOut": ["10.99.1.30/31", "denied.test", "*.wild.test"],
                               "allowOut": ["b.a.wild.test"], "allowPublicTraffic": true}}),
        );
        let (code, out) = curl(&c, &id, "http://allowed.test/").await;
        assert_eq!(code, 0, "not denied, reached: {out}");
        let (code, out) = curl(&c, &id, "http://10.99.1.30/").await;
        assert_ne!(code, 0, "a denied CIDR: {out}");
        let (code, out) = curl(&c, &id, "http://denied.test/").await;
        assert_ne!(code, 0, "a denied name does not resolve: {out}");
        assert!(out.contains("resolve"), "refused at DNS: {out}");
        let (code, out) = curl(
            &c,
            &id,
            "--resolve denied.test:80:10.99.1.20 http://denied.test/",
        )
        .await;
        assert_ne!(
            code, 0,
            "a denied name resolved by the sandbox itself: {out}"
        );
        let (code, out) = curl(&c, &id, "http://10.99.1.20/").await;
        assert_eq!(code, 0, "the literal address of a denied name: {out}");
        let (code, out) = curl(&c, &id, "http://a.wild.test/").await;
        assert_ne!(code, 0, "below a denied wildcard: {out}");
        let (code, out) = curl(&c, &id, "http://b.a.wild.test/").await;
        assert_eq!(code, 0, "allowOut wins over denyOut: {out}");
        assert!(out.contains("server=b.a.wild.test"), "{out}");
        let (code, log, err) = d.cli(&["net", "log", &id, "--denied"]);
        assert_eq!(code, 0, "{err}");
        assert!(log.contains("a deny rule names 10.99.1.30:80"), "{log}");
        assert!(log.contains("a deny rule names denied.test:80"), "{log}");
        let (st, info) = e2b(&world, &key, "GET", &format!("/sandboxes/{id}"), None);
        assert_eq!(st, 200, "{info}");
        assert_eq!(info["allowInternetAccess"], true);
        assert_eq!(
            info["network"],
            json!({"allowOut": ["b.a.wild.test"],
                   "denyOut": ["10.99.1.30/31", "denied.test", "*.wild.test"]})
        );

        // An update takes a deny list: now allowed.test is refused, denied.test reached.
        let (st, v) = e2b(
            &world,
            &key,
            "PUT",
            &format!("/sandboxes/{id}/network"),
            Some(json!({"denyOut": ["allowed.test"]})),
        );
        assert_eq!(st, 204, "{v}");
        let (code, _) = curl(&c, &id, "http://allowed.test/").await;
        assert_ne!(code, 0, "denied after the update");
        let (code, out) = curl(&c, &id, "http://denied.test/").await;
        assert_eq!(code, 0, "no longer denied: {out}");

        let (st, v) = e2b(&world, &key, "DELETE", &format!("/sandboxes/{id}"), None);
        assert_eq!(st, 204, "{v}");
    });
    drop(c);
    drop(d);
}

/// Starts an HTTP server on port 8000 in the sandbox and waits until the port
/// proxy (with the key) reaches it.
async fn serve_8000(world: &World, key: &str, c: &Client, id: &str) {
    c.run(
        id,
        &[
            "/bin/sh",
            "-c",
            "mkdir -p /tmp/www && echo served > /tmp/www/index.html && cd /tmp/www && \
             (setsid python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &)",
        ],
    )
    .await
    .unwrap();
    for _ in 0..100 {
        let o = Command::new("ip")
            .args([
                "netns",
                "exec",
                &world.host_ns,
                "curl",
                "-s",
                "-o",
                "/dev/null",
            ])
            .args([
                "-w",
                "%{http_code}",
                "-H",
                &format!("Host: 8000-{id}.sandlot.test"),
            ])
            .args(["-H", &format!("X-API-Key: {key}")])
            .arg(format!("http://{HOST_ADDR}:{E2B_PORT}/index.html"))
            .output()
            .unwrap();
        if o.stdout == b"200" {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the server in sandbox {id} never answered");
}

/// `allowPublicTraffic: true`: a port answers its host-name URL without a
/// credential; envd (49983) and the code interpreter (49999) do not; a sandbox
/// without it still needs the token or the key.
#[test]
fn e2b_public_traffic_opens_ports_but_never_envd() {
    let world = World::new();
    let (d, key) = start(&world);
    let c = d.client();
    rt().block_on(async {
        let public = create(
            &world,
            &key,
            json!({"network": {"allowPublicTraffic": true}}),
        );
        let private = create(
            &world,
            &key,
            json!({"network": {"allowPublicTraffic": false}}),
        );
        for id in [&public, &private] {
            serve_8000(&world, &key, &c, id).await;
        }
        let (st, body) = get_by_host(
            &world,
            &format!("8000-{public}.sandlot.test"),
            "/index.html",
        );
        assert_eq!(
            (st, body.as_str()),
            (200, "served\n"),
            "public, no credential"
        );
        let (st, body) = get_by_host(
            &world,
            &format!("8000-{private}.sandlot.test"),
            "/index.html",
        );
        assert_eq!(st, 401, "not public: {body}");
        // Envd by host name still wants the sandbox's access token.
        let (st, body) = get_by_host(&world, &format!("49983-{public}.sandlot.test"), "/health");
        assert_eq!(st, 401, "envd is never public: {body}");
        // 49999 is the interpreter's (this sandbox runs none): never the port proxy.
        let (st, body) = get_by_host(&world, &format!("49999-{public}.sandlot.test"), "/");
        assert_ne!(st, 200, "49999 is never public: {body}");
        assert!(!body.contains("served"), "{body}");
        for id in [public, private] {
            let (st, v) = e2b(&world, &key, "DELETE", &format!("/sandboxes/{id}"), None);
            assert_eq!(st, 204, "{v}");
        }
    });
    drop(c);
    drop(d);
}

/// An operator who forbids public ports (`[ports] allow_public = false`): a create
/// asking for them is a 400 naming the field, natively and through E2B.
#[test]
fn public_ports_forbidden_by_the_operator_are_refused_at_create() {
    let world = World::new();
    let (d, key) = start_with(&world, "[ports]\nallow_public = false\n");
    let (st, v) = e2b(
        &world,
        &key,
        "POST",
        "/v2/sandboxes",
        Some(json!({"network": {"allowPublicTraffic": true}})),
    );
    assert_eq!(st, 400, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("ports.public"),
        "{v}"
    );
    let c = d.client();
    let native = rt().block_on(async {
        let Value::Object(spec) = json!({"ports": {"public": true}}) else {
            unreachable!()
        };
        c.create_sandbox(&sandlot_client::CreateSandbox {
            spec,
            ..Default::default()
        })
        .await
    });
    let e = native.expect_err("a public sandbox against the operator's word");
    assert_eq!(e.status().map(|s| s.as_u16()), Some(400), "{e}");
    assert!(e.to_string().contains("ports.public"), "{e}");
    drop(c);
    let (st, v) = e2b(&world, &key, "GET", "/v2/sandboxes", None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v, json!([]), "nothing was created");
    drop(d);
}
