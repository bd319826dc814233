//! Differential tests: the same command lines through the virtual shell and
//! through real bash + GNU tools on a real copy of the tree, compared byte
//! for byte (stdout, stderr, exit status).

mod common;

use std::path::Path;

use common::{fixture_files, real_bash, real_bash_rw, require_tool, write_sorted, TempDir};
use sandlot_vfs::{Collection, IngestOptions, Limits, Principal, ScratchLimits, Source, Store};

const COMMANDS: &[&str] = &[
    // ls
    "ls",
    "ls -a",
    "ls -A",
    "ls -1 docs",
    "ls docs/",
    "ls -R docs",
    "ls -R",
    "ls -d docs src",
    "ls -F",
    "ls -p docs",
    "ls -r",
    "ls -S docs/guides",
    "ls -S -r notes",
    "ls nope",
    "ls nope docs",
    "ls docs/api src/lib README.md",
    "ls README.md/",
    "ls -z",
    "ls --bogus",
    "ls -a 'with space'",
    // cat / head / tail / wc
    "cat docs/intro.md",
    "cat README.md docs/api.txt",
    "cat nope",
    "cat docs",
    "cat -n docs/latin1.txt",
    "cat -A docs/binary.dat",
    "cat -s -E docs/long.md | head -3",
    "cat 'with space/file name.md'",
    "cat < docs/latin1.txt",
    "head docs/long.md",
    "head -n 3 docs/long.md",
    "head -3 docs/long.md docs/latin1.txt",
    "head -c 20 docs/long.md",
    "head -n -2995 docs/long.md",
    "head nope",
    "head docs docs/latin1.txt",
    "head -n x docs/long.md",
    "tail docs/long.md",
    "tail -n 2 docs/long.md docs/latin1.txt",
    "tail -n +2998 docs/long.md",
    "tail -c 7 docs/long.md",
    "tail -q -n1 docs/long.md docs/latin1.txt",
    "tail nope",
    "wc docs/long.md",
    "wc -l docs/long.md",
    "wc -l docs/long.md docs/latin1.txt",
    "wc -w -c docs/latin1.txt",
    "wc -m -L docs/latin1.txt",
    "wc docs",
    "wc nope docs/long.md",
    "cat docs/long.md | wc",
    "cat docs/long.md | wc -l",
    "wc < docs/long.md",
    "wc -l < docs/long.md",
    "wc empty.txt",
    // grep
    "grep -rn 'rate limit' .",
    "grep -rn 'rate limit'",
    "grep -rn 'rate limit' docs | head",
    "grep -r rate docs/api",
    "grep -rl limit .",
    "grep -rL limit .",
    "grep -rc limit docs",
    "grep -ri 'RATE' docs/api",
    "grep -rw 'rate' docs/guides",
    "grep -rv 'rate' docs/api",
    "grep -rn -E 'rat(e|s) lim' docs",
    "grep -rnF '[x]' .",
    "grep -rno 'r[a-z]*e' docs/api",
    "grep -rn -A2 'about rate limit number 12' docs/long.md | head -20",
    "grep -n -B1 -C1 'line 10 ' docs/long.md",
    "grep -n -C2 -m3 rate docs/long.md",
    "grep --include='*.md' -rn timeout .",
    "grep --exclude='*.md' -rl timeout .",
    "grep --exclude-dir=docs -rl rate .",
    "grep rate docs/binary.dat",
    "grep -c rate docs/binary.dat",
    "grep -a rate docs/binary.dat",
    "grep rate docs/latin1.txt",
    "grep -n rate docs/latin1.txt docs/api.txt",
    "grep -x 'rate again' docs/latin1.txt",
    "grep rate nope docs/latin1.txt",
    "grep -s rate nope docs/latin1.txt",
    "grep rate docs",
    "grep -c rate docs",
    "grep -q rate docs/latin1.txt",
    "grep -q nomatch docs/latin1.txt",
    "grep -h rate docs/latin1.txt docs/long.md | head -3",
    "grep -H rate docs/latin1.txt",
    "grep -e rate -e timeout -n docs/api.txt",
    "grep '\\(ra\\)te' docs/latin1.txt",
    "grep 'a\\{2\\}' -r .",
    "grep -E 'x{1,2}y' -r .",
    "grep '[[:digit:]]\\+' -c docs/long.md",
    "grep '[' docs/latin1.txt",
    "grep -E '(' docs/latin1.txt",
    "grep '[:space:]' docs/latin1.txt",
    "grep -i 'café' -r .",
    "grep -w -o 'rate' docs/latin1.txt",
    "grep -rn '^rate' .",
    "grep -rn 'limit$' .",
    "grep -rn '\\<api\\>' docs",
    "grep -r -Z -l rate docs/api",
    "grep -b rate docs/latin1.txt",
    "grep -m1 rate -r docs",
    "grep",
    "grep -y RATE docs/latin1.txt",
    "grep -rn '' empty.txt",
    "grep -v '' docs/latin1.txt",
    "grep -c '' docs/latin1.txt",
    "grep -rn '\\$z' .",
    "grep -rnF '*' docs/api",
    "echo 'hello rate' | grep rate",
    "echo hello | grep -c x",
    "grep rate - < docs/latin1.txt",
    // find
    "find docs",
    "find .",
    "find docs -name '*.md'",
    "find . -iname 'readme*'",
    "find . -type d",
    "find . -type f -name '*.txt'",
    "find docs/ -maxdepth 1",
    "find . -mindepth 2 -maxdepth 2 -type d",
    "find . -path '*api*' -type f",
    "find . -type f -size +2k",
    "find . -size -1",
    "find . -size 0",
    "find . -empty",
    "find . -name '*.md' -o -name '*.txt'",
    "find . \\( -name '*.md' -o -name '*.txt' \\) -print",
    "find . ! -name '*.md' -type f",
    "find . -not -path './docs/*' -type f",
    "find docs -name api -prune -o -print",
    "find nope",
    "find docs nope src",
    "find . -foo",
    "find . -name",
    "find . -type q",
    "find . -size 3x",
    "find docs -type f -printf '%p|%f|%h|%s|%d|%P|%y\\n'",
    "find docs -printf '%p|%f|%h|%d|%P|%y\\n'",
    "find docs -type f -print0 | tr '\\0' '\\n'",
    "find docs/api -type f -exec wc -l {} \\;",
    "find docs/api -type f -exec wc -l {} +",
    "find . -name '*.rs' -exec grep -l rate {} \\;",
    "find . -depth -type d",
    "find docs -quit",
    "find . -name 'a*.md' | sort",
    // tree
    "tree",
    "tree docs",
    "tree -a",
    "tree -d",
    "tree -L 1",
    "tree -L 2 docs",
    "tree -f docs/api",
    "tree -F src",
    "tree --noreport docs/api",
    "tree docs src",
    "tree nope",
    "tree README.md",
    "tree -P '*.md' docs",
    "tree -I '*.md' docs",
    // text tools
    "sort docs/latin1.txt",
    "sort -r docs/api.txt",
    "cat docs/*.md | sort | uniq -c | sort -rn | head",
    "sort -n docs/long.md | head -3",
    "sort -k2,2n -t' ' docs/long.md | head -5",
    "sort -u docs/latin1.txt docs/latin1.txt",
    "sort -f README.md",
    "sort nope",
    "cut -d' ' -f1,3 docs/long.md | head -3",
    "cut -c1-5 docs/long.md | uniq | head -3",
    "cut -f2 docs/api.txt",
    "cut -d' ' -f2- -s docs/latin1.txt",
    "cut docs/long.md",
    "cut -f0 docs/long.md",
    "uniq -c docs/latin1.txt",
    "sort docs/long.md | uniq -d | head",
    "tr a-z A-Z < docs/latin1.txt",
    "tr -d ' ' < docs/latin1.txt",
    "tr -s ' ' < docs/long.md | head -2",
    "basename docs/api/v2.md .md",
    "dirname docs/api/v2.md",
    "seq 5",
    "seq 2 2 9",
    "printf '%s-%d\\n' a 1 b 2",
    "printf '%5s|%-5s|%05d\\n' x y 42",
    "echo -n hi; echo there",
    "echo -e 'a\\tb'",
    // shell features
    "cd docs && ls",
    "cd docs/api; ls; cd ..; ls",
    "cd nope",
    "cd README.md",
    "cd docs src",
    "cd 'with space' && cat 'file name.md'",
    "ls *.md",
    "ls docs/*.md",
    "ls */",
    "ls nomatch*",
    "echo docs/a*",
    "echo .*",
    "echo *",
    "echo d?cs",
    "echo [dn]*",
    "echo '*'",
    "echo \"docs/*\"",
    "ls | head -2 | tail -1",
    "false || echo fallback",
    "true && echo yes",
    "false && echo never; echo $?",
    "grep -q rate docs/latin1.txt && echo found",
    "nosuchcommand",
    "nosuchcommand 2>/dev/null; echo $?",
    "cat nope 2>/dev/null || echo missing",
    "cat nope 2>&1 | wc -l",
    "ls nope docs 2>&1",
    "grep -r rate nope docs/api 2>&1",
    "echo hi > out.txt",
    "echo hi >> docs/intro.md",
    "echo hi > docs",
    "echo hi > nope/x.txt",
    "cat < nope",
    "ls > /dev/null && echo ok",
    "x=docs; ls $x",
    "for f in docs/api/*; do echo \"== $f\"; head -1 \"$f\"; done",
    "for d in docs src; do ls $d | wc -l; done",
    "if [ -d docs ]; then echo dir; else echo nodir; fi",
    "if test -f nope; then echo yes; else echo no; fi",
    "[ -f README.md ] && echo file",
    "! grep -q zzz docs/latin1.txt && echo negated",
    "ls |",
    "| ls",
    "echo 'unterminated",
    "ls )",
    "echo $HOME",
    "find . -name '*.md' | xargs grep -l timeout",
    "find docs/api -type f | xargs wc -l",
    "echo docs src | xargs -n1 echo dir:",
    "touch new.txt",
    "mkdir docs",
    "mkdir newdir",
    "rm docs/intro.md",
    "rm nope",
    "rm docs",
    "cp docs/intro.md copy.md",
    "mv docs/intro.md moved.md",
    "echo x | tee out.txt",
    "exit 3",
    "echo a; exit 4; echo b",
    "(cd docs; ls) ; ls -d docs",
    "{ echo a; echo b; } | wc -l",
    "type ls cd",
    // early-closing readers (SIGPIPE semantics)
    // (GNU's stderr after the reader exits is timing-dependent, so only
    // commands without late diagnostics are compared here.)
    "grep -rn rate docs/api | head -3",
    "grep -rn rate src | head -n 2; echo $?",
    "cat docs/long.md | head -c 10",
    "seq 100 | head -n5 | tail -1",
    "{ echo a; echo b; echo c; } | head -1",
    "ls nope docs | head -1",
    "find . -type f | head",
    "for f in docs/*; do echo $f; done | head -2",
];

