//! E2B's template listing, inspection and deletion over the tenant's own image
//! tags: `GET /templates` and `GET /v2/templates` (the caller's templates),
//! `GET /templates/{templateID}` (one with its builds) and the template half of
//! `DELETE /templates/{templateID}` (`snapshots.rs` takes the snapshot half).
//!
//! A template of a tenant is a repository of the tags in its own namespace
//! (`NAME:TAG`, however they were made: an E2B build, a native build, a tag
//! request), with the builds this listener still remembers of that name. The
//! operator's templates (`[e2b.templates]`) and shared images are E2B's public
//! templates: not listed, not shown, not deleted here (404).
//!
//! Deleting removes the tenant's tags of the repository, forgets its builds and
//! lets each image it named go through the daemon's removal of committed images
//! (`pause::forget_commit`): removed with its unused layers when nothing else
//! names or holds it, else when its last sandbox lets it go; layers a snapshot
//! or another image uses stay. A build of it that is running refuses the
//! delete (409); one still waiting for its files is dropped with the template.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use sandlot_store::{ImageInfo, ImageName, ScopedTag};
use serde_json::{json, Value};

use super::super::rest::{principal, RestError};
use super::super::{E2b, ENVD_VERSION};
use super::{bad, image_build_id, lock, start_file, Phase, RestResult};
use crate::error::ApiError;

/// Templates (v2) or builds one page holds at most, and by default.
const PAGE: usize = 100;

/// One image a template's tags name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Kept {
    pub tag: String,
    pub build_id: String,
    pub created_ms: i64,
}

/// One build this listener remembers of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Remembered {
    pub id: String,
    pub phase: Phase,
    pub requested_ms: i64,
    pub finished_ms: Option<i64>,
}

/// What a template's sandboxes get (the operator's defaults: a template does not
/// set resources).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sizes {
    pub cpus: u64,
    pub memory_mb: u64,
    pub disk_mb: u64,
}

/// A template of the caller: its tags (one per image each) and its builds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Own {
    pub kept: Vec<Kept>,
    pub builds: Vec<Remembered>,
}

/// The `templateID` of a path: a repository name (a `team/` prefix is kept: a
/// repository may have one; the caller's lookup tries the last component too).
/// A tag, a digest or anything that is not an image name is a 400 naming it.
pub(super) fn template_id(raw: &str) -> Result<String, String> {
    let n = ImageName::parse(raw).map_err(|e| format!("templateID {raw:?}: {}", e.problem))?;
    if n.repo != raw {
        return Err(format!(
            "templateID {raw:?}: a template's name, without a tag (Template.remove_tags removes a tag)"
        ));
    }
    Ok(n.repo)
}

/// Groups `(tag name, image)` pairs by repository: each template's images,
/// newest first, one entry per image (its `latest` tag, else its first by name).
pub(super) fn group(tagged: Vec<(ImageName, String, i64)>) -> BTreeMap<String, Vec<Kept>> {
    let mut by_repo: BTreeMap<String, BTreeMap<String, Kept>> = BTreeMap::new();
    for (name, build_id, created_ms) in tagged {
        let images = by_repo.entry(name.repo).or_default();
        let k = images.entry(build_id.clone()).or_insert_with(|| Kept {
            tag: name.tag.clone(),
            build_id,
            created_ms,
        });
        if name.tag == "latest" || (k.tag != "latest" && name.tag < k.tag) {
            k.tag = name.tag;
        }
    }
    by_repo
        .into_iter()
        .map(|(repo, images)| {
            let mut v: Vec<Kept> = images.into_values().collect();
            v.sort_by(|a, b| {
                b.created_ms
                    .cmp(&a.created_ms)
                    .then(a.build_id.cmp(&b.build_id))
            });
            (repo, v)
        })
        .collect()
}

