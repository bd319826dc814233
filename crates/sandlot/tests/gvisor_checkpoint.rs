//! gVisor's checkpoint and restore through the runtime: a sandbox saved while a
//! process runs comes back with that process where it was (its memory, its
//! output kept by the agent, its process id), one checkpoint restores into
//! two sandboxes that go on apart, and a sandbox paused and resumed twenty times
//! over comes back every time. Needs root and Debian's `runsc`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sandlot_guest::client::GuestClient;
use sandlot_proto::guest::{AttachRequest, ExecRequest};
use sandlot_runtime::gvisor::{GvisorBackend, GvisorConfig};
use sandlot_runtime::{Backend, CreateOptions, Instance};

/// A backend of its own (run directory and cgroup parent), so that nothing of the
/// suite's daemons is touched.
fn backend(tag: &str) -> (GvisorBackend, PathBuf) {
    let run_dir = PathBuf::from(format!("/run/sandlot-test-{tag}-{}", std::process::id()));
    let be = GvisorBackend::new(GvisorConfig {
        runsc: PathBuf::from("runsc"),
        platform: "auto".into(),
        run_dir: run_dir.clone(),
        cgroup_parent: format!("sandlot-test-{tag}-{}", std::process::id()),
        cgroup_cpu_weight: None,
        sandlot_exe: PathBuf::from(env!("CARGO_BIN_EXE_sandlot")),
        default_cpus: None,
        // Ranges of their own, away from the suite's daemons' (each run directory
        // keeps its own slots).
        id_base: 3 << 28,
        id_slots: 8,
    })
    .unwrap_or_else(|e| panic!("gVisor is needed here (scripts/setup.sh installs runsc): {e:?}"));
    (be, run_dir)
}

/// Counts to 40 on its standard output, one number every 50 ms: about 2 s.
const COUNTER: &str = "i=0; while [ $i -lt 40 ]; do i=$((i+1)); echo $i; sleep 0.05; done";

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Starts the counter in `inst`, lets it run a while, and quiesces the agent.
async fn start_counter(inst: &dyn Instance) -> sandlot_proto::guest::ProcessId {
    let c = GuestClient::connect(inst.agent_socket()).await.unwrap();
    let p = c
        .exec(ExecRequest::new(["/bin/sh", "-c", COUNTER]))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    quiesce(&c).await;
    p.id()
}

/// Quiesces the agent and waits, as the daemon's pause does, until it has
/// closed its connections (this one too): a checkpoint taken while gVisor still
/// tears one down fails to encode it.
async fn quiesce(c: &GuestClient) {
    c.quiesce().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while c.ping().await.is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent kept its connections after the quiesce"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
}

/// The counter's whole output and exit code, read through `inst`'s agent.
async fn counter_output(
    inst: &dyn Instance,
    id: sandlot_proto::guest::ProcessId,
) -> (String, Option<i32>) {
    let c = GuestClient::connect(inst.agent_socket()).await.unwrap();
    let p = c
        .attach_with(AttachRequest {
            id,
            stdout_from: Some(0),
            stderr_from: Some(0),
        })
        .await
        .unwrap();
    let o = p.output().await.unwrap();
    (String::from_utf8(o.stdout).unwrap(), o.status.code)
}

fn counted() -> String {
    (1..=40).map(|i| format!("{i}\n")).collect()
}

fn cleanup(run_dir: &Path) {
    let _ = std::fs::remove_dir_all(run_dir.join("image"));
    let _ = std::fs::remove_dir(run_dir.join("gvisor"));
    // The id slots' lock files, free once every sandbox of the backend ended.
    let _ = std::fs::remove_dir_all(run_dir.join("slots"));
    let _ = std::fs::remove_dir(run_dir);
}

/// Terminates its sandbox when dropped, a failing test's too.
struct Held(Box<dyn Instance>);

impl std::ops::Deref for Held {
    type Target = dyn Instance;
    fn deref(&self) -> &(dyn Instance + 'static) {
        &*self.0
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.0.terminate();
    }
}

