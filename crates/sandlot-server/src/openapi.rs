//! The OpenAPI document, generated from the handlers and types. Served at
//! `/v1/openapi.json` and committed as `api/openapi.json` (a test keeps them equal).

use std::collections::BTreeMap;

use sandlot_proto::api::{
    checkpoint as ckpt_api, code as code_api, metrics as metrics_api, network as net_api,
    ports as ports_api, vfs as vfs_api,
};
use utoipa::{OpenApi, ToSchema};

use crate::routes::{
    checkpoints, code, exec, files, images, memory, metrics, network, ports, sandboxes, secrets,
    snapshots, tenants, tokens, vfs, volumes,
};

/// A bind mount, a tmpfs, a memory store or a collection (the `type` field selects).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct MountDoc {
    /// `bind`, `tmpfs`, `memory` or `collection`.
    #[schema(example = "bind")]
    r#type: String,
    /// memory: the name of one of the tenant's memory stores (mounted read-write unless
    /// `readonly`; its `.git` and `.sandlot` are read-only inside).
    store: Option<String>,
    /// collection: the name of one of the tenant's vfs collections, mounted read-only
    /// (FUSE): the principal's ACL-pruned view, at a version pinned for the sandbox's life.
    /// 400 naming `mounts[i].collection` if the tenant has no such collection.
    collection: Option<String>,
    /// collection: who documents are pruned for (default `anonymous`: public documents only).
    principal: Option<String>,
    /// collection: the principal's groups (it sees public documents and those of its groups).
    groups: Option<Vec<String>>,
    /// collection: every document regardless of ACLs (default false).
    all_access: Option<bool>,
    /// collection: the version to mount (default: the head at create; the sandbox's
    /// record shows the version pinned).
    version: Option<u64>,
    /// bind: absolute host path.
    source: Option<String>,
    /// Absolute path in the sandbox.
    target: String,
    /// bind: read-only (default true); memory: read-only (default false).
    readonly: Option<bool>,
    /// tmpfs: size (default 64M).
    #[schema(example = "64M")]
    size: Option<String>,
}

/// Resource limits.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ResourcesDoc {
    /// CPU quota in cores (`0.5`). Absent: the operator's `runtime.default_cpus`
    /// (unless configured, half the host's CPUs).
    cpus: Option<f64>,
    /// Memory limit, bytes or `"512M"` (default 512M).
    #[schema(example = "512M")]
    memory: Option<String>,
    /// Processes and threads (default 512).
    pids: Option<u32>,
    /// Size of the writable layer (default 1G).
    #[schema(example = "1G")]
    disk: Option<String>,
}

/// Network egress policy (see docs/networking.md). Unknown fields are refused.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct NetworkDoc {
    /// `none` (loopback only, the default unless the operator sets another),
    /// `allow` (only the `allow` rules), or `open` (the internet but the `deny`
    /// rules, never the host, other sandboxes, link-local/metadata or unallowed
    /// private ranges).
    #[schema(example = "allow")]
    mode: Option<String>,
    /// With `allow`: the destinations the sandbox may reach. With `open` and
    /// `deny` rules: exceptions to them (an allow rule wins).
    allow: Option<Vec<AllowRuleDoc>>,
    /// With `open` only: destinations refused (same shape as allow rules). A
    /// denied name gets no DNS answer and connections naming it (TLS SNI, HTTP
    /// `Host`) are reset; its addresses dialled without the name are not stopped.
    deny: Option<Vec<AllowRuleDoc>>,
}

/// Inbound: whether the sandbox's ports answer without a credential.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct PortsDoc {
    /// Host-name URLs (`PORT-ID.DOMAIN`, with the E2B front door's `[e2b] domain`)
    /// reach the sandbox's ports without a credential, never 49983 (envd) or 49999
    /// (code interpreter). Default false. 400 naming `ports.public` when the
    /// operator forbids it (`[ports] allow_public = false`). The native port proxy
    /// route always needs the key.
    public: Option<bool>,
}

/// One allowed destination: exactly one of `domain` or `cidr`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct AllowRuleDoc {
    /// `api.example.com`, or `*.example.com` (names below it, not itself).
    #[schema(example = "api.example.com")]
    domain: Option<String>,
    /// `203.0.113.0/24` (TCP to these addresses).
    cidr: Option<String>,
    /// TCP ports (absent or empty: any).
    #[schema(example = json!([443]))]
    ports: Option<Vec<u16>>,
}

