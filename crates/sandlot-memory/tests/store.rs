//! Store behaviour end to end with the real all-MiniLM-L6-v2 embedder: writes through every path
//! become searchable, direct edits / checkouts / deletes leave no stale rows, renames embed
//! nothing, supersession, history, status.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use sandlot_memory::memory_tool;
use sandlot_memory::{
    Freshness, MemoryPatch, NewMemory, SearchMode, SearchQuery, Store, StoreError, Validity,
};

/// Files whose text matches `q` lexically (BM25 only: vector search always returns neighbours,
/// so absence is checked lexically).
fn paths(store: &Store, q: &str) -> Vec<String> {
    let mut sq = SearchQuery::new(q);
    sq.mode = SearchMode::Bm25;
    store
        .search(&sq)
        .unwrap()
        .into_iter()
        .map(|h| h.path)
        .collect()
}

/// The best hybrid hit.
fn top(store: &Store, q: &str) -> Option<String> {
    store
        .search(&SearchQuery::new(q))
        .unwrap()
        .into_iter()
        .next()
        .map(|h| h.path)
}

fn vector_top(store: &Store, q: &str) -> Option<String> {
    let mut sq = SearchQuery::new(q);
    sq.mode = SearchMode::Vector;
    store
        .search(&sq)
        .unwrap()
        .into_iter()
        .next()
        .map(|h| h.path)
}

fn mem(title: &str, body: &str, folder: &str) -> NewMemory {
    NewMemory {
        title: title.into(),
        body: body.into(),
        folder: Some(folder.into()),
        ..Default::default()
    }
}

#[test]
fn writes_through_every_path_become_searchable() {
    let (_d, store) = new_store("paths", minilm());
    let a = agent();

    // add
    let added = store
        .add(
            mem(
                "Acme renewal risk",
                "Acme Corp told us they are evaluating competitors before their contract renewal in March.",
                "customers",
            ),
            &a,
        )
        .unwrap();
    assert_eq!(added.path, "customers/acme-renewal-risk.md");
    assert!(added.commit.is_some());
    assert_eq!(paths(&store, "Acme renewal")[0], added.path);
    // semantic: no shared keywords
    assert_eq!(
        vector_top(&store, "which client might leave us for another vendor").as_deref(),
        Some(added.path.as_str())
    );

    // edit
    store
        .edit(
            &added.id,
            MemoryPatch {
                body: Some(
                    "Acme Corp signed a three-year extension; the zebrafish pilot is expanding."
                        .into(),
                ),
                add_tags: vec!["won".into()],
                ..Default::default()
            },
            &a,
        )
        .unwrap();
    assert_eq!(paths(&store, "zebrafish")[0], added.path);
    assert!(
        paths(&store, "evaluating competitors").is_empty(),
        "old text still indexed"
    );
    assert_eq!(
        top(&store, "zebrafish pilot").as_deref(),
        Some(added.path.as_str())
    );
    let mut tagged = SearchQuery::new("extension");
    tagged.tags = vec!["won".into()];
    assert_eq!(store.search(&tagged).unwrap().len(), 1);
    tagged.tags = vec!["lost".into()];
    assert!(store.search(&tagged).unwrap().is_empty());

    // write_file (editor path), no front matter
    store
        .write_file(
            "notes/standup.md",
            "# Standup\nThe quokka migration finished on Tuesday.\n",
            "standup notes",
            &a,
        )
        .unwrap();
    assert_eq!(paths(&store, "quokka")[0], "notes/standup.md");
    assert_eq!(
        top(&store, "when did the quokka migration finish").as_deref(),
        Some("notes/standup.md")
    );

    // memory tool create / str_replace / insert
    let out = memory_tool::execute_json(
        &store,
        &serde_json::json!({"command": "create", "path": "/memories/prefs.txt", "file_text": "Favourite colour: ultramarine\n"}),
        &a,
    );
    assert_eq!(
        out.text,
        "File created successfully at: /memories/prefs.txt"
    );
    assert_eq!(paths(&store, "ultramarine")[0], "prefs.txt");
    let out = memory_tool::execute_json(
        &store,
        &serde_json::json!({"command": "str_replace", "path": "/memories/prefs.txt", "old_str": "ultramarine", "new_str": "vermilion"}),
        &a,
    );
    assert!(
        out.text.starts_with("The memory file has been edited."),
        "{}",
        out.text
    );
    assert_eq!(paths(&store, "vermilion")[0], "prefs.txt");
    assert!(paths(&store, "ultramarine").is_empty());
    let out = memory_tool::execute_json(
        &store,
        &serde_json::json!({"command": "insert", "path": "/memories/prefs.txt", "insert_line": 0, "insert_text": "Editor: helix"}),
        &a,
    );
    assert_eq!(out.text, "The file /memories/prefs.txt has been edited.");
    assert_eq!(paths(&store, "helix")[0], "prefs.txt");
    assert_eq!(
        store.read_file("prefs.txt").unwrap(),
        "Editor: helix\nFavourite colour: vermilion\n"
    );

    // rename via the tool, then delete
    let out = memory_tool::execute_json(
        &store,
        &serde_json::json!({"command": "rename", "old_path": "/memories/prefs.txt", "new_path": "/memories/people/me.txt"}),
        &a,
    );
    assert_eq!(
        out.text,
        "Successfully renamed /memories/prefs.txt to /memories/people/me.txt"
    );
    assert_eq!(paths(&store, "vermilion"), vec!["people/me.txt"]);
    let out = memory_tool::execute_json(
        &store,
        &serde_json::json!({"command": "delete", "path": "/memories/people"}),
        &a,
    );
    assert_eq!(out.text, "Successfully deleted /memories/people");
    assert!(paths(&store, "vermilion").is_empty());

    // every write was a commit by the agent
    let log = store.log(None, 50).unwrap();
    assert!(log.len() >= 9, "{log:#?}");
    assert!(log
        .iter()
        .all(|c| c.author == "agent-7" && c.email == "agent-7@tenant.example"));
    assert!(log
        .iter()
        .any(|c| c.message.starts_with("add customers/acme-renewal-risk.md")));
    assert!(log
        .iter()
        .any(|c| c.message == "memory: create /memories/prefs.txt"));
    let st = store.status().unwrap();
    assert!(
        st.iter()
            .all(|s| s.index == Freshness::Fresh && s.git.is_none()),
        "{st:#?}"
    );
}

