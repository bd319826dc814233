//! Secret references of a spec: which named secret goes where, and a secret file's
//! owner and mode.

use serde::{Deserialize, Serialize};

use super::{
    check_env_name, check_sandbox_path, normalize_sandbox_path, valid_object_name, SpecError,
    MAX_SANDBOX_ID, SECRETS_DIR,
};

/// A named secret injected into a sandbox: exactly one of `env` (a variable name)
/// or `path` (a file directly under `/run/secrets/`). A file's owner and mode default
/// to the sandbox's user (the uid and primary gid its commands run as) and 0400.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Owner of the file (default: the sandbox user's uid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Group of the file (default: the sandbox user's primary gid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    /// Permission bits of the file (default 0400); no set-id or sticky bits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<FileMode>,
}

impl std::fmt::Debug for SecretRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretRef")
            .field("name", &self.name)
            .field("env", &self.env)
            .field("path", &self.path)
            .field("uid", &self.uid)
            .field("gid", &self.gid)
            .field("mode", &self.mode)
            .finish()
    }
}

/// The mode of a secret file when the reference gives none.
pub const SECRET_FILE_MODE: u32 = 0o400;

/// Permission bits as the API takes them: a number (`288`) or an octal string
/// (`"0440"`, `"440"`, `"0o440"`); written back as the octal string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileMode(pub u32);

impl Serialize for FileMode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{:04o}", self.0))
    }
}

impl<'de> Deserialize<'de> for FileMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        const EXPECTED: &str = "a mode: a number or an octal string like \"0440\"";
        impl serde::de::Visitor<'_> for V {
            type Value = FileMode;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<FileMode, E> {
                u32::try_from(v)
                    .map(FileMode)
                    .map_err(|_| E::custom(format!("{v} is not {EXPECTED}")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<FileMode, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("{v} is not {EXPECTED}")))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<FileMode, E> {
                let digits = v.strip_prefix("0o").unwrap_or(v);
                if digits.is_empty() || digits.len() > 11 {
                    return Err(E::custom(format!("{v:?} is not {EXPECTED}")));
                }
                u32::from_str_radix(digits, 8)
                    .map(FileMode)
                    .map_err(|_| E::custom(format!("{v:?} is not {EXPECTED}")))
            }
        }
        d.deserialize_any(V)
    }
}

