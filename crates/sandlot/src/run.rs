//! `sandlot run`: one command in a fresh sandbox, without a daemon.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use sandlot_proto::spec::{MountSpec, SandboxSpec};
use sandlot_proto::units::{ByteSize, Seconds};
use sandlot_runtime::init::AgentStart;
use sandlot_runtime::{Backend, CreateOptions, NamespaceBackend, RuntimeConfig, SandboxInstance};

use crate::EXIT_SANDLOT_ERROR;

#[derive(Debug, clap::Args)]
#[command(trailing_var_arg = true)]
pub struct RunArgs {
    /// Use this directory as the root filesystem (read-only lower layer).
    #[arg(long, value_name = "DIR", conflicts_with = "image")]
    pub rootfs: Option<PathBuf>,
    /// Image to run (built in: host; others from the image store under --data-dir).
    #[arg(long)]
    pub image: Option<String>,
    /// The daemon's data directory, whose image store `--image` is resolved in.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/sandlot")]
    pub data_dir: PathBuf,
    /// Memory limit, e.g. 512M.
    #[arg(long, value_parser = parse_size)]
    pub memory: Option<ByteSize>,
    /// CPU quota in cores, e.g. 0.5.
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Maximum number of processes and threads.
    #[arg(long)]
    pub pids: Option<u32>,
    /// Size limit of the writable layer, e.g. 1G.
    #[arg(long, value_parser = parse_size)]
    pub disk: Option<ByteSize>,
    /// Lifetime: everything is killed after this long, e.g. 30s.
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Seconds>,
    /// Bind a host path: SRC:DST[:ro|rw] (default ro). Repeatable.
    #[arg(long = "mount", value_name = "SRC:DST[:ro|rw]")]
    pub mounts: Vec<String>,
    /// A fresh tmpfs: DST[:SIZE]. Repeatable.
    #[arg(long = "tmpfs", value_name = "DST[:SIZE]")]
    pub tmpfs: Vec<String>,
    /// Environment variable K=V. Repeatable.
    #[arg(short, long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Working directory of the command.
    #[arg(short, long)]
    pub workdir: Option<String>,
    /// User: root, user, or UID[:GID].
    #[arg(short, long)]
    pub user: Option<String>,
    #[arg(long)]
    pub hostname: Option<String>,
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

fn parse_size(s: &str) -> Result<ByteSize, String> {
    s.parse()
        .map_err(|e: sandlot_proto::units::UnitError| e.to_string())
}

fn parse_duration(s: &str) -> Result<Seconds, String> {
    s.parse()
        .map_err(|e: sandlot_proto::units::UnitError| e.to_string())
}

/// Builds the spec from `--spec` and the flags.
pub fn build_spec(a: &RunArgs) -> anyhow::Result<SandboxSpec> {
    let mut spec = match &a.spec {
        Some(p) => {
            let s =
                std::fs::read_to_string(p).with_context(|| format!("read spec {}", p.display()))?;
            serde_json::from_str(&s).map_err(|e| anyhow::anyhow!("spec {}: {e}", p.display()))?
        }
        None => SandboxSpec::default(),
    };
    if let Some(r) = &a.rootfs {
        let abs = if r.is_absolute() {
            r.clone()
        } else {
            std::env::current_dir()?.join(r)
        };
        spec.rootfs = Some(abs.to_string_lossy().into_owned());
    }
    if let Some(i) = &a.image {
        spec.image = i.clone();
    }
    if let Some(m) = a.memory {
        spec.resources.memory = m;
    }
    if let Some(c) = a.cpus {
        spec.resources.cpus = Some(c);
    }
    if let Some(p) = a.pids {
        spec.resources.pids = p;
    }
    if let Some(d) = a.disk {
        spec.resources.disk = d;
    }
    if let Some(t) = a.timeout {
        spec.timeout = Some(t);
    }
    for m in &a.mounts {
        let mut m = MountSpec::parse_bind(m)?;
        if let MountSpec::Bind { source, .. } = &mut m {
            let p = PathBuf::from(&*source);
            if p.is_relative() {
                *source = std::env::current_dir()?
                    .join(p)
                    .to_string_lossy()
                    .into_owned();
            }
        }
        spec.mounts.push(m);
    }
    for t in &a.tmpfs {
        let (target, size) = match t.split_once(':') {
            Some((d, s)) => (
                d,
                parse_size(s).map_err(|e| anyhow::anyhow!("--tmpfs {t}: {e}"))?,
            ),
            None => (t.as_str(), ByteSize::mib(64)),
        };
        spec.mounts.push(MountSpec::Tmpfs {
            target: target.to_string(),
            size,
        });
    }
    for kv in &a.env {
        let Some((k, v)) = kv.split_once('=') else {
            bail!("--env {kv:?}: expected K=V");
        };
        spec.env.insert(k.to_string(), v.to_string());
    }
    if let Some(w) = &a.workdir {
        spec.workdir = Some(w.clone());
    }
    if let Some(u) = &a.user {
        spec.user = u.clone();
    }
    if let Some(h) = &a.hostname {
        spec.hostname = Some(h.clone());
    }
    spec.validate()?;
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

fn backend() -> anyhow::Result<NamespaceBackend> {
    let exe = std::env::current_exe().context("find the sandlot binary")?;
    let be = NamespaceBackend::new(RuntimeConfig::new(exe))?;
    // Leftovers of runs whose CLI was killed.
    be.sweep();
    Ok(be)
}

/// The entry point of the agent inside a sandbox (see `sandlot_runtime::init`).
pub fn agent_main(start: AgentStart) -> std::io::Result<()> {
    let cfg = sandlot_guest::AgentConfig {
        env: start.setup.env,
        default_user: start.setup.default_user,
        default_cwd: start.setup.default_cwd,
        lifeline: start.lifeline,
        ..Default::default()
    };
    sandlot_guest::run_agent(start.listener, cfg)
}

/// Removes the sandbox however the run ends.
struct Guard<'a> {
    be: &'a NamespaceBackend,
    sb: Option<SandboxInstance>,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if let Some(sb) = self.sb.take() {
            if let Err(e) = self.be.terminate(&sb) {
                eprintln!("sandlot: tear down sandbox {}: {e}", sb.id);
            }
        }
    }
}

