//! Memory documents: Markdown with YAML front matter.
//!
//! A memory file looks like
//!
//! ```text
//! ---
//! id: churn-q3
//! title: Customer churn rose in Q3
//! type: fact
//! tags: [customers, churn]
//! links: [acme-corp]
//! created: 2026-11-01T10:00:00Z
//! updated: 2026-11-01T10:00:00Z
//! valid_from: 2026-10-01
//! ---
//! Body in Markdown. [Acme](../companies/acme-corp.md) is a relation too.
//! ```
//!
//! Files without front matter are valid memories too (the memory tool writes plain files); their
//! id is derived from the path. Unknown front matter keys are preserved verbatim on rewrite.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use serde::{Deserialize, Serialize};

/// Errors from parsing or rendering a memory document.
#[derive(Debug, thiserror::Error)]
pub enum DocError {
    #[error("parse front matter of {path}: {source}")]
    FrontMatter {
        path: String,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("parse front matter of {path}: opening '---' has no closing '---' line")]
    Unterminated { path: String },
    #[error("render front matter of {path}: {source}")]
    Render {
        path: String,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("parse time {value:?} in field {field} of {path}: expected RFC 3339 or YYYY-MM-DD")]
    Time {
        path: String,
        field: &'static str,
        value: String,
    },
}

/// The YAML front matter of a memory. Every field is optional on disk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FrontMatter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Relations: memory ids or store-relative paths of other memories.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_to: Option<String>,
    /// Set on a superseded memory: the id of its successor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<String>,
    /// Set on a successor: the id of the memory it supersedes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supersedes: Option<String>,
    /// Keys Sandlot does not know, kept as written.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_yaml_ng::Value>,
}

/// A parsed memory document.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// `None` when the file has no front matter block.
    pub front: Option<FrontMatter>,
    pub body: String,
    /// 1-based line number in the file where `body` starts.
    pub body_line: usize,
}

impl Document {
    /// Parses `text` (the content of the file at store-relative `path`).
    pub fn parse(path: &str, text: &str) -> Result<Document, DocError> {
        let Some(rest) = text
            .strip_prefix("---\n")
            .or_else(|| text.strip_prefix("---\r\n"))
        else {
            return Ok(Document {
                front: None,
                body: text.to_string(),
                body_line: 1,
            });
        };
        // Find the closing delimiter line.
        let mut offset = 0usize;
        // Line 1 is the opening '---'.
        for (line_no, line) in (2usize..).zip(rest.split_inclusive('\n')) {
            let trimmed = line.trim_end_matches(['\n', '\r']);
            if trimmed == "---" || trimmed == "..." {
                let yaml = &rest[..offset];
                let body = &rest[offset + line.len()..];
                let front: FrontMatter = if yaml.trim().is_empty() {
                    FrontMatter::default()
                } else {
                    serde_yaml_ng::from_str(yaml).map_err(|source| DocError::FrontMatter {
                        path: path.to_string(),
                        source,
                    })?
                };
                return Ok(Document {
                    front: Some(front),
                    body: body.to_string(),
                    body_line: line_no + 1,
                });
            }
            offset += line.len();
        }
        Err(DocError::Unterminated {
            path: path.to_string(),
        })
    }

    /// Renders the document back to file text.
    pub fn render(&self, path: &str) -> Result<String, DocError> {
        match &self.front {
            None => Ok(self.body.clone()),
            Some(front) => {
                let yaml = serde_yaml_ng::to_string(front).map_err(|source| DocError::Render {
                    path: path.to_string(),
                    source,
                })?;
                let mut out = String::with_capacity(yaml.len() + self.body.len() + 8);
                out.push_str("---\n");
                out.push_str(&yaml);
                if !yaml.ends_with('\n') {
                    out.push('\n');
                }
                out.push_str("---\n");
                out.push_str(&self.body);
                Ok(out)
            }
        }
    }

    /// The memory id: front matter `id`, else derived from the path (`people/alice.md` → `people/alice`).
    pub fn id_or_path(&self, path: &str) -> String {
        self.front
            .as_ref()
            .and_then(|f| f.id.clone())
            .unwrap_or_else(|| id_from_path(path))
    }

    /// The title: front matter `title`, else the first Markdown heading, else the file stem.
    pub fn title(&self, path: &str) -> String {
        if let Some(t) = self.front.as_ref().and_then(|f| f.title.clone()) {
            return t;
        }
        for line in self.body.lines() {
            let l = line.trim_start();
            if let Some(h) = l.strip_prefix('#') {
                let h = h.trim_start_matches('#').trim();
                if !h.is_empty() {
                    return h.to_string();
                }
            }
        }
        let stem = path.rsplit('/').next().unwrap_or(path);
        stem.rsplit_once('.')
            .map(|(s, _)| s)
            .unwrap_or(stem)
            .to_string()
    }

