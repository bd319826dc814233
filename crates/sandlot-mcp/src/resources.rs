//! Resources: a sandbox's files as `sandlot://sandboxes/{sandbox}/files/{path}`
//! (the path without its leading `/`), read through the API like `read_file`.

use base64::Engine;
use rmcp::model::{ResourceContents, ResourceTemplate};
use rmcp::ErrorData;
use sandlot_client::Client;

use crate::tools::{read_capped, ToolError, MAX_READ_BYTES};

const PREFIX: &str = "sandlot://sandboxes/";

pub fn templates() -> Vec<ResourceTemplate> {
    vec![ResourceTemplate::new(
        "sandlot://sandboxes/{sandbox}/files/{+path}",
        "sandbox_file",
    )
    .with_title("A file of a sandbox")
    .with_description(
        "The content of a file in one of your sandboxes (path without its leading /); \
         at most 1 MiB, text or base64 for binary content.",
    )]
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

/// The sandbox and absolute path a resource URI names.
pub fn parse_uri(uri: &str) -> Result<(String, String), String> {
    let rest = uri.strip_prefix(PREFIX).ok_or_else(|| {
        format!("{uri}: not a sandlot://sandboxes/{{sandbox}}/files/{{path}} URI")
    })?;
    let (sandbox, path) = rest.split_once("/files/").ok_or_else(|| {
        format!("{uri}: not a sandlot://sandboxes/{{sandbox}}/files/{{path}} URI")
    })?;
    let bad_escape = || format!("{uri}: a bad %-escape");
    let sandbox = percent_decoded(sandbox).ok_or_else(bad_escape)?;
    let path = percent_decoded(path).ok_or_else(bad_escape)?;
    crate::args::one_name("sandbox", &sandbox).map_err(|e| format!("{uri}: {e}"))?;
    if path.is_empty() {
        return Err(format!("{uri}: names no file"));
    }
    Ok((sandbox, format!("/{path}")))
}

pub async fn read(client: &Client, uri: &str) -> Result<ResourceContents, ErrorData> {
    let (sandbox, path) = parse_uri(uri).map_err(|m| ErrorData::invalid_params(m, None))?;
    let (data, total) = read_capped(client, &sandbox, &path, MAX_READ_BYTES as usize)
        .await
        .map_err(|e| match &e {
            ToolError::Api(api) if api.status().is_some_and(|s| s.as_u16() == 404) => {
                ErrorData::resource_not_found(e.to_string(), None)
            }
            _ => ErrorData::invalid_request(e.to_string(), None),
        })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resource_uri_names_one_sandbox_and_an_absolute_path() {
        assert_eq!(
            parse_uri("sandlot://sandboxes/sb-1/files/tmp/a%20b.txt").unwrap(),
            ("sb-1".to_string(), "/tmp/a b.txt".to_string())
        );
        for bad in [
            "file:///etc/passwd",
            "sandlot://sandboxes/sb-1/tmp/x",
            "sandlot://sandboxes/sb-1/files/",
            "sandlot://sandboxes/../files/etc/passwd",
            "sandlot://sandboxes/a%2Fb/files/etc/passwd",
            "sandlot://sandboxes/sb-1/files/x%zz",
        ] {
            assert!(parse_uri(bad).is_err(), "{bad}");
        }
    }
}