/// The builds E2B's `TemplateBuild` list shows, newest first: each image the
/// template names (`ready`), and each remembered build that did not end in one
/// (waiting, building or failed; a ready one's result is among the images).
pub(super) fn builds_json(own: &Own, sizes: Sizes) -> Vec<(i64, Value)> {
    let mut out: Vec<(i64, Value)> = Vec::new();
    for k in &own.kept {
        let at = crate::timefmt::rfc3339(k.created_ms);
        out.push((
            k.created_ms,
            json!({
                "buildID": k.build_id,
                "status": "ready",
                "createdAt": at,
                "updatedAt": at,
                "finishedAt": at,
                "cpuCount": sizes.cpus,
                "memoryMB": sizes.memory_mb,
                "diskSizeMB": sizes.disk_mb,
                "envdVersion": ENVD_VERSION,
            }),
        ));
    }
    for b in own.builds.iter().filter(|b| b.phase != Phase::Ready) {
        let mut v = json!({
            "buildID": b.id,
            "status": b.phase.as_str(),
            "createdAt": crate::timefmt::rfc3339(b.requested_ms),
            "updatedAt": crate::timefmt::rfc3339(b.finished_ms.unwrap_or(b.requested_ms)),
            "cpuCount": sizes.cpus,
            "memoryMB": sizes.memory_mb,
            "diskSizeMB": sizes.disk_mb,
            "envdVersion": ENVD_VERSION,
        });
        if let Some(f) = b.finished_ms {
            v["finishedAt"] = json!(crate::timefmt::rfc3339(f));
        }
        out.push((b.requested_ms, v));
    }
    out.sort_by_key(|b| std::cmp::Reverse(b.0));
    out
}

/// E2B's `Template` of the caller's template `repo`: `buildID` is the image its
/// `latest` tag names (else its newest image; with none, its newest build),
/// `buildStatus` that of its newest build (`ready` when none is remembered),
/// `buildCount` the builds [`builds_json`] shows. Spawns are not counted:
/// `spawnCount` 0, `lastSpawnedAt` null. `None`: nothing of it is left.
pub(super) fn template_json(repo: &str, own: &Own, sizes: Sizes) -> Option<Value> {
    let newest_build = own.builds.iter().max_by_key(|b| b.requested_ms);
    let latest = own
        .kept
        .iter()
        .find(|k| k.tag == "latest")
        .or(own.kept.first());
    let build_id = match (latest, newest_build) {
        (Some(k), _) => k.build_id.clone(),
        (None, Some(b)) => b.id.clone(),
        (None, None) => return None,
    };
    let status = newest_build.map_or("ready", |b| b.phase.as_str());
    let times = own
        .kept
        .iter()
        .map(|k| k.created_ms)
        .chain(own.builds.iter().map(|b| b.requested_ms))
        .chain(own.builds.iter().filter_map(|b| b.finished_ms));
    let (created, updated) = times.fold((i64::MAX, i64::MIN), |(lo, hi), t| (lo.min(t), hi.max(t)));
    Some(json!({
        "templateID": repo,
        "buildID": build_id,
        "cpuCount": sizes.cpus,
        "memoryMB": sizes.memory_mb,
        "diskSizeMB": sizes.disk_mb,
        "public": false,
        "aliases": [repo],
        "names": [repo],
        "createdAt": crate::timefmt::rfc3339(created),
        "updatedAt": crate::timefmt::rfc3339(updated),
        "createdBy": null,
        "lastSpawnedAt": null,
        "spawnCount": 0,
        "buildCount": builds_json(own, sizes).len(),
        "envdVersion": ENVD_VERSION,
        "buildStatus": status,
    }))
}

fn sizes(e2b: &E2b) -> Sizes {
    let res = sandlot_proto::spec::Resources::default();
    let cpus = e2b
        .app
        .cfg
        .runtime
        .effective_default_cpus()
        .map(|c| c.ceil().max(1.0) as u64)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64));
    Sizes {
        cpus,
        memory_mb: res.memory.0 >> 20,
        disk_mb: res.disk.0 >> 20,
    }
}

/// Wall-clock milliseconds of an instant in the past.
fn wall_ms(at: std::time::Instant) -> i64 {
    crate::store::now_ms() - at.elapsed().as_millis() as i64
}

