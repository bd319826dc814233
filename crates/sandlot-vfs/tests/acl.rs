//! ACL pruning: a principal cannot list, read, grep, find, glob or cd into a
//! document it may not see, by any path.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::TempDir;
use sandlot_vfs::{
    Acl, AclPolicy, AclRule, IngestOptions, Limits, Principal, Session, Source, Store,
};

fn fixture() -> BTreeMap<String, Vec<u8>> {
    let mut f = BTreeMap::new();
    f.insert(
        "README.md".into(),
        b"public readme about rate limits\n".to_vec(),
    );
    f.insert("guide/intro.md".into(), b"public guide\n".to_vec());
    f.insert(
        "internal/design.md".into(),
        b"eng only: zebracorn design\n".to_vec(),
    );
    f.insert(
        "internal/deep/plan.md".into(),
        b"eng only: zebracorn plan\n".to_vec(),
    );
    f.insert(
        "hr/salaries.csv".into(),
        b"alice,zebracorn-salary\n".to_vec(),
    );
    f.insert("mixed/ok.md".into(), b"visible to all\n".to_vec());
    f.insert(
        "mixed/secret.md".into(),
        b"hidden zebracorn in mixed\n".to_vec(),
    );
    f
}

fn setup(base: &Path) -> (TempDir, Store) {
    let src = TempDir::new(base, "acl-src");
    for (p, d) in fixture() {
        let full = src.path.join(&p);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, d).unwrap();
    }
    let store_dir = TempDir::new(base, "acl-store");
    let store = Store::open(&store_dir.path).unwrap();
    let policy = AclPolicy {
        default: Acl::public(),
        rules: vec![
            AclRule {
                pattern: "internal/**".into(),
                acl: Acl::groups(["eng"]),
            },
            AclRule {
                pattern: "hr/**".into(),
                acl: Acl::groups(["hr"]),
            },
            AclRule {
                pattern: "mixed/secret.md".into(),
                acl: Acl::groups(["eng", "hr"]),
            },
        ],
    };
    store
        .create(
            "acl",
            Source::Dir {
                path: src.path.clone(),
            },
            IngestOptions { acl: policy },
        )
        .unwrap();
    // The content now lives in the store; the source can go.
    drop(src);
    (store_dir, store)
}

fn run(s: &mut Session, cmd: &str) -> (String, String, i32) {
    let o = s.run(cmd).unwrap();
    (
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
        o.exit_code,
    )
}

/// Every way of reaching content must be blind to the hidden documents.
fn assert_blind(s: &mut Session, hidden_word: &str, hidden_paths: &[&str], hidden_dirs: &[&str]) {
    let probes = [
        "ls -laR /".to_string(),
        "tree -a /".to_string(),
        "find / -print".to_string(),
        format!("grep -r {hidden_word} /"),
        format!("grep -rl {hidden_word} /"),
        format!("grep -rc {hidden_word} /"),
        format!("rg -uu {hidden_word} /"),
        "rg --files -uu /".to_string(),
        "echo /* /*/* /*/*/* /*/*/*/*".to_string(),
        "cat /*/* /*/*/* 2>/dev/null".to_string(),
        "find / -type f -exec cat {} +".to_string(),
    ];
    for p in &probes {
        let (out, err, _) = run(s, p);
        assert!(
            !out.contains(hidden_word) && !err.contains(hidden_word),
            "{p} leaked {hidden_word}: {out}{err}"
        );
        for h in hidden_paths.iter().chain(hidden_dirs) {
            let name = h.rsplit('/').next().unwrap();
            assert!(!out.contains(name), "{p} listed {h}: {out}");
        }
    }
    for h in hidden_paths {
        for path in [
            h.to_string(),
            format!("/{h}"),
            format!("/guide/../{h}"),
            format!("./{h}"),
        ] {
            for cmd in ["cat", "head", "tail", "wc", "grep x"] {
                let (out, err, code) = run(s, &format!("{cmd} {path}"));
                assert_ne!(code, 0, "{cmd} {path} succeeded: {out}");
                assert!(
                    err.contains("No such file or directory"),
                    "{cmd} {path}: {err}"
                );
                assert!(!out.contains(hidden_word));
            }
            let (out, _, code) = run(s, &format!("test -e {path} && echo exists"));
            assert_eq!((out.as_str(), code), ("", 1), "test -e {path}");
            let (_, err, code) = run(s, &format!("ls {path}"));
            assert_eq!(code, 2);
            assert!(err.contains("cannot access"), "{err}");
        }
    }
    for d in hidden_dirs {
        let (_, err, code) = run(s, &format!("cd /{d}"));
        assert_eq!(code, 1, "cd /{d}");
        assert!(err.contains("No such file or directory"), "{err}");
        let (out, err, code) = run(s, &format!("ls /{d}/"));
        assert_eq!(code, 2, "ls {d}: {out}{err}");
        let (out, _, _) = run(s, &format!("echo /{d}/*"));
        assert_eq!(
            out.trim(),
            format!("/{d}/*"),
            "glob expanded inside hidden {d}"
        );
    }
}

