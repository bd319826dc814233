//! Snapshots: saved sandbox states of the tenant's that outlive their sandbox
//! (`/v1/sandboxes/{id}/snapshots`, `/v1/snapshots`).

use http::Method;
pub use sandlot_proto::api::snapshot::{CreateSnapshot, Snapshot, SnapshotList, StartFromSnapshot};

use crate::{enc, Client, Error, Sandbox};

impl Client {
    /// Takes a snapshot of sandbox `id` (a fresh checkpoint, or the one
    /// `req.checkpoint` names, promoted out of the sandbox).
    pub async fn create_snapshot(&self, id: &str, req: &CreateSnapshot) -> Result<Snapshot, Error> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/snapshots", enc(id)),
            Some(req),
        )
        .await
    }

    /// The caller's snapshots, oldest first (those of sandbox `sandbox` and of
    /// name `name` only, when given).
    pub async fn list_snapshots(
        &self,
        sandbox: Option<&str>,
        name: Option<&str>,
    ) -> Result<Vec<Snapshot>, Error> {
        let mut q = Vec::new();
        if let Some(s) = sandbox {
            q.push(format!("sandbox_id={}", enc(s)));
        }
        if let Some(n) = name {
            q.push(format!("name={}", enc(n)));
        }
        let path = if q.is_empty() {
            "/v1/snapshots".to_string()
        } else {
            format!("/v1/snapshots?{}", q.join("&"))
        };
        let l: SnapshotList = self.json(Method::GET, &path, None::<&()>).await?;
        Ok(l.snapshots)
    }

    /// Snapshot `sn`.
    pub async fn get_snapshot(&self, sn: &str) -> Result<Snapshot, Error> {
        self.json(
            Method::GET,
            &format!("/v1/snapshots/{}", enc(sn)),
            None::<&()>,
        )
        .await
    }

    /// Deletes snapshot `sn`, freeing its disk.
    pub async fn delete_snapshot(&self, sn: &str) -> Result<(), Error> {
        self.no_content(
            Method::DELETE,
            &format!("/v1/snapshots/{}", enc(sn)),
            None::<&()>,
        )
        .await
    }

    /// Starts a new sandbox from snapshot `sn`.
    pub async fn start_from_snapshot(
        &self,
        sn: &str,
        req: &StartFromSnapshot,
    ) -> Result<Sandbox, Error> {
        self.json(
            Method::POST,
            &format!("/v1/snapshots/{}/sandboxes", enc(sn)),
            Some(req),
        )
        .await
    }
}
