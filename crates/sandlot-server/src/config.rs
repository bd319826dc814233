//! Operator configuration: a TOML file, tolerant (unknown keys are reported as
//! warnings, not errors), overridden by command-line flags.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sandlot_proto::spec::Isolation;
use sandlot_proto::units::{ByteSize, Seconds};
use serde::Deserialize;

/// Errors loading the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("read config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config: {0}")]
    Invalid(String),
}

/// Resource quotas of one tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Quota {
    /// Sandboxes alive at once (creating, running or stopping).
    pub max_sandboxes: u32,
    /// Sum of the memory limits of the live sandboxes.
    pub max_memory: ByteSize,
    /// Snapshots kept at once (`/v1/snapshots`; those being made count).
    pub max_snapshots: u32,
    /// Bytes of the host's disk the tenant's snapshots and checkpoints may
    /// hold together (a `filesystem` one: its image's layers; a checkpoint of
    /// one: 0, its image is counted by the image store).
    pub max_saved_disk: ByteSize,
}

impl Default for Quota {
    fn default() -> Self {
        Quota {
            max_sandboxes: 100,
            max_memory: ByteSize(64 << 30),
            max_snapshots: 20,
            max_saved_disk: ByteSize(20 << 30),
        }
    }
}

/// Timeouts and size limits the daemon enforces.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Limits {
    /// Lifetime of a sandbox that does not ask for one.
    pub default_timeout: Seconds,
    /// Longest lifetime a sandbox may have, counted from its creation (extensions
    /// included).
    pub max_timeout: Seconds,
    /// Idle timeout of a sandbox that does not ask for one (absent: none).
    pub default_idle_timeout: Option<Seconds>,
    /// Largest JSON request body.
    pub max_request_body: ByteSize,
    /// Largest file upload (0: unlimited).
    pub max_upload: ByteSize,
    /// How long the output of a process started without `background` waits for a
    /// reader (with back-pressure) before it is drained into the re-attach buffer.
    pub exec_grace: Seconds,
    /// How long the output of a finished process stays re-attachable.
    pub finished_retention: Seconds,
    /// How long the record of a stopped sandbox (its spec, usage and events) is
    /// kept after it ended; older ones are deleted hourly. 0: kept forever.
    pub stopped_retention: Seconds,
    /// Most sandboxes a tenant may hold paused (or being paused or resumed) at
    /// once: paused sandboxes hold host memory (their kept files) and disk
    /// (their memory images) outside the memory quota. 0: no limit.
    pub max_paused_per_tenant: u32,
    /// How long a sandbox may stay paused; older ones are deleted hourly (with
    /// what their pause saved). 0: kept until deleted.
    pub paused_retention: Seconds,
    /// Most checkpoints a sandbox holds (`POST .../checkpoints`); at least 1.
    pub max_checkpoints_per_sandbox: u32,
    /// Most sandboxes one `POST .../fork` makes; at least 1.
    pub max_fork_count: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            default_timeout: Seconds::secs(300),
            max_timeout: Seconds::secs(24 * 3600),
            default_idle_timeout: None,
            max_request_body: ByteSize(1 << 20),
            max_upload: ByteSize(0),
            exec_grace: Seconds::secs(30),
            finished_retention: Seconds::secs(60),
            stopped_retention: Seconds::secs(7 * 24 * 3600),
            max_paused_per_tenant: 8,
            paused_retention: Seconds::secs(7 * 24 * 3600),
            max_checkpoints_per_sandbox: 16,
            max_fork_count: 16,
        }
    }
}