/// Removes the backend's run directory when dropped (after the sandboxes: declare
/// it first).
struct RunDir(PathBuf);

impl Drop for RunDir {
    fn drop(&mut self) {
        cleanup(&self.0);
    }
}

#[test]
fn a_restored_gvisor_sandbox_goes_on_with_its_processes_where_they_were() {
    let (be, run_dir) = backend("restore");
    let _dir = RunDir(run_dir.clone());
    let spec = sandlot_proto::spec::SandboxSpec::default();
    let id = "ckpt-restore";
    let inst = Held(be.create(id, &spec, CreateOptions::default()).unwrap());
    let rt = rt();
    let proc_id = rt.block_on(start_counter(&*inst));
    let image = run_dir.join("image");
    std::fs::create_dir_all(&image).unwrap();
    inst.checkpoint(&image).unwrap();
    // Saved, the sandbox ends; nothing of it runs while it is away.
    assert!(inst.wait_exit(Duration::from_secs(10)).is_some());
    inst.terminate().unwrap();
    let back = Held(
        be.restore(id, &spec, CreateOptions::default(), &image)
            .unwrap(),
    );
    // The same process, its count neither restarted nor lost.
    let (out, code) = rt.block_on(counter_output(&*back, proc_id));
    assert_eq!((out, code), (counted(), Some(0)));
    back.terminate().unwrap();
}

#[test]
fn one_checkpoint_restores_into_two_sandboxes_that_go_on_apart() {
    let (be, run_dir) = backend("fork");
    let _dir = RunDir(run_dir.clone());
    let spec = sandlot_proto::spec::SandboxSpec::default();
    let inst = Held(
        be.create("ckpt-origin", &spec, CreateOptions::default())
            .unwrap(),
    );
    let rt = rt();
    let proc_id = rt.block_on(start_counter(&*inst));
    let image = run_dir.join("image");
    std::fs::create_dir_all(&image).unwrap();
    inst.checkpoint(&image).unwrap();
    inst.terminate().unwrap();
    let a = Held(
        be.restore("ckpt-fork-a", &spec, CreateOptions::default(), &image)
            .unwrap(),
    );
    let b = Held(
        be.restore("ckpt-fork-b", &spec, CreateOptions::default(), &image)
            .unwrap(),
    );
    // Each finishes the count on its own.
    for fork in [&a, &b] {
        let (out, code) = rt.block_on(counter_output(&**fork, proc_id));
        assert_eq!((out, code), (counted(), Some(0)));
    }
    // And they are apart: a file one writes is not the other's.
    rt.block_on(async {
        let ca = GuestClient::connect(a.agent_socket()).await.unwrap();
        let cb = GuestClient::connect(b.agent_socket()).await.unwrap();
        let w = ca
            .exec(ExecRequest::new(["/bin/sh", "-c", "echo a > /tmp/who"]))
            .await
            .unwrap();
        w.output().await.unwrap();
        let r = cb
            .exec(ExecRequest::new([
                "/bin/sh",
                "-c",
                "cat /tmp/who 2>/dev/null || echo none",
            ]))
            .await
            .unwrap();
        assert_eq!(r.output().await.unwrap().stdout, b"none\n");
    });
    a.terminate().unwrap();
    b.terminate().unwrap();
}

/// Counts in its own memory (a shell variable), writing each count to
/// `/tmp/count`; a restart would count from 1 again.
const MEMORY_COUNTER: &str =
    "i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done";

