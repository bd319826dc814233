//! The files of a sandbox: stat, list, read (streamed, within the sandbox's disk
//! limit), write (streamed, within `limits.max_upload`; the agent replaces a file
//! atomically unless appending), mkdir, remove, rename and watch. Errors are the
//! daemon's `ApiError`s (a guest error mapped by `ApiError::from_guest`, naming
//! the path in the sandbox); the E2B front door converts them to Connect codes.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use sandlot_guest::client::{
    ClientError, DirEntry, DirListing, FileDownload, FileStat, FileUpload, ListDirRequest,
    MkdirRequest, ReadFileRequest, RemoveRequest, RenameRequest, StatRequest, Watch, WatchEvent,
    WatchRequest, WriteFileRequest,
};
use sandlot_store::{Budget, SizeLimit};
use tokio::sync::mpsc;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::sandbox::{ActiveGuard, Counters, SandboxHandle};
use crate::state::AppState;

/// Entries a listing returns at most.
pub const MAX_LIST: usize = 100_000;

/// One sandbox's files, as one user of it.
pub struct SandboxFiles {
    state: Arc<AppState>,
    h: Arc<SandboxHandle>,
    /// The user the operations act as; `None`: the sandbox's default user.
    user: Option<String>,
}

fn guest_err(path: &str) -> impl FnOnce(ClientError) -> ApiError + '_ {
    move |e| ApiError::from_guest(e, path)
}

impl SandboxFiles {
    /// Sandbox `id` (an id or a name) of tenant `p`, as its default user: another
    /// tenant's is not found, and a paused one with `auto_resume` is resumed.
    pub async fn of_tenant(
        state: &Arc<AppState>,
        p: &Principal,
        id: &str,
    ) -> ApiResult<SandboxFiles> {
        let h = crate::autopause::live(state, p, id).await?;
        Ok(SandboxFiles {
            state: state.clone(),
            h,
            user: None,
        })
    }

    /// A sandbox its front door has already admitted the caller to (E2B's envd:
    /// by the sandbox's access token, resumed on demand by its middleware), as
    /// `user` (`None`: the sandbox's default user).
    pub fn of_handle(
        state: Arc<AppState>,
        h: Arc<SandboxHandle>,
        user: Option<String>,
    ) -> SandboxFiles {
        SandboxFiles { state, h, user }
    }

    pub fn handle(&self) -> &Arc<SandboxHandle> {
        &self.h
    }

    /// The sandbox's disk limit as a bound on what one read may return.
    pub fn read_limit(&self) -> SizeLimit {
        self.state.images.limit(Some(self.h.disk_limit))
    }

    pub async fn stat(&self, path: &str, follow: bool) -> ApiResult<FileStat> {
        self.h.touch();
        self.h
            .guest
            .stat(StatRequest {
                path: path.to_string(),
                follow,
                user: self.user.clone(),
            })
            .await
            .map_err(guest_err(path))
    }

    /// The tree under `path`, `depth` levels deep, streamed from the agent.
    pub async fn list(&self, path: &str, depth: u32) -> ApiResult<Listing> {
        self.h.touch();
        let inner = self
            .h
            .guest
            .list_dir_stream(ListDirRequest {
                path: path.to_string(),
                depth,
                user: self.user.clone(),
            })
            .await
            .map_err(guest_err(path))?;
        Ok(Listing {
            inner,
            path: path.to_string(),
        })
    }

    pub async fn mkdir(&self, path: &str, parents: bool, mode: Option<u32>) -> ApiResult<()> {
        self.h.touch();
        self.h
            .guest
            .mkdir(MkdirRequest {
                path: path.to_string(),
                parents,
                mode,
                user: self.user.clone(),
            })
            .await
            .map_err(guest_err(path))
    }

    pub async fn remove(&self, path: &str, recursive: bool) -> ApiResult<()> {
        self.h.touch();
        self.h
            .guest
            .remove(RemoveRequest {
                path: path.to_string(),
                recursive,
                user: self.user.clone(),
            })
            .await
            .map_err(guest_err(path))
    }

    /// Renames `from` to `to` (errors name `from`).
    pub async fn rename(&self, from: &str, to: &str, overwrite: bool) -> ApiResult<()> {
        self.h.touch();
        self.h
            .guest
            .rename(RenameRequest {
                from: from.to_string(),
                to: to.to_string(),
                overwrite,
                user: self.user.clone(),
            })
            .await
            .map_err(guest_err(from))
    }

