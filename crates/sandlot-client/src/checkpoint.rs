//! Checkpoints of a sandbox and forks (`/v1/sandboxes/{id}/checkpoints`,
//! `/v1/sandboxes/{id}/fork`).

use http::Method;
pub use sandlot_proto::api::checkpoint::{
    Checkpoint, CheckpointDiff, CheckpointList, CreateCheckpoint, ForkRequest, Forked, Restored,
};

use crate::{enc, Client, Error};

impl Client {
    /// Takes a checkpoint of sandbox `id` (it runs on unless `leave_running` is
    /// false, then it stays paused).
    pub async fn create_checkpoint(
        &self,
        id: &str,
        req: &CreateCheckpoint,
    ) -> Result<Checkpoint, Error> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/checkpoints", enc(id)),
            Some(req),
        )
        .await
    }

    /// The checkpoints of sandbox `id`, oldest first.
    pub async fn list_checkpoints(&self, id: &str) -> Result<Vec<Checkpoint>, Error> {
        let l: CheckpointList = self
            .json(
                Method::GET,
                &format!("/v1/sandboxes/{}/checkpoints", enc(id)),
                None::<&()>,
            )
            .await?;
        Ok(l.checkpoints)
    }

    /// Deletes checkpoint `cp` of sandbox `id`.
    pub async fn delete_checkpoint(&self, id: &str, cp: &str) -> Result<(), Error> {
        self.no_content(
            Method::DELETE,
            &format!("/v1/sandboxes/{}/checkpoints/{}", enc(id), enc(cp)),
            None::<&()>,
        )
        .await
    }

    /// Restores sandbox `id` in place to its checkpoint `cp`.
    pub async fn restore_checkpoint(&self, id: &str, cp: &str) -> Result<Restored, Error> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/checkpoints/{}/restore", enc(id), enc(cp)),
            None::<&()>,
        )
        .await
    }

    /// Makes `req.count` new sandboxes that continue from a checkpoint of `id`.
    pub async fn fork_sandbox(&self, id: &str, req: &ForkRequest) -> Result<Forked, Error> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/fork", enc(id)),
            Some(req),
        )
        .await
    }

    /// The files that differ from checkpoint `a` to checkpoint `b` of sandbox `id`.
    pub async fn diff_checkpoints(
        &self,
        id: &str,
        a: &str,
        b: &str,
    ) -> Result<CheckpointDiff, Error> {
        self.json(
            Method::GET,
            &format!(
                "/v1/sandboxes/{}/checkpoints/{}/diff?against={}",
                enc(id),
                enc(a),
                enc(b)
            ),
            None::<&()>,
        )
        .await
    }
}