/// Sequences of command lines run in one session with a scratch area, and with
/// real bash on a writable copy of the tree, compared line by line. Readers are
/// ones whose output does not depend on directory order on disk (new entries
/// land anywhere in a real directory; the virtual shell keeps names sorted),
/// and every path is relative (the real side runs in the copy).
const WRITE_CASES: &[&[&str]] = &[
    &[
        "echo hello > new.txt",
        "cat new.txt",
        "ls",
        "echo more >> new.txt; cat new.txt",
        "wc -l new.txt",
        "printf '%s\n' b a > f && sort f && cat f",
    ],
    &[
        "echo hi >> docs/latin1.txt",
        "tail -2 docs/latin1.txt",
        "grep -c hi docs/latin1.txt",
        "grep -rn '^hi$' . | sort",
        "echo 'zebra unique' > docs/long.md",
        "grep -rn zebra . | sort",
        "grep -c 'rate limit' docs/long.md",
        "grep -rl 'long document' .; echo $?",
        "wc docs/long.md",
    ],
    &[
        "mkdir newdir",
        "mkdir newdir",
        "mkdir -p a/b/c && ls -R a",
        "mkdir -p docs/long.md/x",
        "mkdir nope/x",
        "mkdir docs/long.md/x",
        "mkdir -v q",
        "mkdir -pv r/s",
        "mkdir",
        "mkdir -p newdir ./q/ && ls -d */",
        "mkdir ''",
        "mkdir --bogus",
    ],
    &[
        "rm docs/latin1.txt",
        "ls docs",
        "cat docs/latin1.txt",
        "rm docs/latin1.txt",
        "rm -f docs/latin1.txt; echo $?",
        "rm docs",
        "rm -d docs",
        "grep -rl 'rate again' .; echo $?",
        "rm docs/long.md/",
        "rm -r nope docs/api",
        "find docs | sort",
        "rm",
        "rm -f",
        "rm -r .",
        "rm -r docs/..",
        "rm ''",
    ],
    &[
        "rm -r docs/api",
        "ls docs",
        "grep -rl rate docs | sort",
        "rmdir docs/guides",
        "rm -r deep && ls",
        "find . -type d | sort",
        "tree docs",
    ],
    &[
        "rmdir docs",
        "rmdir nope",
        "rmdir docs/long.md",
        "mkdir -p e/f/g && rmdir -p e/f/g && ls",
        "rmdir .",
        "mkdir k && rmdir -v k",
        "rmdir",
    ],
    &[
        "cp docs/latin1.txt copy.txt && cat copy.txt",
        "cp docs/latin1.txt docs/latin1.txt",
        "cp docs newdocs",
        "cp -r docs/api apicopy && find apicopy | sort",
        "cat docs/api/* | wc -c; cat apicopy/* | wc -c",
        "cp -r docs/api apicopy && find apicopy | sort",
        "cp nope x",
        "cp docs/long.md nope/x",
        "cp docs/long.md docs/latin1.txt/x",
        "cp empty.txt docs/latin1.txt src && ls src",
        "cp empty.txt docs/latin1.txt missingdir",
        "cp empty.txt docs/latin1.txt empty.txt",
        "cp docs/long.md empty.txt && wc -l empty.txt",
        "cp -r docs src/lib && ls src/lib/docs",
        "cp -r docs empty.txt",
        "mkdir -p z/long.md && cp docs/long.md z",
        "cp -n docs/latin1.txt copy.txt; cat copy.txt",
        "cp -T docs/long.md t1 && wc -c t1",
        "cp -t src docs/long.md && ls src",
        "cp -t nope docs/long.md",
        "cp",
        "cp docs/long.md",
        "cp docs/long.md newname/",
        "cp -z a b",
    ],
    &[
        "mv docs/latin1.txt moved.txt && ls docs && cat moved.txt",
        "mv moved.txt docs/long.md && wc -l docs/long.md",
        "mv docs/api src && ls src && find src/api | sort",
        "mv docs docs/guides",
        "mv src src",
        "mv nope x",
        "mv empty.txt nope/x",
        "mv notes Notes2 && ls Notes2",
        "mv deep/a/b deep/a/b/c",
        "mkdir -p t/docs && mv docs t && find t | sort",
        "mkdir -p u/src/x && mv src u",
        "mkdir -p v/empty.txt && mv empty.txt v",
        "mv v/empty.txt g.txt && mv empty.txt g.txt && find g.txt",
        "mv t/docs/long.md t",
        "mv t/docs t/docs",
        "mv g.txt nosuchdir/ && find nosuchdir",
        "mv -v t/long.md t2.md",
        "mv -n t2.md 'with space/file name.md'; ls",
        "mv . x",
        "mv",
        "mv x",
    ],
    &[
        "echo x | tee t1 t2 > /dev/null; cat t1 t2",
        "echo y | tee -a t1; cat t1",
        "echo z | tee docs nope/x",
        "seq 3 | tee -a docs/long.md | wc -l; tail -4 docs/long.md",
        "ls docs | tee listing.txt | wc -l; cat listing.txt",
    ],
    &[
        "touch newfile && ls newfile && wc -c newfile",
        "touch nope/x",
        "touch docs/long.md/x",
        "touch -c ghost; ls ghost",
        "touch",
        "touch empty.txt docs && ls",
        "touch docs/long.md/",
        "touch ghost/",
        "touch -d bogus x",
        "touch -d @0 old && touch -t 202001020304.05 old2 && ls -t old old2 docs/long.md",
        "touch -r old docs/long.md && ls -t old2 docs/long.md",
    ],
    &[
        "echo x > docs",
        "echo x > nope/y",
        "echo x > docs/long.md/y",
        "echo x > newdir/",
        "echo x > ''",
        "cat docs/latin1.txt > out && cat out",
        "cat out >> out",
        "cat out > out; wc -c out",
        "sort -r docs/latin1.txt > sorted && cat sorted",
        "for i in 1 2 3; do echo line $i >> loop.txt; done; cat loop.txt",
        "{ echo a; echo b; } > grp.txt; cat grp.txt",
        "(cd docs && echo inner > inner.txt); cat docs/inner.txt",
        "ls nope 2> e.txt; cat e.txt",
        "ls nope docs/api > both.txt 2>&1; cat both.txt",
        "grep -r inner . | sort",
        "wc -l < loop.txt",
    ],
    &[
        "truncate -s 5 docs/latin1.txt && cat docs/latin1.txt",
        "truncate -s +3 empty.txt && wc -c empty.txt",
        "truncate -s 2K fresh && wc -c fresh",
        "truncate -c -s 1 nofile; ls nofile",
        "truncate",
        "truncate -s 1",
        "truncate -s x docs/long.md",
    ],
    &[
        "mkdir -p w/x && cd w/x && touch y && ls && cd .. && ls",
        "touch .dotfile newglob.md && echo *.md && echo .d*",
        "cd docs && rm long.md && ls long.md",
        "mkdir d1 && cd d1 && rm -r ../d1; ls",
        "sort -r docs/latin1.txt -o s.txt && cat s.txt",
        "sort -o docs/latin1.txt docs/latin1.txt && cat docs/latin1.txt",
        "sort -o nope/x docs/latin1.txt",
        "uniq docs/latin1.txt u.txt && cat u.txt",
        "uniq docs/latin1.txt nope/u.txt",
        "find docs/api -name '*.md' -delete; find docs/api | sort",
        "find docs -type d -delete",
        "mkdir -p e1/e2 && find e1 -delete; ls e1",
    ],
];