#[test]
fn rename_reembeds_nothing_and_model_change_reembeds_in_background() {
    let counting = Counting::new(minilm());
    let (d, store) = new_store("rename", counting.clone());
    let a = agent();
    let body =
        "The staging cluster runs on three nodes.\n\nBackups happen nightly at 02:00 UTC.\n\n"
            .repeat(6);
    let w = store
        .add(mem("Infrastructure notes", &body, "infra"), &a)
        .unwrap();
    let after_add = counting.count();
    assert!(after_add > 0);
    let (_, chunks, vectors) = store.counts().unwrap();
    assert_eq!(chunks, vectors);

    store.rename(&w.path, "ops/infrastructure.md", &a).unwrap();
    assert_eq!(counting.count(), after_add, "rename embedded something");
    assert_eq!(
        paths(&store, "staging cluster nodes")[0],
        "ops/infrastructure.md"
    );

    // A direct `git mv` picked up by a reconcile also embeds nothing.
    git(d.path(), &["mv", "ops/infrastructure.md", "infra.md"]);
    git(d.path(), &["commit", "-qm", "move by hand"]);
    let r = store.sync().unwrap();
    assert_eq!(r.texts_embedded, 0, "{r:?}");
    assert_eq!(counting.count(), after_add);
    assert_eq!(paths(&store, "nightly backups")[0], "infra.md");

    // Reindex keeping vectors embeds nothing either.
    let r = store.reindex(true).unwrap();
    assert_eq!(r.texts_embedded, 0);
    drop(store);

    // Another model (an HTTP endpoint here stands in): BM25 works at once, vectors fill in
    // through embed_pending (the watcher's background step), and nothing is stale.
    let other = Counting::new(Arc::new(Renamed(minilm())));
    let store = Store::open_unsynced(d.path(), other.clone()).unwrap();
    let (_, chunks, vectors) = store.counts().unwrap();
    assert!(chunks > 0);
    assert_eq!(vectors, 0);
    assert_eq!(
        store
            .status()
            .unwrap()
            .iter()
            .map(|s| s.missing_vectors)
            .sum::<usize>(),
        chunks
    );
    let mut bm = SearchQuery::new("nightly backups");
    bm.mode = SearchMode::Bm25;
    assert_eq!(store.search(&bm).unwrap()[0].path, "infra.md");
    let mut n = 0;
    loop {
        let k = store.embed_pending(1).unwrap();
        if k == 0 {
            break;
        }
        n += k;
    }
    assert!(n > 0 && n <= chunks);
    let (_, chunks2, vectors2) = store.counts().unwrap();
    assert_eq!(chunks2, vectors2);
    assert_eq!(
        vector_top(&store, "when are backups taken").as_deref(),
        Some("infra.md")
    );
}

