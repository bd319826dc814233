//! The gVisor backend through a real daemon: gVisor's kernel answers the sandbox's
//! system calls; nothing of a gVisor sandbox stays on the host after a delete, a
//! daemon `kill -9` and restart, or a crash of gVisor's own processes; and a
//! create asking for gVisor where the daemon cannot provide it is refused whole,
//! naming what is missing. Needs root and Debian's `runsc` (scripts/setup.sh).

mod api_support;
mod img_support;

use api_support::{eventually, leftovers_of, rt, spec_body, Daemon};
use sandlot_client::{ListFilter, SandboxState};
use serde_json::json;

fn gvisor() -> sandlot_client::CreateSandbox {
    spec_body(json!({"isolation": "gvisor"}))
}

/// Pids of gVisor's processes (sandbox, gofer) of sandbox `id`.
fn runsc_processes(id: &str) -> Vec<i32> {
    let root = format!("--root=/run/sandlot/gvisor/{id}/");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            (cmd.starts_with("runsc-") && cmd.contains(&root)).then_some(pid)
        })
        .collect()
}

#[test]
fn gvisors_kernel_answers_uname_and_proc_version() {
    let d = Daemon::start(None);
    let c = d.client();
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let host_version = std::fs::read_to_string("/proc/version").unwrap();
    rt().block_on(async {
        let g = c.create_sandbox(&gvisor()).await.unwrap();
        assert_eq!(g.spec["isolation"], "gvisor", "{:?}", g.spec);
        let n = c
            .create_sandbox(&spec_body(json!({"isolation": "namespace"})))
            .await
            .unwrap();
        let ask = |id: String| {
            let c = c.clone();
            async move {
                let o = c
                    .run(&id, &["/bin/sh", "-c", "uname -r; cat /proc/version"])
                    .await
                    .unwrap();
                assert_eq!(
                    o.exit.code,
                    Some(0),
                    "{}",
                    String::from_utf8_lossy(&o.stderr)
                );
                String::from_utf8(o.stdout).unwrap()
            }
        };
        let (inside_g, inside_n) = (ask(g.id.clone()).await, ask(n.id.clone()).await);
        // The namespace sandbox shares the host's kernel: the host answers.
        assert_eq!(inside_n, format!("{}{}", host_release, host_version));
        // gVisor's kernel answers for itself: neither the release nor the banner
        // are the host's.
        let mut lines = inside_g.lines();
        let (release, version) = (lines.next().unwrap(), lines.next().unwrap());
        assert_ne!(release, host_release.trim(), "{inside_g}");
        assert_ne!(version, host_version.trim(), "{inside_g}");
        assert!(version.starts_with("Linux version "), "{inside_g}");
        // And the host sees gVisor's processes, not the sandbox's command.
        assert!(!runsc_processes(&g.id).is_empty());
        for id in [&g.id, &n.id] {
            c.delete_sandbox(id).await.unwrap();
        }
    });
}

