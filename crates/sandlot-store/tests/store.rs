//! Store round trips: directory → image → OCI archive → another store; digests
//! are verified; snapshots commit an overlay-format directory; prune.

use std::fs;
use std::path::Path;

use sandlot_store::{
    oci, Budget, Commit, ImageConfig, ImageName, ImageStore, LegacyOwners, ScopedTag, StoreError,
    Viewer,
};

fn tree(dir: &Path) {
    fs::create_dir_all(dir.join("etc")).unwrap();
    fs::create_dir_all(dir.join("usr/bin")).unwrap();
    fs::write(dir.join("etc/os-release"), "ID=test\n").unwrap();
    fs::write(dir.join("usr/bin/tool"), vec![7u8; 100_000]).unwrap();
    std::os::unix::fs::symlink("usr/bin", dir.join("bin")).unwrap();
}

fn cfg() -> ImageConfig {
    ImageConfig {
        env: vec!["PATH=/usr/bin:/bin".into(), "FOO=bar".into()],
        workdir: Some("/work".into()),
        user: None,
        entrypoint: vec![],
        cmd: vec!["/bin/sh".into()],
        host_base: false,
    }
}

fn nop(_: oci::Progress) {}

#[test]
fn export_import_round_trip_keeps_the_id_and_verifies_digests() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    tree(&src);
    let a = ImageStore::open(&t.path().join("a")).unwrap();
    let name = ImageName::parse("test/base:1").unwrap();
    let img = a.import_dir(&src, &cfg(), Some(&name)).unwrap();
    assert_eq!(img.tags, ["test/base:1"]);
    assert_eq!(img.config.env, cfg().env);
    assert_eq!(a.resolve("test/base:1").unwrap().id, img.id);
    assert_eq!(a.resolve(&img.id.hex()[..12]).unwrap().id, img.id);
    assert!(matches!(a.resolve("nope"), Err(StoreError::NotFound(_))));

    let archive = t.path().join("img.tar");
    let f = fs::File::create(&archive).unwrap();
    oci::export(&a, &img, std::slice::from_ref(&name), f, &nop).unwrap();

    let b = ImageStore::open(&t.path().join("b")).unwrap();
    let got = oci::import(&b, &archive, None, &nop).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].id, img.id,
        "the config bytes survive, so does the id"
    );
    assert_eq!(got[0].tags, ["test/base:1"]);
    let dirs = b.layer_dirs(&got[0]);
    assert_eq!(
        fs::read_to_string(dirs[0].join("etc/os-release")).unwrap(),
        "ID=test\n"
    );
    assert_eq!(
        fs::read_link(dirs[0].join("bin")).unwrap(),
        Path::new("usr/bin")
    );

    // Importing the same archive again reuses the layer.
    let again = oci::import(
        &b,
        &archive,
        Some(&ImageName::parse("other").unwrap()),
        &nop,
    )
    .unwrap();
    assert_eq!(again[0].id, img.id);
    assert_eq!(b.resolve("other:latest").unwrap().tags.len(), 2);

    // A corrupted blob is refused, naming the digest.
    let layout = t.path().join("layout");
    fs::create_dir(&layout).unwrap();
    tar::Archive::new(fs::File::open(&archive).unwrap())
        .unpack(&layout)
        .unwrap();
    let blob = layout.join("blobs/sha256").join(img.layers[0].blob.hex());
    let mut bytes = fs::read(&blob).unwrap();
    let n = bytes.len();
    bytes[n / 3] ^= 0xff;
    fs::write(&blob, bytes).unwrap();
    fs::remove_file(layout.join("manifest.json")).unwrap();
    let c = ImageStore::open(&t.path().join("c")).unwrap();
    let e = oci::import(&c, &layout, None, &nop).unwrap_err();
    assert!(matches!(e, StoreError::DigestMismatch { .. }), "{e}");
    assert!(
        e.to_string().contains(&img.layers[0].blob.to_string()),
        "{e}"
    );
}