/// Where the namespace runtime keeps its state. Defaults match `sandlot run`, so
/// both share the uid-range slots (sandboxes never share host ids).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct RuntimeSection {
    pub run_dir: PathBuf,
    pub cgroup_parent: String,
    /// Cold creates (and pool refills) running at once, and as many pool claims;
    /// more wait their turn, in arrival order. Started together, creates share the
    /// CPUs and all finish late; admitted a few at a time, the first ones are ready
    /// early. 0: twice the CPU count.
    pub max_concurrent_creates: usize,
    /// Remount the cgroup2 hierarchy with `favordynmods` at start (a host-wide
    /// kernel setting): attaching a sandbox to its cgroups then no longer waits
    /// for an RCU grace period under the global cgroup lock, which is what
    /// serializes concurrent creates. Costs slightly slower fork/exit host-wide.
    pub cgroup_favordynmods: bool,
    /// Fork each sandbox's init helper from one fork server (`sandlot __zygote`)
    /// instead of exec'ing the binary per create: PID 1s share the binary's relocated
    /// pages (less memory per sandbox) and creates skip an exec.
    pub fork_server: bool,
    /// Empty cgroups made ahead of time by a background thread (cgroup v1 only):
    /// a cold create renames one instead of a `mkdir` in each hierarchy. 0: off.
    pub cgroup_stock: usize,
    /// Loopback-only network namespaces made ahead of time by a background thread
    /// for sandboxes with network `none`: a cold create joins one instead of
    /// creating it (`CLONE_NEWNET`, the dearest namespace). 0: off.
    pub netns_stock: usize,
    /// Mount a small tmpfs of the daemon's own on `run_dir/sandboxes` when that is
    /// on a disk file system (a `/run` that is not a tmpfs) and no sandbox lives
    /// there: each create and delete then skips journalled disk metadata work. The
    /// mount stays across restarts, like `/run`.
    pub run_dir_tmpfs: bool,
    /// CPU quota, in cores, of a sandbox whose spec gives no `resources.cpus`
    /// (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`). Absent: half the host's CPUs,
    /// at least one, at most `max_cpus`; 0: no quota.
    pub default_cpus: Option<f64>,
    /// Largest CPU quota, in cores, a spec may ask for in `resources.cpus` (more is
    /// refused with 400). Absent: the host's CPU count. Without a ceiling a tenant
    /// asking for `cpus: 1024` had no quota at all.
    pub max_cpus: Option<f64>,
    /// CPU weight of all sandboxes together against the daemon and the rest of the
    /// host when the CPUs are contended (the parent cgroup's v2 `cpu.weight`; v1
    /// `cpu.shares`, 100 being 1024); the kernel's default is 100. 0: left alone.
    pub cgroup_cpu_weight: u32,
}

impl RuntimeSection {
    /// The CPU quota of sandboxes that ask for none (`default_cpus`): `None` for no
    /// quota.
    pub fn effective_default_cpus(&self) -> Option<f64> {
        match self.default_cpus {
            Some(0.0) => None,
            Some(c) => Some(c),
            None => {
                let n = std::thread::available_parallelism().map_or(2, |n| n.get());
                Some(((n / 2).max(1) as f64).min(self.effective_max_cpus()))
            }
        }
    }

    /// The largest `resources.cpus` a spec may ask for (`max_cpus`).
    pub fn effective_max_cpus(&self) -> f64 {
        // Asked on every create that names its CPUs: the host's count is read once
        // (`available_parallelism` reads cgroup files each time).
        static HOST_CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        self.max_cpus.unwrap_or_else(|| {
            *HOST_CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
                as f64
        })
    }

    /// The effective limit of concurrent cold creates.
    pub fn create_concurrency(&self) -> usize {
        match self.max_concurrent_creates {
            0 => 2 * std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        }
    }
}

impl Default for RuntimeSection {
    fn default() -> Self {
        RuntimeSection {
            run_dir: PathBuf::from("/run/sandlot"),
            cgroup_parent: "sandlot".to_string(),
            max_concurrent_creates: 0,
            cgroup_favordynmods: true,
            fork_server: true,
            cgroup_stock: 4,
            netns_stock: 4,
            run_dir_tmpfs: true,
            default_cpus: None,
            max_cpus: None,
            cgroup_cpu_weight: 50,
        }
    }
}

/// The whole operator configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct ServerConfig {
    pub data_dir: PathBuf,
    /// Unix socket (root only, no token needed).
    pub socket: PathBuf,
    /// Optional TCP address; every request there needs a bearer token.
    pub listen: Option<SocketAddr>,
    /// Optional TCP address serving only `GET /metrics`, without authentication, for
    /// a Prometheus scraper (the metrics cover every tenant: bind it where only the
    /// monitoring system reaches).
    pub metrics_listen: Option<SocketAddr>,
    /// Prefix of the ids of this daemon's sandboxes. On start the daemon reclaims
    /// runtime leftovers with this prefix only, so a `sandlot run` next to it (or a
    /// second daemon with another prefix) is never touched.
    pub id_prefix: String,
    /// How the daemon writes its log to stderr: `text` (the default) or `json`
    /// (one object per line; a request's lines carry its `request_id`).
    pub log_format: LogFormat,
    pub limits: Limits,
    /// Quotas of tenants not listed under `tenants`.
    pub quotas: Quota,
    pub tenants: BTreeMap<String, Quota>,
    pub runtime: RuntimeSection,
    /// Warm pools (`[[pools]]`): sandboxes started ahead of time per shape.
    pub pools: Vec<crate::pool::PoolConfig>,
    /// Host paths API clients may mount (`[mounts]`).
    pub mounts: MountsSection,
    /// Network egress: default and ceiling, upstream DNS, private ranges, slot
    /// subnet and pool (`[network]`, see `docs/networking.md`).
    pub network: sandlot_net::NetConfig,
    /// The E2B-compatible front door (`[e2b]`): listener and templates.
    pub e2b: crate::e2b::E2bConfig,
    /// Inbound traffic: where published TCP ports may listen (`[ports]`).
    pub ports: crate::ports::PortsConfig,
    /// Virtual filesystem collections and shell sessions (`[vfs]`).
    pub vfs: VfsSection,
    /// Registries and builds (`[images]`, see `docs/images.md`).
    pub images: ImagesSection,
    /// The TCP listeners' caps and timeouts and the descriptors kept for the
    /// operator (`[connections]`, see `inbound.rs`).
    pub connections: crate::inbound::ConnectionsSection,
    /// What isolates sandboxes from the host kernel: the default and ceiling of
    /// create requests, and gVisor's `runsc` (`[isolation]`).
    pub isolation: IsolationSection,
}

