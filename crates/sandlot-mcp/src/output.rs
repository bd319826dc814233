//! What a tool hands back of a command's output: at most a budget of bytes per
//! stream, its head and its tail, with a marker saying how much was left out.

/// A stream's output kept within `limit` bytes: the first half of the budget and
/// the most recent half, and the count of everything seen.
#[derive(Debug, Clone)]
pub struct CappedOutput {
    limit: usize,
    head: Vec<u8>,
    /// The most recent bytes past the head, at most `limit - limit / 2`.
    tail: std::collections::VecDeque<u8>,
    total: u64,
}

impl CappedOutput {
    pub fn new(limit: usize) -> CappedOutput {
        CappedOutput {
            limit,
            head: Vec::new(),
            tail: std::collections::VecDeque::new(),
            total: 0,
        }
    }

    pub fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        let head_room = (self.limit / 2).saturating_sub(self.head.len());
        let n = head_room.min(data.len());
        self.head.extend_from_slice(&data[..n]);
        data = &data[n..];
        let tail_cap = self.limit - self.limit / 2;
        if data.len() >= tail_cap {
            self.tail.clear();
            self.tail.extend(&data[data.len() - tail_cap..]);
            return;
        }
        let over = (self.tail.len() + data.len()).saturating_sub(tail_cap);
        self.tail.drain(..over);
        self.tail.extend(data);
    }

    /// Bytes seen in all.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Bytes seen but not kept.
    pub fn left_out(&self) -> u64 {
        self.total - (self.head.len() + self.tail.len()) as u64
    }

    /// The text kept (invalid UTF-8 replaced), with a marker where bytes were left
    /// out: `[... 1234 bytes left out ...]`.
    pub fn render(&self) -> String {
        let left_out = self.left_out();
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        if left_out == 0 {
            let mut all = self.head.clone();
            all.extend_from_slice(&tail);
            return String::from_utf8_lossy(&all).into_owned();
        }
        format!(
            "{}\n[... {left_out} bytes left out of {} ...]\n{}",
            String::from_utf8_lossy(&self.head),
            self.total,
            String::from_utf8_lossy(&tail)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_within_the_limit_is_kept_whole() {
        let mut c = CappedOutput::new(16);
        c.push(b"hello ");
        c.push(b"world");
        assert_eq!(c.render(), "hello world");
        assert_eq!(c.left_out(), 0);
    }

    #[test]
    fn output_past_the_limit_keeps_head_and_tail_and_says_how_much_was_left_out() {
        let mut c = CappedOutput::new(10);
        for chunk in [&b"0123"[..], b"456789", b"abcdefghij", b"XYZ"] {
            c.push(chunk);
        }
        assert_eq!(c.total(), 23);
        assert_eq!(c.left_out(), 13);
        assert_eq!(
            c.render(),
            "01234\n[... 13 bytes left out of 23 ...]\nijXYZ"
        );
    }

    #[test]
    fn one_huge_chunk_is_cut_the_same_way() {
        let mut c = CappedOutput::new(8);
        c.push(&[b'a'; 1000]);
        c.push(b"end");
        assert_eq!(c.left_out(), 995);
        let r = c.render();
        assert!(
            r.starts_with("aaaa\n[... 995 bytes left out of 1003 ...]\n"),
            "{r}"
        );
        assert!(r.ends_with("aend"), "{r}");
    }

    #[test]
    fn a_zero_limit_keeps_nothing_but_the_count() {
        let mut c = CappedOutput::new(0);
        c.push(b"abc");
        assert_eq!(c.render(), "\n[... 3 bytes left out of 3 ...]\n");
    }
}
