//! The create body of a sandbox, typed ([`CreateSandboxRequest`]), resolved into
//! what `sandbox::create` takes: the name, tags, metadata, idle timeout and
//! lifecycle checked, the operator's defaults applied where the request leaves
//! a field absent (isolation, network, CPUs, lifetime, idle timeout) and its
//! ceilings enforced (isolation, network, public ports, CPUs, lifetime).
//! Callers: the native create route ([`parse`]) and E2B's create (which builds
//! a request from its own body and calls [`resolve`]).

use sandlot_proto::api::CreateSandboxRequest;
use serde_json::Value;

use crate::auth::Principal;
use crate::body::from_value;
use crate::config::fmt_secs;
use crate::error::{ApiError, ApiResult};
use crate::sandbox::{spec_problem, CreateParams};
use crate::state::AppState;

const MAX_TAGS: usize = 64;
const MAX_METADATA_BYTES: usize = 16 * 1024;

fn check_label(field: &str, k: &str, max: usize) -> ApiResult<()> {
    let ok = !k.is_empty()
        && k.len() <= max
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            field,
            format!("{k:?}: use 1 to {max} letters, digits, '-', '_', '.', '/' or ':'"),
        ))
    }
}

/// Reads a create body (a JSON object) into the typed request, naming the
/// field of any error (`tags.x`, `volumes[0].target`, an unknown key; inside a
/// mount, the mount: `mounts[2]`), then [`resolve`]s it.
pub fn parse(state: &AppState, p: &Principal, body: Value) -> ApiResult<CreateParams> {
    if !body.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    let req: CreateSandboxRequest = from_value(body)?;
    resolve(state, p, req)
}