    /// Watches `path`; the sandbox counts as active while the watch lives.
    pub async fn watch(&self, path: &str, recursive: bool) -> ApiResult<FileWatch> {
        let guard = self.h.active();
        let inner = self
            .h
            .guest
            .watch(WatchRequest {
                path: path.to_string(),
                recursive,
                user: self.user.clone(),
            })
            .await
            .map_err(guest_err(path))?;
        Ok(FileWatch {
            inner,
            _guard: guard,
        })
    }

    /// Opens `path` for reading `range` within the sandbox's disk limit: past it
    /// (from the file's size now) the answer is 413 `too_large` and nothing is
    /// read; a file that grows past it while it is read is cut there.
    pub async fn read(&self, path: &str, range: ReadRange) -> ApiResult<Download> {
        let guard = self.h.active();
        let plan = ReadPlan::new(path, range, self.read_limit());
        let dl = self
            .h
            .guest
            .read_file(ReadFileRequest {
                path: path.to_string(),
                offset: plan.offset,
                length: Some(plan.request_length),
                user: self.user.clone(),
            })
            .await
            .map_err(guest_err(path))?;
        plan.check_size(dl.stat().size)?;
        Ok(Download {
            dl,
            plan,
            counters: self.h.counters.clone(),
            _guard: guard,
        })
    }

    /// Exactly `length` bytes of `path` from its start, unbounded by the disk
    /// limit (the caller bounded them already: a directory archive measured as a
    /// whole), counted as the sandbox's file output as they are taken. The caller
    /// holds the sandbox's activity guard. Only the archive route may use it.
    pub(crate) async fn read_exact(&self, path: &str, length: u64) -> ApiResult<ExactRead> {
        let dl = self
            .h
            .guest
            .read_file(ReadFileRequest {
                path: path.to_string(),
                offset: 0,
                length: Some(length),
                user: self.user.clone(),
            })
            .await
            .map_err(guest_err(path))?;
        Ok(ExactRead {
            dl,
            left: length,
            counters: self.h.counters.clone(),
        })
    }

    /// Opens `path` for writing; the file appears whole when the upload is
    /// finished (unless appending), and an upload dropped unfinished is
    /// discarded.
    pub async fn write(&self, req: WriteSpec) -> ApiResult<Upload> {
        let path = req.path;
        let up = self
            .h
            .guest
            .write_file(WriteFileRequest {
                path: path.clone(),
                mode: req.mode,
                append: req.append,
                create_parents: true,
                user: self.user.clone(),
                xattrs: req.xattrs,
            })
            .await
            .map_err(guest_err(&path))?;
        Ok(Upload {
            path,
            up,
            counters: self.h.counters.clone(),
        })
    }

    /// What the request's uploads may write in all (`limits.max_upload`).
    pub fn upload_budget(&self, kind: UploadKind) -> UploadBudget {
        UploadBudget::new(self.state.cfg.limits.max_upload.bytes(), kind)
    }
}

/// A listing streamed from the agent.
pub struct Listing {
    inner: DirListing,
    path: String,
}

impl Listing {
    /// What was listed.
    pub fn root(&self) -> &FileStat {
        self.inner.stat()
    }

    pub async fn next_entry(&mut self) -> ApiResult<Option<DirEntry>> {
        self.inner.next_entry().await.map_err(guest_err(&self.path))
    }

    /// The first [`MAX_LIST`] entries, and whether there were more.
    pub async fn collect(mut self) -> ApiResult<(Vec<DirEntry>, bool)> {
        let mut entries = Vec::new();
        while let Some(e) = self.next_entry().await? {
            if entries.len() >= MAX_LIST {
                return Ok((entries, true));
            }
            entries.push(e);
        }
        Ok((entries, false))
    }
}

/// A watch of a directory; dropping it cancels it in the agent.
pub struct FileWatch {
    inner: Watch,
    _guard: ActiveGuard,
}

impl FileWatch {
    /// The next event; `None` when the watch ended or failed (the error is the
    /// caller's to show or not).
    pub async fn next_event(&mut self) -> Result<Option<WatchEvent>, ClientError> {
        self.inner.next_event().await
    }
}

/// Which part of a file a read returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadRange {
    /// The whole file (E2B's `GET /files`).
    Whole,
    /// From `offset`, at most `length` bytes (`None`: to the end).
    From { offset: u64, length: Option<u64> },
}

