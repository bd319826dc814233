//! The Sandlot daemon (`sandlot serve`): the HTTP API v1 over a Unix socket
//! (operator) and optionally TCP (bearer tokens, one tenant each); SQLite state;
//! one owner task per sandbox enforcing lifetime and idle timeouts; usage
//! metering and Prometheus metrics; reconciliation after a restart.
//!
//! See `docs/api.md` for the API and `api/openapi.json` for its schema.

pub mod auth;
pub mod autopause;
pub mod body;
pub mod build;
pub mod checkpoint;
pub mod code;
pub mod collection_mount;
pub mod config;
pub mod console;
pub mod e2b;
pub mod error;
pub mod fork;
pub mod images;
pub mod inbound;
pub mod isolation;
pub mod mcp;
pub mod memory;
pub mod memory_guard;
pub mod metrics;
pub mod mount_users;
pub mod network;
pub mod openapi;
pub mod pause;
pub mod pool;
pub mod ports;
pub mod process;
pub mod request_body;
pub mod routes;
pub mod sandbox;
pub mod services;
pub mod snapshot;
pub mod state;
pub mod store;
pub mod tarstream;
pub mod timefmt;
pub mod usage_history;
pub mod vfs;

use std::future::IntoFuture;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sandlot_runtime::host_lock::HostLock;
use sandlot_runtime::{Backend, NamespaceBackend, RuntimeConfig};

pub use config::ServerConfig;

use crate::auth::Transport;
use crate::state::AppState;
use crate::store::Store;

/// Errors starting or running the daemon.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("another sandlot daemon uses the data directory {0}")]
    Locked(PathBuf),
    #[error("socket {0} is in use by a running daemon")]
    SocketInUse(PathBuf),
    /// Two daemons with one id prefix would each take the other's sandboxes,
    /// cgroups and network namespaces for leftovers of their own, and remove them.
    #[error(
        "another sandlot daemon ({holder}) uses the id prefix {prefix:?} on this host \
         (lock {}): its sandboxes would be taken for this daemon's leftovers and killed; \
         stop it, or give this daemon another prefix (--id-prefix, or id_prefix in the config)",
        path.display()
    )]
    PrefixInUse {
        prefix: String,
        holder: String,
        path: PathBuf,
    },
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Runtime(#[from] sandlot_runtime::RuntimeError),
    #[error(transparent)]
    Images(sandlot_store::StoreError),
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> ServerError + 'a {
    move |source| ServerError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Takes an exclusive lock on `data_dir/daemon.lock` for the life of the process.
fn lock_data_dir(dir: &Path) -> Result<HostLock, ServerError> {
    let p = dir.join("daemon.lock");
    match HostLock::try_take(&p).map_err(io("lock", &p))? {
        Ok(l) => Ok(l),
        Err(_) => Err(ServerError::Locked(dir.to_path_buf())),
    }
}

/// Whether a daemon runs on `data_dir` now: its `daemon.lock` names a live process.
/// Reads only (takes no lock, creates nothing), so a daemon starting meanwhile is
/// never disturbed; a reused pid reads as running.
pub fn daemon_running_on(data_dir: &Path) -> bool {
    std::fs::read_to_string(data_dir.join("daemon.lock"))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists())
}

/// Where daemons lock their id prefixes (`<id_prefix>.lock`, holding the pid): one
/// directory for the whole host, whatever each daemon's run directory, because
/// network namespace names are host-wide.
pub const ID_PREFIX_LOCK_DIR: &str = "/run/lock/sandlot";

/// The id prefix of a daemon whose configuration names none.
pub const DEFAULT_ID_PREFIX: &str = "sb-";

/// The id prefixes of sandlot daemons on this host: the default one, and every
/// prefix with a lock file in [`ID_PREFIX_LOCK_DIR`] (a running daemon's, or one that a
/// killed daemon left). A sandbox made without a daemon (`sandlot run`) must not have
/// an id with one of them: that daemon's next start would take it for a leftover of
/// its own and kill it.
pub fn daemon_id_prefixes() -> Vec<String> {
    daemon_id_prefixes_in(Path::new(ID_PREFIX_LOCK_DIR))
}

