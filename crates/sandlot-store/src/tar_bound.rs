//! Reading a tar archive someone else wrote (an image layer, an image archive, a
//! tenant's build context) without letting it choose how much memory the daemon
//! allocates.
//!
//! The `tar` crate reads a GNU long name (`L`), a GNU long link (`K`) and a PAX
//! extension (`x`) entry whole into memory before it yields the entry they describe,
//! and a GNU sparse map likewise; how large they are is the archive's to say. An
//! archive whose first entry was a long name of several GiB made the daemon
//! allocate that much. [`for_each_entry`] counts what the crate reads while it looks
//! for the next entry (headers and that metadata; the previous entry's data is
//! drained before, so none of it counts) and fails the read past
//! [`MAX_ENTRY_METADATA`].

use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// What may be read between two entries: their headers, long names and links, PAX
/// records and sparse maps together.
pub const MAX_ENTRY_METADATA: u64 = 1 << 20;

/// What the GNU sparse entries of one archive may expand to, together. A sparse
/// entry's holes read as zeros, and its 512-byte header may say they span
/// exabytes: reading such an entry through (as every entry's rest is) would spin
/// for ever. 1 TiB is 16 times the default `images.max_expanded_size`, which
/// bounds the layers the store packs itself, holes included; reading through that
/// much takes about a minute of CPU.
pub const MAX_SPARSE_EXPANSION: u64 = 1 << 40;

#[derive(Debug, Default)]
struct Gate {
    /// Looking for the next entry: reads count.
    armed: AtomicBool,
    read: AtomicU64,
}

