//! Resources, read through the API like the tools that read them:
//!
//! * `sandlot://sandboxes/{sandbox}/files/{path}`: a file of a sandbox (the path
//!   without its leading `/`), like `read_file`;
//! * `sandlot://memory/{store}/{key}`: a memory of a memory store (its path or
//!   id), its Markdown file as stored, like `memory_view`;
//! * `sandlot://collections/{collection}/{path}`: a document of a collection, as
//!   `cat` shows it in a read-only shell session of its own, like `vfs_shell`.

use base64::Engine;
use rmcp::model::{ResourceContents, ResourceTemplate};
use rmcp::ErrorData;
use sandlot_client::{encode_path as enc, Client};

use crate::tools::{read_capped, read_only_session, ToolError, MAX_READ_BYTES};

/// What a resource URI names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    SandboxFile { sandbox: String, path: String },
    Memory { store: String, key: String },
    Document { collection: String, path: String },
}

pub fn templates() -> Vec<ResourceTemplate> {
    vec![
        ResourceTemplate::new(
            "sandlot://sandboxes/{sandbox}/files/{+path}",
            "sandbox_file",
        )
        .with_title("A file of a sandbox")
        .with_description(
            "The content of a file in one of your sandboxes (path without its leading /); \
                 at most 1 MiB, text or base64 for binary content.",
        ),
        ResourceTemplate::new("sandlot://memory/{store}/{+key}", "memory")
            .with_title("A memory of a memory store")
            .with_description(
                "One memory of one of your memory stores (its path, e.g. notes/deploy.md, or \
                 its id): the Markdown file as stored, front matter included.",
            )
            .with_mime_type("text/markdown"),
        ResourceTemplate::new(
            "sandlot://collections/{collection}/{+path}",
            "collection_document",
        )
        .with_title("A document of a collection")
        .with_description(
            "One document of one of your collections (path without its leading /), as \
                 `cat` shows it in the collection's read-only shell; at most the shell's \
                 output limit.",
        ),
    ]
}