/// Isolation backends (`[isolation]`, see `docs/api.md`, "Isolation").
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct IsolationSection {
    /// The isolation of a create that names none.
    pub default: Isolation,
    /// The strongest isolation a create may ask for (`namespace` < `gvisor`):
    /// gVisor sandboxes cost more memory and CPU per system call.
    pub ceiling: Isolation,
    /// The weakest isolation any sandbox of this daemon gets: a create asking for
    /// less is refused, and build steps, pools and the E2B front door are held to
    /// it too (`gvisor`: every sandbox runs under gVisor).
    pub minimum: Isolation,
    /// gVisor's `runsc`: a path, or a name looked up on the daemon's `PATH`.
    pub runsc: PathBuf,
    /// gVisor's platform: `auto` (systrap where the installed `runsc` has it,
    /// else ptrace), `ptrace`, `systrap` or `kvm`.
    pub platform: String,
}

impl IsolationSection {
    /// Whether a sandbox may run under `isolation`: not above the ceiling, not
    /// below the minimum; why not otherwise (`"namespace" is below the operator's
    /// minimum "gvisor"`).
    pub fn permits(&self, isolation: Isolation) -> Result<(), String> {
        if isolation > self.ceiling {
            return Err(format!(
                "{:?} is above the operator's ceiling {:?}",
                isolation.as_str(),
                self.ceiling.as_str()
            ));
        }
        if isolation < self.minimum {
            return Err(format!(
                "{:?} is below the operator's minimum {:?}",
                isolation.as_str(),
                self.minimum.as_str()
            ));
        }
        Ok(())
    }
}

impl Default for IsolationSection {
    fn default() -> Self {
        IsolationSection {
            default: Isolation::Namespace,
            ceiling: Isolation::Gvisor,
            minimum: Isolation::Namespace,
            runsc: PathBuf::from("runsc"),
            platform: "auto".into(),
        }
    }
}

/// The daemon's log format (`log_format`, `sandlot serve --log-format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines, a request's span (`request{request_id=...}`) in front.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `fields` (`message` and the
    /// event's own), `target`, `span` and `spans` (a request's carries its
    /// `request_id`).
    Json,
}

/// Virtual filesystem collections and sessions (`[vfs]`, see docs/vfs.md).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct VfsSection {
    /// Bytes of stdout plus stderr one command line may return; the rest is cut.
    pub max_output: ByteSize,
    /// Command lines one session may run.
    pub max_commands: u64,
    /// Wall-clock budget of one command line.
    pub command_timeout: Seconds,
    /// A session unused for this long is closed.
    pub session_idle_timeout: Seconds,
    /// Open sessions per tenant.
    pub max_sessions: usize,
    /// Collections per tenant.
    pub max_collections: usize,
    /// Largest uploaded archive or JSONL export (bytes after decoding).
    pub max_upload: ByteSize,
    /// Absolute host paths under which API clients may name `dir`, `git` and
    /// `jsonl` sources. Empty (the default): only uploads and S3.
    pub allowed_source_paths: Vec<PathBuf>,
    /// S3 endpoint URLs API clients may ingest from (exact match, e.g.
    /// `http://127.0.0.1:9000`). Empty (the default): no S3 ingest through the API.
    pub allowed_s3_endpoints: Vec<String>,
    /// Size of a session's copy-on-write scratch area when the client asks for
    /// one without naming a size.
    pub scratch_default_size: ByteSize,
    /// Largest scratch area a client may ask for (memory per session).
    pub scratch_max_size: ByteSize,
    /// Files and directories one scratch area may hold.
    pub scratch_max_entries: u64,
}

impl Default for VfsSection {
    fn default() -> Self {
        VfsSection {
            max_output: ByteSize(1 << 20),
            max_commands: 10_000,
            command_timeout: Seconds::secs(10),
            session_idle_timeout: Seconds::secs(15 * 60),
            max_sessions: 256,
            max_collections: 100,
            max_upload: ByteSize(1 << 30),
            allowed_source_paths: Vec::new(),
            allowed_s3_endpoints: Vec::new(),
            scratch_default_size: ByteSize(16 << 20),
            scratch_max_size: ByteSize(64 << 20),
            scratch_max_entries: 10_000,
        }
    }
}

