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

/// The Lee corpus files that `scripts/setup.d/40-memory.sh` extracts from the gensim wheel.
pub fn data_dir() -> PathBuf {
    let d = std::env::var_os("SANDLOT_MEMORY_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/sandlot/data/lee")
        });
    for f in ["lee.cor", "lee_background.cor", "similarities0-1.txt"] {
        assert!(
            d.join(f).is_file(),
            "{} is missing: run `bash scripts/setup.d/40-memory.sh` (it extracts the Lee corpus from the gensim wheel)",
            d.join(f).display()
        );
    }
    d
}

pub fn read_lines(p: PathBuf) -> Vec<String> {
    // The Lee files are Latin-1 in places: decode leniently.
    let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
    let text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => e.into_bytes().iter().map(|&b| b as char).collect(),
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// (index of the story in lee_background.cor, paraphrased query).
pub const PARAPHRASES: &[(usize, &str)] = &[
    (0, "residents told to leave as gales push a wildfire towards a small southern tablelands town"),
    (10, "crews reconnecting electricity after a violent tempest cut supply to many households"),
    (20, "South American president asks lenders to pay retirees and employees to calm unrest"),
    (30, "heterosexual transmission of the virus in the top end is double the countrywide figure"),
    (40, "crews brace for shifting gusts as blazes encircle the harbour city"),
    (50, "militant from the Arabian peninsula captured while comrades hold out in a medical facility"),
    (60, "Jewish state stops the Palestinian chairman attending the Nativity celebrations"),
    (70, "state leader takes the blame after a psychiatric patient who murdered a teen escaped abroad"),
    (80, "African nation warned it may be expelled from the group of former British colonies over land seizures"),
    (90, "campaigners demand the viceroy step down over how he handled molestation complaints at a church boarding school"),
    (100, "inquest finds an Indigenous youth who took his own life in juvenile jail should never have been locked up"),
    (110, "Islamist militants switch strategy to hit infrastructure instead of civilians"),
    (120, "airline engineers threaten escalating strikes unless the carrier accepts independent adjudication of their pay fight"),
    (130, "ailing ex-strongman of Jakarta recovering after receiving breathing assistance"),
    (140, "al-Qaeda chief admits on recorded footage that he orchestrated the 2001 hijackings"),
    (150, "finance employees walk off the job at major lenders to coincide with shareholder meetings"),
    (160, "first criminal charge laid over the hijackings, against a man who took aviation classes"),
    (170, "American central bank lowers borrowing costs to the lowest level in four decades"),
    (180, "Pacific island agrees to take more refugees in return for millions in assistance"),
    (190, "man imprisoned for felling protected tropical trees in a heritage listed area"),
    (200, "footage recovered in Afghanistan shows the Saudi exile knew about the plot beforehand"),
    (210, "Indian police charge a man who trained as an aviator down under and confessed to plotting strikes"),
    (220, "militant group threatens Palestinian Authority officials if its spiritual leader is hurt"),
    (230, "Swiss adventure guides deny blame for the flash flood deaths of tourists in a gorge"),
    (240, "slow vote tallying in the Pacific nation's poll amid fears of ballot fraud"),
    (250, "Israeli jets and helicopters bomb Palestinian territories and strike near the leader's headquarters"),
    (260, "travel agency chain collapses leaving hundreds out of work"),
    (270, "tycoons ask Canberra to curb the national carrier's market power to help revive a failed airline"),
    (280, "environmental party secures another upper house seat, unseating a long serving senator"),
    (290, "another bovine spongiform encephalopathy case found in Japanese cattle"),
];