#[test]
fn nothing_of_a_gvisor_sandbox_stays_after_delete_kill9_restart_and_a_runsc_crash() {
    let mut d = Daemon::start(None);
    let c = d.client();
    let (kept, crashed) = rt().block_on(async {
        let gone = c.create_sandbox(&gvisor()).await.unwrap().id;
        let kept = c.create_sandbox(&gvisor()).await.unwrap().id;
        let crashed = c.create_sandbox(&gvisor()).await.unwrap().id;
        // A delete answers once gVisor's processes are dead; the rest follows.
        let rec = c.delete_sandbox(&gone).await.unwrap();
        assert_eq!(rec.state, SandboxState::Stopped);
        assert!(runsc_processes(&gone).is_empty());
        eventually(10, "the deleted sandbox's traces to go", || {
            let g = gone.clone();
            async move { leftovers_of(&g).is_empty() }
        })
        .await;
        (kept, crashed)
    });
    // The daemon dies; gVisor's processes do not, and the next daemon takes them
    // back with their agents.
    d.kill9();
    assert!(!runsc_processes(&kept).is_empty());
    d.spawn();
    let c = d.client();
    rt().block_on(async {
        let o = c.run(&kept, &["/bin/echo", "still here"]).await.unwrap();
        assert_eq!(o.stdout, b"still here\n");
        // gVisor's sandbox process crashes: the sandbox is recorded as exited,
        // and its gofer, cgroups and directory go.
        let sandbox_pid =
            std::fs::read_to_string(format!("/run/sandlot/gvisor/{crashed}/sandbox.pid")).unwrap();
        let pid: i32 = sandbox_pid.trim().parse().unwrap();
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
        eventually(20, "the crashed sandbox to be recorded and removed", || {
            let (c, id) = (c.clone(), crashed.clone());
            async move {
                c.get_sandbox(&id).await.unwrap().state == SandboxState::Stopped
                    && leftovers_of(&id).is_empty()
            }
        })
        .await;
        let rec = c.get_sandbox(&crashed).await.unwrap();
        assert_eq!(rec.end_reason.as_deref(), Some("exited"), "{rec:?}");
        // Its gofer went with it (the whole cgroup is killed).
        assert!(runsc_processes(&crashed).is_empty());
        let live = c.list_sandboxes(&ListFilter::default()).await.unwrap();
        let ids: Vec<&str> = live.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, vec![kept.as_str()]);
    });
    // `shutdown` deletes the last one and asserts that nothing of the prefix is
    // left: directories, cgroups in every hierarchy, runsc processes.
    d.shutdown();
    assert!(leftovers_of(&d.prefix).is_empty());
}

