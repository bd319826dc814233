//! The tenant's view of sandboxes, which every operation on one goes through: a
//! sandbox by id or name, another tenant's "not found" (never "forbidden"), and
//! the live handle of a running one.

use std::sync::Arc;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::sandbox::SandboxHandle;
use crate::state::AppState;
use crate::store::{SandboxRecord, SandboxState};

/// The sandbox record `id` (or, failing that, the live sandbox named `id`), if
/// the caller may see it. Others' sandboxes are "not found", never "forbidden".
pub fn lookup(state: &AppState, p: &Principal, id: &str) -> ApiResult<SandboxRecord> {
    let not_found = || ApiError::not_found(format!("no sandbox {id}"));
    if let Some(r) = state.store.get_sandbox(id).map_err(ApiError::internal)? {
        return if p.sees(&r.tenant) {
            Ok(r)
        } else {
            Err(not_found())
        };
    }
    let f = crate::store::SandboxFilter {
        tenant: p.scope.clone(),
        name: Some(id.to_string()),
        limit: 2,
        ..Default::default()
    };
    let mut found = state.store.list_sandboxes(&f).map_err(ApiError::internal)?;
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(not_found()),
        _ => Err(ApiError::conflict(format!(
            "several sandboxes are named {id}: use the id"
        ))),
    }
}

/// The live sandbox `id` for the caller: 404 if unknown to them, 409 if stopped.
pub fn live(state: &AppState, p: &Principal, id: &str) -> ApiResult<Arc<SandboxHandle>> {
    if let Some(h) = state.handle(id) {
        if p.sees(&h.tenant) {
            h.check_running()?;
            return Ok(h);
        }
        return Err(ApiError::not_found(format!("no sandbox {id}")));
    }
    let rec = lookup(state, p, id)?;
    match state.handle(&rec.id) {
        Some(h) => {
            h.check_running()?;
            Ok(h)
        }
        None if matches!(
            rec.state,
            SandboxState::Pausing | SandboxState::Paused | SandboxState::Resuming
        ) =>
        {
            Err(crate::pause::wrong_state(&rec.id, rec.state))
        }
        None => Err(ApiError::conflict(format!(
            "sandbox {} is {}",
            rec.id,
            rec.state.as_str()
        ))),
    }
}
