//! The committed `api/openapi.json` is the document the code generates.
//! Regenerate with `SANDLOT_UPDATE_OPENAPI=1 cargo test -p sandlot-server --test openapi`.

use std::path::PathBuf;

#[test]
fn committed_openapi_matches_the_code() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../api/openapi.json");
    let generated = sandlot_server::openapi::json();
    if std::env::var_os("SANDLOT_UPDATE_OPENAPI").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "read {}: {e} (generate it with SANDLOT_UPDATE_OPENAPI=1)",
            path.display()
        )
    });
    assert!(
        committed == generated,
        "api/openapi.json is stale: regenerate with SANDLOT_UPDATE_OPENAPI=1 cargo test -p sandlot-server --test openapi"
    );
    // Sanity: the document lists every route group and the error shape.
    let v: serde_json::Value = serde_json::from_str(&generated).unwrap();
    for p in [
        "/v1/sandboxes",
        "/v1/sandboxes/{id}/exec",
        "/v1/sandboxes/{id}/files",
        "/v1/sandboxes/{id}/processes/{pid}/output",
    ] {
        assert!(v["paths"][p].is_object(), "missing {p}");
    }
    assert!(v["components"]["schemas"]["ErrorEnvelope"].is_object());
}