/// A reader whose reads are bounded while the `tar` crate looks for an entry.
pub struct Bounded<R> {
    inner: R,
    gate: Arc<Gate>,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.gate.armed.load(Ordering::Relaxed) {
            return self.inner.read(buf);
        }
        let used = self.gate.read.load(Ordering::Relaxed);
        let left = MAX_ENTRY_METADATA.saturating_sub(used);
        if left == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "an entry's headers (long name, long link, PAX records or sparse map) are larger than {} KiB",
                    MAX_ENTRY_METADATA >> 10
                ),
            ));
        }
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.gate.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Opens `reader` as a tar archive, lets `configure` set the archive's options, and
/// calls `each` on every entry in order, with the metadata between entries bounded
/// by [`MAX_ENTRY_METADATA`]. What `each` leaves of an entry's data is read through
/// before the next entry. Read errors (the bound's included) go through `io_error`.
pub fn for_each_entry<R, E>(
    reader: R,
    configure: impl FnOnce(&mut tar::Archive<Bounded<R>>),
    io_error: impl Fn(io::Error) -> E,
    mut each: impl FnMut(&mut tar::Entry<'_, Bounded<R>>) -> Result<(), E>,
) -> Result<(), E>
where
    R: Read,
{
    let gate = Arc::new(Gate::default());
    let mut ar = tar::Archive::new(Bounded {
        inner: reader,
        gate: gate.clone(),
    });
    configure(&mut ar);
    gate.armed.store(true, Ordering::Relaxed);
    let mut entries = ar.entries().map_err(&io_error)?;
    let mut sparse = 0u64;
    loop {
        gate.read.store(0, Ordering::Relaxed);
        gate.armed.store(true, Ordering::Relaxed);
        let Some(e) = entries.next() else {
            return Ok(());
        };
        let mut e = e.map_err(&io_error)?;
        gate.armed.store(false, Ordering::Relaxed);
        if e.header().entry_type().is_gnu_sparse() {
            sparse = sparse.saturating_add(e.size());
            if sparse > MAX_SPARSE_EXPANSION {
                return Err(io_error(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "the archive's sparse entries expand to more than {} GiB",
                        MAX_SPARSE_EXPANSION >> 30
                    ),
                )));
            }
        }
        each(&mut e)?;
        io::copy(&mut e, &mut io::sink()).map_err(&io_error)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(name: &[u8], kind: tar::EntryType, size: u64) -> [u8; 512] {
        let mut h = tar::Header::new_gnu();
        h.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name);
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o644);
        h.set_cksum();
        let mut out = [0u8; 512];
        out.copy_from_slice(h.as_bytes());
        out
    }

    /// An archive whose first entry is a long name of `len` bytes, then a file.
    fn long_name_archive(len: u64) -> impl Read {
        let name = header(b"././@LongLink", tar::EntryType::GNULongName, len);
        let padded = len.div_ceil(512) * 512;
        let file = header(b"f", tar::EntryType::Regular, 3);
        let mut file_block = [0u8; 512];
        file_block[..3].copy_from_slice(b"abc");
        io::Cursor::new(name)
            .chain(io::repeat(b'a').take(len.saturating_sub(1)))
            .chain(io::repeat(0).take(padded - len.saturating_sub(1)))
            .chain(io::Cursor::new(file))
            .chain(io::Cursor::new(file_block))
            .chain(io::repeat(0).take(1024))
    }

    #[test]
    fn a_long_name_of_gigabytes_is_refused_after_a_mebibyte_is_read() {
        // 4 GiB of long name: the tar crate alone would allocate all of it.
        let mut seen = Vec::new();
        let err = for_each_entry(
            long_name_archive(4 << 30),
            |_| {},
            |e| e,
            |e| {
                seen.push(e.path().unwrap().into_owned());
                Ok(())
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("larger than 1024 KiB"), "{err}");
        assert!(seen.is_empty(), "{seen:?}");
    }

    /// An archive of one GNU sparse entry with no data: a hole of `hole` bytes.
    fn sparse_archive(hole: u64) -> Vec<u8> {
        let mut h = tar::Header::new_gnu();
        h.as_gnu_mut().unwrap().name[..1].copy_from_slice(b"s");
        h.set_entry_type(tar::EntryType::GNUSparse);
        h.set_size(0);
        h.set_mode(0o644);
        let g = h.as_gnu_mut().unwrap();
        g.set_real_size(hole);
        g.sparse[0].set_offset(hole);
        g.sparse[0].set_length(0);
        h.set_cksum();
        let mut out = h.as_bytes().to_vec();
        out.extend(std::iter::repeat_n(0u8, 1024));
        out
    }

    #[test]
    fn a_sparse_entry_expanding_to_exabytes_is_refused_before_it_is_read() {
        let mut seen = 0;
        let err = for_each_entry(
            &sparse_archive(1 << 62)[..],
            |_| {},
            |e| e,
            |_| {
                seen += 1;
                Ok(())
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("sparse entries expand"), "{err}");
        assert_eq!(seen, 0);
        // A hole of a mebibyte is read through.
        let mut sizes = Vec::new();
        for_each_entry(
            &sparse_archive(1 << 20)[..],
            |_| {},
            |e| e,
            |e| {
                sizes.push(e.size());
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(sizes, [1 << 20]);
    }

    #[test]
    fn entries_with_long_names_and_large_data_are_read_as_usual() {
        // A 300-byte name is fine, and so is data far larger than the bound,
        // whether the callback reads it or leaves it.
        let mut b = tar::Builder::new(Vec::new());
        let long = "d/".repeat(150) + "file";
        let mut h = tar::Header::new_gnu();
        h.set_size(3);
        h.set_mode(0o644);
        b.append_data(&mut h, &long, &b"xyz"[..]).unwrap();
        let big = vec![7u8; 3 << 20];
        for name in ["big-left", "big-read"] {
            let mut h = tar::Header::new_gnu();
            h.set_size(big.len() as u64);
            h.set_mode(0o644);
            b.append_data(&mut h, name, &big[..]).unwrap();
        }
        let tar = b.into_inner().unwrap();
        let mut seen = Vec::new();
        for_each_entry(
            &tar[..],
            |_| {},
            |e| e,
            |e| {
                let name = e.path().unwrap().display().to_string();
                if name == "big-read" {
                    let mut data = Vec::new();
                    e.read_to_end(&mut data).unwrap();
                    assert_eq!(data.len(), 3 << 20);
                }
                seen.push(name);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(seen, [long.as_str(), "big-left", "big-read"]);
    }
}
