//! Frame encoding and decoding over a byte stream, shared by the agent and the client.
//! The layout itself is defined in `sandlot_proto::guest` and `docs/protocol.md`.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt};

use sandlot_proto::guest::{FrameError, FrameHeader, FrameKind, HEADER_LEN, MAX_PAYLOAD};

/// Errors reading or writing frames.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("reading frame: {0}")]
    Io(#[from] std::io::Error),
    #[error("invalid frame: {0}")]
    Frame(#[from] FrameError),
    #[error("connection closed in the middle of a frame ({have} of {want} bytes)")]
    Truncated { have: usize, want: usize },
    #[error("encoding {what}: {source}")]
    Encode {
        what: &'static str,
        source: serde_json::Error,
    },
    #[error("encoding {what}: {len} bytes exceed the maximum payload of {max}")]
    EncodeTooLarge {
        what: &'static str,
        len: usize,
        max: usize,
    },
}

/// A received frame. The payload shares the reader's buffer (no copy).
#[derive(Debug, Clone)]
pub struct Frame {
    pub kind: FrameKind,
    pub channel: u32,
    pub payload: Bytes,
}

/// Reads whole frames from a byte stream, enforcing the maximum payload.
pub struct FrameReader<R> {
    inner: R,
    buf: BytesMut,
    max_payload: usize,
}

const READ_CHUNK: usize = 128 * 1024;

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R) -> Self {
        FrameReader {
            inner,
            buf: BytesMut::with_capacity(8 * 1024),
            max_payload: MAX_PAYLOAD,
        }
    }

    /// Reads the next frame; `Ok(None)` on a clean end of stream between frames.
    /// Cancel-safe: a cancelled call loses no bytes.
    pub async fn next(&mut self) -> Result<Option<Frame>, WireError> {
        loop {
            if let Some(f) = self.parse()? {
                return Ok(Some(f));
            }
            if self.buf.capacity() - self.buf.len() < 4096 {
                // Large enough for the frame being assembled, in one step.
                let want = self.pending_len().max(READ_CHUNK);
                self.buf.reserve(want);
            }
            let n = self.inner.read_buf(&mut self.buf).await?;
            if n == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(WireError::Truncated {
                    have: self.buf.len(),
                    want: self.pending_len().max(HEADER_LEN),
                });
            }
        }
    }

    /// Total length of the frame at the head of the buffer, if its header is in.
    fn pending_len(&self) -> usize {
        if self.buf.len() < 4 {
            return HEADER_LEN;
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
        4 + (len as usize).min(self.max_payload + 5)
    }

    fn parse(&mut self) -> Result<Option<Frame>, WireError> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&self.buf[..HEADER_LEN]);
        let header = FrameHeader::decode(&h, self.max_payload)?;
        if self.buf.len() < HEADER_LEN + header.payload_len {
            return Ok(None);
        }
        self.buf.advance(HEADER_LEN);
        let payload = self.buf.split_to(header.payload_len).freeze();
        Ok(Some(Frame {
            kind: header.kind,
            channel: header.channel,
            payload,
        }))
    }
}

/// Appends a frame with a raw payload.
pub fn put_frame(out: &mut BytesMut, kind: FrameKind, channel: u32, payload: &[u8]) {
    out.reserve(HEADER_LEN + payload.len());
    out.put_slice(&FrameHeader::encode(kind, channel, payload.len()));
    out.put_slice(payload);
}

/// Appends a DATA frame: stream byte then `data` (callers keep it under the limit).
pub fn put_data(out: &mut BytesMut, channel: u32, stream: u8, data: &[u8]) {
    debug_assert!(!data.is_empty() && data.len() < MAX_PAYLOAD);
    out.reserve(HEADER_LEN + 1 + data.len());
    out.put_slice(&FrameHeader::encode(
        FrameKind::Data,
        channel,
        1 + data.len(),
    ));
    out.put_u8(stream);
    out.put_slice(data);
}

