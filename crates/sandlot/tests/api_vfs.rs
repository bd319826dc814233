//! Virtual filesystem collections and shell sessions through a real daemon:
//! uploads and daemon-side sources, ACL pruning before a session starts, cwd kept
//! across runs, limits, idle expiry, audit, re-ingest, tenant isolation, the CLI.

mod api_support;

use std::path::Path;
use std::time::Duration;

use api_support::vfs::{acl, body, tar_of};
use api_support::{rt, Daemon};
use sandlot_client::vfs::{
    CreateCollection, IngestCollection, OpenSession, UploadFormat, VfsAcl, VfsAclRule, VfsSource,
};
use sandlot_client::Client;

const SITE: &[(&str, &str)] = &[
    (
        "docs/guide.md",
        "# Guide\nThe API has a rate limit of 10 requests.\nSee limits.\n",
    ),
    (
        "docs/faq.md",
        "Q: what is the rate limit?\nA: ten per second\n",
    ),
    (
        "internal/secret.md",
        "the rate limit bypass token is hunter2\n",
    ),
    ("README.md", "hello\n"),
];

fn status(e: &sandlot_client::Error) -> (u16, String) {
    (
        e.status().map(|s| s.as_u16()).unwrap_or(0),
        e.code().unwrap_or("").to_string(),
    )
}

async fn open(c: &Client, coll: &str, who: &str, groups: &[&str]) -> String {
    c.open_vfs_session(
        coll,
        &OpenSession {
            principal: who.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            version: None,
            all_access: false,
            ..OpenSession::default()
        },
    )
    .await
    .unwrap()
    .id
}