fn differential(base: &Path) {
    for t in ["bash", "grep", "find", "tree", "sort", "xargs"] {
        require_tool(t);
    }
    let files = fixture_files(7);
    let tree_dir = TempDir::new(base, "tree");
    let root = tree_dir.path.join("root");
    std::fs::create_dir(&root).unwrap();
    write_sorted(&root, &files, 1_700_000_000);
    let store_dir = TempDir::new(Path::new("/tmp"), "store");
    let store = Store::open(&store_dir.path).unwrap();
    store
        .create(
            "fixture",
            Source::Dir { path: root.clone() },
            IngestOptions::default(),
        )
        .unwrap();
    let coll = store.collection("fixture").unwrap();
    let mut failures = Vec::new();
    for cmd in COMMANDS {
        // A fresh session per command, so `cd` does not leak between cases.
        let mut s = coll
            .open_session(Principal::operator(), Limits::default())
            .unwrap();
        let v = s.run(cmd).unwrap();
        let (out, err, code) = real_bash(&root, cmd);
        if v.stdout != out || v.stderr != err || v.exit_code != code {
            failures.push(format!(
                "### {cmd}\n--- virtual (exit {}):\n{}{}--- real (exit {code}):\n{}{}",
                v.exit_code,
                String::from_utf8_lossy(&v.stdout),
                String::from_utf8_lossy(&v.stderr),
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&err),
            ));
        }
    }
    failures.extend(write_differential(base, &coll, &files));
    // Nothing a scratch session did reached the collection or another session.
    let mut s = coll
        .open_session(Principal::operator(), Limits::default())
        .unwrap();
    for cmd in [
        "find . | sort",
        "cat docs/long.md | wc -c",
        "ls -a docs",
        "grep -c rate docs/latin1.txt",
    ] {
        let v = s.run(cmd).unwrap();
        let (out, err, code) = real_bash(&root, cmd);
        if (v.stdout.as_slice(), v.stderr.as_slice(), v.exit_code) != (&out[..], &err[..], code) {
            failures.push(format!("### after the scratch sessions: {cmd}"));
        }
    }
    // The real side must not have modified the tree (all writes are refused virtually).
    assert!(
        failures.is_empty(),
        "{} of {} commands differ:\n{}",
        failures.len(),
        COMMANDS.len() + WRITE_CASES.iter().map(|c| c.len()).sum::<usize>(),
        failures.join("\n")
    );
}

