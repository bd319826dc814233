//! `Content-Encoding: gzip` on envd's `/files`: uploads are inflated as they
//! arrive and downloads deflated as they leave, in bounded steps. A gzip body is
//! tenant data: each step feeds the decoder at most [`INFLATE_STEP`] compressed
//! bytes, so one step yields at most about a MiB whatever the ratio, and the
//! inflated total is bounded by the upload limits (`limits.max_upload`, the
//! sandbox's disk) that every upload is counted against.

use std::io::Write;

use bytes::Bytes;
use flate2::write::{GzDecoder, GzEncoder};

/// Compressed bytes fed to the decoder at once (deflate expands at most ~1032×).
pub const INFLATE_STEP: usize = 1024;

/// What a request's `Content-Encoding` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Identity,
    Gzip,
}

/// The coding of a `Content-Encoding` value, or the error naming it.
pub fn content_coding(v: Option<&str>) -> Result<Coding, String> {
    match v.map(str::trim) {
        None | Some("") => Ok(Coding::Identity),
        Some(c) if c.eq_ignore_ascii_case("identity") => Ok(Coding::Identity),
        Some(c) if c.eq_ignore_ascii_case("gzip") || c.eq_ignore_ascii_case("x-gzip") => {
            Ok(Coding::Gzip)
        }
        Some(c) => Err(format!(
            "Content-Encoding {c:?} is not supported (gzip or identity)"
        )),
    }
}

/// Whether an `Accept-Encoding` value accepts gzip (`gzip`, `x-gzip` or `*`,
/// without `q=0`).
pub fn accepts_gzip(v: Option<&str>) -> bool {
    v.unwrap_or("").split(',').any(|item| {
        let mut parts = item.split(';').map(str::trim);
        let coding = parts.next().unwrap_or("");
        let refused = parts.any(|p| {
            p.strip_prefix("q=")
                .and_then(|q| q.parse::<f32>().ok())
                .is_some_and(|q| q == 0.0)
        });
        !refused
            && (coding.eq_ignore_ascii_case("gzip")
                || coding.eq_ignore_ascii_case("x-gzip")
                || coding == "*")
    })
}

/// A streaming gzip decoder fed in bounded steps.
pub struct Inflate {
    dec: GzDecoder<Vec<u8>>,
}

impl Default for Inflate {
    fn default() -> Self {
        Inflate {
            dec: GzDecoder::new(Vec::new()),
        }
    }
}

impl Inflate {
    /// Feeds one step of compressed input (at most [`INFLATE_STEP`] bytes) and
    /// returns what it inflated to.
    pub fn step(&mut self, input: &[u8]) -> Result<Vec<u8>, String> {
        debug_assert!(input.len() <= INFLATE_STEP);
        self.dec
            .write_all(input)
            .map_err(|e| format!("the gzip body is not valid: {e}"))?;
        Ok(std::mem::take(self.dec.get_mut()))
    }

    /// Ends the stream: the rest of the output, or an error if the body ended
    /// inside the gzip stream.
    pub fn finish(self) -> Result<Vec<u8>, String> {
        self.dec
            .finish()
            .map_err(|e| format!("the gzip body ended early or is not valid: {e}"))
    }
}

/// A streaming gzip encoder.
pub struct Deflate {
    enc: GzEncoder<Vec<u8>>,
}

impl Default for Deflate {
    fn default() -> Self {
        Deflate {
            enc: GzEncoder::new(Vec::new(), flate2::Compression::fast()),
        }
    }
}

impl Deflate {
    /// Compresses a chunk; returns what is ready to send (it may be empty).
    pub fn chunk(&mut self, data: &[u8]) -> std::io::Result<Bytes> {
        self.enc.write_all(data)?;
        Ok(Bytes::from(std::mem::take(self.enc.get_mut())))
    }

    /// The end of the stream (the gzip trailer).
    pub fn finish(self) -> std::io::Result<Bytes> {
        self.enc.finish().map(Bytes::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inflate_all(gz: &[u8]) -> Result<Vec<u8>, String> {
        let mut i = Inflate::default();
        let mut out = Vec::new();
        for c in gz.chunks(INFLATE_STEP) {
            out.extend(i.step(c)?);
        }
        out.extend(i.finish()?);
        Ok(out)
    }

    #[test]
    fn gzip_round_trips_in_steps() {
        let data: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let mut d = Deflate::default();
        let mut gz = Vec::new();
        for c in data.chunks(7000) {
            gz.extend_from_slice(&d.chunk(c).unwrap());
        }
        gz.extend_from_slice(&d.finish().unwrap());
        assert_eq!(inflate_all(&gz).unwrap(), data);
    }

    #[test]
    fn one_step_of_a_bomb_inflates_to_a_bounded_size() {
        // 64 MiB of zeros compress to about 64 KiB; no step yields more than ~1 MiB.
        let mut d = Deflate::default();
        let mut gz = d.chunk(&vec![0u8; 64 << 20]).unwrap().to_vec();
        gz.extend_from_slice(&d.finish().unwrap());
        let mut i = Inflate::default();
        let mut total = 0usize;
        for c in gz.chunks(INFLATE_STEP) {
            let out = i.step(c).unwrap();
            assert!(out.len() <= 1100 * INFLATE_STEP, "{}", out.len());
            total += out.len();
        }
        total += i.finish().unwrap().len();
        assert_eq!(total, 64 << 20);
    }

    #[test]
    fn broken_and_truncated_bodies_are_errors() {
        assert!(inflate_all(b"not gzip at all").is_err());
        let mut d = Deflate::default();
        let mut gz = d.chunk(b"hello world").unwrap().to_vec();
        gz.extend_from_slice(&d.finish().unwrap());
        assert_eq!(inflate_all(&gz).unwrap(), b"hello world");
        assert!(inflate_all(&gz[..gz.len() - 4]).is_err());
    }

    #[test]
    fn codings_are_read_from_headers() {
        assert_eq!(content_coding(None), Ok(Coding::Identity));
        assert_eq!(content_coding(Some("GZIP")), Ok(Coding::Gzip));
        assert!(content_coding(Some("br")).unwrap_err().contains("br"));
        assert!(accepts_gzip(Some("gzip")));
        assert!(accepts_gzip(Some("br, gzip;q=0.5")));
        assert!(!accepts_gzip(Some("gzip;q=0")));
        assert!(!accepts_gzip(Some("identity")));
        assert!(!accepts_gzip(None));
    }
}