/// A read computed before it is made: what the agent is asked for and how the
/// bytes are bounded.
#[derive(Debug, Clone, PartialEq)]
struct ReadPlan {
    offset: u64,
    /// At most the range's length, and at most one byte past the limit: a file
    /// that grows while it is read is cut there.
    request_length: u64,
    /// The range's length (`u64::MAX`: to the end).
    length: u64,
    limit: SizeLimit,
    /// How a `too_large` error names the read.
    what: String,
}

impl ReadPlan {
    fn new(path: &str, range: ReadRange, limit: SizeLimit) -> ReadPlan {
        let (offset, length, what) = match range {
            ReadRange::Whole => (0, u64::MAX, path.to_string()),
            ReadRange::From { offset, length } => (
                offset,
                length.unwrap_or(u64::MAX),
                format!("{path} from offset {offset}"),
            ),
        };
        ReadPlan {
            offset,
            request_length: length.min(limit.bytes.saturating_add(1)),
            length,
            limit,
            what,
        }
    }

    /// 413 `too_large` if what the range covers of a file of `size` bytes is past
    /// the limit.
    fn check_size(&self, size: u64) -> ApiResult<()> {
        Budget::new(Some(&self.limit), &self.what)
            .charge(size.saturating_sub(self.offset).min(self.length))
            .map_err(|e| crate::images::store_error(e.into()))
    }
}

pub type Chunk = Result<Bytes, std::io::Error>;

/// A file being read, bounded by its [`ReadPlan`]; the sandbox counts as active
/// until it is dropped.
pub struct Download {
    dl: FileDownload,
    plan: ReadPlan,
    counters: Arc<Counters>,
    _guard: ActiveGuard,
}

impl Download {
    pub fn stat(&self) -> &FileStat {
        self.dl.stat()
    }

    /// Sends the file's chunks to `tx` (counted as the sandbox's file output)
    /// until its end or the receiver's going away. A read error or a file that
    /// grows past the limit cuts the body (an error item: the client sees a
    /// truncated transfer, never a short file) and is returned.
    pub async fn relay(mut self, tx: mpsc::Sender<Chunk>) -> Option<String> {
        let mut budget = Budget::new(Some(&self.plan.limit), &self.plan.what);
        loop {
            let err = match self.dl.chunk().await {
                Ok(Some(c)) => match budget.charge(c.len() as u64) {
                    Ok(()) => {
                        self.counters
                            .file_out
                            .fetch_add(c.len() as u64, Ordering::Relaxed);
                        if tx.send(Ok(c)).await.is_err() {
                            return None;
                        }
                        continue;
                    }
                    Err(e) => e.to_string(),
                },
                Ok(None) => return None,
                Err(e) => e.to_string(),
            };
            let _ = tx.send(Err(std::io::Error::other(err.clone()))).await;
            return Some(err);
        }
    }
}

/// At most a given number of a file's bytes.
pub struct ExactRead {
    dl: FileDownload,
    left: u64,
    counters: Arc<Counters>,
}

impl ExactRead {
    /// The next chunk, cut at the length asked for; `None` at the end of the
    /// file or of that length.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, ClientError> {
        if self.left == 0 {
            return Ok(None);
        }
        let Some(c) = self.dl.chunk().await? else {
            return Ok(None);
        };
        let take = self.left.min(c.len() as u64) as usize;
        self.left -= take as u64;
        self.counters
            .file_out
            .fetch_add(take as u64, Ordering::Relaxed);
        Ok(Some(c.slice(..take)))
    }
}

/// A file to write.
#[derive(Debug, Clone, Default)]
pub struct WriteSpec {
    pub path: String,
    /// Permission bits; `None`: those of the file it replaces, else 0644.
    pub mode: Option<u32>,
    pub append: bool,
    /// Extended attributes set on the new file before it appears.
    pub xattrs: BTreeMap<String, String>,
}

impl WriteSpec {
    pub fn new(path: impl Into<String>) -> WriteSpec {
        WriteSpec {
            path: path.into(),
            ..WriteSpec::default()
        }
    }
}

/// What a request's uploads write, which names their bound when it is passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadKind {
    /// Files sent as they are.
    Files,
    /// The files of a tar archive.
    Archive,
}

/// The bytes one request may write into a sandbox, over all its files
/// (`limits.max_upload`; 0: unbounded).
#[derive(Debug)]
pub struct UploadBudget {
    max: u64,
    used: u64,
    kind: UploadKind,
}