#[test]
fn virtual_shell_matches_gnu_tools_byte_for_byte() {
    let shm = Path::new("/dev/shm");
    assert!(
        shm.is_dir(),
        "/dev/shm (tmpfs) is required for a controllable directory order"
    );
    differential(shm);
}

/// Run every [`WRITE_CASES`] sequence in a fresh scratch session and in real
/// bash on a fresh writable copy of the tree; the differences.
fn write_differential(
    base: &Path,
    coll: &Collection,
    files: &std::collections::BTreeMap<String, Vec<u8>>,
) -> Vec<String> {
    let mut failures = Vec::new();
    for case in WRITE_CASES {
        let copy = TempDir::new(base, "rw");
        let root = copy.path.join("root");
        std::fs::create_dir(&root).unwrap();
        write_sorted(&root, files, 1_700_000_000);
        let mut s = coll
            .open_session(Principal::operator(), Limits::default())
            .unwrap()
            .with_scratch(ScratchLimits::default());
        for line in *case {
            let v = s.run(line).unwrap();
            // Each real line is a new bash at the root: so is each virtual one
            // (the files persist, the working directory does not).
            s.run("cd /").unwrap();
            let (out, err, code) = real_bash_rw(&root, line);
            if v.stdout != out || v.stderr != err || v.exit_code != code {
                failures.push(format!(
                    "### [scratch, after {:?}] {line}\n--- virtual (exit {}):\n{}{}--- real (exit {code}):\n{}{}",
                    &case[..case.iter().position(|l| l == line).unwrap_or(0)],
                    v.exit_code,
                    String::from_utf8_lossy(&v.stdout),
                    String::from_utf8_lossy(&v.stderr),
                    String::from_utf8_lossy(&out),
                    String::from_utf8_lossy(&err),
                ));
            }
        }
    }
    failures
}

