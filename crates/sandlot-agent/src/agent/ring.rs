//! Retained output of one process stream: the most recent bytes, addressed by their
//! absolute offset in the stream, so that clients can (re-)attach from any offset
//! still retained.

use std::collections::VecDeque;

use bytes::{Buf, Bytes};

#[derive(Debug, Default)]
pub(crate) struct OutputRing {
    chunks: VecDeque<Bytes>,
    /// Offset of the first retained byte.
    start: u64,
    /// Offset one past the last byte produced.
    end: u64,
    /// Maximum retained bytes.
    limit: usize,
}

impl OutputRing {
    pub fn new(limit: usize) -> Self {
        OutputRing {
            limit,
            ..Default::default()
        }
    }

    pub fn start(&self) -> u64 {
        self.start
    }

    pub fn end(&self) -> u64 {
        self.end
    }

    pub fn retained(&self) -> usize {
        (self.end - self.start) as usize
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Appends produced bytes and drops the oldest beyond the limit.
    pub fn push(&mut self, data: Bytes) {
        if data.is_empty() {
            return;
        }
        self.end += data.len() as u64;
        self.chunks.push_back(data);
        let mut excess = self.retained().saturating_sub(self.limit);
        while excess > 0 {
            let front = self
                .chunks
                .front_mut()
                .expect("retained bytes are in chunks");
            if front.len() <= excess {
                excess -= front.len();
                self.start += front.len() as u64;
                self.chunks.pop_front();
            } else {
                front.advance(excess);
                self.start += excess as u64;
                excess = 0;
            }
        }
    }

    /// Up to `max` bytes from `offset` (which must be within `start..end`), without
    /// copying; may return fewer than available when they span chunks.
    pub fn slice_from(&self, offset: u64, max: usize) -> Bytes {
        debug_assert!(offset >= self.start && offset <= self.end);
        let mut skip = (offset - self.start) as usize;
        for c in &self.chunks {
            if skip < c.len() {
                let n = (c.len() - skip).min(max);
                return c.slice(skip..skip + n);
            }
            skip -= c.len();
        }
        Bytes::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_most_recent_bytes_with_absolute_offsets() {
        let mut r = OutputRing::new(10);
        r.push(Bytes::from_static(b"abcdef"));
        r.push(Bytes::from_static(b"ghij"));
        assert_eq!((r.start(), r.end()), (0, 10));
        assert_eq!(&r.slice_from(2, 100)[..], b"cdef");
        assert_eq!(&r.slice_from(6, 2)[..], b"gh");
        r.push(Bytes::from_static(b"klm"));
        assert_eq!((r.start(), r.end(), r.retained()), (3, 13, 10));
        assert_eq!(&r.slice_from(3, 100)[..], b"def");
        assert_eq!(&r.slice_from(10, 100)[..], b"klm");
        assert!(r.slice_from(13, 100).is_empty());
        r.push(Bytes::from_static(b"0123456789ABC"));
        assert_eq!((r.start(), r.end()), (16, 26));
        assert_eq!(&r.slice_from(16, 100)[..], b"3456789ABC");
    }
}