/// The builds this listener remembers of `tenant`'s templates, by template.
fn remembered(e2b: &E2b, tenant: &str) -> BTreeMap<String, Vec<Remembered>> {
    let mut out: BTreeMap<String, Vec<Remembered>> = BTreeMap::new();
    for (id, b) in e2b.templates.lock().iter() {
        let b = lock(b);
        if b.tenant != tenant {
            continue;
        }
        out.entry(b.template.clone()).or_default().push(Remembered {
            id: id.clone(),
            phase: b.phase,
            requested_ms: wall_ms(b.requested),
            finished_ms: b.finished.map(wall_ms),
        });
    }
    out
}

/// `tenant`'s own tags (its namespace), with the images they name.
fn own_tags(
    app: &crate::state::AppState,
    tenant: &str,
) -> Result<Vec<(ImageName, ImageInfo)>, sandlot_store::StoreError> {
    let mut out = Vec::new();
    for img in app.images.store.list()? {
        for tt in img.tenant_tags.iter().filter(|t| t.tenant == tenant) {
            if let Ok(n) = ImageName::parse(&tt.name) {
                out.push((n, img.clone()));
            }
        }
    }
    Ok(out)
}

/// Every template of `tenant`: its tags' repositories and the templates it has
/// builds of.
async fn own_templates(e2b: &Arc<E2b>, tenant: &str) -> RestResult<BTreeMap<String, Own>> {
    let app = e2b.app.clone();
    let t = tenant.to_string();
    let tagged = tokio::task::spawn_blocking(move || own_tags(&app, &t))
        .await
        .map_err(|e| RestError::from(ApiError::internal(e)))?
        .map_err(crate::images::store_error)?;
    let kept = group(
        tagged
            .into_iter()
            .map(|(n, img)| (n, image_build_id(&img), img.created_at))
            .collect(),
    );
    let mut all: BTreeMap<String, Own> = kept
        .into_iter()
        .map(|(repo, kept)| {
            (
                repo,
                Own {
                    kept,
                    builds: Vec::new(),
                },
            )
        })
        .collect();
    for (repo, builds) in remembered(e2b, tenant) {
        all.entry(repo).or_default().builds = builds;
    }
    Ok(all)
}

/// The caller's template a path names: by its whole name, else (a `team/name`
/// form) by its last component.
fn find<'a>(all: &'a BTreeMap<String, Own>, id: &str) -> Option<(&'a String, &'a Own)> {
    all.get_key_value(id).or_else(|| {
        id.rsplit_once('/')
            .and_then(|(_, name)| all.get_key_value(name))
    })
}

fn not_found(id: &str) -> RestError {
    RestError::new(
        StatusCode::NOT_FOUND,
        format!("template {id:?} was not found"),
    )
}

/// `limit` (1 to 100) and `nextToken` of a paginated listing.
fn page_query(q: Option<String>) -> RestResult<(usize, Option<String>)> {
    let (mut limit, mut next) = (PAGE, None);
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "limit" => {
                limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=PAGE).contains(n))
                    .ok_or_else(|| bad(format!("limit: {v:?} is not a number from 1 to {PAGE}")))?
            }
            "nextToken" if !v.is_empty() => next = Some(v.into_owned()),
            // `teamID`: the key's tenant is the team; another value changes nothing.
            _ => {}
        }
    }
    Ok((limit, next))
}

fn with_next(body: Value, next: Option<String>) -> Response {
    let mut resp = Json(body).into_response();
    if let Some(v) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        resp.headers_mut().insert("x-next-token", v);
    }
    resp
}

/// `GET /templates`: the caller's templates, by name.
pub async fn list(State(e2b): State<Arc<E2b>>, headers: HeaderMap) -> RestResult<Json<Value>> {
    let p = principal(&e2b, &headers)?;
    let s = sizes(&e2b);
    let all = own_templates(&e2b, &p.tenant).await?;
    Ok(Json(Value::Array(
        all.iter()
            .filter_map(|(repo, own)| template_json(repo, own, s))
            .collect(),
    )))
}

