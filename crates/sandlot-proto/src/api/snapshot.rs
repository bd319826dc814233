//! Snapshots: saved states of a sandbox that belong to its tenant and outlive
//! it (`/v1/sandboxes/{id}/snapshots`, `/v1/snapshots`).

use serde::{Deserialize, Serialize};

use super::PauseKind;

/// `POST /v1/sandboxes/{id}/snapshots` (the body is optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    /// A name of the caller's (1 to 64 characters, not unique).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A checkpoint of the sandbox to promote: it leaves the sandbox's
    /// checkpoints and becomes the snapshot. Absent: a fresh checkpoint of the
    /// sandbox is taken (it runs on, or stays paused if it was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
}

/// A saved state of a sandbox that belongs to its tenant: kept after the
/// sandbox ends and across daemon restarts, until deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Snapshot {
    pub id: String,
    pub name: Option<String>,
    /// The sandbox it was taken of (which may have ended since).
    pub sandbox_id: String,
    /// RFC 3339 (UTC).
    pub created_at: String,
    /// `memory` (gVisor: processes, memory and files; a sandbox started from it
    /// continues its processes) or `filesystem` (namespace backend: files only;
    /// a sandbox started from it starts its processes afresh).
    pub kind: PauseKind,
    /// Whether its processes and memory are kept (`kind` is `memory`).
    pub memory: bool,
    /// Bytes it holds on the host's disk, counted against the tenant's
    /// `max_saved_disk` (a `filesystem` snapshot's image: the bytes of its
    /// layers).
    pub size: u64,
}

/// `GET /v1/snapshots`, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SnapshotList {
    pub snapshots: Vec<Snapshot>,
}

/// `POST /v1/snapshots/{id}/sandboxes` (the body is optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct StartFromSnapshot {
    /// Lifetime of the new sandbox in seconds (default: the lifetime the
    /// snapshot's sandbox was created with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
}