#[test]
fn commit_diff_rm_and_prune() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    tree(&src);
    let s = ImageStore::open(&t.path().join("s")).unwrap();
    let base = s
        .import_dir(&src, &cfg(), Some(&ImageName::parse("base").unwrap()))
        .unwrap();

    // An overlay upper: one new file, one changed, one deleted (whiteout).
    let upper = t.path().join("upper");
    fs::create_dir_all(upper.join("etc")).unwrap();
    fs::write(upper.join("etc/os-release"), "ID=changed\n").unwrap();
    fs::write(upper.join("new.txt"), "hello").unwrap();
    sandlot_store::layer::make_whiteout(&upper.join("bin")).unwrap();
    let snap = s
        .commit(&base, &upper, &base.config, "snapshot", "snapshot", None)
        .unwrap();
    assert_eq!(snap.parent, Some(base.id));
    assert_eq!(snap.layers.len(), 2);
    let d = s.diff(&base, &snap, None).unwrap();
    assert_eq!(d.added, ["/new.txt"]);
    assert_eq!(d.changed, ["/etc/os-release"]);
    assert_eq!(d.removed, ["/bin"]);

    // A leased image cannot be removed; released, it can; prune frees its layer.
    s.lease("sb-1", &snap.id).unwrap();
    let e = s.remove(&snap.id.to_string()).unwrap_err();
    assert!(e.to_string().contains("sb-1"), "{e}");
    assert!(s.prune().unwrap().layers.is_empty());
    s.release("sb-1").unwrap();
    s.remove(&snap.id.to_string()).unwrap();
    let rep = s.prune().unwrap();
    assert_eq!(rep.layers, [snap.layers[1].diff_id]);
    assert!(!s.layer_dir(&snap.layers[1].diff_id).exists());
    assert!(
        s.layer_dir(&base.layers[0].diff_id).exists(),
        "base layers stay"
    );
    // Removing by name removes the last tag and the image.
    s.remove("base").unwrap();
    assert!(s.list().unwrap().is_empty());
    assert_eq!(s.prune().unwrap().layers.len(), 1);
}

/// A docker save archive of one file per entry.
fn docker_archive(path: &Path, files: &[(&str, &[u8])]) {
    let mut b = tar::Builder::new(fs::File::create(path).unwrap());
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.finish().unwrap();
}

/// Found by probing imports: the paths in a docker save archive's `manifest.json`
/// were joined to the unpacked archive as given, so `"Layers": ["/some/host/file"]`
/// (or `../../file`) moved a host file into the store, and `"Config"` read one.
#[test]
fn manifest_paths_stay_inside_the_archive() {
    let t = tempfile::tempdir().unwrap();
    let store = ImageStore::open(&t.path().join("store")).unwrap();
    let victim = t.path().join("victim");
    fs::write(&victim, "host data").unwrap();
    let config = br#"{"architecture":"amd64","os":"linux","config":{},"rootfs":{"type":"layers","diff_ids":["sha256:0000000000000000000000000000000000000000000000000000000000000000"]}}"#;
    for (i, (cfg, layer)) in [
        ("c.json".to_string(), victim.display().to_string()),
        ("c.json".to_string(), "../../../../../../victim".to_string()),
        (victim.display().to_string(), "l.tar".to_string()),
    ]
    .into_iter()
    .enumerate()
    {
        let manifest =
            format!(r#"[{{"Config": "{cfg}", "RepoTags": ["p/x:1"], "Layers": ["{layer}"]}}]"#);
        let archive = t.path().join(format!("a{i}.tar"));
        docker_archive(
            &archive,
            &[
                ("manifest.json", manifest.as_bytes()),
                ("c.json", config),
                ("l.tar", b""),
            ],
        );
        let e = oci::import(&store, &archive, None, &nop).unwrap_err();
        assert!(
            e.to_string()
                .contains("is not a relative path inside the archive"),
            "{i}: {e}"
        );
        assert_eq!(fs::read_to_string(&victim).unwrap(), "host data", "{i}");
    }
    assert!(store.list().unwrap().is_empty());
}

/// Found by probing imports: a file that is not a tar, a truncated archive and a
/// layout without one of its blobs were host errors (500 "internal error" through the
/// API). They are the archive's fault, and say so.
#[test]
fn broken_archives_are_refused_as_invalid() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    tree(&src);
    let a = ImageStore::open(&t.path().join("a")).unwrap();
    let img = a.import_dir(&src, &cfg(), None).unwrap();
    let archive = t.path().join("img.tar");
    oci::export(&a, &img, &[], fs::File::create(&archive).unwrap(), &nop).unwrap();
    let bytes = fs::read(&archive).unwrap();
    let b = ImageStore::open(&t.path().join("b")).unwrap();
    let check = |name: &str, data: &[u8], needle: &str| {
        let p = t.path().join(name);
        fs::write(&p, data).unwrap();
        let e = oci::import(&b, &p, None, &nop).unwrap_err();
        assert!(matches!(e, StoreError::Invalid { .. }), "{name}: {e:?}");
        assert!(e.to_string().contains(needle), "{name}: {e}");
    };
    check(
        "garbage.tar",
        &vec![b'x'; 4096],
        "not a readable tar archive",
    );
    check(
        "truncated.tar",
        &bytes[..bytes.len() / 2],
        "not a readable tar archive",
    );
    // The layout without its layer blob.
    let layout = t.path().join("layout");
    fs::create_dir(&layout).unwrap();
    tar::Archive::new(&bytes[..]).unpack(&layout).unwrap();
    fs::remove_file(layout.join("blobs/sha256").join(img.layers[0].blob.hex())).unwrap();
    fs::remove_file(layout.join("manifest.json")).unwrap();
    let e = oci::import(&b, &layout, None, &nop).unwrap_err();
    assert!(
        e.to_string().contains("is missing from the archive")
            && e.to_string().contains(&img.layers[0].blob.to_string()),
        "{e}"
    );
    assert!(b.list().unwrap().is_empty());
}

