//! Guest protocol benchmarks, each against a peer run in the same command.
//!
//! Run: `cargo bench -p sandlot-agent --bench guest` (release build; the agent runs
//! as a child process on a Unix socket, the client in this process).
//!
//! On a machine busy with other work, scheduling delays dominate the latencies;
//! give the benchmark (and the agent it starts) real-time priority instead:
//! `cargo bench -p sandlot-agent --bench guest --no-run`, then run the printed
//! executable as `chrt -f 20 /path/to/guest-HASH --bench`.
//!
//! * exec round trip of `/bin/true` (request -> started -> exit received) vs a plain
//!   fork/exec/wait of `/bin/true` from this process (std's posix_spawn path);
//! * protocol round trip (ping);
//! * parent-side CPU per exec: the agent's vs this process's for the plain spawn;
//! * stdout throughput through the agent vs reading a pipe directly;
//! * idle agent memory (private, anonymous).

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandlot_guest::client::{ExecRequest, GuestClient, ProcessEvent};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p) as usize]
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l[field.len()..].split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn private_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("Private_Clean:") || l.starts_with("Private_Dirty:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// utime + stime of a process in milliseconds (from /proc/PID/stat, 10 ms ticks).
fn cpu_ms(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = s[s.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 * 1000.0 / 100.0
}

fn main() {
    let dir = std::env::temp_dir().join(format!("sandlot-guest-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock: PathBuf = dir.join("agent.sock");
    let mut agent = Command::new(env!("CARGO_BIN_EXE_sandlot-guest-agent"))
        .arg("--listen")
        .arg(&sock)
        .spawn()
        .expect("start agent");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = loop {
            match GuestClient::connect(&sock).await {
                Ok(c) => break c,
                Err(_) => tokio::time::sleep(Duration::from_millis(2)).await,
            }
        };
        let idle_rss = status_kib(agent.id(), "RssAnon:");
        let idle_private = private_kib(agent.id());

        let n = 2000;
        // Warm up both paths.
        for _ in 0..100 {
            c.exec(ExecRequest::new(["/bin/true"]))
                .await
                .unwrap()
                .wait()
                .await
                .unwrap();
            Command::new("/bin/true").status().unwrap();
        }
        // Interleave the two so that machine noise hits both alike.
        let (mut via_agent, mut direct, mut ping) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..n {
            let t = Instant::now();
            let st = c
                .exec(ExecRequest::new(["/bin/true"]))
                .await
                .unwrap()
                .wait()
                .await
                .unwrap();
            via_agent.push(t.elapsed().as_secs_f64() * 1e3);
            assert!(st.success());
            let t = Instant::now();
            let st = Command::new("/bin/true")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .output()
                .unwrap();
            direct.push(t.elapsed().as_secs_f64() * 1e3);
            assert!(st.status.success());
            let t = Instant::now();
            c.ping().await.unwrap();
            ping.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (ma, md, mp) = (
            median(&mut via_agent),
            median(&mut direct),
            median(&mut ping),
        );
        println!("exec round trip of /bin/true, {n} runs each (interleaved):");
        println!(
            "  via agent:   median {ma:.3} ms   p99 {:.3} ms",
            pct(&mut via_agent, 0.99)
        );
        println!(
            "  direct fork/exec/wait (peer): median {md:.3} ms   p99 {:.3} ms",
            pct(&mut direct, 0.99)
        );
        println!(
            "  overhead of the agent path: {:.3} ms (ratio {:.2}x)",
            ma - md,
            ma / md
        );
        println!(
            "protocol round trip (ping): median {mp:.3} ms   p99 {:.3} ms",
            pct(&mut ping, 0.99)
        );

        // CPU cost (load-independent): the agent's CPU per exec vs this process's CPU
        // per plain fork/exec/wait (the parent-side work of both paths).
        let m = 1000;
        let a0 = cpu_ms(agent.id());
        for _ in 0..m {
            c.exec(ExecRequest::new(["/bin/true"])).await.unwrap().wait().await.unwrap();
        }
        let agent_cpu = (cpu_ms(agent.id()) - a0) / m as f64;
        let me = std::process::id();
        let s0 = cpu_ms(me);
        for _ in 0..m {
            Command::new("/bin/true")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .output()
                .unwrap();
        }
        let direct_cpu = (cpu_ms(me) - s0) / m as f64;
        println!(
            "parent-side CPU per exec ({m} runs): agent {agent_cpu:.3} ms, direct spawn (peer) {direct_cpu:.3} ms"
        );

        // Throughput: 1 GiB of stdout.
        let bytes: u64 = 1 << 30;
        let mut agent_t = Vec::new();
        let mut direct_t = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            let mut p = c
                .exec(ExecRequest::new([
                    "head",
                    "-c",
                    &bytes.to_string(),
                    "/dev/zero",
                ]))
                .await
                .unwrap();
            let mut got = 0u64;
            while let Some(ev) = p.next_event().await.unwrap() {
                match ev {
                    ProcessEvent::Stdout(b) => got += b.len() as u64,
                    ProcessEvent::Stderr(_) => {}
                    ProcessEvent::Exit(_) => break,
                }
            }
            assert_eq!(got, bytes);
            agent_t.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let mut child = Command::new("head")
                .args(["-c", &bytes.to_string(), "/dev/zero"])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut out = child.stdout.take().unwrap();
            let mut buf = vec![0u8; 64 * 1024];
            let mut got = 0u64;
            loop {
                let k = out.read(&mut buf).unwrap();
                if k == 0 {
                    break;
                }
                got += k as u64;
            }
            child.wait().unwrap();
            assert_eq!(got, bytes);
            direct_t.push(t.elapsed().as_secs_f64());
        }
        let (ta, td) = (median(&mut agent_t), median(&mut direct_t));
        println!("stdout throughput, 1 GiB, median of 3:");
        println!("  via agent: {:.0} MiB/s", 1024.0 / ta);
        println!("  direct pipe read (peer): {:.0} MiB/s", 1024.0 / td);
        println!("  ratio: {:.2}x the direct time", ta / td);
        println!(
            "idle agent memory: RssAnon {idle_rss} KiB, private (clean+dirty) {idle_private} KiB"
        );
        println!(
            "after the runs:    RssAnon {} KiB, private {} KiB",
            status_kib(agent.id(), "RssAnon:"),
            private_kib(agent.id())
        );
        c.shutdown().await.unwrap();
    });
    agent.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
