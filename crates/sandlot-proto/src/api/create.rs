//! The create body of a sandbox (`POST /v1/sandboxes`): the sandbox spec, every
//! field optional, plus `name`, `tags`, `metadata`, `idle_timeout` and the
//! lifecycle. One type for the daemon (which parses it, then resolves what is
//! absent against the operator's defaults), the Rust client, the E2B front door
//! (which builds one from its own body) and the OpenAPI document.
//!
//! Absence is kept where the daemon needs it: an absent `network`, `isolation`,
//! `resources.cpus`, `timeout` or `idle_timeout` takes the operator's default,
//! which a present value (even the spec's default) overrides. `null` means what
//! it meant before there was a type: absent for the spec's optional fields
//! (`rootfs`, `workdir`, `hostname`, `timeout`) and the daemon's fields (`name`,
//! `tags`, `metadata`, `on_idle`, `on_timeout`, `auto_resume`), "no idle
//! timeout" for `idle_timeout`, and refused for the others.

use std::collections::BTreeMap;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use super::lifecycle::OnExpiry;
use crate::spec::{
    Isolation, MountSpec, NetworkSpec, PortsSpec, Resources, SandboxSpec, SecretRef, VolumeMount,
};
use crate::units::Seconds;

#[cfg(feature = "openapi")]
mod doc;
#[cfg(feature = "openapi")]
pub use doc::{
    AllowRuleDoc, MountDoc, NetworkDoc, PortsDoc, ResourcesDoc, SecretRefDoc, VolumeMountDoc,
};

/// `POST /v1/sandboxes`: the sandbox spec (every field optional) plus `name`,
/// `tags`, `metadata`, `idle_timeout` and the lifecycle (`on_idle`,
/// `on_timeout`, `auto_resume`). Unknown fields are refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields, remote = "Self")]
pub struct CreateSandboxRequest {
    /// `host` (built in, the default).
    #[serde(
        default,
        deserialize_with = "not_null::image",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(nullable = false, example = "host"))]
    pub image: Option<String>,
    /// A host directory used as the root filesystem (read-only lower layer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<String>,
    #[serde(
        default,
        deserialize_with = "not_null::mounts",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(nullable = false, value_type = Option<Vec<MountDoc>>))]
    pub mounts: Option<Vec<MountSpec>>,
    #[serde(
        default,
        deserialize_with = "not_null::env",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// `root` (default), `user`, or `UID[:GID]`.
    #[serde(
        default,
        deserialize_with = "not_null::user",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(
        default,
        deserialize_with = "not_null::resources",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(nullable = false, value_type = Option<ResourcesDoc>))]
    pub resources: Option<Resources>,
    /// Lifetime: seconds or `"10m"` (default: the operator's, 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(schema_with = doc::timeout))]
    pub timeout: Option<Seconds>,
    #[serde(
        default,
        deserialize_with = "not_null::network",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(nullable = false, value_type = Option<NetworkDoc>))]
    pub network: Option<NetworkSpec>,
    #[serde(
        default,
        deserialize_with = "not_null::ports",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(nullable = false, value_type = Option<PortsDoc>))]
    pub ports: Option<PortsSpec>,
    /// Named volumes: `[{"name", "target", "read_only"}]`.
    #[serde(
        default,
        deserialize_with = "not_null::volumes",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(nullable = false, value_type = Option<Vec<VolumeMountDoc>>))]
    pub volumes: Option<Vec<VolumeMount>>,
    /// Named secrets: `[{"name", "env"}]` or `[{"name", "path": "/run/secrets/x"}]`.
    #[serde(
        default,
        deserialize_with = "not_null::secrets",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(nullable = false, value_type = Option<Vec<SecretRefDoc>>))]
    pub secrets: Option<Vec<SecretRef>>,
    /// `namespace` (Linux namespaces on the host kernel) or `gvisor` (gVisor's
    /// kernel in user space); default: the operator's (`[isolation] default`).
    #[serde(
        default,
        deserialize_with = "not_null::isolation",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(nullable = false, value_type = Option<String>, example = "gvisor"))]
    pub isolation: Option<Isolation>,
    /// Unique among the tenant's live sandboxes; usable instead of the id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Stop after this long without exec or file activity: seconds or `"2m"`.
    /// Absent: the operator's default (`limits.default_idle_timeout`); `null`:
    /// none.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(schema_with = doc::idle_timeout))]
    pub idle_timeout: Option<Option<Seconds>>,
    /// What the idle timeout does: `kill` (the default) ends the sandbox,
    /// `pause` pauses it as `POST .../pause` would (needs an `idle_timeout`).
    #[serde(
        default,
        deserialize_with = "on_expiry",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, example = "pause"))]
    pub on_idle: Option<OnExpiry>,
    /// What the lifetime timeout does: `kill` (the default) or `pause`.
    #[serde(
        default,
        deserialize_with = "on_expiry",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, example = "pause"))]
    pub on_timeout: Option<OnExpiry>,
    /// Exec, file, code-context and port-proxy calls on the sandbox while it is
    /// paused resume it first (default false: they answer 409 `invalid_state`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_resume: Option<bool>,
}