/// Checks a create request and resolves it against the operator's defaults and
/// ceilings.
pub fn resolve(
    state: &AppState,
    p: &Principal,
    req: CreateSandboxRequest,
) -> ApiResult<CreateParams> {
    let tenant = p.tenant.clone();
    if let Some(n) = &req.name {
        let ok = !n.is_empty()
            && n.len() <= 64
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && !n.starts_with(&state.cfg.id_prefix);
        if !ok {
            return Err(ApiError::invalid(
                "name",
                format!(
                    "{n:?}: use 1 to 64 letters, digits, '-', '_' or '.', not starting with the id prefix {:?}",
                    state.cfg.id_prefix
                ),
            ));
        }
    }
    let tags = req.tags.clone().unwrap_or_default();
    if tags.len() > MAX_TAGS {
        return Err(ApiError::invalid(
            "tags",
            format!("at most {MAX_TAGS} tags"),
        ));
    }
    for (k, v) in &tags {
        check_label("tags", k, 64)?;
        if v.len() > 256 {
            return Err(ApiError::invalid(
                format!("tags.{k}"),
                "values are at most 256 bytes",
            ));
        }
    }
    let metadata = req.metadata.clone().unwrap_or_default();
    let size: usize = metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_METADATA_BYTES {
        return Err(ApiError::invalid(
            "metadata",
            format!("at most {MAX_METADATA_BYTES} bytes in all"),
        ));
    }
    let limits = &state.cfg.limits;
    let idle_timeout = match req.idle_timeout {
        None => limits.default_idle_timeout.map(|s| s.duration()),
        Some(None) => None,
        Some(Some(s)) if s.duration().is_zero() => {
            return Err(ApiError::invalid("idle_timeout", "must be positive"))
        }
        Some(Some(s)) => Some(s.duration()),
    };
    let lifecycle = crate::autopause::lifecycle_of(&req, idle_timeout)?;
    let network_given = req.network.is_some();
    let isolation_given = req.isolation.is_some();
    let mut spec = req.spec();
    spec.validate()
        .map_err(|e| ApiError::invalid(e.field(), spec_problem(&e)))?;
    crate::isolation::admit(state, &mut spec, isolation_given)?;
    crate::network::admit(state, &mut spec, network_given)?;
    crate::ports::admit_public(&state.cfg.ports, &spec)?;
    if let Some(c) = spec.resources.cpus {
        let max = state.cfg.runtime.effective_max_cpus();
        if c > max {
            return Err(ApiError::invalid(
                "resources.cpus",
                format!("{c} cores exceeds the operator's ceiling of {max}"),
            ));
        }
    }
    let timeout = spec
        .timeout
        .map(|t| t.duration())
        .unwrap_or(limits.default_timeout.duration());
    let max = limits.max_timeout.duration();
    if timeout > max {
        return Err(ApiError::invalid(
            "timeout",
            format!(
                "{} exceeds the operator's maximum lifetime of {}",
                fmt_secs(timeout),
                fmt_secs(max)
            ),
        ));
    }
    if let Some(i) = idle_timeout {
        if i > max {
            return Err(ApiError::invalid(
                "idle_timeout",
                format!(
                    "{} exceeds the operator's maximum lifetime of {}",
                    fmt_secs(i),
                    fmt_secs(max)
                ),
            ));
        }
    }
    Ok(CreateParams {
        tenant,
        scope: p.scope.clone(),
        name: req.name,
        spec,
        tags,
        metadata,
        timeout,
        idle_timeout,
        lifecycle,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(body: Value) -> ApiError {
        match from_value::<CreateSandboxRequest>(body.clone()) {
            Ok(r) => panic!("{body} should be refused, got {r:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn a_bad_create_body_is_refused_naming_the_field() {
        for (body, field) in [
            (json!({"imgae": "host"}), "imgae"),
            (json!({"name": 5}), "name"),
            (json!({"tags": {"x": 1}}), "tags.x"),
            (json!({"tags": ["x"]}), "tags"),
            (json!({"metadata": {"k": []}}), "metadata.k"),
            (json!({"idle_timeout": "soon"}), "idle_timeout"),
            (json!({"idle_timeout": -1}), "idle_timeout"),
            (json!({"on_idle": "sleep"}), "on_idle"),
            (json!({"on_timeout": 1}), "on_timeout"),
            (json!({"auto_resume": "yes"}), "auto_resume"),
            (json!({"image": null}), "image"),
            (json!({"network": null}), "network"),
            (json!({"resources": null}), "resources"),
            (json!({"ports": null}), "ports"),
            (json!({"on_idle": {"pause": null}}), "on_idle"),
            (json!({"network": {"mode": "sideways"}}), "network.mode"),
            (json!({"isolation": "vm"}), "isolation"),
            (json!({"resources": {"memory": "lots"}}), "resources.memory"),
            (json!({"resources": {"colour": 1}}), "resources.colour"),
            (json!({"timeout": "forever"}), "timeout"),
            (
                json!({"mounts": [{"type": "tmpfs", "target": "/a"}, {"type": "tmpfs", "target": "/b"},
                    {"type": "bind", "source": 5, "target": "/c"}]}),
                "mounts[2]",
            ),
            (json!({"volumes": [{"name": "v"}]}), "volumes[0].target"),
            (
                json!({"secrets": [{"name": "s", "colour": 1}]}),
                "secrets[0].colour",
            ),
        ] {
            let e = refused(body.clone());
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{body}");
            let named = e.field.as_deref().unwrap_or("");
            assert!(
                named == field || named.starts_with(&format!("{field}.")),
                "{body}: field {named:?}, expected {field:?} ({})",
                e.message
            );
            // The message says what is wrong in the API's terms: no Rust type
            // (`struct NetworkSpec`, `enum MountSpec`) shows through.
            for rust in ["struct ", "enum ", "Spec", "Request", "OnExpiry"] {
                assert!(!e.message.contains(rust), "{body}: {}", e.message);
            }
        }
    }

    #[test]
    fn an_unknown_key_is_named_with_every_accepted_key() {
        let e = refused(json!({"image": "host", "imgae": "host"}));
        assert_eq!(e.field.as_deref(), Some("imgae"));
        for k in CreateSandboxRequest::keys() {
            assert!(e.message.contains(&format!("`{k}`")), "{k}: {}", e.message);
        }
    }

    #[test]
    fn a_create_body_read_as_the_route_reads_it_keeps_the_last_of_duplicate_keys() {
        // The route reads the body as a JSON value first (the idempotency key
        // hashes it), where a repeated key keeps its last value, as before the
        // request was typed.
        let v: Value =
            crate::body::parse_json(br#"{"name": "a", "network": {}, "name": "b"}"#).unwrap();
        let r: CreateSandboxRequest = from_value(v).unwrap();
        assert_eq!(r.name.as_deref(), Some("b"));
        assert!(r.network.is_some());
    }

    #[test]
    fn a_body_that_is_not_an_object_is_refused_by_the_type_too() {
        for body in [json!([]), json!("x"), json!(null), json!(1)] {
            let e = refused(body.clone());
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{body}");
        }
    }

    /// The keys `create_body` of the Python SDK sends: the `plain` table's and
    /// those it sets as `body["KEY"]`.
    fn python_sdk_create_keys() -> std::collections::BTreeSet<String> {
        let sdk = include_str!("../../../../sdk/python/src/sandlot/_spec.py");
        let f = &sdk[sdk.find("def create_body(").expect("the SDK's create_body")..];
        let f = &f[..f[1..].find("\ndef ").map_or(f.len(), |i| i + 1)];
        let mut keys = std::collections::BTreeSet::new();
        let plain = &f[f.find("plain = {").expect("its plain table")..];
        let plain = &plain[..plain.find("\n    }").expect("its end")];
        for l in plain.lines().skip(1) {
            if let Some((k, _)) = l.trim().strip_prefix('"').and_then(|r| r.split_once('"')) {
                keys.insert(k.to_string());
            }
        }
        for part in f.split("body[\"").skip(1) {
            if let Some((k, _)) = part.split_once('"') {
                keys.insert(k.to_string());
            }
        }
        keys
    }

    #[test]
    fn the_python_sdk_sends_only_fields_of_the_create_request() {
        let keys = python_sdk_create_keys();
        // The parse above found the table and the assignments.
        for k in [
            "image",
            "auto_resume",
            "env",
            "idle_timeout",
            "resources",
            "ports",
        ] {
            assert!(
                keys.contains(k),
                "{k} not found in the SDK's create_body: {keys:?}"
            );
        }
        let fields = CreateSandboxRequest::keys();
        for k in &keys {
            assert!(
                fields.contains(&k.as_str()),
                "sdk/python/src/sandlot/_spec.py create_body sends {k:?}, not a field of CreateSandboxRequest"
            );
        }
    }
}
