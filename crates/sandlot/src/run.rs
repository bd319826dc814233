//! `sandlot run`: one command in a fresh sandbox, without a daemon.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use sandlot_proto::spec::Isolation;
use sandlot_proto::spec::SandboxSpec;
use sandlot_runtime::gvisor::{GvisorBackend, GvisorConfig};
use sandlot_runtime::init::AgentStart;
use sandlot_runtime::{CreateOptions, Instance, NamespaceBackend, RuntimeConfig};

use crate::spec_flags::{read_object, SpecFlags};
use crate::EXIT_SANDLOT_ERROR;

#[derive(Debug, clap::Args)]
#[command(trailing_var_arg = true)]
pub struct RunArgs {
    #[command(flatten)]
    pub spec_flags: SpecFlags,
    /// The daemon's data directory, whose image store `--image` is resolved in.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/sandlot")]
    pub data_dir: PathBuf,
    /// Allocate a pseudo-terminal (interactive programs).
    #[arg(short = 't', long)]
    pub tty: bool,
    /// A JSON sandbox spec; flags override its fields.
    #[arg(long, value_name = "FILE")]
    pub spec: Option<PathBuf>,
    /// Sandbox id (default: random).
    #[arg(long)]
    pub id: Option<String>,
    /// The command and its arguments.
    #[arg(required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Builds the spec from `--spec` and the flags.
pub fn build_spec(a: &RunArgs) -> anyhow::Result<SandboxSpec> {
    let mut obj = match &a.spec {
        Some(p) => read_object(p)?,
        None => serde_json::Map::new(),
    };
    a.spec_flags.apply(&mut obj)?;
    let spec: SandboxSpec =
        serde_json::from_value(serde_json::Value::Object(obj)).map_err(|e| {
            anyhow::anyhow!(
                "spec{}: {e}",
                a.spec
                    .as_ref()
                    .map(|p| format!(" {}", p.display()))
                    .unwrap_or_default()
            )
        })?;
    spec.validate()?;
    if let Some(i) = spec
        .mounts
        .iter()
        .position(|m| matches!(m, sandlot_proto::spec::MountSpec::Collection { .. }))
    {
        anyhow::bail!(
            "mounts[{i}]: collection mounts are served by the daemon: use `sandlot create` \
             (or the API) instead of `sandlot run`"
        );
    }
    Ok(spec)
}

/// A random sandbox id: 16 hex digits.
pub fn random_id() -> String {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_err()
    {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        b = (t.as_nanos() as u64 ^ u64::from(std::process::id())).to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The id of a sandbox made without a daemon: `requested` (`--id`), or a random one.
/// It must not start with a daemon's id prefix (`daemon_prefixes`, see
/// [`sandlot_server::daemon_id_prefixes`]): that daemon's next start would take the
/// sandbox for a leftover of its own and kill it mid-run.
fn run_id(
    requested: Option<&str>,
    daemon_prefixes: &[String],
    mut random: impl FnMut() -> String,
) -> anyhow::Result<String> {
    let claimed_by = |id: &str| daemon_prefixes.iter().find(|p| id.starts_with(p.as_str()));
    if let Some(id) = requested {
        if let Some(p) = claimed_by(id) {
            bail!(
                "--id {id:?}: ids starting with {p:?} belong to a sandlot daemon on this host \
                 (its id prefix): at its next start it would take this sandbox for a leftover \
                 of its own and kill it; choose an id that does not start with {p:?}"
            );
        }
        return Ok(id.to_string());
    }
    // A prefix of hex digits claims a share of the random ids: draw again.
    for _ in 0..64 {
        let id = random();
        if claimed_by(&id).is_none() {
            return Ok(id);
        }
    }
    bail!(
        "no random sandbox id is free of the daemons' id prefixes {daemon_prefixes:?}: \
         give one with --id"
    )
}

/// The backend of `sandlot run`: its one sandbox's `__init` helper is forked from
/// this process, which is single-threaded until the sandbox runs, instead of an
/// exec of the binary (see `RuntimeConfig::fork_helper_here`).
fn backend() -> anyhow::Result<NamespaceBackend> {
    backend_with(false, Some(agent_main))
}

fn backend_with(
    fork_server: bool,
    fork_helper_here: Option<sandlot_runtime::init::AgentMain>,
) -> anyhow::Result<NamespaceBackend> {
    let exe = std::env::current_exe().context("find the sandlot binary")?;
    let mut cfg = RuntimeConfig::new(exe);
    cfg.fork_helper_here = fork_helper_here;
    // The daemon's settings (`runtime.fork_server`, `runtime.cgroup_stock`,
    // `runtime.netns_stock`) for the benchmark's daemon-like contender.
    cfg.fork_server = fork_server;
    // As the daemon's default `runtime.run_dir_tmpfs`: both share the directory.
    cfg.run_dir_tmpfs = true;
    if fork_server {
        cfg.cgroup_stock = 4;
        cfg.netns_stock = 4;
    }
    let be = NamespaceBackend::new(cfg)?;
    // Leftovers of runs whose CLI was killed.
    be.sweep();
    Ok(be)
}

/// The gVisor backend with the daemon's default settings (`runsc` on `PATH`, the
/// best platform the installed release has); it sweeps what killed runs left.
fn gvisor_backend() -> anyhow::Result<GvisorBackend> {
    let exe = std::env::current_exe().context("find the sandlot binary")?;
    let be = GvisorBackend::new(GvisorConfig {
        runsc: PathBuf::from("runsc"),
        platform: "auto".into(),
        run_dir: PathBuf::from("/run/sandlot"),
        cgroup_parent: "sandlot".into(),
        cgroup_cpu_weight: None,
        sandlot_exe: exe,
        default_cpus: None,
        id_base: sandlot_runtime::plan::DEFAULT_ID_BASE,
        id_slots: sandlot_runtime::plan::DEFAULT_ID_SLOTS,
    })
    .map_err(|e| match e {
        Ok(why) => anyhow::anyhow!("--isolation gvisor: {why}"),
        Err(e) => anyhow::anyhow!("--isolation gvisor: {e}"),
    })?;
    be.sweep();
    Ok(be)
}

/// The entry point of the agent inside a sandbox (see `sandlot_runtime::init`).
pub fn agent_main(start: AgentStart) -> std::io::Result<()> {
    let cfg = sandlot_agent::AgentConfig {
        env: start.setup.env,
        default_user: start.setup.default_user,
        default_cwd: start.setup.default_cwd,
        lifeline: start.lifeline,
        oom_score_adj: start.oom_score_adj,
        first_exec: start.first_exec,
        ..Default::default()
    };
    sandlot_agent::run_agent(start.listener, cfg)
}

/// Removes the sandbox however the run ends.
struct Guard {
    sb: Option<Box<dyn Instance>>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(sb) = self.sb.take() {
            if let Err(e) = sb.terminate() {
                eprintln!("sandlot: tear down sandbox {}: {e}", sb.id());
            }
        }
    }
}

/// `SANDLOT_TRACE_INIT=1`: the CLI's own phases on stderr, beside the runtime's
/// (`sandlot-init host`, `helper`, `pid1`, `stop`).
pub(crate) struct RunTrace(Option<Instant>);

impl RunTrace {
    fn new() -> RunTrace {
        RunTrace(
            std::env::var_os("SANDLOT_TRACE_INIT")
                .is_some_and(|v| v == "1")
                .then(Instant::now),
        )
    }

    pub(crate) fn mark(&self, what: &str) {
        if let Some(t) = self.0 {
            eprintln!(
                "sandlot-run  cli    +{:>7.3} ms {what} @{:.3}",
                t.elapsed().as_secs_f64() * 1e3,
                sandlot_runtime::plan::monotonic_ms()
            );
        }
    }
}

pub fn run(a: RunArgs) -> anyhow::Result<i32> {
    let tr = RunTrace::new();
    let spec = build_spec(&a)?;
    let id = run_id(
        a.id.as_deref(),
        &sandlot_server::daemon_id_prefixes(),
        random_id,
    )?;
    let (life_r, life_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .context("create lifeline pipe")?;
    let request = crate::run_session::command_request(&a);
    let handed = spec.isolation == Isolation::Namespace;
    let opts = CreateOptions {
        lifeline: Some(life_r),
        image: local_image(&a.data_dir, &spec)?,
        // The agent starts the command as it starts, while this process is still
        // hearing that the sandbox is ready and connecting to it.
        first_exec: handed.then(|| request.clone()),
        ..Default::default()
    };
    tr.mark("spec and id");
    let sb: Box<dyn Instance> = match spec.isolation {
        Isolation::Namespace => Box::new({
            let be = backend()?;
            tr.mark("backend ready");
            be.create_instance(&id, &spec, opts)
                .with_context(|| format!("create sandbox {id}"))?
        }),
        Isolation::Gvisor => Box::new(
            gvisor_backend()?
                .create_instance(&id, &spec, opts)
                .with_context(|| format!("create sandbox {id}"))?,
        ),
    };
    tr.mark("sandbox created");
    let guard = Guard { sb: Some(sb) };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let socket = guard
        .sb
        .as_ref()
        .map(|s| s.agent_socket().to_path_buf())
        .expect("sandbox");
    let lifetime = spec.timeout.map(|t| t.duration());
    tr.mark("client runtime started");
    let start = if handed {
        crate::run_session::Start::Attach(sandlot_proto::guest::FIRST_PROCESS)
    } else {
        crate::run_session::Start::Exec(request)
    };
    let code = rt.block_on(crate::run_session::session(
        &socket, &a, start, lifetime, &tr,
    ));
    // A blocking read of our stdin may still be pending: do not wait for it.
    tr.mark("command done");
    rt.shutdown_background();
    drop(guard);
    drop(life_w);
    tr.mark("sandbox removed");
    code
}

/// Benchmark helper: create, exec `/bin/true`, wait, terminate; `n` times in-process.
pub fn bench_in_process(n: usize, fork_server: bool) -> anyhow::Result<Vec<Duration>> {
    let be = backend_with(fork_server, None)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let spec = SandboxSpec::default();
    let daemon_prefixes = sandlot_server::daemon_id_prefixes();
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let id = run_id(None, &daemon_prefixes, random_id)?;
        let t = Instant::now();
        let sb = be.create_instance(&id, &spec, CreateOptions::default())?;
        let guard = Guard {
            sb: Some(Box::new(sb)),
        };
        let socket = guard
            .sb
            .as_ref()
            .map(|s| s.agent_socket().to_path_buf())
            .expect("sandbox");
        let code = rt.block_on(crate::run_session::exec_true(&socket))?;
        drop(guard);
        v.push(t.elapsed());
        if code != 0 {
            bail!("/bin/true exited with {code}");
        }
    }
    Ok(v)
}

/// Maps an exit to the CLI's exit code: the code, or 128 + signal.
pub fn exit_code(code: Option<i32>, signal: Option<i32>) -> i32 {
    match (code, signal) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => EXIT_SANDLOT_ERROR,
    }
}

/// Resolves a store image for `sandlot run` (its writable layer is a tmpfs inside
/// the sandbox; snapshots are the daemon's).
fn local_image(
    data_dir: &std::path::Path,
    spec: &SandboxSpec,
) -> anyhow::Result<Option<sandlot_runtime::mounts::ImageRoot>> {
    if spec.image == sandlot_proto::spec::HOST_IMAGE {
        return Ok(None);
    }
    // Opened like the daemon opens it: a store of an earlier version migrates the
    // same way whichever opens it first. Names are the operator's (shared) tags.
    let store = sandlot_store::ImageStore::open_with(
        &data_dir.join("images"),
        Some(sandlot_store::LegacyOwners {
            dir: &data_dir.join("image-owners"),
            operator_tenant: sandlot_server::auth::DEFAULT_TENANT,
        }),
    )
    .with_context(|| format!("open the image store in {}", data_dir.display()))?;
    let img = store.resolve(&spec.image)?;
    Ok(Some(sandlot_runtime::mounts::ImageRoot {
        layers: store.layer_dirs(&img),
        rw: None,
        env: img.config.env.clone(),
        workdir: img.config.workdir.clone(),
        user: img.config.user.clone(),
        on_host: img.config.host_base,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefixes(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn run_refuses_an_id_with_a_daemon_prefix() {
        let daemons = prefixes(&["sb-", "ab"]);
        let e = run_id(Some("sb-mine"), &daemons, random_id)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--id \"sb-mine\""), "{e}");
        assert!(e.contains("\"sb-\""), "{e}");
        assert!(e.contains("kill it"), "{e}");
        let e = run_id(Some("abc"), &daemons, random_id)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"ab\""), "{e}");
        // Other ids are taken as given, the prefix itself elsewhere in them too.
        assert_eq!(
            run_id(Some("job-sb-1"), &daemons, random_id).unwrap(),
            "job-sb-1"
        );
        assert_eq!(run_id(Some("a"), &daemons, random_id).unwrap(), "a");
    }

    #[test]
    fn random_run_ids_avoid_daemon_prefixes() {
        let daemons = prefixes(&["sb-", "ab"]);
        let mut draws = vec!["abff".to_string(), "ab00".to_string(), "c0ffee".to_string()];
        let id = run_id(None, &daemons, || draws.remove(0)).unwrap();
        assert_eq!(id, "c0ffee");
        assert!(draws.is_empty());
        // Prefixes that claim every id: a clear error instead of looping.
        let every: Vec<String> = (0..16).map(|d| format!("{d:x}")).collect();
        let e = run_id(None, &every, random_id).unwrap_err().to_string();
        assert!(e.contains("--id"), "{e}");
        // The real generator: 16 hex digits, never the default prefix.
        let id = run_id(None, &prefixes(&["sb-"]), random_id).unwrap();
        assert_eq!(id.len(), 16);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    }
}