#[test]
fn vfs_sessions_prune_by_acl_keep_cwd_and_are_audited() {
    let d = Daemon::start(Some(
        "[vfs]\nmax_commands = 12\nmax_output = \"200\"\nsession_idle_timeout = \"4s\"\n",
    ));
    let c = d.client();
    rt().block_on(async {
        let a = c
            .create_collection_upload("docs", UploadFormat::Tar, &acl(), body(tar_of(SITE)))
            .await
            .unwrap();
        assert_eq!(a.collection.name, "docs");
        assert_eq!(a.collection.documents, 4);
        assert_eq!(a.collection.source, "upload:tar");
        assert_eq!((a.ingest.version, a.ingest.added), (1, 4));
        // The staged upload is gone once ingested.
        assert!(!d.data_dir().join("vfs/uploads/default/docs").exists());
        let l = c.list_collections().await.unwrap();
        assert_eq!(l.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["docs"]);
        // A second create of the same name is a conflict.
        let e = c
            .create_collection_upload("docs", UploadFormat::Tar, &acl(), body(tar_of(SITE)))
            .await
            .unwrap_err();
        assert_eq!(status(&e), (409, "already_exists".into()), "{e}");

        // alice (no groups) never sees internal/, by any path.
        let s = open(&c, "docs", "alice", &[]).await;
        let r = c.vfs_run("docs", &s, "ls /").await.unwrap();
        assert_eq!((r.stdout.as_str(), r.exit_code), ("README.md\ndocs\n", 0));
        let r = c.vfs_run("docs", &s, "cat /internal/secret.md").await.unwrap();
        assert_eq!(r.exit_code, 1);
        assert_eq!(
            r.stderr,
            "cat: /internal/secret.md: No such file or directory\n"
        );
        let r = c
            .vfs_run("docs", &s, "grep -rn 'rate limit' / | head")
            .await
            .unwrap();
        assert_eq!(
            r.stdout,
            "/docs/faq.md:1:Q: what is the rate limit?\n/docs/guide.md:2:The API has a rate limit of 10 requests.\n"
        );
        assert!(!r.truncated);
        // cwd is kept across runs.
        let r = c.vfs_run("docs", &s, "cd docs && pwd").await.unwrap();
        assert_eq!(r.stdout, "/docs\n");
        assert_eq!(r.cwd, "/docs");
        let r = c.vfs_run("docs", &s, "ls").await.unwrap();
        assert_eq!(r.stdout, "faq.md\nguide.md\n");
        // Writes fail like on a read-only mount.
        let r = c.vfs_run("docs", &s, "echo x > new.md").await.unwrap();
        assert_eq!(r.exit_code, 1);
        assert!(r.stderr.contains("Read-only file system"), "{}", r.stderr);
        // Output is cut at vfs.max_output (200 bytes).
        let r = c
            .vfs_run("docs", &s, "cat guide.md faq.md guide.md faq.md guide.md")
            .await
            .unwrap();
        assert!(r.truncated, "{r:?}");
        assert!(r.stdout.len() <= 200, "{r:?}");
        assert!(r.stdout.starts_with("# Guide\n"), "{r:?}");
        let v = c.get_vfs_session("docs", &s).await.unwrap();
        assert_eq!((v.cwd.as_str(), v.commands_run, v.documents), ("/docs", 7, 3));

        // bob in eng sees the internal document.
        let sb = open(&c, "docs", "bob", &["eng"]).await;
        let r = c
            .vfs_run("docs", &sb, "grep -rl hunter2 /")
            .await
            .unwrap();
        assert_eq!(r.stdout, "/internal/secret.md\n");

        // The audit log has every command with its principal.
        let recs = c.vfs_audit("docs", None, None).await.unwrap();
        assert_eq!(recs.len(), 8);
        assert_eq!(recs[0].command, "ls /");
        assert_eq!(recs[0].principal, "alice");
        assert_eq!(recs[0].session, s);
        assert_eq!(recs[7].principal, "bob");
        let bob = c.vfs_audit("docs", Some("bob"), None).await.unwrap();
        assert_eq!(bob.len(), 1);
        assert_eq!(bob[0].stdout_bytes, 20);
        let last = c.vfs_audit("docs", None, Some(2)).await.unwrap();
        assert_eq!(last.len(), 2);

        // The command limit (12) ends the session's runs with 429.
        for _ in 0..5 {
            c.vfs_run("docs", &s, "true").await.unwrap();
        }
        let e = c.vfs_run("docs", &s, "true").await.unwrap_err();
        assert_eq!(status(&e), (429, "limit".into()), "{e}");

        // Closing a session: later runs are 404.
        let s2 = open(&c, "docs", "carol", &[]).await;
        c.close_vfs_session("docs", &s2).await.unwrap();
        let e = c.vfs_run("docs", &s2, "ls").await.unwrap_err();
        assert_eq!(status(&e), (404, "not_found".into()));

        // Re-ingest: the same upload changes nothing; an edit publishes v2, and a
        // session opened before keeps browsing v1.
        let old = open(&c, "docs", "dave", &[]).await;
        let r = c
            .ingest_collection_upload("docs", UploadFormat::Tar, None, body(tar_of(SITE)))
            .await
            .unwrap();
        assert!(!r.ingest.changed, "{r:?}");
        assert_eq!(r.ingest.version, 1);
        // (keeps `old` from going idle on a slow machine)
        c.vfs_run("docs", &old, "true").await.unwrap();
        let mut edited = SITE.to_vec();
        edited[3] = ("README.md", "hello again\n");
        let r = c
            .ingest_collection_upload("docs", UploadFormat::Tar, None, body(tar_of(&edited)))
            .await
            .unwrap();
        assert!(r.ingest.changed);
        assert_eq!((r.ingest.version, r.ingest.updated, r.ingest.unchanged), (2, 1, 3));
        // The ACL policy carried over from the create.
        assert_eq!(r.collection.documents, 4);
        let fresh = open(&c, "docs", "erin", &[]).await;
        assert_eq!(
            c.vfs_run("docs", &fresh, "cat /README.md").await.unwrap().stdout,
            "hello again\n"
        );
        assert_eq!(
            c.vfs_run("docs", &old, "cat /README.md").await.unwrap().stdout,
            "hello\n"
        );
        assert_eq!(
            c.vfs_run("docs", &fresh, "ls /internal").await.unwrap().exit_code,
            2
        );
        // An uploaded collection cannot be re-ingested from a stored source.
        let e = c
            .ingest_collection("docs", &IngestCollection::default())
            .await
            .unwrap_err();
        assert_eq!(status(&e).0, 409, "{e}");

        // Idle sessions expire (4 s here).
        let idle = open(&c, "docs", "ida", &[]).await;
        tokio::time::sleep(Duration::from_millis(4600)).await;
        let e = c.vfs_run("docs", &idle, "ls").await.unwrap_err();
        assert_eq!(status(&e), (404, "not_found".into()), "{e}");
        assert_eq!(c.get_collection("docs").await.unwrap().sessions, 0);

        // Removing the collection closes its sessions.
        let last = open(&c, "docs", "lee", &[]).await;
        c.delete_collection("docs").await.unwrap();
        let e = c.vfs_run("docs", &last, "ls").await.unwrap_err();
        assert_eq!(status(&e), (404, "not_found".into()));
        assert!(c.list_collections().await.unwrap().is_empty());
    });
}

