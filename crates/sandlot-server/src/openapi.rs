//! The OpenAPI document, generated from the handlers and types. Served at
//! `/v1/openapi.json` and committed as `api/openapi.json` (a test keeps them equal).

use sandlot_proto::api::create::{
    AllowRuleDoc, MountDoc, NetworkDoc, PortsDoc, ResourcesDoc, SecretRefDoc, VolumeMountDoc,
};
use sandlot_proto::api::{
    checkpoint as ckpt_api, code as code_api, metrics as metrics_api, network as net_api,
    ports as ports_api, vfs as vfs_api, CreateSandboxRequest,
};
use utoipa::OpenApi;

use crate::routes::{
    checkpoints, code, exec, files, images, memory, metrics, network, ports, sandboxes, secrets,
    snapshots, tenants, tokens, vfs, volumes,
};

#[derive(OpenApi)]
#[openapi(
    info(title = "Sandlot API", version = "1", description = "Secure, ephemeral sandboxes for AI agents. Errors are `{\"error\": {\"code\", \"message\", \"request_id\"}}`. Over TCP every request needs `Authorization: Bearer TOKEN` (a WebSocket may instead offer the subprotocol `sandlot.bearer.TOKEN` beside `sandlot.v1`, which the server selects); the Unix socket is the operator's. The web console is `/ui/` on the TCP listener. See docs/api.md."),
    paths(
        sandboxes::health, sandboxes::create, sandboxes::list, sandboxes::get_one, sandboxes::delete,
        sandboxes::set_timeout, sandboxes::pause, sandboxes::resume, sandboxes::events, metrics::get,
        checkpoints::create, checkpoints::list, checkpoints::delete, checkpoints::restore,
        checkpoints::fork, checkpoints::diff,
        snapshots::create, snapshots::list, snapshots::get_one, snapshots::delete, snapshots::start,
        exec::start, exec::start_ws, exec::list, exec::get_one, exec::output, exec::attach_ws, exec::stdin,
        exec::stdin_close, exec::signal, exec::resize, exec::wait,
        code::create, code::list, code::get_one, code::remove, code::restart, code::interrupt,
        code::run, code::run_ws,
        files::read, files::write, files::remove, files::stat, files::list, files::mkdir, files::rename,
        files::watch, files::tar_download, files::tar_upload,
        network::get_policy, network::put_policy, network::get_log,
        ports::proxy, ports::publish, ports::list, ports::unpublish,
        images::list, images::inspect, images::remove, images::prune, images::import,
        images::export, images::diff, images::snapshot, images::pull, images::push, images::build,
        volumes::create, volumes::list, volumes::get_one, volumes::remove,
        secrets::create, secrets::list, secrets::remove,
        tokens::create, tokens::list, tokens::revoke, tenants::list,
        memory::list, memory::create, memory::info, memory::delete, memory::add, memory::get_one,
        memory::edit, memory::remove, memory::move_memory, memory::search, memory::log,
        memory::diff, memory::revert, memory::status, memory::reindex, memory::tool,
        vfs::create, vfs::list, vfs::get_one, vfs::remove, vfs::ingest, vfs::open_session,
        vfs::get_session, vfs::close_session, vfs::run, vfs::audit,
    ),
    components(schemas(CreateSandboxRequest, MountDoc, ResourcesDoc, NetworkDoc, AllowRuleDoc, PortsDoc, net_api::NetLog, net_api::NetLogEntry,
        ports_api::PublishPort, ports_api::PublishedPort, ports_api::PortList,
        metrics_api::MetricsHistory, metrics_api::MetricsSample,
        ckpt_api::CreateCheckpoint, ckpt_api::Checkpoint, ckpt_api::CheckpointList,
        ckpt_api::ForkRequest, ckpt_api::Forked, ckpt_api::Restored, ckpt_api::CheckpointDiff,
        code_api::CreateContextBody, code_api::ContextView, code_api::ContextList, code_api::RunCodeBody,
        code_api::CodeResult, code_api::CodeError, code_api::RunStatus, code_api::Execution, code_api::CodeEvent,
        VolumeMountDoc, SecretRefDoc, images::ImageView, images::LayerView, images::TenantTagView, images::ImageList,
        images::PruneView, images::DiffView, images::SnapshotBody, images::PullBody,
        images::PushBody, images::RegistryAuthBody, images::ProgressLine, volumes::CreateVolume,
        volumes::VolumeList, crate::images::Volume, secrets::CreateSecret, secrets::SecretList,
        crate::images::SecretInfo, tokens::CreateToken, tokens::TokenView, tokens::NewToken,
        tokens::TokenList, sandlot_proto::api::tenants::TenantList,
        sandlot_proto::api::tenants::Tenant, sandlot_proto::api::tenants::TenantQuota,
        sandlot_proto::api::tenants::TenantUsage, memory::CreateMemoryStore, memory::MemoryStoreDoc,
        memory::NewMemoryDoc, memory::MemoryPatchDoc, memory::SearchDoc, memory::WriteOutcomeDoc,
        memory::ToolOutputDoc, memory::MoveBody, memory::RevertBody, memory::ReindexBody,
        vfs_api::VfsSource, vfs_api::VfsAcl, vfs_api::VfsAclRule, vfs_api::CreateCollection,
        vfs_api::IngestCollection, vfs_api::CollectionView, vfs_api::CollectionList,
        vfs_api::IngestResult, vfs_api::IngestAnswer, vfs_api::OpenSession,
        vfs_api::SessionLimits, vfs_api::VfsSession, vfs_api::VfsScratch, vfs_api::RunCommand,
        vfs_api::RunResult,
        vfs_api::AuditEntry, vfs_api::AuditList)),
    tags((name = "sandboxes"), (name = "checkpoints"), (name = "snapshots"), (name = "processes"), (name = "code"), (name = "files"), (name = "network"), (name = "ports"), (name = "images"), (name = "volumes"), (name = "secrets"), (name = "tokens"), (name = "memory"), (name = "vfs"), (name = "system")),
    modifiers(&Security),
)]
struct ApiDoc;

