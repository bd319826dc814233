//! Benchmark (ignored by default): create latency through the API with
//! `network.mode = "none"` and with an `allow` policy (a pre-built slot claimed from
//! the pool), interleaved in the same run against one daemon in the test world.
//!
//! `cargo test -p sandlot --no-default-features --release --test net_bench -- --ignored --nocapture`
//! (root). Prints medians, p90 and the ratio; figures in docs/networking.md.

mod net_world;

use std::time::{Duration, Instant};

use net_world::{rt, NetDaemon, World};
use sandlot_client::CreateSandbox;
use serde_json::json;

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn create_latency_allow_vs_none() {
    let n: usize = std::env::var("NET_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let world = World::new();
    let mut d = NetDaemon::start(&world, "pool_size = 4\n");
    let rt = rt();
    let c = d.client();
    let modes = [
        ("none", json!({"mode": "none"})),
        (
            "allow",
            json!({"mode": "allow", "allow": [{"domain": "allowed.test"}]}),
        ),
    ];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(), Vec::new()];
    rt.block_on(async {
        // Warm up both paths (and let the pool fill).
        for (_, net) in &modes {
            let mut spec = serde_json::Map::new();
            spec.insert("network".into(), net.clone());
            let sb = c
                .create_sandbox(&CreateSandbox { spec, ..Default::default() })
                .await
                .unwrap();
            c.delete_sandbox(&sb.id).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        for _ in 0..n {
            for (i, (_, net)) in modes.iter().enumerate() {
                let mut spec = serde_json::Map::new();
                spec.insert("network".into(), net.clone());
                let t = Instant::now();
                let sb = c
                    .create_sandbox(&CreateSandbox { spec, ..Default::default() })
                    .await
                    .unwrap();
                times[i].push(t.elapsed().as_secs_f64() * 1e3);
                c.delete_sandbox(&sb.id).await.unwrap();
            }
        }
        // One allow sandbox does real work: DNS + HTTP through the proxy.
        let mut spec = serde_json::Map::new();
        spec.insert("network".into(), modes[1].1.clone());
        let sb = c
            .create_sandbox(&CreateSandbox { spec, ..Default::default() })
            .await
            .unwrap();
        let t = Instant::now();
        let o = c
            .run(&sb.id, &["curl", "-sS", "-o", "/dev/null", "http://allowed.test/"])
            .await
            .unwrap();
        assert_eq!(o.exit.code, Some(0));
        println!(
            "first HTTP request through resolver and proxy (curl in the sandbox, incl. exec): {:.1} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
    });
    let mut none = times[0].clone();
    let mut allow = times[1].clone();
    let (mn, ma) = (pct(&mut none, 0.5), pct(&mut allow, 0.5));
    println!(
        "create latency over {n} interleaved pairs (API, create returns when the agent listens):"
    );
    println!(
        "  none : median {mn:.1} ms, p90 {:.1} ms",
        pct(&mut none, 0.9)
    );
    println!(
        "  allow: median {ma:.1} ms, p90 {:.1} ms",
        pct(&mut allow, 0.9)
    );
    println!("  allow/none median ratio: {:.2}", ma / mn);
    d.stop(&rt);
}

/// Benchmark (ignored): HTTP requests through the proxy from an `open` sandbox,
/// without deny rules and with deny name rules (every connection's `Host` is then
/// read before the proxy connects). 100 sequential `curl`s each, timed inside the
/// sandbox; prints the mean per request.
#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn request_latency_open_with_and_without_deny_names() {
    let world = World::new();
    let mut d = NetDaemon::start(&world, "");
    let rt = rt();
    let c = d.client();
    rt.block_on(async {
        for (label, net) in [
            ("open", json!({"mode": "open"})),
            (
                "open + deny names",
                json!({"mode": "open", "deny": [{"domain": "denied.test"}, {"domain": "*.wild.test"}]}),
            ),
        ] {
            let mut spec = serde_json::Map::new();
            spec.insert("network".into(), net);
            let sb = c
                .create_sandbox(&CreateSandbox { spec, ..Default::default() })
                .await
                .unwrap();
            let script = "curl -s -o /dev/null http://allowed.test/; s=$(date +%s%N); \
                          for i in $(seq 100); do curl -s -o /dev/null http://allowed.test/ || exit 1; done; \
                          echo $(( ($(date +%s%N) - s) / 100000 ))";
            let o = c.run(&sb.id, &["/bin/sh", "-c", script]).await.unwrap();
            assert_eq!(o.exit.code, Some(0), "{}", String::from_utf8_lossy(&o.stderr));
            let us: f64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
            println!("{label}: {:.2} ms per request (100 sequential curls)", us / 1000.0);
            c.delete_sandbox(&sb.id).await.unwrap();
        }
    });
    drop(c);
    d.stop(&rt);
}
