//! Content digests (`sha256:<64 hex>`) and hashing readers/writers.

use std::fmt;
use std::io::{self, Read, Write};
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// A sha256 content digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

/// A string that is not `sha256:` followed by 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid digest {0:?}: expected sha256:<64 hex digits>")]
pub struct BadDigest(pub String);

impl Digest {
    pub fn of(data: &[u8]) -> Digest {
        Digest(Sha256::digest(data).into())
    }

    /// The 64 hex digits (file names in the store).
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 64 hex digits without the algorithm prefix.
    pub fn from_hex(h: &str) -> Result<Digest, BadDigest> {
        let bad = || BadDigest(h.to_string());
        if h.len() != 64
            || !h
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(h, &mut out).map_err(|_| bad())?;
        Ok(Digest(out))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl FromStr for Digest {
    type Err = BadDigest;
    fn from_str(s: &str) -> Result<Digest, BadDigest> {
        let h = s
            .strip_prefix("sha256:")
            .ok_or_else(|| BadDigest(s.to_string()))?;
        Digest::from_hex(h).map_err(|_| BadDigest(s.to_string()))
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Digest, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A reader that hashes what passes through it.
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> HashingReader<R> {
    pub fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }
    /// Reads to the end (so trailing padding is hashed too) and returns the digest
    /// and the byte count.
    pub fn finish(mut self) -> io::Result<(Digest, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((Digest(self.hasher.finalize().into()), self.count))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// A writer that hashes what passes through it.
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    count: u64,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }
    /// Bytes written so far.
    pub fn count(&self) -> u64 {
        self.count
    }
    pub fn finish(self) -> (W, Digest, u64) {
        (
            self.inner,
            Digest(self.hasher.finalize().into()),
            self.count,
        )
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_print() {
        let d = Digest::of(b"");
        let s = d.to_string();
        assert_eq!(
            s,
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(s.parse::<Digest>().unwrap(), d);
        assert!("sha256:E3B0".parse::<Digest>().is_err());
        assert!("md5:00".parse::<Digest>().is_err());
        assert!(format!("sha256:{}", "g".repeat(64))
            .parse::<Digest>()
            .is_err());
    }

    #[test]
    fn hashing_reader_counts_everything() {
        let mut r = HashingReader::new(&b"hello world"[..]);
        let mut b = [0u8; 5];
        r.read_exact(&mut b).unwrap();
        let (d, n) = r.finish().unwrap();
        assert_eq!(n, 11);
        assert_eq!(d, Digest::of(b"hello world"));
    }
}
