//! A sandbox's resource use over time: `GET /v1/sandboxes/{id}/metrics`.

use serde::{Deserialize, Serialize};

/// Samples of a running sandbox's CPU and memory, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MetricsHistory {
    /// Seconds between kept samples now: 5 while the sandbox is young; each time
    /// the history is full, every other sample is dropped and this doubles, so
    /// the whole life stays in a bounded history.
    pub interval_seconds: u32,
    pub samples: Vec<MetricsSample>,
}

/// The sandbox's use at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MetricsSample {
    /// When it was taken (RFC 3339, UTC).
    pub at: String,
    /// The same, in milliseconds since the Unix epoch.
    pub at_unix_ms: i64,
    /// CPU time used since the sandbox started (all its processes).
    pub cpu_seconds: f64,
    /// CPU cores in use on average since the sample before (1.0 = one core busy).
    pub cpu_cores: f64,
    /// Memory charged to the sandbox (its cgroup) at that moment.
    pub memory_bytes: u64,
}