#[test]
fn vfs_collections_belong_to_their_tenant() {
    let d = Daemon::start(None);
    let ta = d.token("alpha");
    let tb = d.token("beta");
    let a = d.tcp(Some(&ta));
    let b = d.tcp(Some(&tb));
    rt().block_on(async {
        a.create_collection_upload("kb", UploadFormat::Tar, &acl(), body(tar_of(SITE)))
            .await
            .unwrap();
        let s = open(&a, "kb", "alice", &["eng"]).await;
        let nf =
            |e: sandlot_client::Error| assert_eq!(status(&e), (404, "not_found".into()), "{e}");
        // beta cannot see, open, run in, audit, re-ingest or delete alpha's collection.
        assert!(b.list_collections().await.unwrap().is_empty());
        nf(b.get_collection("kb").await.unwrap_err());
        nf(b.open_vfs_session(
            "kb",
            &OpenSession {
                principal: "mallory".into(),
                groups: vec!["eng".into()],
                version: None,
                all_access: false,
                ..OpenSession::default()
            },
        )
        .await
        .unwrap_err());
        nf(b.vfs_run("kb", &s, "cat /internal/secret.md")
            .await
            .unwrap_err());
        nf(b.get_vfs_session("kb", &s).await.unwrap_err());
        nf(b.close_vfs_session("kb", &s).await.unwrap_err());
        nf(b.vfs_audit("kb", None, None).await.unwrap_err());
        nf(b.ingest_collection("kb", &IngestCollection::default())
            .await
            .unwrap_err());
        nf(b.delete_collection("kb").await.unwrap_err());
        // beta's own collection of the same name is a different one.
        b.create_collection_upload(
            "kb",
            UploadFormat::Tar,
            &VfsAcl::default(),
            body(tar_of(&[("only-beta.txt", "b\n")])),
        )
        .await
        .unwrap();
        let sb = open(&b, "kb", "bea", &[]).await;
        assert_eq!(
            b.vfs_run("kb", &sb, "ls /").await.unwrap().stdout,
            "only-beta.txt\n"
        );
        // alpha's session is untouched.
        let r = a
            .vfs_run("kb", &s, "cat /internal/secret.md")
            .await
            .unwrap();
        assert_eq!(r.stdout, "the rate limit bypass token is hunter2\n");
        // Through the operator socket, the tenant header selects whose collections.
        let op = d.client().with_tenant(Some("beta".into()));
        let l = op.list_collections().await.unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].documents, 1);
        assert!(d.client().list_collections().await.unwrap().is_empty());
    });
}

