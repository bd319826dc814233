//! Ingest from every source kind, and re-ingest fetching only what changed.

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::TempDir;
use sandlot_vfs::{IngestOptions, Limits, Principal, S3Credentials, S3Options, Source, Store};

fn sh(store: &Store, coll: &str, cmd: &str) -> String {
    let c = store.collection(coll).unwrap();
    let mut s = c
        .open_session(Principal::operator(), Limits::default())
        .unwrap();
    let o = s.run(cmd).unwrap();
    assert_eq!(
        o.exit_code,
        0,
        "{cmd}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn write(root: &Path, rel: &str, data: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

#[test]
fn local_directory_reingest_updates_only_changes() {
    let src = TempDir::new(Path::new("/tmp"), "ingest-dir");
    let sd = TempDir::new(Path::new("/tmp"), "ingest-store");
    write(&src.path, "a.md", "alpha\n");
    write(&src.path, "sub/b.md", "beta\n");
    write(&src.path, "sub/c.md", "gamma\n");
    write(&src.path, ".git/HEAD", "ref: x\n");
    let store = Store::open(&sd.path).unwrap();
    let r = store
        .create(
            "d",
            Source::Dir {
                path: src.path.clone(),
            },
            IngestOptions::default(),
        )
        .unwrap();
    assert_eq!((r.version, r.added, r.fetched, r.documents), (1, 3, 3, 3));
    assert_eq!(
        sh(&store, "d", "find . -type f"),
        "./a.md\n./sub/b.md\n./sub/c.md\n"
    );

    // Nothing changed: no new version, nothing fetched.
    let r = store.update("d", None, None).unwrap();
    assert!(!r.changed);
    assert_eq!((r.version, r.fetched, r.unchanged), (1, 0, 3));

    // Change one, remove one, add one.
    std::thread::sleep(Duration::from_millis(20));
    write(&src.path, "sub/b.md", "beta v2\n");
    std::fs::remove_file(src.path.join("sub/c.md")).unwrap();
    write(&src.path, "new/d.md", "delta\n");
    let r = store.update("d", None, None).unwrap();
    assert!(r.changed);
    assert_eq!(
        (
            r.version,
            r.added,
            r.updated,
            r.removed,
            r.unchanged,
            r.fetched
        ),
        (2, 1, 1, 1, 1, 2)
    );
    assert_eq!(sh(&store, "d", "cat sub/b.md new/d.md"), "beta v2\ndelta\n");
    assert_eq!(sh(&store, "d", "ls sub"), "b.md\n");
    // Old versions stay readable.
    let c = store.collection("d").unwrap();
    let mut old = c
        .open_session_at(1, Principal::operator(), Limits::default())
        .unwrap();
    assert_eq!(
        old.run("cat sub/b.md sub/c.md").unwrap().stdout,
        b"beta\ngamma\n"
    );
    // The index follows the content.
    assert_eq!(sh(&store, "d", "grep -rl 'beta v2' ."), "./sub/b.md\n");

    let info = store.list().unwrap();
    assert_eq!(info.len(), 1);
    assert_eq!((info[0].version, info[0].documents), (2, 3));
    store.remove("d").unwrap();
    assert!(store.list().unwrap().is_empty());
    assert!(matches!(
        store.collection("d"),
        Err(sandlot_vfs::StoreError::NotFound { .. })
    ));
}

#[test]
fn bad_input_is_rejected_and_leaves_nothing_behind() {
    let sd = TempDir::new(Path::new("/tmp"), "ingest-bad");
    let store = Store::open(&sd.path).unwrap();
    let err = store
        .create(
            "x",
            Source::Dir {
                path: "/nonexistent/sandlot-vfs".into(),
            },
            IngestOptions::default(),
        )
        .unwrap_err();
    assert!(
        common::chain(&err).contains("/nonexistent/sandlot-vfs"),
        "{err}"
    );
    assert!(
        !sd.path.join("collections/x").exists(),
        "half-created collection left behind"
    );
    assert!(store
        .create(
            "../evil",
            Source::Dir {
                path: "/tmp".into()
            },
            IngestOptions::default()
        )
        .is_err());
    let src = TempDir::new(Path::new("/tmp"), "ingest-bad-src");
    write(&src.path, "a", "x");
    store
        .create(
            "ok",
            Source::Dir {
                path: src.path.clone(),
            },
            IngestOptions::default(),
        )
        .unwrap();
    let e = store
        .create(
            "ok",
            Source::Dir {
                path: src.path.clone(),
            },
            IngestOptions::default(),
        )
        .unwrap_err();
    assert_eq!(e.to_string(), "collection \"ok\" already exists");
}

fn git(dir: &Path, args: &[&str]) {
    let st = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .stdout(Stdio::null())
        .status()
        .expect("git is required");
    assert!(st.success(), "git {args:?}");
}

#[test]
fn git_work_tree_ingests_tracked_files_only() {
    common::require_tool("git");
    let repo = TempDir::new(Path::new("/tmp"), "ingest-git");
    let sd = TempDir::new(Path::new("/tmp"), "ingest-git-store");
    git(&repo.path, &["init", "-q"]);
    write(&repo.path, "README.md", "tracked readme\n");
    write(&repo.path, "docs/a.md", "tracked a\n");
    write(&repo.path, ".gitignore", "*.log\n");
    git(&repo.path, &["add", "."]);
    git(&repo.path, &["commit", "-q", "-m", "init"]);
    write(&repo.path, "untracked.md", "not tracked\n");
    write(&repo.path, "debug.log", "ignored\n");
    write(
        &repo.path,
        "docs/a.md",
        "tracked a, edited in the work tree\n",
    );
    let store = Store::open(&sd.path).unwrap();
    let src = Source::parse(
        &format!("git:{}", repo.path.display()),
        S3Options::default(),
    )
    .unwrap();
    let r = store.create("g", src, IngestOptions::default()).unwrap();
    assert_eq!(r.documents, 3);
    assert_eq!(
        sh(&store, "g", "find . -type f | sort"),
        "./.gitignore\n./README.md\n./docs/a.md\n"
    );
    assert_eq!(
        sh(&store, "g", "cat docs/a.md"),
        "tracked a, edited in the work tree\n"
    );
    git(&repo.path, &["rm", "-q", "--cached", "README.md"]);
    let r = store.update("g", None, None).unwrap();
    assert_eq!((r.removed, r.fetched), (1, 0));
    // Not a repository: clear error.
    let plain = TempDir::new(Path::new("/tmp"), "ingest-notgit");
    let e = store
        .create(
            "h",
            Source::Git {
                path: plain.path.clone(),
            },
            IngestOptions::default(),
        )
        .unwrap_err();
    let e = common::chain(&e);
    assert!(e.contains("not a git work tree"), "{e}");
}

fn mkfifo(p: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
}

/// Runs `f` on a thread and waits at most 30 s for it: a read that blocks (a FIFO
/// opened for reading waits for a writer for ever) is a failure, not a hung test.
fn within_30s<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("{what} blocked"))
}

