//! File operations of the client: streamed reads and writes, listings, metadata,
//! and watches.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use sandlot_proto::guest::{
    stream, DirEntry, FileStat, ListDirRequest, MkdirRequest, ReadFileRequest, RemoveRequest,
    RenameRequest, Reply, Request, StatRequest, WatchEvent, WatchRequest, WriteFileRequest,
};
use serde::de::DeserializeOwned;
use tokio::io::AsyncWrite;

use super::{unexpected, Channel, ClientError, Event, GuestClient, InputSink, OUTPUT_WINDOW};

/// Longest NDJSON record (a directory entry, a watch event) the client buffers: a
/// path of a few kilobytes and at most 64 extended attributes of 4 KiB, escaped.
pub const MAX_RECORD: usize = 2 << 20;

/// A file being downloaded, chunk by chunk.
pub struct FileDownload {
    chan: Channel,
    stat: FileStat,
    consumed: u32,
    /// Bytes the request asked for and not delivered yet (None: to the end).
    left: Option<u64>,
}

impl FileDownload {
    /// Metadata of the file when it was opened.
    pub fn stat(&self) -> &FileStat {
        &self.stat
    }

    /// The next chunk; `Ok(None)` at the end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, ClientError> {
        loop {
            match self.chan.recv().await? {
                Event::Data(_, b) => {
                    if let Some(left) = &mut self.left {
                        *left = left.checked_sub(b.len() as u64).ok_or_else(|| {
                            ClientError::Protocol(format!(
                                "read_file {:?}: more data than the request asked for",
                                self.stat.path
                            ))
                        })?;
                    }
                    self.consumed += b.len() as u32;
                    if self.consumed >= OUTPUT_WINDOW / 4 {
                        self.chan.grant(stream::OUTPUT, self.consumed);
                        self.consumed = 0;
                    }
                    return Ok(Some(b));
                }
                Event::Eof => continue,
                Event::End => return Ok(None),
                Event::Reply(Reply::Error(e)) => {
                    return Err(ClientError::remote("read_file", e));
                }
                Event::Reply(other) => return Err(unexpected("read_file", &other)),
            }
        }
    }

    /// Reads everything that is left.
    pub async fn read_to_end(mut self) -> Result<Vec<u8>, ClientError> {
        // The size is the agent's word: reserve little ahead of the data itself.
        let mut v = Vec::with_capacity(self.stat.size.min(1 << 20) as usize);
        while let Some(c) = self.chunk().await? {
            v.extend_from_slice(&c);
        }
        Ok(v)
    }
}

/// A file being uploaded. Written atomically (unless appending): the file appears
/// at its path only when [`FileUpload::finish`] succeeds; dropping an unfinished
/// upload discards it.
pub struct FileUpload {
    chan: Channel,
    sink: Option<InputSink>,
}

impl FileUpload {
    /// Sends `data`, waiting for flow-control credit.
    pub async fn write(&mut self, data: &[u8]) -> Result<(), ClientError> {
        let Some(sink) = &mut self.sink else {
            return Err(ClientError::Io(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "upload already finished",
            )));
        };
        if let Err(e) = sink.write_all(data).await {
            // The agent may have failed the write (disk full...): report its reason.
            return Err(self.failure().await.unwrap_or(ClientError::Io(e)));
        }
        Ok(())
    }

    async fn failure(&mut self) -> Option<ClientError> {
        loop {
            match self.chan.recv().await {
                Ok(Event::Reply(Reply::Error(e))) => {
                    return Some(ClientError::remote("write_file", e))
                }
                Ok(Event::End) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// Ends the upload and puts the file in place. Returns the bytes written.
    pub async fn finish(mut self) -> Result<u64, ClientError> {
        if let Some(mut s) = self.sink.take() {
            s.close();
        }
        let r = self.chan.reply("write_file").await?;
        self.chan.finish().await?;
        match r {
            Reply::Written { bytes } => Ok(bytes),
            other => Err(unexpected("write_file", &other)),
        }
    }
}

impl AsyncWrite for FileUpload {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().sink {
            Some(s) => s.poll_write(cx, buf),
            None => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "upload already finished",
            ))),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Does not finish the upload (that needs the agent's answer): call
    /// [`FileUpload::finish`].
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl Drop for FileUpload {
    fn drop(&mut self) {
        // Closing the input would commit the file: cancel instead (the Channel's
        // drop sends CANCEL and the agent removes the temporary file).
        if let Some(mut s) = self.sink.take() {
            s.forget();
        }
    }
}

/// Newline-delimited JSON records on stream 1.
struct Ndjson {
    chan: Channel,
    buf: BytesMut,
    /// Bytes at the start of `buf` known to hold no newline.
    scanned: usize,
    op: &'static str,
    ended: bool,
}

impl Ndjson {
    async fn next<T: DeserializeOwned>(&mut self) -> Result<Option<T>, ClientError> {
        loop {
            if let Some(pos) = self.buf[self.scanned..].iter().position(|&b| b == b'\n') {
                let line = self.buf.split_to(self.scanned + pos + 1);
                let pos = line.len() - 1;
                self.scanned = 0;
                let v = serde_json::from_slice(&line[..pos]).map_err(|e| {
                    ClientError::Protocol(format!("{}: invalid record: {e}", self.op))
                })?;
                return Ok(Some(v));
            }
            if self.ended {
                if !self.buf.is_empty() {
                    return Err(ClientError::Protocol(format!(
                        "{}: stream ended inside a record",
                        self.op
                    )));
                }
                return Ok(None);
            }
            self.scanned = self.buf.len();
            if self.buf.len() > MAX_RECORD {
                return Err(ClientError::Protocol(format!(
                    "{}: a record longer than {MAX_RECORD} bytes",
                    self.op
                )));
            }
            match self.chan.recv().await? {
                Event::Data(_, b) => {
                    self.chan.grant(stream::OUTPUT, b.len() as u32);
                    self.buf.extend_from_slice(b.chunk());
                }
                Event::Eof => {}
                Event::End => self.ended = true,
                Event::Reply(Reply::Error(e)) => return Err(ClientError::remote(self.op, e)),
                Event::Reply(other) => return Err(unexpected(self.op, &other)),
            }
        }
    }
}

/// A directory listing, entry by entry.
pub struct DirListing {
    inner: Ndjson,
    stat: FileStat,
}

impl DirListing {
    /// Metadata of the listed directory.
    pub fn stat(&self) -> &FileStat {
        &self.stat
    }

    /// The next entry, depth first in name order; `Ok(None)` at the end.
    pub async fn next_entry(&mut self) -> Result<Option<DirEntry>, ClientError> {
        self.inner.next().await
    }
}

/// A stream of filesystem events. Dropping it stops the watch.
pub struct Watch {
    inner: Ndjson,
}

impl Watch {
    /// The next event; `Ok(None)` when the watched path itself is gone.
    pub async fn next_event(&mut self) -> Result<Option<WatchEvent>, ClientError> {
        self.inner.next().await
    }
}

macro_rules! debug_by_channel {
    ($($t:ty => $name:literal),*) => {$(
        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct($name).finish_non_exhaustive()
            }
        }
    )*};
}
debug_by_channel!(
    FileDownload => "FileDownload",
    FileUpload => "FileUpload",
    DirListing => "DirListing",
    Watch => "Watch"
);

