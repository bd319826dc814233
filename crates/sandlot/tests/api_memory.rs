//! Memory stores through the daemon (`/v1/memory/...`), with the real all-MiniLM-L6-v2
//! embedder (run `bash scripts/setup.d/40-memory.sh` first): every operation over TCP as a
//! tenant, the memory tool endpoint, tenant isolation (another tenant gets 404), the CLI's
//! `--remote` mode, and a store mounted read-write into a sandbox whose writes the watcher
//! indexes (while `.git` and `.sandlot` stay read-only and symbolic links lead nowhere).
#![cfg(feature = "memory")]

mod api_support;

use std::time::{Duration, Instant};

use api_support::{rt, Daemon};
use serde_json::{json, Value};

fn model_installed() {
    let dir = std::env::var_os("SANDLOT_MODEL_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/sandlot/models/all-MiniLM-L6-v2")
        });
    assert!(
        dir.join("model.safetensors").is_file(),
        "the embedding model is missing at {}: run `bash scripts/setup.d/40-memory.sh`",
        dir.display()
    );
}

fn code(e: &sandlot_client::Error) -> (Option<u16>, Option<&str>) {
    (e.status().map(|s| s.as_u16()), e.code())
}

fn paths(hits: &Value) -> Vec<String> {
    hits["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["path"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn memory_api_end_to_end_and_tenant_isolation() {
    model_installed();
    let d = Daemon::start(None);
    let ta = d.token("alpha");
    let tb = d.token("beta");
    let a = d.tcp(Some(&ta));
    let agent = d.tcp(Some(&ta)).with_agent(Some("planner".into()));
    let b = d.tcp(Some(&tb));
    rt().block_on(async {
        // Stores.
        let s = a
            .call_json("POST", "/v1/memory", Some(&json!({"name": "notes"})))
            .await
            .unwrap();
        assert_eq!((s["name"].as_str(), s["tenant"].as_str()), (Some("notes"), Some("alpha")));
        assert_eq!(s["model"], "all-MiniLM-L6-v2");
        let e = a
            .call_json("POST", "/v1/memory", Some(&json!({"name": "notes"})))
            .await
            .unwrap_err();
        assert_eq!(code(&e), (Some(409), Some("conflict")), "{e}");
        let e = a
            .call_json("POST", "/v1/memory", Some(&json!({"name": "../x"})))
            .await
            .unwrap_err();
        assert_eq!(code(&e).0, Some(400), "{e}");
        let e = a
            .call_json("POST", "/v1/memory", Some(&json!({"name": "n", "size": 1})))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("size"), "{e}");

        // Writes: commits by the agent named in the request (or the tenant), searchable at once.
        let base = "/v1/memory/notes";
        let w = agent
            .call_json(
                "POST",
                &format!("{base}/memories"),
                Some(&json!({"title": "Office move", "folder": "facts", "tags": ["office"],
                    "body": "The team relocated from Dock Street to the riverside building in March."})),
            )
            .await
            .unwrap();
        assert_eq!(w["path"], "facts/office-move.md");
        assert!(w["commit"].as_str().is_some_and(|c| c.len() >= 40), "{w}");
        a.call_json(
            "POST",
            &format!("{base}/memories"),
            Some(&json!({"title": "Ann Lee", "folder": "people", "links": ["facts/office-move"],
                "body": "Ann runs customer success and tracks churn of enterprise accounts."})),
        )
        .await
        .unwrap();
        let e = a
            .call_json(
                "POST",
                &format!("{base}/memories"),
                Some(&json!({"title": "x", "colour": "red"})),
            )
            .await
            .unwrap_err();
        assert!(e.to_string().contains("colour"), "the unknown field is named: {e}");
        // Semantic search: no shared keyword with the memory.
        let hits = a
            .call_json(
                "POST",
                &format!("{base}/search"),
                Some(&json!({"text": "which colleague looks after clients leaving us", "limit": 1})),
            )
            .await
            .unwrap();
        assert_eq!(paths(&hits), vec!["people/ann-lee.md"], "{hits}");
        // Filters and expand.
        let hits = a
            .call_json(
                "POST",
                &format!("{base}/search"),
                Some(&json!({"text": "customer success", "expand": true, "mode": "bm25"})),
            )
            .await
            .unwrap();
        assert_eq!(hits["hits"][0]["related"][0]["path"], "facts/office-move.md", "{hits}");
        let hits = a
            .call_json(
                "POST",
                &format!("{base}/search"),
                Some(&json!({"text": "building", "tags": ["office"]})),
            )
            .await
            .unwrap();
        assert_eq!(paths(&hits), vec!["facts/office-move.md"]);
        let e = a
            .call_json("POST", &format!("{base}/search"), Some(&json!({"text": "x", "mode": "fuzzy"})))
            .await
            .unwrap_err();
        assert_eq!(code(&e).0, Some(400), "{e}");

        // get / edit / move / log / diff / revert / status / reindex.
        let m = a
            .call_json("GET", &format!("{base}/memories/facts/office-move"), None)
            .await
            .unwrap();
        assert_eq!(m["title"], "Office move");
        a.call_json(
            "PATCH",
            &format!("{base}/memories/facts/office-move.md"),
            Some(&json!({"body": "The team relocated to the riverside building in April.", "add_tags": ["moved"]})),
        )
        .await
        .unwrap();
        let mv = a
            .call_json(
                "POST",
                &format!("{base}/move"),
                Some(&json!({"from": "facts/office-move.md", "to": "facts/hq.md"})),
            )
            .await
            .unwrap();
        assert_eq!(mv["path"], "facts/hq.md");
        let log = a
            .call_json("GET", &format!("{base}/log?key=facts/hq.md&limit=10"), None)
            .await
            .unwrap();
        let commits = log["commits"].as_array().unwrap();
        assert_eq!(commits.len(), 3, "add, edit, move (renames followed): {log}");
        assert_eq!(commits[2]["author"], "planner");
        assert_eq!(commits[2]["email"], "planner@alpha.sandlot");
        assert_eq!(commits[0]["author"], "alpha");
        let first = commits[2]["rev"].as_str().unwrap().to_string();
        let old = a
            .call_json("GET", &format!("{base}/memories/facts/office-move.md?rev={first}"), None)
            .await
            .unwrap();
        assert!(old["text"].as_str().unwrap().contains("Dock Street"), "{old}");
        let diff = a
            .call_json("GET", &format!("{base}/diff?from={first}&key=facts/hq.md"), None)
            .await
            .unwrap();
        assert!(diff["diff"].as_str().unwrap().contains("+The team relocated to the riverside building in April."), "{diff}");
        a.call_json(
            "POST",
            &format!("{base}/revert"),
            Some(&json!({"key": "facts/hq.md", "to": first})),
        )
        .await
        .unwrap();
        let m = a.call_json("GET", &format!("{base}/memories/facts/hq.md"), None).await.unwrap();
        assert!(m["body"].as_str().unwrap().contains("Dock Street"), "{m}");
        let e = a
            .call_json("POST", &format!("{base}/revert"), Some(&json!({"key": "facts/hq.md"})))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("to"), "{e}");
        // The store's watcher reconciles what the writes touched on disk in the
        // background (write to searchable within 1 s is the target): wait for it.
        let mut st = serde_json::Value::Null;
        for _ in 0..50 {
            st = a.call_json("GET", &format!("{base}/status?all=true"), None).await.unwrap();
            if st["indexed_files"] == 2 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert_eq!(st["indexed_files"], 2, "{st}");
        assert!(st["files"].as_array().unwrap().iter().all(|f| f["index"] == "fresh"), "{st}");
        let r = a.call_json("POST", &format!("{base}/reindex"), None).await.unwrap();
        assert_eq!(r["texts_embedded"], 0, "reindex keeps vectors: {r}");

        // The Anthropic memory tool, verbatim tool inputs.
        let tool = |input: Value| {
            let agent = agent.clone();
            async move {
                agent
                    .call_json("POST", "/v1/memory/notes/tool", Some(&input))
                    .await
                    .unwrap()
            }
        };
        let out = tool(json!({"command": "create", "path": "/memories/todo.md", "file_text": "- call the zyxel vendor\n"})).await;
        assert_eq!(out, json!({"text": "File created successfully at: /memories/todo.md", "is_error": false}));
        let out = tool(json!({"command": "str_replace", "path": "/memories/todo.md", "old_str": "zyxel", "new_str": "quorvex"})).await;
        assert_eq!(out["is_error"], false, "{out}");
        let out = tool(json!({"command": "insert", "path": "/memories/todo.md", "insert_line": 1, "insert_text": "- renew the lease\n"})).await;
        assert_eq!(out["is_error"], false, "{out}");
        let out = tool(json!({"command": "view", "path": "/memories/todo.md"})).await;
        assert!(out["text"].as_str().unwrap().contains("quorvex") && out["text"].as_str().unwrap().contains("renew"), "{out}");
        let hits = a
            .call_json("POST", &format!("{base}/search"), Some(&json!({"text": "quorvex"})))
            .await
            .unwrap();
        // Hybrid search also returns semantic neighbours; the one memory with the word
        // ranks first.
        assert_eq!(paths(&hits).first().map(String::as_str), Some("todo.md"), "{hits}");
        let out = tool(json!({"command": "rename", "old_path": "/memories/todo.md", "new_path": "/memories/tasks/todo.md"})).await;
        assert_eq!(out["text"], "Successfully renamed /memories/todo.md to /memories/tasks/todo.md");
        let out = tool(json!({"command": "view", "path": "/memories/../etc/passwd"})).await;
        assert_eq!(out["is_error"], true, "{out}");
        let out = tool(json!({"command": "delete", "path": "/memories/tasks/todo.md"})).await;
        assert_eq!(out["is_error"], false, "{out}");
        let hits = a
            .call_json("POST", &format!("{base}/search"), Some(&json!({"text": "quorvex", "mode": "bm25"})))
            .await
            .unwrap();
        assert_eq!(paths(&hits), Vec::<String>::new());
        let log = a.call_json("GET", &format!("{base}/log?limit=1"), None).await.unwrap();
        assert_eq!(log["commits"][0]["message"], "remove tasks/todo.md");
        assert_eq!(log["commits"][0]["author"], "planner");
        let e = d
            .tcp(Some(&ta))
            .with_agent(Some("bad <agent>".into()))
            .call_json("POST", "/v1/memory/notes/tool", Some(&json!({"command": "view", "path": "/memories"})))
            .await
            .unwrap_err();
        assert_eq!(code(&e).0, Some(400), "{e}");

        // Another tenant: 404 for every route of alpha's store, its own list is empty, and it
        // may have a store of the same name that shares nothing.
        let not_found = |e: sandlot_client::Error| {
            assert_eq!(code(&e), (Some(404), Some("not_found")), "{e}");
        };
        not_found(b.call_json("GET", base, None).await.unwrap_err());
        not_found(b.call_json("GET", &format!("{base}/memories/people/ann-lee.md"), None).await.unwrap_err());
        not_found(b.call_json("POST", &format!("{base}/search"), Some(&json!({"text": "churn"}))).await.unwrap_err());
        not_found(b.call_json("POST", &format!("{base}/tool"), Some(&json!({"command": "view", "path": "/memories"}))).await.unwrap_err());
        not_found(b.call_json("GET", &format!("{base}/log"), None).await.unwrap_err());
        not_found(b.call_json("DELETE", base, None).await.unwrap_err());
        let l = b.call_json("GET", "/v1/memory", None).await.unwrap();
        assert_eq!(l, json!({"stores": []}));
        b.call_json("POST", "/v1/memory", Some(&json!({"name": "notes"}))).await.unwrap();
        let hits = b
            .call_json("POST", &format!("{base}/search"), Some(&json!({"text": "churn"})))
            .await
            .unwrap();
        assert_eq!(paths(&hits), Vec::<String>::new());
        let l = a.call_json("GET", "/v1/memory", None).await.unwrap();
        assert_eq!(l, json!({"stores": [{"name": "notes", "tenant": "alpha"}]}));
        // Unknown memory, unknown store.
        not_found(a.call_json("GET", &format!("{base}/memories/nope"), None).await.unwrap_err());
        not_found(a.call_json("GET", "/v1/memory/other", None).await.unwrap_err());
        // Delete.
        b.call_json("DELETE", base, None).await.unwrap();
        not_found(b.call_json("GET", base, None).await.unwrap_err());
        a.call_json("GET", base, None).await.unwrap();
    });
}