/// `s` with its `%XX` escapes decoded (as a URI template's expansion makes them).
fn percent_decoded(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// What resource `uri` names; an error naming the URI when it names nothing.
pub fn parse_uri(uri: &str) -> Result<Target, String> {
    const SHAPES: &str = "sandlot://sandboxes/{sandbox}/files/{path}, sandlot://memory/{store}/{key} or sandlot://collections/{collection}/{path}";
    let bad = || format!("{uri}: not a {SHAPES} URI");
    let bad_escape = || format!("{uri}: a bad %-escape");
    let (kind, rest) = uri
        .strip_prefix("sandlot://")
        .and_then(|r| r.split_once('/'))
        .ok_or_else(bad)?;
    let (owner, path) = match kind {
        "sandboxes" => rest.split_once("/files/").ok_or_else(bad)?,
        "memory" | "collections" => rest.split_once('/').ok_or_else(bad)?,
        _ => return Err(bad()),
    };
    let owner = percent_decoded(owner).ok_or_else(bad_escape)?;
    let path = percent_decoded(path).ok_or_else(bad_escape)?;
    let arg = match kind {
        "sandboxes" => "sandbox",
        "memory" => "store",
        _ => "collection",
    };
    crate::args::one_name(arg, &owner).map_err(|e| format!("{uri}: {e}"))?;
    let path = path.trim_start_matches('/');
    if path.is_empty() {
        return Err(format!("{uri}: names no file"));
    }
    if path.split('/').any(|c| c == "..") {
        return Err(format!("{uri}: a path with `..`"));
    }
    Ok(match kind {
        "sandboxes" => Target::SandboxFile {
            sandbox: owner,
            path: format!("/{path}"),
        },
        "memory" => Target::Memory {
            store: owner,
            key: path.to_string(),
        },
        _ => Target::Document {
            collection: owner,
            path: format!("/{path}"),
        },
    })
}

/// A client error as the MCP error of reading `uri`: not found, or invalid.
fn read_error(e: ToolError) -> ErrorData {
    match &e {
        ToolError::Api(api) if api.status().is_some_and(|s| s.as_u16() == 404) => {
            ErrorData::resource_not_found(e.to_string(), None)
        }
        _ => ErrorData::invalid_request(e.to_string(), None),
    }
}

pub async fn read(client: &Client, uri: &str) -> Result<ResourceContents, ErrorData> {
    match parse_uri(uri).map_err(|m| ErrorData::invalid_params(m, None))? {
        Target::SandboxFile { sandbox, path } => read_file(client, uri, &sandbox, &path).await,
        Target::Memory { store, key } => {
            let path = format!("/v1/memory/{}/memories/{}", enc(&store), enc(&key));
            let v = client
                .call_json("GET", &path, None)
                .await
                .map_err(|e| read_error(e.into()))?;
            let text = v["text"].as_str().unwrap_or_default().to_string();
            Ok(ResourceContents::text(text, uri).with_mime_type("text/markdown"))
        }
        Target::Document { collection, path } => {
            read_document(client, uri, &collection, &path).await
        }
    }
}

async fn read_file(
    client: &Client,
    uri: &str,
    sandbox: &str,
    path: &str,
) -> Result<ResourceContents, ErrorData> {
    let (data, total) = read_capped(client, sandbox, path, MAX_READ_BYTES as usize)
        .await
        .map_err(read_error)?;
    if total > data.len() as u64 {
        return Err(ErrorData::invalid_request(
            format!(
                "{uri}: the file has {total} bytes, more than a resource holds ({MAX_READ_BYTES}); use read_file with max_bytes"
            ),
            None,
        ));
    }
    Ok(match String::from_utf8(data) {
        Ok(text) => ResourceContents::text(text, uri),
        Err(e) => ResourceContents::blob(
            base64::engine::general_purpose::STANDARD.encode(e.into_bytes()),
            uri,
        )
        .with_mime_type("application/octet-stream"),
    })
}

/// `path` as one word of the collections' shell, quoted.
fn shell_word(path: &str) -> String {
    format!("'{}'", path.replace('\'', "'\\''"))
}

/// A document of a collection, through a shell session of its own.
async fn read_document(
    client: &Client,
    uri: &str,
    collection: &str,
    path: &str,
) -> Result<ResourceContents, ErrorData> {
    let s = client
        .open_vfs_session(collection, &read_only_session())
        .await
        .map_err(|e| read_error(e.into()))?;
    let r = client
        .vfs_run(collection, &s.id, &format!("cat -- {}", shell_word(path)))
        .await;
    let _ = client.close_vfs_session(collection, &s.id).await;
    let r = r.map_err(|e| read_error(e.into()))?;
    if r.exit_code != 0 {
        return Err(ErrorData::resource_not_found(
            format!("{uri}: {}", r.stderr.trim()),
            None,
        ));
    }
    if r.truncated {
        return Err(ErrorData::invalid_request(
            format!("{uri}: the document is longer than the shell's output limit; read it in parts with vfs_shell (head, sed -n)"),
            None,
        ));
    }
    Ok(ResourceContents::text(r.stdout, uri))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resource_uri_names_one_sandbox_store_or_collection_and_a_path_in_it() {
        assert_eq!(
            parse_uri("sandlot://sandboxes/sb-1/files/tmp/a%20b.txt").unwrap(),
            Target::SandboxFile {
                sandbox: "sb-1".into(),
                path: "/tmp/a b.txt".into()
            }
        );
        assert_eq!(
            parse_uri("sandlot://memory/team/notes/deploy.md").unwrap(),
            Target::Memory {
                store: "team".into(),
                key: "notes/deploy.md".into()
            }
        );
        assert_eq!(
            parse_uri("sandlot://collections/docs/guide/intro.md").unwrap(),
            Target::Document {
                collection: "docs".into(),
                path: "/guide/intro.md".into()
            }
        );
        for bad in [
            "file:///etc/passwd",
            "sandlot://sandboxes/sb-1/tmp/x",
            "sandlot://sandboxes/sb-1/files/",
            "sandlot://sandboxes/../files/etc/passwd",
            "sandlot://sandboxes/a%2Fb/files/etc/passwd",
            "sandlot://sandboxes/sb-1/files/x%zz",
            "sandlot://memory/team",
            "sandlot://memory/team/../other/x.md",
            "sandlot://collections/docs/",
            "sandlot://collections/%2E%2E/x",
            "sandlot://volumes/v/x",
        ] {
            assert!(parse_uri(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_document_path_is_one_quoted_word_of_the_shell() {
        assert_eq!(shell_word("/a b"), "'/a b'");
        assert_eq!(shell_word("/it's; rm -rf /"), "'/it'\\''s; rm -rf /'");
    }
}
