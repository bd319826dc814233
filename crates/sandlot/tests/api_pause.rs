//! Pause and resume through a real daemon. On gVisor a pause keeps the
//! sandbox's memory: its processes, their memory, open files and sockets come
//! back as they were, after a daemon restart too, while nothing of it runs on the
//! host. On the namespace backend a pause keeps its files only. Wrong states,
//! a pause gVisor cannot save, a damaged memory image and a daemon killed mid-way leave
//! consistent records and nothing behind. Needs root (and Debian's `runsc` for
//! the gVisor tests).

mod api_support;
mod img_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use api_support::{eventually, leftovers_of, mounts_under, rt, spec_body, Daemon};
use sandlot_client::{Client, ExecBody, SandboxState};
use serde_json::json;

/// Serves TCP connections on 127.0.0.1:7000 inside the sandbox, answering each
/// with the number of connections it has served (kept in its memory), its pid and
/// its child's pid; it also writes that number to `/tmp/served` through a file it
/// keeps open.
const SERVER: &str = r#"
import os, socket, subprocess
child = subprocess.Popen(["sleep", "100000"])
log = open("/tmp/served", "a")
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 7000))
s.listen(8)
with open("/tmp/ready", "w") as f:
    f.write("ok")
n = 0
while True:
    c, _ = s.accept()
    n += 1
    log.write(f"{n}\n")
    log.flush()
    c.sendall(f"{n} {os.getpid()} {child.pid}\n".encode())
    c.close()
"#;

const PROBE: &str = r#"import socket; s = socket.create_connection(("127.0.0.1", 7000)); print(s.recv(100).decode(), end="")"#;

fn gvisor() -> sandlot_client::CreateSandbox {
    spec_body(json!({"isolation": "gvisor"}))
}

fn namespace() -> sandlot_client::CreateSandbox {
    spec_body(json!({"isolation": "namespace"}))
}

fn background(argv: &[&str]) -> ExecBody {
    ExecBody {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        background: true,
        ..Default::default()
    }
}