/// A directory source is read without following a symbolic link: not below its root
/// (`linked -> /elsewhere`, `secret.md -> /elsewhere/secret.md` are skipped), and
/// not at it: a source path that goes through a link (which the daemon's policy
/// check resolved, and which could be swapped after it) is refused.
#[test]
fn a_directory_source_never_follows_a_link_below_or_at_its_root() {
    let outside = TempDir::new(Path::new("/tmp"), "ingest-outside");
    write(&outside.path, "secret.md", "host secret\n");
    let src = TempDir::new(Path::new("/tmp"), "ingest-links");
    write(&src.path, "docs/a.md", "a\n");
    std::os::unix::fs::symlink(&outside.path, src.path.join("linked")).unwrap();
    std::os::unix::fs::symlink(outside.path.join("secret.md"), src.path.join("secret.md")).unwrap();
    let sd = TempDir::new(Path::new("/tmp"), "ingest-links-store");
    let store = Store::open(&sd.path).unwrap();
    let r = store
        .create(
            "d",
            Source::Dir {
                path: src.path.clone(),
            },
            IngestOptions::default(),
        )
        .unwrap();
    assert_eq!(r.documents, 1, "{r:?}");
    for name in ["linked", "secret.md"] {
        assert!(
            r.skipped.contains(&format!("{name}: symbolic link")),
            "{:?}",
            r.skipped
        );
    }
    assert_eq!(sh(&store, "d", "grep -rl 'host secret' / || true"), "");
    let alias = TempDir::new(Path::new("/tmp"), "ingest-alias");
    std::os::unix::fs::symlink(&src.path, alias.path.join("src")).unwrap();
    let e = store
        .create(
            "e",
            Source::Dir {
                path: alias.path.join("src"),
            },
            IngestOptions::default(),
        )
        .unwrap_err();
    assert!(common::chain(&e).contains("symbolic link"), "{e}");
}

