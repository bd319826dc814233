//! Vector-database chunk exports: one JSON object per line, each a chunk of a
//! document. Chunks are reassembled in index order.
//!
//! Accepted fields (first present wins):
//! - path: `path`, `document_path`, `source`, or the same keys inside `metadata`
//!   (plus `metadata.file_path`);
//! - chunk index: `chunk_index`, `chunk`, or the same inside `metadata`;
//! - text: `text`, `content`, `page_content`, `document`;
//! - metadata: `metadata` (object);
//! - ACL: `public` (bool) and `groups` (array of strings or comma-separated
//!   string), top level or inside `metadata`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Map, Value};

use super::{host_files, IngestError, IngestLimits, Listing, SourceEntry, SourceReader};
use crate::acl::Acl;

pub(crate) struct JsonlReader {
    file: PathBuf,
    limits: IngestLimits,
}

impl JsonlReader {
    pub(crate) fn new(file: PathBuf, limits: IngestLimits) -> Self {
        JsonlReader { file, limits }
    }
}

const PATH_KEYS: [&str; 3] = ["path", "document_path", "source"];
const CHUNK_KEYS: [&str; 2] = ["chunk_index", "chunk"];
const TEXT_KEYS: [&str; 4] = ["text", "content", "page_content", "document"];
const STRUCTURAL: [&str; 8] = [
    "path",
    "document_path",
    "source",
    "file_path",
    "chunk_index",
    "chunk",
    "groups",
    "public",
];

struct Chunk {
    line: usize,
    index: u64,
    text: String,
    acl: Option<Acl>,
    metadata: BTreeMap<String, Value>,
}

fn field<'a>(
    row: &'a Map<String, Value>,
    meta: Option<&'a Map<String, Value>>,
    keys: &[&str],
) -> Option<&'a Value> {
    keys.iter()
        .find_map(|k| row.get(*k))
        .or_else(|| meta.and_then(|m| keys.iter().find_map(|k| m.get(*k))))
}

fn parse_acl(
    row: &Map<String, Value>,
    meta: Option<&Map<String, Value>>,
) -> Result<Option<Acl>, String> {
    let public = match field(row, meta, &["public"]) {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(v) => return Err(format!("`public` must be a boolean, got {v}")),
    };
    let groups = match field(row, meta, &["groups"]) {
        None => None,
        Some(Value::String(s)) => Some(
            s.split(',')
                .map(str::trim)
                .filter(|g| !g.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>(),
        ),
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| format!("`groups` entries must be strings, got {v}"))
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(v) => return Err(format!("`groups` must be an array or a string, got {v}")),
    };
    if public.is_none() && groups.is_none() {
        return Ok(None);
    }
    Ok(Some(
        Acl {
            public: public.unwrap_or(false),
            groups: groups.unwrap_or_default(),
        }
        .normalized(),
    ))
}

