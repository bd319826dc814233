use super::*;

/// The user and group this test runs as. The test layers' entries belong to
/// them: `unpack` keeps ownership, only root may give a file to another user,
/// and unit tests run without root.
fn own_ids() -> (u64, u64) {
    let f = tempfile::tempfile().unwrap();
    let md = f.metadata().unwrap();
    (md.uid().into(), md.gid().into())
}

/// A layer tar of raw headers: (path, type, link target, mode).
fn tar_raw(entries: &[(&str, tar::EntryType, &str, u32)]) -> Vec<u8> {
    let (uid, gid) = own_ids();
    let mut b = tar::Builder::new(Vec::new());
    for (path, ty, link, mode) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(*ty);
        h.set_mode(*mode);
        h.set_uid(uid);
        h.set_gid(gid);
        h.set_mtime(1_700_000_000);
        h.set_size(0);
        if ty.is_symlink() {
            b.append_link(&mut h, path, link).unwrap();
        } else {
            b.append_data(&mut h, path, &[][..]).unwrap();
        }
    }
    b.into_inner().unwrap()
}

/// Found by probing imports: a whiteout or an opaque marker under a symbolic link
/// that the same layer made followed the link, and deleted or created things
/// anywhere on the host, as root (`a -> /victims`, then `a/.wh.file`).
#[test]
fn whiteouts_never_reach_through_a_symlink() {
    let t = tempfile::tempdir().unwrap();
    let outside = t.path().join("outside");
    fs::create_dir_all(outside.join("vdir")).unwrap();
    fs::write(outside.join("victim"), "precious").unwrap();
    let out = outside.to_str().unwrap();
    for (i, entry) in [
        "a/.wh.victim",
        "a/.wh.vdir",
        "a/newdir/.wh..wh..opq",
        "a/pipe",
    ]
    .into_iter()
    .enumerate()
    {
        let ty = if entry.ends_with("pipe") {
            tar::EntryType::Fifo
        } else {
            tar::EntryType::Regular
        };
        let layer = t.path().join(format!("layer{i}"));
        fs::create_dir(&layer).unwrap();
        let tar = tar_raw(&[
            ("a", tar::EntryType::Symlink, out, 0o777),
            (entry, ty, "", 0o644),
        ]);
        let e = unpack(&tar[..], &layer).unwrap_err();
        assert!(
            e.to_string().contains("path goes through a symbolic link"),
            "{entry}: {e}"
        );
    }
    // Relative links are refused the same way.
    let layer = t.path().join("layer-rel");
    fs::create_dir(&layer).unwrap();
    let tar = tar_raw(&[
        ("a", tar::EntryType::Symlink, "../outside", 0o777),
        ("a/.wh.victim", tar::EntryType::Regular, "", 0o644),
    ]);
    assert!(unpack(&tar[..], &layer).is_err());
    assert_eq!(
        fs::read_to_string(outside.join("victim")).unwrap(),
        "precious"
    );
    assert!(outside.join("vdir").is_dir());
    assert!(!outside.join("newdir").exists());
    assert!(!outside.join("pipe").exists());
    // Whiteouts in real directories of the layer still work.
    let layer = t.path().join("layer-ok");
    fs::create_dir(&layer).unwrap();
    let tar = tar_raw(&[
        ("d", tar::EntryType::Directory, "", 0o755),
        ("d/.wh.gone", tar::EntryType::Regular, "", 0o644),
        ("e/f/.wh..wh..opq", tar::EntryType::Regular, "", 0o644),
    ]);
    let st = unpack(&tar[..], &layer).unwrap();
    assert_eq!((st.whiteouts, st.opaque_dirs), (1, 1));
    assert!(is_whiteout(
        &fs::symlink_metadata(layer.join("d/gone")).unwrap()
    ));
    assert!(is_opaque(&layer.join("e/f")));
}