/// Image registries and builds (`[images]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct ImagesSection {
    /// Most a snapshot, copy-out, export or diff may expand to when read (files
    /// at their apparent size, holes included, plus 512 bytes per entry), whatever
    /// a sandbox's disk limit; the limit of those no sandbox bounds (an image's
    /// export or diff, a build's context and copy steps).
    pub max_expanded_size: ByteSize,
    /// `host[:port]` registries reached over plain HTTP (e.g. a loopback test
    /// registry). Every other registry is HTTPS with verified certificates.
    pub insecure_registries: Vec<String>,
    /// A docker-style `config.json` (`auths.<host>.auth`) with registry
    /// credentials; API requests may also carry their own.
    pub auth_file: Option<PathBuf>,
    /// The registry of references that name none (none by default: a pull must
    /// name its registry host).
    pub default_registry: Option<String>,
    /// Extra CA certificates (PEM) trusted for registries, besides the host's.
    pub ca_file: Option<PathBuf>,
    /// The longest a build may take, all its steps together (operator's and
    /// tenants' alike); past it the step running is ended and the build fails.
    pub build_timeout: Seconds,
    /// The writable layer of a build's `run` step: the most one step may add.
    pub build_disk: ByteSize,
    /// The memory of a build's `run` step sandbox. A tenant's build counts against
    /// its quotas like any of its sandboxes.
    pub build_memory: ByteSize,
    /// Builds one tenant may run at once (their contexts staged on the daemon's
    /// disk included); the operator's builds are not counted.
    pub max_builds_per_tenant: usize,
}

impl Default for ImagesSection {
    fn default() -> Self {
        ImagesSection {
            max_expanded_size: ByteSize(64 << 30),
            insecure_registries: Vec::new(),
            auth_file: None,
            default_registry: None,
            ca_file: None,
            build_timeout: Seconds(Duration::from_secs(3600)),
            build_disk: ByteSize(8 << 30),
            build_memory: ByteSize(2 << 30),
            max_builds_per_tenant: 2,
        }
    }
}

/// Host directory mounts through the API.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct MountsSection {
    /// Absolute host paths under which `bind` mount sources and `rootfs`
    /// directories may lie. Empty (the default): API clients may mount none.
    pub allowed_host_paths: Vec<PathBuf>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            data_dir: PathBuf::from("/var/lib/sandlot"),
            socket: PathBuf::from("/run/sandlot/sandlot.sock"),
            listen: None,
            metrics_listen: None,
            id_prefix: crate::DEFAULT_ID_PREFIX.to_string(),
            log_format: LogFormat::Text,
            limits: Limits::default(),
            quotas: Quota::default(),
            tenants: BTreeMap::new(),
            runtime: RuntimeSection::default(),
            pools: Vec::new(),
            mounts: MountsSection::default(),
            network: sandlot_net::NetConfig::default(),
            e2b: crate::e2b::E2bConfig::default(),
            ports: crate::ports::PortsConfig::default(),
            vfs: VfsSection::default(),
            images: ImagesSection::default(),
            connections: crate::inbound::ConnectionsSection::default(),
            isolation: IsolationSection::default(),
        }
    }
}

