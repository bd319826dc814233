//! The daemon's fork server: sandbox PID 1s forked from
//! `sandlot __zygote` share the binary's relocated pages instead of each holding a
//! private copy, and the fork server goes away with the daemon.

mod api_support;

use api_support::{rt, Daemon};
use sandlot_client::{CreateSandbox, ExecBody};

/// Children of `parent` (host pids), with their command lines.
fn children(parent: i32) -> Vec<(i32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let ppid = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse::<i32>().ok());
        if ppid == Some(parent) {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            out.push((pid, String::from_utf8_lossy(&cmd).replace('\0', " ")));
        }
    }
    out
}

/// The host pid of sandbox `id`'s PID 1 (a child of the daemon in its cgroup).
fn pid1(daemon: i32, id: &str) -> i32 {
    children(daemon)
        .into_iter()
        .map(|(p, _)| p)
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cgroup"))
                .is_ok_and(|c| c.contains(&format!("/{id}")))
        })
        .unwrap_or_else(|| panic!("no PID 1 of {id} under the daemon"))
}

/// `Private_Dirty` of a process, in KiB.
fn private_dirty_kib(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("Private_Dirty:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Creates a sandbox, checks it runs code, returns its PID 1's private memory.
fn sandbox_private_kib(d: &Daemon) -> (u64, String) {
    let c = d.client();
    rt().block_on(async {
        let sb = c.create_sandbox(&CreateSandbox::default()).await.unwrap();
        let body = ExecBody {
            argv: vec!["echo".into(), "ok".into()],
            ..Default::default()
        };
        let p = c.exec(&sb.id, &body).await.unwrap();
        let out = c
            .output(&sb.id, p.id, 0, 0)
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert_eq!(out.stdout, b"ok\n");
        let pid = pid1(d.pid(), &sb.id);
        let cmd = children(d.pid())
            .into_iter()
            .find(|(p, _)| *p == pid)
            .map(|(_, c)| c)
            .unwrap();
        (private_dirty_kib(pid), cmd)
    })
}

#[test]
fn forked_pid1_shares_the_binarys_relocated_pages() {
    let mut forked = Daemon::start(None);
    let (forked_kib, cmd) = sandbox_private_kib(&forked);
    assert!(cmd.contains("__zygote"), "PID 1 was not forked: {cmd}");
    let zygotes: Vec<i32> = children(forked.pid())
        .into_iter()
        .filter(|(_, c)| c.contains("__zygote"))
        .map(|(p, _)| p)
        .collect();

    let exec = Daemon::start(Some("[runtime]\nfork_server = false\n"));
    let (exec_kib, cmd) = sandbox_private_kib(&exec);
    assert!(cmd.contains("__init"), "PID 1 was not exec'd: {cmd}");
    // The exec'd PID 1 holds its own relocated copy of the binary's data (0.7 MiB
    // in a release build, more in a debug build); the forked one shares it.
    assert!(
        forked_kib + 256 < exec_kib,
        "forked PID 1: {forked_kib} KiB private, exec'd: {exec_kib} KiB"
    );
    drop(exec);

    // The fork server exits with the daemon.
    forked.shutdown();
    let outlived = |z: &i32| {
        let alive = std::fs::read_to_string(format!("/proc/{z}/cmdline"))
            .is_ok_and(|c| c.contains("__zygote"));
        let stat = std::fs::read_to_string(format!("/proc/{z}/stat")).unwrap_or_default();
        alive && !stat.contains(") Z ")
    };
    // They exit on their socket's end, once scheduled: polled for, 10 s at most.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while zygotes.iter().any(outlived) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for z in &zygotes {
        assert!(!outlived(z), "process {z} outlived the daemon");
    }
}

/// Runs `sh -c script` in sandbox `id`; returns (exit code, stdout, stderr).
fn sh(d: &Daemon, id: &str, script: &str) -> (Option<i32>, String, String) {
    rt().block_on(async {
        let out = d
            .client()
            .run(id, &["/bin/sh", "-c", script])
            .await
            .unwrap();
        (
            out.exit.code,
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
}

fn create(d: &Daemon) -> String {
    create_with(d, serde_json::json!({}))
}

/// Creates a sandbox with `spec` (a JSON object); returns its id.
fn create_with(d: &Daemon, spec: serde_json::Value) -> String {
    let serde_json::Value::Object(spec) = spec else {
        panic!("a spec is a JSON object: {spec}")
    };
    rt().block_on(async {
        d.client()
            .create_sandbox(&CreateSandbox {
                spec,
                ..Default::default()
            })
            .await
            .unwrap()
            .id
    })
}

/// The `host` image's allow-listed `/etc` entries come from one prepared,
/// read-only view that the fork server clones per sandbox (one mount instead of ~30
/// binds); `/etc` itself stays writable, the view is fresh after the host replaces a
/// bound file, and nothing of it is visible on the host.
#[test]
fn host_etc_comes_from_one_prepared_view() {
    use std::os::unix::fs::MetadataExt;
    let d = Daemon::start(None);
    let id = create(&d);
    let (code, out, err) = sh(
        &d,
        &id,
        "readlink /etc/services; cat /etc/services | md5sum; \
         awk '$5 ~ \"^/etc/\"' /proc/self/mountinfo | wc -l; \
         awk '$5 ~ \"^/run/host/etc\"' /proc/self/mountinfo | wc -l; \
         ls /etc/ssl/certs | grep -c . ; stat -L -c %i /etc/services; \
         echo 127.0.0.2 extra >> /etc/hosts && echo x > /etc/new-file && cat /etc/new-file; \
         touch /run/host/etc/intruder 2>&1; echo touch=$?",
    );
    assert_eq!(code, Some(0), "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "/run/host/etc/services", "{out}");
    let host_sum = {
        let o = std::process::Command::new("sh")
            .args(["-c", "md5sum < /etc/services"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(lines[1], host_sum.trim(), "same bytes as the host's");
    assert_eq!(lines[2], "0", "no mount left directly under /etc: {out}");
    let view_mounts: usize = lines[3].parse().unwrap();
    assert!(view_mounts > 5, "the view holds the entries: {out}");
    assert!(
        lines[4].parse::<usize>().unwrap() > 10,
        "CA certificates: {out}"
    );
    let host_ino = std::fs::metadata("/etc/services").unwrap().ino();
    assert_eq!(lines[5], host_ino.to_string(), "{out}");
    assert_eq!(lines[6], "x", "/etc is writable: {out}");
    assert!(lines[7].contains("Read-only file system"), "{out}");
    assert_eq!(lines[8], "touch=1", "{out}");

    // Nothing of the view is mounted on the host.
    let host_mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !host_mounts.contains(&d.dir.display().to_string()),
        "{host_mounts}"
    );

    // The host replaces a bound file (as ldconfig or an upgrade does: a new inode
    // renamed into place, same bytes here): the next sandbox sees the new one.
    let tmp = std::path::Path::new("/etc/.services.sandlot-test");
    std::fs::copy("/etc/services", tmp).unwrap();
    std::fs::rename(tmp, "/etc/services").unwrap();
    let new_ino = std::fs::metadata("/etc/services").unwrap().ino();
    assert_ne!(new_ino, host_ino);
    let id2 = create(&d);
    let (code, out, err) = sh(&d, &id2, "stat -L -c %i /etc/services");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out.trim(),
        new_ino.to_string(),
        "a stale view was handed out"
    );
    // The first sandbox keeps what it was given.
    let (_, out, _) = sh(&d, &id, "stat -L -c %i /etc/services");
    assert_eq!(out.trim(), host_ino.to_string());

    // A tmpfs over /run would hide the view: that sandbox binds the entries itself.
    let covered = create_with(
        &d,
        serde_json::json!({"mounts": [{"type": "tmpfs", "target": "/run"}]}),
    );
    let (code, out, err) = sh(
        &d,
        &covered,
        "test -L /etc/services; echo link=$?; md5sum < /etc/services; ls /run",
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, format!("link=1\n{}\n", host_sum.trim()), "{out}");

    // Without the fork server each sandbox binds the entries itself.
    let exec = Daemon::start(Some("[runtime]\nfork_server = false\n"));
    let id3 = create(&exec);
    let (code, out, err) = sh(
        &exec,
        &id3,
        "test -L /etc/services; echo link=$?; awk '$5 == \"/etc/services\"' /proc/self/mountinfo | wc -l",
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, "link=1\n1\n");
}

/// Runs `mount ARGS...` on the host, panicking with its stderr on failure.
fn host_mount(args: &[&str]) {
    let o = std::process::Command::new("mount")
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "mount {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Host mounts a test made, unmounted (and their directories removed) when dropped,
/// also when the test fails.
struct HostMounts(Vec<std::path::PathBuf>);

impl HostMounts {
    fn tmpfs(&mut self, at: &std::path::Path) {
        std::fs::create_dir_all(at).unwrap();
        host_mount(&[
            "-t",
            "tmpfs",
            "-o",
            "size=64k",
            "sandlot-test",
            at.to_str().unwrap(),
        ]);
        self.0.push(at.to_path_buf());
    }
}

impl Drop for HostMounts {
    fn drop(&mut self) {
        for m in self.0.iter().rev() {
            let _ = std::process::Command::new("umount").arg(m).status();
            let _ = std::fs::remove_dir(m);
        }
    }
}

/// Mount points in the mount namespace of process `pid`.
fn mount_points(pid: i32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .collect()
}

/// Every create copied the host's whole mount table, and the host
/// holds one bind mount per network slot under /run/netns, so creates slowed down as
/// `allow` sandboxes accumulated. The fork server works in a copy of the host's mount
/// namespace without /run/netns; a sandbox that binds host paths is still built in
/// the host's namespace, so it sees a mount the host made after the fork server
/// started.
#[test]
fn fork_server_leaves_the_hosts_netns_mounts_behind() {
    api_support::require_root();
    let me = std::process::id() as i32;
    // A mount under /run/netns, as a network slot leaves (`ip netns add` makes
    // /run/netns a shared mount point of its own; sandlot-net does the same).
    std::fs::create_dir_all("/run/netns").unwrap();
    if !mount_points(me).iter().any(|m| m == "/run/netns") {
        host_mount(&["--bind", "/run/netns", "/run/netns"]);
    }
    host_mount(&["--make-shared", "/run/netns"]);
    let mut made = HostMounts(Vec::new());
    let marker = std::path::PathBuf::from(format!("/run/netns/zt{me}-fork-server"));
    made.tmpfs(&marker);
    let late = std::env::temp_dir().join(format!("sandlot-late-{me}"));
    std::fs::create_dir_all(&late).unwrap();

    let d = Daemon::start(Some(&format!(
        "[mounts]\nallowed_host_paths = [{:?}]\n",
        late.display().to_string()
    )));
    let id = create(&d);
    let zygote = children(d.pid())
        .into_iter()
        .find(|(_, c)| c.contains("__zygote"))
        .map(|(p, _)| p)
        .expect("the daemon's fork server");
    let ns = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
    assert_ne!(
        ns(zygote),
        ns(me),
        "the fork server shares the host's mount namespace"
    );
    let own = mount_points(zygote);
    assert!(!own.iter().any(|m| m.starts_with("/run/netns")), "{own:?}");
    // Left behind in the fork server's namespace only: the host keeps its mounts.
    assert!(
        mount_points(me).contains(&marker.display().to_string()),
        "the host lost {}",
        marker.display()
    );
    let (code, out, err) = sh(&d, &id, "echo ok");
    assert_eq!((code, out.as_str()), (Some(0), "ok\n"), "{err}");

    // A host mount made after the fork server started, bound into a sandbox.
    made.tmpfs(&late);
    std::fs::write(late.join("hello"), "from a late mount").unwrap();
    let id2 = create_with(
        &d,
        serde_json::json!({"mounts": [{"type": "bind", "source": late, "target": "/data"}]}),
    );
    let (code, out, err) = sh(&d, &id2, "cat /data/hello");
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "from a late mount"),
        "{err}"
    );
    drop(d);
    drop(made);
}
