//! Network policy and egress audit log of a sandbox (`/v1/sandboxes/{id}/network`).

use http::Method;
pub use sandlot_proto::api::network::{NetLog, NetLogEntry};

use crate::{Client, Error};

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