async fn sh(c: &Client, id: &str, script: &str) -> String {
    let o = c.run(id, &["/bin/sh", "-c", script]).await.unwrap();
    assert_eq!(
        o.exit.code,
        Some(0),
        "{script}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Starts [`SERVER`] in sandbox `id` and waits until it listens.
async fn start_server(c: &Client, id: &str) {
    c.write_file_bytes(id, "/tmp/srv.py", SERVER.as_bytes().to_vec())
        .await
        .unwrap();
    c.exec(id, &background(&["python3", "/tmp/srv.py"]))
        .await
        .unwrap();
    eventually(20, "the server to listen", || {
        let (c, id) = (c.clone(), id.to_string());
        async move {
            c.run(&id, &["/bin/cat", "/tmp/ready"])
                .await
                .is_ok_and(|o| o.stdout == b"ok")
        }
    })
    .await;
}

/// What the server answers: (connections served, its pid, its child's pid).
async fn probe(c: &Client, id: &str) -> (u64, String, String) {
    let out = c.run(id, &["python3", "-c", PROBE]).await.unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut f = text.split_whitespace();
    let n = f.next().and_then(|n| n.parse().ok());
    match (n, f.next(), f.next()) {
        (Some(n), Some(pid), Some(child)) => (n, pid.into(), child.into()),
        _ => panic!(
            "the server answered {text:?} ({})",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
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

fn checkpoint_dir(d: &Daemon, id: &str) -> PathBuf {
    d.data_dir().join("checkpoints").join(id)
}

/// Asserts a 409 `code` whose message names `state`.
fn assert_conflict(
    r: Result<sandlot_client::Sandbox, sandlot_client::Error>,
    code: &str,
    state: &str,
) {
    let e = r.expect_err("a conflict");
    assert_eq!(
        (e.status().map(|s| s.as_u16()), e.code()),
        (Some(409), Some(code)),
        "{e}"
    );
    assert!(e.to_string().contains(state), "{e}");
}

#[test]
fn a_paused_gvisor_sandbox_resumes_with_its_processes_memory_open_files_and_sockets() {
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&gvisor()).await.unwrap();
        start_server(&c, &s.id).await;
        let (n, pid, child) = probe(&c, &s.id).await;
        assert_eq!(n, 1);
        let p = c.pause_sandbox(&s.id).await.unwrap();
        assert_eq!(p.state, SandboxState::Paused);
        assert_eq!(p.pause, Some(sandlot_client::api::PauseKind::Memory));
        // Nothing of it runs: no gVisor process, no cgroup; its memory image is
        // on disk, readable by root only.
        assert!(runsc_processes(&s.id).is_empty());
        assert!(leftovers_of(&s.id).is_empty(), "{:?}", leftovers_of(&s.id));
        let ckpt = checkpoint_dir(&d, &s.id);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&ckpt).unwrap().permissions().mode() & 0o777,
            0o700
        );
        // Work on a paused sandbox is refused, naming its state.
        let e = c.run(&s.id, &["/bin/true"]).await.unwrap_err();
        assert_eq!(
            (e.code(), e.status().map(|s| s.as_u16())),
            (Some("invalid_state"), Some(409))
        );
        assert!(e.to_string().contains("paused"), "{e}");
        let e = c.stat(&s.id, "/tmp").await.unwrap_err();
        assert_eq!(e.code(), Some("invalid_state"), "{e}");
        let r = c.resume_sandbox(&s.id).await.unwrap();
        assert_eq!((r.state, r.pause), (SandboxState::Running, None));
        // The same processes, the count where it was, the open file written on.
        assert_eq!(probe(&c, &s.id).await, (2, pid.clone(), child.clone()));
        assert_eq!(sh(&c, &s.id, "cat /tmp/served").await, "1\n2\n");
        sh(&c, &s.id, &format!("kill -0 {child}")).await;
        // The checkpoint is gone once used.
        assert!(!ckpt.exists());
        // And it pauses and resumes again, every time: the same processes, the
        // count where it was, nothing of it running while it is paused.
        for n in 3..=7 {
            c.pause_sandbox(&s.id).await.unwrap();
            assert!(runsc_processes(&s.id).is_empty());
            let r = c
                .resume_sandbox(&s.id)
                .await
                .unwrap_or_else(|e| panic!("resume {}: {e}", n - 1));
            assert_eq!((r.state, r.pause), (SandboxState::Running, None));
            assert_eq!(probe(&c, &s.id).await, (n, pid.clone(), child.clone()));
            assert!(!ckpt.exists());
        }
        assert_eq!(
            sh(&c, &s.id, "cat /tmp/served").await,
            "1\n2\n3\n4\n5\n6\n7\n"
        );
        let _ = c.delete_sandbox(&s.id).await;
    });
}

#[test]
fn a_paused_gvisor_sandbox_survives_a_daemon_restart() {
    let mut d = Daemon::start(None);
    let c = d.client();
    let id = rt().block_on(async {
        let s = c.create_sandbox(&gvisor()).await.unwrap();
        start_server(&c, &s.id).await;
        assert_eq!(probe(&c, &s.id).await.0, 1);
        c.pause_sandbox(&s.id).await.unwrap();
        s.id
    });
    d.kill9();
    d.spawn();
    let c = d.client();
    rt().block_on(async {
        let s = c.get_sandbox(&id).await.unwrap();
        assert_eq!(
            (s.state, s.pause),
            (
                SandboxState::Paused,
                Some(sandlot_client::api::PauseKind::Memory)
            )
        );
        c.resume_sandbox(&id).await.unwrap();
        assert_eq!(probe(&c, &id).await.0, 2);
        c.delete_sandbox(&id).await.unwrap();
    });
}

