//! Memory store benchmarks with the real all-MiniLM-L6-v2 embedder.
//!
//!   cargo bench -p sandlot-memory --bench memory            # both parts
//!   cargo bench -p sandlot-memory --bench memory -- write   # write-to-searchable only
//!   cargo bench -p sandlot-memory --bench memory -- search  # 100,000-chunk search only
//!
//! Part 1, write to searchable: a store seeded with the 300 Lee background stories; each sample
//! adds a memory (file + git commit + index) and then searches for it; the same for a direct file
//! write picked up by the watcher. Peer: a bare `git add && git commit` of the same file.
//!
//! Part 2, search over 100,000 chunks: 1,000 Markdown files x 100 sections cut from the
//! Wikipedia sample in gensim's test data (10,000 distinct section texts repeated ten times,
//! see `build_100k`), embedded with the real model once and cached under
//! $SANDLOT_BENCH_DIR (default ~/.cache/sandlot/bench/memory-100k); queries are embedded with
//! the real model on every search. Peers: BM25 alone, vector alone, query embedding alone.
//!
//! Needs `bash scripts/setup.d/40-memory.sh` first.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandlot_memory::{
    Author, Embedder, MiniLmEmbedder, NewMemory, SearchMode, SearchQuery, Store, VectorScan,
    WatchOptions,
};

fn data_dir() -> PathBuf {
    std::env::var_os("SANDLOT_MEMORY_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache/sandlot/data/lee"))
}

fn home() -> PathBuf {
    PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
}

