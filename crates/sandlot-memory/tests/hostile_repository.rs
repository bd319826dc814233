//! A store whose files (and, for defence in depth, whose own `.git/config`) were written by
//! hostile code: no program named in repository data ever runs, whichever operation reads or
//! commits the store, and a nested repository is never staged or descended into.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::{agent, git, minilm, new_store, TempDir};
use sandlot_memory::{GitError, NewMemory, StoreError};

/// A program that leaves a file named after how it was started in `marks`.
fn planted_program(dir: &Path, marks: &Path) -> PathBuf {
    let p = dir.join("evil.sh");
    std::fs::write(
        &p,
        format!(
            "#!/bin/sh\ntouch \"{}/$(basename \"$0\")-$$\"\ncat\n",
            marks.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// Every way a repository's configuration can name a program for git to run.
fn hostile_config(prog: &Path, include: Option<&Path>) -> String {
    let p = prog.display();
    let include = include
        .map(|i| format!("[include]\n\tpath = {}\n", i.display()))
        .unwrap_or_default();
    format!(
        "[filter \"evil\"]\n\tclean = {p}\n\tsmudge = {p}\n\tprocess = {p}\n\trequired = true\n\
         [diff \"evil\"]\n\ttextconv = {p}\n\tcommand = {p}\n\
         [diff]\n\texternal = {p}\n\
         [core]\n\tpager = {p}\n\tfsmonitor = {p}\n\thooksPath = {hooks}\n{include}",
        hooks = prog.parent().unwrap().join("hooks").display(),
    )
}

fn plant_hooks(dir: &Path, prog: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for h in [
        "pre-commit",
        "post-commit",
        "commit-msg",
        "prepare-commit-msg",
        "post-index-change",
        "reference-transaction",
        "post-checkout",
        "fsmonitor-watchman",
    ] {
        std::fs::copy(prog, dir.join(h)).unwrap();
    }
}

fn marks_left(marks: &Path) -> Vec<String> {
    std::fs::read_dir(marks)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn no_program_named_in_repository_data_ever_runs() {
    let (d, store) = new_store("hostile", minilm());
    let a = agent();
    let tools = TempDir::new("hostile-tools");
    let marks = tools.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let prog = planted_program(tools.path(), &marks);
    plant_hooks(&tools.path().join("hooks"), &prog);
    let include = tools.path().join("included.config");
    std::fs::write(&include, hostile_config(&prog, None)).unwrap();
    let root = d.path();

    // The store's own repository, as if its configuration and hooks had been written.
    let mut cfg = std::fs::read_to_string(root.join(".git/config")).unwrap();
    cfg.push_str(&hostile_config(&prog, Some(&include)));
    std::fs::write(root.join(".git/config"), cfg).unwrap();
    plant_hooks(&root.join(".git/hooks"), &prog);
    std::fs::write(root.join(".gitattributes"), "* filter=evil diff=evil\n").unwrap();

    // A tracked folder that becomes a nested repository with its own hostile configuration,
    // as a sandbox would make it (`git add` of its move would record a submodule, and
    // `git status` would enter it).
    let nested = root.join("notes");
    store
        .write_file("notes/inner.md", "# Inner\nText.\n", "add", &a)
        .unwrap();
    git(&nested, &["init", "-q"]);
    git(&nested, &["add", "-A"]);
    git(&nested, &["commit", "-qm", "inner"]);
    let mut ncfg = std::fs::read_to_string(nested.join(".git/config")).unwrap();
    ncfg.push_str(&hostile_config(&prog, Some(&include)));
    std::fs::write(nested.join(".git/config"), ncfg).unwrap();
    plant_hooks(&nested.join(".git/hooks"), &prog);
    std::fs::write(nested.join(".gitattributes"), "* filter=evil diff=evil\n").unwrap();
    std::fs::write(nested.join("inner.md"), "# Inner\nChanged.\n").unwrap();

    // Every operation of the store, reads and writes.
    let w = store
        .add(
            NewMemory {
                title: "Recipe".into(),
                body: "Two eggs.".into(),
                folder: Some("kitchen".into()),
                ..Default::default()
            },
            &a,
        )
        .unwrap();
    let v1 = w.commit.clone().unwrap();
    store
        .write_file("kitchen/recipe.md", "# Recipe\nThree eggs.\n", "edit", &a)
        .unwrap();
    std::fs::write(root.join("kitchen/recipe.md"), "# Recipe\nFour eggs.\n").unwrap();
    store.status().unwrap();
    store.diff(&v1, None, None).unwrap();
    store
        .diff(&v1, Some("HEAD"), Some("kitchen/recipe.md"))
        .unwrap();
    store
        .write_file("kitchen/recipe.md", "# Recipe\nFive eggs.\n", "edit", &a)
        .unwrap();
    store.log(None, 50).unwrap();
    store.log(Some("kitchen/recipe.md"), 50).unwrap();
    store.show("kitchen/recipe.md", &v1).unwrap();
    store.rename("kitchen", "pantry", &a).unwrap();
    store.revert_memory("pantry/recipe.md", &v1, &a).unwrap();
    let extra = store
        .write_file("pantry/extra.md", "# Extra\nSalt.\n", "add", &a)
        .unwrap();
    store
        .revert_commit(extra.commit.as_deref().unwrap(), &a)
        .unwrap();
    store.remove("pantry/recipe.md", &a).unwrap();
    store.sync().unwrap();

    // The nested repository is refused as a whole, and left where it was.
    let e = store.rename("notes", "moved", &a).unwrap_err();
    assert!(
        matches!(e, StoreError::Git(GitError::NestedRepository { ref path }) if path == "moved"),
        "{e}"
    );
    assert!(nested.join(".git/config").exists() && !root.join("moved").exists());
    let st = store.status().unwrap();
    assert!(st.iter().all(|s| !s.path.contains(".git/")), "{st:?}");

    assert_eq!(
        marks_left(&marks),
        Vec::<String>::new(),
        "programs named in repository data ran"
    );
    // What was committed is the file's bytes, not a filter's output.
    let shown = store.show("kitchen/recipe.md", &v1).unwrap();
    assert!(shown.contains("Two eggs."), "{shown}");
}

#[test]
fn a_store_whose_git_is_a_link_to_another_repository_is_refused() {
    let (d, store) = new_store("gitlink", minilm());
    drop(store);
    let other = TempDir::new("gitlink-other");
    git(other.path(), &["init", "-q"]);
    let root = d.path();
    std::fs::rename(root.join(".git"), root.join("old-git")).unwrap();
    std::fs::write(
        root.join(".git"),
        format!("gitdir: {}\n", other.path().join(".git").display()),
    )
    .unwrap();
    let e = match sandlot_memory::Store::open(root, minilm()) {
        Ok(_) => panic!("a .git file pointing elsewhere was opened"),
        Err(e) => e,
    };
    assert!(e.to_string().contains("not a git repository"), "{e}");
}

/// FIFOs, links and huge sparse files where the daemon reads: `.gitignore` and
/// `.gitattributes` as FIFOs (git and libgit2 with a work tree would block on them), a
/// `.gitattributes` linked to a host file, a memory whose apparent size is 64 GiB. Every
/// operation finishes, none reads through the link, and the big file is refused by name.
#[test]
fn fifos_links_and_sparse_files_never_block_or_redirect_the_store() {
    let (d, store) = new_store("fifos", minilm());
    let a = agent();
    let root = d.path().to_path_buf();
    store
        .write_file("notes/a.md", "# A\nText.\n", "add", &a)
        .unwrap();
    for f in [".gitattributes", "notes/.gitignore"] {
        let p = root.join(f);
        let st = std::process::Command::new("mkfifo")
            .arg(&p)
            .status()
            .unwrap();
        assert!(st.success());
    }
    std::fs::remove_file(root.join(".gitignore")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.join(".gitignore")).unwrap();
    let big = std::fs::File::create(root.join("notes/big.md")).unwrap();
    big.set_len(64 << 30).unwrap();
    drop(big);

    let (tx, rx) = std::sync::mpsc::channel();
    let store = std::sync::Arc::new(store);
    let s2 = store.clone();
    std::thread::spawn(move || {
        let a = agent();
        let v1 = s2.log(None, 10).unwrap().last().unwrap().rev.clone();
        let status = s2.status().map(|st| st.len());
        let write = s2.write_file("notes/b.md", "# B\nMore.\n", "add", &a);
        let diff = s2.diff(&v1, None, None).map(|d| d.len());
        let sync = s2.sync().map(|r| r.skipped);
        let big = s2.read_file("notes/big.md").map(|t| t.len());
        let rename = s2.rename("notes", "moved", &a).map(|w| w.path);
        let _ = tx.send((
            status.is_ok(),
            write.is_ok(),
            diff.is_ok(),
            sync,
            big,
            rename,
        ));
    });
    let (status, write, diff, sync, big, rename) = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("a store operation blocked on a FIFO");
    assert!(
        status && write && diff,
        "status {status}, write {write}, diff {diff}"
    );
    let skipped = sync.unwrap();
    assert!(skipped.iter().any(|p| p == "notes/big.md"), "{skipped:?}");
    let e = big.unwrap_err();
    assert!(e.to_string().contains("larger than"), "{e}");
    // The folder holds a file too large to commit: the move is refused and undone.
    let e = rename.unwrap_err();
    assert!(
        e.to_string().contains("/big.md") && e.to_string().contains("larger than"),
        "{e}"
    );
    assert!(root.join("notes/a.md").exists());
    // Nothing of the host file went into the history.
    let log = store.log(None, 10).unwrap();
    for c in log.iter().filter(|c| c.message != "init memory store") {
        assert!(!c.paths.iter().any(|p| p == ".gitignore"), "{c:?}");
    }
}
