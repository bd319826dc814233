//! Output of any size with back-pressure: integrity, no head-of-line blocking,
//! bounded agent memory, producers that block when nobody reads.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::{sh, TestAgent};
use sandlot_guest::client::{ExecRequest, GuestClient, ProcessEvent, ProcessId, ProcessInfo};
use sha2::{Digest, Sha256};

/// Deterministic incompressible bytes.
fn pseudo_random(len: usize, mut seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        v.extend_from_slice(&seed.to_le_bytes());
    }
    v.truncate(len);
    v
}

async fn info(c: &GuestClient, id: ProcessId) -> ProcessInfo {
    c.list_processes()
        .await
        .unwrap()
        .into_iter()
        .find(|p| p.id == id)
        .expect("process listed")
}

#[tokio::test]
async fn hundred_megabytes_arrive_intact_without_head_of_line_blocking() {
    let a = TestAgent::start();
    let c = a.client().await;
    let size = 100 * 1024 * 1024;
    let data = pseudo_random(size, 0x9e3779b97f4a7c15);
    let expect = Sha256::digest(&data);
    let file = a.dir.join("big");
    std::fs::File::create(&file)
        .unwrap()
        .write_all(&data)
        .unwrap();
    drop(data);

    let mut big = c
        .exec(ExecRequest::new(["cat", file.to_str().unwrap()]))
        .await
        .unwrap();
    a.track(&big);
    // Nobody reads `big` yet: it must stall without stalling anything else on the
    // connection.
    let mut small = c
        .exec(sh(
            "for i in $(seq 1 20); do echo tick $i; sleep 0.01; done",
        ))
        .await
        .unwrap();
    a.track(&small);
    let mut ticks = 0;
    let st = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match small.next_event().await.unwrap().unwrap() {
                ProcessEvent::Stdout(b) => ticks += b.iter().filter(|&&c| c == b'\n').count(),
                ProcessEvent::Stderr(_) => {}
                ProcessEvent::Exit(s) => break s,
            }
        }
    })
    .await
    .expect("the small process finished while the big one was not read");
    assert!(st.success());
    assert_eq!(ticks, 20);
    c.ping().await.unwrap();
    let i = info(&c, big.id()).await;
    assert!(
        i.exit.is_none(),
        "cat cannot have finished: nobody read its output"
    );
    assert!(
        i.stdout.produced < 4 << 20,
        "the agent read {} bytes ahead of the client",
        i.stdout.produced
    );

    // Now read it all, while another process runs on the same connection.
    let c2 = c.clone();
    let concurrent = tokio::spawn(async move {
        let p = c2
            .exec(sh("for i in $(seq 1 50); do echo $i; sleep 0.005; done"))
            .await
            .unwrap();
        let pid = p.pid();
        (pid, p.output().await.unwrap())
    });
    let mut h = Sha256::new();
    let mut n = 0usize;
    let started = Instant::now();
    let status = loop {
        match big.next_event().await.unwrap().unwrap() {
            ProcessEvent::Stdout(b) => {
                n += b.len();
                h.update(&b);
            }
            ProcessEvent::Stderr(b) => panic!("stderr {b:?}"),
            ProcessEvent::Exit(s) => break s,
        }
    };
    let secs = started.elapsed().as_secs_f64();
    assert!(status.success());
    assert_eq!(n, size);
    assert_eq!(h.finalize(), expect, "checksum of 100 MB of stdout");
    eprintln!(
        "100 MiB of stdout in {secs:.2}s ({:.0} MiB/s, debug build)",
        100.0 / secs
    );
    let (pid, o) = concurrent.await.unwrap();
    a.track_pid(pid);
    assert_eq!(o.stdout.iter().filter(|&&c| c == b'\n').count(), 50);
    a.finish(&c).await;
}

