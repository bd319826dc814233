//! OpenAPI shapes of the spec's parts inside a create body
//! ([`super::CreateSandboxRequest`]): the spec types themselves parse units and
//! tagged enums by hand, so their documented shapes are written out here.

use utoipa::ToSchema;

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

/// A duration: seconds (a number, 0 or more) or a string with a unit.
fn duration(description: &str, example: &str) -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([
            Type::Number,
            Type::String,
            Type::Null,
        ]))
        .description(Some(description))
        .examples([serde_json::json!(example)])
        .build()
}

/// `timeout` of a create body (`null`: absent).
pub(super) fn timeout() -> utoipa::openapi::schema::Object {
    duration(
        "Lifetime: seconds or a string with a unit (`\"10m\"`; units ms, s, m, h). \
         Absent or `null`: the operator's default (5m unless configured).",
        "10m",
    )
}

/// `idle_timeout` of a create body (`null`: none).
pub(super) fn idle_timeout() -> utoipa::openapi::schema::Object {
    duration(
        "Stop after this long without exec or file activity: seconds or a string \
         with a unit (`\"2m\"`). Absent: the operator's default \
         (`limits.default_idle_timeout`); `null`: no idle timeout.",
        "2m",
    )
}