#[test]
fn anonymous_sees_only_public_documents() {
    let (_dir, store) = setup(Path::new("/tmp"));
    let coll = store.collection("acl").unwrap();
    let mut s = coll
        .open_session(Principal::anonymous(), Limits::default())
        .unwrap();
    assert_blind(
        &mut s,
        "zebracorn",
        &[
            "internal/design.md",
            "internal/deep/plan.md",
            "hr/salaries.csv",
            "mixed/secret.md",
        ],
        &["internal", "internal/deep", "hr"],
    );
    let (out, _, code) = run(&mut s, "find / -type f | sort");
    assert_eq!(code, 0);
    assert_eq!(out, "/README.md\n/guide/intro.md\n/mixed/ok.md\n");
    assert_eq!(run(&mut s, "ls /mixed").0, "ok.md\n");
}

#[test]
fn group_members_see_their_documents_only() {
    let (_dir, store) = setup(Path::new("/tmp"));
    let coll = store.collection("acl").unwrap();
    let mut eng = coll
        .open_session(Principal::new("erin", ["eng"]), Limits::default())
        .unwrap();
    let (out, _, _) = run(&mut eng, "grep -rl zebracorn / | sort");
    assert_eq!(
        out,
        "/internal/deep/plan.md\n/internal/design.md\n/mixed/secret.md\n"
    );
    assert_blind(&mut eng, "salary", &["hr/salaries.csv"], &["hr"]);

    let mut hr = coll
        .open_session(Principal::new("harry", ["hr"]), Limits::default())
        .unwrap();
    let (out, _, _) = run(&mut hr, "grep -rl zebracorn / | sort");
    assert_eq!(out, "/hr/salaries.csv\n/mixed/secret.md\n");
    assert_blind(
        &mut hr,
        "design",
        &["internal/design.md", "internal/deep/plan.md"],
        &["internal"],
    );

    let mut op = coll
        .open_session(Principal::operator(), Limits::default())
        .unwrap();
    assert_eq!(run(&mut op, "find / -type f | wc -l").0, "7\n");
}

#[test]
fn views_are_shared_per_group_set_and_audited() {
    let (_dir, store) = setup(Path::new("/tmp"));
    let coll = store.collection("acl").unwrap();
    let a = coll.view(&Principal::new("a", ["eng"])).unwrap();
    let b = coll.view(&Principal::new("b", ["eng"])).unwrap();
    assert!(
        std::sync::Arc::ptr_eq(&a, &b),
        "same groups share one pruned view"
    );
    let mut s = coll
        .open_session(Principal::new("auditor", ["eng"]), Limits::default())
        .unwrap();
    s.run("cat /internal/design.md").unwrap();
    s.run("cat /nope").unwrap();
    let recs = store
        .audit_log()
        .read(&sandlot_vfs::AuditFilter {
            principal: Some("auditor".into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0].command, "cat /internal/design.md");
    assert_eq!(recs[0].exit_code, 0);
    assert_eq!(recs[0].stdout_bytes, 27);
    assert_eq!(recs[1].exit_code, 1);
    assert_eq!(recs[1].session, s.id());
}
