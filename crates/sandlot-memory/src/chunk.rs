//! Splitting a memory body into search chunks.
//!
//! Headings start a new chunk; paragraphs are grouped until a chunk holds about
//! [`TARGET_WORDS`] words; an overlong paragraph is split at line, then word, boundaries so no
//! chunk exceeds [`MAX_WORDS`] (all-MiniLM-L6-v2 reads at most 256 word pieces).

use sha2::{Digest, Sha256};

/// Words a chunk aims for.
pub const TARGET_WORDS: usize = 120;
/// Words a chunk never exceeds.
pub const MAX_WORDS: usize = 180;

/// One chunk of a memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// 1-based first and last line in the file.
    pub line: usize,
    pub end_line: usize,
    /// The chunk's text as in the file.
    pub text: String,
    /// The text that is embedded (front matter title, if any, then the chunk text).
    pub embed_text: String,
    /// SHA-256 (hex) of `embed_text`: the key of its vectors, independent of the file path.
    pub hash: String,
}

/// Hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    let d = Sha256::digest(data);
    let mut s = String::with_capacity(64);
    for b in d {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

fn words(s: &str) -> usize {
    s.split_whitespace().count()
}

/// Splits `body` (which starts at 1-based line `first_line` of the file) into chunks.
/// `title` is the front matter title, prefixed to every chunk's embedding text.
pub fn chunk_body(body: &str, first_line: usize, title: Option<&str>) -> Vec<Chunk> {
    // Blocks: runs of non-blank lines, a heading always starting a new block.
    let mut blocks: Vec<(usize, usize, String, bool)> = Vec::new(); // (line, end_line, text, is_heading)
    let mut cur: Option<(usize, usize, String)> = None;
    let mut in_fence = false;
    for (i, line) in body.lines().enumerate() {
        let ln = first_line + i;
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            in_fence = !in_fence;
        }
        let heading = !in_fence && t.starts_with('#') && t.trim_start_matches('#').starts_with(' ');
        if line.trim().is_empty() && !in_fence {
            if let Some((a, b, s)) = cur.take() {
                blocks.push((a, b, s, false));
            }
            continue;
        }
        if heading {
            if let Some((a, b, s)) = cur.take() {
                blocks.push((a, b, s, false));
            }
            blocks.push((ln, ln, line.to_string(), true));
            continue;
        }
        match &mut cur {
            Some((_, b, s)) => {
                *b = ln;
                s.push('\n');
                s.push_str(line);
            }
            None => cur = Some((ln, ln, line.to_string())),
        }
    }
    if let Some((a, b, s)) = cur.take() {
        blocks.push((a, b, s, false));
    }

    // Split overlong blocks by lines, then by words.
    let mut pieces: Vec<(usize, usize, String, bool)> = Vec::new();
    for (a, b, s, h) in blocks {
        if words(&s) <= MAX_WORDS {
            pieces.push((a, b, s, h));
            continue;
        }
        let mut acc: Option<(usize, usize, String)> = None;
        for (i, line) in s.lines().enumerate() {
            let ln = a + i;
            if words(line) > MAX_WORDS {
                if let Some(p) = acc.take() {
                    pieces.push((p.0, p.1, p.2, false));
                }
                let ws: Vec<&str> = line.split_whitespace().collect();
                for part in ws.chunks(TARGET_WORDS) {
                    pieces.push((ln, ln, part.join(" "), false));
                }
                continue;
            }
            match &mut acc {
                Some((_, e, t)) if words(t) + words(line) <= MAX_WORDS => {
                    *e = ln;
                    t.push('\n');
                    t.push_str(line);
                }
                _ => {
                    if let Some(p) = acc.take() {
                        pieces.push((p.0, p.1, p.2, false));
                    }
                    acc = Some((ln, ln, line.to_string()));
                }
            }
        }
        if let Some(p) = acc.take() {
            pieces.push((p.0, p.1, p.2, false));
        }
        let _ = b;
    }

    // Group pieces into chunks; a heading closes the chunk before it and opens the next one.
    let mut chunks = Vec::new();
    let mut acc: Option<(usize, usize, String, usize)> = None; // (line, end, text, words)
    let flush = |acc: &mut Option<(usize, usize, String, usize)>, chunks: &mut Vec<Chunk>| {
        if let Some((a, b, text, _)) = acc.take() {
            let embed_text = match title {
                Some(t) if !t.trim().is_empty() => format!("{}\n{}", t.trim(), text),
                _ => text.clone(),
            };
            let hash = sha256_hex(embed_text.as_bytes());
            chunks.push(Chunk {
                line: a,
                end_line: b,
                text,
                embed_text,
                hash,
            });
        }
    };
    for (a, b, s, heading) in pieces {
        let w = words(&s);
        if heading {
            flush(&mut acc, &mut chunks);
            acc = Some((a, b, s, w));
            continue;
        }
        match &mut acc {
            Some((_, e, t, n)) if *n + w <= TARGET_WORDS || (*n < 16 && *n + w <= MAX_WORDS) => {
                *e = b;
                t.push_str("\n\n");
                t.push_str(&s);
                *n += w;
            }
            _ => {
                flush(&mut acc, &mut chunks);
                acc = Some((a, b, s, w));
            }
        }
    }
    flush(&mut acc, &mut chunks);
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headings_split_and_lines_are_tracked() {
        let body = "# A\nalpha one\nalpha two\n\n# B\n\nbeta\n";
        let c = chunk_body(body, 5, None);
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].line, c[0].end_line), (5, 7));
        assert_eq!(c[0].text, "# A\n\nalpha one\nalpha two");
        assert_eq!((c[1].line, c[1].end_line), (9, 11));
    }

    #[test]
    fn long_text_is_bounded() {
        let para = vec!["word"; 1000].join(" ");
        let body = format!("{para}\n\nshort tail\n");
        let c = chunk_body(&body, 1, None);
        assert!(c.len() >= 6, "{}", c.len());
        assert!(c.iter().all(|c| words(&c.text) <= MAX_WORDS));
        let last = c.last().unwrap();
        assert!(last.text.ends_with("word\n\nshort tail"), "{:?}", last.text);
        assert_eq!((last.line, last.end_line), (1, 3));
    }

    #[test]
    fn hash_depends_on_text_and_title_only() {
        let a = chunk_body("same text\n", 1, Some("T"));
        let b = chunk_body("\n\nsame text\n", 9, Some("T"));
        let c = chunk_body("same text\n", 1, Some("U"));
        assert_eq!(a[0].hash, b[0].hash);
        assert_ne!(a[0].hash, c[0].hash);
        assert!(a[0].embed_text.starts_with("T\n"));
    }

    #[test]
    fn empty_body_has_no_chunks() {
        assert!(chunk_body("\n\n  \n", 1, None).is_empty());
    }
}