/// Found by probing snapshots: a FIFO in a layer became an empty regular file.
#[test]
fn fifos_stay_fifos() {
    let t = tempfile::tempdir().unwrap();
    let tar = tar_raw(&[
        ("opt", tar::EntryType::Directory, "", 0o755),
        ("opt/myfifo", tar::EntryType::Fifo, "", 0o640),
    ]);
    unpack(&tar[..], t.path()).unwrap();
    let md = fs::symlink_metadata(t.path().join("opt/myfifo")).unwrap();
    assert!(md.file_type().is_fifo(), "{:?}", md.file_type());
    assert_eq!(md.mode() & 0o7777, 0o640);
    assert_eq!(md.mtime(), 1_700_000_000);
    // And back into a layer as a FIFO.
    let packed = pack(t.path(), Vec::new(), &mut Budget::unlimited()).unwrap();
    let mut ar = tar::Archive::new(&packed[..]);
    let fifo = ar
        .entries()
        .unwrap()
        .map(|e| e.unwrap())
        .find(|e| e.path().unwrap().ends_with("myfifo"))
        .unwrap();
    assert!(fifo.header().entry_type().is_fifo());
}

fn tar_of(entries: &[(&str, Option<&[u8]>)]) -> Vec<u8> {
    let (uid, gid) = own_ids();
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_uid(uid);
        h.set_gid(gid);
        h.set_mtime(0);
        match data {
            Some(d) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(0o644);
                h.set_size(d.len() as u64);
                b.append_data(&mut h, path, *d).unwrap();
            }
            None => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                b.append_data(&mut h, path, &[][..]).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

#[test]
fn whiteouts_become_overlay_whiteouts_and_back() {
    let t = tempfile::tempdir().unwrap();
    let l1 = t.path().join("l1");
    let l2 = t.path().join("l2");
    fs::create_dir(&l1).unwrap();
    fs::create_dir(&l2).unwrap();
    unpack(
        &tar_of(&[
            ("etc", None),
            ("etc/a", Some(b"a")),
            ("etc/b", Some(b"b")),
            ("opt", None),
            ("opt/x", Some(b"x")),
        ])[..],
        &l1,
    )
    .unwrap();
    let st = unpack(
        &tar_of(&[
            ("etc/.wh.a", Some(b"")),
            ("opt/.wh..wh..opq", Some(b"")),
            ("opt/y", Some(b"y")),
            ("new", Some(b"n")),
        ])[..],
        &l2,
    )
    .unwrap();
    assert_eq!((st.whiteouts, st.opaque_dirs), (1, 1));
    let md = fs::symlink_metadata(l2.join("etc/a")).unwrap();
    assert!(md.file_type().is_char_device() && md.rdev() == 0);
    assert!(is_opaque(&l2.join("opt")));

    let tree = flatten(&[l1.clone(), l2.clone()], &mut Budget::unlimited()).unwrap();
    let keys: Vec<&str> = tree.keys().map(String::as_str).collect();
    assert_eq!(keys, ["/etc", "/etc/b", "/new", "/opt", "/opt/y"]);

    // Packing the overlay-format layer gives OCI whiteouts again.
    let packed = pack(&l2, Vec::new(), &mut Budget::unlimited()).unwrap();
    let mut ar = tar::Archive::new(&packed[..]);
    let names: Vec<String> = ar
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    assert!(names.contains(&"etc/.wh.a".to_string()), "{names:?}");
    assert!(names.contains(&"opt/.wh..wh..opq".to_string()), "{names:?}");
    // Deterministic.
    assert_eq!(
        packed,
        pack(&l2, Vec::new(), &mut Budget::unlimited()).unwrap()
    );
}

#[test]
fn escaping_paths_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(1);
    h.set_mode(0o644);
    // Bypass the builder's own path check.
    h.as_gnu_mut().unwrap().name[..9].copy_from_slice(b"../escape");
    h.set_cksum();
    b.append(&h, &b"x"[..]).unwrap();
    let data = b.into_inner().unwrap();
    let e = unpack(&data[..], t.path()).unwrap_err();
    assert!(e.to_string().contains("escapes"), "{e}");
    assert!(!t.path().parent().unwrap().join("escape").exists());
}