/// A tree with empty directories (`ls`, `ls -R`, `find -type d`, `tree` show them
/// in GNU) lists the same through the virtual shell: ingest used to drop every
/// directory without a document under it.
#[test]
fn empty_directories_list_as_gnu_lists_them() {
    for t in ["bash", "find", "tree", "sort"] {
        require_tool(t);
    }
    let tree_dir = TempDir::new(Path::new("/dev/shm"), "empty-dirs");
    let root = tree_dir.path.join("root");
    for d in ["docs", "empty", "nested/deeper/deepest", "docs/empty-too"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::write(root.join("docs/a.md"), "a\n").unwrap();
    std::fs::write(root.join("top.txt"), "top\n").unwrap();
    let store_dir = TempDir::new(Path::new("/tmp"), "store");
    let store = Store::open(&store_dir.path).unwrap();
    store
        .create(
            "empties",
            Source::Dir { path: root.clone() },
            IngestOptions::default(),
        )
        .unwrap();
    let coll = store.collection("empties").unwrap();
    let mut failures = Vec::new();
    for cmd in [
        "ls",
        "ls -R",
        "ls empty",
        "ls -a nested/deeper",
        "ls -d */",
        "find . -type d | sort",
        "find . | sort",
        "find empty nested -type d | sort",
        "tree",
        "cd empty && ls -a",
    ] {
        let mut s = coll
            .open_session(Principal::operator(), Limits::default())
            .unwrap();
        let v = s.run(cmd).unwrap();
        let (out, err, code) = real_bash(&root, cmd);
        if v.stdout != out || v.stderr != err || v.exit_code != code {
            failures.push(format!(
                "### {cmd}\n--- virtual (exit {}):\n{}{}--- real (exit {code}):\n{}{}",
                v.exit_code,
                String::from_utf8_lossy(&v.stdout),
                String::from_utf8_lossy(&v.stderr),
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&err),
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