pub fn put_eof(out: &mut BytesMut, channel: u32, stream: u8) {
    put_frame(out, FrameKind::Eof, channel, &[stream]);
}

pub fn put_window(out: &mut BytesMut, channel: u32, stream: u8, increment: u32) {
    put_frame(
        out,
        FrameKind::Window,
        channel,
        &sandlot_proto::guest::encode_window(stream, increment),
    );
}

/// Appends a frame whose payload is `msg` as JSON, serialized in place. On error
/// nothing is appended.
pub fn put_json<T: Serialize>(
    out: &mut BytesMut,
    kind: FrameKind,
    channel: u32,
    what: &'static str,
    msg: &T,
) -> Result<(), WireError> {
    let start = out.len();
    out.put_slice(&[0u8; HEADER_LEN]);
    let res = serde_json::to_writer((&mut *out).writer(), msg);
    if let Err(source) = res {
        out.truncate(start);
        return Err(WireError::Encode { what, source });
    }
    let len = out.len() - start - HEADER_LEN;
    if len > MAX_PAYLOAD {
        out.truncate(start);
        return Err(WireError::EncodeTooLarge {
            what,
            len,
            max: MAX_PAYLOAD,
        });
    }
    out[start..start + HEADER_LEN].copy_from_slice(&FrameHeader::encode(kind, channel, len));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_across_arbitrary_splits() {
        let mut out = BytesMut::new();
        put_data(&mut out, 5, 1, b"hello");
        put_json(
            &mut out,
            FrameKind::Request,
            6,
            "req",
            &serde_json::json!({"op":"ping"}),
        )
        .unwrap();
        put_window(&mut out, 5, 1, 1000);
        put_eof(&mut out, 5, 2);
        let bytes = out.freeze();
        // Feed the stream one byte at a time through a duplex pipe.
        let (mut a, b) = tokio::io::duplex(1);
        let feeder = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for chunk in bytes.chunks(1) {
                a.write_all(chunk).await.unwrap();
            }
        });
        let mut r = FrameReader::new(b);
        let f = r.next().await.unwrap().unwrap();
        assert_eq!(
            (f.kind, f.channel, &f.payload[..]),
            (FrameKind::Data, 5, &b"\x01hello"[..])
        );
        let f = r.next().await.unwrap().unwrap();
        assert_eq!(f.kind, FrameKind::Request);
        assert_eq!(&f.payload[..], br#"{"op":"ping"}"#);
        let f = r.next().await.unwrap().unwrap();
        assert_eq!(f.kind, FrameKind::Window);
        let f = r.next().await.unwrap().unwrap();
        assert_eq!((f.kind, &f.payload[..]), (FrameKind::Eof, &[2u8][..]));
        feeder.await.unwrap();
        assert!(r.next().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn oversized_and_truncated_frames_are_errors() {
        let mut big = BytesMut::new();
        big.put_slice(&FrameHeader::encode(FrameKind::Data, 1, MAX_PAYLOAD + 1));
        let mut r = FrameReader::new(&big[..]);
        assert!(matches!(
            r.next().await,
            Err(WireError::Frame(FrameError::TooLarge { .. }))
        ));
        let mut out = BytesMut::new();
        put_data(&mut out, 1, 1, b"abcdef");
        let cut = &out[..out.len() - 2];
        let mut r = FrameReader::new(cut);
        assert!(matches!(r.next().await, Err(WireError::Truncated { .. })));
    }

    #[test]
    fn json_too_large_is_refused_without_partial_output() {
        let mut out = BytesMut::new();
        let s = "x".repeat(MAX_PAYLOAD);
        let e = put_json(&mut out, FrameKind::Reply, 1, "reply", &s).unwrap_err();
        assert!(matches!(e, WireError::EncodeTooLarge { .. }));
        assert!(out.is_empty());
    }
}