#[test]
fn a_daemon_killed_during_a_pause_or_resume_leaves_the_sandbox_running_paused_or_gone() {
    let mut d = Daemon::start(None);
    for (step, delay) in [("pause", 150u64), ("resume", 150), ("pause", 30)] {
        let c = d.client();
        let id = rt().block_on(async {
            let s = c.create_sandbox(&gvisor()).await.unwrap();
            start_server(&c, &s.id).await;
            if step == "resume" {
                c.pause_sandbox(&s.id).await.unwrap();
            }
            s.id
        });
        // The request runs on while the daemon is killed under it.
        let (c2, id2) = (c.clone(), id.clone());
        let asked = std::thread::spawn(move || {
            rt().block_on(async move {
                let _ = match step {
                    "pause" => c2.pause_sandbox(&id2).await,
                    _ => c2.resume_sandbox(&id2).await,
                };
            })
        });
        std::thread::sleep(Duration::from_millis(delay));
        d.kill9();
        let _ = asked.join();
        d.spawn();
        let c = d.client();
        rt().block_on(async {
            let s = c.get_sandbox(&id).await.unwrap();
            match s.state {
                SandboxState::Running => {
                    // It answers as before.
                    assert_eq!(probe(&c, &id).await.0, 1, "{step}: {s:?}");
                }
                SandboxState::Paused => {
                    assert!(runsc_processes(&id).is_empty(), "{step}");
                    c.resume_sandbox(&id).await.unwrap();
                    assert_eq!(probe(&c, &id).await.0, 1, "{step}: {s:?}");
                }
                SandboxState::Stopped => {
                    // Its checkpoint ended it, and the record of the pause was
                    // never written: lost (or, re-adopted as the checkpoint
                    // finished, exited).
                    assert!(
                        matches!(s.end_reason.as_deref(), Some("lost" | "exited")),
                        "{step}: {s:?}"
                    );
                    // An exit's clean-up runs on after its record says stopped.
                    eventually(20, "an ended sandbox's host traces to go", || {
                        let (id, dir) = (id.clone(), checkpoint_dir(&d, &id));
                        async move { leftovers_of(&id).is_empty() && !dir.exists() }
                    })
                    .await;
                }
                other => panic!("{step}: the sandbox is {other:?} after a restart"),
            }
            c.delete_sandbox(&id).await.unwrap();
            // The host's side of a running sandbox goes right after the delete.
            eventually(20, "the sandbox's host traces to go", || {
                let id = id.clone();
                async move { leftovers_of(&id).is_empty() }
            })
            .await;
            assert!(!checkpoint_dir(&d, &id).exists(), "{step}");
        });
    }
}

#[test]
fn pausing_or_resuming_in_the_wrong_state_is_a_409_naming_the_state() {
    let d = Daemon::start_isolated(None, "namespace");
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&namespace()).await.unwrap();
        assert_conflict(c.resume_sandbox(&s.id).await, "invalid_state", "running");
        c.pause_sandbox(&s.id).await.unwrap();
        assert_conflict(c.pause_sandbox(&s.id).await, "invalid_state", "paused");
        c.resume_sandbox(&s.id).await.unwrap();
        c.delete_sandbox(&s.id).await.unwrap();
        assert_conflict(c.pause_sandbox(&s.id).await, "invalid_state", "stopped");
        assert_conflict(c.resume_sandbox(&s.id).await, "invalid_state", "stopped");
        // Another tenant's, or nobody's, is not found.
        let e = c.pause_sandbox("no-such-sandbox").await.unwrap_err();
        assert_eq!(e.code(), Some("not_found"), "{e}");
    });
}

#[test]
fn a_namespace_sandbox_pauses_its_files_only_and_resumes_from_them() {
    let d = Daemon::start_isolated(None, "namespace");
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&namespace()).await.unwrap();
        sh(
            &c,
            &s.id,
            "echo kept > /root/note; mkdir -p /srv/data && echo more > /srv/data/x",
        )
        .await;
        c.exec(&s.id, &background(&["sleep", "100000"]))
            .await
            .unwrap();
        let p = c.pause_sandbox(&s.id).await.unwrap();
        assert_eq!(
            (p.state, p.pause),
            (
                SandboxState::Paused,
                Some(sandlot_client::api::PauseKind::Filesystem)
            )
        );
        // No process of it is left.
        assert!(leftovers_of(&s.id).is_empty(), "{:?}", leftovers_of(&s.id));
        c.resume_sandbox(&s.id).await.unwrap();
        assert_eq!(
            sh(&c, &s.id, "cat /root/note /srv/data/x").await,
            "kept\nmore\n"
        );
        // Its processes ended at the pause.
        let o = c.run(&s.id, &["pgrep", "-x", "sleep"]).await.unwrap();
        assert_eq!(
            o.exit.code,
            Some(1),
            "{}",
            String::from_utf8_lossy(&o.stdout)
        );
        // A second pause keeps what the sandbox wrote since.
        sh(&c, &s.id, "echo again >> /root/note").await;
        c.pause_sandbox(&s.id).await.unwrap();
        c.resume_sandbox(&s.id).await.unwrap();
        assert_eq!(sh(&c, &s.id, "cat /root/note").await, "kept\nagain\n");
        c.delete_sandbox(&s.id).await.unwrap();
    });
}