/// The same model under another id, to simulate a model change.
struct Renamed(Arc<sandlot_memory::MiniLmEmbedder>);
impl sandlot_memory::Embedder for Renamed {
    fn model_id(&self) -> &str {
        "all-MiniLM-L6-v2-renamed"
    }
    fn dim(&self) -> usize {
        384
    }
    fn embed(&self, t: &[&str]) -> Result<Vec<Vec<f32>>, sandlot_memory::EmbedError> {
        self.0.embed(t)
    }
}

#[test]
fn direct_edits_checkouts_and_deletes_leave_no_stale_rows() {
    let (d, store) = new_store("direct", minilm());
    let store = Arc::new(store);
    let a = agent();
    let w = store
        .add(
            mem(
                "Lighthouse",
                "The lighthouse keeper logs the weather twice a day.",
                "places",
            ),
            &a,
        )
        .unwrap();
    let watcher = sandlot_memory::watch(store.clone(), Default::default()).unwrap();
    let file = d.path().join(&w.path);

    // A person edits the file in an editor.
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replace("weather twice a day", "barometer hourly"),
    )
    .unwrap();
    assert!(
        eventually(10, || paths(&store, "barometer") == vec![w.path.clone()]),
        "edit not picked up"
    );
    assert!(
        paths(&store, "twice").is_empty(),
        "stale row for replaced text"
    );
    git(d.path(), &["commit", "-qam", "hourly barometer"]);

    // A new file dropped in, then a checkout of an older revision removes it again.
    std::fs::write(
        d.path().join("places/harbour.md"),
        "# Harbour\nPelicans nest near the harbour crane.\n",
    )
    .unwrap();
    assert!(eventually(10, || paths(&store, "pelicans")
        == vec!["places/harbour.md".to_string()]));
    git(d.path(), &["add", "places/harbour.md"]);
    git(d.path(), &["commit", "-qm", "harbour"]);
    let log = store.log(None, 10).unwrap();
    let first = log.last().unwrap().rev.clone(); // init commit
    let add_rev = log
        .iter()
        .find(|c| c.message.starts_with("add places/lighthouse.md"))
        .unwrap()
        .rev
        .clone();
    git(d.path(), &["checkout", "-q", &add_rev]);
    assert!(
        eventually(10, || paths(&store, "pelicans").is_empty()
            && paths(&store, "weather twice") == vec![w.path.clone()]),
        "checkout not reflected"
    );
    assert!(
        paths(&store, "barometer").is_empty(),
        "stale row after checkout"
    );
    git(d.path(), &["checkout", "-q", &first]);
    assert!(
        eventually(10, || store.counts().unwrap().0 == 0),
        "rows survive checkout of the empty revision"
    );
    git(d.path(), &["checkout", "-q", "main"]);
    assert!(eventually(10, || paths(&store, "pelicans").len() == 1
        && paths(&store, "barometer").len() == 1));

    // rm -rf of a folder by hand.
    std::fs::remove_dir_all(d.path().join("places")).unwrap();
    assert!(
        eventually(10, || store.counts().unwrap() == (0, 0, 0)),
        "{:?}",
        store.counts()
    );
    assert!(watcher.syncs() >= 4);
    drop(watcher);
    let st = store.status().unwrap();
    assert!(st.iter().all(|s| s.index == Freshness::Fresh), "{st:#?}");
    assert!(st.iter().any(|s| s.git.as_deref() == Some("D")));
}

