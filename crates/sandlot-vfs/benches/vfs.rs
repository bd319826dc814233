//! Benchmark: a generated 10,000-document, ~50 MB collection. Measures session
//! start, `grep -rn`, `cat` and a few other commands in the virtual shell, and
//! the same command lines run by real bash + GNU tools on a copy on disk, in
//! the same run.
//!
//! Run: `cargo bench -p sandlot-vfs --bench vfs` (set `VFS_BENCH_OUT=path.md`
//! to also write the Markdown report there; `VFS_BENCH_DOCS` to change size).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandlot_vfs::manifest::Tree;
use sandlot_vfs::{Acl, AclPolicy, AclRule, IngestOptions, Limits, Principal, Source, Store};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn vocabulary(rng: &mut Rng) -> Vec<String> {
    let syl = [
        "ka", "to", "ri", "mon", "sel", "da", "pe", "lu", "vor", "in", "qua", "ze", "bra", "tis",
        "eng", "ol",
    ];
    let mut v: Vec<String> = (0..6000)
        .map(|_| {
            let n = 1 + rng.below(3);
            (0..n)
                .map(|_| syl[rng.below(syl.len() as u64) as usize])
                .collect()
        })
        .collect();
    v.extend(
        [
            "the", "a", "of", "and", "to", "in", "request", "token", "bucket", "retry",
        ]
        .map(String::from),
    );
    v
}