pub fn run(a: RunArgs) -> anyhow::Result<i32> {
    let spec = build_spec(&a)?;
    let id = a.id.clone().unwrap_or_else(random_id);
    let be = backend()?;
    let (life_r, life_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .context("create lifeline pipe")?;
    let sb = be
        .create(
            &id,
            &spec,
            CreateOptions {
                lifeline: Some(life_r),
                image: local_image(&a.data_dir, &spec)?,
                ..Default::default()
            },
        )
        .with_context(|| format!("create sandbox {id}"))?;
    let guard = Guard {
        be: &be,
        sb: Some(sb),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let socket = guard
        .sb
        .as_ref()
        .map(|s| s.socket.clone())
        .expect("sandbox");
    let lifetime = spec.timeout.map(|t| t.duration());
    let code = rt.block_on(crate::run_session::session(&socket, &a, lifetime));
    // A blocking read of our stdin may still be pending: do not wait for it.
    rt.shutdown_background();
    drop(guard);
    drop(life_w);
    code
}

/// Benchmark helper: create, exec `/bin/true`, wait, terminate; `n` times in-process.
pub fn bench_in_process(n: usize) -> anyhow::Result<Vec<Duration>> {
    let be = backend()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let spec = SandboxSpec::default();
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let id = random_id();
        let t = Instant::now();
        let sb = be.create(&id, &spec, CreateOptions::default())?;
        let guard = Guard {
            be: &be,
            sb: Some(sb),
        };
        let socket = guard
            .sb
            .as_ref()
            .map(|s| s.socket.clone())
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
    let store = sandlot_store::ImageStore::open(&data_dir.join("images"))
        .with_context(|| format!("open the image store in {}", data_dir.display()))?;
    let img = store.resolve(&spec.image)?;
    Ok(Some(sandlot_runtime::mounts::ImageRoot {
        layers: store.layer_dirs(&img),
        rw: None,
        env: img.config.env.clone(),
        workdir: img.config.workdir.clone(),
        user: img.config.user.clone(),
    }))
}
