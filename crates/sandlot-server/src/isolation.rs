//! The daemon's isolation backends (`[isolation]`): the namespace backend, and the
//! gVisor backend where `runsc` is installed and recent enough; the operator's
//! default, ceiling and minimum of what a sandbox may run under.

use std::sync::Arc;

use sandlot_proto::spec::{Isolation, SandboxSpec};
use sandlot_runtime::Backend;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// One backend per [`Isolation`], or why it is not available on this host (a
/// message for tenants: it names no host path).
pub struct Backends {
    namespace: Arc<dyn Backend>,
    gvisor: Result<Arc<dyn Backend>, String>,
}

impl Backends {
    pub fn new(namespace: Arc<dyn Backend>, gvisor: Result<Arc<dyn Backend>, String>) -> Backends {
        Backends { namespace, gvisor }
    }

    /// `backend` for namespace sandboxes, and no gVisor (the fake backend of the
    /// daemon's unprivileged tests).
    pub fn only(backend: Arc<dyn Backend>) -> Backends {
        Backends::new(
            backend,
            Err("this daemon was started without a gVisor backend".into()),
        )
    }

    /// The backend of `isolation`, or why there is none.
    pub fn get(&self, isolation: Isolation) -> Result<&Arc<dyn Backend>, &str> {
        match isolation {
            Isolation::Namespace => Ok(&self.namespace),
            Isolation::Gvisor => self.gvisor.as_ref().map_err(String::as_str),
        }
    }

    /// Every backend this daemon has.
    pub fn available(&self) -> impl Iterator<Item = &Arc<dyn Backend>> {
        std::iter::once(&self.namespace).chain(self.gvisor.as_ref().ok())
    }
}

/// The isolation a recorded spec names (`namespace` when it names none).
pub fn of_record(spec: &serde_json::Value) -> Isolation {
    spec.get("isolation")
        .and_then(|v| v.as_str())
        .and_then(Isolation::parse)
        .unwrap_or_default()
}

/// Create-time checks of a spec's isolation: the operator's default when the
/// request names none (`given` false), 400 above the operator's ceiling, 409 when
/// this daemon cannot provide it (naming what is missing).
pub fn admit(state: &AppState, spec: &mut SandboxSpec, given: bool) -> ApiResult<()> {
    let cfg = &state.cfg.isolation;
    if !given {
        spec.isolation = cfg.default;
    }
    permitted(state, spec.isolation)?;
    memory_floor(spec).map_err(|why| ApiError::invalid("resources.memory", why))?;
    state
        .backends
        .get(spec.isolation)
        .map(|_| ())
        .map_err(|why| unavailable(spec.isolation, why))
}

/// The smallest memory limit a created gVisor sandbox may have: its own kernel,
/// counted under the limit, takes about 16 MiB.
const GVISOR_MIN_MEMORY: u64 = 32 << 20;

/// Why `spec`'s `resources.memory` is too little for its isolation, if it is
/// (a create's spec, a pool's shape).
pub fn memory_floor(spec: &SandboxSpec) -> Result<(), String> {
    if spec.isolation == Isolation::Gvisor && spec.resources.memory.0 < GVISOR_MIN_MEMORY {
        return Err(format!(
            "{} is too little for a gVisor sandbox: use at least 32M (gVisor's own kernel uses about 16 MiB of it)",
            spec.resources.memory
        ));
    }
    Ok(())
}

/// 400 when the operator's `[isolation]` ceiling or minimum rules `isolation`
/// out. Every create passes here (`sandbox::create`), whatever made its spec: an
/// API or E2B request, a pool, a build step.
pub fn permitted(state: &AppState, isolation: Isolation) -> ApiResult<()> {
    state
        .cfg
        .isolation
        .permits(isolation)
        .map_err(|why| ApiError::invalid("isolation", why))
}

/// The 409 of a create asking for an isolation this daemon does not have.
pub fn unavailable(isolation: Isolation, why: &str) -> ApiError {
    let mut e = ApiError::conflict(format!(
        "isolation {:?} is not available on this daemon: {why}",
        isolation.as_str()
    ));
    e.field = Some("isolation".into());
    e
}