#[test]
fn diff_reports_added_changed_removed() {
    let t = tempfile::tempdir().unwrap();
    let a = t.path().join("a");
    let b = t.path().join("b");
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    unpack(
        &tar_of(&[("k", Some(b"same")), ("c", Some(b"one")), ("r", Some(b"r"))])[..],
        &a,
    )
    .unwrap();
    unpack(
        &tar_of(&[("k", Some(b"same")), ("c", Some(b"two")), ("n", Some(b"n"))])[..],
        &b,
    )
    .unwrap();
    let mut budget = Budget::unlimited();
    let d = diff(
        &flatten(&[a], &mut budget).unwrap(),
        &flatten(&[b], &mut budget).unwrap(),
        &mut budget,
    )
    .unwrap();
    assert_eq!(d.added, ["/n"]);
    assert_eq!(d.changed, ["/c"]);
    assert_eq!(d.removed, ["/r"]);
}

/// A sparse file of `size` bytes with `data` written at each offset of `at`.
fn sparse_file(p: &Path, size: u64, at: &[u64], data: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = fs::File::create(p).unwrap();
    f.set_len(size).unwrap();
    for &o in at {
        f.write_all_at(data, o).unwrap();
    }
}

/// Found by an outside review: a snapshot of a sparse file wrote every hole as
/// zeros (a 2 GiB file of no blocks became a 2 GiB layer, twice). Packed with
/// its data runs only, it unpacks with its holes and its bytes.
#[test]
fn sparse_files_pack_and_unpack_with_their_holes() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    let size = 256 << 20;
    // Data at the start, in the middle (more runs than a header holds), and a
    // trailing hole; a file of holes only; an ordinary file.
    let at: Vec<u64> = (0..30).map(|i| i * (8 << 20)).collect();
    sparse_file(&src.join("sparse"), size, &at, b"data!");
    sparse_file(&src.join("holes"), 64 << 20, &[], b"");
    fs::write(src.join("plain"), b"plain bytes").unwrap();
    let mut budget = Budget::unlimited();
    let tar = pack(&src, Vec::new(), &mut budget).unwrap();
    assert!(
        tar.len() < 1 << 20,
        "the tar holds the data only: {}",
        tar.len()
    );
    // Counted as read: the apparent sizes.
    assert!(budget.used() > size + (64 << 20), "{}", budget.used());

    let dst = t.path().join("dst");
    fs::create_dir(&dst).unwrap();
    unpack(&tar[..], &dst).unwrap();
    for (name, len) in [("sparse", size), ("holes", 64 << 20)] {
        let md = fs::metadata(dst.join(name)).unwrap();
        assert_eq!(md.len(), len, "{name}");
        assert!(
            md.blocks() * 512 < 4 << 20,
            "{name}: {} blocks",
            md.blocks()
        );
    }
    let got = fs::read(dst.join("sparse")).unwrap();
    let mut want = vec![0u8; size as usize];
    for &o in &at {
        want[o as usize..o as usize + 5].copy_from_slice(b"data!");
    }
    assert!(
        got == want,
        "the sparse file's bytes differ after a round trip"
    );
    assert_eq!(fs::read(dst.join("plain")).unwrap(), b"plain bytes");
    // Deterministic, and the same tree again gives the same tar.
    assert_eq!(
        tar,
        pack(&dst, Vec::new(), &mut Budget::unlimited()).unwrap()
    );
}