fn read(p: &Path) -> String {
    std::fs::read(p)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_else(|e| {
            panic!(
                "read {}: {e}; run `bash scripts/setup.d/40-memory.sh` first",
                p.display()
            )
        })
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn row(name: &str, v: &mut [f64]) -> (f64, f64) {
    let (p50, p95) = (pct(v, 0.5), pct(v, 0.95));
    println!(
        "| {name} | {} | {p50:.1} | {p95:.1} | {:.1} |",
        v.len(),
        pct(v, 1.0)
    );
    (p50, p95)
}

fn bench_write(model: Arc<dyn Embedder>) {
    let author = Author::new("bench", "bench@localhost");
    let dir =
        TempDir(std::env::temp_dir().join(format!("sandlot-memory-bench-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    let store = Arc::new(Store::init(&dir.0, model, &author).unwrap());
    let stories = read(&data_dir().join("lee_background.cor"));
    let t = Instant::now();
    for (i, s) in stories.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        std::fs::create_dir_all(dir.0.join("lee")).unwrap();
        std::fs::write(dir.0.join(format!("lee/story-{i:03}.md")), format!("{s}\n")).unwrap();
    }
    let r = store.sync().unwrap();
    let (files, chunks, _) = store.counts().unwrap();
    println!(
        "seeded {files} files / {chunks} chunks in {:.1} s ({} texts embedded)\n",
        t.elapsed().as_secs_f64(),
        r.texts_embedded
    );
    let n = 40;
    let mut api = Vec::new();
    for i in 0..n {
        let token = format!("benchtoken{i}q");
        let body = format!(
            "Meeting note {i}: the {token} rollout was discussed with the platform team; \
             owners agreed to revisit the migration plan after the quarterly review."
        );
        let t = Instant::now();
        store
            .add(
                NewMemory {
                    title: format!("Note {i}"),
                    body,
                    folder: Some("notes".into()),
                    ..Default::default()
                },
                &author,
            )
            .unwrap();
        let mut q = SearchQuery::new(&token);
        q.limit = 1;
        let hits = store.search(&q).unwrap();
        assert!(hits
            .first()
            .map(|h| h.snippet.contains(&token))
            .unwrap_or(false));
        api.push(ms(t.elapsed()));
    }
    // Peer: versioning alone, a bare git add + commit of a same-sized file.
    let mut peer = Vec::new();
    for i in 0..n {
        let p = format!("peer/p{i}.md");
        std::fs::create_dir_all(dir.0.join("peer")).unwrap();
        let t = Instant::now();
        std::fs::write(
            dir.0.join(&p),
            format!("peer file {i} with some text of similar size\n"),
        )
        .unwrap();
        let ok = std::process::Command::new("git")
            .arg("-C")
            .arg(&dir.0)
            .args(["-c", "user.name=b", "-c", "user.email=b@l", "add", &p])
            .status()
            .unwrap()
            .success()
            && std::process::Command::new("git")
                .arg("-C")
                .arg(&dir.0)
                .args([
                    "-c",
                    "user.name=b",
                    "-c",
                    "user.email=b@l",
                    "commit",
                    "-qm",
                    "peer",
                    "--",
                    &p,
                ])
                .status()
                .unwrap()
                .success();
        assert!(ok);
        peer.push(ms(t.elapsed()));
    }
    store.sync().unwrap();
    // Direct writes picked up by the watcher.
    let watcher = sandlot_memory::watch(store.clone(), WatchOptions::default()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut direct = Vec::new();
    for i in 0..n {
        let token = format!("directtoken{i}z");
        let t = Instant::now();
        std::fs::write(
            dir.0.join(format!("notes/direct-{i}.md")),
            format!("# Direct {i}\nA person typed {token} into this note about the release checklist.\n"),
        )
        .unwrap();
        let mut q = SearchQuery::new(&token);
        q.limit = 1;
        q.mode = SearchMode::Bm25;
        loop {
            if store
                .search(&q)
                .unwrap()
                .first()
                .map(|h| h.snippet.contains(&token))
                .unwrap_or(false)
            {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "direct write {i} never became searchable"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        direct.push(ms(t.elapsed()));
    }
    drop(watcher);
    println!("### Write to searchable (ms; store of {files} files)\n");
    println!("| path | n | p50 | p95 | max |\n|---|---|---|---|---|");
    let (a50, a95) = row(
        "Store::add (file + git commit + embed + index) then search",
        &mut api,
    );
    let (d50, d95) = row(
        "direct file write, picked up by the watcher (50 ms debounce)",
        &mut direct,
    );
    let (p50, _) = row("peer: bare `git add && git commit`", &mut peer);
    println!(
        "\nadd p95 {a95:.1} ms, watcher p95 {d95:.1} ms (target <= 1000 ms); add p50 is {:.2}x the bare git commit, watcher p50 {:.2}x\n",
        a50 / p50,
        d50 / p50
    );
}

const QUERIES: &[&str] = &[
    "political philosophy rejecting the state",
    "who invented the telephone",
    "chemical element with atomic number 79",
    "ancient greek philosopher student of plato",
    "how do vaccines train the immune system",
    "largest desert in the world",
    "causes of the first world war",
    "programming language created at bell labs",
    "river flowing through egypt",
    "theory of evolution by natural selection",
    "a city famous for its canals",
    "composer of the moonlight sonata",
    "planet with prominent rings",
    "speed of light in a vacuum",
    "monarchy abolished after a revolution",
    "musical instrument with black and white keys",
    "football club from northern england",
    "disease transmitted by mosquitoes",
    "currency used across europe",
    "mountain range between france and spain",
];

fn build_100k(model: &Arc<dyn Embedder>, dir: &Path) -> Store {
    let author = Author::new("bench", "bench@localhost");
    let marker = dir.join(".sandlot/bench-complete");
    if marker.is_file() {
        let t = Instant::now();
        let store = Store::open(dir, model.clone()).unwrap();
        println!(
            "reusing cached store {} (opened and reconciled in {:.2} s)",
            dir.display(),
            t.elapsed().as_secs_f64()
        );
        return store;
    }
    let _ = std::fs::remove_dir_all(dir);
    let store = Store::init(dir, model.clone(), &author).unwrap();
    let words: Vec<String> = read(&data_dir().join("wiki.txt"))
        .split_whitespace()
        .map(str::to_string)
        .collect();
    // 1,000 files x 100 sections = 100,000 chunks. Embedding 100,000 distinct chunks with
    // MiniLM on 2 shared cores takes hours, so the text repeats with a period of
    // `distinct_files` files: every chunk still has its own row, FTS entry and slot in the
    // vector matrix (the search cost is that of 100,000 chunks), while identical texts share one
    // real model vector, since the index keys vectors by content hash.
    let distinct_files: usize = std::env::var("SANDLOT_BENCH_DISTINCT_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let (files, sections, window, stride) = (1000usize, 100usize, 36usize, 9usize);
    assert!(
        words.len() > distinct_files * sections * stride + window,
        "wiki.txt too small for {distinct_files} distinct files"
    );
    let t = Instant::now();
    for f in 0..files {
        let folder = dir.join(format!("wiki/{:02}", f % 50));
        std::fs::create_dir_all(&folder).unwrap();
        // No front matter title: it would be part of every chunk's embedding text.
        let mut text = String::from("---\ntags: [wiki, bench]\n---\n");
        for s in 0..sections {
            let n = (f % distinct_files) * sections + s;
            let start = n * stride;
            text.push_str(&format!(
                "\n## Section {n}\n\n{}\n",
                words[start..start + window].join(" ")
            ));
        }
        std::fs::write(folder.join(format!("sample-{f:04}.md")), text).unwrap();
    }
    println!(
        "generated 100,000 chunks ({} distinct texts); embedding with all-MiniLM-L6-v2 (one-off, cached)...",
        distinct_files * sections
    );
    let r = store.sync().unwrap();
    let secs = t.elapsed().as_secs_f64();
    let (nf, nc, nv) = store.counts().unwrap();
    println!(
        "built {nf} files / {nc} chunks / {nv} vectors in {secs:.0} s ({} texts embedded, {:.0} chunks/s)",
        r.texts_embedded,
        r.texts_embedded as f64 / secs
    );
    std::fs::write(&marker, "ok\n").unwrap();
    store
}

fn bench_search(model: Arc<dyn Embedder>) {
    let dir = std::env::var_os("SANDLOT_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache/sandlot/bench/memory-100k"));
    let store = build_100k(&model, &dir);
    let (nf, nc, nv) = store.counts().unwrap();
    // The first vector search loads the matrix into memory (once per process; the daemon keeps it).
    let t = Instant::now();
    let mut q = SearchQuery::new("warm up");
    q.mode = SearchMode::Vector;
    store.search(&q).unwrap();
    let load = ms(t.elapsed());
    for q in QUERIES.iter().take(5) {
        store.search(&SearchQuery::new(*q)).unwrap();
    }
    let rounds = 5;
    let (mut hybrid, mut bm25, mut vector, mut embed) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut old_hybrid, mut old_vector) = (Vec::new(), Vec::new());
    // Agreement of the int8 scan (exact rerank) with the exact f32 scan: the same memories in
    // the same order, per query.
    let (mut same_top10, mut same_vec50, mut compared) = (0usize, 0usize, 0usize);
    for round in 0..rounds {
        for q in QUERIES {
            store.set_vector_scan(VectorScan::Quantized);
            let t = Instant::now();
            let hits = store.search(&SearchQuery::new(*q)).unwrap();
            hybrid.push(ms(t.elapsed()));
            assert_eq!(hits.len(), 10);
            let mut b = SearchQuery::new(*q);
            b.mode = SearchMode::Bm25;
            let t = Instant::now();
            store.search(&b).unwrap();
            bm25.push(ms(t.elapsed()));
            let mut v = SearchQuery::new(*q);
            v.mode = SearchMode::Vector;
            v.limit = 50;
            let t = Instant::now();
            let vhits = store.search(&v).unwrap();
            vector.push(ms(t.elapsed()));
            let t = Instant::now();
            model.embed(&[q]).unwrap();
            embed.push(ms(t.elapsed()));
            // Peer: the old path, an exact single-threaded f32 scan of every row.
            store.set_vector_scan(VectorScan::Exact);
            let t = Instant::now();
            let old = store.search(&SearchQuery::new(*q)).unwrap();
            old_hybrid.push(ms(t.elapsed()));
            let t = Instant::now();
            let old_v = store.search(&v).unwrap();
            old_vector.push(ms(t.elapsed()));
            store.set_vector_scan(VectorScan::Quantized);
            if round == 0 {
                let paths = |h: &[sandlot_memory::SearchHit]| {
                    h.iter().map(|h| h.path.clone()).collect::<Vec<_>>()
                };
                compared += 1;
                same_top10 += usize::from(paths(&hits) == paths(&old));
                same_vec50 += usize::from(paths(&vhits) == paths(&old_v));
            }
        }
    }
    println!(
        "### Search over {nc} chunks ({nf} files, {nv} vectors; ms per query, {} queries)\n",
        hybrid.len()
    );
    println!("| mode | n | p50 | p95 | max |\n|---|---|---|---|---|");
    let (h50, _) = row(
        "hybrid (query embedding ‖ BM25, then int8 scan on all cores + exact rerank, RRF)",
        &mut hybrid,
    );
    let (o50, _) = row(
        "peer: hybrid with the old exact single-threaded f32 scan",
        &mut old_hybrid,
    );
    let (b50, _) = row("peer: BM25 only", &mut bm25);
    let (v50, _) = row(
        "peer: vector only, int8 scan (incl. query embedding)",
        &mut vector,
    );
    let (ov50, _) = row("peer: vector only, old exact f32 scan", &mut old_vector);
    let (e50, _) = row("peer: query embedding alone", &mut embed);
    println!(
        "\nhybrid p50 {h50:.1} ms (target <= 20 ms), {:.2}x the old path's {o50:.1} ms; vector-only {:.2}x the old; \
         ratios to hybrid p50: BM25 {:.2}, vector {:.2}, embedding {:.2}; one-off vector matrix load {load:.0} ms",
        h50 / o50,
        v50 / ov50,
        b50 / h50,
        v50 / h50,
        e50 / h50
    );
    println!(
        "same results as the exact scan: hybrid top-10 {same_top10}/{compared} queries, vector top-50 {same_vec50}/{compared} queries"
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let want = |w: &str| args.is_empty() || args.iter().any(|a| a == w);
    let model: Arc<dyn Embedder> =
        Arc::new(MiniLmEmbedder::load_default().unwrap_or_else(|e| panic!("{e}")));
    println!(
        "machine: {} cores; model {}; release build\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        model.model_id()
    );
    if want("write") {
        bench_write(model.clone());
    }
    if want("search") {
        bench_search(model);
    }
}