impl GuestClient {
    /// Opens a file for streaming.
    pub async fn read_file(&self, req: ReadFileRequest) -> Result<FileDownload, ClientError> {
        let left = req.length;
        let (mut chan, _) = self.open(&Request::ReadFile(req), &[stream::OUTPUT], false)?;
        match chan.reply("read_file").await? {
            Reply::Stat { stat } => Ok(FileDownload {
                chan,
                stat,
                consumed: 0,
                left,
            }),
            other => Err(unexpected("read_file", &other)),
        }
    }

    /// Reads a whole file as the agent's default user.
    pub async fn read_file_to_vec(&self, path: &str) -> Result<Vec<u8>, ClientError> {
        self.read_file(ReadFileRequest {
            path: path.to_string(),
            offset: 0,
            length: None,
            user: None,
        })
        .await?
        .read_to_end()
        .await
    }

    /// Starts an upload; parents are created unless `req.create_parents` is false.
    pub async fn write_file(&self, req: WriteFileRequest) -> Result<FileUpload, ClientError> {
        let (mut chan, credit) = self.open(&Request::WriteFile(req), &[], true)?;
        match chan.reply("write_file").await? {
            Reply::Ready => {
                let sink = self.sink(&chan, credit.expect("input channel"));
                Ok(FileUpload {
                    chan,
                    sink: Some(sink),
                })
            }
            other => Err(unexpected("write_file", &other)),
        }
    }

    /// Uploads `data` in one call. Returns the bytes written.
    pub async fn write_file_from(
        &self,
        req: WriteFileRequest,
        data: &[u8],
    ) -> Result<u64, ClientError> {
        let mut up = self.write_file(req).await?;
        up.write(data).await?;
        up.finish().await
    }

    /// Lists a directory tree, streaming.
    pub async fn list_dir_stream(&self, req: ListDirRequest) -> Result<DirListing, ClientError> {
        let (mut chan, _) = self.open(&Request::ListDir(req), &[stream::OUTPUT], false)?;
        match chan.reply("list_dir").await? {
            Reply::Stat { stat } => Ok(DirListing {
                inner: Ndjson {
                    chan,
                    buf: BytesMut::new(),
                    scanned: 0,
                    op: "list_dir",
                    ended: false,
                },
                stat,
            }),
            other => Err(unexpected("list_dir", &other)),
        }
    }

    /// Lists a directory tree into a vector.
    pub async fn list_dir(&self, req: ListDirRequest) -> Result<Vec<DirEntry>, ClientError> {
        let mut l = self.list_dir_stream(req).await?;
        let mut v = Vec::new();
        while let Some(e) = l.next_entry().await? {
            v.push(e);
        }
        Ok(v)
    }

    pub async fn stat(&self, req: StatRequest) -> Result<FileStat, ClientError> {
        match self.call(Request::Stat(req)).await? {
            Reply::Stat { stat } => Ok(stat),
            other => Err(unexpected("stat", &other)),
        }
    }

    pub async fn mkdir(&self, req: MkdirRequest) -> Result<(), ClientError> {
        self.call_ok(Request::Mkdir(req)).await
    }

    pub async fn remove(&self, req: RemoveRequest) -> Result<(), ClientError> {
        self.call_ok(Request::Remove(req)).await
    }

    pub async fn rename(&self, req: RenameRequest) -> Result<(), ClientError> {
        self.call_ok(Request::Rename(req)).await
    }

    /// Watches a path; events stream until the [`Watch`] is dropped or the path
    /// is deleted.
    pub async fn watch(&self, req: WatchRequest) -> Result<Watch, ClientError> {
        let (mut chan, _) = self.open(&Request::Watch(req), &[stream::OUTPUT], false)?;
        match chan.reply("watch").await? {
            Reply::Watching => Ok(Watch {
                inner: Ndjson {
                    chan,
                    buf: BytesMut::new(),
                    scanned: 0,
                    op: "watch",
                    ended: false,
                },
            }),
            other => Err(unexpected("watch", &other)),
        }
    }
}
