//! Streaming tar (ustar with PAX extended headers for long names): headers for
//! downloads, and an incremental reader for uploads that never holds more than one
//! block plus one chunk in memory.

use bytes::{Buf, Bytes, BytesMut};
use futures_util::{Stream, StreamExt};

/// Errors reading a tar stream.
#[derive(Debug, thiserror::Error)]
pub enum TarError {
    #[error("tar stream: {0}")]
    Format(String),
    #[error("tar entry {path:?}: {problem}")]
    BadPath { path: String, problem: &'static str },
    #[error("reading the request body: {0}")]
    Body(String),
}

/// Kinds of entries this module writes and reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink(String),
    /// Anything else (hard links, devices, fifos): reported, not extracted.
    Other(char),
}

fn pax_record(key: &str, value: &str) -> String {
    // "LEN key=value\n", where LEN counts the whole record including itself.
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    loop {
        let total = len.to_string().len() + body.len();
        if total == len {
            return format!("{len}{body}");
        }
        len = total;
    }
}

fn ustar(
    name: &str,
    kind: &EntryKind,
    size: u64,
    mode: u32,
    mtime: u64,
    link: Option<&str>,
) -> [u8; 512] {
    let mut h = tar::Header::new_ustar();
    // Callers pass names that fit (or a placeholder when a PAX record carries them).
    let _ = h.set_path(name);
    h.set_size(size);
    h.set_mode(mode);
    h.set_mtime(mtime);
    h.set_uid(0);
    h.set_gid(0);
    h.set_entry_type(match kind {
        EntryKind::File => tar::EntryType::Regular,
        EntryKind::Dir => tar::EntryType::Directory,
        EntryKind::Symlink(_) => tar::EntryType::Symlink,
        EntryKind::Other(_) => tar::EntryType::Regular,
    });
    if let Some(l) = link {
        let _ = h.set_link_name(l);
    }
    h.set_cksum();
    let mut out = [0u8; 512];
    out.copy_from_slice(h.as_bytes());
    out
}

fn fits(name: &str) -> bool {
    let mut h = tar::Header::new_ustar();
    name.is_ascii() && h.set_path(name).is_ok()
}

/// The header block(s) of one entry (a PAX header first when the name or the link
/// target does not fit ustar). File data (padded by [`padding`]) follows.
pub fn header(path: &str, kind: &EntryKind, size: u64, mode: u32, mtime: u64) -> Vec<u8> {
    let name = match kind {
        EntryKind::Dir if !path.ends_with('/') => format!("{path}/"),
        _ => path.to_string(),
    };
    let link = match kind {
        EntryKind::Symlink(t) => Some(t.as_str()),
        _ => None,
    };
    let link_fits = link.is_none_or(|l| l.is_ascii() && l.len() <= 100);
    let mut out = Vec::with_capacity(1536);
    if fits(&name) && link_fits {
        out.extend_from_slice(&ustar(&name, kind, size, mode, mtime, link));
        return out;
    }
    let mut recs = pax_record("path", &name);
    if let Some(l) = link {
        recs.push_str(&pax_record("linkpath", l));
    }
    let mut ph = tar::Header::new_ustar();
    let _ = ph.set_path("PaxHeader");
    ph.set_size(recs.len() as u64);
    ph.set_mode(0o644);
    ph.set_mtime(mtime);
    ph.set_entry_type(tar::EntryType::XHeader);
    ph.set_cksum();
    out.extend_from_slice(ph.as_bytes());
    out.extend_from_slice(recs.as_bytes());
    out.extend(std::iter::repeat_n(0u8, padding(recs.len() as u64)));
    let short: String = name
        .chars()
        .filter(char::is_ascii)
        .rev()
        .take(99)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    out.extend_from_slice(&ustar(&short, kind, size, mode, mtime, link.map(|_| "")));
    out
}

