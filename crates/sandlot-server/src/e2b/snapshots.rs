//! E2B's snapshots over the native ones (`snapshot.rs`): `sb.create_snapshot()`
//! (`POST /sandboxes/{id}/snapshots` `{name, memory}`), `Sandbox.list_snapshots()`
//! (`GET /snapshots`), `Sandbox.delete_snapshot()` (`DELETE /templates/{id}`:
//! E2B's snapshots are templates) and `Sandbox.create(snapshot_id)` (a create
//! whose `templateID` is a snapshot's id or name, [`of_create`]).
//!
//! A snapshot id is Sandlot's (`sn-...`); its `names` are the name it was given.
//! gVisor snapshots keep memory (`memory: false` is refused); namespace ones are
//! files only whatever `memory` says (a sandbox started from one starts its
//! processes afresh), as the namespace pause is.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use sandlot_proto::api::snapshot::CreateSnapshot;
use sandlot_proto::api::PauseKind;
use serde_json::{json, Map, Value};

use super::lifecycle::known_record;
use super::rest::{created_json, json_body, principal, timeout_secs, RestError, RestResult};
use super::E2b;
use crate::auth::Principal;
use crate::store::SnapshotRecord;

pub fn routes() -> Router<Arc<E2b>> {
    // Other methods on these paths answer as any call Sandlot lacks (501).
    let other = super::rest::unsupported;
    Router::new()
        .route("/sandboxes/{id}/snapshots", post(create).fallback(other))
        .route("/snapshots", get(list).fallback(other))
        .route(
            "/templates/{id}",
            get(super::templates::catalog::get_one)
                .delete(remove)
                .fallback(other),
        )
}

/// E2B's `SnapshotInfo`.
fn info(s: &SnapshotRecord) -> Value {
    json!({ "snapshotID": s.id, "names": s.name.iter().collect::<Vec<_>>() })
}

/// The `name` and `memory` of E2B's create-snapshot body.
fn snapshot_body(b: &Value) -> RestResult<(Option<String>, Option<bool>)> {
    let name = match b.get("name") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => return Err(RestError::bad(format!("name: expected a string, got {v}"))),
    };
    let memory = match b.get("memory") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(m)) => Some(*m),
        Some(v) => {
            return Err(RestError::bad(format!(
                "memory: expected true or false, got {v}"
            )))
        }
    };
    Ok((name, memory))
}

async fn create(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> RestResult<Response> {
    let p = principal(&e2b, &headers)?;
    let rec = known_record(&e2b, &p, &id)?;
    let b = json_body(&e2b, body).await?;
    let (name, memory) = snapshot_body(&b)?;
    if memory == Some(false)
        && crate::isolation::of_record(&rec.spec) == sandlot_proto::spec::Isolation::Gvisor
    {
        return Err(RestError::bad(
            "memory: false: a snapshot of a gVisor sandbox keeps its memory (sandboxes started from it continue its processes)",
        ));
    }
    let req = CreateSnapshot {
        name,
        checkpoint: None,
    };
    let s = crate::snapshot::create(&e2b.app, &p, &rec.id, &req).await?;
    Ok((StatusCode::CREATED, Json(info(&s))).into_response())
}

/// `sandboxID`, `name`, `limit` (1 to 100, default 100) and `nextToken` (the
/// offset of the page) of E2B's snapshot listing.
#[derive(Debug, Default, PartialEq)]
struct ListQuery {
    sandbox: Option<String>,
    name: Option<String>,
    limit: usize,
    offset: usize,
}

fn list_query(q: Option<&str>) -> RestResult<ListQuery> {
    let mut out = ListQuery {
        limit: 100,
        ..Default::default()
    };
    for (k, v) in form_urlencoded::parse(q.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "sandboxID" => out.sandbox = Some(v.into_owned()),
            "name" => out.name = Some(v.into_owned()),
            "limit" => {
                out.limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=100).contains(n))
                    .ok_or_else(|| RestError::bad(format!("limit: use 1 to 100, got {v:?}")))?
            }
            "nextToken" => {
                out.offset = v.parse().map_err(|_| {
                    RestError::bad(format!("nextToken: not a token of this server: {v:?}"))
                })?
            }
            _ => {}
        }
    }
    Ok(out)
}