/// `POST /v1/sandboxes`: the sandbox spec (every field optional) plus `name`,
/// `tags`, `metadata`, `idle_timeout` and the lifecycle (`on_idle`,
/// `on_timeout`, `auto_resume`). Unknown fields are refused.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct CreateSandboxDoc {
    /// `host` (built in, the default).
    #[schema(example = "host")]
    image: Option<String>,
    /// A host directory used as the root filesystem (read-only lower layer).
    rootfs: Option<String>,
    mounts: Option<Vec<MountDoc>>,
    env: Option<BTreeMap<String, String>>,
    workdir: Option<String>,
    /// `root` (default), `user`, or `UID[:GID]`.
    user: Option<String>,
    hostname: Option<String>,
    resources: Option<ResourcesDoc>,
    /// Lifetime: seconds or `"10m"` (default: the operator's, 5m).
    #[schema(example = "10m")]
    timeout: Option<String>,
    network: Option<NetworkDoc>,
    ports: Option<PortsDoc>,
    /// Named volumes: `[{"name", "target", "read_only"}]`.
    volumes: Option<Vec<VolumeMountDoc>>,
    /// Named secrets: `[{"name", "env"}]` or `[{"name", "path": "/run/secrets/x"}]`.
    secrets: Option<Vec<SecretRefDoc>>,
    /// `namespace` (Linux namespaces on the host kernel) or `gvisor` (gVisor's
    /// kernel in user space); default: the operator's (`[isolation] default`).
    #[schema(example = "gvisor")]
    isolation: Option<String>,
    /// Unique among the tenant's live sandboxes; usable instead of the id.
    name: Option<String>,
    tags: Option<BTreeMap<String, String>>,
    metadata: Option<BTreeMap<String, String>>,
    /// Stop after this long without exec or file activity: seconds or `"2m"`.
    #[schema(example = "2m")]
    idle_timeout: Option<String>,
    /// What the idle timeout does: `kill` (the default) ends the sandbox,
    /// `pause` pauses it as `POST .../pause` would (needs an `idle_timeout`).
    #[schema(value_type = Option<String>, example = "pause")]
    on_idle: Option<sandlot_proto::api::lifecycle::OnExpiry>,
    /// What the lifetime timeout does: `kill` (the default) or `pause`.
    #[schema(value_type = Option<String>, example = "pause")]
    on_timeout: Option<sandlot_proto::api::lifecycle::OnExpiry>,
    /// Exec, file, code-context and port-proxy calls on the sandbox while it is
    /// paused resume it first (default false: they answer 409 `invalid_state`).
    auto_resume: Option<bool>,
}

/// A named volume mounted at create.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct VolumeMountDoc {
    name: String,
    /// Absolute path in the sandbox.
    target: String,
    /// Default false.
    read_only: Option<bool>,
}

/// A named secret injected at create: exactly one of `env` or `path`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct SecretRefDoc {
    name: String,
    /// Environment variable name.
    env: Option<String>,
    /// File directly under `/run/secrets/`.
    path: Option<String>,
    /// Owner of the file, 0 to 65534 (default: the uid of the sandbox's user, the
    /// spec's `user` or the image's).
    uid: Option<u32>,
    /// Group of the file, 0 to 65534 (default: the sandbox user's primary group).
    gid: Option<u32>,
    /// Permission bits of the file, a number or an octal string (default `"0400"`);
    /// at most 0777: no set-id or sticky bits.
    #[schema(value_type = Option<String>, example = "0440")]
    mode: Option<String>,
}

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
    components(schemas(CreateSandboxDoc, MountDoc, ResourcesDoc, NetworkDoc, AllowRuleDoc, PortsDoc, net_api::NetLog, net_api::NetLogEntry,
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
        let props = doc["components"]["schemas"]["CreateSandboxDoc"]["properties"]
            .as_object()
            .unwrap();
        let mut documented: Vec<&str> = props.keys().map(String::as_str).collect();
        documented.sort();
        let mut accepted: Vec<&str> = [
            sandlot_proto::spec::SPEC_KEYS,
            crate::services::create::EXTRA_KEYS,
        ]
        .concat();
        accepted.sort();
        assert_eq!(documented, accepted);
        // And the spec keys are exactly the spec's fields.
        let mut spec = sandlot_proto::spec::SandboxSpec {
            rootfs: Some("/x".into()),
            workdir: Some("/w".into()),
            hostname: Some("h".into()),
            timeout: Some(sandlot_proto::units::Seconds::secs(1)),
            ..Default::default()
        };
        spec.env.insert("A".into(), "b".into());
        spec.volumes.push(sandlot_proto::spec::VolumeMount {
            name: "v".into(),
            target: "/v".into(),
            read_only: false,
        });
        spec.secrets.push(sandlot_proto::spec::SecretRef {
            name: "s".into(),
            env: Some("S".into()),
            path: None,
            uid: None,
            gid: None,
            mode: None,
        });
        spec.mounts.push(sandlot_proto::spec::MountSpec::Tmpfs {
            target: "/t".into(),
            size: sandlot_proto::units::ByteSize(1 << 20),
        });
        spec.isolation = sandlot_proto::spec::Isolation::Gvisor;
        spec.ports.public = true;
        let v = serde_json::to_value(&spec).unwrap();
        let mut fields: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        fields.sort();
        let mut keys = sandlot_proto::spec::SPEC_KEYS.to_vec();
        keys.sort();
        assert_eq!(fields, keys);
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
}