#[test]
fn cli_remote_mode_against_the_daemon() {
    model_installed();
    let d = Daemon::start(None);
    let run = |args: &[&str]| {
        let mut all = vec!["memory", "--remote", "cli", "--tenant", "gamma"];
        all.extend_from_slice(args);
        let (rc, out, err) = d.cli(&all);
        assert_eq!(rc, 0, "sandlot {all:?}: {err}");
        out
    };
    assert!(run(&["init"]).contains("created memory store cli"));
    let out = run(&[
        "--agent",
        "cli-bot",
        "add",
        "--title",
        "Quarterly churn",
        "--folder",
        "reports",
        "--body",
        "Enterprise churn fell to four percent after the onboarding revamp.",
    ]);
    assert!(out.contains("added reports/quarterly-churn.md"), "{out}");
    let out = run(&["search", "how many big customers did we lose"]);
    assert!(out.starts_with("reports/quarterly-churn.md:"), "{out}");
    let out = run(&["--json", "search", "onboarding", "--mode", "bm25"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["hits"][0]["path"], "reports/quarterly-churn.md");
    let out = run(&["edit", "reports/quarterly-churn.md", "--add-tag", "q3"]);
    assert!(out.contains("edited reports/quarterly-churn.md"), "{out}");
    let out = run(&["get", "reports/quarterly-churn"]);
    assert!(out.contains("tags:") && out.contains("q3"), "{out}");
    let out = run(&["log"]);
    assert!(
        out.contains("cli-bot") && out.contains("add reports/quarterly-churn.md"),
        "{out}"
    );
    let out = run(&["status"]);
    assert!(out.contains("index fresh"), "{out}");
    let out = run(&["tool", r#"{"command": "view", "path": "/memories"}"#]);
    assert!(out.contains("reports"), "{out}");
    let out = run(&["stores"]);
    assert_eq!(out.trim(), "cli");
    // Errors are reported with the daemon's message and a failing exit code.
    let (rc, _, err) = d.cli(&[
        "memory", "--remote", "cli", "--tenant", "gamma", "get", "nope",
    ]);
    assert_ne!(rc, 0);
    assert!(err.contains("nope"), "{err}");
    let (rc, _, err) = d.cli(&["memory", "--remote", "cli", "--tenant", "delta", "log"]);
    assert_ne!(rc, 0);
    assert!(err.contains("no memory store cli"), "another tenant: {err}");
    let (rc, _, err) = d.cli(&["memory", "--remote", "cli", "--tenant", "gamma", "watch"]);
    assert_ne!(rc, 0);
    assert!(err.contains("local only"), "{err}");
    let out = run(&["delete-store"]);
    assert!(out.contains("deleted memory store cli"), "{out}");
}

#[test]
fn store_mounted_into_a_sandbox_is_indexed_and_guarded() {
    model_installed();
    let d = Daemon::start(None);
    let ta = d.token("alpha");
    let a = d.tcp(Some(&ta));
    rt().block_on(async {
        a.call_json("POST", "/v1/memory", Some(&json!({"name": "shared"}))).await.unwrap();
        a.call_json(
            "POST",
            "/v1/memory/shared/memories",
            Some(&json!({"title": "Seed", "body": "A memory written through the API."})),
        )
        .await
        .unwrap();
        // Unknown store: 400 naming the field.
        let e = a
            .call_json(
                "POST",
                "/v1/sandboxes",
                Some(&json!({"mounts": [{"type": "memory", "store": "nope", "target": "/memories"}]})),
            )
            .await
            .unwrap_err();
        assert_eq!(code(&e).0, Some(400), "{e}");
        assert!(e.to_string().contains("mounts[0].store"), "{e}");
        let sb = a
            .call_json(
                "POST",
                "/v1/sandboxes",
                Some(&json!({"mounts": [{"type": "memory", "store": "shared", "target": "/memories"}]})),
            )
            .await
            .unwrap();
        let id = sb["id"].as_str().unwrap().to_string();
        let sh = |script: &str| {
            let a = a.clone();
            let id = id.clone();
            let script = script.to_string();
            async move { a.run(&id, &["sh", "-c", &script]).await.unwrap() }
        };
        // The sandbox sees the store's files and writes a new memory.
        let o = sh("cat /memories/seed.md").await;
        assert!(String::from_utf8_lossy(&o.stdout).contains("written through the API"));
        let t = Instant::now();
        let o = sh("mkdir -p /memories/agent && printf '# Sandbox note\\nThe vexillology club meets on Thursdays.\\n' > /memories/agent/note.md").await;
        assert_eq!(o.exit.code, Some(0), "{}", String::from_utf8_lossy(&o.stderr));
        let mut found = None;
        while t.elapsed() < Duration::from_secs(10) {
            let hits = a
                .call_json(
                    "POST",
                    "/v1/memory/shared/search",
                    Some(&json!({"text": "vexillology", "mode": "bm25"})),
                )
                .await
                .unwrap();
            if paths(&hits) == vec!["agent/note.md"] {
                found = Some(t.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let found = found.expect("the sandbox's write never became searchable");
        eprintln!("sandbox write searchable after {found:?} (target 1 s)");
        // Semantically too (the watcher embeds it).
        let hits = a
            .call_json(
                "POST",
                "/v1/memory/shared/search",
                Some(&json!({"text": "a society for the study of flags", "mode": "vector", "limit": 1})),
            )
            .await
            .unwrap();
        assert_eq!(paths(&hits), vec!["agent/note.md"], "{hits}");
        // The history, hooks, config and index are read-only inside.
        for target in [
            "/memories/.git/hooks/post-commit",
            "/memories/.git/config",
            "/memories/.sandlot/index.sqlite",
            "/memories/.sandlot/x",
        ] {
            let o = sh(&format!("echo 'touch /tmp/pwned' >> {target}")).await;
            assert_ne!(o.exit.code, Some(0), "{target} must not be writable from the sandbox");
        }
        let o = sh("rm -rf /memories/.git").await;
        assert_ne!(o.exit.code, Some(0));
        // A symbolic link planted in the store leads nowhere.
        let o = sh("ln -s /etc/shadow /memories/leak.md && ln -s /etc /memories/etc").await;
        assert_eq!(o.exit.code, Some(0));
        tokio::time::sleep(Duration::from_millis(700)).await;
        for key in ["leak.md", "etc/shadow", "etc/passwd"] {
            let e = a
                .call_json("GET", &format!("/v1/memory/shared/memories/{key}"), None)
                .await
                .unwrap_err();
            assert!(matches!(code(&e).0, Some(400 | 404)), "{key}: {e}");
        }
        let out = a
            .call_json(
                "POST",
                "/v1/memory/shared/tool",
                Some(&json!({"command": "view", "path": "/memories/etc"})),
            )
            .await
            .unwrap();
        assert_eq!(out["is_error"], true, "{out}");
        let hits = a
            .call_json("POST", "/v1/memory/shared/search", Some(&json!({"text": "root", "mode": "bm25"})))
            .await
            .unwrap();
        assert!(paths(&hits).iter().all(|p| !p.starts_with("etc") && p != "leak.md"), "{hits}");
        // A store in use cannot be deleted.
        let e = a.call_json("DELETE", "/v1/memory/shared", None).await.unwrap_err();
        assert_eq!(code(&e).0, Some(409), "{e}");
        a.delete_sandbox(&id).await.unwrap();
        // The commit by the daemon records what the sandbox wrote (the store stays a clean
        // git repository with no hook run: nothing created /tmp/pwned on the host).
        assert!(!std::path::Path::new("/tmp/pwned").exists());
        a.call_json("DELETE", "/v1/memory/shared", None).await.unwrap();
    });
}

/// The attack: code in a sandbox that mounts a store plants a nested repository whose
/// configuration names programs (a filter driver, textconv, external diff, pager, fsmonitor,
/// hooks) and a `.gitattributes` that uses them, then the tenant asks the daemon to move it
/// and to report status, diff and history. Nothing of it runs on the host, and the move is
/// refused with a 400 naming the nested repository.
#[test]
fn a_sandbox_cannot_make_the_daemon_run_a_program_through_a_nested_repository() {
    model_installed();
    let d = Daemon::start(None);
    let ta = d.token("alpha");
    let a = d.tcp(Some(&ta));
    let mark = std::env::temp_dir().join(format!("sandlot-nested-repo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&mark);
    std::fs::create_dir_all(&mark).unwrap();
    let m = mark.display().to_string();
    rt().block_on(async {
        a.call_json("POST", "/v1/memory", Some(&json!({"name": "trap"}))).await.unwrap();
        let sb = a
            .call_json(
                "POST",
                "/v1/sandboxes",
                Some(&json!({"mounts": [{"type": "memory", "store": "trap", "target": "/memories"}]})),
            )
            .await
            .unwrap();
        let id = sb["id"].as_str().unwrap().to_string();
        // A tracked folder first, which the sandbox then turns into a repository of its own:
        // `git add` of its move would record it as a submodule, which `git status` enters.
        a.call_json(
            "POST",
            "/v1/memory/trap/memories",
            Some(&json!({"title": "Inner", "body": "Text.", "path": "evil/inner.md"})),
        )
        .await
        .unwrap();
        let script = format!(
            "set -e; cd /memories/evil; git init -q; \
             for k in filter.x.clean filter.x.smudge filter.x.process diff.x.textconv \
                      diff.x.command diff.external core.pager core.fsmonitor; do \
               git config \"$k\" \"touch {m}/$k; cat\"; done; \
             git config filter.x.required true; \
             mkdir -p .git/hooks; for h in pre-commit post-commit post-index-change reference-transaction; do \
               printf '#!/bin/sh\\ntouch {m}/hook-%s\\n' $h > .git/hooks/$h; chmod +x .git/hooks/$h; done; \
             echo '* filter=x diff=x' > .gitattributes; \
             git add -A 2>/dev/null || true; \
             git -c user.name=x -c user.email=x@x commit -qm inner 2>/dev/null || true; \
             printf '# Changed\\n' >> inner.md; touch -d 2001-01-01 inner.md; \
             echo '* filter=x diff=x' > /memories/.gitattributes"
        );
        let o = a.run(&id, &["sh", "-c", &script]).await.unwrap();
        assert_eq!(o.exit.code, Some(0), "{}", String::from_utf8_lossy(&o.stderr));
        // The planted programs are only ever run by git on the sandbox's side if at all;
        // clear what the sandbox's own git may have run, so only the daemon's runs count.
        for e in std::fs::read_dir(&mark).unwrap() {
            let _ = std::fs::remove_file(e.unwrap().path());
        }
        let tool = |input: Value| {
            let a = a.clone();
            async move {
                a.call_json("POST", "/v1/memory/trap/tool", Some(&input)).await.unwrap()
            }
        };
        let out = tool(json!({"command": "rename", "old_path": "/memories/evil", "new_path": "/memories/moved"})).await;
        assert_eq!(out["is_error"], true, "{out}");
        assert!(out["text"].as_str().unwrap_or("").contains("nested git repository"), "{out}");
        let e = a
            .call_json("POST", "/v1/memory/trap/move", Some(&json!({"from": "evil", "to": "moved"})))
            .await
            .unwrap_err();
        assert_eq!(code(&e).0, Some(400), "{e}");
        a.call_json("GET", "/v1/memory/trap/status", None).await.unwrap();
        a.call_json("GET", "/v1/memory/trap/log", None).await.unwrap();
        a.call_json("GET", "/v1/memory/trap/diff?from=HEAD", None).await.unwrap();
        let w = a
            .call_json("POST", "/v1/memory/trap/memories", Some(&json!({"title": "Note", "body": "Text."})))
            .await
            .unwrap();
        let key = w["path"].as_str().unwrap().to_string();
        a.call_json("DELETE", &format!("/v1/memory/trap/memories/{key}"), None).await.unwrap();
        a.call_json("GET", "/v1/memory/trap/status", None).await.unwrap();
        let ran: Vec<String> = std::fs::read_dir(&mark)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(ran.is_empty(), "the daemon ran programs named by the sandbox: {ran:?}");
        // A sparse file of 64 GiB costs the sandbox nothing on disk: reading it is refused
        // by name, not attempted (the daemon would hold it in memory).
        let o = a.run(&id, &["sh", "-c", "truncate -s 64G /memories/huge.md"]).await.unwrap();
        assert_eq!(o.exit.code, Some(0), "{}", String::from_utf8_lossy(&o.stderr));
        let e = a.call_json("GET", "/v1/memory/trap/memories/huge.md", None).await.unwrap_err();
        assert_eq!(code(&e).0, Some(413), "{e}");
        assert!(e.to_string().contains("huge.md") && !e.to_string().contains(&d.data_dir().display().to_string()), "{e}");
        // Writes leave no zombie processes under the daemon (a tenant could otherwise fill
        // the host's PID table with them).
        for i in 0..40 {
            a.call_json(
                "POST",
                "/v1/memory/trap/memories",
                Some(&json!({"title": format!("Note {i}"), "body": "Text."})),
            )
            .await
            .unwrap();
        }
        // Reaped ones go; one never reaped stays past any wait.
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        let mut zombies = zombie_children(d.pid());
        while !zombies.is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            zombies = zombie_children(d.pid());
        }
        assert!(zombies.is_empty(), "zombies under the daemon: {zombies:?}");
        a.delete_sandbox(&id).await.unwrap();
        a.call_json("DELETE", "/v1/memory/trap", None).await.unwrap();
    });
    let _ = std::fs::remove_dir_all(&mark);
}

/// What the inotify instances of process `pid` watch: the inode of every watched folder,
/// and how many instances it holds.
fn inotify_watches(pid: i32) -> (Vec<u64>, usize) {
    let mut inodes = Vec::new();
    let mut instances = 0;
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        if std::fs::read_link(e.path())
            .is_ok_and(|l| l == std::path::Path::new("anon_inode:inotify"))
        {
            instances += 1;
        }
        let info = format!("/proc/{pid}/fdinfo/{}", e.file_name().to_string_lossy());
        for l in std::fs::read_to_string(info).unwrap_or_default().lines() {
            if let Some(ino) = l
                .strip_prefix("inotify wd:")
                .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("ino:")))
            {
                inodes.push(u64::from_str_radix(ino, 16).unwrap());
            }
        }
    }
    (inodes, instances)
}

/// The daemon watches a mounted store's folders (as root, with the host's inotify watches
/// and instances, which the kernel counts per user across the host). A sandbox that makes a
/// folder and swaps it for a link to a host directory before the watcher looks must never
/// get the daemon to watch that directory (a recursive watch by path walked whatever the
/// new name led to: `l -> /` was the whole host); thousands of folders get a bounded number
/// of watches; and every store shares one inotify instance (one each, a tenant's 128 stores
/// took every instance root may have).
#[test]
fn the_store_watcher_never_watches_host_folders_and_holds_bounded_inotify_resources() {
    model_installed();
    let d = Daemon::start(None);
    let ta = d.token("alpha");
    let a = d.tcp(Some(&ta));
    let host = std::env::temp_dir().join(format!("sandlot-watch-host-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&host);
    std::fs::create_dir_all(host.join("etc/cron.d")).unwrap();
    let host_dirs: Vec<u64> = [host.clone(), host.join("etc"), host.join("etc/cron.d")]
        .iter()
        .map(|p| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap()))
        .collect();
    rt().block_on(async {
        for n in ["watched", "second", "third"] {
            a.call_json("POST", "/v1/memory", Some(&json!({"name": n}))).await.unwrap();
        }
        let sb = a
            .call_json(
                "POST",
                "/v1/sandboxes",
                Some(&json!({"mounts": [{"type": "memory", "store": "watched", "target": "/memories"}]})),
            )
            .await
            .unwrap();
        let id = sb["id"].as_str().unwrap().to_string();
        // A folder and a link to the host directory swap names in a loop
        // (`renameat2(RENAME_EXCHANGE)`): each time the watcher hears of a folder under a
        // name, that name may already be the link. Then fresh folders swapped for the link
        // one by one, then thousands of folders.
        let swap = format!(
            "import ctypes, os, time\n\
             libc = ctypes.CDLL(None, use_errno=True)\n\
             os.mkdir('/memories/notes')\n\
             os.symlink('{host}', '/memories/link')\n\
             end = time.time() + 2\n\
             while time.time() < end:\n\
             \x20   if libc.renameat2(-100, b'/memories/notes', -100, b'/memories/link', 2) != 0:\n\
             \x20       raise OSError(ctypes.get_errno(), 'renameat2')\n\
             for n in ('notes', 'link'):\n\
             \x20   p = '/memories/' + n\n\
             \x20   os.unlink(p) if os.path.islink(p) else os.rename(p, '/memories/swapped')\n\
             for i in range(300):\n\
             \x20   os.mkdir('/memories/notes')\n\
             \x20   os.rename('/memories/notes', '/memories/old-%d' % i)\n\
             \x20   os.symlink('{host}', '/memories/notes')\n\
             \x20   time.sleep(0.002)\n\
             \x20   os.unlink('/memories/notes')\n\
             for i in range(3000):\n\
             \x20   os.mkdir('/memories/many-%d' % i)\n",
            host = host.display()
        );
        let o = a.run(&id, &["python3", "-c", &swap]).await.unwrap();
        assert_eq!(o.exit.code, Some(0), "{}", String::from_utf8_lossy(&o.stderr));
        // A note written now is indexed: the watcher has looked at everything before it.
        let o = a
            .run(&id, &["sh", "-c", "printf '# Last\\nzebra crossing\\n' > /memories/last.md"])
            .await
            .unwrap();
        assert_eq!(o.exit.code, Some(0));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let hits = a
                .call_json("POST", "/v1/memory/watched/search", Some(&json!({"text": "zebra", "mode": "bm25"})))
                .await
                .unwrap();
            if paths(&hits) == vec!["last.md".to_string()] {
                break;
            }
            assert!(Instant::now() < deadline, "the note was never indexed: {hits}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let (watched, instances) = inotify_watches(d.pid());
        let leaked: Vec<&u64> = watched.iter().filter(|i| host_dirs.contains(i)).collect();
        assert!(leaked.is_empty(), "the daemon watches host folders: {leaked:?}");
        eprintln!("{} watches, {instances} inotify instances", watched.len());
        assert!(
            watched.len() <= 3 * 1024,
            "{} watches for three stores, one with 3,300 folders",
            watched.len()
        );
        assert_eq!(instances, 1, "inotify instances of the daemon for three stores");
        a.delete_sandbox(&id).await.unwrap();
        for n in ["watched", "second", "third"] {
            a.call_json("DELETE", &format!("/v1/memory/{n}"), None).await.unwrap();
        }
    });
    let _ = std::fs::remove_dir_all(&host);
}

/// The children of `pid` that are zombies.
fn zombie_children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let s = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        for c in s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            let stat = std::fs::read_to_string(format!("/proc/{c}/stat")).unwrap_or_default();
            if stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next())
                == Some("Z")
            {
                out.push(c);
            }
        }
    }
    out
}
