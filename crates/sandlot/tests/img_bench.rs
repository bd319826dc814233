//! Benchmarks of images (not a pass/fail test; run explicitly):
//!
//! ```sh
//! cargo test --release -p sandlot --no-default-features --test img_bench -- --ignored --nocapture
//! ```
//!
//! 1. create (API round trip, until the agent answers) from a 5-layer image vs from
//!    the `host` image, interleaved in one run: medians and their ratio;
//! 2. snapshot of a 1 MB diff over a large image (many files in its layers): median
//!    time frozen and median API round trip.

mod api_support;
mod img_support;

use std::time::Instant;

use api_support::{rt, Daemon};
use serde_json::json;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn bench_images() {
    let mut d = Daemon::start(None);
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(&tmp).unwrap();
    // 5 layers: the rootfs and 4 small ones.
    let five = img_support::base_archive(&tmp, "bench/five", 4);
    assert_eq!(d.cli(&["image", "import", five.to_str().unwrap()]).0, 0);
    // A large image: the rootfs plus a layer of 20,000 files (80 MB).
    let big = tmp.join("big");
    for i in 0..200 {
        let dir = big.join(format!("data/{i:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        for j in 0..100 {
            std::fs::write(dir.join(format!("{j}")), vec![b'x'; 4096]).unwrap();
        }
    }
    let root = tmp.join("bigroot");
    img_support::mini_rootfs(&root);
    let big_tar = tmp.join("big.tar");
    img_support::archive_of(
        &tmp,
        &[root, big],
        &Default::default(),
        "bench/big",
        &big_tar,
    );
    assert_eq!(d.cli(&["image", "import", big_tar.to_str().unwrap()]).0, 0);

    let c = d.client();
    let rt = rt();
    rt.block_on(async {
        let n: usize = 15;
        let (mut host, mut image) = (Vec::new(), Vec::new());
        for i in 0..n * 2 {
            let body = if i % 2 == 0 { json!({}) } else { json!({"image": "bench/five"}) };
            let t = Instant::now();
            let v = c.call_json("POST", "/v1/sandboxes", Some(&body)).await.unwrap();
            let ms = t.elapsed().as_secs_f64() * 1e3;
            if i % 2 == 0 { host.push(ms) } else { image.push(ms) }
            c.delete_sandbox(v["id"].as_str().unwrap()).await.unwrap();
        }
        let (h, im) = (median(&mut host), median(&mut image));
        println!("create, median of {n}: host {h:.1} ms, 5-layer image {im:.1} ms, ratio image/host {:.2}", im / h);

        let sb = c.call_json("POST", "/v1/sandboxes", Some(&json!({"image": "bench/big"}))).await.unwrap();
        let id = sb["id"].as_str().unwrap().to_string();
        let (mut frozen, mut round) = (Vec::new(), Vec::new());
        for i in 1..=n {
            let o = c
                .run(&id, &["/bin/sh", "-c", &format!("dd if=/dev/urandom of=/diff{i} bs=1024 count=1024 2>/dev/null; rm -f /diff{}", i - 1)])
                .await
                .unwrap();
            assert_eq!(o.exit.code, Some(0));
            let t = Instant::now();
            let s = c.call_json("POST", &format!("/v1/sandboxes/{id}/snapshot"), None).await.unwrap();
            round.push(t.elapsed().as_secs_f64() * 1e3);
            frozen.push(s["frozen_ms"].as_f64().unwrap());
        }
        println!(
            "snapshot of a 1 MB diff over a 20,000-file image, median of {n}: frozen {:.1} ms, API round trip {:.1} ms",
            median(&mut frozen),
            median(&mut round)
        );
        c.delete_sandbox(&id).await.unwrap();
    });
    d.shutdown();
}
