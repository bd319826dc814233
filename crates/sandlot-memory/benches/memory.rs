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
//! the real model on every search. Peers, in the same rounds: BM25 alone, vector alone, query
//! embedding alone; the candle path (candle's generic BERT for the query embedding, exact
//! single-threaded f32 scan) through a second handle on the same store; and the per-term FTS
//! path (matched terms by one FTS query per query term, f32 query weights) through a third.
//!
//! Needs `bash scripts/setup.d/40-memory.sh` first.

#[path = "../tests/reference/candle_bert.rs"]
mod candle_bert;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandlot_memory::{
    Author, Embedder, MiniLmEmbedder, NewMemory, SearchMode, SearchQuery, Store, TextSide,
    VectorScan, WatchOptions,
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

/// CPU time of the whole process (all threads, user + system) from /proc/self/stat, in clock
/// ticks of 10 ms: too coarse for one call, but the mean over many calls is an unbiased estimate,
/// and unlike wall time it does not grow with the time a loaded machine makes threads wait.
fn cpu_now() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    Duration::from_millis(10 * f.iter().sum::<u64>())
}

/// Wall and CPU milliseconds of repeated calls.
#[derive(Default)]
struct Samples {
    wall: Vec<f64>,
    cpu: Vec<f64>,
}

impl Samples {
    fn measure<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let (t, c) = (Instant::now(), cpu_now());
        let out = f();
        self.wall.push(ms(t.elapsed()));
        self.cpu.push(ms(cpu_now().saturating_sub(c)));
        out
    }

    /// A table row (wall p50, p95, max; mean CPU) and (wall p50, mean CPU).
    fn row(&mut self, name: &str) -> (f64, f64) {
        let c50 = self.cpu.iter().sum::<f64>() / self.cpu.len().max(1) as f64;
        let (p50, p95, max) = (
            pct(&mut self.wall, 0.5),
            pct(&mut self.wall, 0.95),
            pct(&mut self.wall, 1.0),
        );
        println!(
            "| {name} | {} | {p50:.1} | {p95:.1} | {max:.1} | {c50:.1} |",
            self.wall.len()
        );
        (p50, c50)
    }
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
    // The candle path, as a peer: a second handle on the same index whose query embedder is
    // candle's BERT and whose vector scan is the exact single-threaded f32 scan.
    let previous_model: Arc<dyn Embedder> = Arc::new(candle_bert::CandleBert::load(
        &sandlot_memory::embed::default_model_dir(),
    ));
    let previous = Store::open_unsynced(&dir, previous_model.clone()).unwrap();
    previous.set_vector_scan(VectorScan::Exact);
    // The per-term FTS path, as a peer: same model and int8 scan, but one FTS query per query
    // term for the matched terms, the query embedder on both cores while BM25 runs, and its
    // weights in f32 for the query too.
    let f32_model: Arc<dyn Embedder> = Arc::new(
        MiniLmEmbedder::load_default()
            .unwrap_or_else(|e| panic!("{e}"))
            .with_f32_queries(),
    );
    let per_term = Store::open_unsynced(&dir, f32_model).unwrap();
    per_term.set_text_side(TextSide::PerTermFts);
    // The first vector search loads the matrix into memory (once per process; the daemon keeps it).
    let t = Instant::now();
    let mut q = SearchQuery::new("warm up");
    q.mode = SearchMode::Vector;
    store.search(&q).unwrap();
    let load = ms(t.elapsed());
    previous.search(&q).unwrap();
    per_term.search(&q).unwrap();
    for q in QUERIES.iter().take(5) {
        store.search(&SearchQuery::new(*q)).unwrap();
        previous.search(&SearchQuery::new(*q)).unwrap();
        per_term.search(&SearchQuery::new(*q)).unwrap();
    }
    let rounds = 5;
    let (mut hybrid, mut bm25, mut vector, mut embed) = Default::default();
    let (mut old_hybrid, mut old_vector, mut old_embed) = Default::default();
    let mut per_term_hybrid = Samples::default();
    let (hybrid, bm25, vector, embed): (&mut Samples, &mut Samples, &mut Samples, &mut Samples) =
        (&mut hybrid, &mut bm25, &mut vector, &mut embed);
    let (old_hybrid, old_vector, old_embed): (&mut Samples, &mut Samples, &mut Samples) =
        (&mut old_hybrid, &mut old_vector, &mut old_embed);
    // Agreement of the int8 scan (exact rerank) with the exact f32 scan for the same query
    // vector: the same memories in the same order, per query. And of the whole new path with
    // the previous one.
    let (mut same_top10, mut same_vec50, mut same_prev, mut compared) = (0, 0, 0, 0);
    let mut same_per_term = 0;
    let mut sim_diff = 0f32;
    for round in 0..rounds {
        for q in QUERIES {
            let hits = hybrid.measure(|| store.search(&SearchQuery::new(*q)).unwrap());
            assert_eq!(hits.len(), 10);
            let pt = per_term_hybrid.measure(|| per_term.search(&SearchQuery::new(*q)).unwrap());
            let mut b = SearchQuery::new(*q);
            b.mode = SearchMode::Bm25;
            bm25.measure(|| store.search(&b).unwrap());
            let mut v = SearchQuery::new(*q);
            v.mode = SearchMode::Vector;
            v.limit = 50;
            let vhits = vector.measure(|| store.search(&v).unwrap());
            embed.measure(|| model.embed(&[q]).unwrap());
            let old = old_hybrid.measure(|| previous.search(&SearchQuery::new(*q)).unwrap());
            old_vector.measure(|| previous.search(&v).unwrap());
            old_embed.measure(|| previous_model.embed(&[q]).unwrap());
            if round == 0 {
                let paths = |h: &[sandlot_memory::SearchHit]| {
                    h.iter().map(|h| h.path.clone()).collect::<Vec<_>>()
                };
                store.set_vector_scan(VectorScan::Exact);
                let exact = store.search(&SearchQuery::new(*q)).unwrap();
                let exact_v = store.search(&v).unwrap();
                store.set_vector_scan(VectorScan::Quantized);
                compared += 1;
                same_top10 += usize::from(paths(&hits) == paths(&exact));
                same_vec50 += usize::from(paths(&vhits) == paths(&exact_v));
                same_prev += usize::from(paths(&hits) == paths(&old));
                // Everything a hit reports but the similarity and the fused score (path, line,
                // snippet, ranks); both differ by the 16-bit query weights only, the fused score
                // being the similarity plus the lexical bonus.
                let full = |h: &[sandlot_memory::SearchHit]| {
                    h.iter()
                        .map(|h| {
                            let s = h.similarity.unwrap_or(0.0);
                            let mut h = h.clone();
                            h.similarity = None;
                            h.score = 0.0;
                            (serde_json::to_string(&h).unwrap(), s)
                        })
                        .collect::<Vec<_>>()
                };
                let (a, b) = (full(&hits), full(&pt));
                same_per_term +=
                    usize::from(a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.0 == y.0));
                for (x, y) in a.iter().zip(&b) {
                    sim_diff = sim_diff.max((x.1 - y.1).abs());
                }
            }
        }
    }
    println!(
        "### Search over {nc} chunks ({nf} files, {nv} vectors; ms per query, {} queries)\n",
        hybrid.wall.len()
    );
    println!("| mode | n | p50 | p95 | max | mean CPU (all threads) |\n|---|---|---|---|---|---|");
    let (h50, hc) = hybrid.row(
        "hybrid (query embedding ‖ BM25 + matched terms in Rust; int8 AVX2 scan on the embedding thread + exact rerank, fusion)",
    );
    let (t50, tc) = per_term_hybrid.row(
        "peer: per-term FTS path, hybrid (one FTS query per query term; f32 query embedding on both cores from the start)",
    );
    let (o50, oc) = old_hybrid.row(
        "peer: candle path, hybrid (candle BERT query embedding, exact single-threaded f32 scan)",
    );
    let (_, bc) = bm25.row("peer: BM25 only");
    let (v50, vc) = vector.row("vector only, incl. query embedding");
    let (ov50, ovc) = old_vector.row("peer: candle path, vector only");
    let (e50, ec) = embed.row("query embedding alone");
    let (oe50, oec) = old_embed.row("peer: candle path, query embedding alone (candle BERT)");
    println!(
        "\nhybrid p50 {h50:.1} ms (target <= 20 ms), {:.2}x the candle path's {o50:.1} ms (CPU {:.2}x); \
         vector-only {:.2}x (CPU {:.2}x); query embedding {:.2}x (CPU {:.2}x); \
         mean CPU per hybrid query {hc:.1} ms, of which BM25 alone {bc:.1}, embedding alone {ec:.1}, \
         vector-only minus embedding (filter, scan, rerank, fetch) {:.1}; one-off vector matrix load {load:.0} ms",
        h50 / o50,
        hc / oc,
        v50 / ov50,
        vc / ovc,
        e50 / oe50,
        ec / oec,
        vc - ec,
    );
    println!(
        "hybrid p50 {:.2}x the per-term FTS peer's {t50:.1} ms (CPU {:.2}x, {hc:.1} against {tc:.1} ms); \
         hits identical to it (paths, lines, snippets, ranks): {same_per_term}/{compared} queries, \
         largest difference of a hit's cosine similarity {sim_diff:.1e}",
        h50 / t50,
        hc / tc,
    );
    println!(
        "same results as the exact f32 scan (same query vector): hybrid top-10 {same_top10}/{compared} queries, \
         vector top-50 {same_vec50}/{compared} queries; hybrid top-10 same as the candle path: {same_prev}/{compared}"
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