/// Found by an outside review: nothing bounded what a layer expands to. Holes,
/// entries and file sizes count; past the limit packing stops with an error
/// naming the limit.
/// What the runtime made in a writable layer to mount on (`dev`, `proc`,
/// `run` for `run/secrets`) or wrote there (`etc/hostname`) is not the
/// sandbox's change: a snapshot listed them as added files. Stubs with content,
/// written files the sandbox changed, and directories holding anything else,
/// are kept.
#[test]
fn runtime_stubs_are_left_out_of_a_packed_layer() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    for dir in ["dev", "proc", "run/secrets", "data/sub", "tmp"] {
        fs::create_dir_all(d.join(dir)).unwrap();
    }
    fs::create_dir_all(d.join("etc")).unwrap();
    fs::write(d.join("etc/hosts"), "").unwrap();
    fs::write(d.join("etc/hostname"), "").unwrap();
    fs::write(d.join("etc/written"), "mine").unwrap();
    fs::write(d.join("tmp/kept"), "not a stub").unwrap();
    fs::write(d.join("etc/identity"), "sb\n").unwrap();
    fs::write(d.join("etc/changed"), "the sandbox's").unwrap();
    let stubs = [
        "dev",
        "proc",
        "run/secrets",
        "etc/hosts",
        "etc/hostname",
        "tmp",
        "dev/pts",
    ]
    .into_iter()
    .map(PathBuf::from)
    .collect();
    let written = [("etc/identity", "sb\n"), ("etc/changed", "the runtime's")]
        .into_iter()
        .map(|(p, c)| (PathBuf::from(p), c.as_bytes().to_vec()))
        .collect();
    let source = PackSource {
        stubs,
        written,
        ..Default::default()
    };
    let tar = pack_from(d, &source, Vec::new(), &mut Budget::unlimited()).unwrap();
    let mut names: Vec<String> = tar::Archive::new(&tar[..])
        .entries()
        .unwrap()
        .map(|e| {
            e.unwrap()
                .path()
                .unwrap()
                .to_string_lossy()
                .trim_end_matches('/')
                .to_string()
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "data",
            "data/sub",
            "etc",
            "etc/changed",
            "etc/written",
            "tmp",
            "tmp/kept"
        ]
    );
    // Without stubs, everything is packed.
    let all = pack(d, Vec::new(), &mut Budget::unlimited()).unwrap();
    assert_eq!(tar::Archive::new(&all[..]).entries().unwrap().count(), 14);
}

/// A running sandbox's files carry the host ids of its range: the layer records
/// the ids inside, and an id of no range becomes the overflow id.
#[test]
fn host_ids_are_packed_as_the_ids_inside() {
    let map = IdMap::parse("0 100000 65536\n", "         0     100000      65536\n").unwrap();
    assert_eq!(
        (map.uid(100000), map.uid(101000), map.gid(165535)),
        (0, 1000, 65535)
    );
    assert_eq!(
        (map.uid(0), map.gid(165536)),
        (IdMap::OVERFLOW, IdMap::OVERFLOW)
    );
    assert_eq!(IdMap::parse("0 x 1", ""), None);

    let t = tempfile::tempdir().unwrap();
    fs::write(t.path().join("f"), b"x").unwrap();
    let md = fs::metadata(t.path().join("f")).unwrap();
    let source = PackSource {
        one_filesystem: true,
        ids: Some(IdMap {
            uids: vec![(7, md.uid(), 1)],
            gids: vec![(8, md.gid(), 1)],
        }),
        ..Default::default()
    };
    let tar = pack_from(t.path(), &source, Vec::new(), &mut Budget::unlimited()).unwrap();
    let mut ar = tar::Archive::new(&tar[..]);
    let owners: Vec<(String, u64, u64)> = ar
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let h = e.header();
            (
                e.path().unwrap().display().to_string(),
                h.uid().unwrap(),
                h.gid().unwrap(),
            )
        })
        .collect();
    assert_eq!(owners, [("f".to_string(), 7, 8)]);
}