/// Documents larger than the store's limit are skipped with a reason (the daemon
/// applies its upload limit), FIFOs and other special files are skipped, never
/// opened: the ingest neither blocks on a FIFO nor reads without bound.
#[test]
fn oversized_documents_and_fifos_are_skipped_not_read() {
    let src = TempDir::new(Path::new("/tmp"), "ingest-limits");
    write(&src.path, "small.md", "12345");
    write(&src.path, "big.md", &"x".repeat(100));
    mkfifo(&src.path.join("pipe.md"));
    let sd = TempDir::new(Path::new("/tmp"), "ingest-limits-store");
    let store = std::sync::Arc::new(
        Store::open(&sd.path)
            .unwrap()
            .with_ingest_limits(sandlot_vfs::IngestLimits { max_file_bytes: 10 }),
    );
    let path = src.path.clone();
    let st = store.clone();
    let r = within_30s("the ingest of a directory holding a FIFO", move || {
        st.create("l", Source::Dir { path }, IngestOptions::default())
            .unwrap()
    });
    assert_eq!((r.documents, r.bytes), (1, 5), "{r:?}");
    assert!(
        r.skipped
            .contains(&"big.md: larger than the largest file allowed (10 bytes)".to_string()),
        "{:?}",
        r.skipped
    );
    assert!(
        r.skipped
            .contains(&"pipe.md: not a regular file".to_string()),
        "{:?}",
        r.skipped
    );
    // A JSONL export is one file, under the same limit.
    write(
        &src.path,
        "export.jsonl",
        &format!(
            r#"{{"path": "a", "chunk": 0, "text": "{}"}}"#,
            "y".repeat(20)
        ),
    );
    let e = store
        .create(
            "j",
            Source::Jsonl {
                path: src.path.join("export.jsonl"),
            },
            IngestOptions::default(),
        )
        .unwrap_err();
    assert!(
        common::chain(&e).contains("larger than the largest file allowed"),
        "{e}"
    );
}