/// Packs `upper` as a tenant's snapshot of `base`, tagged `tag` in `tenant`'s
/// namespace.
fn tenant_snapshot(
    s: &ImageStore,
    base: &sandlot_store::ImageInfo,
    upper: &Path,
    tenant: &str,
    tag: &ImageName,
) -> sandlot_store::ImageInfo {
    let packed = s.pack_dir(upper, &mut Budget::unlimited()).unwrap();
    s.commit_packed(
        base,
        packed,
        &Commit {
            config: &base.config,
            comment: "snapshot",
            source: "snapshot",
            tag: Some(ScopedTag {
                tenant: Some(tenant),
                name: tag,
            }),
            owner: Some(tenant),
        },
    )
    .unwrap()
}

/// Found by an outside review: tags were global, so a tenant's snapshot tagged
/// `ops/base:1` took the operator's name: the operator's creates and pushes got
/// the tenant's image. Tags are per tenant now; a tenant's name is its own tag,
/// then the operator's; never another tenant's.
#[test]
fn a_tenants_tag_never_reaches_the_operator_or_another_tenant() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    tree(&src);
    let s = ImageStore::open(&t.path().join("s")).unwrap();
    let name = ImageName::parse("ops/base:1").unwrap();
    let base = s.import_dir(&src, &cfg(), Some(&name)).unwrap();
    let upper = t.path().join("upper");
    fs::create_dir_all(&upper).unwrap();
    fs::write(upper.join("planted"), "alpha's").unwrap();
    let snap = tenant_snapshot(&s, &base, &upper, "alpha", &name);
    assert_eq!(snap.owner.as_deref(), Some("alpha"));
    assert!(snap.tags.is_empty(), "{:?}", snap.tags);

    // The operator's name is still the operator's image.
    assert_eq!(s.resolve("ops/base:1").unwrap().id, base.id);
    assert_eq!(
        s.resolve_as(Viewer::Shared, "ops/base:1").unwrap().id,
        base.id
    );
    // The tenant's own tag comes first for it; another tenant never sees it.
    assert_eq!(
        s.resolve_as(Viewer::Tenant("alpha"), "ops/base:1")
            .unwrap()
            .id,
        snap.id
    );
    assert_eq!(
        s.resolve_as(Viewer::Tenant("beta"), "ops/base:1")
            .unwrap()
            .id,
        base.id
    );
    for r in [snap.id.to_string(), snap.id.hex()[..16].to_string()] {
        for v in [Viewer::Tenant("beta"), Viewer::Shared] {
            assert!(
                matches!(s.resolve_as(v, &r), Err(StoreError::NotFound(_))),
                "{v:?} {r}"
            );
        }
    }
    // What each one is shown: alpha's own tag hides the shared one it shadows.
    assert_eq!(
        s.tags_seen_by(Viewer::Tenant("alpha"), &snap).unwrap(),
        ["ops/base:1"]
    );
    assert!(s
        .tags_seen_by(Viewer::Tenant("alpha"), &base)
        .unwrap()
        .is_empty());
    assert_eq!(
        s.tags_seen_by(Viewer::Tenant("beta"), &base).unwrap(),
        ["ops/base:1"]
    );
    assert_eq!(
        s.tags_seen_by(Viewer::Operator, &base).unwrap(),
        ["ops/base:1"]
    );
    // A namespace must be a tenant's.
    assert!(s
        .tag_image(
            &snap.id,
            ScopedTag {
                tenant: Some(""),
                name: &name
            }
        )
        .is_err());

    // Removing the operator's tag leaves alpha's; removing the image takes every
    // tag and its owner with it.
    let r = s.remove("ops/base:1").unwrap();
    assert!(r.image_removed && r.image.id == base.id);
    assert_eq!(
        s.resolve_as(Viewer::Tenant("alpha"), "ops/base:1")
            .unwrap()
            .id,
        snap.id
    );
    assert!(matches!(
        s.resolve("ops/base:1"),
        Err(StoreError::NotFound(_))
    ));
    let archive = t.path().join("snap.tar");
    oci::export(&s, &snap, &[], fs::File::create(&archive).unwrap(), &nop).unwrap();
    let r = s.remove(&snap.id.to_string()).unwrap();
    assert!(r.image_removed);
    assert!(matches!(
        s.resolve_as(Viewer::Tenant("alpha"), "ops/base:1"),
        Err(StoreError::NotFound(_))
    ));
    // The same id brought back (import, pull) is the operator's, not alpha's.
    let again = oci::import(&s, &archive, None, &nop).unwrap();
    assert_eq!(again[0].id, snap.id);
    assert_eq!(again[0].owner, None);
    assert!(s
        .resolve_as(Viewer::Tenant("beta"), &snap.id.to_string())
        .is_ok());
}