impl UploadBudget {
    pub fn new(max: u64, kind: UploadKind) -> UploadBudget {
        UploadBudget { max, used: 0, kind }
    }

    /// Counts `n` more bytes; 413 `payload_too_large` once past the bound.
    pub fn charge(&mut self, n: u64) -> ApiResult<()> {
        self.used = self.used.saturating_add(n);
        if self.max == 0 || self.used <= self.max {
            return Ok(());
        }
        Err(ApiError::too_large(match self.kind {
            UploadKind::Files => format!(
                "upload larger than {} (limits.max_upload)",
                sandlot_proto::units::ByteSize(self.max)
            ),
            UploadKind::Archive => "archive content larger than limits.max_upload".to_string(),
        }))
    }
}

/// A file being written.
pub struct Upload {
    path: String,
    up: FileUpload,
    counters: Arc<Counters>,
}

impl Upload {
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Writes `data` once `budget` allows it (counted as the sandbox's file
    /// input); past the budget nothing more is written, and dropping the upload
    /// discards it.
    pub async fn write(&mut self, budget: &mut UploadBudget, data: &[u8]) -> ApiResult<()> {
        budget.charge(data.len() as u64)?;
        self.up.write(data).await.map_err(guest_err(&self.path))?;
        self.counters
            .file_in
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Completes the file; answers the bytes written.
    pub async fn finish(self) -> ApiResult<u64> {
        self.up.finish().await.map_err(guest_err(&self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(bytes: u64) -> SizeLimit {
        SizeLimit {
            bytes,
            name: "the sandbox's disk limit".into(),
        }
    }

    #[test]
    fn a_range_read_asks_for_one_byte_past_the_limit_at_most() {
        let p = ReadPlan::new(
            "/a",
            ReadRange::From {
                offset: 5,
                length: None,
            },
            limit(100),
        );
        assert_eq!(p.offset, 5);
        assert_eq!(p.request_length, 101);
        assert_eq!(p.what, "/a from offset 5");
        let short = ReadPlan::new(
            "/a",
            ReadRange::From {
                offset: 0,
                length: Some(10),
            },
            limit(100),
        );
        assert_eq!(short.request_length, 10);
        let whole = ReadPlan::new("/a", ReadRange::Whole, limit(u64::MAX));
        assert_eq!((whole.offset, whole.request_length), (0, u64::MAX));
        assert_eq!(whole.what, "/a");
    }

    #[test]
    fn a_read_past_the_disk_limit_is_too_large_counting_only_its_range() {
        let whole = ReadPlan::new("/big", ReadRange::Whole, limit(100));
        assert!(whole.check_size(100).is_ok());
        let e = whole.check_size(101).unwrap_err();
        assert_eq!((e.status.as_u16(), e.code.as_str()), (413, "too_large"));
        assert!(
            e.message.starts_with("/big is larger than"),
            "{}",
            e.message
        );
        // 150 bytes from offset 60 is 90 within the limit; 10 of them is 10.
        let tail = ReadPlan::new(
            "/big",
            ReadRange::From {
                offset: 60,
                length: None,
            },
            limit(100),
        );
        assert!(tail.check_size(150).is_ok());
        assert!(tail.check_size(161).is_err());
        let part = ReadPlan::new(
            "/big",
            ReadRange::From {
                offset: 0,
                length: Some(10),
            },
            limit(100),
        );
        assert!(part.check_size(1 << 40).is_ok());
    }

    #[test]
    fn an_upload_budget_counts_every_file_of_a_request() {
        let mut b = UploadBudget::new(10, UploadKind::Files);
        b.charge(6).unwrap();
        b.charge(4).unwrap();
        let e = b.charge(1).unwrap_err();
        assert_eq!(
            (e.status.as_u16(), e.code.as_str()),
            (413, "payload_too_large")
        );
        assert!(e.message.contains("(limits.max_upload)"), "{}", e.message);
        let mut a = UploadBudget::new(3, UploadKind::Archive);
        let e = a.charge(4).unwrap_err();
        assert_eq!(e.message, "archive content larger than limits.max_upload");
    }

    #[test]
    fn an_upload_budget_of_zero_is_unbounded() {
        let mut b = UploadBudget::new(0, UploadKind::Files);
        b.charge(u64::MAX).unwrap();
        b.charge(u64::MAX).unwrap();
    }
}
