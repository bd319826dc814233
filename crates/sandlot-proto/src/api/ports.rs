//! Raw TCP ports of a sandbox published on the daemon's host: `/v1/sandboxes/{id}/ports`.

use serde::{Deserialize, Serialize};

/// `POST /v1/sandboxes/{id}/ports`: publish a TCP port of the sandbox on the host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PublishPort {
    /// The port inside the sandbox (1 to 65535); reached on its loopback.
    pub port: u32,
    /// The host port; absent: a free one from the operator's range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_port: Option<u32>,
    /// The host address to listen on; absent: the operator's first allowed one
    /// (loopback by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind: Option<String>,
}

/// A sandbox port published on the daemon's host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PublishedPort {
    /// The port inside the sandbox.
    pub port: u16,
    /// The host address listened on.
    pub host: String,
    pub host_port: u16,
    /// `host:port` (IPv6 in brackets), ready to dial.
    pub address: String,
    /// RFC 3339.
    pub created_at: String,
}

/// `GET /v1/sandboxes/{id}/ports`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PortList {
    pub ports: Vec<PublishedPort>,
}
