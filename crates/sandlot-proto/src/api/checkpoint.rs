//! Checkpoints of a sandbox and forks: `/v1/sandboxes/{id}/checkpoints` and
//! `/v1/sandboxes/{id}/fork`.

use serde::{Deserialize, Serialize};

use super::{PauseKind, Sandbox, SandboxState};

fn yes() -> bool {
    true
}

/// `POST /v1/sandboxes/{id}/checkpoints` (the body is optional).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateCheckpoint {
    /// A name of the caller's (1 to 64 characters, not unique).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Whether the sandbox runs on after the checkpoint (default true); false
    /// leaves it paused (`POST .../resume` starts it again).
    #[serde(default = "yes")]
    pub leave_running: bool,
}

impl Default for CreateCheckpoint {
    fn default() -> Self {
        CreateCheckpoint {
            name: None,
            leave_running: true,
        }
    }
}

/// A saved state of a sandbox: its files, and on gVisor its memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Checkpoint {
    pub id: String,
    pub sandbox_id: String,
    pub name: Option<String>,
    /// The checkpoint the sandbox's state came from when this one was taken (a
    /// restore or a fork sets it): the checkpoints of a sandbox form a tree.
    pub parent: Option<String>,
    /// RFC 3339 (UTC).
    pub created_at: String,
    /// `memory` (gVisor: processes, memory and files) or `filesystem` (namespace
    /// backend: files only; a restore or fork starts its processes afresh).
    pub kind: PauseKind,
    /// Whether its processes and memory are kept (`kind` is `memory`).
    pub memory: bool,
    /// Bytes it holds on the host's disk (its memory image and files; for a
    /// `filesystem` checkpoint, the image its files were committed to is counted
    /// by the image store).
    pub size: u64,
    /// In the answer to a create only: the sandbox's state once the checkpoint
    /// is taken (`running`, or `paused` when it was asked to stay paused or its
    /// resume after the checkpoint failed; the checkpoint is kept either way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_state: Option<SandboxState>,
}

/// `GET /v1/sandboxes/{id}/checkpoints`, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CheckpointList {
    pub checkpoints: Vec<Checkpoint>,
}

/// `POST /v1/sandboxes/{id}/fork`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// How many sandboxes (1 to the operator's `limits.max_fork_count`).
    #[serde(default = "one")]
    pub count: u32,
    /// A checkpoint of the sandbox to fork from; absent: a fresh checkpoint of
    /// the running sandbox (which runs on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
}

fn one() -> u32 {
    1
}

impl Default for ForkRequest {
    fn default() -> Self {
        ForkRequest {
            count: 1,
            checkpoint: None,
        }
    }
}

/// The answer to a fork or to a restore in place.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Forked {
    /// The checkpoint they continue from.
    pub checkpoint: String,
    /// `memory`: their processes continue from the checkpoint's; `filesystem`:
    /// they have its files, and their processes started afresh.
    pub kind: PauseKind,
    pub sandboxes: Vec<Sandbox>,
}

/// The answer to `POST /v1/sandboxes/{id}/checkpoints/{cp}/restore`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Restored {
    pub checkpoint: String,
    /// `memory`: processes, memory and files as at the checkpoint;
    /// `filesystem`: its files, its processes started afresh.
    pub kind: PauseKind,
    pub sandbox: Sandbox,
}

/// `GET /v1/sandboxes/{id}/checkpoints/{cp}/diff?against=OTHER`: the absolute
/// paths of the files that are in `OTHER` and not in `cp` (`added`), in both but different (`changed`), in `cp` only (`removed`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CheckpointDiff {
    pub added: Vec<String>,
    pub changed: Vec<String>,
    pub removed: Vec<String>,
}