/// Zero bytes after `size` bytes of data to reach a block boundary.
pub fn padding(size: u64) -> usize {
    ((512 - size % 512) % 512) as usize
}

/// The end-of-archive marker.
pub fn trailer() -> [u8; 1024] {
    [0u8; 1024]
}

/// Checks and normalizes an entry path to a relative path without `..`.
pub fn clean_path(raw: &str) -> Result<Option<String>, TarError> {
    let mut parts = Vec::new();
    for c in raw.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                return Err(TarError::BadPath {
                    path: raw.to_string(),
                    problem: "contains '..'",
                })
            }
            c if c.contains('\0') => {
                return Err(TarError::BadPath {
                    path: raw.to_string(),
                    problem: "contains a NUL byte",
                })
            }
            c => parts.push(c),
        }
    }
    Ok((!parts.is_empty()).then(|| parts.join("/")))
}

/// One entry of an uploaded archive.
#[derive(Debug)]
pub struct Entry {
    /// Relative, cleaned; None for the archive's root (`./`).
    pub path: Option<String>,
    pub kind: EntryKind,
    pub size: u64,
    pub mode: u32,
    /// Modification time from the header, seconds since the epoch.
    pub mtime: Option<u64>,
}

/// Reads a tar archive from a byte stream, entry by entry.
pub struct TarReader<S> {
    body: S,
    buf: BytesMut,
    /// Data bytes of the current entry not yet consumed, then its padding.
    data_left: u64,
    pad_left: usize,
    pub total_in: u64,
}