#[test]
fn status_reports_freshness_without_changing_the_index() {
    let (d, store) = new_store("status", minilm());
    let a = agent();
    let w = store.add(mem("One", "first memory", "x"), &a).unwrap();
    let w2 = store.add(mem("Two", "second memory", "x"), &a).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(d.path().join(&w.path), "changed by hand\n").unwrap();
    std::fs::write(d.path().join("x/new.md"), "brand new\n").unwrap();
    std::fs::remove_file(d.path().join(&w2.path)).unwrap();
    std::fs::write(d.path().join("x/blob.bin"), [0u8, 159, 146, 150]).unwrap();
    let st = store.status().unwrap();
    let get = |p: &str| {
        st.iter()
            .find(|s| s.path == p)
            .unwrap_or_else(|| panic!("{p} missing in {st:#?}"))
    };
    assert_eq!(get(&w.path).index, Freshness::Stale);
    assert_eq!(get(&w.path).git.as_deref(), Some("M"));
    assert_eq!(get("x/new.md").index, Freshness::Unindexed);
    assert_eq!(get("x/new.md").git.as_deref(), Some("??"));
    assert_eq!(get(&w2.path).index, Freshness::Deleted);
    assert_eq!(get("x/blob.bin").index, Freshness::Skipped);
    // status did not index anything
    assert_eq!(store.status().unwrap().len(), st.len());
    assert_eq!(get(&w.path).index, Freshness::Stale);
    let r = store.sync().unwrap();
    assert_eq!(r.removed, vec![w2.path.clone()]);
    assert_eq!(r.skipped, vec!["x/blob.bin".to_string()]);
    let st = store.status().unwrap();
    assert!(
        st.iter()
            .all(|s| matches!(s.index, Freshness::Fresh | Freshness::Skipped)),
        "{st:#?}"
    );
}

#[test]
fn supersession_keeps_the_old_fact_with_validity() {
    let (_d, store) = new_store("supersede", minilm());
    let a = agent();
    let old = store
        .add(
            NewMemory {
                title: "Office location".into(),
                body: "The team works from the Dock Street office.".into(),
                folder: Some("facts".into()),
                valid_from: Some("2024-01-01".into()),
                ..Default::default()
            },
            &a,
        )
        .unwrap();
    let new = store
        .supersede(
            &old.id,
            NewMemory {
                title: "Office location (moved)".into(),
                body: "The team moved to the Harbour Tower office.".into(),
                valid_from: Some("2026-06-01".into()),
                ..Default::default()
            },
            &a,
        )
        .unwrap();
    assert_eq!(new.path, "facts/office-location-moved.md");
    let o = store.get(&old.id).unwrap();
    assert_eq!(o.valid_to.as_deref(), Some("2026-06-01"));
    assert_eq!(o.superseded_by.as_deref(), Some(new.id.as_str()));
    assert!(o.links.contains(&new.id));
    let n = store.get(&new.id).unwrap();
    assert_eq!(n.supersedes.as_deref(), Some(old.id.as_str()));

    // Now: only the successor. Back in 2025: only the old fact. Any: both.
    assert_eq!(
        paths(&store, "where does the team work office"),
        vec![new.path.clone()]
    );
    let mut q = SearchQuery::new("where does the team work office");
    q.valid = Validity::At(sandlot_memory::doc::parse_time("2025-03-01").unwrap());
    assert_eq!(
        store
            .search(&q)
            .unwrap()
            .into_iter()
            .map(|h| h.path)
            .collect::<Vec<_>>(),
        vec![old.path.clone()]
    );
    q.valid = Validity::Any;
    q.expand = true;
    let hits = store.search(&q).unwrap();
    assert_eq!(hits.len(), 2);
    for h in &hits {
        assert_eq!(h.related.len(), 1, "{h:?}");
        assert_ne!(h.related[0].path, h.path);
    }
    // One commit for both files.
    let c = &store.log(None, 1).unwrap()[0];
    assert!(c
        .message
        .starts_with("supersede facts/office-location.md with facts/office-location-moved.md"));
    assert_eq!(c.paths.len(), 2);
    // Superseding twice is refused.
    assert!(matches!(
        store.supersede(&old.id, mem("x", "y", "facts"), &a),
        Err(StoreError::Invalid(_))
    ));
}