fn daemon_id_prefixes_in(dir: &Path) -> Vec<String> {
    let mut v = vec![DEFAULT_ID_PREFIX.to_string()];
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let name = e.file_name();
            if let Some(p) = name.to_str().and_then(|n| n.strip_suffix(".lock")) {
                if !p.is_empty() && !v.iter().any(|q| q == p) {
                    v.push(p.to_string());
                }
            }
        }
    }
    v
}

/// Takes an exclusive lock on `dir/<id_prefix>.lock` for the life of the process
/// (with its pid in it), so that a second daemon with the same prefix (another data
/// directory) fails to start, naming the first, instead of reconciling the first
/// one's sandboxes away as orphans.
fn lock_id_prefix(dir: &Path, prefix: &str) -> Result<HostLock, ServerError> {
    let p = dir.join(format!("{prefix}.lock"));
    match HostLock::try_take(&p).map_err(io("lock", &p))? {
        Ok(l) => Ok(l),
        Err(pid) => Err(ServerError::PrefixInUse {
            prefix: prefix.to_string(),
            holder: match pid {
                Some(n) => format!("pid {n}"),
                None => "a process that is starting".to_string(),
            },
            path: p,
        }),
    }
}

/// Refuses to start beside a daemon that answers on `path`; removes a socket file
/// a killed daemon left.
fn claim_socket_path(path: &Path) -> Result<(), ServerError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io("create", parent))?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ServerError::SocketInUse(path.to_path_buf()));
        }
        std::fs::remove_file(path).map_err(io("remove stale socket", path))?;
    }
    Ok(())
}

/// Binds the operator socket, root-only: its mode is set on the socket before
/// `bind` makes the file, so the file is 0600 from its first instant, whatever the
/// umask. It is bound after every TCP listener: a client (a service manager, a
/// test) that waits for the socket to accept finds the API, metrics and E2B ports
/// bound too.
fn bind_socket(path: &Path) -> Result<tokio::net::UnixListener, ServerError> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )
    .map_err(|e| io("create a socket for", path)(e.into()))?;
    rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(0o600))
        .map_err(|e| io("chmod", path)(e.into()))?;
    let addr = SocketAddrUnix::new(path).map_err(|e| io("bind", path)(e.into()))?;
    rustix::net::bind(&fd, &addr).map_err(|e| io("bind", path)(e.into()))?;
    rustix::net::listen(&fd, 1024).map_err(|e| io("listen on", path)(e.into()))?;
    tokio::net::UnixListener::from_std(std::os::unix::net::UnixListener::from(fd))
        .map_err(io("listen on", path))
}

/// How long a stopping daemon waits for open requests and streams.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a graceful shutdown waits for the host clean-ups of stopped sandboxes.
const TEARDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Raises the soft limit of open files to the hard one: the daemon holds
/// descriptors per sandbox (its PID 1's pidfd, the agent connection, mount
/// helpers' pipes) and per TCP client and proxied connection, and service
/// managers often start it with a soft limit of 1,024. Returns the limit now in
/// force, logged with how it is shared out (see [`inbound::DescriptorPlan`]).
fn raise_open_file_limit() -> usize {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    let before = l.current;
    if l.current < l.maximum {
        l.current = l.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, l) {
            tracing::warn!("raise the open-file limit: {e}");
        }
    }
    let now = getrlimit(Resource::Nofile);
    // An unlimited or absurd limit counts as what the kernel allows a process.
    let cap = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(1 << 20);
    let got = now.current.unwrap_or(cap).min(cap) as usize;
    tracing::info!(
        soft_before = ?before,
        soft = got,
        hard = ?now.maximum,
        "open-file limit"
    );
    got
}