impl<S, E> TarReader<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    pub fn new(body: S) -> Self {
        TarReader {
            body,
            buf: BytesMut::new(),
            data_left: 0,
            pad_left: 0,
            total_in: 0,
        }
    }

    async fn more(&mut self) -> Result<bool, TarError> {
        match self.body.next().await {
            Some(Ok(b)) => {
                self.total_in += b.len() as u64;
                self.buf.extend_from_slice(&b);
                Ok(true)
            }
            Some(Err(e)) => Err(TarError::Body(e.to_string())),
            None => Ok(false),
        }
    }

    async fn block(&mut self) -> Result<Option<[u8; 512]>, TarError> {
        while self.buf.len() < 512 {
            if !self.more().await? {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(TarError::Format("truncated header block".into()));
            }
        }
        let mut b = [0u8; 512];
        b.copy_from_slice(&self.buf[..512]);
        self.buf.advance(512);
        Ok(Some(b))
    }

    async fn skip_rest(&mut self) -> Result<(), TarError> {
        while self.next_data().await?.is_some() {}
        let mut pad = self.pad_left;
        while pad > 0 {
            if self.buf.is_empty() && !self.more().await? {
                return Err(TarError::Format("truncated padding".into()));
            }
            let n = pad.min(self.buf.len());
            self.buf.advance(n);
            pad -= n;
        }
        self.pad_left = 0;
        Ok(())
    }

    /// The next chunk of the current entry's data; None at its end.
    pub async fn next_data(&mut self) -> Result<Option<Bytes>, TarError> {
        if self.data_left == 0 {
            return Ok(None);
        }
        if self.buf.is_empty() && !self.more().await? {
            return Err(TarError::Format("truncated entry data".into()));
        }
        let n = (self.data_left.min(self.buf.len() as u64)) as usize;
        self.data_left -= n as u64;
        Ok(Some(self.buf.split_to(n).freeze()))
    }

    async fn read_all_data(&mut self, max: u64) -> Result<Vec<u8>, TarError> {
        if self.data_left > max {
            return Err(TarError::Format(format!(
                "extended header of {} bytes is too large",
                self.data_left
            )));
        }
        let mut v = Vec::new();
        while let Some(c) = self.next_data().await? {
            v.extend_from_slice(&c);
        }
        Ok(v)
    }

    /// The next entry (after skipping what is left of the previous one).
    pub async fn next_entry(&mut self) -> Result<Option<Entry>, TarError> {
        self.skip_rest().await?;
        let mut long_name: Option<String> = None;
        let mut long_link: Option<String> = None;
        let mut pax_size: Option<u64> = None;
        loop {
            let Some(b) = self.block().await? else {
                return Ok(None);
            };
            if b.iter().all(|&x| x == 0) {
                // End of archive (the second zero block, if any, is not needed).
                return Ok(None);
            }
            let h = tar::Header::from_byte_slice(&b);
            let sum = h
                .cksum()
                .map_err(|e| TarError::Format(format!("bad checksum field: {e}")))?;
            let computed: u32 = b[..148]
                .iter()
                .chain(&[b' '; 8])
                .chain(&b[156..])
                .map(|&x| u32::from(x))
                .sum();
            if sum != computed {
                return Err(TarError::Format(
                    "header checksum mismatch (not a tar archive?)".into(),
                ));
            }
            let size = h
                .entry_size()
                .map_err(|e| TarError::Format(format!("bad size field: {e}")))?;
            self.data_left = size;
            self.pad_left = padding(size);
            let et = h.entry_type();
            match et {
                tar::EntryType::XHeader => {
                    let data = self.read_all_data(1 << 20).await?;
                    self.skip_rest().await?;
                    for (k, v) in parse_pax(&data)? {
                        match k.as_str() {
                            "path" => long_name = Some(v),
                            "linkpath" => long_link = Some(v),
                            "size" => pax_size = v.parse().ok(),
                            _ => {}
                        }
                    }
                    continue;
                }
                tar::EntryType::XGlobalHeader => {
                    self.skip_rest().await?;
                    continue;
                }
                tar::EntryType::GNULongName | tar::EntryType::GNULongLink => {
                    let mut data = self.read_all_data(1 << 20).await?;
                    self.skip_rest().await?;
                    while data.last() == Some(&0) {
                        data.pop();
                    }
                    let s = String::from_utf8(data)
                        .map_err(|_| TarError::Format("long name is not UTF-8".into()))?;
                    if et == tar::EntryType::GNULongName {
                        long_name = Some(s);
                    } else {
                        long_link = Some(s);
                    }
                    continue;
                }
                _ => {}
            }
            if let Some(s) = pax_size {
                self.data_left = s;
                self.pad_left = padding(s);
            }
            let raw = match long_name.take() {
                Some(n) => n,
                None => String::from_utf8(h.path_bytes().into_owned())
                    .map_err(|_| TarError::Format("entry name is not UTF-8".into()))?,
            };
            let path = clean_path(&raw)?;
            let kind = match et {
                tar::EntryType::Regular | tar::EntryType::Continuous => EntryKind::File,
                tar::EntryType::Directory => EntryKind::Dir,
                tar::EntryType::Symlink => {
                    let l = match long_link.take() {
                        Some(l) => l,
                        None => String::from_utf8_lossy(&h.link_name_bytes().unwrap_or_default())
                            .into_owned(),
                    };
                    EntryKind::Symlink(l)
                }
                other => EntryKind::Other(other.as_byte() as char),
            };
            let mode = h.mode().unwrap_or(0o644) & 0o7777;
            return Ok(Some(Entry {
                path,
                kind,
                size: self.data_left,
                mode,
                mtime: h.mtime().ok(),
            }));
        }
    }
}