/// The attack: a git work tree (an allowed directory a sandbox can write) whose
/// repository configuration is hostile. libgit2 opening the repository reads
/// `.git/config` (and its includes, `commondir`, ...): with the config a FIFO the
/// ingest blocked for ever. The ingest reads only the index file now, through a
/// descriptor it checked: the configuration is never opened, an index that is a
/// FIFO is refused at once, and a `.git` that is a link to another repository is
/// not used.
#[test]
fn a_git_source_reads_only_its_index_never_the_repository_configuration() {
    let wt = TempDir::new(Path::new("/tmp"), "ingest-git-hostile");
    let repo = git2::Repository::init(&wt.path).unwrap();
    write(&wt.path, "a.md", "tracked\n");
    write(&wt.path, "b.md", "untracked\n");
    let mut index = repo.index().unwrap();
    index.add_path(Path::new("a.md")).unwrap();
    index.write().unwrap();
    drop(repo);
    let git_dir = wt.path.join(".git");
    std::fs::remove_file(git_dir.join("config")).unwrap();
    mkfifo(&git_dir.join("config"));
    std::fs::write(git_dir.join("commondir"), "/nonexistent-common\n").unwrap();
    let sd = TempDir::new(Path::new("/tmp"), "ingest-git-hostile-store");
    let store = std::sync::Arc::new(Store::open(&sd.path).unwrap());
    let (st, path) = (store.clone(), wt.path.clone());
    let r = within_30s(
        "the ingest of a repository whose config is a FIFO",
        move || {
            st.create("g", Source::Git { path }, IngestOptions::default())
                .map_err(|e| common::chain(&e))
        },
    )
    .unwrap();
    assert_eq!(r.documents, 1, "{r:?}");
    assert_eq!(sh(&store, "g", "cat a.md"), "tracked\n");

    // The index a FIFO: refused, not waited on.
    std::fs::remove_file(git_dir.join("index")).unwrap();
    mkfifo(&git_dir.join("index"));
    let st = store.clone();
    let e = within_30s(
        "the ingest of a repository whose index is a FIFO",
        move || st.update("g", None, None).map_err(|e| common::chain(&e)),
    )
    .unwrap_err();
    assert!(e.contains(".git/index is not a regular file"), "{e}");

    // `.git` a link to another repository: not used.
    let other = TempDir::new(Path::new("/tmp"), "ingest-git-other");
    git2::Repository::init(&other.path).unwrap();
    std::fs::remove_dir_all(&git_dir).unwrap();
    std::os::unix::fs::symlink(other.path.join(".git"), &git_dir).unwrap();
    let e = store.update("g", None, None).unwrap_err();
    assert!(
        common::chain(&e).contains(".git is not a directory of the work tree"),
        "{e}"
    );
}

#[test]
fn jsonl_chunk_export_reassembles_documents_with_acls() {
    let dir = TempDir::new(Path::new("/tmp"), "ingest-jsonl");
    let f = dir.path.join("export.jsonl");
    std::fs::write(
        &f,
        concat!(
            r#"{"id":"1","document":"Rate limits apply per token.","metadata":{"source":"docs/limits.md","chunk_index":0}}"#, "\n",
            r#"{"id":"2","document":"Bursts of 10 are allowed.","metadata":{"source":"docs/limits.md","chunk_index":1}}"#, "\n",
            r#"{"id":"3","text":"Internal escalation path.","path":"internal/oncall.md","chunk_index":0,"groups":["sre"]}"#, "\n",
        ),
    )
    .unwrap();
    let sd = TempDir::new(Path::new("/tmp"), "ingest-jsonl-store");
    let store = Store::open(&sd.path).unwrap();
    let src = Source::parse(&format!("jsonl:{}", f.display()), S3Options::default()).unwrap();
    let r = store.create("j", src, IngestOptions::default()).unwrap();
    assert_eq!(r.documents, 2);
    assert_eq!(
        sh(&store, "j", "cat docs/limits.md"),
        "Rate limits apply per token.\nBursts of 10 are allowed.\n"
    );
    let c = store.collection("j").unwrap();
    let mut anon = c
        .open_session(Principal::anonymous(), Limits::default())
        .unwrap();
    assert_eq!(
        anon.run("find / -type f").unwrap().stdout,
        b"/docs/limits.md\n"
    );
    let mut sre = c
        .open_session(Principal::new("s", ["sre"]), Limits::default())
        .unwrap();
    assert_eq!(
        sre.run("grep -rl escalation /").unwrap().stdout,
        b"/internal/oncall.md\n"
    );
    // Re-ingest after editing one chunk: only that document changes.
    let text = std::fs::read_to_string(&f)
        .unwrap()
        .replace("Bursts of 10", "Bursts of 20");
    std::fs::write(&f, text).unwrap();
    let r = store.update("j", None, None).unwrap();
    assert_eq!((r.updated, r.unchanged, r.version), (1, 1, 2));
    assert!(sh(&store, "j", "cat docs/limits.md").contains("Bursts of 20"));
}

