//! The create body of a sandbox checked into what `sandbox::create` takes: the
//! spec's keys and the others (`EXTRA_KEYS`), the name, tags, metadata, idle
//! timeout and lifecycle, the operator's defaults and ceilings (isolation,
//! network, public ports, CPUs, lifetime). Callers: the native create route and
//! E2B's create (which builds a native body from its own).

use std::collections::BTreeMap;

use sandlot_proto::spec::{SandboxSpec, SPEC_KEYS};
use serde_json::Value;

use super::parse_duration;
use crate::auth::Principal;
use crate::config::fmt_secs;
use crate::error::{ApiError, ApiResult};
use crate::routes::from_value;
use crate::sandbox::{spec_problem, CreateParams};
use crate::state::AppState;

/// Top-level keys of the create body that are not part of the spec.
pub const EXTRA_KEYS: &[&str] = &[
    "name",
    "tags",
    "metadata",
    "idle_timeout",
    "on_idle",
    "on_timeout",
    "auto_resume",
];

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

fn string_map(field: &str, v: Value) -> ApiResult<BTreeMap<String, String>> {
    match v {
        Value::Null => Ok(BTreeMap::new()),
        Value::Object(m) => m
            .into_iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k, s)),
                other => Err(ApiError::invalid(
                    format!("{field}.{k}"),
                    format!("values are strings, got {other}"),
                )),
            })
            .collect(),
        other => Err(ApiError::invalid(
            field,
            format!("expected an object of strings, got {other}"),
        )),
    }
}

/// Validates a create body into parameters.
pub fn parse(state: &AppState, p: &Principal, body: Value) -> ApiResult<CreateParams> {
    let tenant = p.tenant.clone();
    let Value::Object(mut obj) = body else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    };
    for k in obj.keys() {
        if !SPEC_KEYS.contains(&k.as_str()) && !EXTRA_KEYS.contains(&k.as_str()) {
            return Err(ApiError::invalid(
                k.clone(),
                format!(
                    "unknown field, expected one of {}",
                    [SPEC_KEYS, EXTRA_KEYS].concat().join(", ")
                ),
            ));
        }
    }
    let name = match obj.remove("name") {
        None | Some(Value::Null) => None,
        Some(Value::String(n)) => {
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
            Some(n)
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "name",
                format!("expected a string, got {other}"),
            ))
        }
    };
    let tags = string_map("tags", obj.remove("tags").unwrap_or(Value::Null))?;
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
    let metadata = string_map("metadata", obj.remove("metadata").unwrap_or(Value::Null))?;
    let size: usize = metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_METADATA_BYTES {
        return Err(ApiError::invalid(
            "metadata",
            format!("at most {MAX_METADATA_BYTES} bytes in all"),
        ));
    }
    let limits = &state.cfg.limits;
    let idle_timeout = match obj.remove("idle_timeout") {
        None => limits.default_idle_timeout.map(|s| s.duration()),
        Some(Value::Null) => None,
        Some(v) => Some(parse_duration("idle_timeout", &v)?),
    };
    let lifecycle = crate::autopause::parse_lifecycle(&mut obj, idle_timeout)?;
    let network_given = obj.contains_key("network");
    let isolation_given = obj.contains_key("isolation");
    let mut spec: SandboxSpec = from_value(Value::Object(obj))?;
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
        name,
        spec,
        tags,
        metadata,
        timeout,
        idle_timeout,
        lifecycle,
    })
}