#[test]
fn a_pause_gvisor_cannot_save_is_refused_before_its_checkpoint_and_the_sandbox_runs_on() {
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&gvisor()).await.unwrap();
        start_server(&c, &s.id).await;
        // A Unix socket bound in /tmp is a host socket gVisor cannot save.
        let bind = r#"import socket, time; s = socket.socket(socket.AF_UNIX); s.bind("/tmp/held.sock"); s.listen(); open("/tmp/bound", "w").write("ok"); time.sleep(100000)"#;
        let holder = c
            .exec(&s.id, &background(&["python3", "-c", bind]))
            .await
            .unwrap();
        eventually(20, "the socket to be bound", || {
            let (c, id) = (c.clone(), s.id.clone());
            async move { c.run(&id, &["/bin/cat", "/tmp/bound"]).await.is_ok_and(|o| o.stdout == b"ok") }
        })
        .await;
        let e = c.pause_sandbox(&s.id).await.unwrap_err();
        assert_eq!(
            (e.status().map(|s| s.as_u16()), e.code()),
            (Some(409), Some("pause_refused")),
            "{e}"
        );
        assert!(e.to_string().contains("/tmp/held.sock"), "{e}");
        assert!(!e.to_string().contains(&d.data_dir().display().to_string()), "{e}");
        // It runs on, as it was.
        assert_eq!(c.get_sandbox(&s.id).await.unwrap().state, SandboxState::Running);
        assert_eq!(probe(&c, &s.id).await.0, 1);
        assert!(!checkpoint_dir(&d, &s.id).exists());
        // Without the socket it pauses.
        c.signal(&s.id, holder.id, "KILL").await.unwrap();
        sh(&c, &s.id, "rm -f /tmp/held.sock").await;
        // The host has no room for the memory image: refused, and it runs on.
        let ckpts = d.data_dir().join("checkpoints");
        std::fs::create_dir_all(&ckpts).unwrap();
        let full = Mounted::tmpfs(&ckpts, "size=64k");
        let e = c.pause_sandbox(&s.id).await.unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(503), "{e}");
        assert_eq!(std::fs::read_dir(&ckpts).unwrap().count(), 0, "a partial checkpoint is left");
        drop(full);
        assert_eq!(c.get_sandbox(&s.id).await.unwrap().state, SandboxState::Running);
        assert_eq!(probe(&c, &s.id).await.0, 2);
        let p = c.pause_sandbox(&s.id).await.unwrap();
        assert_eq!(p.state, SandboxState::Paused);
        c.resume_sandbox(&s.id).await.unwrap();
        assert_eq!(probe(&c, &s.id).await.0, 3);
        c.delete_sandbox(&s.id).await.unwrap();
    });
}

#[test]
fn a_cat_of_the_sandboxs_own_that_prints_or_waits_for_ever_neither_grows_nor_holds_a_pause() {
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        let spec = json!({"isolation": "gvisor", "env": {"PATH": "/tmp/bin:/usr/bin:/bin"}});
        let s = c.create_sandbox(&spec_body(spec)).await.unwrap();
        // First on the PATH: a `cat` that prints without end, then one that
        // never ends. The check gives up on either and the pause goes on.
        for body in ["exec yes", "exec sleep 100000"] {
            sh(
                &c,
                &s.id,
                &format!("mkdir -p /tmp/bin && printf '#!/bin/sh\\n{body}\\n' > /tmp/bin/cat && chmod +x /tmp/bin/cat"),
            )
            .await;
            let p = c.pause_sandbox(&s.id).await.unwrap();
            assert_eq!(p.state, SandboxState::Paused);
            c.resume_sandbox(&s.id).await.unwrap();
            assert_eq!(sh(&c, &s.id, "echo up").await, "up\n");
        }
        c.delete_sandbox(&s.id).await.unwrap();
    });
}