/// Runs the daemon until `shutdown` resolves. Sandboxes keep running across a
/// stop and are re-adopted by the next start.
pub async fn serve(
    cfg: ServerConfig,
    init_exe: PathBuf,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    std::fs::create_dir_all(&cfg.data_dir).map_err(io("create", &cfg.data_dir))?;
    std::fs::set_permissions(&cfg.data_dir, std::fs::Permissions::from_mode(0o700))
        .map_err(io("chmod", &cfg.data_dir))?;
    let _lock = lock_data_dir(&cfg.data_dir)?;
    let _prefix_lock = lock_id_prefix(Path::new(ID_PREFIX_LOCK_DIR), &cfg.id_prefix)?;
    let plan = inbound::DescriptorPlan::new(raise_open_file_limit(), &cfg.connections);
    for w in &plan.warnings {
        tracing::warn!("{w}");
    }
    tracing::info!(
        limit = plan.limit,
        reserve = plan.reserve,
        tcp_clients = plan.inbound,
        egress = plan.egress,
        "descriptors: kept for the operator socket and sandboxes, for TCP clients, for egress"
    );
    let store = Store::open(&cfg.db_path())?;
    let mut rc = RuntimeConfig::new(init_exe.clone());
    rc.run_dir = cfg.runtime.run_dir.clone();
    rc.cgroup_parent = cfg.runtime.cgroup_parent.clone();
    rc.fork_server = cfg.runtime.fork_server;
    rc.cgroup_stock = cfg.runtime.cgroup_stock;
    rc.netns_stock = cfg.runtime.netns_stock;
    rc.run_dir_tmpfs = cfg.runtime.run_dir_tmpfs;
    rc.default_cpus = cfg.runtime.effective_default_cpus();
    rc.cgroup_cpu_weight = Some(cfg.runtime.cgroup_cpu_weight).filter(|w| *w > 0);
    let runtime = NamespaceBackend::new(rc)?;
    // The backend made this process a child subreaper: reap the orphans it adopts.
    sandlot_runtime::orphans::start().map_err(|source| ServerError::Io {
        what: "start the orphan reaper thread",
        path: PathBuf::new(),
        source,
    })?;
    report_run_dir_fs(&cfg.runtime.run_dir, runtime.run_dir_fs());
    if cfg.runtime.cgroup_favordynmods {
        use sandlot_runtime::cgroup::{favor_dynamic_modifications, FavorDynmods};
        match favor_dynamic_modifications() {
            Ok(FavorDynmods::Enabled(p)) => tracing::info!(
                mount = %p.display(),
                "remounted the cgroup2 hierarchy with favordynmods (runtime.cgroup_favordynmods)"
            ),
            Ok(FavorDynmods::AlreadyOn(_)) => {}
            Ok(FavorDynmods::NoUnifiedHierarchy) => tracing::info!(
                "no cgroup2 mount: favordynmods is not available, cgroup attaches wait for RCU"
            ),
            Err(e) => tracing::warn!("runtime.cgroup_favordynmods: {e}"),
        }
    }
    claim_socket_path(&cfg.socket)?;
    let tcp = match cfg.listen {
        Some(a) => {
            Some(
                tokio::net::TcpListener::bind(a)
                    .await
                    .map_err(|source| ServerError::Io {
                        what: "listen on",
                        path: PathBuf::from(a.to_string()),
                        source,
                    })?,
            )
        }
        None => None,
    };
    let metrics_tcp = match cfg.metrics_listen {
        Some(a) => {
            Some(
                tokio::net::TcpListener::bind(a)
                    .await
                    .map_err(|source| ServerError::Io {
                        what: "listen (metrics) on",
                        path: PathBuf::from(a.to_string()),
                        source,
                    })?,
            )
        }
        None => None,
    };
    let images = images::Images::open(
        &cfg.data_dir,
        cfg.mounts.allowed_host_paths.clone(),
        cfg.images.max_expanded_size.bytes(),
    )
    .map_err(ServerError::Images)?;
    let e2b_listener = e2b::bind(&cfg.e2b)
        .await
        .map_err(|source| ServerError::Io {
            what: "listen (e2b) on",
            path: PathBuf::from(format!("{:?}", cfg.e2b.listen)),
            source,
        })?;
    let unix = bind_socket(&cfg.socket)?;
    let gvisor = gvisor_backend(&cfg, &init_exe);
    let backends = isolation::Backends::new(Arc::new(runtime), gvisor);
    let state = Arc::new(AppState::new(cfg, store, backends, images, plan, init_exe));
    let mut rep = sandbox::reconcile(&state).await?;
    // No create runs yet: keys of creates a crash interrupted are free again.
    if let Err(e) = state.store.release_unbound_idempotency_keys() {
        tracing::warn!("release idempotency keys of interrupted creates: {e}");
    }
    tracing::info!(
        adopted = rep.adopted.len(),
        lost = rep.lost.len(),
        orphans_killed = rep.orphans.len(),
        swept = rep.swept.len(),
        "reconciled sandboxes"
    );
    network::start(&state).await;
    ports::restore(&state).await;
    // Only now: a re-adopted sandbox that stops at once must find the network
    // service there to release its slot.
    rep.start_owners(&state);
    pool::Pools::start(&state);
    state.vfs.sweep_uploads();
    routes::vfs::start_sweeper(&state);
    start_record_pruner(&state);
    pause::start_paused_expiry(&state);
    checkpoint::reconcile(&state).await;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let wait_stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    tracing::info!(socket = %state.cfg.socket.display(), listen = ?state.cfg.listen, "sandlot daemon listening");
    let e2b_task = match e2b_listener {
        Some(l) => {
            let front = e2b::E2b::new(state.clone(), state.cfg.e2b.clone(), stop_rx.clone())
                .map_err(io("create the e2b key in", &state.cfg.data_dir))?;
            tracing::info!(listen = ?state.cfg.e2b.listen, "E2B-compatible API listening");
            let srv = inbound::serve(
                &state.inbound,
                l,
                inbound::ListenerKind::E2b,
                e2b::router(front),
                wait_stop(stop_rx.clone()),
            );
            Some(tokio::spawn(srv))
        }
        None => None,
    };
    let metrics_task = metrics_tcp.map(|l| {
        tracing::info!(listen = ?state.cfg.metrics_listen, "metrics listening");
        // No token here: the same caps and timeouts as the API's listener, so a flood
        // of connections cannot take the descriptors the operator and creates need.
        let srv = inbound::serve(
            &state.inbound,
            l,
            inbound::ListenerKind::Metrics,
            routes::metrics_router(state.clone()),
            wait_stop(stop_rx.clone()),
        );
        tokio::spawn(srv)
    });
    // `into_make_service`: each connection gets a clone of the router (one `Arc`).
    // Serving a `Router` directly re-walks every route (`with_state`) per connection,
    // and most clients open one connection per request.
    let unix_app = routes::router(state.clone(), Transport::Unix).into_make_service();
    let unix_srv = axum::serve(unix, unix_app).with_graceful_shutdown(wait_stop(stop_rx.clone()));
    let servers = async {
        match tcp {
            Some(t) => {
                let tcp_srv = inbound::serve(
                    &state.inbound,
                    t,
                    inbound::ListenerKind::Api,
                    routes::router(state.clone(), Transport::Tcp),
                    wait_stop(stop_rx.clone()),
                );
                let (a, b) = tokio::join!(unix_srv.into_future(), tcp_srv);
                a.and(b)
            }
            None => unix_srv.await,
        }
    };
    // Graceful shutdown waits for open requests, and an output stream or a
    // WebSocket can stay open for as long as its process runs: after a grace
    // period the remaining connections are dropped (clients see the stream end
    // and can re-attach to the next daemon; sandboxes keep running).
    let grace = {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        }
    };
    let res = tokio::select! {
        r = servers => r,
        () = grace => {
            tracing::warn!("open connections did not finish within {SHUTDOWN_GRACE:?} of the stop signal; closing them");
            Ok(())
        }
    };
    if let Some(t) = e2b_task {
        let _ = t.await;
    }
    if let Some(t) = metrics_task {
        // Scrapes are short and hold nothing: no grace for them.
        t.abort();
    }
    state.set_shutting_down();
    pool::Pools::drain(&state).await;
    // Host clean-ups of sandboxes already recorded as stopped.
    if !state.teardowns.wait_idle(TEARDOWN_WAIT).await {
        tracing::warn!(
            pending = state.teardowns.pending(),
            "sandbox clean-ups still running after {TEARDOWN_WAIT:?}; the next start finishes them"
        );
    }
    network::shutdown(&state).await;
    for b in state.backends.available() {
        b.release_stock();
    }
    let _ = std::fs::remove_file(&state.cfg.socket);
    res.map_err(io("serve on", &state.cfg.socket))?;
    tracing::info!(
        live = state.live_ids().len(),
        "daemon stopped; live sandboxes keep running"
    );
    Ok(())
}

