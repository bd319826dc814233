//! A sandbox's memory-backed filesystems (its writable layer, `tmpfs` mounts, an
//! image's `/dev/shm`) are full, with `ENOSPC`, before its memory is: filling its
//! own disk, with data or with files, never gets the agent (PID 1) OOM-killed and
//! never ends the sandbox. Needs root.

mod api_support;
mod img_support;

use api_support::{rt, spec_body, Daemon};
use sandlot_client::Client;
use serde_json::json;

async fn sh(c: &Client, id: &str, cmd: &str) -> (i32, String, String) {
    let o = c
        .run(id, &["/bin/sh", "-c", cmd])
        .await
        .unwrap_or_else(|e| {
            panic!("{cmd}: {e}");
        });
    (
        o.exit.code.unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// OOM kills in the sandbox's memory cgroup so far (v1 `memory.oom_control`, v2
/// `memory.events`).
fn oom_kills(id: &str) -> u64 {
    let v1 = format!("/sys/fs/cgroup/memory/sandlot/{id}/memory.oom_control");
    let v2 = format!("/sys/fs/cgroup/sandlot/{id}/memory.events");
    let text = std::fs::read_to_string(&v1)
        .or_else(|_| std::fs::read_to_string(&v2))
        .expect("the sandbox's memory cgroup");
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
        .expect("an oom_kill count")
}

/// The sandbox still answers, and nothing in it was OOM-killed.
async fn still_alive(c: &Client, id: &str) {
    let (code, out, err) = sh(c, id, "echo alive").await;
    assert_eq!((code, out.as_str()), (0, "alive\n"), "{err}");
    assert_eq!(oom_kills(id), 0, "nothing was OOM-killed");
}

/// Fills `dir` with data until the filesystem is full; returns the shell's stderr.
async fn fill_with_data(c: &Client, id: &str, dir: &str) -> String {
    let (code, _, err) = sh(
        c,
        id,
        &format!("dd if=/dev/zero of={dir}/fill bs=1M count=4096"),
    )
    .await;
    assert_ne!(code, 0, "dd into {dir} cannot succeed: {err}");
    err
}

/// Creates empty files in `dir` until the filesystem refuses one; returns how many
/// and the shell's stderr.
async fn fill_with_files(c: &Client, id: &str, dir: &str) -> (u64, String) {
    let (_, out, err) = sh(
        c,
        id,
        &format!(
            "mkdir -p {dir}/many && i=0; while true > {dir}/many/f$i; do i=$((i+1)); done; echo $i"
        ),
    )
    .await;
    (out.trim().parse().expect("a count"), err)
}

/// The default sandbox (1G disk, 512M memory): 4 GiB of `dd` into `/tmp` ends with
/// `No space left on device` at the layer's size, which is what `df` shows, and
/// the sandbox goes on.
#[test]
fn filling_the_default_disk_fails_with_enospc_and_the_sandbox_lives_on() {
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        let sb = c.create_sandbox(&Default::default()).await.unwrap();
        let id = sb.id.as_str();
        let err = fill_with_data(&c, id, "/tmp").await;
        assert!(err.contains("No space left on device"), "{err}");
        still_alive(&c, id).await;
        // The layer holds what the memory limit leaves it, and says so.
        let (_, df, _) = sh(&c, id, "df -k / | tail -1").await;
        let size_kib: u64 = df.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert_eq!(size_kib, 384 << 10, "{df}");
        let (code, _, err) = sh(&c, id, "rm /tmp/fill && echo again > /tmp/x").await;
        assert_eq!(code, 0, "{err}");
        still_alive(&c, id).await;
    });
}

/// Files cost memory besides their data: a sandbox creating empty files until
/// the layer refuses one, then filling it with data, is full before its memory.
#[test]
fn filling_the_disk_with_files_then_data_leaves_the_agent_running() {
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        let sb = c
            .create_sandbox(&spec_body(json!({"resources": {"memory": "48M"}})))
            .await
            .unwrap();
        let id = sb.id.as_str();
        let (n, err) = fill_with_files(&c, id, "/tmp").await;
        assert!(err.contains("No space left on device"), "{err}");
        assert!(n > 1000, "{n} files");
        let err = fill_with_data(&c, id, "/home/user").await;
        assert!(err.contains("No space left on device"), "{err}");
        still_alive(&c, id).await;
    });
}

/// An image sandbox has more memory-backed filesystems: the writable layer the
/// daemon mounts, its `/dev` (with `/dev/shm`) and the spec's tmpfs mounts. Each
/// filled with files and data, all together still fit in its memory.
#[test]
fn filling_every_tmpfs_of_an_image_sandbox_leaves_the_agent_running() {
    let d = Daemon::start(None);
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(&tmp).unwrap();
    let archive = img_support::base_archive(&tmp, "test/base:1", 0);
    let (code, _, err) = d.cli(&["image", "import", archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let c = d.client();
    rt().block_on(async {
        let sb = c
            .create_sandbox(&spec_body(json!({
                "image": "test/base:1",
                "resources": {"memory": "96M", "disk": "1G"},
                "mounts": [{"type": "tmpfs", "target": "/scratch", "size": "8M"}],
            })))
            .await
            .unwrap();
        let id = sb.id.as_str();
        for dir in ["/tmp", "/dev/shm", "/scratch"] {
            let (_, err) = fill_with_files(&c, id, dir).await;
            assert!(err.contains("No space left on device"), "{dir}: {err}");
            let err = fill_with_data(&c, id, dir).await;
            assert!(err.contains("No space left on device"), "{dir}: {err}");
            still_alive(&c, id).await;
        }
    });
}

/// `tmpfs` mounts are memory too: a spec whose mounts would not leave the
/// writable layer room in the memory limit is refused, naming the mount.
#[test]
fn tmpfs_mounts_larger_than_the_memory_allows_are_refused() {
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        let e = c
            .create_sandbox(&spec_body(json!({
                "resources": {"memory": "256M"},
                "mounts": [{"type": "tmpfs", "target": "/big", "size": "1G"}],
            })))
            .await
            .unwrap_err();
        assert_eq!(e.status().unwrap().as_u16(), 400, "{e}");
        assert!(e.to_string().contains("mounts[0].size"), "{e}");
        assert!(e.to_string().contains("resources.memory = 256M"), "{e}");
    });
}
