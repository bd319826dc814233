//! Virtual filesystem collections and shell sessions (`/v1/vfs`): the client calls.
//! The JSON types are [`sandlot_proto::api::vfs`]'s, re-exported here.

use bytes::Bytes;
use http::Method;
pub use sandlot_proto::api::vfs::*;

use crate::{conn, enc, stream, Client, Error};

/// Format of an uploaded collection body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadFormat {
    /// A tar archive of a directory (`application/x-tar`).
    Tar,
    /// A JSON-lines chunk export (`application/x-ndjson`).
    Jsonl,
}

impl UploadFormat {
    pub fn content_type(self) -> &'static str {
        match self {
            UploadFormat::Tar => "application/x-tar",
            UploadFormat::Jsonl => "application/x-ndjson",
        }
    }
}

fn acl_query(acl: &VfsAcl) -> String {
    let mut q = String::new();
    if let Some(d) = &acl.default {
        q.push_str(&format!("&acl_default={}", enc(d)));
    }
    for r in &acl.rules {
        q.push_str(&format!(
            "&acl={}",
            enc(&format!("{}={}", r.pattern, r.acl))
        ));
    }
    q
}

impl Client {
    /// Creates a collection from a daemon-side source.
    pub async fn create_collection(&self, req: &CreateCollection) -> Result<IngestAnswer, Error> {
        self.json(Method::POST, "/v1/vfs", Some(req)).await
    }

    /// Creates a collection from an uploaded tar archive or JSONL export.
    pub async fn create_collection_upload<S>(
        &self,
        name: &str,
        format: UploadFormat,
        acl: &VfsAcl,
        body: S,
    ) -> Result<IngestAnswer, Error>
    where
        S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + Sync + 'static,
    {
        let path = format!("/v1/vfs?name={}{}", enc(name), acl_query(acl));
        self.upload_json(&path, format, body).await
    }

    async fn upload_json<S, T>(&self, path: &str, format: UploadFormat, body: S) -> Result<T, Error>
    where
        S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + Sync + 'static,
        T: serde::de::DeserializeOwned,
    {
        let resp = self
            .send(
                Method::POST,
                path,
                Some(format.content_type()),
                conn::streaming(body),
            )
            .await?;
        let b = stream::collect(resp).await?;
        serde_json::from_slice(&b).map_err(|e| Error::Decode(format!("{path}: {e}")))
    }

    pub async fn list_collections(&self) -> Result<Vec<CollectionView>, Error> {
        let l: CollectionList = self.json(Method::GET, "/v1/vfs", None::<&()>).await?;
        Ok(l.collections)
    }

    pub async fn get_collection(&self, name: &str) -> Result<CollectionView, Error> {
        self.json(Method::GET, &format!("/v1/vfs/{}", enc(name)), None::<&()>)
            .await
    }

    /// Removes a collection (its open sessions are closed).
    pub async fn delete_collection(&self, name: &str) -> Result<CollectionView, Error> {
        self.json(
            Method::DELETE,
            &format!("/v1/vfs/{}", enc(name)),
            None::<&()>,
        )
        .await
    }

    /// Re-ingests from the stored source or a new one; only changes are fetched.
    pub async fn ingest_collection(
        &self,
        name: &str,
        req: &IngestCollection,
    ) -> Result<IngestAnswer, Error> {
        self.json(
            Method::POST,
            &format!("/v1/vfs/{}/ingest", enc(name)),
            Some(req),
        )
        .await
    }

    /// Re-ingests from a new upload.
    pub async fn ingest_collection_upload<S>(
        &self,
        name: &str,
        format: UploadFormat,
        acl: Option<&VfsAcl>,
        body: S,
    ) -> Result<IngestAnswer, Error>
    where
        S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + Sync + 'static,
    {
        let q = acl.map(acl_query).unwrap_or_default();
        let path = format!("/v1/vfs/{}/ingest?{}", enc(name), q.trim_start_matches('&'));
        self.upload_json(&path, format, body).await
    }

    pub async fn open_vfs_session(
        &self,
        collection: &str,
        req: &OpenSession,
    ) -> Result<VfsSession, Error> {
        self.json(
            Method::POST,
            &format!("/v1/vfs/{}/sessions", enc(collection)),
            Some(req),
        )
        .await
    }

    pub async fn get_vfs_session(&self, collection: &str, sid: &str) -> Result<VfsSession, Error> {
        self.json(
            Method::GET,
            &format!("/v1/vfs/{}/sessions/{}", enc(collection), enc(sid)),
            None::<&()>,
        )
        .await
    }

    /// Runs one command line in a session.
    pub async fn vfs_run(
        &self,
        collection: &str,
        sid: &str,
        command: &str,
    ) -> Result<RunResult, Error> {
        self.json(
            Method::POST,
            &format!("/v1/vfs/{}/sessions/{}/run", enc(collection), enc(sid)),
            Some(&RunCommand {
                command: command.to_string(),
            }),
        )
        .await
    }

    pub async fn close_vfs_session(&self, collection: &str, sid: &str) -> Result<(), Error> {
        self.no_content(
            Method::DELETE,
            &format!("/v1/vfs/{}/sessions/{}", enc(collection), enc(sid)),
            None::<&()>,
        )
        .await
    }

    /// Audited command lines of a collection, oldest first.
    pub async fn vfs_audit(
        &self,
        collection: &str,
        principal: Option<&str>,
        last: Option<usize>,
    ) -> Result<Vec<AuditEntry>, Error> {
        let mut q = Vec::new();
        if let Some(p) = principal {
            q.push(format!("principal={}", enc(p)));
        }
        if let Some(n) = last {
            q.push(format!("last={n}"));
        }
        let l: AuditList = self
            .json(
                Method::GET,
                &format!("/v1/vfs/{}/audit?{}", enc(collection), q.join("&")),
                None::<&()>,
            )
            .await?;
        Ok(l.records)
    }
}