/// The daemon's shared state over `runtime`, without its listeners, start-up
/// reconcile or network service: opens the database and the image store under
/// `cfg.data_dir`. `helper_exe` is the `sandlot` binary (collection mount helpers).
/// For serving [`routes::router`] in-process, as the tests over the fake backend
/// (`sandlot_runtime::process_backend`) do; `sandlot serve` uses [`serve`].
pub fn open_state(
    cfg: ServerConfig,
    runtime: Arc<dyn Backend>,
    helper_exe: PathBuf,
) -> Result<Arc<AppState>, ServerError> {
    std::fs::create_dir_all(&cfg.data_dir).map_err(io("create", &cfg.data_dir))?;
    let store = Store::open(&cfg.db_path())?;
    let images = images::Images::open(
        &cfg.data_dir,
        cfg.mounts.allowed_host_paths.clone(),
        cfg.images.max_expanded_size.bytes(),
    )
    .map_err(ServerError::Images)?;
    let plan = inbound::DescriptorPlan::new(1024, &cfg.connections);
    let backends = isolation::Backends::only(runtime);
    Ok(Arc::new(AppState::new(
        cfg, store, backends, images, plan, helper_exe,
    )))
}

/// The gVisor backend, when the operator's ceiling or a pool allows gVisor and
/// the host has a `runsc` that can run it; else why not (logged, and the 409 of
/// a create that asks for it).
fn gvisor_backend(cfg: &ServerConfig, sandlot_exe: &Path) -> Result<Arc<dyn Backend>, String> {
    use sandlot_proto::spec::Isolation;
    use sandlot_runtime::gvisor::{GvisorBackend, GvisorConfig};
    let wanted = cfg.isolation.ceiling >= Isolation::Gvisor
        || cfg
            .pools
            .iter()
            .any(|p| p.spec.isolation == Isolation::Gvisor);
    if !wanted {
        return Err("the operator's isolation.ceiling is \"namespace\"".into());
    }
    let gcfg = GvisorConfig {
        runsc: cfg.isolation.runsc.clone(),
        platform: cfg.isolation.platform.clone(),
        run_dir: cfg.runtime.run_dir.clone(),
        cgroup_parent: cfg.runtime.cgroup_parent.clone(),
        cgroup_cpu_weight: Some(cfg.runtime.cgroup_cpu_weight).filter(|w| *w > 0),
        sandlot_exe: sandlot_exe.to_path_buf(),
        default_cpus: cfg.runtime.effective_default_cpus(),
        // The namespace backend's ranges (`RuntimeConfig::new`): both take slots
        // from the same run directory.
        id_base: sandlot_runtime::plan::DEFAULT_ID_BASE,
        id_slots: sandlot_runtime::plan::DEFAULT_ID_SLOTS,
    };
    match GvisorBackend::new(gcfg) {
        Ok(b) => {
            let r = b.runsc();
            tracing::info!(
                runsc = %r.path.display(),
                version = %r.version,
                platform = %r.platform,
                "gVisor backend ready"
            );
            Ok(Arc::new(b))
        }
        Err(Ok(why)) => {
            tracing::warn!(runsc = %cfg.isolation.runsc.display(), "gVisor unavailable: {why}");
            Err(why.to_string())
        }
        Err(Err(e)) => {
            tracing::error!("gVisor backend: {e}");
            Err(
                "the gVisor backend failed to start (the operator has details in the daemon log)"
                    .into(),
            )
        }
    }
}

