//! Privileged: inbound traffic to sandboxes with a network slot
//! (`allow` and `open`), with the daemon running in the simulated internet of
//! `net_world/` (its own network namespaces; no traffic leaves them). The proxy
//! reaches the sandbox's loopback inside its namespace, so the egress policy
//! neither blocks nor logs it.
//!
//! Run: `cargo test -p sandlot --no-default-features --test net_ingress` (root).

mod net_world;
mod ports_app;

use std::io::{Read, Write};
use std::os::fd::AsFd;

use net_world::{rt, NetDaemon, World};
use ports_app::{crc32, read_head, start_app};
use sandlot_client::{Client, CreateSandbox, PublishPort};
use serde_json::{json, Value};

async fn create(c: &Client, network: Value) -> String {
    let mut spec = serde_json::Map::new();
    spec.insert("network".into(), network);
    c.create_sandbox(&CreateSandbox {
        spec,
        ..Default::default()
    })
    .await
    .unwrap()
    .id
}

/// A raw HTTP GET to `addr` from inside the world's host namespace (where the
/// daemon and its published ports are).
fn get_in_ns(ns: &str, addr: &str, path: &str) -> (u16, Vec<u8>) {
    let f = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
    let addr = addr.to_string();
    let path = path.to_string();
    std::thread::spawn(move || {
        rustix::thread::move_into_link_name_space(
            f.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .unwrap();
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let (status, _, mut rest) = read_head(&mut s);
        s.read_to_end(&mut rest).unwrap();
        (status, rest)
    })
    .join()
    .unwrap()
}

#[test]
fn proxy_and_published_ports_work_in_modes_allow_and_open() {
    let world = World::new();
    let mut d = NetDaemon::start(&world, "");
    let rt = rt();
    let c = d.client();
    rt.block_on(async {
        let allow = create(
            &c,
            json!({"mode": "allow", "allow": [{"domain": "allowed.test"}]}),
        )
        .await;
        let open = create(&c, json!({"mode": "open"})).await;
        start_app(&c, &allow, "127.0.0.1", 8000).await;
        start_app(&c, &open, "0.0.0.0", 8080).await;
        for (id, port) in [(&allow, 8000u16), (&open, 8080)] {
            let r = c
                .proxy_request(id, port, "GET", "/hello?a=b", vec![])
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{id}");
            let j: Value = serde_json::from_slice(r.body()).unwrap();
            assert_eq!(j["path"], "/hello?a=b");
            let body: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
            let r = c
                .proxy_request(id, port, "POST", "/up", body.clone())
                .await
                .unwrap();
            let j: Value = serde_json::from_slice(r.body()).unwrap();
            assert_eq!(
                (j["len"].clone(), j["crc32"].clone()),
                (json!(body.len()), json!(crc32(&body)))
            );
            let e = c
                .proxy_request(id, port + 1, "GET", "/", vec![])
                .await
                .unwrap();
            assert_eq!(e.status(), 502);
        }
        // The proxy is not egress: nothing of it is in the audit log.
        let log = c.network_log(&allow, None, None).await.unwrap();
        assert!(
            log.entries.iter().all(|e| e.port != Some(8000)),
            "{:?}",
            log.entries
        );
        // A published port of the allow sandbox, on the loopback of the daemon's
        // (the world's host) namespace.
        let p = c
            .publish_port(
                &allow,
                &PublishPort {
                    port: 8000,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let host_ns = world.host_ns.clone();
        let (status, body) =
            tokio::task::spawn_blocking(move || get_in_ns(&host_ns, &p.address, "/pub"))
                .await
                .unwrap();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        assert!(String::from_utf8_lossy(&body).contains("\"/pub\""));
    });
    d.stop(&rt);
}
