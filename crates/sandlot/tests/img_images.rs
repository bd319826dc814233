//! Images end to end through the daemon: import an OCI archive (built by the image
//! store, exported, imported through `sandlot image import`), run it (layers
//! stacked and idmapped, image config applied), snapshot twice, diff, start from
//! each snapshot, export a snapshot, remove and prune. Needs root.

mod api_support;
mod img_support;

use api_support::{rt, Daemon};
use serde_json::{json, Value};

async fn run(c: &sandlot_client::Client, id: &str, cmd: &str) -> (i32, String, String) {
    let o = c.run(id, &["/bin/sh", "-c", cmd]).await.unwrap();
    (
        o.exit.code.unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

async fn create(c: &sandlot_client::Client, body: Value) -> String {
    let v = c
        .call_json("POST", "/v1/sandboxes", Some(&body))
        .await
        .unwrap();
    v["id"].as_str().unwrap().to_string()
}

#[test]
fn import_run_snapshot_diff_and_start_from_snapshots() {
    let mut d = Daemon::start(None);
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(&tmp).unwrap();
    let archive = img_support::base_archive(&tmp, "test/base:1", 2);

    let (code, out, err) = d.cli(&["image", "import", archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let base_id = out.trim().to_string();
    assert!(base_id.starts_with("sha256:"), "{out}");
    let (code, out, _) = d.cli(&["image", "ls"]);
    assert_eq!(code, 0);
    assert!(out.contains("test/base:1"), "{out}");

    // `sandlot run --image` resolves the image in the data directory's store
    // itself; its writable layer is a size-limited tmpfs inside the sandbox.
    let o = std::process::Command::new(api_support::sandlot())
        .args(["run", "--data-dir"])
        .arg(d.data_dir())
        .args(["--image", "test/base:1", "--disk", "4M", "--", "/bin/sh", "-c"])
        .arg("cat /opt/layers/1; stat -c %u /usr/bin/cat; echo x > /opt/new && cat /opt/new; dd if=/dev/zero of=/opt/big bs=1M count=8 2>/dev/null || echo full")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "layer 1\n0\nx\nfull\n",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = std::process::Command::new(api_support::sandlot())
        .args(["run", "--data-dir"])
        .arg(d.data_dir())
        .args(["--image", "no/such", "--", "/bin/true"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no image no/such"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    let c = d.client();
    let rt = rt();
    rt.block_on(async {
        let img = c.call_json("GET", "/v1/images/test/base:1", None).await.unwrap();
        assert_eq!(img["id"], base_id.as_str());
        assert_eq!(img["layers"].as_array().unwrap().len(), 3);

        // An unknown image is the caller's mistake, naming the field.
        let e = c
            .call_json("POST", "/v1/sandboxes", Some(&json!({"image": "no/such:image"})))
            .await
            .unwrap_err();
        assert_eq!(e.status().unwrap().as_u16(), 400, "{e}");
        assert!(e.to_string().contains("no/such"), "{e}");

        let a = create(&c, json!({"image": "test/base:1", "env": {"FROM_SPEC": "1"}})).await;
        // Image files are owned by root inside (idmapped layers), the image's
        // config applies under the spec's, every layer is visible.
        let (code, out, err) = run(&c, &a, "stat -c %u:%g /usr/bin/sh; id -u; pwd; echo $FROM_IMAGE $FROM_SPEC; cat /etc/os-release; cat /opt/layers/0 /opt/layers/1").await;
        assert_eq!(code, 0, "{err}");
        assert_eq!(out, "0:0\n0\n/opt\nyes 1\nID=sandlot-test\nlayer 0\nlayer 1\n");

        // Change the filesystem: add 1 MB, modify a file, delete a lower file.
        let (code, _, err) = run(&c, &a, "mkdir -p /data && dd if=/dev/zero of=/data/blob bs=1024 count=1024 2>/dev/null && echo ID=changed > /etc/os-release && rm /opt/layers/0").await;
        assert_eq!(code, 0, "{err}");
        let s1 = c
            .call_json("POST", &format!("/v1/sandboxes/{a}/snapshot"), Some(&json!({"tag": "test/snap:1"})))
            .await
            .unwrap();
        assert_eq!(s1["parent"], base_id.as_str());
        assert_eq!(s1["source"], "snapshot");
        assert!(s1["frozen_ms"].as_f64().unwrap() > 0.0);
        assert_eq!(s1["layers"].as_array().unwrap().len(), 4);
        // The sandbox keeps running after the thaw.
        assert_eq!(run(&c, &a, "echo alive").await.1, "alive\n");

        let diff = c
            .call_json("GET", &format!("/v1/images/diff?a={}&b=test/snap:1", base_id), None)
            .await
            .unwrap();
        // Only what the sandbox changed: none of what the runtime made to mount on
        // (`/dev`, `/proc`, `/sys`, `/etc/hosts`, ...) is in the snapshot.
        assert_eq!(diff["added"], json!(["/data", "/data/blob"]), "{diff}");
        assert_eq!(diff["changed"], json!(["/etc/os-release"]), "{diff}");
        assert_eq!(diff["removed"], json!(["/opt/layers/0"]), "{diff}");

        // Change again and snapshot again; diff the two snapshots.
        assert_eq!(run(&c, &a, "echo two > /data/second && rm /data/blob").await.0, 0);
        let s2 = c
            .call_json("POST", &format!("/v1/sandboxes/{a}/snapshot"), None)
            .await
            .unwrap();
        let s2_id = s2["id"].as_str().unwrap().to_string();
        let diff = c
            .call_json("GET", &format!("/v1/images/diff?a=test/snap:1&b={s2_id}"), None)
            .await
            .unwrap();
        assert_eq!(diff["added"], json!(["/data/second"]), "{diff}");
        assert_eq!(diff["removed"], json!(["/data/blob"]), "{diff}");
        let (code, out, _) = d.cli(&["image", "diff", "test/snap:1", &s2_id]);
        assert_eq!(code, 0);
        assert!(out.contains("A /data/second") && out.contains("D /data/blob"), "{out}");

        // New sandboxes start from each snapshot.
        let b = create(&c, json!({"image": "test/snap:1"})).await;
        let (code, out, _) = run(&c, &b, "wc -c < /data/blob; cat /etc/os-release; ls /opt/layers").await;
        assert_eq!(code, 0);
        assert_eq!(out, "1048576\nID=changed\n1\n");
        let b2 = create(&c, json!({"image": s2_id.clone()})).await;
        let (_, out, _) = run(&c, &b2, "cat /data/second; ls /data").await;
        assert_eq!(out, "two\nsecond\n");

        // Found by probing: another tenant could list, inspect, export, diff and
        // start a snapshot, which holds a tenant's data. A snapshot belongs to its
        // sandbox's tenant ("default" here); other tenants see only the shared set.
        let other = d.tcp(Some(&d.token("other")));
        let list = other.call_json("GET", "/v1/images", None).await.unwrap();
        let ids: Vec<&str> = list["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_str().unwrap())
            .collect();
        assert!(ids.contains(&base_id.as_str()), "{list}");
        assert!(!ids.contains(&s2_id.as_str()) && ids.len() == 1, "{list}");
        for path in [
            format!("/v1/images/{s2_id}"),
            "/v1/images/test/snap:1".to_string(),
            format!("/v1/images/export?ref={s2_id}"),
            format!("/v1/images/diff?a={base_id}&b={s2_id}"),
        ] {
            let e = other.call_json("GET", &path, None).await.unwrap_err();
            assert_eq!(e.status().unwrap().as_u16(), 404, "{path}: {e}");
        }
        let e = other
            .call_json("POST", "/v1/sandboxes", Some(&json!({"image": s2_id.clone()})))
            .await
            .unwrap_err();
        assert_eq!(e.status().unwrap().as_u16(), 400, "{e}");
        let mine = d.tcp(Some(&d.token("default")));
        let v = mine.call_json("GET", &format!("/v1/images/{s2_id}"), None).await.unwrap();
        assert_eq!(v["id"], s2_id.as_str());

        // An image in use cannot be removed.
        let e = c.call_json("DELETE", "/v1/images/test/snap:1", None).await.unwrap_err();
        assert_eq!(e.status().unwrap().as_u16(), 409, "{e}");
        for id in [&a, &b, &b2] {
            c.delete_sandbox(id).await.unwrap();
        }
    });

    // Export the snapshot and import it under another name: same id.
    let out_tar = tmp.join("snap.tar");
    let (code, _, err) = d.cli(&[
        "image",
        "export",
        "test/snap:1",
        "-o",
        out_tar.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = d.cli(&[
        "image",
        "import",
        out_tar.to_str().unwrap(),
        "--tag",
        "test/copy",
    ]);
    assert_eq!(code, 0, "{err}");
    let snap_id = rt
        .block_on(c.call_json("GET", "/v1/images/test/snap:1", None))
        .unwrap()["id"]
        .clone();
    assert_eq!(out.trim(), snap_id.as_str().unwrap());

    // Writable layers are gone with their sandboxes.
    let rw = d.data_dir().join("rw");
    rt.block_on(api_support::eventually(
        10,
        "writable layers removed",
        || {
            let rw = rw.clone();
            async move {
                std::fs::read_dir(&rw)
                    .map(|r| r.count() == 0)
                    .unwrap_or(true)
            }
        },
    ));

    // Remove the snapshots; prune frees their layers but not the base's.
    for r in ["test/snap:1", "test/copy", &s2_id_of(&rt, &c)] {
        let (code, _, err) = d.cli(&["image", "rm", r]);
        assert_eq!(code, 0, "{r}: {err}");
    }
    let (code, out, err) = d.cli(&["image", "prune"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("removed 2 layers"), "{out}");
    let left = rt.block_on(c.call_json("GET", "/v1/images", None)).unwrap();
    assert_eq!(left["images"].as_array().unwrap().len(), 1, "{left}");
    d.shutdown();
}

fn s2_id_of(rt: &tokio::runtime::Runtime, c: &sandlot_client::Client) -> String {
    let l = rt.block_on(c.call_json("GET", "/v1/images", None)).unwrap();
    l["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["tags"].as_array().unwrap().is_empty())
        .map(|i| i["id"].as_str().unwrap().to_string())
        .expect("the untagged snapshot")
}

/// A `host` sandbox's snapshot is its writable layer alone: its files with their
/// in-sandbox owners, none of the host's `/usr`, of a volume or a secret mounted in
/// it; it belongs to the sandbox's tenant, goes on top of the `host` image, and a
/// sandbox of it has the files and the host's programs, and snapshots again.
#[test]
fn a_host_sandbox_snapshot_is_its_writable_layer_and_restores_on_the_host_image() {
    host_snapshot_restores_on(&api_support::suite_isolation());
}

#[test]
fn a_host_sandbox_snapshot_is_its_writable_layer_and_restores_on_gvisor() {
    host_snapshot_restores_on("gvisor");
}

/// On the namespace backend and on gVisor (whose root tmpfs the backend mounts on
/// the host): the same layer. The commands avoid coreutils' `stat` and `ls`,
/// which Debian 12's `runsc` fails (`statx` with `AT_NO_AUTOMOUNT`).
fn host_snapshot_restores_on(isolation: &str) {
    let d = Daemon::start_isolated(None, isolation);
    let c = d.tcp(Some(&d.token("alpha")));
    let layers = d.data_dir().join("images").join("layers");
    rt().block_on(async {
        c.call_json("POST", "/v1/volumes", Some(&json!({"name": "v"})))
            .await
            .unwrap();
        c.call_json(
            "POST",
            "/v1/secrets",
            Some(&json!({"name": "s", "value": "hunter2"})),
        )
        .await
        .unwrap();
        let a = create(
            &c,
            json!({
                "volumes": [{"name": "v", "target": "/data"}],
                "secrets": [{"name": "s", "path": "/run/secrets/s"}],
                "mounts": [{"type": "tmpfs", "target": "/scratch"}],
                "hostname": "snapped",
            }),
        )
        .await;
        let (code, _, err) = run(
            &c,
            &a,
            "echo in-volume > /data/v.txt && echo scratch > /scratch/x && \
             mkdir -p /home/user/proj && echo hello > /home/user/proj/f && \
             chown -R 1000:1000 /home/user/proj && ln -s proj/f /home/user/link && \
             echo tmp > /tmp/t",
        )
        .await;
        assert_eq!(code, 0, "{err}");
        let snap = c
            .call_json(
                "POST",
                &format!("/v1/sandboxes/{a}/snapshot"),
                Some(&json!({"tag": "mine:1"})),
            )
            .await
            .unwrap();
        assert_eq!(snap["base"], "host", "{snap}");
        assert!(snap["parent"].is_null(), "{snap}");
        assert_eq!(snap["owner"], "alpha", "{snap}");
        assert_eq!(snap["layers"].as_array().unwrap().len(), 1, "{snap}");

        let diff_id = snap["layers"][0]["diff_id"].as_str().unwrap();
        let layer = layers.join(diff_id.trim_start_matches("sha256:"));
        use std::os::unix::fs::MetadataExt;
        let f = std::fs::symlink_metadata(layer.join("home/user/proj/f")).unwrap();
        assert_eq!((f.uid(), f.gid()), (1000, 1000), "in-sandbox owner");
        assert_eq!(std::fs::read(layer.join("tmp/t")).unwrap(), b"tmp\n");
        for absent in [
            "usr/bin",
            "proc/self",
            "data/v.txt",
            "run/secrets/s",
            "scratch/x",
            "run/host/etc",
            "dev/null",
        ] {
            assert!(
                std::fs::symlink_metadata(layer.join(absent)).is_err(),
                "{absent} is not part of the sandbox's writable layer"
            );
        }

        let b = create(&c, json!({"image": "mine:1"})).await;
        let (code, out, err) = run(
            &c,
            &b,
            "cat /home/user/proj/f && \
             python3 -c 'import os; print(os.stat(\"/home/user/proj/f\").st_uid)' && \
             readlink /home/user/link && cat /tmp/t && test -x /usr/bin/env && \
             for p in /data /run/secrets; do test -e $p || echo \"$p: No such file\"; done; \
             cat /etc/hostname",
        )
        .await;
        assert_eq!(code, 0, "{err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(&lines[..4], ["hello", "1000", "proj/f", "tmp"], "{out}");
        assert!(
            lines[4..]
                .iter()
                .filter(|l| l.contains("No such file"))
                .count()
                == 2,
            "no volume, no secret: {out}"
        );
        // The host image's /etc is synthesized again for the new sandbox.
        assert_ne!(*lines.last().unwrap(), "snapped", "{out}");

        let (_, _, _) = run(&c, &b, "echo two > /home/user/two").await;
        let snap2 = c
            .call_json("POST", &format!("/v1/sandboxes/{b}/snapshot"), None)
            .await
            .unwrap();
        assert_eq!(snap2["parent"], snap["id"], "{snap2}");
        assert_eq!(snap2["base"], "host", "{snap2}");
        let c2 = create(&c, json!({"image": snap2["id"]})).await;
        let (_, out, _) = run(&c, &c2, "cat /home/user/proj/f /home/user/two").await;
        assert_eq!(out, "hello\ntwo\n");

        // Another tenant neither sees it nor starts from it.
        let other = d.tcp(Some(&d.token("beta")));
        let e = other
            .call_json("POST", "/v1/sandboxes", Some(&json!({"image": snap["id"]})))
            .await
            .unwrap_err();
        assert_eq!(e.status().unwrap().as_u16(), 400, "{e}");
        for id in [&a, &b, &c2] {
            c.delete_sandbox(id).await.unwrap();
        }
    });
}

/// An image is removed as soon as the last sandbox using it has been deleted:
/// the sandbox lets its image go in the clean-up that runs on after its delete
/// answered, and the removal waits for that clean-up instead of refusing. A
/// sandbox still running keeps it (409, naming the sandbox).
#[test]
fn an_image_goes_at_once_after_the_last_sandbox_using_it_is_deleted() {
    let mut d = Daemon::start(None);
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(&tmp).unwrap();
    let archive = img_support::base_archive(&tmp, "test/base:1", 1);
    let c = d.client();
    for round in 0..8 {
        let (code, out, err) = d.cli(&["image", "import", archive.to_str().unwrap()]);
        assert_eq!(code, 0, "round {round}: {out}{err}");
        rt().block_on(async {
            let kept = create(&c, json!({"image": "test/base:1"})).await;
            let gone = create(&c, json!({"image": "test/base:1"})).await;
            c.delete_sandbox(&gone).await.unwrap();
            let e = c
                .call_json("DELETE", "/v1/images/test/base:1", None)
                .await
                .unwrap_err();
            assert_eq!(
                e.status().map(|s| s.as_u16()),
                Some(409),
                "round {round}: {e}"
            );
            assert!(
                e.to_string().contains(&kept) && !e.to_string().contains(&gone),
                "round {round}: {e}"
            );
            c.delete_sandbox(&kept).await.unwrap();
            c.call_json("DELETE", "/v1/images/test/base:1", None)
                .await
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        });
    }
    d.shutdown();
}