/// Logs where the sandboxes' run directories live: a disk file system makes every
/// create and delete pay journalled metadata work.
fn report_run_dir_fs(run_dir: &std::path::Path, fs: &sandlot_runtime::run_dir::RunDirFs) {
    use sandlot_runtime::run_dir::RunDirFs;
    let dir = run_dir.join("sandboxes");
    match fs {
        RunDirFs::Memory => {}
        RunDirFs::Mounted => tracing::info!(
            dir = %dir.display(),
            "mounted a tmpfs on the sandboxes' run directory, which was on a disk file system \
             (runtime.run_dir_tmpfs); it stays mounted across restarts"
        ),
        RunDirFs::Disk(why) => tracing::warn!(
            dir = %dir.display(),
            "the sandboxes' run directory is on a disk file system: every create and delete pays \
             disk metadata work; no tmpfs was mounted there: {why}"
        ),
    }
}

/// Deletes the records of sandboxes stopped longer ago than
/// `limits.stopped_retention`, at start and then hourly.
fn start_record_pruner(state: &Arc<AppState>) {
    let keep = state.cfg.limits.stopped_retention.0;
    if keep.is_zero() {
        return;
    }
    let st = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(3600));
        loop {
            tick.tick().await;
            let cutoff = store::now_ms() - keep.as_millis() as i64;
            let s = st.clone();
            match tokio::task::spawn_blocking(move || s.store.prune_stopped(cutoff)).await {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => tracing::info!(records = n, "pruned stopped sandboxes"),
                Ok(Err(e)) => tracing::warn!("prune stopped sandboxes: {e}"),
                Err(e) => tracing::warn!("prune stopped sandboxes: {e}"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_daemon_cannot_take_an_id_prefix_in_use() {
        let lock_dir =
            std::env::temp_dir().join(format!("sandlot-prefix-lock-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&lock_dir);
        let first = lock_id_prefix(&lock_dir, "sb-").unwrap();
        let pid = std::process::id();
        assert_eq!(
            std::fs::read_to_string(lock_dir.join("sb-.lock")).unwrap(),
            format!("{pid}\n")
        );
        // A flock belongs to an open file: a second open conflicts, as in another
        // process.
        let e = lock_id_prefix(&lock_dir, "sb-").unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, ServerError::PrefixInUse { .. }), "{msg}");
        assert!(msg.contains(&format!("(pid {pid})")), "{msg}");
        assert!(msg.contains("\"sb-\""), "{msg}");
        assert!(msg.contains("--id-prefix"), "{msg}");
        // Another prefix is another daemon's business.
        let other = lock_id_prefix(&lock_dir, "t1-").unwrap();
        // Once the first daemon is gone, the prefix is free again, and its lock
        // file is gone with it.
        drop(first);
        assert!(!lock_dir.join("sb-.lock").exists());
        let again = lock_id_prefix(&lock_dir, "sb-").unwrap();
        drop((other, again));
        std::fs::remove_dir_all(&lock_dir).unwrap();
    }

    #[test]
    fn daemon_id_prefixes_are_the_default_and_every_locked_prefix() {
        let lock_dir =
            std::env::temp_dir().join(format!("sandlot-prefix-list-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&lock_dir);
        // No lock directory yet (no daemon has run since boot): the default only.
        assert_eq!(daemon_id_prefixes_in(&lock_dir), vec!["sb-".to_string()]);
        let live = lock_id_prefix(&lock_dir, "tenant7_").unwrap();
        // A file left by a killed daemon counts as well: it will come back.
        std::fs::write(lock_dir.join("killed-.lock"), "123\n").unwrap();
        std::fs::write(lock_dir.join("sb-.lock"), "").unwrap();
        std::fs::write(lock_dir.join("notes.txt"), "").unwrap();
        let mut got = daemon_id_prefixes_in(&lock_dir);
        got.sort();
        assert_eq!(got, vec!["killed-", "sb-", "tenant7_"]);
        drop(live);
        std::fs::remove_dir_all(&lock_dir).unwrap();
    }
}
