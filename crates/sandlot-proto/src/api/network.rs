//! Network policy audit: `/v1/sandboxes/{id}/network/log`.

use serde::{Deserialize, Serialize};

/// One DNS query or TCP connection attempt of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NetLogEntry {
    /// Increasing; pass the last one seen as `after` to page.
    pub seq: i64,
    /// RFC 3339.
    pub at: String,
    /// `dns` or `tcp`.
    pub kind: String,
    /// The name queried (DNS) or presented (TLS SNI, HTTP Host).
    pub name: Option<String>,
    /// Destination address: the one dialled, or the one connected to when allowed.
    pub addr: Option<String>,
    pub port: Option<u16>,
    /// `allowed`, `denied` or `failed` (allowed by policy, but the destination
    /// did not answer).
    pub decision: String,
    pub reason: String,
    /// Bytes sent by the sandbox.
    pub bytes_out: u64,
    /// Bytes received by the sandbox.
    pub bytes_in: u64,
}

/// `GET /v1/sandboxes/{id}/network/log`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NetLog {
    pub entries: Vec<NetLogEntry>,
}