/// Checks the spec's `secrets` (each named field in the error).
pub(super) fn check(secrets: &[SecretRef]) -> Result<(), SpecError> {
    if secrets.len() > 256 {
        return Err(SpecError::new("secrets", "at most 256 secrets"));
    }
    let mut paths = std::collections::BTreeSet::new();
    for (i, s) in secrets.iter().enumerate() {
        if !valid_object_name(&s.name) {
            return Err(SpecError::new(
                format!("secrets[{i}].name"),
                format!("{:?}: use 1 to 64 letters, digits, '-', '_' or '.'", s.name),
            ));
        }
        let file_only = [
            ("uid", s.uid.is_some()),
            ("gid", s.gid.is_some()),
            ("mode", s.mode.is_some()),
        ];
        if s.env.is_some() {
            if let Some((f, _)) = file_only.iter().find(|(_, set)| *set) {
                return Err(SpecError::new(
                    format!("secrets[{i}].{f}"),
                    "only secret files (path) have an owner and a mode",
                ));
            }
        }
        for (f, id) in [("uid", s.uid), ("gid", s.gid)] {
            if let Some(id) = id.filter(|id| *id > MAX_SANDBOX_ID) {
                return Err(SpecError::new(
                    format!("secrets[{i}].{f}"),
                    format!("{id}: ids in a sandbox are 0 to {MAX_SANDBOX_ID}"),
                ));
            }
        }
        if let Some(FileMode(m)) = s.mode {
            if m & !0o777 != 0 {
                return Err(SpecError::new(
                    format!("secrets[{i}].mode"),
                    format!(
                        "{m:04o}: only permission bits (at most 0777); set-id and sticky bits are refused"
                    ),
                ));
            }
        }
        match (&s.env, &s.path) {
            (Some(e), None) => {
                if !check_env_name(e) {
                    return Err(SpecError::new(
                        format!("secrets[{i}].env"),
                        format!("{e:?}: variable names are letters, digits and '_', not starting with a digit"),
                    ));
                }
            }
            (None, Some(p)) => {
                let f = format!("secrets[{i}].path");
                check_sandbox_path(&f, p)?;
                let n = normalize_sandbox_path(p);
                let inside = n
                    .strip_prefix(SECRETS_DIR)
                    .and_then(|r| r.strip_prefix('/'))
                    .is_some_and(|r| !matches!(r, "" | "." | "..") && !r.contains('/'));
                if !inside {
                    return Err(SpecError::new(
                        f,
                        format!("{p:?}: secret files go directly under {SECRETS_DIR}/"),
                    ));
                }
                if !paths.insert(n.clone()) {
                    return Err(SpecError::new(f, format!("{n:?} is used twice")));
                }
            }
            _ => {
                return Err(SpecError::new(
                    format!("secrets[{i}]"),
                    "give exactly one of env or path",
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SandboxSpec;

    fn field_of(json: &str) -> String {
        SandboxSpec::from_json(json)
            .unwrap_err()
            .field()
            .to_string()
    }

    #[test]
    fn secret_file_owners_and_modes_are_checked() {
        let spec = SandboxSpec::from_json(
            r#"{"secrets":[{"name":"a","path":"/run/secrets/a","uid":1000,"gid":100,"mode":"0440"},
                           {"name":"b","path":"/run/secrets/b","mode":288},
                           {"name":"c","path":"/run/secrets/c","mode":"0o600"}]}"#,
        )
        .unwrap();
        let modes: Vec<_> = spec.secrets.iter().map(|s| s.mode).collect();
        assert_eq!(
            modes,
            [
                Some(FileMode(0o440)),
                Some(FileMode(0o440)),
                Some(FileMode(0o600))
            ]
        );
        assert_eq!(
            (spec.secrets[0].uid, spec.secrets[0].gid),
            (Some(1000), Some(100))
        );
        // Written back as an octal string, read again to the same value.
        let again: SandboxSpec =
            serde_json::from_value(serde_json::to_value(&spec).unwrap()).unwrap();
        assert_eq!(again, spec);
        assert_eq!(
            serde_json::to_value(&spec).unwrap()["secrets"][0]["mode"],
            "0440"
        );
        let bad = [
            (
                r#"{"name":"s","path":"/run/secrets/s","mode":"4755"}"#,
                "secrets[0].mode",
            ),
            (
                r#"{"name":"s","path":"/run/secrets/s","mode":"1777"}"#,
                "secrets[0].mode",
            ),
            (
                r#"{"name":"s","path":"/run/secrets/s","mode":2048}"#,
                "secrets[0].mode",
            ),
            (
                r#"{"name":"s","path":"/run/secrets/s","uid":65535}"#,
                "secrets[0].uid",
            ),
            (
                r#"{"name":"s","path":"/run/secrets/s","gid":100000}"#,
                "secrets[0].gid",
            ),
            (r#"{"name":"s","env":"S","mode":"0400"}"#, "secrets[0].mode"),
            (r#"{"name":"s","env":"S","uid":1000}"#, "secrets[0].uid"),
        ];
        for (secret, field) in bad {
            assert_eq!(
                field_of(&format!(r#"{{"secrets":[{secret}]}}"#)),
                field,
                "{secret}"
            );
        }
        // Not a mode at all: refused while parsing.
        for mode in [r#""rw""#, r#""0999""#, "-1", r#""""#, "1.5"] {
            let body =
                format!(r#"{{"secrets":[{{"name":"s","path":"/run/secrets/s","mode":{mode}}}]}}"#);
            assert!(SandboxSpec::from_json(&body).is_err(), "{mode}");
        }
    }
}