/// A file of more data runs than a sparse map may hold is packed with its
/// smallest holes stored as zeros, so that its layer still unpacks within the
/// bound on what is read between entries (about 43,000 runs would pass it).
#[test]
fn the_smallest_holes_are_merged_until_the_runs_fit_a_sparse_map() {
    let mut runs = vec![(0, 1), (10, 11), (12, 13), (100, 101)];
    coalesce_runs(&mut runs, 2);
    assert_eq!(runs, [(0, 13), (100, 101)]);
    let mut many: Vec<(u64, u64)> = (0..100_000u64)
        .map(|i| (i * 8192, i * 8192 + 4096))
        .collect();
    coalesce_runs(&mut many, MAX_SPARSE_RUNS);
    assert_eq!(many.len(), MAX_SPARSE_RUNS);
    assert_eq!(
        (many[0].0, many.last().unwrap().1),
        (0, 99_999 * 8192 + 4096)
    );
    assert!(
        many.windows(2).all(|w| w[0].1 < w[1].0),
        "runs stay ordered and apart"
    );
    let map_blocks = (MAX_SPARSE_RUNS + 1 - 4).div_ceil(21) + 1;
    assert!((map_blocks * 512) as u64 <= crate::tar_bound::MAX_ENTRY_METADATA / 2);
}

/// A sandbox can nest directories thousands deep; packing them recursed once per
/// level and overflowed the stack (a test thread's 2 MiB at about 250 levels in a
/// debug build), which aborts the daemon.
#[test]
fn a_tree_nested_thousands_deep_is_packed_without_overflowing_the_stack() {
    let t = tempfile::tempdir().unwrap();
    let deep = |n: usize| {
        let mut p = t.path().to_path_buf();
        for _ in 0..n {
            p.push("a");
        }
        fs::create_dir_all(&p).unwrap();
    };
    // 1,500 levels of one-letter names: within PATH_MAX from the temporary
    // directory, and far past what recursion in a debug build survives.
    deep(1500);
    let tar = pack(t.path(), Vec::new(), &mut Budget::unlimited()).unwrap();
    let n = tar::Archive::new(&tar[..]).entries().unwrap().count();
    assert_eq!(n, 1500);
}

/// Merging layers for a diff walks a tree thousands deep without recursion (as
/// packing does) and without a descriptor held per level.
#[test]
fn a_tree_nested_thousands_deep_is_merged_without_overflowing_the_stack() {
    let t = tempfile::tempdir().unwrap();
    let mut p = t.path().to_path_buf();
    for _ in 0..1500 {
        p.push("a");
    }
    fs::create_dir_all(&p).unwrap();
    let tree = flatten(&[t.path().to_path_buf()], &mut Budget::unlimited()).unwrap();
    assert_eq!(tree.len(), 1500);
    assert!(
        tree.keys().any(|k| k.len() == 2 * 1500),
        "the deepest is there"
    );
}

/// A tree nested past PATH_MAX (made one directory at a time, as a sandbox can)
/// is the sandbox's: refused naming its path in the layer, never the host's.
#[test]
fn a_tree_nested_past_path_max_is_refused_as_the_layers_entry() {
    let t = tempfile::tempdir().unwrap();
    // 25 directories of 200 bytes, each made from inside the one before.
    let name = "d".repeat(200);
    let made = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd \"$1\" && for i in $(seq 25); do mkdir {name} && cd -P {name} || exit 1; done"
        ))
        .arg("sh")
        .arg(t.path())
        .status()
        .unwrap();
    assert!(made.success());
    let e = pack(t.path(), Vec::new(), &mut Budget::unlimited()).unwrap_err();
    assert!(matches!(e, LayerError::BadEntry { .. }), "{e}");
    assert!(e.to_string().contains("too long to pack"), "{e}");
    assert!(
        !e.to_string().contains(&t.path().display().to_string()),
        "{e}"
    );
    // Removing it takes the same descent.
    let _ = std::process::Command::new("rm")
        .arg("-rf")
        .arg(t.path())
        .status();
}