/// A tmpfs mounted for a test, unmounted when dropped.
struct Mounted(PathBuf);

impl Mounted {
    fn tmpfs(at: &Path, options: &str) -> Mounted {
        let st = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                options,
                "sandlot-test",
                &at.display().to_string(),
            ])
            .status()
            .unwrap();
        assert!(st.success());
        Mounted(at.to_path_buf())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_damaged_memory_image_is_refused_at_resume_and_the_sandbox_stays_paused() {
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        let s = c.create_sandbox(&gvisor()).await.unwrap();
        start_server(&c, &s.id).await;
        c.pause_sandbox(&s.id).await.unwrap();
        let ckpt = checkpoint_dir(&d, &s.id);
        let image = std::fs::read_dir(&ckpt)
            .unwrap()
            .flatten()
            .find(|e| e.file_type().unwrap().is_file() && e.metadata().unwrap().len() > 4096)
            .expect("a memory image")
            .path();
        let len = std::fs::metadata(&image).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&image)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
        let e = c.resume_sandbox(&s.id).await.unwrap_err();
        assert_eq!(
            (e.status().map(|s| s.as_u16()), e.code()),
            (Some(409), Some("checkpoint_damaged")),
            "{e}"
        );
        assert!(!e.to_string().contains(&ckpt.display().to_string()), "{e}");
        // Nothing of it started, and it stays paused.
        assert!(runsc_processes(&s.id).is_empty());
        assert!(leftovers_of(&s.id).is_empty());
        assert_eq!(
            c.get_sandbox(&s.id).await.unwrap().state,
            SandboxState::Paused
        );
        // A bit flipped in place is found as well.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&image)
            .unwrap()
            .set_len(len)
            .unwrap();
        let e = c.resume_sandbox(&s.id).await.unwrap_err();
        assert_eq!(e.code(), Some("checkpoint_damaged"), "{e}");
        c.delete_sandbox(&s.id).await.unwrap();
    });
}

#[test]
fn deleting_a_paused_sandbox_removes_its_checkpoint_layer_and_cgroups() {
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        for create in [gvisor(), namespace()] {
            let s = c.create_sandbox(&create).await.unwrap();
            sh(&c, &s.id, "echo x > /tmp/file").await;
            c.pause_sandbox(&s.id).await.unwrap();
            let gone = c.delete_sandbox(&s.id).await.unwrap();
            assert_eq!(
                (gone.state, gone.end_reason.as_deref()),
                (SandboxState::Stopped, Some("deleted"))
            );
            assert!(!checkpoint_dir(&d, &s.id).exists());
            assert!(!d.data_dir().join("rw").join(&s.id).exists());
            assert!(leftovers_of(&s.id).is_empty(), "{:?}", leftovers_of(&s.id));
            assert!(mounts_under(&d.data_dir())
                .iter()
                .all(|m| !m.contains(&s.id)));
        }
    });
}

