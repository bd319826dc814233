//! Privileged: E2B's network options (`allow_internet_access`, `network.allowOut`
//! and `denyOut`, `update_network`) through the E2B front door, proven against
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
    let v = serde_json::from_str(body).unwrap_or(Value::Null);
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
    let d = NetDaemon::start(
        world,
        &format!("[e2b]\nlisten = \"{HOST_ADDR}:{E2B_PORT}\"\n"),
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

        // What Sandlot's allow-lists cannot say is a 400 naming the field.
        let (st, v) = e2b(
            &world,
            &key,
            "POST",
            "/v2/sandboxes",
            Some(json!({"network": {"denyOut": ["10.99.1.20"]}})),
        );
        assert_eq!(st, 400, "{v}");
        assert!(v["message"].as_str().unwrap().contains("network.denyOut"), "{v}");
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