struct Moto {
    child: Child,
    port: u16,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_moto() -> Moto {
    let found = Command::new("sh")
        .arg("-c")
        .arg("command -v moto_server")
        .stdout(Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(
        found,
        "moto_server is not installed: the S3 ingest test needs it (run scripts/setup.d/30-vfs.sh, which does `pip install 'moto[server]'`)"
    );
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start moto_server");
    let moto = Moto { child, port };
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "moto_server did not start listening on 127.0.0.1:{port}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    moto
}

/// Fill the bucket with an independent client (boto3, which moto depends on).
fn s3_put(port: u16, script: &str) {
    let prog = format!(
        "import boto3\ns3 = boto3.client('s3', endpoint_url='http://127.0.0.1:{port}', aws_access_key_id='testing', \
         aws_secret_access_key='testing', region_name='us-east-1')\n{script}\n"
    );
    let st = Command::new("python3")
        .arg("-c")
        .arg(&prog)
        .status()
        .expect("python3");
    assert!(st.success(), "boto3 script failed:\n{prog}");
}

#[test]
fn s3_bucket_via_moto() {
    let moto = start_moto();
    s3_put(
        moto.port,
        "s3.create_bucket(Bucket='kb-docs')\n\
         s3.put_object(Bucket='kb-docs', Key='site/index.md', Body=b'welcome to the rate limit docs\\n')\n\
         s3.put_object(Bucket='kb-docs', Key='site/api/errors.md', Body=b'429 Too Many Requests\\n')\n\
         s3.put_object(Bucket='kb-docs', Key='site/dir/', Body=b'')\n\
         s3.put_object(Bucket='kb-docs', Key='other/skip.md', Body=b'outside the prefix\\n')",
    );
    let sd = TempDir::new(Path::new("/tmp"), "ingest-s3-store");
    let store = Store::open(&sd.path).unwrap();
    let opts = S3Options {
        endpoint: Some(format!("http://127.0.0.1:{}", moto.port)),
        region: Some("us-east-1".into()),
        allow_http: true,
        credentials: Some(S3Credentials {
            access_key_id: "testing".into(),
            secret_access_key: "testing".into(),
            session_token: None,
        }),
        no_env_credentials: false,
    };
    let src = Source::parse("s3://kb-docs/site", opts.clone()).unwrap();
    let r = store
        .create("s3", src.clone(), IngestOptions::default())
        .unwrap();
    assert_eq!((r.documents, r.fetched), (2, 2), "{r:?}");
    assert_eq!(
        sh(&store, "s3", "find . -type f"),
        "./api/errors.md\n./index.md\n"
    );
    assert_eq!(
        sh(&store, "s3", "grep -rn 'rate limit'"),
        "index.md:1:welcome to the rate limit docs\n"
    );
    // Re-ingest: unchanged objects are not fetched again (ETag match).
    let r = store.update("s3", Some(src.clone()), None).unwrap();
    assert!(!r.changed);
    assert_eq!(r.fetched, 0);
    s3_put(
        moto.port,
        "s3.put_object(Bucket='kb-docs', Key='site/api/errors.md', Body=b'429 and 503\\n')",
    );
    let r = store.update("s3", Some(src), None).unwrap();
    assert_eq!((r.fetched, r.updated, r.unchanged), (1, 1, 1));
    assert_eq!(sh(&store, "s3", "cat api/errors.md"), "429 and 503\n");
    // The persisted config holds no secrets.
    let cfg = std::fs::read_to_string(sd.path.join("collections/s3/collection.json")).unwrap();
    assert!(!cfg.contains("testing"), "credentials persisted: {cfg}");
    // A missing bucket is a clear error.
    let bad = Source::parse("s3://no-such-bucket/x", opts).unwrap();
    let e = store
        .create("s3b", bad, IngestOptions::default())
        .unwrap_err();
    let e = common::chain(&e);
    assert!(e.contains("no-such-bucket"), "{e}");
}