impl ServerConfig {
    /// Parses TOML text. Unknown keys are returned as warnings (dotted paths).
    pub fn from_toml(text: &str, path: &Path) -> Result<(ServerConfig, Vec<String>), ConfigError> {
        let mut unknown = Vec::new();
        let de = toml::Deserializer::parse(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let mut cfg: ServerConfig = serde_ignored::deserialize(de, |p| unknown.push(p.to_string()))
            .map_err(|e| ConfigError::Parse {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        // A pool's spec without `isolation` is of the operator's default, as a
        // create naming none is: otherwise no create would ever match its shape.
        let raw: toml::Table = text.parse().unwrap_or_default();
        let pools = raw.get("pools").and_then(|p| p.as_array());
        for (i, pool) in cfg.pools.iter_mut().enumerate() {
            let named = pools
                .and_then(|p| p.get(i))
                .and_then(|p| p.get("spec"))
                .is_some_and(|s| s.get("isolation").is_some());
            if !named {
                pool.spec.isolation = cfg.isolation.default;
            }
        }
        let warnings = unknown
            .into_iter()
            .map(|k| format!("config {}: unknown key {k:?} ignored", path.display()))
            .collect();
        cfg.validate()?;
        Ok((cfg, warnings))
    }

    /// Reads a TOML file.
    pub fn load(path: &Path) -> Result<(ServerConfig, Vec<String>), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        ServerConfig::from_toml(&text, path)
    }

    /// Checks values serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.limits.default_timeout.0.is_zero()
            || self.limits.default_timeout > self.limits.max_timeout
        {
            return bad(format!(
                "limits.default_timeout {} must be positive and at most limits.max_timeout {}",
                fmt_secs(self.limits.default_timeout.0),
                fmt_secs(self.limits.max_timeout.0)
            ));
        }
        if self.limits.exec_grace.0.is_zero() {
            return bad("limits.exec_grace must be positive".into());
        }
        if self.limits.max_request_body.0 < 4096 {
            return bad("limits.max_request_body must be at least 4K".into());
        }
        // What the store's layers may expand to must stay within what an archive's
        // sparse entries may (their holes are read through on unpack).
        let sparse = sandlot_store::tar_bound::MAX_SPARSE_EXPANSION;
        if self.images.max_expanded_size.0 > sparse {
            return bad(format!(
                "images.max_expanded_size {} is over the maximum of {}",
                self.images.max_expanded_size,
                ByteSize(sparse)
            ));
        }
        let p = &self.id_prefix;
        if p.is_empty()
            || p.len() > 24
            || !p
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return bad(format!(
                "id_prefix {p:?}: use 1 to 24 letters, digits, '-' or '_'"
            ));
        }
        for (i, p) in self.pools.iter().enumerate() {
            if p.size > crate::pool::MAX_POOL_SIZE {
                return bad(format!(
                    "pools[{i}].size {} is over the maximum of {}",
                    p.size,
                    crate::pool::MAX_POOL_SIZE
                ));
            }
            if let Some(m) = p.max_size {
                if m < p.size || m > crate::pool::MAX_POOL_SIZE {
                    return bad(format!(
                        "pools[{i}].max_size {m} must be between size ({}) and {}",
                        p.size,
                        crate::pool::MAX_POOL_SIZE
                    ));
                }
            }
            if p.shrink_after.duration().is_zero() {
                return bad(format!("pools[{i}].shrink_after must be more than 0s"));
            }
            if let Err(e) = p.spec.validate() {
                return bad(format!("pools[{i}].spec.{e}"));
            }
            if let Some(why) = crate::pool::unpoolable(&p.spec) {
                return bad(format!("pools[{i}].spec: {why}"));
            }
            if let Err(why) = self.isolation.permits(p.spec.isolation) {
                return bad(format!("pools[{i}].spec.isolation {why}"));
            }
            if let Err(why) = crate::isolation::memory_floor(&p.spec) {
                return bad(format!("pools[{i}].spec.resources.memory {why}"));
            }
        }
        let iso = &self.isolation;
        if iso.minimum > iso.ceiling {
            return bad(format!(
                "isolation.minimum {:?} is above isolation.ceiling {:?}",
                iso.minimum.as_str(),
                iso.ceiling.as_str()
            ));
        }
        if let Err(why) = iso.permits(iso.default) {
            return bad(format!("isolation.default {why}"));
        }
        if !["auto", "ptrace", "systrap", "kvm"].contains(&iso.platform.as_str()) {
            return bad(format!(
                "isolation.platform {:?}: use auto, ptrace, systrap or kvm",
                iso.platform
            ));
        }
        if let Some(c) = self.runtime.default_cpus {
            use sandlot_proto::spec::limits::{MAX_CPUS, MIN_CPUS};
            if !(c == 0.0 || (c.is_finite() && (MIN_CPUS..=MAX_CPUS).contains(&c))) {
                return bad(format!(
                    "runtime.default_cpus {c}: use 0 (no quota) or {MIN_CPUS} to {MAX_CPUS} cores"
                ));
            }
        }
        if let Some(c) = self.runtime.max_cpus {
            use sandlot_proto::spec::limits::{MAX_CPUS, MIN_CPUS};
            if !(c.is_finite() && (MIN_CPUS..=MAX_CPUS).contains(&c)) {
                return bad(format!(
                    "runtime.max_cpus {c}: use {MIN_CPUS} to {MAX_CPUS} cores"
                ));
            }
        }
        if let Some(d) = self.runtime.default_cpus {
            let max = self.runtime.effective_max_cpus();
            if d > max {
                return bad(format!(
                    "runtime.default_cpus {d} exceeds runtime.max_cpus {max}"
                ));
            }
        }
        if self.images.build_timeout.0.is_zero() {
            return bad("images.build_timeout must be positive".into());
        }
        // A build step's sandbox: the sizes must make a sandbox (memory at least the
        // minimum, the writable layer within what the memory holds).
        let step =
            crate::build::step_spec("build-step", false, &self.images, self.isolation.default);
        if let Err(e) = step.validate() {
            return bad(format!(
                "images.build_memory {} and images.build_disk {}: {e}",
                self.images.build_memory, self.images.build_disk
            ));
        }
        if let Err(why) = crate::isolation::memory_floor(&step) {
            return bad(format!("images.build_memory {why}"));
        }
        if self.runtime.cgroup_cpu_weight > 10_000 {
            return bad(format!(
                "runtime.cgroup_cpu_weight {}: use 0 (the kernel's) or 1 to 10000",
                self.runtime.cgroup_cpu_weight
            ));
        }
        for p in &self.mounts.allowed_host_paths {
            if !p.is_absolute() || p.components().any(|c| c == std::path::Component::ParentDir) {
                return bad(format!(
                    "mounts.allowed_host_paths: {} must be an absolute path without '..'",
                    p.display()
                ));
            }
        }
        self.network
            .validate()
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if let Err(m) = self.e2b.check() {
            return bad(m);
        }
        // An E2B template's sandboxes are of its isolation, else the default.
        for (name, v) in &self.e2b.templates {
            if let Ok(mut spec) =
                serde_json::from_value::<sandlot_proto::spec::SandboxSpec>(v.clone())
            {
                if v.get("isolation").is_none() {
                    spec.isolation = self.isolation.default;
                }
                if let Err(why) = crate::isolation::memory_floor(&spec) {
                    return bad(format!("e2b.templates.{name}.resources.memory {why}"));
                }
            }
        }
        if let Err(m) = self.ports.check() {
            return bad(m);
        }
        if let Err(m) = self.connections.check() {
            return bad(m);
        }
        if self.vfs.command_timeout.0.is_zero() || self.vfs.session_idle_timeout.0.is_zero() {
            return bad("vfs.command_timeout and vfs.session_idle_timeout must be positive".into());
        }
        if self.vfs.max_output.0 == 0 || self.vfs.max_commands == 0 {
            return bad("vfs.max_output and vfs.max_commands must be positive".into());
        }
        if self.vfs.scratch_default_size.0 > self.vfs.scratch_max_size.0 {
            return bad(format!(
                "vfs.scratch_default_size ({} bytes) exceeds vfs.scratch_max_size ({} bytes)",
                self.vfs.scratch_default_size.0, self.vfs.scratch_max_size.0
            ));
        }
        for p in &self.vfs.allowed_source_paths {
            if !p.is_absolute() || p.components().any(|c| c == std::path::Component::ParentDir) {
                return bad(format!(
                    "vfs.allowed_source_paths: {} must be an absolute path without '..'",
                    p.display()
                ));
            }
        }
        for (i, e) in self.vfs.allowed_s3_endpoints.iter().enumerate() {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return bad(format!(
                    "vfs.allowed_s3_endpoints[{i}]: {e:?} must be an http:// or https:// URL"
                ));
            }
        }
        for name in self.tenants.keys() {
            if !valid_tenant(name) {
                return bad(format!("tenants.{name}: {}", TENANT_RULE));
            }
        }
        Ok(())
    }

    /// The quota of `tenant`.
    pub fn quota(&self, tenant: &str) -> Quota {
        self.tenants.get(tenant).copied().unwrap_or(self.quotas)
    }

    pub fn db_path(&self) -> PathBuf {
        self.data_dir.join("sandlot.db")
    }
}