#[test]
fn packing_past_the_limit_is_refused_naming_it() {
    let t = tempfile::tempdir().unwrap();
    sparse_file(&t.path().join("big"), 2 << 30, &[], b"");
    let limit = SizeLimit {
        bytes: 64 << 20,
        name: "the test's limit (64M)".into(),
    };
    let e = pack(
        t.path(),
        Vec::new(),
        &mut Budget::new(Some(&limit), "the layer"),
    )
    .unwrap_err();
    assert!(matches!(e, LayerError::TooLarge { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("the layer is larger than the test's limit (64M)"),
        "{e}"
    );
    // Many empty files count too.
    let many = t.path().join("many");
    fs::create_dir(&many).unwrap();
    for i in 0..300 {
        fs::write(many.join(i.to_string()), b"").unwrap();
    }
    let small = SizeLimit {
        bytes: 100 << 10,
        name: "100K".into(),
    };
    let e = pack(
        &many,
        Vec::new(),
        &mut Budget::new(Some(&small), "the layer"),
    )
    .unwrap_err();
    assert!(matches!(e, LayerError::TooLarge { .. }), "{e}");
    // Under the limit it packs.
    fs::remove_file(t.path().join("big")).unwrap();
    fs::remove_dir_all(&many).unwrap();
    sparse_file(&t.path().join("fits"), 32 << 20, &[0], b"x");
    pack(
        t.path(),
        Vec::new(),
        &mut Budget::new(Some(&limit), "the layer"),
    )
    .unwrap();
}

/// Diffs read only where a file has data, compare hard links once, and stop at
/// the limit.
#[test]
fn diffs_skip_holes_and_stop_at_the_limit() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    sparse_file(&a.join("f"), 1 << 30, &[0, 512 << 20], b"same");
    sparse_file(&b.join("f"), 1 << 30, &[0, 512 << 20], b"same");
    sparse_file(&a.join("g"), 1 << 30, &[4096], b"one");
    sparse_file(&b.join("g"), 1 << 30, &[4096], b"two");
    for i in 0..50 {
        fs::hard_link(a.join("f"), a.join(format!("f{i}"))).unwrap();
        fs::hard_link(b.join("f"), b.join(format!("f{i}"))).unwrap();
    }
    let mut budget = Budget::unlimited();
    let (ta, tb) = (
        flatten(std::slice::from_ref(&a), &mut budget).unwrap(),
        flatten(std::slice::from_ref(&b), &mut budget).unwrap(),
    );
    let d = diff(&ta, &tb, &mut budget).unwrap();
    assert_eq!(d.changed, ["/g"]);
    assert!(budget.used() < 1 << 20, "read {} bytes", budget.used());
    let limit = SizeLimit {
        bytes: 1 << 20,
        name: "1M".into(),
    };
    // Two files of the same 8M of data must be read whole to compare.
    fs::write(a.join("h"), vec![1u8; 8 << 20]).unwrap();
    fs::write(b.join("h"), vec![1u8; 8 << 20]).unwrap();
    let mut budget = Budget::new(Some(&limit), "the diff");
    let (ta, tb) = (
        flatten(&[a], &mut budget).unwrap(),
        flatten(&[b], &mut budget).unwrap(),
    );
    let e = diff(&ta, &tb, &mut budget).unwrap_err();
    assert!(matches!(e, LayerError::TooLarge { .. }), "{e}");
}

#[test]
fn expanded_size_counts_holes_and_hard_links_once() {
    let t = tempfile::tempdir().unwrap();
    sparse_file(&t.path().join("f"), 100 << 20, &[], b"");
    for i in 0..10 {
        fs::hard_link(t.path().join("f"), t.path().join(format!("l{i}"))).unwrap();
    }
    let mut budget = Budget::unlimited();
    expanded_size(t.path(), &mut budget).unwrap();
    assert_eq!(budget.used(), (100 << 20) + 11 * 512);
    let limit = SizeLimit {
        bytes: 50 << 20,
        name: "50M".into(),
    };
    let e = expanded_size(t.path(), &mut Budget::new(Some(&limit), "the image")).unwrap_err();
    assert!(matches!(e, LayerError::TooLarge { .. }), "{e}");
}
