//! A streaming `multipart/form-data` reader for envd's `POST /files`: parts
//! are delivered as they arrive (the daemon's memory does not grow with the
//! upload), each with its field name and file name.

use bytes::{Buf, Bytes, BytesMut};

/// What the reader found next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A part begins.
    Part {
        name: String,
        filename: Option<String>,
    },
    /// Bytes of the current part.
    Data(Bytes),
    /// The current part is complete.
    PartEnd,
    /// The closing delimiter: nothing follows.
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the first delimiter (a preamble is skipped).
    Preamble,
    /// Right after a delimiter: `--` (end) or CRLF then headers.
    AfterDelimiter,
    Headers,
    Body,
    Done,
}

/// Incremental parser; feed bytes with [`Reader::push`], take events with
/// [`Reader::next_event`] until it answers `None` (needs more input).
pub struct Reader {
    /// `\r\n--BOUNDARY`.
    delim: Vec<u8>,
    buf: BytesMut,
    state: State,
}

/// Largest header block of one part.
const MAX_HEADERS: usize = 16 * 1024;

/// The boundary of a `multipart/form-data` content type.
pub fn boundary(content_type: &str) -> Option<String> {
    let mut it = content_type.split(';');
    let mime = it.next()?.trim();
    if !mime.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    for p in it {
        let (k, v) = p.split_once('=')?;
        if k.trim().eq_ignore_ascii_case("boundary") {
            let v = v.trim().trim_matches('"');
            return (!v.is_empty() && v.len() <= 200).then(|| v.to_string());
        }
    }
    None
}