/// The output of `script` run in `inst` (it must succeed).
async fn run_sh(inst: &dyn Instance, script: &str) -> String {
    let c = GuestClient::connect(inst.agent_socket()).await.unwrap();
    let o = c
        .exec(ExecRequest::new(["/bin/sh", "-c", script]))
        .await
        .unwrap()
        .output()
        .await
        .unwrap();
    assert_eq!(
        o.status.code,
        Some(0),
        "{script}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// The pids of `sleep 100000` and of the counting shell, from `ps`.
async fn sleeper_and_counter(inst: &dyn Instance) -> (String, String) {
    let ps = run_sh(inst, "ps -eo pid=,args=").await;
    let pid_of = |what: &str| {
        ps.lines()
            .find(|l| l.contains(what) && !l.contains("ps -eo"))
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or_else(|| panic!("no {what:?} in {ps}"))
            .to_string()
    };
    (pid_of("sleep 100000"), pid_of("while :"))
}

/// gVisor's kernel hands a restored epoll registrations deleted before the
/// checkpoint; the agent, which once took their data for addresses, must come
/// back every time however many times it was paused (and however many pipes its
/// processes opened and closed between).
#[test]
fn a_gvisor_sandbox_pauses_and_resumes_twenty_times_with_its_processes_and_memory() {
    let (be, run_dir) = backend("repeat");
    let _dir = RunDir(run_dir.clone());
    let spec = sandlot_proto::spec::SandboxSpec::default();
    let id = "ckpt-repeat";
    let rt = rt();
    let mut inst = Held(be.create(id, &spec, CreateOptions::default()).unwrap());
    rt.block_on(async {
        let c = GuestClient::connect(inst.agent_socket()).await.unwrap();
        c.exec(ExecRequest::new(["/bin/sh", "-c", "sleep 100000"]))
            .await
            .unwrap();
        c.exec(ExecRequest::new(["/bin/sh", "-c", MEMORY_COUNTER]))
            .await
            .unwrap();
    });
    let first = rt.block_on(async {
        wait_for_count(&*inst).await;
        sleeper_and_counter(&*inst).await
    });
    let mut last_count = 0u64;
    for cycle in 0..20 {
        let image = Image(&be, run_dir.join(format!("image-{cycle}")));
        let count = rt.block_on(async {
            // Processes whose pipes open and close between checkpoints.
            run_sh(&*inst, "for i in 1 2 3; do echo $i | cat >/dev/null; done").await;
            let count: u64 = run_sh(&*inst, "cat /tmp/count")
                .await
                .trim()
                .parse()
                .unwrap();
            quiesce(&GuestClient::connect(inst.agent_socket()).await.unwrap()).await;
            count
        });
        assert!(
            count > last_count,
            "cycle {cycle}: the count went from {last_count} to {count}"
        );
        last_count = count;
        std::fs::create_dir_all(&image.1).unwrap();
        inst.checkpoint(&image.1).unwrap();
        inst.keep_root(&image.1).unwrap();
        assert!(inst.wait_exit(Duration::from_secs(10)).is_some());
        inst.terminate().unwrap();
        let back = be
            .restore(id, &spec, CreateOptions::default(), &image.1)
            .unwrap_or_else(|e| panic!("cycle {cycle}: the restore failed: {e}"));
        // The old instance, ended, is dropped without another terminate (which
        // would remove the directory the restored one now uses).
        inst.0 = back;
        drop(image);
        // The same processes, still counting from where they were.
        let now = rt.block_on(sleeper_and_counter(&*inst));
        assert_eq!(now, first, "cycle {cycle}");
    }
    let after: u64 = rt
        .block_on(run_sh(&*inst, "sleep 0.2; cat /tmp/count"))
        .trim()
        .parse()
        .unwrap();
    assert!(
        after > last_count,
        "the count went from {last_count} to {after}"
    );
    inst.terminate().unwrap();
}

/// A checkpoint directory, removed (its kept root too) when dropped.
struct Image<'a>(&'a GvisorBackend, PathBuf);

impl Drop for Image<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.remove_checkpoint(&self.1) {
            eprintln!("remove {}: {e}", self.1.display());
        }
    }
}

/// Waits until the counter has written its first count.
async fn wait_for_count(inst: &dyn Instance) {
    for _ in 0..200 {
        if run_sh(inst, "cat /tmp/count 2>/dev/null || true")
            .await
            .trim()
            != ""
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the counter never wrote /tmp/count");
}
