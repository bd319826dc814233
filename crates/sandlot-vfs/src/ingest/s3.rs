//! S3-compatible buckets through `object_store`.
//!
//! Credentials come from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`
//! (and `AWS_SESSION_TOKEN`). Without them requests are unsigned (public
//! buckets): the reader never falls back to instance-metadata endpoints.

use std::collections::BTreeMap;

use futures_util::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjPath;
use object_store::ObjectStore;

use super::{IngestError, Listing, S3Options, SourceEntry, SourceReader};

pub(crate) struct S3Reader {
    bucket: String,
    prefix: String,
    store: AmazonS3,
    rt: tokio::runtime::Runtime,
}

impl S3Reader {
    pub(crate) fn new(
        bucket: String,
        prefix: String,
        opts: S3Options,
    ) -> Result<Self, IngestError> {
        let err = |reason: String| IngestError::S3 {
            op: "connect",
            bucket: bucket.clone(),
            key: prefix.clone(),
            reason,
        };
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let region = opts
            .region
            .clone()
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".to_string());
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&bucket)
            .with_region(region)
            .with_allow_http(opts.allow_http);
        if let Some(ep) = &opts.endpoint {
            b = b.with_endpoint(ep);
        }
        let explicit = opts.credentials.clone();
        let (id, secret, token) = match explicit {
            Some(c) => (
                Some(c.access_key_id),
                Some(c.secret_access_key),
                c.session_token,
            ),
            None if opts.no_env_credentials => (None, None, None),
            None => (
                env("AWS_ACCESS_KEY_ID"),
                env("AWS_SECRET_ACCESS_KEY"),
                env("AWS_SESSION_TOKEN"),
            ),
        };
        match (id, secret) {
            (Some(id), Some(secret)) => {
                b = b.with_access_key_id(id).with_secret_access_key(secret);
                if let Some(tok) = token {
                    b = b.with_token(tok);
                }
            }
            (None, None) => b = b.with_skip_signature(true),
            _ => {
                return Err(err(
                    "set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or neither for anonymous access"
                        .into(),
                ))
            }
        }
        let store = b.build().map_err(|e| err(e.to_string()))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| err(format!("start runtime: {e}")))?;
        Ok(S3Reader {
            bucket,
            prefix,
            store,
            rt,
        })
    }
}

impl SourceReader for S3Reader {
    fn list(&mut self) -> Result<Listing, IngestError> {
        let prefix = if self.prefix.is_empty() {
            None
        } else {
            Some(ObjPath::from(self.prefix.as_str()))
        };
        let metas = self.rt.block_on(async {
            let mut out = Vec::new();
            let mut stream = self.store.list(prefix.as_ref());
            while let Some(item) = stream.next().await {
                out.push(item);
            }
            out
        });
        let mut entries = Vec::new();
        let mut skipped = Vec::new();
        let mut metas_sizes: Vec<(String, u64)> = Vec::new();
        for m in metas {
            let m = m.map_err(|e| IngestError::S3 {
                op: "list",
                bucket: self.bucket.clone(),
                key: self.prefix.clone(),
                reason: e.to_string(),
            })?;
            let key = m.location.to_string();
            metas_sizes.push((key.clone(), m.size));
            let rel = if self.prefix.is_empty() {
                key.as_str()
            } else {
                match key
                    .strip_prefix(&self.prefix)
                    .and_then(|r| r.strip_prefix('/'))
                {
                    Some(r) => r,
                    None => {
                        skipped.push(format!("{key}: outside prefix {}", self.prefix));
                        continue;
                    }
                }
            };
            if rel.is_empty() || key.ends_with('/') {
                continue; // directory marker
            }
            if let Err(e) = crate::manifest::validate_path(rel) {
                skipped.push(format!("{key}: {e}"));
                continue;
            }
            let mut metadata = BTreeMap::new();
            let tag = match &m.e_tag {
                Some(etag) => {
                    metadata.insert("etag".to_string(), serde_json::Value::String(etag.clone()));
                    format!("s3:etag:{etag}:{}", m.size)
                }
                None => format!(
                    "s3:{}:{}",
                    m.size,
                    m.last_modified.timestamp_nanos_opt().unwrap_or(0)
                ),
            };
            entries.push(SourceEntry {
                path: rel.to_string(),
                tag,
                mtime: m.last_modified.timestamp(),
                acl: None,
                metadata,
                inline: None,
                locator: key.clone(),
            });
        }
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        // object_store drops the trailing '/' of directory-marker keys
        // ("dir/"), so an empty object that cannot be read back under the
        // normalized name is a marker, not a document.
        let zero: Vec<String> = metas_sizes
            .iter()
            .filter(|(_, size)| *size == 0)
            .map(|(k, _)| k.clone())
            .collect();
        let mut markers = std::collections::HashSet::new();
        for key in zero {
            let loc = ObjPath::from(key.as_str());
            let res = self.rt.block_on(self.store.head(&loc));
            match res {
                Ok(_) => {}
                Err(object_store::Error::NotFound { .. }) => {
                    markers.insert(key);
                }
                Err(e) => {
                    return Err(IngestError::S3 {
                        op: "head",
                        bucket: self.bucket.clone(),
                        key,
                        reason: e.to_string(),
                    })
                }
            }
        }
        entries.retain(|e| !markers.contains(&e.locator));
        Ok(Listing {
            entries,
            skipped,
            empty_dirs: Vec::new(),
        })
    }

    fn fetch(&mut self, entry: &SourceEntry) -> Result<Vec<u8>, IngestError> {
        let loc = ObjPath::from(entry.locator.as_str());
        let res = self.rt.block_on(async {
            let r = self.store.get(&loc).await?;
            r.bytes().await
        });
        res.map(|b| b.to_vec()).map_err(|e| IngestError::S3 {
            op: "get",
            bucket: self.bucket.clone(),
            key: entry.locator.clone(),
            reason: e.to_string(),
        })
    }
}