#[test]
fn history_log_diff_show_and_revert() {
    let (_d, store) = new_store("history", minilm());
    let a = agent();
    let w = store
        .add(mem("Recipe", "Use two eggs.", "kitchen"), &a)
        .unwrap();
    let v1 = w.commit.clone().unwrap();
    store
        .edit(
            &w.id,
            MemoryPatch {
                body: Some("Use three eggs and saffron.".into()),
                ..Default::default()
            },
            &a,
        )
        .unwrap();
    let other = store
        .add(mem("Shopping", "Buy flour.", "kitchen"), &a)
        .unwrap();

    let log = store.log(Some(&w.id), 10).unwrap();
    assert_eq!(log.len(), 2);
    assert!(log[0].message.starts_with("edit kitchen/recipe.md"));
    assert_eq!(log[1].rev, v1);

    assert!(store.show(&w.id, &v1).unwrap().contains("Use two eggs."));
    let diff = store.diff(&v1, Some("HEAD"), Some(&w.id)).unwrap();
    assert!(
        diff.contains("-Use two eggs.") && diff.contains("+Use three eggs and saffron."),
        "{diff}"
    );
    assert!(!diff.contains("flour"));

    // Per memory: back to v1, as a new commit; searchable accordingly.
    let r = store.revert_memory(&w.id, &v1, &a).unwrap();
    assert!(r.commit.is_some());
    assert!(store.get(&w.id).unwrap().body.contains("two eggs"));
    assert!(paths(&store, "saffron").is_empty());
    assert_eq!(store.log(Some(&w.id), 10).unwrap().len(), 3);

    // Per store: undo the commit that added "Shopping".
    let add_other = other.commit.unwrap();
    store.revert_commit(&add_other, &a).unwrap();
    assert!(matches!(
        store.get(&other.path),
        Err(StoreError::NotFound { .. })
    ));
    assert!(paths(&store, "flour").is_empty());
    // History of a deleted memory is still readable.
    assert_eq!(store.log(Some(&other.path), 10).unwrap().len(), 2);
    assert!(store
        .show(&other.path, &add_other)
        .unwrap()
        .contains("Buy flour."));
    // Bad revisions are clear errors.
    let e = store.show(&w.id, "no-such-rev").unwrap_err().to_string();
    assert!(e.contains("no-such-rev"), "{e}");
}