async fn list(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> RestResult<Response> {
    let p = principal(&e2b, &headers)?;
    let q = list_query(q.as_deref())?;
    // E2B names carry a team and a tag (`team/name:tag`): the name is matched.
    let name = q.name.as_deref().map(bare_name);
    let all = crate::snapshot::list(&e2b.app, &p, q.sandbox.as_deref(), name)?;
    let page: Vec<Value> = all.iter().skip(q.offset).take(q.limit).map(info).collect();
    let mut resp = (StatusCode::OK, Json(Value::Array(page))).into_response();
    let next = q.offset.saturating_add(q.limit);
    if next < all.len() {
        if let Ok(v) = HeaderValue::from_str(&next.to_string()) {
            resp.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(resp)
}

/// `team/name:tag` → `name`.
fn bare_name(t: &str) -> &str {
    let t = t.rsplit('/').next().unwrap_or(t);
    t.split(':').next().unwrap_or(t)
}

/// `DELETE /templates/{id}`: a snapshot of the caller's is deleted (204), else
/// a template it built (`templates::catalog::delete`: 204, 404 when it has
/// none of that name).
async fn remove(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> RestResult<Response> {
    let p = principal(&e2b, &headers)?;
    // By id; by name only when no template the caller built has that name (a
    // snapshot's name never shadows a template: the template is deleted).
    let by_id = crate::snapshot::find(&e2b.app, &p, bare_name(&id)).ok();
    let named = || {
        super::templates::image_template(&e2b, &p.tenant, &id)
            .is_none()
            .then(|| snapshot_named(&e2b, &p, &id))
            .flatten()
    };
    let Some(s) = by_id.or_else(named) else {
        if bare_name(&id).starts_with("sn-") {
            return Err(RestError::new(
                StatusCode::NOT_FOUND,
                format!("snapshot {id:?} was not found"),
            ));
        }
        return super::templates::catalog::delete(&e2b, &p.tenant, &id).await;
    };
    match crate::snapshot::delete(&e2b.app, &p, &s.id).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT.into_response()),
        Err(e) if e.status == StatusCode::NOT_FOUND => Err(RestError::new(
            StatusCode::NOT_FOUND,
            format!("snapshot {id:?} was not found"),
        )),
        Err(e) => Err(e.into()),
    }
}

/// The caller's snapshot `t` names: by id (a tag after `:` ignored), else the
/// newest of that name.
fn snapshot_named(e2b: &E2b, p: &Principal, t: &str) -> Option<SnapshotRecord> {
    let bare = bare_name(t);
    if let Ok(s) = crate::snapshot::find(&e2b.app, p, bare) {
        return Some(s);
    }
    crate::snapshot::list(&e2b.app, p, None, Some(bare))
        .ok()?
        .pop()
}

/// The snapshot an E2B create names as its template: by its id always; by its
/// name only when no template answers to that name (the operator's, or one the
/// caller built), so a snapshot's name never shadows a template.
pub fn of_create(e2b: &E2b, p: &Principal, body: &Map<String, Value>) -> Option<SnapshotRecord> {
    let t = body.get("templateID")?.as_str()?;
    if let Ok(s) = crate::snapshot::find(&e2b.app, p, bare_name(t)) {
        return Some(s);
    }
    let a_template = e2b.cfg.templates.contains_key(bare_name(t))
        || e2b.cfg.templates.contains_key(t)
        || super::templates::image_template(e2b, &p.tenant, t).is_some();
    if a_template {
        return None;
    }
    snapshot_named(e2b, p, t)
}

/// `POST /sandboxes` from snapshot `s`: a sandbox continuing it (gVisor) or
/// started afresh on its files (namespace), with the body's `timeout`.
pub async fn create_from(
    e2b: &E2b,
    p: &Principal,
    s: &SnapshotRecord,
    body: &Map<String, Value>,
) -> RestResult<Response> {
    super::rest::refuse_unsupported(body)?;
    let nonempty = |k: &str| {
        body.get(k)
            .and_then(Value::as_object)
            .is_some_and(|o| !o.is_empty())
    };
    for k in ["envVars", "metadata"] {
        if nonempty(k) {
            return Err(RestError::bad(format!(
                "{k}: a sandbox created from a snapshot has the snapshot's (its {k} cannot be set)"
            )));
        }
    }
    // Its network policy is the snapshot's: a request for another one is
    // refused, never dropped (a narrower policy asked for must not come out
    // open). The SDK's default, `allow_internet_access: true` and no `network`,
    // asks for nothing.
    let narrower = nonempty("network")
        || ["allow_internet_access", "allowInternetAccess"]
            .iter()
            .any(|k| {
                body.get(*k)
                    .is_some_and(|v| v != &Value::Bool(true) && !v.is_null())
            });
    if narrower {
        return Err(RestError::bad(
            "network, allow_internet_access: a sandbox created from a snapshot has the snapshot's network policy; change it once it runs (update_network)",
        ));
    }
    let lifecycle = super::lifecycle::of_create(body).map_err(RestError::bad)?;
    if !lifecycle.is_default() {
        return Err(RestError::bad(
            "autoPause: a sandbox created from a snapshot has the snapshot's lifecycle",
        ));
    }
    let secs = timeout_secs(&Value::Object(body.clone()), "timeout")?;
    let sb = crate::snapshot::start(&e2b.app, p, &s.id, secs).await?;
    let rec = known_record(e2b, p, &sb.id)?;
    if s.kind == PauseKind::Filesystem {
        tracing::debug!(sandbox_id = %rec.id, snapshot = %s.id, "started afresh on a snapshot's files");
    }
    Ok((StatusCode::CREATED, Json(created_json(e2b, &rec))).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2b_snapshot_names_match_without_team_or_tag() {
        assert_eq!(bare_name("team/snap-1:default"), "snap-1");
        assert_eq!(bare_name("sn-0123:default"), "sn-0123");
        assert_eq!(bare_name("plain"), "plain");
    }

    #[test]
    fn a_snapshot_listing_pages_by_offset_and_refuses_bad_limits_and_tokens() {
        let q = list_query(Some("sandboxID=sb-1&name=n&limit=2&nextToken=4")).unwrap();
        assert_eq!(
            q,
            ListQuery {
                sandbox: Some("sb-1".into()),
                name: Some("n".into()),
                limit: 2,
                offset: 4
            }
        );
        assert_eq!(list_query(None).unwrap().limit, 100);
        assert!(list_query(Some("limit=0")).is_err());
        assert!(list_query(Some("limit=101")).is_err());
        assert!(list_query(Some("nextToken=abc")).is_err());
    }

    #[test]
    fn a_create_snapshot_body_takes_a_name_and_a_memory_flag() {
        assert_eq!(snapshot_body(&json!({})).unwrap(), (None, None));
        assert_eq!(
            snapshot_body(&json!({"name": "a", "memory": false})).unwrap(),
            (Some("a".into()), Some(false))
        );
        assert!(snapshot_body(&json!({"name": 1})).is_err());
        assert!(snapshot_body(&json!({"memory": "yes"})).is_err());
    }
}