/// Generate the corpus on disk; returns (paths, total bytes).
fn generate(root: &Path, docs: usize) -> (Vec<String>, u64) {
    let mut rng = Rng(0x5eed_1234_abcd);
    let vocab = vocabulary(&mut rng);
    let mut paths = Vec::with_capacity(docs);
    let mut total = 0u64;
    for i in 0..docs {
        let rel = format!(
            "section{:02}/topic{:02}/doc{:05}.md",
            i % 20,
            (i / 20) % 25,
            i
        );
        let mut body = String::with_capacity(5200);
        body.push_str(&format!("# Document {i}\n\n"));
        let target = 4600 + rng.below(1000) as usize;
        while body.len() < target {
            let words = 6 + rng.below(10);
            let mut line: Vec<&str> = (0..words)
                .map(|_| vocab[rng.below(vocab.len() as u64) as usize].as_str())
                .collect();
            if i % 97 == 0 && rng.below(20) == 0 {
                line.insert(2, "rate limit");
            }
            body.push_str(&line.join(" "));
            body.push('\n');
        }
        if i % 97 == 0 {
            body.push_str("See the rate limit policy for burst sizes.\n");
        }
        let p = root.join(&rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, &body).unwrap();
        total += body.len() as u64;
        paths.push(rel);
    }
    (paths, total)
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let idx = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[idx]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

fn bash(dir: &Path, cmd: &str) -> Duration {
    let t = Instant::now();
    let st = Command::new("bash")
        .arg("-c")
        .arg(cmd)
        .current_dir(dir)
        .env("LC_ALL", "C.UTF-8")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .output()
        .unwrap();
    let d = t.elapsed();
    assert!(st.status.code().is_some());
    d
}

struct Row {
    name: String,
    v50: Duration,
    v95: Duration,
    r50: Option<Duration>,
    r95: Option<Duration>,
}

fn main() {
    let docs: usize = std::env::var("VFS_BENCH_DOCS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let base = std::env::temp_dir().join(format!("sandlot-vfs-bench-{}", std::process::id()));
    let _guard = TempDir(base.clone());
    let src = base.join("corpus");
    let t = Instant::now();
    let (paths, total) = generate(&src, docs);
    eprintln!(
        "generated {docs} documents, {total} bytes in {:?}",
        t.elapsed()
    );

    let store = Store::open(base.join("store")).unwrap();
    let policy = AclPolicy {
        default: Acl::public(),
        rules: vec![AclRule {
            pattern: "section19/**".into(),
            acl: Acl::groups(["eng"]),
        }],
    };
    let t = Instant::now();
    store
        .create(
            "bench",
            Source::Dir { path: src.clone() },
            IngestOptions { acl: policy },
        )
        .unwrap();
    let ingest = t.elapsed();
    let t = Instant::now();
    let r = store.update("bench", None, None).unwrap();
    let reingest = t.elapsed();
    assert!(!r.changed);
    eprintln!("ingest {ingest:?}, no-op re-ingest {reingest:?}");

    let coll = store.collection("bench").unwrap();
    let principal = Principal::new("agent", ["eng"]);
    let limits = Limits {
        max_output_bytes: 64 << 20,
        max_run_time: Duration::from_secs(60),
        ..Limits::default()
    };
    let mut rows = Vec::new();

    // Session start (view cached after the first session for this group set).
    let _ = coll
        .open_session(principal.clone(), limits.clone())
        .unwrap();
    let mut v: Vec<Duration> = (0..2000)
        .map(|_| {
            let t = Instant::now();
            let s = coll
                .open_session(principal.clone(), limits.clone())
                .unwrap();
            let d = t.elapsed();
            drop(s);
            d
        })
        .collect();
    let mut peer: Vec<Duration> = (0..200).map(|_| bash(&src, "true")).collect();
    rows.push(Row {
        name: "session start (cached view)".into(),
        v50: pct(&mut v, 0.5),
        v95: pct(&mut v, 0.95),
        r50: Some(pct(&mut peer, 0.5)),
        r95: Some(pct(&mut peer, 0.95)),
    });
    // Cold: prune and build the tree for a new group set.
    let head = coll.head().unwrap();
    let mut v: Vec<Duration> = (0..100)
        .map(|_| {
            let t = Instant::now();
            let tree = Tree::for_principal(&head.manifest, &principal).unwrap();
            let d = t.elapsed();
            assert!(tree.doc_count() > 0);
            d
        })
        .collect();
    rows.push(Row {
        name: "session start (cold: prune + build tree)".into(),
        v50: pct(&mut v, 0.5),
        v95: pct(&mut v, 0.95),
        r50: None,
        r95: None,
    });

    let mut session = coll
        .open_session(principal.clone(), limits.clone())
        .unwrap();
    let mut rng = Rng(42);
    let mut bench_cmd = |name: &str, cmd: &dyn Fn(&mut Rng) -> String, n: usize, n_real: usize| {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let c = cmd(&mut rng);
            let t = Instant::now();
            let o = session.run(&c).unwrap();
            v.push(t.elapsed());
            assert!(
                o.exit_code <= 1,
                "{c}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let mut r: Vec<Duration> = (0..n_real)
            .map(|_| bash(&src, &cmd(&mut rng).replace(" / ", " . ")))
            .collect();
        rows.push(Row {
            name: name.to_string(),
            v50: pct(&mut v, 0.5),
            v95: pct(&mut v, 0.95),
            r50: Some(pct(&mut r, 0.5)),
            r95: Some(pct(&mut r, 0.95)),
        });
    };
    let pick = |rng: &mut Rng| paths[rng.below(paths.len() as u64) as usize].clone();
    bench_cmd("cat DOC", &|rng| format!("cat {}", pick(rng)), 2000, 200);
    bench_cmd(
        "grep -rn 'rate limit' /",
        &|_| "grep -rn 'rate limit' / ".into(),
        60,
        20,
    );
    bench_cmd(
        "grep -rni 'Rate Limit' /",
        &|_| "grep -rni 'Rate Limit' / ".into(),
        30,
        10,
    );
    bench_cmd(
        "grep -rl 'burst sizes' / | wc -l",
        &|_| "grep -rl 'burst sizes' / | wc -l".into(),
        30,
        10,
    );
    bench_cmd(
        "grep -rc zzqqxx / (no match)",
        &|_| "grep -rc zzqqxx / | tail -1".into(),
        30,
        10,
    );
    bench_cmd(
        "grep -rn 'ka[a-z]*mon vor' / | head",
        &|_| "grep -rn 'ka[a-z]*mon vor' / | head".into(),
        20,
        10,
    );
    bench_cmd(
        "find / -name '*.md' | wc -l",
        &|_| "find / -name '*.md' | wc -l".into(),
        30,
        10,
    );
    bench_cmd(
        "ls DIR",
        &|rng| format!("ls {}", pick(rng).rsplit_once('/').unwrap().0),
        500,
        100,
    );
    bench_cmd(
        "head -20 DOC | wc -w",
        &|rng| format!("head -20 {} | wc -w", pick(rng)),
        500,
        100,
    );

    let mut md = String::new();
    let _ = writeln!(md, "# sandlot-vfs benchmark\n");
    let _ = writeln!(
        md,
        "Corpus: {docs} generated Markdown documents, {:.1} MB, 500 directories; one ACL rule (section19/** for group eng); \
         principal in group eng. Machine: {} cores. Ingest {:.2} s; no-op re-ingest {:.2} s.\n",
        total as f64 / 1e6,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        ingest.as_secs_f64(),
        reingest.as_secs_f64()
    );
    let _ = writeln!(
        md,
        "Peer: the same command line run by real bash + GNU tools on a copy on local disk (page cache warm), \
         process start included; for session start the peer is `bash -c true`.\n"
    );
    let _ = writeln!(md, "| operation | virtual p50 ms | virtual p95 ms | GNU/bash p50 ms | GNU/bash p95 ms | ratio (p50 peer / virtual) |");
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|");
    for r in &rows {
        let (p50, p95, ratio) = match (r.r50, r.r95) {
            (Some(a), Some(b)) => (
                ms(a),
                ms(b),
                format!("{:.1}x", a.as_secs_f64() / r.v50.as_secs_f64().max(1e-9)),
            ),
            _ => ("-".into(), "-".into(), "-".into()),
        };
        let _ = writeln!(
            md,
            "| `{}` | {} | {} | {p50} | {p95} | {ratio} |",
            r.name.replace('|', "\\|"),
            ms(r.v50),
            ms(r.v95)
        );
    }
    let find = |n: &str| rows.iter().find(|r| r.name.starts_with(n)).unwrap();
    let _ = writeln!(
        md,
        "\nTargets: session start p50 <= 10 ms: {} ms; `grep -rn` p95 <= 200 ms: {} ms; `cat` p50 < 1 ms: {} ms.",
        ms(find("session start (cached").v50),
        ms(find("grep -rn 'rate").v95),
        ms(find("cat DOC").v50)
    );
    println!("{md}");
    if let Ok(out) = std::env::var("VFS_BENCH_OUT") {
        std::fs::write(&out, &md).unwrap();
        eprintln!("wrote {out}");
    }
}