#[test]
fn bad_input_is_rejected_and_nothing_is_half_done() {
    let (d, store) = new_store("bad", minilm());
    let a = agent();
    for bad in ["../escape.md", "/abs.md", ".git/x.md", "a//b.md"] {
        let e = store
            .add(
                NewMemory {
                    title: "t".into(),
                    path: Some(bad.into()),
                    ..Default::default()
                },
                &a,
            )
            .unwrap_err();
        assert!(matches!(e, StoreError::BadPath { .. }), "{bad}: {e}");
    }
    assert!(matches!(
        store.add(mem("  ", "b", "x"), &a),
        Err(StoreError::Invalid(_))
    ));
    let e = store
        .add(
            NewMemory {
                title: "t".into(),
                valid_to: Some("next week".into()),
                ..Default::default()
            },
            &a,
        )
        .unwrap_err();
    assert!(e.to_string().contains("valid_to"), "{e}");
    let w = store.add(mem("Keep", "kept", "x"), &a).unwrap();
    let e = store.rename(&w.path, "x/keep.md", &a).unwrap_err();
    assert!(matches!(e, StoreError::Exists { .. }));
    assert!(matches!(
        store.get("nope"),
        Err(StoreError::NotFound { .. })
    ));
    // A file with broken front matter written by hand is indexed as text and reported.
    std::fs::write(
        d.path().join("x/broken.md"),
        "---\ntags: [oops\n---\nmarmalade notes\n",
    )
    .unwrap();
    store.sync().unwrap();
    assert_eq!(paths(&store, "marmalade"), vec!["x/broken.md".to_string()]);
    let st = store.status().unwrap();
    let b = st.iter().find(|s| s.path == "x/broken.md").unwrap();
    assert!(b.error.as_deref().unwrap().contains("x/broken.md"));
    // Memory tool errors use the documented strings.
    let t = |v: serde_json::Value| memory_tool::execute_json(&store, &v, &a);
    let out = t(serde_json::json!({"command": "view", "path": "/memories/missing.txt"}));
    assert_eq!(
        out.text,
        "The path /memories/missing.txt does not exist. Please provide a valid path."
    );
    assert!(out.is_error);
    let out = t(
        serde_json::json!({"command": "create", "path": "/memories/x/keep.md", "file_text": "x"}),
    );
    assert_eq!(out.text, "Error: File /memories/x/keep.md already exists");
    let out = t(serde_json::json!({"command": "view", "path": "/memories/../../etc/passwd"}));
    assert!(
        out.is_error && out.text.contains("not allowed"),
        "{}",
        out.text
    );
    assert!(store
        .status()
        .unwrap()
        .iter()
        .all(|s| s.git.is_none() || s.path == "x/broken.md"));
}

#[test]
fn memory_tool_view_lists_and_numbers() {
    let (_d, store) = new_store("view", minilm());
    let a = agent();
    let t = |v: serde_json::Value| memory_tool::execute_json(&store, &v, &a);
    t(
        serde_json::json!({"command": "create", "path": "/memories/notes.txt", "file_text": "Hello World\nThis is line two\n"}),
    );
    t(
        serde_json::json!({"command": "create", "path": "/memories/proj/a/b/deep.md", "file_text": "deep\n"}),
    );
    let out = t(serde_json::json!({"command": "view", "path": "/memories"}));
    assert!(!out.is_error);
    let lines: Vec<&str> = out.text.lines().collect();
    assert_eq!(
        lines[0],
        "Here're the files and directories up to 2 levels deep in /memories, excluding hidden items and node_modules:"
    );
    assert!(lines[1].ends_with("\t/memories"));
    assert!(lines
        .iter()
        .any(|l| l.ends_with("\t/memories/notes.txt") && l.starts_with("29\t")));
    assert!(lines.iter().any(|l| l.ends_with("\t/memories/proj/a")));
    assert!(!lines
        .iter()
        .any(|l| l.contains("deep.md") || l.contains(".git") || l.contains(".sandlot")));
    let out = t(serde_json::json!({"command": "view", "path": "/memories/notes.txt"}));
    assert_eq!(
        out.text,
        "Here's the content of /memories/notes.txt with line numbers:\n     1\tHello World\n     2\tThis is line two"
    );
    let out = t(
        serde_json::json!({"command": "view", "path": "/memories/notes.txt", "view_range": [2, -1]}),
    );
    assert_eq!(
        out.text,
        "Here's the content of /memories/notes.txt with line numbers:\n     2\tThis is line two"
    );
    let out = t(
        serde_json::json!({"command": "str_replace", "path": "/memories/notes.txt", "old_str": "i", "new_str": "x"}),
    );
    assert!(
        out.text.starts_with(
            "No replacement was performed. Multiple occurrences of old_str `i` in lines: 2, 2, 2"
        ),
        "{}",
        out.text
    );
    let out = t(
        serde_json::json!({"command": "insert", "path": "/memories/notes.txt", "insert_line": 9, "insert_text": "x"}),
    );
    assert_eq!(out.text, "Error: Invalid `insert_line` parameter: 9. It should be within the range of lines of the file: [0, 2]");
    let out = t(
        serde_json::json!({"command": "rename", "old_path": "/memories/notes.txt", "new_path": "/memories/proj"}),
    );
    assert_eq!(
        out.text,
        "Error: The destination /memories/proj already exists"
    );
}
