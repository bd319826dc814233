//! Which live sandboxes mount a tenant's memory store or collection: such a store or
//! collection cannot be removed while they run (its content is used in place).

use serde_json::Value;

use crate::state::AppState;

/// What a sandbox mount names, as in [`MountSpec`](sandlot_proto::spec::MountSpec).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountedKind {
    /// A memory store (`{"type": "memory", "store": NAME}`).
    Memory,
    /// A virtual filesystem collection (`{"type": "collection", "collection": NAME}`).
    Collection,
}

impl MountedKind {
    /// The mount's `type` tag and the field that names what it mounts.
    fn tag_and_field(self) -> (&'static str, &'static str) {
        match self {
            MountedKind::Memory => ("memory", "store"),
            MountedKind::Collection => ("collection", "collection"),
        }
    }
}

/// Whether a stored sandbox spec (JSON) mounts the `kind` named `name`.
pub fn spec_mounts(spec: &Value, kind: MountedKind, name: &str) -> bool {
    let (tag, field) = kind.tag_and_field();
    spec["mounts"]
        .as_array()
        .is_some_and(|ms| ms.iter().any(|m| m["type"] == tag && m[field] == name))
}

/// Ids, sorted, of the live sandboxes of `tenant` whose spec mounts the `kind` named `name`.
pub fn live_sandboxes_mounting(
    state: &AppState,
    tenant: &str,
    kind: MountedKind,
    name: &str,
) -> Vec<String> {
    let mut out: Vec<String> = state
        .all_live()
        .into_iter()
        .filter(|h| h.tenant == tenant)
        .filter(|h| {
            matches!(state.store.get_sandbox(&h.id),
                Ok(Some(rec)) if spec_mounts(&rec.spec, kind, name))
        })
        .map(|h| h.id.clone())
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec() -> Value {
        json!({"mounts": [
            {"type": "memory", "store": "notes", "target": "/mem"},
            {"type": "collection", "collection": "docs", "target": "/docs"},
            {"type": "bind", "source": "/srv", "target": "/srv"},
        ]})
    }

    #[test]
    fn matches_kind_and_name() {
        let s = spec();
        assert!(spec_mounts(&s, MountedKind::Memory, "notes"));
        assert!(spec_mounts(&s, MountedKind::Collection, "docs"));
        assert!(!spec_mounts(&s, MountedKind::Memory, "docs"));
        assert!(!spec_mounts(&s, MountedKind::Collection, "notes"));
        assert!(!spec_mounts(&s, MountedKind::Memory, "other"));
    }

    #[test]
    fn no_or_malformed_mounts_match_nothing() {
        assert!(!spec_mounts(&json!({}), MountedKind::Memory, "notes"));
        assert!(!spec_mounts(
            &json!({"mounts": {"type": "memory", "store": "notes"}}),
            MountedKind::Memory,
            "notes"
        ));
        assert!(!spec_mounts(
            &json!({"mounts": [{"type": "memory"}]}),
            MountedKind::Memory,
            "notes"
        ));
    }
}