/// `GET /v2/templates?limit=N&nextToken=T`: [`list`] in pages; the token is the
/// name a page starts at.
pub async fn list_v2(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> RestResult<Response> {
    let p = principal(&e2b, &headers)?;
    let (limit, from) = page_query(q)?;
    let s = sizes(&e2b);
    let all = own_templates(&e2b, &p.tenant).await?;
    let mut rest = all
        .iter()
        .filter(|(repo, _)| from.as_deref().is_none_or(|f| repo.as_str() >= f))
        .filter_map(|(repo, own)| template_json(repo, own, s).map(|v| (repo, v)));
    let page: Vec<Value> = rest.by_ref().take(limit).map(|(_, v)| v).collect();
    let next = rest.next().map(|(repo, _)| repo.clone());
    Ok(with_next(Value::Array(page), next))
}

/// `GET /templates/{templateID}?limit=N&nextToken=T`: the caller's template with
/// its builds (newest first; the token is the offset a page starts at).
pub async fn get_one(
    State(e2b): State<Arc<E2b>>,
    headers: HeaderMap,
    UrlPath(raw): UrlPath<String>,
    RawQuery(q): RawQuery,
) -> RestResult<Response> {
    let p = principal(&e2b, &headers)?;
    let id = template_id(&raw).map_err(bad)?;
    let (limit, from) = page_query(q)?;
    let offset = match from {
        None => 0,
        Some(t) => t
            .parse::<usize>()
            .map_err(|_| bad(format!("nextToken: {t:?} is not a token this listing gave")))?,
    };
    let s = sizes(&e2b);
    let all = own_templates(&e2b, &p.tenant).await?;
    let (repo, own) = find(&all, &id).ok_or_else(|| not_found(&raw))?;
    let mut out = template_json(repo, own, s).ok_or_else(|| not_found(&raw))?;
    let builds = builds_json(own, s);
    let end = offset.saturating_add(limit);
    let next = (end < builds.len()).then(|| end.to_string());
    out["builds"] = Value::Array(
        builds
            .into_iter()
            .skip(offset)
            .take(limit)
            .map(|(_, v)| v)
            .collect(),
    );
    Ok(with_next(out, next))
}

/// Deletes the caller's template `raw` names (204): its tags go, its builds are
/// forgotten, its images go as nothing else names or holds them. 404 when the
/// caller has no such template; 409 while a build of it runs or receives files.
pub async fn delete(e2b: &Arc<E2b>, tenant: &str, raw: &str) -> RestResult<Response> {
    let id = template_id(raw).map_err(bad)?;
    let (e2, t, r) = (e2b.clone(), tenant.to_string(), raw.to_string());
    let removed = tokio::task::spawn_blocking(move || remove_blocking(&e2, &t, &id, &r))
        .await
        .map_err(|e| RestError::from(ApiError::internal(e)))??;
    // Outside the builds' lock (which request handlers take): a removal waits
    // for commits in progress, and a dropped build's uploaded context may be
    // large.
    let (app, tenant) = (e2b.app.clone(), tenant.to_string());
    let Removed {
        images,
        contexts,
        failed,
    } = removed;
    tokio::task::spawn_blocking(move || {
        for ctx in contexts {
            let _ = std::fs::remove_dir_all(ctx);
        }
        for img in images {
            let reference = img.to_string();
            crate::pause::forget_commit(&app, &reference);
            if app.images.store.get(&img).is_err() {
                let _ = std::fs::remove_file(start_file(&app.cfg.data_dir, &tenant, &img));
            }
        }
    })
    .await
    .map_err(|e| RestError::from(ApiError::internal(e)))?;
    match failed {
        Some(e) => Err(e),
        None => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

/// What a delete took out under the builds' lock, for the work done after it:
/// the tenant's images that lost a tag, the contexts of the builds it dropped,
/// and the store error that stopped it part way (what it had untagged until
/// then is still cleaned up).
struct Removed {
    images: Vec<sandlot_store::Digest>,
    contexts: Vec<std::path::PathBuf>,
    failed: Option<RestError>,
}

/// The checks and the removal of the tags and builds, under the builds' lock
/// (no build of the template starts or ends meanwhile): the images of the
/// tenant's own that lost a tag.
fn remove_blocking(e2b: &E2b, tenant: &str, id: &str, raw: &str) -> RestResult<Removed> {
    let store = &e2b.app.images.store;
    let mut builds = e2b.templates.lock();
    // The whole name, else the last component (as a create finds it).
    let candidates: Vec<&str> = [Some(id), id.rsplit_once('/').map(|(_, n)| n)]
        .into_iter()
        .flatten()
        .collect();
    // Their builds held until the end, before the tags are read: none starts,
    // receives, tags or ends between the checks and the removal.
    let held: Vec<(String, Arc<std::sync::Mutex<super::Build>>, String)> = builds
        .iter()
        .filter_map(|(k, b)| {
            let g = lock(b);
            (g.tenant == tenant && candidates.contains(&g.template.as_str()))
                .then(|| (k.clone(), b.clone(), g.template.clone()))
        })
        .collect();
    let mut guards: Vec<_> = held.iter().map(|(k, b, t)| (k, t, lock(b))).collect();
    let tagged = own_tags(&e2b.app, tenant).map_err(crate::images::store_error)?;
    let repo = candidates
        .iter()
        .find(|r| tagged.iter().any(|(n, _)| n.repo == **r) || held.iter().any(|(_, _, t)| t == *r))
        .ok_or_else(|| not_found(raw))?
        .to_string();
    guards.retain(|(_, t, _)| **t == repo);
    for (k, _, b) in &guards {
        let receiving = b
            .uploads
            .values()
            .any(|u| u.state == super::UploadState::Receiving);
        if b.phase == Phase::Building || receiving {
            return Err(RestError::new(
                StatusCode::CONFLICT,
                format!(
                    "build {k} of template {repo} is running: delete the template once it has ended"
                ),
            ));
        }
    }
    let mut images = Vec::new();
    for (n, img) in tagged.iter().filter(|(n, _)| n.repo == repo) {
        if let Err(e) = store.untag(ScopedTag {
            tenant: Some(tenant),
            name: n,
        }) {
            // The builds stay remembered; what lost its tag is cleaned up.
            return Ok(Removed {
                images,
                contexts: Vec::new(),
                failed: Some(crate::images::store_error(e).into()),
            });
        }
        if img.owner.as_deref() == Some(tenant) && !images.contains(&img.id) {
            images.push(img.id);
        }
    }
    let mut contexts = Vec::new();
    // A build that waits for its files ends with its template (a request that
    // had it already finds it ended), its context and place freed.
    for (_, _, b) in guards.iter_mut() {
        if b.phase == Phase::Waiting {
            let message = format!("template {repo} was deleted");
            b.log("error", message.clone(), None);
            b.reason = Some((message, None));
            b.phase = Phase::Error;
            b.finished = Some(std::time::Instant::now());
            b.lease = None;
            contexts.push(b.ctx.clone());
        }
    }
    let gone: Vec<String> = guards.iter().map(|(k, _, _)| (*k).clone()).collect();
    drop(guards);
    for k in gone {
        builds.remove(&k);
    }
    Ok(Removed {
        images,
        contexts,
        failed: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZES: Sizes = Sizes {
        cpus: 2,
        memory_mb: 512,
        disk_mb: 1024,
    };

    fn name(s: &str) -> ImageName {
        ImageName::parse(s).unwrap()
    }

    fn build(id: &str, phase: Phase, at: i64) -> Remembered {
        Remembered {
            id: id.into(),
            phase,
            requested_ms: at,
            finished_ms: (phase != Phase::Waiting && phase != Phase::Building).then_some(at + 5),
        }
    }

    #[test]
    fn a_template_id_is_a_repository_name_and_nothing_else() {
        assert_eq!(template_id("my-app").unwrap(), "my-app");
        assert_eq!(template_id("team/my-app").unwrap(), "team/my-app");
        for (raw, problem) in [
            ("my-app:v1", "without a tag"),
            ("..", "repository components"),
            ("a/../b", "repository components"),
            ("/etc", "repository components"),
            ("a//b", "repository components"),
            ("My-App", "repository components"),
            ("a b", "repository components"),
            ("", "1 to 255"),
            ("sha256:abcd", "image id"),
        ] {
            let e = template_id(raw).unwrap_err();
            assert!(
                e.contains(&format!("{raw:?}")) && e.contains(problem),
                "{raw}: {e}"
            );
        }
    }

    #[test]
    fn tags_group_by_repository_one_entry_per_image_newest_first() {
        let g = group(vec![
            (name("app:v1"), "b1".into(), 10),
            (name("app:latest"), "b2".into(), 20),
            (name("app:v2"), "b2".into(), 20),
            (name("app:a"), "b1".into(), 10),
            (name("other"), "b3".into(), 5),
        ]);
        assert_eq!(g.keys().collect::<Vec<_>>(), ["app", "other"]);
        let app = &g["app"];
        assert_eq!(
            app.iter()
                .map(|k| (k.build_id.as_str(), k.tag.as_str()))
                .collect::<Vec<_>>(),
            [("b2", "latest"), ("b1", "a")]
        );
    }

    #[test]
    fn the_build_id_is_the_latest_tags_image_and_the_status_the_newest_builds() {
        let kept = vec![
            Kept {
                tag: "v2".into(),
                build_id: "new".into(),
                created_ms: 30,
            },
            Kept {
                tag: "latest".into(),
                build_id: "old".into(),
                created_ms: 10,
            },
        ];
        let own = Own {
            kept: kept.clone(),
            builds: vec![],
        };
        let t = template_json("app", &own, SIZES).unwrap();
        assert_eq!(t["buildID"], "old");
        assert_eq!(t["buildStatus"], "ready");
        assert_eq!(t["buildCount"], 2);
        assert_eq!(t["public"], false);
        assert_eq!(t["names"], json!(["app"]));
        assert_eq!(t["aliases"], json!(["app"]));
        assert_eq!(t["spawnCount"], 0);
        assert!(t["lastSpawnedAt"].is_null() && t["createdBy"].is_null());
        assert_eq!(t["envdVersion"], ENVD_VERSION);
        assert_eq!(
            (
                t["cpuCount"].clone(),
                t["memoryMB"].clone(),
                t["diskSizeMB"].clone()
            ),
            (json!(2), json!(512), json!(1024))
        );
        assert_eq!(t["createdAt"], crate::timefmt::rfc3339(10));
        assert_eq!(t["updatedAt"], crate::timefmt::rfc3339(30));

        // A build running again: its status; the last good build stays the id.
        let own = Own {
            kept,
            builds: vec![
                build("r1", Phase::Ready, 25),
                build("x1", Phase::Building, 40),
            ],
        };
        let t = template_json("app", &own, SIZES).unwrap();
        assert_eq!(t["buildID"], "old");
        assert_eq!(t["buildStatus"], "building");
        // The two images and the running build (the ready one is an image).
        assert_eq!(t["buildCount"], 3);
        let b = builds_json(&own, SIZES);
        let ids: Vec<&str> = b
            .iter()
            .map(|(_, v)| v["buildID"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["x1", "new", "old"]);
        assert!(b[0].1.get("finishedAt").is_none());
        assert_eq!(b[1].1["status"], "ready");
    }

    #[test]
    fn a_page_is_1_to_100_long_and_starts_at_its_token() {
        assert_eq!(page_query(None).unwrap(), (100, None));
        let q = |s: &str| page_query(Some(s.into()));
        assert_eq!(
            q("limit=7&nextToken=app&teamID=x").unwrap(),
            (7, Some("app".into()))
        );
        assert_eq!(q("nextToken=").unwrap(), (100, None));
        for bad in ["limit=0", "limit=101", "limit=-1", "limit=x"] {
            let e = q(bad).unwrap_err();
            assert!(
                e.status == StatusCode::BAD_REQUEST && e.message.starts_with("limit: "),
                "{bad}: {}",
                e.message
            );
        }
    }

    #[test]
    fn a_template_with_no_image_yet_is_its_newest_build() {
        let own = Own {
            kept: vec![],
            builds: vec![
                build("e1", Phase::Error, 10),
                build("w1", Phase::Waiting, 20),
            ],
        };
        let t = template_json("app", &own, SIZES).unwrap();
        assert_eq!(t["buildID"], "w1");
        assert_eq!(t["buildStatus"], "waiting");
        assert_eq!(t["buildCount"], 2);
        assert!(template_json("app", &Own::default(), SIZES).is_none());
    }
}