impl Serialize for CreateSandboxRequest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // The derived (remote) serializer.
        CreateSandboxRequest::serialize(self, s)
    }
}

/// Only a JSON object is read as a request: a derived `Deserialize` would also
/// read an array as the fields in order.
impl<'de> Deserialize<'de> for CreateSandboxRequest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(ObjectOnly)
    }
}

/// Reads a create request from a map only, with the derived (remote)
/// deserializer.
struct ObjectOnly;

impl<'de> Visitor<'de> for ObjectOnly {
    type Value = CreateSandboxRequest;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object (the create body)")
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<CreateSandboxRequest, A::Error> {
        CreateSandboxRequest::deserialize(de::value::MapAccessDeserializer::new(map))
    }
}

/// A field that may be absent but not `null`: present, it is read as `T`;
/// `null` is refused naming the field (not the Rust type it would have been).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
    field: &'static str,
) -> Result<Option<T>, D::Error> {
    match Option::<T>::deserialize(d)? {
        Some(v) => Ok(Some(v)),
        None => Err(de::Error::custom(format_args!(
            "null is not allowed for `{field}`: leave the field out for the default"
        ))),
    }
}

/// One [`present`] per field that refuses `null`, each naming its field.
macro_rules! not_null {
    ($($field:ident),* $(,)?) => {
        mod not_null {
            use serde::{Deserialize, Deserializer};
            $(
                pub(super) fn $field<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
                    d: D,
                ) -> Result<Option<T>, D::Error> {
                    super::present(d, stringify!($field))
                }
            )*
        }
    };
}

not_null!(image, mounts, env, user, resources, network, ports, volumes, secrets, isolation,);

/// `on_idle` and `on_timeout`: absent or `null` (the default, `kill`), or one
/// of the strings `"kill"` and `"pause"`; anything else is refused naming them.
fn on_expiry<'de, D: Deserializer<'de>>(d: D) -> Result<Option<OnExpiry>, D::Error> {
    d.deserialize_option(OnExpiryVisitor)
}

struct OnExpiryVisitor;

impl<'de> Visitor<'de> for OnExpiryVisitor {
    type Value = Option<OnExpiry>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"kill\" or \"pause\"")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        match OnExpiry::parse(v) {
            Some(p) => Ok(Some(p)),
            None => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
        }
    }
}

/// A field whose absence (`None`) differs from `null` (`Some(None)`).
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

impl CreateSandboxRequest {
    /// A request declaring every field of `spec` (none absent).
    pub fn from_spec(spec: SandboxSpec) -> CreateSandboxRequest {
        let SandboxSpec {
            image,
            rootfs,
            mounts,
            env,
            workdir,
            user,
            hostname,
            resources,
            timeout,
            network,
            ports,
            volumes,
            secrets,
            isolation,
        } = spec;
        CreateSandboxRequest {
            image: Some(image),
            rootfs,
            mounts: Some(mounts),
            env: Some(env),
            workdir,
            user: Some(user),
            hostname,
            resources: Some(resources),
            timeout,
            network: Some(network),
            ports: Some(ports),
            volumes: Some(volumes),
            secrets: Some(secrets),
            isolation: Some(isolation),
            ..Default::default()
        }
    }

    /// The spec it declares, an absent field at the spec's default (the daemon
    /// then applies the operator's defaults where [`Self::network`] or
    /// [`Self::isolation`] is absent).
    pub fn spec(&self) -> SandboxSpec {
        let d = SandboxSpec::default();
        SandboxSpec {
            image: self.image.clone().unwrap_or(d.image),
            rootfs: self.rootfs.clone(),
            mounts: self.mounts.clone().unwrap_or(d.mounts),
            env: self.env.clone().unwrap_or(d.env),
            workdir: self.workdir.clone(),
            user: self.user.clone().unwrap_or(d.user),
            hostname: self.hostname.clone(),
            resources: self.resources.clone().unwrap_or(d.resources),
            timeout: self.timeout,
            network: self.network.clone().unwrap_or(d.network),
            ports: self.ports.unwrap_or(d.ports),
            volumes: self.volumes.clone().unwrap_or(d.volumes),
            secrets: self.secrets.clone().unwrap_or(d.secrets),
            isolation: self.isolation.unwrap_or(d.isolation),
        }
    }

