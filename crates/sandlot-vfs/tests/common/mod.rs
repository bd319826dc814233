//! Shared test fixtures: a deterministic document tree written to tmpfs so
//! that directory order on disk equals the sorted order the virtual shell uses.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A temporary directory removed on drop.
pub struct TempDir {
    pub path: PathBuf,
}

impl TempDir {
    pub fn new(base: &Path, tag: &str) -> TempDir {
        let path = base.join(format!(
            "sandlot-vfs-{tag}-{}-{}",
            std::process::id(),
            unique()
        ));
        fs::create_dir_all(&path).unwrap();
        TempDir { path }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Small deterministic PRNG (xorshift).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

pub const WORDS: &[&str] = &[
    "rate",
    "limit",
    "Rate",
    "LIMIT",
    "token",
    "bucket",
    "request",
    "quota",
    "error",
    "retry",
    "backoff",
    "api",
    "client",
    "server",
    "timeout",
    "config",
    "deploy",
    "cache",
    "index",
    "query",
    "user",
    "admin",
    "secret",
    "public",
    "docs",
    "guide",
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "for",
    "with",
    "foo",
    "bar",
    "baz",
    "x",
    "y",
    "z",
    "42",
    "3.14",
    "-1",
    "100",
    "7",
    "naïve",
    "café",
    "Über",
    "日本",
    "_under",
    "dash-word",
    "path/like",
    "a.b",
    "[x]",
    "(y)",
    "$z",
    "*",
    "?",
];

/// Generate file contents for the fixture tree: path -> bytes.
pub fn fixture_files(seed: u64) -> BTreeMap<String, Vec<u8>> {
    let mut rng = Rng::new(seed);
    let mut files = BTreeMap::new();
    let dirs = [
        "",
        "docs",
        "docs/api",
        "docs/api/v2",
        "docs/guides",
        "src",
        "src/lib",
        "notes",
        "Notes2",
        "deep/a/b/c",
        ".config",
        "with space",
    ];
    let names = [
        "README.md",
        "intro.md",
        "rate-limits.md",
        "api.txt",
        "CHANGELOG",
        "notes.txt",
        "a10.md",
        "a9.md",
        "B.md",
        "b.md",
        "main.rs",
        "lib.py",
        ".hidden.md",
        "data.csv",
        "x.y.z",
        "-dash.txt",
        "Zeta.MD",
    ];
    for d in dirs {
        let n = 2 + rng.below(5) as usize;
        for _ in 0..n {
            let name = *rng.pick(&names);
            let path = if d.is_empty() {
                name.to_string()
            } else {
                format!("{d}/{name}")
            };
            let lines = rng.below(30) as usize;
            let mut body = String::new();
            for _ in 0..lines {
                let w = 1 + rng.below(12) as usize;
                let mut line = Vec::new();
                for _ in 0..w {
                    line.push(*rng.pick(WORDS));
                }
                match rng.below(10) {
                    0 => body.push('\n'),
                    1 => {
                        body.push('\t');
                        body.push_str(&line.join(" "));
                        body.push('\n');
                    }
                    _ => {
                        body.push_str(&line.join(" "));
                        body.push('\n');
                    }
                }
            }
            if rng.below(6) == 0 && body.ends_with('\n') {
                body.pop(); // no trailing newline
            }
            files.insert(path, body.into_bytes());
        }
    }
    files.insert("empty.txt".into(), Vec::new());
    files.insert(
        "docs/binary.dat".into(),
        b"header rate\0limit\x01\x02 binary rate\n".to_vec(),
    );
    files.insert(
        "docs/latin1.txt".into(),
        b"ok rate line\nbad \xe9 rate line\nrate again\n".to_vec(),
    );
    files.insert("docs/long.md".into(), {
        let mut s = String::new();
        for i in 0..3000 {
            s.push_str(&format!(
                "line {i} of the long document about rate limit number {}\n",
                i * 7 % 13
            ));
        }
        s.into_bytes()
    });
    files.insert(
        "with space/file name.md".into(),
        b"spaced rate limit\n".to_vec(),
    );
    files
}

/// Whether tmpfs lists entries newest-first (older kernels) or oldest-first.
fn newest_first(base: &Path) -> bool {
    let probe = TempDir::new(base, "probe");
    for n in ["a", "b", "c"] {
        fs::write(probe.path.join(n), b"").unwrap();
    }
    let order: Vec<String> = fs::read_dir(&probe.path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    match order.as_slice() {
        [a, b, c] if a == "c" && b == "b" && c == "a" => true,
        [a, b, c] if a == "a" && b == "b" && c == "c" => false,
        other => panic!(
            "cannot control directory order on {}: {other:?}",
            base.display()
        ),
    }
}

/// Write `files` under `root` so that readdir returns every directory's
/// entries in byte-sorted order (what the virtual shell shows).
pub fn write_sorted(root: &Path, files: &BTreeMap<String, Vec<u8>>, mtime: i64) {
    let rev = newest_first(root.parent().unwrap());
    // Children per directory.
    let mut children: BTreeMap<String, Vec<(String, bool)>> = BTreeMap::new();
    for path in files.keys() {
        let parts: Vec<&str> = path.split('/').collect();
        for i in 0..parts.len() {
            let parent = parts[..i].join("/");
            let is_dir = i + 1 < parts.len();
            let e = children.entry(parent).or_default();
            if !e.iter().any(|(n, _)| n == parts[i]) {
                e.push((parts[i].to_string(), is_dir));
            }
        }
    }
    fn create(
        root: &Path,
        rel: &str,
        children: &BTreeMap<String, Vec<(String, bool)>>,
        files: &BTreeMap<String, Vec<u8>>,
        rev: bool,
    ) {
        let mut kids = children.get(rel).cloned().unwrap_or_default();
        kids.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        if rev {
            kids.reverse();
        }
        for (name, is_dir) in &kids {
            let child = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let p = root.join(&child);
            if *is_dir {
                fs::create_dir(&p).unwrap();
            } else {
                fs::write(&p, &files[&child]).unwrap();
            }
        }
        for (name, is_dir) in &kids {
            if *is_dir {
                let child = if rel.is_empty() {
                    name.clone()
                } else {
                    format!("{rel}/{name}")
                };
                create(root, &child, children, files, rev);
            }
        }
    }
    create(root, "", &children, files, rev);
    // Verify order and set times.
    fn check(dir: &Path) {
        let names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        let mut sorted = names.clone();
        sorted.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        assert_eq!(names, sorted, "directory order in {}", dir.display());
        for n in names {
            let p = dir.join(n);
            if p.is_dir() {
                check(&p);
            }
        }
    }
    check(root);
    let status = Command::new("find")
        .arg(root)
        .args(["-exec", "touch", "-h", "-d"])
        .arg(format!("@{mtime}"))
        .args(["{}", "+"])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Run `cmd` with real bash and GNU tools in `dir`, which is bind-mounted
/// read-only inside a private mount namespace (gone when the command exits).
pub fn real_bash(dir: &Path, cmd: &str) -> (Vec<u8>, Vec<u8>, i32) {
    let out = Command::new("unshare")
        .args([
            "-m",
            "--",
            "sh",
            "-c",
            "mount --bind -o ro \"$0\" \"$0\" && cd \"$0\" && exec bash -c \"$1\"",
        ])
        .arg(dir)
        .arg(cmd)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .env("LC_ALL", "C.UTF-8")
        .env("TZ", "UTC")
        .env("HOME", "/")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (out.stdout, out.stderr, out.status.code().unwrap_or(-1))
}

/// Run `cmd` with real bash and GNU tools in `dir`, writable (for the scratch
/// area differential tests; every command there uses relative paths only).
pub fn real_bash_rw(dir: &Path, cmd: &str) -> (Vec<u8>, Vec<u8>, i32) {
    let out = Command::new("bash")
        .arg("-c")
        .arg(cmd)
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .env("LC_ALL", "C.UTF-8")
        .env("TZ", "UTC")
        .env("HOME", "/")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (out.stdout, out.stderr, out.status.code().unwrap_or(-1))
}

/// Fail loudly if a required tool is missing (the set-up script installs them).
pub fn require_tool(tool: &str) {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(
        ok,
        "required tool `{tool}` is not installed; run scripts/setup.d/30-vfs.sh"
    );
}

/// Render an error with its whole source chain, as the CLI does.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Fails the test loudly unless it runs as root (CI does).
pub fn require_root(why: &str) {
    let euid_is_root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        .unwrap_or(false);
    assert!(
        euid_is_root,
        "privileged test: run as root ({why}); CI runs as root"
    );
}