    /// All relations: front matter `links` plus relative Markdown links in the body
    /// (resolved against the file's folder, normalised to store-relative paths).
    pub fn relations(&self, path: &str) -> Vec<String> {
        let mut out: Vec<String> = self
            .front
            .as_ref()
            .map(|f| {
                let mut v = f.links.clone();
                v.extend(f.superseded_by.iter().cloned());
                v.extend(f.supersedes.iter().cloned());
                v
            })
            .unwrap_or_default();
        let dir = path.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
        for target in markdown_link_targets(&self.body) {
            if let Some(p) = resolve_relative(dir, &target) {
                out.push(p);
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

/// `people/alice.md` → `people/alice`.
pub fn id_from_path(path: &str) -> String {
    path.strip_suffix(".md")
        .or_else(|| path.strip_suffix(".markdown"))
        .unwrap_or(path)
        .to_string()
}

/// A lowercase, dash-separated slug of `s` suitable for a file name (at most 80 bytes).
pub fn slugify(s: &str) -> String {
    let mut out = String::new();
    let mut dash = false;
    for c in s.chars() {
        if c.is_alphanumeric() {
            for l in c.to_lowercase() {
                out.push(l);
            }
            dash = false;
        } else if !dash && !out.is_empty() {
            out.push('-');
            dash = true;
        }
        if out.len() >= 80 {
            break;
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    if out.is_empty() {
        out.push_str("memory");
    }
    out
}

/// Targets of inline Markdown links `[text](target)` that are relative file links
/// (no scheme, no leading '/', not a pure fragment). Fragments and titles are stripped.
fn markdown_link_targets(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = body.as_bytes();
    let mut i = 0;
    while let Some(pos) = body[i..].find("](") {
        let start = i + pos + 2;
        let Some(end_rel) = body[start..].find(')') else {
            break;
        };
        let raw = body[start..start + end_rel].trim();
        let raw = raw.split_whitespace().next().unwrap_or("");
        let raw = raw.trim_start_matches('<').trim_end_matches('>');
        let target = raw.split('#').next().unwrap_or("");
        let is_external = target.contains("://") || target.starts_with("mailto:");
        if !target.is_empty() && !is_external && !target.starts_with('/') {
            out.push(target.to_string());
        }
        i = start + end_rel.min(bytes.len() - start);
    }
    out
}

/// Resolves `target` relative to folder `dir`; `None` if it escapes the store root.
fn resolve_relative(dir: &str, target: &str) -> Option<String> {
    let mut parts: Vec<&str> = if dir.is_empty() {
        Vec::new()
    } else {
        dir.split('/').collect()
    };
    for seg in target.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    if parts.is_empty() {
        None
    } else {
        Some(parts.join("/"))
    }
}

/// Current time as RFC 3339 with second precision, UTC.
pub fn now_rfc3339() -> String {
    Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Parses an RFC 3339 time or a `YYYY-MM-DD` date (midnight UTC) or `YYYY-MM-DDTHH:MM:SS` (UTC)
/// to UNIX seconds.
pub fn parse_time(value: &str) -> Option<i64> {
    let v = value.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(v) {
        return Some(t.timestamp());
    }
    if let Ok(t) = NaiveDateTime::parse_from_str(v, "%Y-%m-%dT%H:%M:%S") {
        return Some(t.and_utc().timestamp());
    }
    if let Ok(d) = NaiveDate::parse_from_str(v, "%Y-%m-%d") {
        return Some(d.and_hms_opt(0, 0, 0)?.and_utc().timestamp());
    }
    None
}

/// Parses a validity field; a present but unparsable value is an error naming the field.
pub(crate) fn parse_time_field(
    path: &str,
    field: &'static str,
    value: Option<&str>,
) -> Result<Option<i64>, DocError> {
    match value {
        None => Ok(None),
        Some(v) => parse_time(v).map(Some).ok_or_else(|| DocError::Time {
            path: path.to_string(),
            field,
            value: v.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_render_round_trip_keeps_unknown_keys() {
        let text = "---\nid: a1\ntitle: Alpha\ntags: [x, y]\ncustom: 42\n---\n# Alpha\nbody\n";
        let d = Document::parse("notes/a.md", text).unwrap();
        let f = d.front.as_ref().unwrap();
        assert_eq!(f.id.as_deref(), Some("a1"));
        assert_eq!(f.tags, vec!["x", "y"]);
        assert_eq!(f.extra.get("custom").unwrap().as_u64(), Some(42));
        assert_eq!(d.body, "# Alpha\nbody\n");
        assert_eq!(d.body_line, 7);
        let again = Document::parse("notes/a.md", &d.render("notes/a.md").unwrap()).unwrap();
        assert_eq!((again.front, again.body), (d.front, d.body));
    }

    #[test]
    fn no_front_matter_is_plain_body() {
        let d = Document::parse("x.md", "hello\n").unwrap();
        assert!(d.front.is_none());
        assert_eq!(d.id_or_path("dir/x.md"), "dir/x");
        assert_eq!(d.title("dir/x.md"), "x");
    }

    #[test]
    fn unterminated_front_matter_is_an_error() {
        let e = Document::parse("x.md", "---\nid: a\nbody\n").unwrap_err();
        assert!(e.to_string().contains("no closing"), "{e}");
    }

    #[test]
    fn bad_yaml_names_the_file() {
        let e = Document::parse("p/q.md", "---\ntags: [unclosed\n---\n").unwrap_err();
        assert!(e.to_string().contains("p/q.md"), "{e}");
    }

    #[test]
    fn relations_include_relative_markdown_links() {
        let text = "---\nlinks: [acme]\n---\nSee [Bob](../people/bob.md#x) and [web](https://e.invalid/) and [c](c.md \"t\").\n";
        let d = Document::parse("notes/a.md", text).unwrap();
        assert_eq!(
            d.relations("notes/a.md"),
            vec!["acme", "notes/c.md", "people/bob.md"]
        );
    }

    #[test]
    fn slug_and_times() {
        assert_eq!(
            slugify("Customer churn: Q3 / 2026!"),
            "customer-churn-q3-2026"
        );
        assert_eq!(slugify("!!!"), "memory");
        assert_eq!(parse_time("2026-01-02"), Some(1767312000));
        assert_eq!(parse_time("2026-01-02T00:00:00Z"), Some(1767312000));
        assert_eq!(parse_time("2026-01-02T01:00:00+01:00"), Some(1767312000));
        assert_eq!(parse_time("yesterday"), None);
    }
}