    /// Every key a create body may have, from the type itself.
    pub fn keys() -> &'static [&'static str] {
        let mut fields: &'static [&'static str] = &[];
        // The derived (remote) deserializer names them.
        let _ = CreateSandboxRequest::deserialize(FieldNames {
            fields: &mut fields,
        });
        fields
    }
}

/// The keys of a sandbox spec (a JSON object), from [`SandboxSpec`] itself.
pub fn spec_keys() -> &'static [&'static str] {
    fields_of::<SandboxSpec>()
}

/// The field names a derived `Deserialize` of a struct hands to its deserializer
/// (renames applied): what the type accepts, read from the type.
fn fields_of<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(FieldNames {
        fields: &mut fields,
    });
    fields
}

/// A deserializer that records the fields of the struct asked of it, then fails.
struct FieldNames<'a> {
    fields: &'a mut &'static [&'static str],
}

#[derive(Debug)]
struct Recorded;

impl std::fmt::Display for Recorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("field names recorded")
    }
}

impl std::error::Error for Recorded {}

impl de::Error for Recorded {
    fn custom<M: std::fmt::Display>(_: M) -> Self {
        Recorded
    }
}

impl<'de> Deserializer<'de> for FieldNames<'_> {
    type Error = Recorded;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Recorded> {
        Err(Recorded)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Recorded> {
        *self.fields = fields;
        Err(Recorded)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::ByteSize;
    use serde_json::json;

    fn parse(v: serde_json::Value) -> Result<CreateSandboxRequest, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    #[test]
    fn the_request_takes_every_spec_key_and_the_daemons_own() {
        let keys = CreateSandboxRequest::keys();
        for k in spec_keys() {
            assert!(
                keys.contains(k),
                "the create request lacks the spec key {k}"
            );
        }
        let mut extra: Vec<&str> = keys
            .iter()
            .copied()
            .filter(|k| !spec_keys().contains(k))
            .collect();
        extra.sort();
        assert_eq!(
            extra,
            [
                "auto_resume",
                "idle_timeout",
                "metadata",
                "name",
                "on_idle",
                "on_timeout",
                "tags"
            ]
        );
        assert!(spec_keys().contains(&"network") && spec_keys().contains(&"isolation"));
    }

    #[test]
    fn a_spec_goes_through_the_request_unchanged_field_by_field() {
        // Every field away from its default, so that a field the conversion
        // forgot shows up as a difference.
        let mut spec = SandboxSpec {
            image: "team/app:1".into(),
            rootfs: Some("/srv/root".into()),
            workdir: Some("/w".into()),
            user: "user".into(),
            hostname: Some("h".into()),
            timeout: Some(Seconds::secs(9)),
            isolation: Isolation::Gvisor,
            ..Default::default()
        };
        spec.mounts.push(MountSpec::Tmpfs {
            target: "/t".into(),
            size: ByteSize(1 << 20),
        });
        spec.env.insert("A".into(), "b".into());
        spec.resources.cpus = Some(0.5);
        spec.network.mode = crate::spec::NetworkMode::Open;
        spec.ports.public = true;
        spec.volumes.push(VolumeMount {
            name: "v".into(),
            target: "/v".into(),
            read_only: true,
        });
        spec.secrets.push(SecretRef {
            name: "s".into(),
            env: Some("S".into()),
            path: None,
            uid: None,
            gid: None,
            mode: None,
        });
        let req = CreateSandboxRequest::from_spec(spec.clone());
        assert_eq!(req.spec(), spec);
        let v = serde_json::to_value(&req).unwrap();
        let mut sent: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        sent.sort();
        let mut keys = spec_keys().to_vec();
        keys.sort();
        assert_eq!(sent, keys, "from_spec declares every spec field");
        assert_eq!(parse(v).unwrap(), req, "and it reads back the same");
    }

    #[test]
    fn an_empty_body_is_the_default_spec_with_nothing_declared() {
        let req = parse(json!({})).unwrap();
        assert_eq!(req, CreateSandboxRequest::default());
        assert_eq!(req.spec(), SandboxSpec::default());
        assert_eq!(serde_json::to_value(&req).unwrap(), json!({}));
    }

    #[test]
    fn absent_network_and_isolation_differ_from_present_defaults() {
        let req = parse(json!({"network": {}, "isolation": "namespace"})).unwrap();
        assert_eq!(req.network, Some(NetworkSpec::default()));
        assert_eq!(req.isolation, Some(Isolation::Namespace));
        let req = parse(json!({"image": "host"})).unwrap();
        assert_eq!((req.network, req.isolation), (None, None));
    }

    #[test]
    fn idle_timeout_absent_null_and_given_are_three_things() {
        assert_eq!(parse(json!({})).unwrap().idle_timeout, None);
        assert_eq!(
            parse(json!({"idle_timeout": null})).unwrap().idle_timeout,
            Some(None)
        );
        assert_eq!(
            parse(json!({"idle_timeout": "2m"})).unwrap().idle_timeout,
            Some(Some(Seconds::secs(120)))
        );
        // And each is sent as it was given.
        let req = CreateSandboxRequest {
            idle_timeout: Some(None),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&req).unwrap(),
            json!({"idle_timeout": null})
        );
    }

    #[test]
    fn null_is_absent_where_it_was_and_refused_where_it_was() {
        for k in [
            "rootfs",
            "workdir",
            "hostname",
            "timeout",
            "name",
            "tags",
            "metadata",
            "on_idle",
            "on_timeout",
            "auto_resume",
        ] {
            let req = parse(json!({ k: null })).unwrap_or_else(|e| panic!("{k}: null: {e}"));
            assert_eq!(req, CreateSandboxRequest::default(), "{k}: null is absent");
        }
        for k in [
            "image",
            "mounts",
            "env",
            "user",
            "resources",
            "network",
            "ports",
            "volumes",
            "secrets",
            "isolation",
        ] {
            let e = parse(json!({ k: null })).expect_err(k);
            assert!(e.contains("null is not allowed"), "{k}: {e}");
            assert!(
                e.contains(&format!("`{k}`")),
                "{k}: the message names it: {e}"
            );
            assert!(
                !e.contains("struct ") && !e.contains("Spec") && !e.contains("enum "),
                "{k}: no Rust type is named: {e}"
            );
            // As the spec alone refuses it.
            assert!(
                serde_json::from_value::<SandboxSpec>(json!({ k: null })).is_err(),
                "{k}"
            );
        }
    }

    #[test]
    fn an_unknown_key_is_refused_naming_it_and_the_accepted_ones() {
        let e = parse(json!({"imgae": "host"})).unwrap_err();
        assert!(e.contains("`imgae`"), "{e}");
        for k in CreateSandboxRequest::keys() {
            assert!(e.contains(&format!("`{k}`")), "{k} is listed: {e}");
        }
    }

    #[test]
    fn only_an_object_is_a_request() {
        for v in [
            json!([]),
            json!(["host"]),
            json!("x"),
            json!(null),
            json!(1),
        ] {
            let e = parse(v.clone()).expect_err("refused");
            assert!(e.contains("a JSON object"), "{v}: {e}");
        }
        assert_eq!(
            serde_json::from_str::<CreateSandboxRequest>(r#"{"image": "host"}"#)
                .unwrap()
                .image
                .as_deref(),
            Some("host")
        );
    }

    #[test]
    fn the_type_read_straight_from_text_refuses_a_duplicate_key() {
        // Only when read from text: the daemon's route reads the body as a
        // JSON value first, where the last of duplicate keys wins (docs/api.md).
        let e =
            serde_json::from_str::<CreateSandboxRequest>(r#"{"name":"a","name":"b"}"#).unwrap_err();
        assert!(e.to_string().contains("duplicate field `name`"), "{e}");
    }

    #[test]
    fn on_idle_and_on_timeout_take_only_kill_or_pause_and_name_them() {
        for k in ["on_idle", "on_timeout"] {
            for (v, want) in [("kill", OnExpiry::Kill), ("pause", OnExpiry::Pause)] {
                let r = parse(json!({ k: v })).unwrap();
                assert_eq!(r.on_idle.or(r.on_timeout), Some(want), "{k}: {v}");
            }
            for bad in [
                json!({"pause": null}),
                json!({"kill": null}),
                json!("Pause"),
                json!("sleep"),
                json!(1),
                json!(true),
                json!(["pause"]),
            ] {
                let e = parse(json!({ k: bad.clone() })).expect_err(k);
                assert!(
                    e.contains(r#"expected "kill" or "pause""#),
                    "{k}: {bad}: {e}"
                );
            }
        }
    }
}