#[test]
fn asking_for_gvisor_where_it_cannot_run_is_refused_naming_what_is_missing() {
    let dir = std::env::temp_dir().join(format!("sandlot-old-runsc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A runsc that predates `--host-uds` (releases before 2022 only had
    // `--fsgofer-host-uds`).
    let old = dir.join("runsc");
    std::fs::write(
        &old,
        "#!/bin/sh\ncase \"$1\" in\n--version) echo 'runsc version release-20200127.0';;\n\
         flags) printf '  -fsgofer-host-uds\\n  -network value\\n  -platform string\\n    \\tspecifies which platform to use: ptrace (default), kvm.\\n  -root string\\n';;\n\
         *) exit 1;;\nesac\n",
    )
    .unwrap();
    std::fs::set_permissions(&old, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cases = [
        (
            format!(
                "[isolation]\nrunsc = \"{}\"\n",
                dir.join("missing").display()
            ),
            "runsc was not found",
        ),
        (
            format!("[isolation]\nrunsc = \"{}\"\n", old.display()),
            "runsc release-20200127.0 is too old: it has no --host-uds flag",
        ),
    ];
    for (config, says) in &cases {
        let d = Daemon::start(Some(config));
        let (status, body) = d.raw("POST", "/v1/sandboxes", r#"{"isolation": "gvisor"}"#);
        assert_eq!(status, 409, "{body}");
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(msg.contains(says), "{msg}");
        assert_eq!(body["error"]["field"], "isolation", "{body}");
        // The operator's path is the operator's business.
        assert!(!msg.contains(&dir.display().to_string()), "{msg}");
        // Nothing was made: no record, nothing on the host.
        let (_, list) = d.raw("GET", "/v1/sandboxes?state=all", "");
        assert_eq!(list["sandboxes"], json!([]), "{list}");
        assert!(d.leftovers().is_empty());
        // The namespace backend is unaffected.
        let (status, body) = d.raw("POST", "/v1/sandboxes", "{}");
        assert_eq!(status, 201, "{body}");
    }
    // Above the operator's ceiling: 400; an unknown kind: 400 naming the field.
    let d = Daemon::start(Some("[isolation]\nceiling = \"namespace\"\n"));
    let (status, body) = d.raw("POST", "/v1/sandboxes", r#"{"isolation": "gvisor"}"#);
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (400, Some("isolation")),
        "{body}"
    );
    let (status, body) = d.raw("POST", "/v1/sandboxes", r#"{"isolation": "vm"}"#);
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("isolation"),
        "{body}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// gVisor's kernel (Debian 12's runsc) has no openat2, with which the agent
/// refuses magic links while it resolves a path of the files API. Without it, the
/// agent's pipes and sockets (`/proc/1/fd/*`: its standard input, its listening
/// socket, its connections) must still not be served, nor its own `/proc` entries.
#[test]
fn the_files_api_serves_none_of_the_agents_descriptors_on_gvisor() {
    let d = Daemon::start(None);
    let c = d.client();
    let id = rt().block_on(c.create_sandbox(&gvisor())).unwrap().id;
    let sb = format!("/v1/sandboxes/{id}");
    // A link to one of them, made by the sandbox, is refused the same way.
    let o = rt()
        .block_on(c.run(&id, &["/bin/ln", "-s", "/proc/1/fd/0", "/tmp/stdin-link"]))
        .unwrap();
    assert_eq!(o.exit.code, Some(0));
    let mut paths: Vec<String> = (0..12).map(|n| format!("/proc/1/fd/{n}")).collect();
    paths.extend(["/proc/1/environ", "/proc/self/environ", "/tmp/stdin-link"].map(String::from));
    // The agent's standard output and error are the sandbox's own `/dev/null`
    // (`__agent --pid1`), which any process of it may open: those two may be
    // served, as that device and nothing else.
    let stat = |p: &str| d.raw("GET", &format!("{sb}/files/stat?path={p}&follow=true"), "");
    let (_, null) = stat("/dev/null");
    for p in &paths {
        if p.ends_with("/fd/1") || p.ends_with("/fd/2") {
            let (st, b) = stat(p);
            if st == 200 {
                assert_eq!(
                    (&b["kind"], &b["mode"], &b["size"]),
                    (&null["kind"], &null["mode"], &null["size"]),
                    "{p}: {b}"
                );
                continue;
            }
        }
        for route in ["files", "files/stat", "files/list"] {
            let (st, body) = d.raw("GET", &format!("{sb}/{route}?path={p}&follow=true"), "");
            let (st, body) = match st {
                // `files` and `files/list` take no `follow`.
                400 if body["error"]["field"] == "follow" => {
                    d.raw("GET", &format!("{sb}/{route}?path={p}"), "")
                }
                _ => (st, body),
            };
            assert!(
                (400..500).contains(&st),
                "{route} {p} was served: {st} {body}"
            );
        }
    }
    // Ordinary files are served.
    let (st, _) = d.raw("GET", &format!("{sb}/files/stat?path=/etc/hostname"), "");
    assert_eq!(st, 200);
    rt().block_on(c.delete_sandbox(&id)).unwrap();
}

/// The value of the metric line `name{pool="pool"} V`.
async fn pool_metric(c: &sandlot_client::Client, name: &str, pool: &str) -> Option<u64> {
    let text = c.metrics().await.ok()?;
    let key = format!("{name}{{pool=\"{pool}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
}

/// A `[[pools]]` spec with `isolation = "gvisor"` keeps gVisor sandboxes ready, and
/// a create asking for gVisor claims one (a namespace create does not).
#[test]
fn a_gvisor_pool_hands_out_gvisor_sandboxes() {
    let mut d = Daemon::start(Some(
        "[[pools]]\nname = \"g\"\nsize = 1\nspec = { isolation = \"gvisor\" }\n",
    ));
    let c = d.client();
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    rt().block_on(async {
        eventually(30, "the gVisor pool to be ready", || async {
            pool_metric(&c, "sandlot_pool_ready", "g").await == Some(1)
        })
        .await;
        let n = c
            .create_sandbox(&spec_body(json!({"isolation": "namespace"})))
            .await
            .unwrap();
        assert_eq!(
            pool_metric(&c, "sandlot_pool_hits_total", "g").await,
            Some(0)
        );
        let g = c.create_sandbox(&gvisor()).await.unwrap();
        assert_eq!(
            pool_metric(&c, "sandlot_pool_hits_total", "g").await,
            Some(1)
        );
        let o = c.run(&g.id, &["/bin/uname", "-r"]).await.unwrap();
        let release = String::from_utf8(o.stdout).unwrap();
        assert_ne!(
            release.trim(),
            host_release.trim(),
            "a pooled gVisor sandbox"
        );
        assert!(!runsc_processes(&g.id).is_empty());
        for id in [&g.id, &n.id] {
            c.delete_sandbox(id).await.unwrap();
        }
    });
    d.shutdown();
}

/// The agent (PID 1) starts with `runsc`'s standard output and error, a file on the
/// host: no process of the sandbox may write there through `/proc/1/fd` (a megabyte
/// at a time filled the host's `/run`).
#[test]
fn a_gvisor_sandbox_cannot_write_the_hosts_files_through_the_agents_descriptors() {
    let d = Daemon::start(None);
    let c = d.client();
    let id = rt().block_on(c.create_sandbox(&gvisor())).unwrap().id;
    let log = std::path::PathBuf::from(format!("/run/sandlot/gvisor/{id}/runsc.log"));
    let before = std::fs::metadata(&log).unwrap().len();
    let o = rt()
        .block_on(c.run(
            &id,
            &[
                "/bin/sh",
                "-c",
                "for n in 1 2; do head -c 1000000 /dev/zero > /proc/1/fd/$n; done; true",
            ],
        ))
        .unwrap();
    assert_eq!(o.exit.code, Some(0));
    let after = std::fs::metadata(&log).unwrap().len();
    assert_eq!(after, before, "the sandbox wrote to the host's log");
    rt().block_on(c.delete_sandbox(&id)).unwrap();
}

/// The agent's directory is bound writable into a gVisor sandbox from the host:
/// what the sandbox writes there lands in a tiny tmpfs of its own, never in the
/// host's `/run`, and the tmpfs goes with the sandbox.
#[test]
fn a_gvisor_sandbox_cannot_fill_the_hosts_run_through_the_agents_directory() {
    let mut d = Daemon::start(None);
    let c = d.client();
    let id = rt().block_on(c.create_sandbox(&gvisor())).unwrap().id;
    let dir = format!("/run/sandlot/gvisor/{id}/agent");
    let run_free = || rustix::fs::statvfs("/run").unwrap().f_bavail;
    let before = run_free();
    let o = rt()
        .block_on(c.run(
            &id,
            &[
                "/bin/sh",
                "-c",
                "cd /dev/.sandlot/run || exit 9; \
                 head -c 64000000 /dev/zero > big; echo size=$(wc -c < big); \
                 n=0; while [ $n -lt 200 ] && (: > f$n) 2>/dev/null; do n=$((n+1)); done; echo files=$n",
            ],
        ))
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let size: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("size="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{out}{}", String::from_utf8_lossy(&o.stderr)));
    let files: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("files="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{out}{}", String::from_utf8_lossy(&o.stderr)));
    assert!(
        size <= 16 * 1024,
        "wrote {size} bytes into the agent's directory"
    );
    assert!(files < 16, "made {files} files in the agent's directory");
    // What the sandbox wrote is on the tmpfs, not in the host's /run.
    assert!(
        before.saturating_sub(run_free()) < 1000,
        "the host's /run lost space"
    );
    let mounts = || std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(mounts().contains(&format!(" {dir} ")), "{dir} is no mount");
    rt().block_on(async {
        c.delete_sandbox(&id).await.unwrap();
        eventually(10, "the agent's tmpfs unmounted", || {
            let gone = !mounts().contains(&format!(" {dir} "));
            async move { gone }
        })
        .await;
    });
    d.shutdown();
}

/// A daemon with the test's store image `test/base:1` imported.
fn daemon_with_base_image() -> Daemon {
    let d = Daemon::start(None);
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(&tmp).unwrap();
    let archive = img_support::base_archive(&tmp, "test/base:1", 1);
    let (code, out, err) = d.cli(&["image", "import", archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    d
}

/// A store image on gVisor: its layers and config, a size-limited writable layer
/// the host can snapshot (gVisor's writes reach the host's directory, no cache of
/// its own in between), and a new gVisor sandbox started from the snapshot.
#[test]
fn a_gvisor_sandbox_runs_a_store_image_and_its_snapshot_has_its_writes() {
    let mut d = daemon_with_base_image();
    let c = d.client();
    rt().block_on(async {
        let body = |image: &str| spec_body(json!({"image": image, "isolation": "gvisor", "resources": {"disk": "4M"}}));
        let a = c.create_sandbox(&body("test/base:1")).await.unwrap().id;
        let sh = |id: String, cmd: &'static str| {
            let c = c.clone();
            async move {
                let o = c.run(&id, &["/bin/sh", "-c", cmd]).await.unwrap();
                (o.exit.code, String::from_utf8_lossy(&o.stdout).into_owned())
            }
        };
        let (code, out) = sh(a.clone(), "echo $FROM_IMAGE; cat /opt/layers/0 /proc/version").await;
        assert_eq!(code, Some(0), "{out}");
        let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        assert!(out.starts_with("yes\nlayer 0\n") && !out.contains(host.trim()), "{out}");
        // The disk limit holds, and a write is in the snapshot at once.
        let (_, out) = sh(a.clone(), "dd if=/dev/zero of=/opt/big bs=1M count=8 2>/dev/null || echo full; rm -f /opt/big; echo kept > /opt/new").await;
        assert_eq!(out, "full\n");
        let snap = c
            .call_json("POST", &format!("/v1/sandboxes/{a}/snapshot"), Some(&json!({"tag": "test/gsnap:1"})))
            .await
            .unwrap();
        assert_eq!(snap["source"], "snapshot", "{snap}");
        // What the runtime made to mount on (`/proc`, `/dev`, `/etc/hosts`...) and
        // the host name it wrote are not the sandbox's change.
        let diff = c
            .call_json("GET", "/v1/images/diff?a=test/base:1&b=test/gsnap:1", None)
            .await
            .unwrap();
        assert_eq!(diff["added"], json!(["/opt/new"]), "{diff}");
        assert_eq!(diff["removed"], json!([]), "{diff}");
        assert_eq!(sh(a.clone(), "echo alive").await.1, "alive\n");
        let b = c.create_sandbox(&body("test/gsnap:1")).await.unwrap().id;
        assert_eq!(sh(b.clone(), "cat /opt/new").await.1, "kept\n");
        for id in [&a, &b] {
            c.delete_sandbox(id).await.unwrap();
        }
    });
    d.shutdown();
}

/// Runs `script` in sandbox `id` (it must succeed), saves the sandbox as image
/// `tag` and deletes it.
async fn save_as(c: &sandlot_client::Client, id: &str, script: &str, tag: &str) {
    let o = c.run(id, &["/bin/sh", "-c", script]).await.unwrap();
    assert_eq!(
        o.exit.code,
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    c.call_json(
        "POST",
        &format!("/v1/sandboxes/{id}/snapshot"),
        Some(&json!({ "tag": tag })),
    )
    .await
    .unwrap();
    c.delete_sandbox(id).await.unwrap();
}

/// The attack: an image whose `/tmp` is a link to a host path (made in a namespace
/// sandbox and saved as a snapshot). `runsc` resolves a bind's source on the host,
/// so binding the root's `/tmp` by path would mount the host directory the link
/// names into a gVisor sandbox. Such an image is refused on gVisor, naming the
/// problem, and leaves nothing behind; on the namespace backend the link is
/// followed inside the root only. A `/tmp` that loops is refused on both.
#[test]
fn an_images_tmp_link_never_binds_a_host_directory_into_a_gvisor_sandbox() {
    // A host directory the link names, and which the image has too (so that the
    // plan's `/tmp` step, following the link inside the root, finds it).
    let marker =
        std::path::PathBuf::from(format!("/var/tmp/sandlot-tmp-link-{}", std::process::id()));
    std::fs::create_dir_all(&marker).unwrap();
    std::fs::write(marker.join("host-secret"), "host\n").unwrap();
    struct Gone(std::path::PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _gone = Gone(marker.clone());
    let mut d = daemon_with_base_image();
    let c = d.client();
    rt().block_on(async {
        let ns = |image: &str| spec_body(json!({"image": image}));
        let a = c.create_sandbox(&ns("test/base:1")).await.unwrap().id;
        let link = format!(
            "mkdir -p {m} && rm -rf /tmp && ln -s {m} /tmp && ls -ld /tmp",
            m = marker.display()
        );
        save_as(&c, &a, &link, "test/tmplink:1").await;

        let e = c
            .create_sandbox(&spec_body(
                json!({"image": "test/tmplink:1", "isolation": "gvisor"}),
            ))
            .await
            .unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(400), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("/tmp") && msg.contains("symbolic link"),
            "{msg}"
        );
        assert!(!msg.contains(&marker.display().to_string()), "{msg}");
        eventually(10, "the refused sandbox's traces to go", || {
            let p = d.prefix.clone();
            async move { leftovers_of(&p).is_empty() }
        })
        .await;

        // The namespace backend follows the link inside the root, never to the host.
        let b = c.create_sandbox(&ns("test/tmplink:1")).await.unwrap().id;
        let o = c.run(&b, &["/bin/sh", "-c", "ls -A /tmp/"]).await.unwrap();
        assert_eq!(
            o.exit.code,
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!String::from_utf8_lossy(&o.stdout).contains("host-secret"));
        // A `/tmp` that is a loop of links is the image's problem on both
        // backends: 400 on `image` naming `/tmp` in the sandbox, never a 500.
        save_as(&c, &b, "rm -f /tmp && ln -s /tmp/x /tmp", "test/tmploop:1").await;
        for isolation in ["namespace", "gvisor"] {
            let e = c
                .create_sandbox(&spec_body(
                    json!({"image": "test/tmploop:1", "isolation": isolation}),
                ))
                .await
                .unwrap_err();
            assert_eq!(
                e.status().map(|s| s.as_u16()),
                Some(400),
                "{isolation}: {e}"
            );
            let msg = e.to_string();
            assert!(
                msg.contains("/tmp in the sandbox is a symbolic link"),
                "{isolation}: {msg}"
            );
        }
        eventually(10, "the refused sandboxes' traces to go", || {
            let p = d.prefix.clone();
            async move { leftovers_of(&p).is_empty() }
        })
        .await;
    });
    d.shutdown();
}

/// A FIFO an image has where the runtime writes its own file (`/etc/hostname`):
/// opened for writing, it would wait for a reader for ever and hold the create
/// (and a create slot every tenant shares). It is replaced on both backends.
#[test]
fn a_fifo_in_an_image_at_a_runtime_file_is_replaced_not_waited_on() {
    let mut d = Daemon::start(None);
    let tmp = d.dir.join("work");
    let root = tmp.join("rootfs");
    img_support::mini_rootfs(&root);
    let fifo = tmp.join("fifo");
    std::fs::create_dir_all(fifo.join("etc")).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(fifo.join("etc/hostname"))
        .status()
        .unwrap();
    assert!(made.success());
    let cfg = sandlot_store::ImageConfig {
        env: vec!["PATH=/usr/bin:/bin".into()],
        workdir: None,
        user: None,
        entrypoint: vec![],
        cmd: vec!["/bin/sh".into()],
        host_base: false,
    };
    let archive = tmp.join("fifo.tar");
    img_support::archive_of(&tmp, &[root, fifo], &cfg, "test/fifo:1", &archive);
    let (code, out, err) = d.cli(&["image", "import", archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let c = d.client();
    rt().block_on(async {
        for isolation in ["namespace", "gvisor"] {
            let body = spec_body(json!({"image": "test/fifo:1", "isolation": isolation}));
            let id =
                tokio::time::timeout(std::time::Duration::from_secs(60), c.create_sandbox(&body))
                    .await
                    .expect("the create waited on the FIFO")
                    .unwrap()
                    .id;
            let o = c
                .run(
                    &id,
                    &[
                        "/bin/sh",
                        "-c",
                        "test -f /etc/hostname && cat /etc/hostname",
                    ],
                )
                .await
                .unwrap();
            assert_eq!(
                o.exit.code,
                Some(0),
                "{isolation}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            assert!(!o.stdout.is_empty(), "{isolation}");
            c.delete_sandbox(&id).await.unwrap();
        }
    });
    d.shutdown();
}

/// An operator who requires gVisor (`[isolation] minimum = "gvisor"`) gets it for
/// every sandbox: a create asking for less is refused naming the minimum, one naming
/// nothing runs on gVisor, and so do the sandboxes of an image build's steps.
#[test]
fn an_operators_minimum_isolation_holds_for_creates_and_build_steps() {
    let mut d = Daemon::start(Some(
        "[isolation]\nminimum = \"gvisor\"\ndefault = \"gvisor\"\n",
    ));
    let c = d.client();
    rt().block_on(async {
        let e = c
            .create_sandbox(&spec_body(json!({"isolation": "namespace"})))
            .await
            .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("isolation") && msg.contains("below the operator's minimum \"gvisor\""),
            "{msg}"
        );
        let s = c.create_sandbox(&spec_body(json!({}))).await.unwrap();
        assert_eq!(s.spec["isolation"], "gvisor", "{:?}", s.spec);
        c.delete_sandbox(&s.id).await.unwrap();
    });
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(tmp.join("ctx")).unwrap();
    let archive = img_support::base_archive(&tmp, "test/base:1", 1);
    let (code, _, err) = d.cli(&["image", "import", archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let spec = tmp.join("spec.toml");
    std::fs::write(
        &spec,
        "from = \"test/base:1\"\n[[steps]]\nrun = \"echo kernel=$(cat /proc/sys/kernel/osrelease)\"\n",
    )
    .unwrap();
    let (code, out, err) = d.cli(&[
        "image",
        "build",
        "-f",
        spec.to_str().unwrap(),
        tmp.join("ctx").to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    // gVisor's kernel answers the step, not the host's.
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(err.contains("kernel="), "{err}");
    assert!(
        !err.contains(&format!("kernel={}", host.trim())),
        "a build step ran on the host kernel: {err}"
    );
    d.shutdown();
}

/// gVisor's gofer of sandbox `id` (the process that opens the sandbox's files on
/// the host) and the first host uid of its user namespace's mapping (0 when it
/// has none: it is host root).
fn gofer_and_id_base(id: &str) -> (i32, u32) {
    let gofer = runsc_processes(id)
        .into_iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.starts_with(b"runsc-gofer"))
        })
        .expect("the sandbox's gofer");
    let map = std::fs::read_to_string(format!("/proc/{gofer}/uid_map")).unwrap();
    let base = map.split_whitespace().nth(1).unwrap().parse().unwrap();
    (gofer, base)
}

fn owner(path: &std::path::Path) -> (u32, u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.uid(), m.gid(), m.mode() & 0o7777)
}

/// Whether a host id belongs to a sandbox's range (never host root, never a host
/// user's id below the ranges' base).
fn in_range(id: u32, base: u32) -> bool {
    base >= first_id_base() && (base..base + sandlot_runtime::plan::ID_RANGE).contains(&id)
}

/// Where the sandboxes' id ranges start on the host.
fn first_id_base() -> u32 {
    sandlot_runtime::RuntimeConfig::new(std::path::PathBuf::new()).id_base
}

/// The attack: root in a gVisor sandbox makes a set-uid-root program on a
/// writable bind of a host directory, gives a file to root (`chown 0:0`), and
/// reads a host file only host root may read. gVisor's gofer acts on those host
/// files as the sandbox's id range: on the host both files belong to the range,
/// not to host root, and the root-only file stays unread.
#[test]
fn root_in_a_gvisor_sandbox_is_its_id_range_on_bound_host_files_never_host_root() {
    let base = std::env::temp_dir().join(format!("sandlot-gvisor-ids-{}", std::process::id()));
    struct RemoveOnDrop(std::path::PathBuf);
    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = RemoveOnDrop(base.clone());
    let (rw, ro) = (base.join("rw"), base.join("ro"));
    use std::os::unix::fs::PermissionsExt;
    for d in [&rw, &ro] {
        std::fs::create_dir_all(d).unwrap();
    }
    // Anyone may write here (root of the sandbox too, without host root's powers).
    std::fs::set_permissions(&rw, std::fs::Permissions::from_mode(0o777)).unwrap();
    let secret = ro.join("root-only");
    std::fs::write(&secret, "host root only\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(owner(&secret).0, 0, "the test runs as host root");
    let d = Daemon::start(Some(&format!(
        "[mounts]\nallowed_host_paths = [\"{}\"]\n",
        base.display()
    )));
    let c = d.client();
    let body = spec_body(json!({
        "isolation": "gvisor",
        "mounts": [
            {"type": "bind", "source": rw.display().to_string(), "target": "/rw", "readonly": false},
            {"type": "bind", "source": ro.display().to_string(), "target": "/ro"},
        ],
    }));
    let id = rt().block_on(c.create_sandbox(&body)).unwrap().id;
    let (_, id_base) = gofer_and_id_base(&id);
    let o = rt()
        .block_on(c.run(
            &id,
            &[
                "/bin/sh",
                "-c",
                "id -u; cp /bin/sh /rw/suid && chmod 4755 /rw/suid && touch /rw/given && chown 0:0 /rw/given && echo made; \
                 cat /ro/root-only || echo unread",
            ],
        ))
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(out.starts_with("0\nmade\n"), "{out}{err}");
    assert!(
        !out.contains("host root only"),
        "read a host root-only file: {out}"
    );
    assert!(out.ends_with("unread\n"), "{out}{err}");
    for f in ["suid", "given"] {
        let (uid, gid, mode) = owner(&rw.join(f));
        assert!(
            in_range(uid, id_base) && in_range(gid, id_base),
            "{f} is {uid}:{gid} (mode {mode:o}) on the host, the sandbox's range starts at {id_base}"
        );
        // Root inside is the range's first id.
        assert_eq!((uid, gid), (id_base, id_base), "{f}");
    }
    rt().block_on(c.delete_sandbox(&id)).unwrap();
}

/// The attack: root in a gVisor sandbox of the `host` image writes its writable
/// layer and gives a file there to root. The layer's files belong to the
/// sandbox's range on the host (seen through the gofer's root), never to host
/// root; and the `host` image's own read-only view of the host stays readable.
#[test]
fn a_gvisor_sandboxs_writable_layer_belongs_to_its_id_range_on_the_host() {
    let d = Daemon::start(None);
    let c = d.client();
    let id = rt().block_on(c.create_sandbox(&gvisor())).unwrap().id;
    let (gofer, id_base) = gofer_and_id_base(&id);
    assert!(
        id_base >= first_id_base(),
        "the gofer is host root ({id_base})"
    );
    let o = rt()
        .block_on(c.run(
            &id,
            &[
                "/bin/sh",
                "-c",
                "mkdir /made && echo x > /made/f && chown 0:0 /made/f && chown 1000:1000 /made && test -r /usr/bin/env && echo ok",
            ],
        ))
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(
        o.exit.code,
        Some(0),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let root = std::path::PathBuf::from(format!("/proc/{gofer}/root"));
    assert_eq!(owner(&root.join("made/f")).0, id_base);
    assert_eq!(owner(&root.join("made")).0, id_base + 1000);
    // What the runtime made for the sandbox is the sandbox root's too.
    for p in ["", "etc", "etc/hostname"] {
        let (uid, gid, _) = owner(&root.join(p));
        assert!(
            in_range(uid, id_base) && in_range(gid, id_base),
            "/{p}: {uid}:{gid}"
        );
    }
    rt().block_on(c.delete_sandbox(&id)).unwrap();
}

/// An operator raises the minimum to gVisor while namespace sandboxes run, and
/// restarts the daemon: those sandboxes are stopped, with reason `policy`, not
/// adopted to run on under the old rule.
#[test]
fn a_sandbox_below_a_raised_isolation_minimum_is_stopped_at_the_next_start() {
    let mut d = Daemon::start_isolated(Some("[isolation]\ndefault = \"namespace\"\n"), "namespace");
    let c = d.client();
    let id = rt()
        .block_on(c.create_sandbox(&spec_body(
            json!({"isolation": "namespace", "timeout": "10m"}),
        )))
        .unwrap()
        .id;
    d.kill9();
    std::fs::write(
        d.config.as_ref().unwrap(),
        "[isolation]\nminimum = \"gvisor\"\ndefault = \"gvisor\"\n",
    )
    .unwrap();
    d.spawn();
    let c = d.client();
    rt().block_on(eventually(20, "the sandbox stopped by the policy", || {
        let (c, id) = (c.clone(), id.clone());
        async move {
            let s = c.get_sandbox(&id).await.unwrap();
            s.state == SandboxState::Stopped && s.end_reason.as_deref() == Some("policy")
        }
    }));
    d.shutdown();
}