#[test]
fn vfs_daemon_side_sources_jsonl_and_bad_input() {
    let d0 = Daemon::start(None);
    let src = d0.dir.join("site");
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("a/one.txt"), "one\n").unwrap();
    std::fs::write(src.join("two.txt"), "two\n").unwrap();
    let outside = d0.dir.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let c0 = d0.client();
    rt().block_on(async {
        // Without vfs.allowed_source_paths, host paths are refused.
        let e = c0
            .create_collection(&CreateCollection {
                name: "site".into(),
                source: VfsSource::Dir {
                    path: src.display().to_string(),
                },
                acl: None,
            })
            .await
            .unwrap_err();
        assert_eq!(status(&e), (403, "forbidden".into()), "{e}");
        // S3 endpoints need allowing too.
        let e = c0
            .create_collection(&CreateCollection {
                name: "s3".into(),
                source: VfsSource::S3 {
                    bucket: "b".into(),
                    prefix: String::new(),
                    endpoint: "http://127.0.0.1:1".into(),
                    region: None,
                    access_key_id: None,
                    secret_access_key: None,
                    session_token: None,
                },
                acl: None,
            })
            .await
            .unwrap_err();
        assert_eq!(status(&e), (403, "forbidden".into()), "{e}");
    });
    drop(d0);

    let root = std::env::temp_dir().join(format!("sandlot-vfs-src-{}", std::process::id()));
    let site = root.join("site");
    std::fs::create_dir_all(site.join("a")).unwrap();
    std::fs::write(site.join("a/one.txt"), "one\n").unwrap();
    std::fs::write(site.join("two.txt"), "two\n").unwrap();
    let d = Daemon::start(Some(&format!(
        "[vfs]\nallowed_source_paths = [\"{}\"]\n",
        site.display()
    )));
    let c = d.client();
    rt().block_on(async {
        let a = c
            .create_collection(&CreateCollection {
                name: "site".into(),
                source: VfsSource::Dir {
                    path: site.display().to_string(),
                },
                acl: Some(VfsAcl {
                    default: Some("none".into()),
                    rules: vec![VfsAclRule {
                        pattern: "a/**".into(),
                        acl: "public".into(),
                    }],
                }),
            })
            .await
            .unwrap();
        assert_eq!(a.collection.documents, 2);
        let s = open(&c, "site", "anyone", &[]).await;
        let r = c.vfs_run("site", &s, "find / -type f").await.unwrap();
        assert_eq!(r.stdout, "/a/one.txt\n");
        // Re-ingest from the stored source picks up changes.
        std::fs::write(site.join("a/three.txt"), "three\n").unwrap();
        let r = c
            .ingest_collection("site", &IngestCollection::default())
            .await
            .unwrap();
        assert_eq!((r.ingest.version, r.ingest.added, r.ingest.fetched), (2, 1, 1));

        // A JSONL chunk export upload: chunks are joined per document, and an
        // ACL in a row's metadata applies.
        let jsonl = concat!(
            r#"{"path": "kb/a.md", "chunk": 1, "text": "second\n"}"#,
            "\n",
            r#"{"path": "kb/a.md", "chunk": 0, "text": "first\n"}"#,
            "\n",
            r#"{"path": "kb/private.md", "chunk": 0, "text": "p\n", "metadata": {"groups": ["hr"]}}"#,
            "\n"
        );
        let a = c
            .create_collection_upload(
                "vec",
                UploadFormat::Jsonl,
                &VfsAcl::default(),
                body(jsonl.as_bytes().to_vec()),
            )
            .await
            .unwrap();
        assert_eq!(a.collection.source, "upload:jsonl");
        let s = open(&c, "vec", "x", &[]).await;
        let r = c.vfs_run("vec", &s, "cat kb/a.md; ls kb").await.unwrap();
        assert_eq!(r.stdout, "first\nsecond\na.md\n");

        // Bad input: each error names the problem.
        let raw = |m: &str, p: &str, b: &str| {
            let (st, v) = d.raw(m, p, b);
            (st, v["error"]["field"].as_str().unwrap_or("").to_string(), v)
        };
        let (st, f, v) = raw("POST", "/v1/vfs", r#"{"name": "x", "source": {"kind": "dir", "path": "/tmp"}, "acll": 1}"#);
        assert_eq!((st, f.as_str()), (400, "acll"), "{v}");
        let (st, f, v) = raw("POST", "/v1/vfs", r#"{"name": "x", "source": {"kind": "ftp"}}"#);
        assert_eq!(st, 400, "{v}");
        assert!(f.starts_with("source"), "{v}");
        let (st, f, v) = raw(
            "POST",
            "/v1/vfs",
            &format!(r#"{{"name": "../x", "source": {{"kind": "dir", "path": "{}"}}}}"#, site.display()),
        );
        assert_eq!((st, f.as_str()), (400, "name"), "{v}");
        let (st, f, v) = raw(
            "POST",
            "/v1/vfs",
            &format!(r#"{{"name": "y", "source": {{"kind": "dir", "path": "{}"}}, "acl": {{"rules": [{{"pattern": "x", "acl": "group:a b"}}]}}}}"#, site.display()),
        );
        assert_eq!((st, f.as_str()), (400, "acl.rules[0].acl"), "{v}");
        let (st, f, v) = raw("POST", "/v1/vfs/site/sessions", r#"{"principal": ""}"#);
        assert_eq!((st, f.as_str()), (400, "principal"), "{v}");
        let (st, f, v) = raw("POST", "/v1/vfs/site/sessions", r#"{"principal": "a", "group": ["x"]}"#);
        assert_eq!((st, f.as_str()), (400, "group"), "{v}");
        let (st, _, v) = raw("POST", "/v1/vfs/site/sessions", r#"{"principal": "a", "version": 9}"#);
        assert_eq!(st, 404, "{v}");
        let (st, _, v) = raw("POST", "/v1/vfs/nope/sessions", r#"{"principal": "a"}"#);
        assert_eq!(st, 404, "{v}");
        let (st, f, v) = raw("POST", &format!("/v1/vfs/vec/sessions/{s}/run"), r#"{"cmd": "ls"}"#);
        assert_eq!((st, f.as_str()), (400, "cmd"), "{v}");
        // Not a tar archive.
        let e = c
            .create_collection_upload("junk", UploadFormat::Tar, &VfsAcl::default(), body(vec![7u8; 1024]))
            .await
            .unwrap_err();
        assert_eq!(status(&e).0, 400, "{e}");
        assert!(e.to_string().contains("tar stream"), "{e}");
        assert!(c.get_collection("junk").await.is_err());
        // A malformed JSONL row names its line, and nothing is created.
        let e = c
            .create_collection_upload("junk", UploadFormat::Jsonl, &VfsAcl::default(), body(b"{\"path\": \"a\", \"chunk\": 0, \"text\": \"x\"}\nnot json\n".to_vec()))
            .await
            .unwrap_err();
        assert_eq!(status(&e).0, 400, "{e}");
        assert!(e.to_string().contains("the upload, line 2"), "{e}");
        assert!(c.get_collection("junk").await.is_err());
        assert!(!d.data_dir().join("vfs/uploads/default/junk.jsonl").exists());
    });
    drop(d);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn vfs_cli_goes_through_the_daemon() {
    let d = Daemon::start(None);
    let site = d.dir.join("site");
    std::fs::create_dir_all(site.join("guides")).unwrap();
    std::fs::create_dir_all(site.join("internal")).unwrap();
    std::fs::write(site.join("guides/limits.md"), "the rate limit is 10/s\n").unwrap();
    std::fs::write(site.join("internal/ops.md"), "rate limit override\n").unwrap();
    let s = site.display().to_string();
    let (code, out, err) = d.cli(&[
        "vfs",
        "create",
        "docs",
        "--from",
        &s,
        "--acl",
        "internal/**=group:ops",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("docs v1: 2 documents"), "{out}");
    let (code, out, _) = d.cli(&["vfs", "ls"]);
    assert_eq!(code, 0);
    assert!(out.lines().nth(1).unwrap().starts_with("docs "), "{out}");
    assert!(out.contains("upload:tar"), "{out}");
    // Without a principal: the owner sees everything.
    let (code, out, err) = d.cli(&["vfs", "sh", "docs", "grep -rn 'rate limit' / | head"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "/guides/limits.md:1:the rate limit is 10/s\n/internal/ops.md:1:rate limit override\n"
    );
    // As a principal: pruned; the exit status is the command line's.
    let (code, out, err) = d.cli(&[
        "vfs",
        "sh",
        "docs",
        "cat /internal/ops.md",
        "--principal",
        "alice",
    ]);
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(err, "cat: /internal/ops.md: No such file or directory\n");
    // Limits are the operator's through the daemon.
    let (code, _, err) = d.cli(&["vfs", "sh", "docs", "ls", "--timeout", "1"]);
    assert_eq!(code, 125);
    assert!(err.contains("--local"), "{err}");
    // Re-upload after an edit: only the change is ingested.
    std::fs::write(site.join("guides/new.md"), "new\n").unwrap();
    let (code, out, err) = d.cli(&["vfs", "update", "docs", "--from", &s]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("v2: 3 documents") && out.contains("1 added"),
        "{out}"
    );
    let (code, out, _) = d.cli(&["vfs", "log", "docs"]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(out.contains(" alice docs@v1 exit=1 "), "{out}");
    // The sessions were closed by the CLI.
    let (_, out, _) = d.cli(&["vfs", "ls", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["sessions"], 0, "{out}");
    let (code, out, _) = d.cli(&["vfs", "rm", "docs"]);
    assert_eq!((code, out.as_str()), (0, "removed docs\n"));
    let (code, _, err) = d.cli(&["vfs", "sh", "docs", "ls"]);
    assert_eq!(code, 125);
    assert!(err.contains("no collection docs"), "{err}");
    // --local works on a data directory, apart from the daemon's collections.
    let local = d.dir.join("local");
    let (code, out, err) = d.cli(&[
        "vfs",
        "--local",
        "--data-dir",
        &local.display().to_string(),
        "create",
        "l",
        "--from",
        &s,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let (_, out, _) = d.cli(&["vfs", "ls", "--json"]);
    assert_eq!(out.trim(), "[]");
}

#[test]
fn scratch_writes_are_private_to_their_session_and_freed_on_close() {
    let d = Daemon::start(Some(
        "[vfs]\nscratch_default_size = \"1K\"\nscratch_max_size = \"4K\"\n",
    ));
    let c = d.client();
    rt().block_on(async {
        c.create_collection_upload("docs", UploadFormat::Tar, &acl(), body(tar_of(SITE)))
            .await
            .unwrap();
        let scratch = |max: Option<u64>| OpenSession {
            principal: "alice".into(),
            scratch: true,
            scratch_max_bytes: max,
            ..OpenSession::default()
        };
        let a = c.open_vfs_session("docs", &scratch(None)).await.unwrap();
        let sc = a.scratch.clone().expect("a scratch area");
        assert_eq!((sc.used_bytes, sc.max_bytes), (0, 1024));
        let b = open(&c, "docs", "bob", &[]).await;

        // Session A writes, renames, removes; its reads see the merged view.
        let r = c
            .vfs_run(
                "docs",
                &a.id,
                "mkdir /notes && echo 'rate limit dr''aft' > /notes/a.md && mv /docs/faq.md /notes/ && rm /README.md && ls / /notes",
            )
            .await
            .unwrap();
        assert_eq!(
            (r.stdout.as_str(), r.stderr.as_str(), r.exit_code),
            ("/:\ndocs\nnotes\n\n/notes:\na.md\nfaq.md\n", "", 0)
        );
        let r = c
            .vfs_run("docs", &a.id, "grep -rl 'rate limit' /")
            .await
            .unwrap();
        assert_eq!(r.stdout, "/docs/guide.md\n/notes/a.md\n/notes/faq.md\n");
        // A pruned document's name is simply free: nothing of it shows.
        let r = c
            .vfs_run(
                "docs",
                &a.id,
                "mkdir /internal && touch /internal/secret.md && wc -c /internal/secret.md && grep -r hunter2 /",
            )
            .await
            .unwrap();
        assert_eq!(
            (r.stdout.as_str(), r.exit_code),
            ("0 /internal/secret.md\n", 1)
        );
        let v = c.get_vfs_session("docs", &a.id).await.unwrap();
        let sc = v.scratch.expect("a scratch area");
        assert_eq!(sc.used_bytes, "rate limit draft\n".len() as u64);
        assert_eq!(sc.entries, 4, "{sc:?}");
        // The size limit is the GNU ENOSPC error.
        let r = c
            .vfs_run("docs", &a.id, "seq 1000 > /big; wc -c < /big")
            .await
            .unwrap();
        assert_eq!(r.stderr, "seq: write error: No space left on device\n");
        assert_eq!(
            r.stdout,
            format!("{}\n", 1024 - "rate limit draft\n".len())
        );

        // Session B (and so the collection) sees none of it, and cannot write.
        let r = c.vfs_run("docs", &b, "ls / /docs").await.unwrap();
        assert_eq!(
            r.stdout,
            "/:\nREADME.md\ndocs\n\n/docs:\nfaq.md\nguide.md\n"
        );
        let r = c.vfs_run("docs", &b, "touch /x").await.unwrap();
        assert_eq!(
            (r.stderr.as_str(), r.exit_code),
            ("touch: cannot touch '/x': Read-only file system\n", 1)
        );

        // Closed: the scratch area is gone; a new session starts from the collection.
        c.close_vfs_session("docs", &a.id).await.unwrap();
        let e = c.vfs_run("docs", &a.id, "ls /notes").await.unwrap_err();
        assert_eq!(status(&e).0, 404, "{e}");
        let a2 = c
            .open_vfs_session("docs", &scratch(Some(4096)))
            .await
            .unwrap();
        assert_eq!(a2.scratch.as_ref().map(|s| s.max_bytes), Some(4096));
        let r = c
            .vfs_run("docs", &a2.id, "ls /; cat /notes/a.md")
            .await
            .unwrap();
        assert_eq!(r.stdout, "README.md\ndocs\n");
        assert_eq!(r.stderr, "cat: /notes/a.md: No such file or directory\n");
        // Nothing of the scratch area ever reached the daemon's disk (the
        // command lines in the audit log spell the content differently).
        let leaked: Vec<_> = walk_files(&d.data_dir())
            .into_iter()
            .filter(|p| {
                std::fs::read(p).is_ok_and(|b| b.windows(16).any(|w| w == b"rate limit draft"))
            })
            .collect();
        assert!(leaked.is_empty(), "scratch content on disk: {leaked:?}");

        // Over the operator's maximum, or a size without scratch: 400 naming the field.
        for req in [
            scratch(Some(4097)),
            OpenSession {
                principal: "x".into(),
                scratch_max_bytes: Some(10),
                ..OpenSession::default()
            },
        ] {
            let e = c.open_vfs_session("docs", &req).await.unwrap_err();
            assert_eq!(status(&e).0, 400, "{e}");
            assert!(e.to_string().contains("scratch_max_bytes"), "{e}");
        }
    });

    // The CLI through the daemon: a scratch area lives as long as one `sh`.
    let (code, out, err) = d.cli(&[
        "vfs",
        "sh",
        "docs",
        "--scratch",
        "echo hi > /n.md && cat /n.md && rm /docs/guide.md && ls /docs",
    ]);
    assert_eq!((code, out.as_str(), err.as_str()), (0, "hi\nfaq.md\n", ""));
    let (code, out, err) = d.cli(&["vfs", "sh", "docs", "cat /n.md; ls /docs"]);
    assert_eq!((code, out.as_str()), (0, "faq.md\nguide.md\n"));
    assert_eq!(err, "cat: /n.md: No such file or directory\n");
    let (code, _, err) = d.cli(&["vfs", "sh", "docs", "--scratch-size", "10", "seq 100 > /s"]);
    assert_eq!(
        (code, err.as_str()),
        (1, "seq: write error: No space left on device\n")
    );
    let (code, _, err) = d.cli(&["vfs", "sh", "docs", "--scratch-size", "1M", "ls"]);
    assert_eq!(code, 125);
    assert!(err.contains("scratch_max_bytes"), "{err}");
    // And with --local, on a data directory.
    let site = d.dir.join("site-scratch");
    std::fs::create_dir_all(site.join("a")).unwrap();
    std::fs::write(site.join("a/x.md"), "x\n").unwrap();
    let local = d.dir.join("local-scratch").display().to_string();
    let (code, out, err) = d.cli(&[
        "vfs",
        "--local",
        "--data-dir",
        &local,
        "create",
        "l",
        "--from",
        &site.display().to_string(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = d.cli(&[
        "vfs",
        "--local",
        "--data-dir",
        &local,
        "sh",
        "l",
        "--scratch",
        "mv /a/x.md /y.md && cp -r /a /b && find / | sort",
    ]);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (0, "/\n/a\n/b\n/y.md\n", "")
    );
    let (code, out, err) = d.cli(&[
        "vfs",
        "--local",
        "--data-dir",
        &local,
        "sh",
        "l",
        "touch /z",
    ]);
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(err, "touch: cannot touch '/z': Read-only file system\n");
}

/// Every regular file under `dir`.
fn walk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// The attack: a collection made from a host directory the operator allowed; the
/// operator then takes that directory off `vfs.allowed_source_paths` (it turned out
/// to hold what tenants must not read) and restarts the daemon. A re-ingest from the
/// stored source used to read the directory anyway, policy or not. It is refused
/// now, as a new source would be, and the collection keeps its last version.
#[test]
fn a_reingest_from_a_source_the_operator_no_longer_allows_is_refused() {
    let root = std::env::temp_dir().join(format!("sandlot-vfs-revoked-{}", std::process::id()));
    let site = root.join("site");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("one.txt"), "one\n").unwrap();
    let allowing = format!("[vfs]\nallowed_source_paths = [\"{}\"]\n", site.display());
    let mut d = Daemon::start(Some(&allowing));
    let c = d.client();
    rt().block_on(async {
        let a = c
            .create_collection(&CreateCollection {
                name: "site".into(),
                source: VfsSource::Dir {
                    path: site.display().to_string(),
                },
                acl: None,
            })
            .await
            .unwrap();
        assert_eq!(a.collection.documents, 1);
    });
    std::fs::write(site.join("two.txt"), "written after the policy changed\n").unwrap();
    d.terminate();
    std::fs::write(
        d.config.as_ref().unwrap(),
        "[vfs]\nallowed_source_paths = []\n",
    )
    .unwrap();
    d.spawn();
    let c = d.client();
    rt().block_on(async {
        let e = c
            .ingest_collection("site", &IngestCollection::default())
            .await
            .unwrap_err();
        assert_eq!(status(&e), (403, "forbidden".into()), "{e}");
        let v = c.get_collection("site").await.unwrap();
        assert_eq!((v.version, v.documents), (1, 1), "{v:?}");
    });
    drop(d);
    std::fs::remove_dir_all(&root).unwrap();
}
