//! Volumes (shared, read-only mounts, survive sandbox end and daemon restart, size
//! limits), the host-mount policy, and secrets (injected as variables and files,
//! never returned, logged or stored in the databases or snapshots). Needs root.

mod api_support;
mod img_support;

use api_support::{rt, Daemon};
use serde_json::json;

async fn sh(c: &sandlot_client::Client, id: &str, cmd: &str) -> (i32, String, String) {
    let o = c.run(id, &["/bin/sh", "-c", cmd]).await.unwrap();
    (
        o.exit.code.unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn volumes_persist_and_host_mounts_follow_the_policy() {
    let base = std::env::temp_dir().join(format!("sandlot-img-allowed-{}", std::process::id()));
    let allowed = base.join("allowed");
    let outside = base.join("outside");
    struct RemoveOnDrop(std::path::PathBuf);
    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = RemoveOnDrop(base.clone());
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(allowed.join("hello"), "from the host\n").unwrap();
    let cfg = format!(
        "[mounts]\nallowed_host_paths = [\"{}\"]\n",
        allowed.display()
    );
    let mut d = Daemon::start(Some(&cfg));
    let rt = rt();
    let c = d.client();
    rt.block_on(async {
        c.call_json("POST", "/v1/volumes", Some(&json!({"name": "shared"}))).await.unwrap();
        let e = c.call_json("POST", "/v1/volumes", Some(&json!({"name": "shared"}))).await.unwrap_err();
        assert_eq!(e.status().unwrap().as_u16(), 409);
        let e = c.call_json("POST", "/v1/volumes", Some(&json!({"name": "../x"}))).await.unwrap_err();
        assert_eq!(e.status().unwrap().as_u16(), 400);

        let a = c
            .call_json("POST", "/v1/sandboxes", Some(&json!({"volumes": [{"name": "shared", "target": "/data"}]})))
            .await
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        let b = c
            .call_json("POST", "/v1/sandboxes", Some(&json!({"volumes": [{"name": "shared", "target": "/ro", "read_only": true}]})))
            .await
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        let (code, _, err) = sh(&c, &a, "echo kept > /data/file && mkdir /data/d && chown 1000:1000 /data/d").await;
        assert_eq!(code, 0, "{err}");
        // Shared, with the same ownership in every sandbox; read-only where asked.
        let (code, out, _) = sh(&c, &b, "cat /ro/file; stat -c %u /ro/file /ro/d").await;
        assert_eq!(code, 0);
        assert_eq!(out, "kept\n0\n1000\n");
        let (code, _, _) = sh(&c, &b, "touch /ro/new").await;
        assert_ne!(code, 0, "a read-only volume must refuse writes");
        // In use: not removable.
        let e = c.call_json("DELETE", "/v1/volumes/shared", None).await.unwrap_err();
        assert_eq!(e.status().unwrap().as_u16(), 409, "{e}");
        c.delete_sandbox(&a).await.unwrap();
        c.delete_sandbox(&b).await.unwrap();

        // Host mounts: allowed under the configured path, refused elsewhere.
        let ok = c
            .call_json("POST", "/v1/sandboxes", Some(&json!({"mounts": [{"type": "bind", "source": allowed.to_str().unwrap(), "target": "/host"}]})))
            .await
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(sh(&c, &ok, "cat /host/hello").await.1, "from the host\n");
        c.delete_sandbox(&ok).await.unwrap();
        for (body, field) in [
            (json!({"mounts": [{"type": "tmpfs", "target": "/t"}, {"type": "bind", "source": outside.to_str().unwrap(), "target": "/h"}]}), "mounts[1].source"),
            (json!({"mounts": [{"type": "bind", "source": format!("{}/../outside", allowed.display()), "target": "/h"}]}), "mounts[0].source"),
            (json!({"mounts": [{"type": "bind", "source": "/etc", "target": "/h"}]}), "mounts[0].source"),
            (json!({"rootfs": outside.to_str().unwrap()}), "rootfs"),
            // Refused at the check, not left for the runtime to find missing.
            (json!({"mounts": [{"type": "bind", "source": allowed.join("missing").to_str().unwrap(), "target": "/h"}]}), "mounts[0].source"),
            (json!({"rootfs": allowed.join("hello").to_str().unwrap()}), "rootfs"),
        ] {
            let e = c.call_json("POST", "/v1/sandboxes", Some(&body)).await.unwrap_err();
            assert_eq!(e.status().unwrap().as_u16(), 400, "{body}: {e}");
            match &e {
                sandlot_client::Error::Api { body: b, .. } => {
                    let f = b.field.clone().unwrap_or_default();
                    assert_eq!(f, field, "{body}: {e}");
                }
                other => panic!("{other}"),
            }
        }

        // Size-limited volume: the filesystem is that size.
        c.call_json("POST", "/v1/volumes", Some(&json!({"name": "small", "size_limit": "16M"}))).await.unwrap();
        let s = c
            .call_json("POST", "/v1/sandboxes", Some(&json!({"volumes": [{"name": "small", "target": "/small"}]})))
            .await
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        let (code, out, _) = sh(&c, &s, "dd if=/dev/zero of=/small/big bs=1M count=32 2>&1").await;
        assert_ne!(code, 0, "writing 32M into a 16M volume must fail");
        assert!(out.contains("No space left"), "{out}");
        c.delete_sandbox(&s).await.unwrap();
    });

    // The volume survives a daemon restart.
    d.terminate();
    d.spawn();
    let c = d.client();
    rt.block_on(async {
        let l = c.call_json("GET", "/v1/volumes", None).await.unwrap();
        let names: Vec<&str> = l["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v["name"].as_str())
            .collect();
        assert_eq!(names, ["shared", "small"]);
        let x = c
            .call_json(
                "POST",
                "/v1/sandboxes",
                Some(&json!({"volumes": [{"name": "shared", "target": "/data"}]})),
            )
            .await
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(sh(&c, &x, "cat /data/file").await.1, "kept\n");
        c.delete_sandbox(&x).await.unwrap();
        for v in ["shared", "small"] {
            c.call_json("DELETE", &format!("/v1/volumes/{v}"), None)
                .await
                .unwrap();
        }
        let l = c.call_json("GET", "/v1/volumes", None).await.unwrap();
        assert_eq!(l["volumes"], json!([]));
    });
    d.shutdown();
    let _ = std::fs::remove_dir_all(&base);
}

fn grep_tree(dir: &std::path::Path, needle: &[u8], hits: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let md = std::fs::symlink_metadata(&p).unwrap();
        if md.is_dir() {
            grep_tree(&p, needle, hits);
        } else if md.is_file() {
            if let Ok(b) = std::fs::read(&p) {
                if b.windows(needle.len()).any(|w| w == needle) {
                    hits.push(p.display().to_string());
                }
            }
        }
    }
}

#[test]
fn secrets_are_injected_and_never_leak() {
    let mut d = Daemon::start(None);
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(&tmp).unwrap();
    let archive = img_support::base_archive(&tmp, "test/secretbase", 0);
    let (code, _, err) = d.cli(&["image", "import", archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let value = format!("s3cr3t-{}-{}", std::process::id(), rand_suffix());
    let rt = rt();
    let c = d.client();
    let mut responses: Vec<String> = Vec::new();
    rt.block_on(async {
        let v = c
            .call_json("POST", "/v1/secrets", Some(&json!({"name": "api-token", "value": value})))
            .await
            .unwrap();
        responses.push(v.to_string());
        // Through the CLI too: the value comes on stdin.
        let mut child = std::process::Command::new(api_support::sandlot())
            .args(["secret", "create", "cli-secret"])
            .env("SANDLOT_HOST", format!("unix://{}", d.socket.display()))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(value.as_bytes()).unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success());
        responses.push(String::from_utf8_lossy(&o.stdout).into_owned());
        let e = c
            .call_json("POST", "/v1/secrets", Some(&json!({"name": "api-token", "value": "x"})))
            .await
            .unwrap_err();
        assert_eq!(e.status().unwrap().as_u16(), 409);
        responses.push(e.to_string());
        let l = c.call_json("GET", "/v1/secrets", None).await.unwrap();
        responses.push(l.to_string());
        let names: Vec<&str> = l["secrets"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
        assert_eq!(names, ["api-token", "cli-secret"]);

        let body = json!({
            "image": "test/secretbase",
            "secrets": [{"name": "api-token", "env": "API_TOKEN"}, {"name": "cli-secret", "path": "/run/secrets/token"}]
        });
        let sb = c.call_json("POST", "/v1/sandboxes", Some(&body)).await.unwrap();
        responses.push(sb.to_string());
        let id = sb["id"].as_str().unwrap().to_string();
        responses.push(c.call_json("GET", &format!("/v1/sandboxes/{id}"), None).await.unwrap().to_string());
        responses.push(c.call_json("GET", "/v1/sandboxes", None).await.unwrap().to_string());
        let (code, out, err) = sh(&c, &id, "printenv API_TOKEN; cat /run/secrets/token; echo; stat -c %a /run/secrets/token").await;
        assert_eq!(code, 0, "{err}");
        assert_eq!(out, format!("{value}\n{value}\n400\n"));
        // A snapshot never contains secret files (they live on their own tmpfs).
        let snap = c.call_json("POST", &format!("/v1/sandboxes/{id}/snapshot"), None).await.unwrap();
        responses.push(snap.to_string());
        responses.push(c.call_json("GET", "/v1/images", None).await.unwrap().to_string());
        let bad = c
            .call_json("POST", "/v1/sandboxes", Some(&json!({"secrets": [{"name": "nope", "env": "X"}]})))
            .await
            .unwrap_err();
        assert_eq!(bad.status().unwrap().as_u16(), 400);
        responses.push(bad.to_string());
        c.delete_sandbox(&id).await.unwrap();
        c.call_json("DELETE", "/v1/secrets/cli-secret", None).await.unwrap();
    });
    // Stored 0600 in a 0700 directory.
    let sdir = d.data_dir().join("secrets");
    let mut hits = Vec::new();
    grep_tree(&sdir, value.as_bytes(), &mut hits);
    assert_eq!(hits.len(), 1, "{hits:?}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&hits[0]).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::metadata(&sdir).unwrap().permissions().mode() & 0o777,
        0o700
    );

    for r in &responses {
        assert!(!r.contains(&value), "an API response shows the secret: {r}");
    }
    d.terminate();
    let log = d.log();
    assert!(log.contains("sandbox created"), "the log is being written");
    assert!(!log.contains(&value), "the daemon log shows the secret");
    // Everything else in the data directory (the SQLite databases with their WAL
    // files, image layers and blobs, writable layers, volumes): nothing.
    let mut hits = Vec::new();
    let mut dbs = 0;
    for e in std::fs::read_dir(d.data_dir()).unwrap().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n == "secrets" {
            continue;
        }
        if e.path().is_dir() {
            grep_tree(&e.path(), value.as_bytes(), &mut hits);
        } else {
            dbs += usize::from(n.starts_with("sandlot.db"));
            let b = std::fs::read(e.path()).unwrap();
            if b.windows(value.len()).any(|w| w == value.as_bytes()) {
                hits.push(n);
            }
        }
    }
    assert!(dbs >= 1, "the daemon database was scanned");
    let images_db = d.data_dir().join("images/images.db");
    assert!(images_db.exists(), "the image database was scanned");
    assert!(hits.is_empty(), "the secret is stored in {hits:?}");
    d.spawn();
    d.shutdown();
}

fn rand_suffix() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{t:08x}")
}

/// The attack: sandbox A has an allowed host directory bound read-write and keeps
/// swapping an entry of it, `x`, between a directory and a link to the host's `/`
/// (`renameat2(RENAME_EXCHANGE)` every 2 ms, so that `x` always exists and the
/// daemon's check often sees the directory). Meanwhile the tenant
/// asks, again and again, for sandboxes with `x` as a bind source or as their
/// rootfs. The daemon used to check the path and later mount it by name, following
/// whatever `x` was by then: a sandbox got the host's root. Now each create either
/// gets the directory that was checked or fails; none ever sees the host's `/usr`.
#[test]
fn a_host_path_swapped_for_a_link_to_the_host_root_is_never_mounted() {
    use std::os::unix::fs::PermissionsExt;
    let base = std::env::temp_dir().join(format!("sandlot-img-swap-{}", std::process::id()));
    let share = base.join("share");
    struct RemoveOnDrop(std::path::PathBuf);
    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = RemoveOnDrop(base.clone());
    std::fs::create_dir_all(&share).unwrap();
    // Writable by sandbox A's mapped root.
    std::fs::set_permissions(&share, std::fs::Permissions::from_mode(0o777)).unwrap();
    let cfg = format!("[mounts]\nallowed_host_paths = [\"{}\"]\n", share.display());
    let mut d = Daemon::start(Some(&cfg));
    let rt = rt();
    let c = d.client();
    let x = share.join("x");
    let (mut mounted, mut refused) = (0, 0);
    rt.block_on(async {
        let a = c
            .call_json("POST", "/v1/sandboxes", Some(&json!({"mounts": [{"type": "bind", "source": share.to_str().unwrap(), "target": "/share", "readonly": false}]})))
            .await
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        let swap = r#"
import ctypes, os, time
os.chdir("/share")
os.mkdir("x")
open("x/inside", "w").close()
os.symlink("/", "l")
libc = ctypes.CDLL(None, use_errno=True)
end = time.time() + 300
while time.time() < end:
    if libc.renameat2(-100, b"x", -100, b"l", 2) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
    time.sleep(0.002)
"#;
        c.write_file_bytes(&a, "/tmp/swap.py", swap.as_bytes().to_vec()).await.unwrap();
        let body: sandlot_client::api::ExecBody = serde_json::from_value(json!({"argv": ["python3", "/tmp/swap.py"], "background": true})).unwrap();
        let p = c.exec(&a, &body).await.unwrap();
        api_support::eventually(30, "sandbox A swaps x", || async {
            std::fs::symlink_metadata(&x).is_ok() && std::fs::symlink_metadata(share.join("l")).is_ok()
        })
        .await;
        for i in 0..40 {
            let (body, probe) = if i % 2 == 0 {
                (json!({"mounts": [{"type": "bind", "source": x.to_str().unwrap(), "target": "/mnt/x", "readonly": true}]}), "/mnt/x/usr")
            } else {
                (json!({"rootfs": x.to_str().unwrap()}), "/usr")
            };
            let b = match c.call_json("POST", "/v1/sandboxes", Some(&body)).await {
                Ok(v) => v["id"].as_str().unwrap().to_string(),
                // The check saw the link (400), or the mount found another file (500).
                Err(_) => {
                    refused += 1;
                    continue;
                }
            };
            let saw_host = c.stat(&b, probe).await.is_ok();
            c.delete_sandbox(&b).await.unwrap();
            assert!(!saw_host, "create {i} ({body}) mounted the host's root");
            mounted += 1;
        }
        // Still swapping: the race ran the whole time.
        let view = c.process(&a, p.id).await.unwrap();
        assert!(view.exit.is_none(), "the swapper stopped: {view:?}");
        c.delete_sandbox(&a).await.unwrap();
    });
    eprintln!(
        "host path swap: {mounted} creates got the checked directory, {refused} were refused"
    );
    d.shutdown();
}