/// What a tenant name may be.
pub const TENANT_RULE: &str = "tenant names are 1 to 64 letters, digits, '-', '_' or '.'";

pub fn valid_tenant(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// A tenant's name as one component of a host path: the name itself, or for one
/// that could not be a component (`.`, `..`, a leading dot) `~` and its bytes in
/// hex, which no valid name spells (valid names have no `~`), so two tenants never
/// share a directory.
pub fn tenant_path_component(tenant: &str) -> String {
    if valid_tenant(tenant) && !tenant.starts_with('.') {
        tenant.to_string()
    } else {
        format!("~{}", crate::auth::hex(tenant.as_bytes()))
    }
}

/// The tenant whose directory is `component` ([`tenant_path_component`]'s inverse).
pub fn tenant_of_path_component(component: &str) -> String {
    let decoded = component.strip_prefix('~').and_then(|h| {
        (h.len() % 2 == 0)
            .then(|| {
                (0..h.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
                    .collect::<Option<Vec<u8>>>()
            })
            .flatten()
    });
    match decoded {
        Some(b) => String::from_utf8_lossy(&b).into_owned(),
        None => component.to_string(),
    }
}

/// `90s`, `5m`, `2h` (whole units when exact).
pub fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs();
    if d.subsec_nanos() != 0 {
        return format!("{:.3}s", d.as_secs_f64());
    }
    if s >= 3600 && s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s >= 60 && s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_never_share_a_path_component() {
        let names = [".", "..", ".x", "_", "a", "~2e", "a/b", ""];
        let parts: Vec<String> = names.iter().map(|n| tenant_path_component(n)).collect();
        let mut uniq = parts.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), parts.len(), "{parts:?}");
        assert_eq!(tenant_path_component("acme"), "acme");
        assert_eq!(tenant_path_component(".."), "~2e2e");
        for n in names {
            assert_eq!(tenant_of_path_component(&tenant_path_component(n)), n);
        }
        assert!(parts
            .iter()
            .all(|p| !p.is_empty() && !p.contains('/') && p != "." && p != ".."));
    }

    #[test]
    fn unknown_keys_warn_and_known_keys_apply() {
        let text = r#"
data_dir = "/srv/sandlot"
listen = "127.0.0.1:7071"
colour = "blue"
[limits]
default_timeout = "10m"
max_timeout = "2h"
exec_grace = "5s"
typo_key = 1
[quotas]
max_sandboxes = 7
max_memory = "2G"
[tenants.acme]
max_sandboxes = 3
"#;
        let (c, w) = ServerConfig::from_toml(text, Path::new("x.toml")).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/srv/sandlot"));
        assert_eq!(c.listen, Some("127.0.0.1:7071".parse().unwrap()));
        assert_eq!(c.limits.default_timeout, Seconds::secs(600));
        assert_eq!(c.limits.max_timeout, Seconds::secs(7200));
        assert_eq!(c.quota("other").max_sandboxes, 7);
        assert_eq!(c.quota("other").max_memory, ByteSize(2 << 30));
        assert_eq!(c.quota("acme").max_sandboxes, 3);
        // Fields a tenant leaves out take the built-in default.
        assert_eq!(c.quota("acme").max_memory, Quota::default().max_memory);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w.iter().any(|m| m.contains("colour")), "{w:?}");
        assert!(w.iter().any(|m| m.contains("limits.typo_key")), "{w:?}");
    }

    #[test]
    fn bad_values_are_errors() {
        let e = ServerConfig::from_toml("[limits]\ndefault_timeout = \"30h\"\n", Path::new("c"))
            .unwrap_err();
        assert!(e.to_string().contains("default_timeout"), "{e}");
        let e = ServerConfig::from_toml("listen = 5\n", Path::new("c")).unwrap_err();
        assert!(e.to_string().contains("listen"), "{e}");
        let e = ServerConfig::from_toml("id_prefix = \"a/b\"\n", Path::new("c")).unwrap_err();
        assert!(e.to_string().contains("id_prefix"), "{e}");
        let e = ServerConfig::from_toml("[tenants.\"a b\"]\n", Path::new("c")).unwrap_err();
        assert!(e.to_string().contains("tenant"), "{e}");
    }

    #[test]
    fn isolation_default_and_ceiling_are_checked() {
        let (c, _) = ServerConfig::from_toml("", Path::new("c")).unwrap();
        assert_eq!(
            (c.isolation.default, c.isolation.ceiling),
            (Isolation::Namespace, Isolation::Gvisor)
        );
        let (c, _) = ServerConfig::from_toml(
            "[isolation]\ndefault = \"gvisor\"\nplatform = \"ptrace\"\n",
            Path::new("c"),
        )
        .unwrap();
        assert_eq!(c.isolation.default, Isolation::Gvisor);
        for (bad, names) in [
            (
                "[isolation]\ndefault = \"gvisor\"\nceiling = \"namespace\"\n",
                "isolation.default",
            ),
            ("[isolation]\nplatform = \"vm\"\n", "isolation.platform"),
            ("[isolation]\ndefault = \"vm\"\n", "default"),
            (
                "[isolation]\nceiling = \"namespace\"\n[[pools]]\nspec = { isolation = \"gvisor\" }\n",
                "pools[0].spec.isolation",
            ),
            (
                "[isolation]\nminimum = \"gvisor\"\n",
                "isolation.default \"namespace\" is below the operator's minimum \"gvisor\"",
            ),
            (
                "[isolation]\nminimum = \"gvisor\"\nceiling = \"namespace\"\n",
                "isolation.minimum",
            ),
            (
                "[isolation]\nminimum = \"gvisor\"\ndefault = \"gvisor\"\n[[pools]]\nspec = { isolation = \"namespace\" }\n",
                "pools[0].spec.isolation \"namespace\" is below",
            ),
            (
                "[[pools]]\nspec = { isolation = \"gvisor\", resources = { memory = \"16M\" } }\n",
                "pools[0].spec.resources.memory 16M is too little for a gVisor sandbox",
            ),
            (
                "[isolation]\ndefault = \"gvisor\"\n[[pools]]\nspec = { resources = { memory = \"24M\" } }\n",
                "at least 32M",
            ),
            (
                "[isolation]\ndefault = \"gvisor\"\n[images]\nbuild_memory = \"24M\"\n",
                "images.build_memory 24M is too little for a gVisor sandbox",
            ),
            (
                "[isolation]\ndefault = \"gvisor\"\n[e2b.templates.tiny]\nresources = { memory = \"16M\" }\n",
                "e2b.templates.tiny.resources.memory 16M is too little",
            ),
        ] {
            let e = ServerConfig::from_toml(bad, Path::new("c")).unwrap_err();
            assert!(e.to_string().contains(names), "{bad}: {e}");
        }
        // A pool naming no isolation is of the default one.
        let (c, _) = ServerConfig::from_toml(
            "[isolation]\nminimum = \"gvisor\"\ndefault = \"gvisor\"\n[[pools]]\nsize = 1\n",
            Path::new("c"),
        )
        .unwrap();
        assert_eq!(c.pools[0].spec.isolation, Isolation::Gvisor);
    }

    #[test]
    fn sandbox_cpu_defaults_are_checked() {
        let (c, _) = ServerConfig::from_toml("", Path::new("c")).unwrap();
        let half = (std::thread::available_parallelism().unwrap().get() / 2).max(1);
        assert_eq!(c.runtime.effective_default_cpus(), Some(half as f64));
        assert_eq!(c.runtime.cgroup_cpu_weight, 50);
        let (c, _) = ServerConfig::from_toml(
            "[runtime]\ndefault_cpus = 0\ncgroup_cpu_weight = 0\n",
            Path::new("c"),
        )
        .unwrap();
        assert_eq!(c.runtime.effective_default_cpus(), None);
        let (c, _) = ServerConfig::from_toml(
            "[runtime]\ndefault_cpus = 1.5\nmax_cpus = 4\n",
            Path::new("c"),
        )
        .unwrap();
        assert_eq!(c.runtime.effective_default_cpus(), Some(1.5));
        assert_eq!(c.runtime.effective_max_cpus(), 4.0);
        // The ceiling defaults to the host's CPUs and bounds the implicit default.
        let (c, _) = ServerConfig::from_toml("", Path::new("c")).unwrap();
        let host = std::thread::available_parallelism().unwrap().get() as f64;
        assert_eq!(c.runtime.effective_max_cpus(), host);
        let (c, _) =
            ServerConfig::from_toml("[runtime]\nmax_cpus = 0.25\n", Path::new("c")).unwrap();
        assert_eq!(c.runtime.effective_default_cpus(), Some(0.25));
        let e = ServerConfig::from_toml(
            "[runtime]\ndefault_cpus = 2\nmax_cpus = 1\n",
            Path::new("c"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("exceeds runtime.max_cpus"), "{e}");
        for bad in [
            "default_cpus = -1",
            "default_cpus = 0.001",
            "default_cpus = 5000",
            "max_cpus = 0",
            "max_cpus = 5000",
            "cgroup_cpu_weight = 10001",
        ] {
            let text = format!("[runtime]\n{bad}\n");
            let e = ServerConfig::from_toml(&text, Path::new("c")).unwrap_err();
            let key = bad.split(' ').next().unwrap();
            assert!(
                e.to_string().contains(&format!("runtime.{key}")),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn defaults() {
        let (c, w) = ServerConfig::from_toml("", Path::new("c")).unwrap();
        assert!(w.is_empty());
        assert_eq!(c, ServerConfig::default());
        assert_eq!(c.limits.default_timeout, Seconds::secs(300));
        assert_eq!(fmt_secs(Duration::from_secs(300)), "5m");
        assert_eq!(fmt_secs(Duration::from_secs(7200)), "2h");
        assert_eq!(fmt_secs(Duration::from_secs(61)), "61s");
    }

    #[test]
    fn scratch_limits_parse_and_are_checked() {
        let (c, w) = ServerConfig::from_toml(
            "[vfs]\nscratch_default_size = \"1M\"\nscratch_max_size = \"8M\"\nscratch_max_entries = 50\nscratch_typo = 1\n",
            Path::new("c"),
        )
        .unwrap();
        assert_eq!(c.vfs.scratch_default_size, ByteSize(1 << 20));
        assert_eq!(c.vfs.scratch_max_size, ByteSize(8 << 20));
        assert_eq!(c.vfs.scratch_max_entries, 50);
        assert!(
            w.len() == 1 && w[0].contains("vfs.scratch_typo"),
            "an unknown key warns: {w:?}"
        );
        let e = ServerConfig::from_toml(
            "[vfs]\nscratch_default_size = \"9M\"\nscratch_max_size = \"8M\"\n",
            Path::new("c"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("vfs.scratch_default_size"), "{e}");
    }

    #[test]
    fn build_limits_parse_and_are_checked() {
        let (c, _) = ServerConfig::from_toml(
            "[images]\nbuild_timeout = \"10m\"\nbuild_disk = \"1G\"\nbuild_memory = \"512M\"\n",
            Path::new("c"),
        )
        .unwrap();
        assert_eq!(c.images.build_timeout.0, Duration::from_secs(600));
        assert_eq!(c.images.build_disk, ByteSize(1 << 30));
        assert_eq!(c.images.build_memory, ByteSize(512 << 20));
        let e = ServerConfig::from_toml("[images]\nbuild_timeout = \"0s\"\n", Path::new("c"))
            .unwrap_err();
        assert!(e.to_string().contains("images.build_timeout"), "{e}");
        let e = ServerConfig::from_toml("[images]\nbuild_memory = \"1M\"\n", Path::new("c"))
            .unwrap_err();
        assert!(e.to_string().contains("images.build_memory 1M"), "{e}");
    }
}
