//! The web console: static assets built into the binary and served at `/ui` on the
//! TCP listener without a token. The console itself holds no authority: it calls
//! the public API from the browser with the token the user signs in with, so it
//! shows nothing that token could not fetch. Every answer carries a strict
//! Content-Security-Policy (scripts only from `/ui`, connections only to this
//! origin, no framing) and `nosniff`; tenant data is rendered as text by the
//! scripts themselves (`console/src/dom.js`). See `docs/console.md`.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

/// The Content-Security-Policy of every console answer. `style-src` allows inline
/// styles because xterm.js sizes its rows with `<style>` elements it creates; no
/// script runs but the console's own files.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self' 'unsafe-inline'; img-src 'self'; connect-src 'self'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One file of the console: its path under `/ui/`, its media type and bytes.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $type:expr) => {
        Asset {
            path: $path,
            content_type: $type,
            bytes: include_bytes!(concat!("../console/", $path)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

/// Every file the console serves; nothing else under `/ui/` exists.
const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
    asset!("src/app.js", JS),
    asset!("src/api.js", JS),
    asset!("src/dom.js", JS),
    asset!("src/format.js", JS),
    asset!("src/sandboxes.js", JS),
    asset!("src/sandbox.js", JS),
    asset!("src/terminal.js", JS),
    asset!("src/files.js", JS),
    asset!("src/network.js", JS),
    asset!("src/processes.js", JS),
    asset!("src/usage.js", JS),
    asset!("src/knowledge.js", JS),
    asset!("src/store.js", JS),
    asset!("src/operator.js", JS),
    asset!("src/style.css", CSS),
    asset!("vendor/xterm.js", JS),
    asset!("vendor/addon-fit.js", JS),
    asset!("vendor/xterm.css", CSS),
    asset!("vendor/LICENSE-xterm.txt", TEXT),
    asset!("vendor/LICENSE-addon-fit.txt", TEXT),
];

/// The routes of the console, for the TCP listener's router. Every answer under
/// them (files, 404, the redirect, a 405 for another method) carries the
/// console's headers.
pub fn router() -> Router {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(|| async { serve("index.html") }))
        .route(
            "/ui/{*path}",
            get(|Path(path): Path<String>| async move { serve(&path) }),
        )
        .layer(axum::middleware::map_response(with_console_headers))
}

/// The file at `path` under `/ui/`, or 404.
fn serve(path: &str) -> Response {
    match ASSETS.iter().find(|a| a.path == path) {
        Some(a) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(a.content_type),
            )],
            a.bytes,
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            )],
            "no such console file\n",
        )
            .into_response(),
    }
}

/// The console's security headers on `resp`.
async fn with_console_headers(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_has_a_type_matching_its_extension() {
        for a in ASSETS {
            let want = match a.path.rsplit_once('.').map(|(_, e)| e) {
                Some("js") => JS,
                Some("css") => CSS,
                Some("html") => "text/html; charset=utf-8",
                Some("svg") => "image/svg+xml",
                Some("txt") => TEXT,
                other => panic!("{}: unexpected extension {other:?}", a.path),
            };
            assert_eq!(a.content_type, want, "{}", a.path);
            assert!(!a.bytes.is_empty(), "{} is empty", a.path);
        }
    }

    #[test]
    fn the_console_scripts_never_parse_a_string_as_html_or_code() {
        // The console's own modules (not the vendored xterm.js, whose DOM renderer
        // writes only characters it renders): every string becomes a text node.
        for a in ASSETS
            .iter()
            .filter(|a| a.path.starts_with("src/") && a.path.ends_with(".js"))
        {
            let text = std::str::from_utf8(a.bytes).unwrap();
            for sink in [
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "DOMParser",
                "createContextualFragment",
                "eval(",
                "new Function",
                "srcdoc",
                "localStorage",
                "document.cookie",
            ] {
                assert!(!text.contains(sink), "{} uses {sink}", a.path);
            }
        }
    }

    #[test]
    fn the_policy_allows_no_inline_script_nor_foreign_connections_nor_framing() {
        let directives: Vec<&str> = CONTENT_SECURITY_POLICY.split(';').map(str::trim).collect();
        assert!(directives.contains(&"script-src 'self'"));
        assert!(directives.contains(&"connect-src 'self'"));
        assert!(directives.contains(&"frame-ancestors 'none'"));
        assert!(directives.contains(&"default-src 'none'"));
        assert!(!CONTENT_SECURITY_POLICY.contains("unsafe-eval"));
    }
}