fn parse_row(line: &str) -> Result<(String, Chunk), String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let Value::Object(row) = v else {
        return Err("row is not a JSON object".into());
    };
    let meta = match row.get("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m),
        Some(_) => return Err("`metadata` must be an object".into()),
    };
    let mut path_keys: Vec<&str> = PATH_KEYS.to_vec();
    path_keys.push("file_path");
    let path = match field(&row, meta, &path_keys) {
        Some(Value::String(s)) => s.trim_start_matches('/').to_string(),
        Some(v) => return Err(format!("document path must be a string, got {v}")),
        None => return Err("missing document path (`path`, `source` or `metadata.source`)".into()),
    };
    let index = match field(&row, meta, &CHUNK_KEYS) {
        Some(v) => v
            .as_u64()
            .ok_or_else(|| format!("chunk index must be a non-negative integer, got {v}"))?,
        None => return Err("missing chunk index (`chunk_index` or `metadata.chunk_index`)".into()),
    };
    let text = match TEXT_KEYS.iter().find_map(|k| row.get(*k)) {
        Some(Value::String(s)) => s.clone(),
        Some(v) => return Err(format!("chunk text must be a string, got {v}")),
        None => {
            return Err(
                "missing chunk text (`text`, `content`, `page_content` or `document`)".into(),
            )
        }
    };
    let acl = parse_acl(&row, meta)?;
    let metadata = meta
        .map(|m| {
            m.iter()
                .filter(|(k, _)| !STRUCTURAL.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    Ok((
        path,
        Chunk {
            line: 0,
            index,
            text,
            acl,
            metadata,
        },
    ))
}

impl SourceReader for JsonlReader {
    fn list(&mut self) -> Result<Listing, IngestError> {
        // Without following a link, a regular file only, at most the largest file
        // allowed (the export may be written by someone else while it is read).
        let (data, st) = host_files::read_file(
            None,
            &self.file,
            &self.file.display().to_string(),
            &self.limits,
        )?;
        let mtime = st.st_mtime;
        let text = String::from_utf8(data).map_err(|e| IngestError::Jsonl {
            file: self.file.clone(),
            line: 0,
            reason: format!("file is not UTF-8: {e}"),
        })?;
        let mut docs: BTreeMap<String, Vec<Chunk>> = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let (path, mut chunk) = parse_row(line).map_err(|reason| IngestError::Jsonl {
                file: self.file.clone(),
                line: i + 1,
                reason,
            })?;
            chunk.line = i + 1;
            docs.entry(path).or_default().push(chunk);
        }
        let mut entries = Vec::with_capacity(docs.len());
        for (path, mut chunks) in docs {
            chunks.sort_by_key(|c| c.index);
            let jerr = |line, reason| IngestError::Jsonl {
                file: self.file.clone(),
                line,
                reason,
            };
            for w in chunks.windows(2) {
                if w[0].index == w[1].index {
                    return Err(jerr(
                        w[1].line,
                        format!(
                            "duplicate chunk {} of {path:?} (also on line {})",
                            w[1].index, w[0].line
                        ),
                    ));
                }
                if w[0].acl != w[1].acl {
                    return Err(jerr(
                        w[1].line,
                        format!(
                            "chunks of {path:?} disagree on access (lines {} and {})",
                            w[0].line, w[1].line
                        ),
                    ));
                }
            }
            let mut body = String::new();
            for c in &chunks {
                if !body.is_empty() && !body.ends_with('\n') {
                    body.push('\n');
                }
                body.push_str(&c.text);
            }
            if !body.is_empty() && !body.ends_with('\n') {
                body.push('\n');
            }
            let first = &chunks[0];
            let mut metadata = first.metadata.clone();
            metadata.insert("chunks".into(), Value::from(chunks.len()));
            let bytes = body.into_bytes();
            entries.push(SourceEntry {
                tag: format!("jsonl:{}", crate::blob::hash_bytes(&bytes)),
                path,
                mtime,
                acl: first.acl.clone(),
                metadata,
                inline: Some(bytes),
                locator: String::new(),
            });
        }
        Ok(Listing {
            empty_dirs: Vec::new(),
            entries,
            skipped: Vec::new(),
        })
    }

    fn fetch(&mut self, entry: &SourceEntry) -> Result<Vec<u8>, IngestError> {
        Ok(entry.inline.clone().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn reassembles_chunks() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("x.jsonl");
        fs::write(
            &f,
            concat!(
                r#"{"id":"2","document":"second part","metadata":{"source":"/docs/a.md","chunk":1,"title":"A"}}"#, "\n",
                r#"{"id":"1","document":"first part","metadata":{"source":"/docs/a.md","chunk":0,"title":"A"}}"#, "\n",
                "\n",
                r#"{"path":"secret.md","chunk_index":0,"text":"s\n","groups":["hr"]}"#, "\n",
            ),
        )
        .unwrap();
        let l = JsonlReader::new(f, IngestLimits::default()).list().unwrap();
        assert_eq!(l.entries.len(), 2);
        assert_eq!(l.entries[0].path, "docs/a.md");
        assert_eq!(
            l.entries[0].inline.as_deref(),
            Some(&b"first part\nsecond part\n"[..])
        );
        assert_eq!(l.entries[0].metadata["title"], "A");
        assert_eq!(l.entries[1].acl, Some(Acl::groups(["hr"])));
    }

    #[test]
    fn errors_name_the_line() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("x.jsonl");
        fs::write(&f, "{\"path\":\"a\",\"chunk\":0,\"text\":\"x\"}\n{\"path\":\"a\",\"chunk\":0,\"text\":\"y\"}\n").unwrap();
        let e = JsonlReader::new(f.clone(), IngestLimits::default())
            .list()
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with(":2: duplicate chunk 0 of \"a\" (also on line 1)"),
            "{e}"
        );
        fs::write(&f, "{\"path\":\"a\",\"text\":\"x\"}\n").unwrap();
        let e = JsonlReader::new(f.clone(), IngestLimits::default())
            .list()
            .unwrap_err()
            .to_string();
        assert!(e.contains(":1: missing chunk index"), "{e}");
        fs::write(&f, "not json\n").unwrap();
        let e = JsonlReader::new(f, IngestLimits::default())
            .list()
            .unwrap_err()
            .to_string();
        assert!(e.contains(":1: invalid JSON"), "{e}");
    }
}