/// A store of the single-namespace schema keeps working: its tags become the
/// operator's, but for images a tenant owns (their owner records, files beside
/// the store, move into the database), whose tags become that tenant's. The
/// operator's own tenant's images keep shared tags; stale records are dropped.
#[test]
fn an_old_store_migrates_its_tags_and_owner_records() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    tree(&src);
    let root = t.path().join("s");
    let (base, snap_a, snap_d) = {
        let s = ImageStore::open(&root).unwrap();
        let base = s
            .import_dir(&src, &cfg(), Some(&ImageName::parse("ops/base:1").unwrap()))
            .unwrap();
        let upper = t.path().join("upper");
        fs::create_dir_all(&upper).unwrap();
        let a = s
            .commit(
                &base,
                &upper,
                &base.config,
                "a",
                "snapshot",
                Some(&ImageName::parse("team/a").unwrap()),
            )
            .unwrap();
        fs::write(upper.join("x"), "x").unwrap();
        let d = s
            .commit(
                &base,
                &upper,
                &base.config,
                "d",
                "snapshot",
                Some(&ImageName::parse("mine").unwrap()),
            )
            .unwrap();
        (base, a, d)
    };
    // Back to the old schema: one `tags` table, no owner column.
    {
        let c = rusqlite::Connection::open(root.join("images.db")).unwrap();
        c.execute_batch(
            "CREATE TABLE tags(name TEXT PRIMARY KEY, image_id TEXT NOT NULL);
             INSERT INTO tags SELECT name, image_id FROM image_tags;
             DROP TABLE image_tags;
             ALTER TABLE images DROP COLUMN owner;",
        )
        .unwrap();
    }
    let owners = t.path().join("image-owners");
    fs::create_dir(&owners).unwrap();
    fs::write(owners.join(snap_a.id.hex()), "alpha").unwrap();
    fs::write(owners.join(snap_d.id.hex()), "default").unwrap();
    let stale = sandlot_store::Digest::of(b"removed long ago");
    fs::write(owners.join(stale.hex()), "alpha").unwrap();

    let s = ImageStore::open_with(
        &root,
        Some(LegacyOwners {
            dir: &owners,
            operator_tenant: "default",
        }),
    )
    .unwrap();
    assert!(!owners.exists(), "the records moved into the database");
    let a = s.get(&snap_a.id).unwrap();
    assert_eq!(a.owner.as_deref(), Some("alpha"));
    assert!(a.tags.is_empty());
    assert_eq!(
        s.resolve_as(Viewer::Tenant("alpha"), "team/a").unwrap().id,
        snap_a.id
    );
    assert!(s.resolve("team/a").is_err());
    let d = s.get(&snap_d.id).unwrap();
    assert_eq!(
        (d.owner.as_deref(), d.tags.clone()),
        (Some("default"), vec!["mine:latest".to_string()])
    );
    assert_eq!(s.resolve("ops/base:1").unwrap().id, base.id);
    assert_eq!(s.get(&base.id).unwrap().owner, None);
    // Opening again changes nothing.
    drop(s);
    let s = ImageStore::open(&root).unwrap();
    assert_eq!(
        s.resolve_as(Viewer::Tenant("alpha"), "team/a").unwrap().id,
        snap_a.id
    );
}