impl Reader {
    pub fn new(boundary: &str) -> Reader {
        let mut buf = BytesMut::new();
        // The first delimiter may start the body without a preceding CRLF.
        buf.extend_from_slice(b"\r\n");
        Reader {
            delim: format!("\r\n--{boundary}").into_bytes(),
            buf,
            state: State::Preamble,
        }
    }

    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Whether the closing delimiter was seen.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    pub fn next_event(&mut self) -> Result<Option<Event>, String> {
        loop {
            match self.state {
                State::Done => return Ok(None),
                State::Preamble => match find(&self.buf, &self.delim) {
                    Some(i) => {
                        self.buf.advance(i + self.delim.len());
                        self.state = State::AfterDelimiter;
                    }
                    None => {
                        // Keep what could be the start of the delimiter.
                        let keep = self.delim.len() - 1;
                        if self.buf.len() > keep {
                            let n = self.buf.len() - keep;
                            self.buf.advance(n);
                        }
                        return Ok(None);
                    }
                },
                State::AfterDelimiter => {
                    if self.buf.len() < 2 {
                        return Ok(None);
                    }
                    if &self.buf[..2] == b"--" {
                        self.state = State::Done;
                        self.buf.clear();
                        return Ok(Some(Event::End));
                    }
                    // Transport padding (spaces, tabs) may precede the CRLF.
                    let Some(i) = find(&self.buf, b"\r\n") else {
                        return Ok(None);
                    };
                    if !self.buf[..i].iter().all(|b| *b == b' ' || *b == b'\t') {
                        return Err("malformed multipart body: junk after a boundary".into());
                    }
                    self.buf.advance(i + 2);
                    self.state = State::Headers;
                }
                State::Headers => {
                    let Some(i) = find(&self.buf, b"\r\n\r\n") else {
                        if self.buf.len() > MAX_HEADERS {
                            return Err("malformed multipart body: part headers too large".into());
                        }
                        // An empty header block is just CRLF.
                        if self.buf.starts_with(b"\r\n") {
                            self.buf.advance(2);
                            self.state = State::Body;
                            return Ok(Some(Event::Part {
                                name: String::new(),
                                filename: None,
                            }));
                        }
                        return Ok(None);
                    };
                    let head = String::from_utf8_lossy(&self.buf[..i]).into_owned();
                    self.buf.advance(i + 4);
                    self.state = State::Body;
                    let (name, filename) = disposition(&head);
                    return Ok(Some(Event::Part { name, filename }));
                }
                State::Body => match find(&self.buf, &self.delim) {
                    Some(0) => {
                        self.buf.advance(self.delim.len());
                        self.state = State::AfterDelimiter;
                        return Ok(Some(Event::PartEnd));
                    }
                    Some(i) => {
                        let data = self.buf.split_to(i).freeze();
                        return Ok(Some(Event::Data(data)));
                    }
                    None => {
                        let keep = self.delim.len() - 1;
                        if self.buf.len() > keep {
                            let n = self.buf.len() - keep;
                            return Ok(Some(Event::Data(self.buf.split_to(n).freeze())));
                        }
                        return Ok(None);
                    }
                },
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    let first = needle[0];
    let mut i = 0;
    while i + needle.len() <= hay.len() {
        match hay[i..].iter().position(|b| *b == first) {
            Some(p) => i += p,
            None => return None,
        }
        if i + needle.len() <= hay.len() && &hay[i..i + needle.len()] == needle {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// `name` and `filename` of a part's `Content-Disposition`. File names are
/// unescaped as browsers and httpx escape them (`%22` for `"`, `%0A`...).
fn disposition(head: &str) -> (String, Option<String>) {
    let mut name = String::new();
    let mut filename = None;
    for line in head.split("\r\n") {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        if !k.trim().eq_ignore_ascii_case("content-disposition") {
            continue;
        }
        for (pk, pv) in params(v) {
            match pk.to_ascii_lowercase().as_str() {
                "name" => name = pv,
                "filename" => filename = Some(unescape(&pv)),
                _ => {}
            }
        }
    }
    (name, filename)
}

/// `form-data; name="a"; filename="b;c"` → [("name","a"), ("filename","b;c")].
fn params(v: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let b = v.as_bytes();
    let mut i = 0;
    while i < b.len() {
        // Key up to '=' or ';'.
        let ks = i;
        while i < b.len() && b[i] != b'=' && b[i] != b';' {
            i += 1;
        }
        let key = v[ks..i].trim().to_string();
        if i < b.len() && b[i] == b'=' {
            i += 1;
            let val = if i < b.len() && b[i] == b'"' {
                i += 1;
                let mut s = Vec::new();
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' && i + 1 < b.len() {
                        i += 1;
                    }
                    s.push(b[i]);
                    i += 1;
                }
                i += 1;
                String::from_utf8_lossy(&s).into_owned()
            } else {
                let vs = i;
                while i < b.len() && b[i] != b';' {
                    i += 1;
                }
                v[vs..i].trim().to_string()
            };
            out.push((key, val));
        }
        while i < b.len() && b[i] != b';' {
            i += 1;
        }
        i += 1;
    }
    out
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
            if let Some(n) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                if n == b'"' || n < 0x20 || n == 0x7f {
                    out.push(n);
                    i += 3;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(body: &[u8], boundary: &str, step: usize) -> Vec<Event> {
        let mut r = Reader::new(boundary);
        let mut out = Vec::new();
        for chunk in body.chunks(step) {
            r.push(chunk);
            while let Some(e) = r.next_event().unwrap() {
                out.push(e);
            }
        }
        // Merge data events so chunking does not matter for comparisons.
        let mut merged: Vec<Event> = Vec::new();
        for e in out {
            match (merged.last_mut(), e) {
                (Some(Event::Data(a)), Event::Data(b)) => {
                    let mut v = a.to_vec();
                    v.extend_from_slice(&b);
                    *a = Bytes::from(v);
                }
                (_, e) => merged.push(e),
            }
        }
        merged
    }

    #[test]
    fn parts_stream_whatever_the_chunking() {
        let body = b"preamble\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/tmp/a b.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nhello\r\n-XyZ not yet\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"rel/c%22q.txt\"\r\n\r\n\r\n--XyZ--\r\nepilogue";
        let want = vec![
            Event::Part {
                name: "file".into(),
                filename: Some("/tmp/a b.txt".into()),
            },
            Event::Data(Bytes::from_static(b"hello\r\n-XyZ not yet")),
            Event::PartEnd,
            Event::Part {
                name: "file".into(),
                filename: Some("rel/c\"q.txt".into()),
            },
            Event::PartEnd,
            Event::End,
        ];
        for step in [1, 2, 3, 7, 64, 1000] {
            assert_eq!(parse_all(body, "XyZ", step), want, "step {step}");
        }
    }

    #[test]
    fn binary_data_with_crlf_is_exact() {
        let data: Vec<u8> = (0..=255u8)
            .cycle()
            .take(5000)
            .chain(*b"\r\n--C\r\n-")
            .collect();
        let mut body =
            b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x\"\r\n\r\n"
                .to_vec();
        body.extend_from_slice(&data);
        body.extend_from_slice(b"\r\n--B--\r\n");
        let ev = parse_all(&body, "B", 13);
        // Bytes that look like a delimiter of another boundary are data.
        assert_eq!(ev.len(), 4);
        assert_eq!(ev[1], Event::Data(Bytes::from(data)));
        assert_eq!(ev[3], Event::End);
    }

    #[test]
    fn boundaries_come_from_the_content_type() {
        assert_eq!(
            boundary("multipart/form-data; boundary=abc").as_deref(),
            Some("abc")
        );
        assert_eq!(
            boundary("multipart/form-data; charset=x; boundary=\"q r\"").as_deref(),
            Some("q r")
        );
        assert_eq!(boundary("application/octet-stream"), None);
        assert_eq!(boundary("multipart/form-data"), None);
    }

    #[test]
    fn junk_after_a_boundary_is_an_error() {
        let mut r = Reader::new("B");
        r.push(b"--Bjunk\r\n");
        assert!(r.next_event().is_err());
    }
}
