//! Shared helpers for the integration tests: the real all-MiniLM-L6-v2 embedder (loaded once per
//! test binary), a counting wrapper, and temporary stores that clean up after themselves.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use sandlot_memory::{Author, EmbedError, Embedder, MiniLmEmbedder, Store};

/// The real model. Panics (fails the test) with set-up instructions when it is missing.
pub fn minilm() -> Arc<MiniLmEmbedder> {
    static MODEL: OnceLock<Arc<MiniLmEmbedder>> = OnceLock::new();
    MODEL
        .get_or_init(|| match MiniLmEmbedder::load_default() {
            Ok(m) => Arc::new(m),
            Err(e) => panic!(
                "these tests need the all-MiniLM-L6-v2 weights: {e}\n\
                 run `bash scripts/setup.d/40-memory.sh` first"
            ),
        })
        .clone()
}

/// Counts texts passed to an inner embedder.
pub struct Counting {
    pub inner: Arc<dyn Embedder>,
    pub texts: AtomicU64,
    pub id: String,
}

impl Counting {
    pub fn new(inner: Arc<dyn Embedder>) -> Arc<Counting> {
        let id = inner.model_id().to_string();
        Arc::new(Counting {
            inner,
            texts: AtomicU64::new(0),
            id,
        })
    }
    pub fn count(&self) -> u64 {
        self.texts.load(Ordering::SeqCst)
    }
}

impl Embedder for Counting {
    fn model_id(&self) -> &str {
        &self.id
    }
    fn dim(&self) -> usize {
        self.inner.dim()
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.texts.fetch_add(texts.len() as u64, Ordering::SeqCst);
        self.inner.embed(texts)
    }
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "sandlot-memory-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn agent() -> Author {
    Author::new("agent-7", "agent-7@tenant.example")
}

pub fn new_store(tag: &str, e: Arc<dyn Embedder>) -> (TempDir, Store) {
    let dir = TempDir::new(tag);
    let store = Store::init(dir.path(), e, &agent()).unwrap();
    (dir, store)
}

/// Runs git in `dir` (for simulating a person's direct edits), panicking on failure.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=Person",
            "-c",
            "user.email=person@example.org",
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Polls `f` until it returns true or `secs` pass.
pub fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() > end {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
}