#[tokio::test]
async fn slow_reader_blocks_the_producer_and_bounds_agent_memory() {
    let a = TestAgent::start();
    let c = a.client().await;
    let baseline = a.rss_anon_kib();
    let blocks = 3000u64; // 64 KiB each: ~196 MB
    let mut p = c
        .exec(ExecRequest::new([
            "dd",
            "if=/dev/zero",
            "bs=65536",
            &format!("count={blocks}"),
            "status=none",
        ]))
        .await
        .unwrap();
    a.track(&p);
    // Read nothing: the producer must come to a stop (two samples 300 ms apart
    // agree), however slowly the loaded machine runs it.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut prev = info(&c, p.id()).await;
    let second = loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let cur = info(&c, p.id()).await;
        if cur.stdout.produced == prev.stdout.produced && cur.stdout.produced > 0 {
            break cur;
        }
        assert!(
            Instant::now() < deadline,
            "the agent kept reading without credit: {} bytes",
            cur.stdout.produced
        );
        prev = cur;
    };
    assert!(second.exit.is_none(), "dd finished although nobody read");
    // Client window (256 KiB) + retention (1 MiB) + one chunk.
    assert!(
        second.stdout.produced <= (256 + 1024 + 64) * 1024,
        "read ahead {} bytes",
        second.stdout.produced
    );
    let state = std::fs::read_to_string(format!("/proc/{}/stat", p.pid())).unwrap();
    let state = state[state.rfind(')').unwrap() + 2..]
        .chars()
        .next()
        .unwrap();
    assert_eq!(state, 'S', "dd sleeps in write(2)");

    // Read slowly (yielding often); agent memory stays bounded.
    let mut total = 0u64;
    let mut peak = 0;
    let mut k = 0u64;
    let status = loop {
        match p.next_event().await.unwrap().unwrap() {
            ProcessEvent::Stdout(b) => {
                assert!(b.iter().all(|&x| x == 0));
                total += b.len() as u64;
                k += 1;
                if k.is_multiple_of(200) {
                    peak = peak.max(a.rss_anon_kib());
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            ProcessEvent::Stderr(b) => panic!("stderr {b:?}"),
            ProcessEvent::Exit(s) => break s,
        }
    };
    assert!(status.success());
    assert_eq!(total, blocks * 65536);
    eprintln!("agent RssAnon: baseline {baseline} KiB, peak {peak} KiB while streaming");
    assert!(
        peak < baseline + 16 * 1024,
        "agent memory grew from {baseline} KiB to {peak} KiB"
    );
    a.finish(&c).await;
}

#[tokio::test]
async fn detached_output_is_retained_up_to_the_limit_and_never_blocks() {
    // Nobody attached: the process must not block, and the agent keeps only the
    // most recent `retention` bytes.
    let a = TestAgent::start_with(&["--retention", "65536"]);
    let c = a.client().await;
    let mut req = sh("head -c 1000000 /dev/zero; echo tail-marker");
    req.detached = true;
    let p = c.exec(req).await.unwrap();
    a.track(&p);
    let deadline = Instant::now() + Duration::from_secs(20);
    let i = loop {
        let i = info(&c, p.id()).await;
        if i.exit.is_some() && i.stdout.eof {
            break i;
        }
        assert!(
            Instant::now() < deadline,
            "detached producer blocked: {i:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(i.stdout.produced, 1_000_012);
    assert_eq!(i.stdout.retained_from, 1_000_012 - 65536);
    let mut q = c.attach(p.id(), Some(0)).await.unwrap();
    assert_eq!(
        q.offsets().0,
        1_000_012 - 65536,
        "attach starts at the oldest byte kept"
    );
    let mut got = Vec::new();
    loop {
        match q.next_event().await.unwrap().unwrap() {
            ProcessEvent::Stdout(b) => got.extend_from_slice(&b),
            ProcessEvent::Stderr(_) => {}
            ProcessEvent::Exit(_) => break,
        }
    }
    assert_eq!(got.len(), 65536);
    assert!(got.ends_with(b"\0tail-marker\n"));
    a.finish(&c).await;
}

#[tokio::test]
async fn stdin_is_flow_controlled_when_the_process_does_not_read() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let a = TestAgent::start();
    let c = a.client().await;
    let fifo = a.dir.join("go");
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .unwrap();
    let mut req = sh(&format!("read x < {}; wc -c", fifo.display()));
    req.stdin = true;
    let mut p = c.exec(req).await.unwrap();
    a.track(&p);
    let mut stdin = p.take_stdin().unwrap();
    let total: u64 = 20 << 20;
    let accepted = Arc::new(AtomicU64::new(0));
    let acc = accepted.clone();
    let writer = tokio::spawn(async move {
        let chunk = vec![b'x'; 64 * 1024];
        let mut sent = 0;
        while sent < total {
            stdin.write(&chunk).await.unwrap();
            sent += chunk.len() as u64;
            acc.store(sent, Ordering::SeqCst);
        }
        stdin.close();
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let early = accepted.load(Ordering::SeqCst);
    // Agent credit (256 KiB) + the pipe (64 KiB) + one chunk in flight.
    assert!(
        early <= (256 + 64 + 64 + 64) * 1024,
        "the client sent {early} bytes to a process that reads nothing"
    );
    assert!(!writer.is_finished());
    std::fs::write(&fifo, b"go\n").unwrap();
    writer.await.unwrap();
    let o = p.output().await.unwrap();
    assert!(o.status.success());
    assert_eq!(
        String::from_utf8(o.stdout).unwrap().trim(),
        total.to_string()
    );
    a.finish(&c).await;
}
