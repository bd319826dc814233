//! Network policy and egress audit log of a sandbox (`/v1/sandboxes/{id}/network`).

use http::Method;
use serde::{Deserialize, Serialize};

use crate::{Client, Error};

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

impl Client {
    /// The sandbox's network policy (`{"mode": ..., "allow": [...]}`).
    pub async fn get_network(&self, id: &str) -> Result<serde_json::Value, Error> {
        self.json(
            Method::GET,
            &format!("/v1/sandboxes/{id}/network"),
            None::<&()>,
        )
        .await
    }

    /// Replaces a running sandbox's network policy; effective immediately.
    pub async fn set_network(
        &self,
        id: &str,
        network: &serde_json::Value,
    ) -> Result<serde_json::Value, Error> {
        self.json(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/network"),
            Some(network),
        )
        .await
    }

    /// Egress audit entries after `after` (oldest first), at most `limit`.
    pub async fn network_log(
        &self,
        id: &str,
        after: Option<i64>,
        limit: Option<u32>,
    ) -> Result<NetLog, Error> {
        let mut q = Vec::new();
        if let Some(a) = after {
            q.push(format!("after={a}"));
        }
        if let Some(l) = limit {
            q.push(format!("limit={l}"));
        }
        let qs = if q.is_empty() {
            String::new()
        } else {
            format!("?{}", q.join("&"))
        };
        self.json(
            Method::GET,
            &format!("/v1/sandboxes/{id}/network/log{qs}"),
            None::<&()>,
        )
        .await
    }
}