struct Security;

impl utoipa::Modify for Security {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let c = api.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        api.security = Some(vec![utoipa::openapi::security::SecurityRequirement::new(
            "bearer",
            Vec::<String>::new(),
        )]);
    }
}

/// The document as pretty JSON (stable key order), with a final newline.
pub fn json() -> String {
    let mut s = ApiDoc::openapi()
        .to_pretty_json()
        .expect("the OpenAPI document serializes");
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_doc_lists_exactly_the_accepted_keys() {
        let doc: serde_json::Value = serde_json::from_str(&json()).unwrap();
        let props = doc["components"]["schemas"]["CreateSandboxRequest"]["properties"]
            .as_object()
            .unwrap();
        let mut documented: Vec<&str> = props.keys().map(String::as_str).collect();
        documented.sort();
        let mut accepted = CreateSandboxRequest::keys().to_vec();
        accepted.sort();
        assert_eq!(documented, accepted);
        // A secret reference documents exactly its fields.
        let secret = sandlot_proto::spec::SecretRef {
            name: "s".into(),
            env: Some("S".into()),
            path: Some("/run/secrets/s".into()),
            uid: Some(1),
            gid: Some(1),
            mode: Some(sandlot_proto::spec::FileMode(0o400)),
        };
        let v = serde_json::to_value(&secret).unwrap();
        let mut fields: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        fields.sort();
        let props = doc["components"]["schemas"]["SecretRefDoc"]["properties"]
            .as_object()
            .unwrap();
        let mut documented: Vec<&str> = props.keys().map(String::as_str).collect();
        documented.sort();
        assert_eq!(documented, fields);
    }

    /// The JSON types a property's schema allows (`$ref`: an object).
    fn types(prop: &serde_json::Value) -> Vec<String> {
        let of = |t: &serde_json::Value| match t {
            serde_json::Value::String(s) => vec![s.clone()],
            serde_json::Value::Array(a) => a
                .iter()
                .filter_map(|t| t.as_str().map(str::to_string))
                .collect(),
            _ => vec![],
        };
        if let Some(alts) = prop.get("oneOf").and_then(|a| a.as_array()) {
            return alts.iter().flat_map(types).collect();
        }
        if prop.get("$ref").is_some() {
            return vec!["object".into()];
        }
        prop.get("type").map(of).unwrap_or_default()
    }

    #[test]
    fn create_doc_allows_null_and_numbers_exactly_where_the_daemon_does() {
        use serde_json::json;
        let doc: serde_json::Value = serde_json::from_str(&json()).unwrap();
        let props = &doc["components"]["schemas"]["CreateSandboxRequest"]["properties"];
        for k in CreateSandboxRequest::keys() {
            let documented = types(&props[*k]).contains(&"null".to_string());
            let accepted =
                serde_json::from_value::<CreateSandboxRequest>(json!({ *k: null })).is_ok();
            assert_eq!(
                documented, accepted,
                "{k}: null documented {documented}, accepted {accepted}"
            );
        }
        for k in ["timeout", "idle_timeout"] {
            assert!(
                serde_json::from_value::<CreateSandboxRequest>(json!({ k: 30 })).is_ok(),
                "{k}: 30"
            );
            let t = types(&props[k]);
            assert!(
                t.contains(&"number".to_string()) && t.contains(&"string".to_string()),
                "{k}: {t:?}"
            );
        }
    }
}