fn parse_pax(data: &[u8]) -> Result<Vec<(String, String)>, TarError> {
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let sp = rest
            .iter()
            .position(|&b| b == b' ')
            .ok_or_else(|| TarError::Format("malformed PAX record".into()))?;
        let len: usize = std::str::from_utf8(&rest[..sp])
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|&l| l > sp + 1 && l <= rest.len())
            .ok_or_else(|| TarError::Format("malformed PAX record length".into()))?;
        let rec = &rest[sp + 1..len - 1];
        let eq = rec
            .iter()
            .position(|&b| b == b'=')
            .ok_or_else(|| TarError::Format("malformed PAX record".into()))?;
        out.push((
            String::from_utf8_lossy(&rec[..eq]).into_owned(),
            String::from_utf8_lossy(&rec[eq + 1..]).into_owned(),
        ));
        rest = &rest[len..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(
        data: Vec<u8>,
        n: usize,
    ) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Unpin {
        let v: Vec<Result<Bytes, std::io::Error>> = data
            .chunks(n)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        futures_util::stream::iter(v)
    }

    fn archive() -> Vec<u8> {
        let long = format!("{}/{}", "d".repeat(80), "f".repeat(90));
        let mut a = Vec::new();
        a.extend(header("dir", &EntryKind::Dir, 0, 0o755, 1));
        a.extend(header("dir/a.txt", &EntryKind::File, 5, 0o600, 1));
        a.extend(b"hello");
        a.extend(std::iter::repeat_n(0, padding(5)));
        a.extend(header(&long, &EntryKind::File, 1000, 0o644, 1));
        a.extend(std::iter::repeat_n(b'x', 1000));
        a.extend(std::iter::repeat_n(0, padding(1000)));
        a.extend(header(
            "dir/link",
            &EntryKind::Symlink("a.txt".into()),
            0,
            0o777,
            1,
        ));
        a.extend(trailer());
        a
    }

    #[tokio::test]
    async fn round_trips_in_any_chunking() {
        let long = format!("{}/{}", "d".repeat(80), "f".repeat(90));
        for n in [1usize, 7, 512, 513, 100_000] {
            let mut r = TarReader::new(chunks(archive(), n));
            let e = r.next_entry().await.unwrap().unwrap();
            assert_eq!((e.path.as_deref(), &e.kind), (Some("dir"), &EntryKind::Dir));
            let e = r.next_entry().await.unwrap().unwrap();
            assert_eq!(
                (e.path.as_deref(), e.size, e.mode),
                (Some("dir/a.txt"), 5, 0o600)
            );
            let mut d = Vec::new();
            while let Some(c) = r.next_data().await.unwrap() {
                d.extend_from_slice(&c);
            }
            assert_eq!(d, b"hello");
            let e = r.next_entry().await.unwrap().unwrap();
            assert_eq!(e.path.as_deref(), Some(long.as_str()));
            assert_eq!(e.size, 1000);
            // Data not read is skipped.
            let e = r.next_entry().await.unwrap().unwrap();
            assert_eq!(e.kind, EntryKind::Symlink("a.txt".into()));
            assert!(r.next_entry().await.unwrap().is_none());
        }
    }

    #[test]
    fn the_tar_crate_reads_what_we_write() {
        let a = archive();
        let mut ar = tar::Archive::new(&a[..]);
        let names: Vec<String> = ar
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 4);
        assert_eq!(names[0], "dir/");
        assert_eq!(names[2].len(), 171);
    }

    #[test]
    fn paths_are_cleaned_and_escapes_refused() {
        assert_eq!(clean_path("./a//b/").unwrap().as_deref(), Some("a/b"));
        assert_eq!(clean_path("/abs/x").unwrap().as_deref(), Some("abs/x"));
        assert_eq!(clean_path("./").unwrap(), None);
        assert!(clean_path("a/../../etc").is_err());
        assert_eq!(pax_record("path", "ab"), "11 path=ab\n");
    }

    #[tokio::test]
    async fn garbage_is_refused() {
        let mut r = TarReader::new(chunks(vec![7u8; 2048], 100));
        assert!(r.next_entry().await.is_err());
        let mut a = archive();
        a.truncate(1027);
        let mut r = TarReader::new(chunks(a, 100));
        r.next_entry().await.unwrap();
        r.next_entry().await.unwrap();
        assert_eq!(&r.next_data().await.unwrap().unwrap()[..], b"hel");
        assert!(r.next_data().await.is_err());
    }
}