#[test]
fn a_store_image_sandbox_keeps_its_writable_layer_across_a_pause_on_both_backends() {
    let d = Daemon::start(None);
    let tmp = d.dir.join("work");
    std::fs::create_dir_all(&tmp).unwrap();
    let archive = img_support::base_archive(&tmp, "test/base:1", 1);
    let (code, out, err) = d.cli(&["image", "import", archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let c = d.client();
    rt().block_on(async {
        for (isolation, kind) in [
            ("gvisor", sandlot_client::api::PauseKind::Memory),
            ("namespace", sandlot_client::api::PauseKind::Filesystem),
        ] {
            let body = spec_body(json!({"image": "test/base:1", "isolation": isolation}));
            let s = c.create_sandbox(&body).await.unwrap();
            sh(&c, &s.id, "echo kept > /opt/new; rm /opt/layers/0").await;
            let p = c.pause_sandbox(&s.id).await.unwrap();
            assert_eq!(p.pause, Some(kind), "{isolation}");
            // A memory pause keeps the writable layer where it was; a files-only
            // pause has committed it to an image and dropped it.
            let rw = d.data_dir().join("rw").join(&s.id);
            assert_eq!(rw.exists(), isolation == "gvisor", "{isolation}");
            c.resume_sandbox(&s.id).await.unwrap();
            assert_eq!(
                sh(
                    &c,
                    &s.id,
                    "cat /opt/new; test -e /opt/layers/0 || echo gone"
                )
                .await,
                "kept\ngone\n",
                "{isolation}"
            );
            c.delete_sandbox(&s.id).await.unwrap();
        }
    });
}

#[test]
fn a_pause_past_the_tenants_paused_limit_is_a_429_naming_it_and_the_sandbox_runs_on() {
    let d = Daemon::start(Some("[limits]\nmax_paused_per_tenant = 1\n"));
    let c = d.client();
    rt().block_on(async {
        let a = c.create_sandbox(&namespace()).await.unwrap();
        let b = c.create_sandbox(&namespace()).await.unwrap();
        c.pause_sandbox(&a.id).await.unwrap();
        let e = c.pause_sandbox(&b.id).await.unwrap_err();
        assert_eq!(
            (e.status().map(|s| s.as_u16()), e.code()),
            (Some(429), Some("quota_exceeded")),
            "{e}"
        );
        assert!(e.to_string().contains("max_paused_per_tenant"), "{e}");
        assert_eq!(
            c.get_sandbox(&b.id).await.unwrap().state,
            SandboxState::Running
        );
        // Once the first is resumed the second pauses.
        c.resume_sandbox(&a.id).await.unwrap();
        c.pause_sandbox(&b.id).await.unwrap();
        c.delete_sandbox(&a.id).await.unwrap();
        c.delete_sandbox(&b.id).await.unwrap();
    });
}

#[test]
fn pauses_at_once_never_pass_the_tenants_paused_limit() {
    let d = Daemon::start(Some("[limits]\nmax_paused_per_tenant = 4\n"));
    let c = d.client();
    rt().block_on(async {
        let mut ids = Vec::new();
        for _ in 0..8 {
            ids.push(c.create_sandbox(&namespace()).await.unwrap().id);
        }
        let pauses: Vec<_> = ids
            .iter()
            .map(|id| {
                let (c, id) = (c.clone(), id.clone());
                tokio::spawn(async move { c.pause_sandbox(&id).await })
            })
            .collect();
        let mut refused = 0;
        for p in pauses {
            if let Err(e) = p.await.unwrap() {
                assert_eq!(
                    (e.status().map(|s| s.as_u16()), e.code()),
                    (Some(429), Some("quota_exceeded")),
                    "{e}"
                );
                assert!(e.to_string().contains("max_paused_per_tenant"), "{e}");
                refused += 1;
            }
        }
        assert_eq!(refused, 4);
        let mut paused = 0;
        for id in &ids {
            let s = c.get_sandbox(id).await.unwrap();
            match s.state {
                SandboxState::Paused => paused += 1,
                SandboxState::Running => {}
                other => panic!("{id} is {other:?}"),
            }
        }
        assert_eq!(paused, 4);
        for id in &ids {
            c.delete_sandbox(id).await.unwrap();
        }
    });
}

#[test]
fn a_gvisor_sandbox_with_a_spec_tmpfs_is_refused_a_pause_and_keeps_its_files() {
    let d = Daemon::start(None);
    let c = d.client();
    rt().block_on(async {
        let spec =
            json!({"isolation": "gvisor", "mounts": [{"type": "tmpfs", "target": "/scratch"}]});
        let s = c.create_sandbox(&spec_body(spec)).await.unwrap();
        sh(&c, &s.id, "echo kept > /scratch/f").await;
        let e = c.pause_sandbox(&s.id).await.unwrap_err();
        assert_eq!(e.code(), Some("pause_refused"), "{e}");
        assert!(e.to_string().contains("/scratch"), "{e}");
        assert_eq!(sh(&c, &s.id, "cat /scratch/f").await, "kept\n");
        c.delete_sandbox(&s.id).await.unwrap();
    });
}
