//! Files copied out of a sandbox keep their holes on the local disk: whole 4 KiB
//! blocks of zeros are left unwritten (a single file), or punched out again right
//! after a directory archive's file is written, so that a sparse file does not
//! become its full size here.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

const BLOCK: u64 = 4096;

/// A new (empty) file written in order, blocks of zeros left as holes.
/// [`finish`](Self::finish) sets its length.
pub struct SparseFile {
    f: File,
    pos: u64,
}

impl SparseFile {
    pub fn new(f: File) -> SparseFile {
        SparseFile { f, pos: 0 }
    }

    /// Sets the length (a trailing hole is written by no block) and returns the file.
    pub fn finish(self) -> io::Result<File> {
        self.f.set_len(self.pos)?;
        Ok(self.f)
    }
}

/// The block-aligned pieces of `buf` written at `pos`: (offset in `buf`, length,
/// all zeros).
fn pieces(pos: u64, buf: &[u8]) -> impl Iterator<Item = (usize, usize, bool)> + '_ {
    let mut done = 0;
    std::iter::from_fn(move || {
        if done == buf.len() {
            return None;
        }
        let at = pos + done as u64;
        let n = ((BLOCK - at % BLOCK) as usize).min(buf.len() - done);
        let piece = (done, n, buf[done..done + n].iter().all(|&b| b == 0));
        done += n;
        Some(piece)
    })
}

impl Write for SparseFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Consecutive pieces with data are written at once.
        let mut run: Option<(usize, usize)> = None;
        for (off, n, zero) in pieces(self.pos, buf) {
            match (&mut run, zero) {
                (Some((_, len)), false) => *len += n,
                (None, false) => run = Some((off, n)),
                (Some((s, len)), true) => {
                    self.f
                        .write_all_at(&buf[*s..*s + *len], self.pos + *s as u64)?;
                    run = None;
                }
                (None, true) => {}
            }
        }
        if let Some((s, len)) = run {
            self.f.write_all_at(&buf[s..s + len], self.pos + s as u64)?;
        }
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Punches the whole blocks of zeros of the regular file `path` (just written,
/// not through a link) back into holes.
pub fn punch_zero_blocks(path: &Path) -> io::Result<()> {
    use rustix::fs::{fallocate, FallocateFlags};
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Ok(());
    }
    let punch = |f: &File, (start, end): (u64, u64)| -> io::Result<()> {
        if end > start {
            fallocate(
                f,
                FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
                start,
                end - start,
            )?;
        }
        Ok(())
    };
    let mut buf = vec![0u8; 256 << 10];
    let (mut pos, mut zeros) = (0u64, None::<(u64, u64)>);
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        for (off, len, zero) in pieces(pos, &buf[..n]) {
            let at = pos + off as u64;
            let whole = len as u64 == BLOCK;
            match (zeros, zero && whole) {
                (Some((s, _)), true) => zeros = Some((s, at + BLOCK)),
                (None, true) => zeros = Some((at, at + BLOCK)),
                (Some(z), false) => {
                    punch(&f, z)?;
                    zeros = None;
                }
                (None, false) => {}
            }
        }
        pos += n as u64;
    }
    if let Some(z) = zeros {
        punch(&f, z)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn content() -> Vec<u8> {
        let mut v = vec![0u8; 8 << 20];
        v[5000..5010].copy_from_slice(b"0123456789");
        v[(6 << 20) + 1] = 7;
        v
    }

    #[test]
    fn zero_blocks_stay_holes() {
        let dir = std::env::temp_dir().join(format!("sandlot-sparse-out-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let want = content();
        let p = dir.join("written");
        let mut w = SparseFile::new(File::create(&p).unwrap());
        // In odd-sized writes that straddle blocks.
        for c in want.chunks(10_007) {
            w.write_all(c).unwrap();
        }
        w.finish().unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), want);
        assert!(std::fs::metadata(&p).unwrap().blocks() * 512 <= 64 << 10);

        let q = dir.join("punched");
        std::fs::write(&q, &want).unwrap();
        punch_zero_blocks(&q).unwrap();
        assert_eq!(std::fs::read(&q).unwrap(), want);
        assert!(std::fs::metadata(&q).unwrap().blocks() * 512 <= 64 << 10);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
