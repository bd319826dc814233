//! Benchmark (ignored by default): round trip of one small HTTP request (a new
//! connection each, `Connection: close`) to the same Python app, interleaved in one
//! run: directly on the host's loopback (the peer), through a published TCP port,
//! and through the daemon's authenticated HTTP proxy (token check, sandbox lookup,
//! dial inside the sandbox's network namespace). Then the throughput of one 64 MiB
//! download through the proxy and directly.
//!
//! `cargo test -p sandlot --no-default-features --release --test ports_bench -- --ignored --nocapture`
//! (root; `PORTS_BENCH_N`, default 200). Prints medians, p90 and ratios; figures in
//! docs/networking.md.

mod api_support;
mod ports_app;

use std::time::Instant;

use api_support::{rt, Daemon};
use ports_app::{raw, start_app, APP};
use sandlot_client::{CreateSandbox, PublishPort};

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

struct HostApp(std::process::Child, std::path::PathBuf);

impl Drop for HostApp {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_file(&self.1);
    }
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn proxied_request_rtt_vs_direct() {
    let n: usize = std::env::var("PORTS_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let d = Daemon::start(None);
    let token = d.token("bench");
    let c = d.tcp(Some(&token));
    let id = rt()
        .block_on(c.create_sandbox(&CreateSandbox::default()))
        .unwrap()
        .id;
    rt().block_on(start_app(&c, &id, "127.0.0.1", 8000));
    let published = rt()
        .block_on(c.publish_port(
            &id,
            &PublishPort {
                port: 8000,
                ..Default::default()
            },
        ))
        .unwrap()
        .address;
    // The peer: the same app on the host's loopback.
    let hp = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let script =
        std::env::temp_dir().join(format!("sandlot-ports-bench-{}.py", std::process::id()));
    std::fs::write(&script, APP).unwrap();
    let _host = HostApp(
        std::process::Command::new("python3")
            .arg(&script)
            .arg("127.0.0.1")
            .arg(hp.to_string())
            .spawn()
            .unwrap(),
        script.clone(),
    );
    let direct = format!("127.0.0.1:{hp}");
    while std::net::TcpStream::connect(&direct).is_err() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let api = format!("127.0.0.1:{}", d.port);
    let proxy_head = format!(
        "GET /v1/sandboxes/{id}/ports/8000/b HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}"
    );
    let plain_head = "GET /b HTTP/1.1\r\nHost: x";
    let targets: [(&str, &str, &str); 3] = [
        ("direct (host loopback)", &direct, plain_head),
        ("published TCP port", &published, plain_head),
        ("HTTP proxy", &api, &proxy_head),
    ];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); 3];
    for _ in 0..10 {
        for (_, addr, head) in &targets {
            assert_eq!(raw(addr, head, b"").status, 200);
        }
    }
    for _ in 0..n {
        for (i, (_, addr, head)) in targets.iter().enumerate() {
            let t = Instant::now();
            let r = raw(addr, head, b"");
            times[i].push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(r.status, 200);
        }
    }
    let base = pct(&mut times[0].clone(), 0.5);
    println!("request round trip, n={n} each, interleaved (ms):");
    for (i, (name, _, _)) in targets.iter().enumerate() {
        let med = pct(&mut times[i], 0.5);
        let p90 = pct(&mut times[i], 0.9);
        println!(
            "  {name:<24} median {med:7.3}  p90 {p90:7.3}  x{:.2} of direct",
            med / base
        );
    }
    // Throughput of one large streamed answer.
    let size = 64 << 20;
    let mut mb = Vec::new();
    for (name, addr, head) in [
        (
            "direct",
            direct.as_str(),
            plain_head.replace("/b", &format!("/big?n={size}")),
        ),
        (
            "HTTP proxy",
            api.as_str(),
            proxy_head.replace("/b ", &format!("/big?n={size} ")),
        ),
    ] {
        let t = Instant::now();
        let r = raw(addr, &head, b"");
        assert_eq!(r.body.len(), size);
        let rate = size as f64 / t.elapsed().as_secs_f64() / 1e6;
        println!("  64 MiB download {name:<12} {rate:8.1} MB/s");
        mb.push(rate);
    }
    println!("  proxy/direct throughput x{:.2}", mb[1] / mb[0]);
    rt().block_on(c.delete_sandbox(&id)).unwrap();
}
