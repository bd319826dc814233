//! The operator's view of tenants: `GET /v1/tenants`.

use serde::{Deserialize, Serialize};

/// Every tenant the daemon knows: those the configuration gives quotas
/// (`[tenants.NAME]`) and those of its tokens, sandboxes (stopped records
/// included) and snapshots, by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TenantList {
    pub tenants: Vec<Tenant>,
}

/// One tenant: its quota and what it holds now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Tenant {
    pub name: String,
    /// Whether the configuration names it (`[tenants.NAME]`); otherwise the
    /// default `[quotas]` apply.
    pub configured: bool,
    pub quota: TenantQuota,
    pub usage: TenantUsage,
}

/// A tenant's quota, as the configuration sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TenantQuota {
    /// Sandboxes at once, live and paused.
    pub max_sandboxes: u32,
    /// Sum of the memory limits of the live sandboxes, in bytes.
    pub max_memory_bytes: u64,
    /// Snapshots kept at once.
    pub max_snapshots: u32,
    /// Bytes its snapshots and checkpoints may hold together.
    pub max_saved_disk_bytes: u64,
}

/// What a tenant holds now, counted as its quota counts it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TenantUsage {
    /// Sandboxes creating, running, pausing, resuming or stopping.
    pub sandboxes_live: u64,
    /// Paused sandboxes (they count against `max_sandboxes` too).
    pub sandboxes_paused: u64,
    /// Sum of the live sandboxes' memory limits (what `max_memory_bytes` bounds).
    pub memory_limit_bytes: u64,
    /// Memory charged to its running sandboxes now.
    pub memory_in_use_bytes: u64,
    /// CPU time its running sandboxes have used since they started.
    pub cpu_seconds: f64,
    /// Snapshots kept (those being made included).
    pub snapshots: u64,
    /// Bytes its snapshots and checkpoints hold.
    pub saved_bytes: u64,
    /// Its tokens not revoked.
    pub active_tokens: u64,
}
