//! What a sandbox can make the daemon read or write: a snapshot, a copy-out, an
//! export or a diff never expands past the sandbox's disk limit or the operator's
//! `images.max_expanded_size` (files at their apparent size, holes included, and
//! 512 bytes per entry), a refusal is a 413 naming the limit with nothing left in
//! the store, and a sparse file under the limit keeps its holes all the way. Needs
//! root.

mod api_support;
mod img_support;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use api_support::{rt, Daemon};
use serde_json::{json, Value};

/// The operator's ceiling equals the sandboxes' disk limit here, so that a
/// sandbox's refusal names its disk limit and an image's the ceiling.
const CONFIG: &str = "[images]\nmax_expanded_size = \"64M\"\n";
const LIMIT: u64 = 64 << 20;

async fn run(c: &sandlot_client::Client, id: &str, cmd: &str) -> String {
    let o = c.run(id, &["/bin/sh", "-c", cmd]).await.unwrap();
    assert_eq!(
        o.exit.code,
        Some(0),
        "{cmd}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

async fn create(c: &sandlot_client::Client, image: &str) -> String {
    let v = c
        .call_json(
            "POST",
            "/v1/sandboxes",
            Some(&json!({"image": image, "resources": {"disk": "64M"}})),
        )
        .await
        .unwrap();
    v["id"].as_str().unwrap().to_string()
}

async fn snapshot(c: &sandlot_client::Client, id: &str) -> Result<Value, sandlot_client::Error> {
    c.call_json("POST", &format!("/v1/sandboxes/{id}/snapshot"), None)
        .await
}

/// A 413 `too_large` whose message names `limit`.
fn too_large(e: sandlot_client::Error, limit: &str) {
    assert_eq!(
        (e.status().map(|s| s.as_u16()), e.code()),
        (Some(413), Some("too_large")),
        "{e}"
    );
    assert!(e.to_string().contains(limit), "{e}");
}

/// Every name in the store's blob, layer and staging directories.
fn store_files(data: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for d in ["images/blobs/sha256", "images/layers", "images/tmp"] {
        for e in std::fs::read_dir(data.join(d)).unwrap() {
            out.push(format!("{d}/{}", e.unwrap().file_name().to_string_lossy()));
        }
    }
    out.sort();
    out
}

fn free_bytes(p: &Path) -> u64 {
    let s = rustix::fs::statvfs(p).unwrap();
    s.f_bavail * s.f_frsize
}

/// A refused snapshot leaves the store as it was: no blob, layer or staging file,
/// and the free space the same, give or take what others write meanwhile (the
/// old code wrote 4 GiB here).
async fn snapshot_is_refused(
    c: &sandlot_client::Client,
    data: &Path,
    id: &str,
    limit: &str,
) -> Value {
    let (before, free) = (store_files(data), free_bytes(data));
    let images = c.call_json("GET", "/v1/images", None).await.unwrap();
    too_large(snapshot(c, id).await.unwrap_err(), limit);
    assert_eq!(store_files(data), before, "the store gained files");
    assert!(
        free_bytes(data) + (1 << 30) > free,
        "free space fell by {} bytes",
        free - free_bytes(data)
    );
    let after = c.call_json("GET", "/v1/images", None).await.unwrap();
    assert_eq!(after, images);
    after
}

/// Found by an outside review: in a sandbox with `disk: 64M`, `truncate -s 2G f`
/// and a snapshot wrote a 2 GiB layer (4 GiB in the store). Holes, many empty
/// files, hard links and a file growing while it is read can no longer make a
/// snapshot or a copy-out larger than the sandbox's disk limit.
#[test]
fn sparse_files_links_and_many_entries_cannot_pass_the_disk_limit() {
    let mut d = Daemon::start(Some(CONFIG));
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(&tmp).unwrap();
    let archive = img_support::base_archive(&tmp, "test/base:1", 0);
    let (code, _, err) = d.cli(&["image", "import", archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let data = d.data_dir();
    let c = d.tcp(Some(&d.token("alpha")));
    let disk = "the sandbox's disk limit (resources.disk = 64M)";
    let rt = rt();
    let sb = rt.block_on(async {
        let sb = create(&c, "test/base:1").await;
        // 2 GiB of holes in a 64M writable layer.
        let out = run(
            &c,
            &sb,
            "mkdir /data && dd if=/dev/zero of=/data/huge bs=1M count=0 seek=2048 2>/dev/null && stat -c %s /data/huge",
        )
        .await;
        assert_eq!(out, "2147483648\n");
        snapshot_is_refused(&c, &data, &sb, disk).await;
        // Nor can it be copied out: an archive of its directory or the file itself.
        too_large(c.tar_download(&sb, "/data").await.err().unwrap(), disk);
        too_large(c.read_file(&sb, "/data/huge").await.err().unwrap(), disk);
        sb
    });
    let dest = tmp.join("out");
    let (code, _, err) = d.cli(&["cp", &format!("{sb}:/data"), dest.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("resources.disk = 64M"), "{err}");
    assert!(
        std::fs::read_dir(&dest).map_or(0, |r| r.count()) == 0,
        "nothing was copied"
    );

    rt.block_on(async {
        // Many empty files: 512 bytes of archive each, no disk at all.
        run(
            &c,
            &sb,
            "rm /data/huge && cd /data && i=0; while [ $i -lt 140000 ]; do : > f$i; i=$((i+1)); done",
        )
        .await;
        snapshot_is_refused(&c, &data, &sb, disk).await;
        too_large(c.tar_download(&sb, "/data").await.err().unwrap(), disk);

        // Hard links: a copy-out has no links, each one is the whole file; a
        // layer stores the file once.
        run(
            &c,
            &sb,
            "rm -r /data && mkdir /data && dd if=/dev/zero of=/data/ten bs=1M count=10 2>/dev/null && for i in 0 1 2 3 4 5 6 7 8 9; do ln /data/ten /data/ten$i; done",
        )
        .await;
        too_large(c.tar_download(&sb, "/data").await.err().unwrap(), disk);
        let snap = snapshot(&c, &sb).await.unwrap();
        let top = snap["layers"].as_array().unwrap().last().unwrap().clone();
        assert!(top["size"].as_u64().unwrap() < 11 << 20, "{top}");

        // A file that grows while it is read: 48M when the read starts, then 2 GiB
        // of holes. The read is cut at the limit, visibly (not a complete-looking
        // short file).
        run(
            &c,
            &sb,
            "rm -r /data && mkdir /data && dd if=/dev/zero of=/data/grow bs=1M count=48 2>/dev/null",
        )
        .await;
        let mut s = c.read_file(&sb, "/data/grow").await.unwrap();
        let mut n = s.chunk().await.unwrap().unwrap().len() as u64;
        run(
            &c,
            &sb,
            "dd if=/dev/zero of=/data/grow bs=1 count=1 seek=2147483647 conv=notrunc 2>/dev/null",
        )
        .await;
        let cut = loop {
            match s.chunk().await {
                Ok(Some(b)) => n += b.len() as u64,
                Ok(None) => break false,
                Err(_) => break true,
            }
            assert!(n <= LIMIT, "read {n} bytes, past the limit");
        };
        assert!(cut && n > 48 << 20, "read {n} bytes, cut: {cut}");
        c.delete_sandbox(&sb).await.unwrap();
    });
    d.shutdown();
}

/// A sparse file under the limit keeps its holes through a snapshot (a small
/// layer), a sandbox started from it, and a copy-out; an image's export and diff
/// are bounded by the operator's `images.max_expanded_size`, and comparing two
/// large sparse files reads only their data.
#[test]
fn a_sparse_file_under_the_limit_keeps_its_holes_and_images_are_bounded() {
    let mut d = Daemon::start(Some(CONFIG));
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(&tmp).unwrap();
    let archive = img_support::base_archive(&tmp, "test/base:1", 0);
    let (code, _, err) = d.cli(&["image", "import", archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let data = d.data_dir();
    let c = d.tcp(Some(&d.token("alpha")));
    let ceiling = "the operator's limit (images.max_expanded_size = 64M)";
    const SIZE: u64 = 62 << 20;
    let rt = rt();
    let (sb2, snap1) = rt.block_on(async {
        let sb = create(&c, "test/base:1").await;
        // 62M: data at the start and at the end, holes between.
        run(
            &c,
            &sb,
            &format!(
                "mkdir /data && dd if=/dev/zero of=/data/sparse bs=1M count=0 seek=62 2>/dev/null && echo -n head | dd of=/data/sparse conv=notrunc 2>/dev/null && echo -n end | dd of=/data/sparse bs=1 seek={} conv=notrunc 2>/dev/null",
                SIZE - 3
            ),
        )
        .await;
        let snap = snapshot(&c, &sb).await.unwrap();
        let top = snap["layers"].as_array().unwrap().last().unwrap().clone();
        assert!(top["size"].as_u64().unwrap() < 1 << 20, "the layer blob holds the data only: {top}");
        let layer = data
            .join("images/layers")
            .join(top["diff_id"].as_str().unwrap().trim_start_matches("sha256:"));
        let md = std::fs::metadata(layer.join("data/sparse")).unwrap();
        assert_eq!(md.len(), SIZE);
        assert!(md.blocks() * 512 < 1 << 20, "{} blocks in the layer", md.blocks());
        c.delete_sandbox(&sb).await.unwrap();

        let id = snap["id"].as_str().unwrap().to_string();
        let sb2 = create(&c, &id).await;
        let out = run(
            &c,
            &sb2,
            &format!(
                "stat -c '%s %b' /data/sparse; head -c 4 /data/sparse; echo; dd if=/data/sparse bs=1 skip={} count=3 2>/dev/null",
                SIZE - 3
            ),
        )
        .await;
        let (stat, rest) = out.split_once('\n').unwrap();
        let (size, blocks) = stat.split_once(' ').unwrap();
        assert_eq!(size.parse::<u64>().unwrap(), SIZE);
        assert!(blocks.parse::<u64>().unwrap() * 512 < 1 << 20, "{out}");
        assert_eq!(rest, "head\nend");

        // The image expands past the operator's limit (the base plus 62M): not
        // exported, and nothing is sent.
        too_large(
            c.call_json("GET", &format!("/v1/images/export?ref={id}"), None)
                .await
                .unwrap_err(),
            ceiling,
        );
        (sb2, snap)
    });

    // Copied out, file and directory: the local copies keep the holes.
    let file = tmp.join("sparse");
    let (code, _, err) = d.cli(&["cp", &format!("{sb2}:/data/sparse"), file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let dir = tmp.join("dir");
    let (code, _, err) = d.cli(&["cp", &format!("{sb2}:/data"), dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    for p in [file, dir.join("sparse")] {
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!(md.len(), SIZE, "{}", p.display());
        assert!(
            md.blocks() * 512 < 1 << 20,
            "{}: {} blocks",
            p.display(),
            md.blocks()
        );
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[..4], b"head");
        assert_eq!(&bytes[bytes.len() - 3..], b"end");
        assert!(bytes[4..bytes.len() - 3].iter().all(|&b| b == 0));
    }

    rt.block_on(async {
        // The same 62M file changed at its end in a second snapshot: the diff
        // compares the two files' data only (124M of holes would pass the limit).
        run(
            &c,
            &sb2,
            &format!(
                "echo -n END | dd of=/data/sparse bs=1 seek={} conv=notrunc 2>/dev/null",
                SIZE - 3
            ),
        )
        .await;
        let snap2 = snapshot(&c, &sb2).await.unwrap();
        let (a, b) = (snap1["id"].as_str().unwrap(), snap2["id"].as_str().unwrap());
        let diff = c
            .call_json("GET", &format!("/v1/images/diff?a={a}&b={b}"), None)
            .await
            .unwrap();
        // (Besides the sandboxes' own /etc/hostname and /etc/hosts.)
        assert!(
            diff["changed"]
                .as_array()
                .unwrap()
                .contains(&json!("/data/sparse")),
            "{diff}"
        );
        c.delete_sandbox(&sb2).await.unwrap();

        // Two 33M files of data that differ in their last byte must be read whole
        // to compare: past the operator's limit, the diff is refused.
        let sb = create(&c, "test/base:1").await;
        run(
            &c,
            &sb,
            "mkdir /data && dd if=/dev/zero of=/data/real bs=1M count=33 2>/dev/null",
        )
        .await;
        let s1 = snapshot(&c, &sb).await.unwrap();
        run(
            &c,
            &sb,
            "echo -n x | dd of=/data/real bs=1 seek=34603007 conv=notrunc 2>/dev/null",
        )
        .await;
        let s2 = snapshot(&c, &sb).await.unwrap();
        too_large(
            c.call_json(
                "GET",
                &format!(
                    "/v1/images/diff?a={}&b={}",
                    s1["id"].as_str().unwrap(),
                    s2["id"].as_str().unwrap()
                ),
                None,
            )
            .await
            .unwrap_err(),
            ceiling,
        );
        c.delete_sandbox(&sb).await.unwrap();
    });
    d.shutdown();
}
