//! Access control: documents carry a public flag and/or groups; a principal
//! sees a document when it is public, or when they share a group.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::glob::{MatchOptions, Pattern};

/// Who may read one document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Acl {
    /// Readable by every principal.
    #[serde(default)]
    pub public: bool,
    /// Readable by members of any of these groups (sorted, deduplicated).
    #[serde(default)]
    pub groups: Vec<String>,
}

impl Acl {
    /// A document every principal may read.
    pub fn public() -> Self {
        Acl {
            public: true,
            groups: Vec::new(),
        }
    }

    /// A document readable by members of any of `groups`.
    pub fn groups<I, S>(groups: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let set: BTreeSet<String> = groups.into_iter().map(Into::into).collect();
        Acl {
            public: false,
            groups: set.into_iter().collect(),
        }
    }

    /// Parse `public`, `none`, or a comma list of `public` and `group:NAME`
    /// (a bare `NAME` is a group too).
    pub fn parse(spec: &str) -> Result<Acl, String> {
        let mut acl = Acl::default();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "public" => acl.public = true,
                "none" | "private" => {}
                g => {
                    let name = g.strip_prefix("group:").unwrap_or(g);
                    if name.is_empty() || name.contains(char::is_whitespace) {
                        return Err(format!("invalid ACL entry {part:?} in {spec:?}: expected public, none or group:NAME"));
                    }
                    acl.groups.push(name.to_string());
                }
            }
        }
        Ok(acl.normalized())
    }

    /// Sorted, deduplicated form.
    pub fn normalized(mut self) -> Self {
        self.groups.sort();
        self.groups.dedup();
        self
    }

    /// Whether `principal` may read a document with this ACL.
    pub fn allows(&self, principal: &Principal) -> bool {
        principal.all_access
            || self.public
            || self.groups.iter().any(|g| principal.groups.contains(g))
    }
}

/// The identity a session or mount is opened for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    /// Name recorded in the audit log.
    pub name: String,
    /// Groups the principal belongs to.
    pub groups: BTreeSet<String>,
    /// Sees every document regardless of ACL (operators only).
    #[serde(default)]
    pub all_access: bool,
}

impl Principal {
    /// A principal with a name and groups.
    pub fn new<I, S>(name: impl Into<String>, groups: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Principal {
            name: name.into(),
            groups: groups.into_iter().map(Into::into).collect(),
            all_access: false,
        }
    }

    /// The anonymous principal: sees public documents only.
    pub fn anonymous() -> Self {
        Principal::new("anonymous", Vec::<String>::new())
    }

    /// The operator: sees every document.
    pub fn operator() -> Self {
        Principal {
            name: "operator".into(),
            groups: BTreeSet::new(),
            all_access: true,
        }
    }

    /// Two principals with the same key see exactly the same documents.
    pub fn view_key(&self) -> String {
        if self.all_access {
            return "*".into();
        }
        let mut k = String::from("g:");
        for g in &self.groups {
            k.push_str(&g.len().to_string());
            k.push(':');
            k.push_str(g);
        }
        k
    }
}

/// One ingest rule: documents whose path matches `pattern` get `acl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclRule {
    /// Wildcard over the document path (no leading `/`); `**` spans directories.
    pub pattern: String,
    /// The ACL given to matching documents.
    pub acl: Acl,
}

impl AclRule {
    /// Parse `GLOB=ACL`, e.g. `internal/**=group:eng` or `press/*=public`.
    pub fn parse(spec: &str) -> Result<AclRule, String> {
        let (pattern, acl) = spec.rsplit_once('=').ok_or_else(|| {
            format!("invalid ACL rule {spec:?}: expected GLOB=ACL, e.g. 'internal/**=group:eng'")
        })?;
        if pattern.is_empty() {
            return Err(format!("invalid ACL rule {spec:?}: empty pattern"));
        }
        Ok(AclRule {
            pattern: pattern.to_string(),
            acl: Acl::parse(acl)?,
        })
    }
}

/// How ingest assigns ACLs: a default, then rules in order (the last match wins),
/// then an ACL carried by the source itself (JSONL metadata) overrides both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclPolicy {
    /// ACL for documents no rule matches.
    pub default: Acl,
    /// Path rules.
    #[serde(default)]
    pub rules: Vec<AclRule>,
}

impl Default for AclPolicy {
    fn default() -> Self {
        AclPolicy {
            default: Acl::public(),
            rules: Vec::new(),
        }
    }
}

impl AclPolicy {
    /// The ACL for a document at `path`.
    pub fn acl_for(&self, path: &str) -> Acl {
        let opts = MatchOptions {
            pathname: true,
            ..Default::default()
        };
        let mut acl = &self.default;
        for rule in &self.rules {
            if Pattern::new_recursive(&rule.pattern).matches(path, opts) {
                acl = &rule.acl;
            }
        }
        acl.clone().normalized()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows() {
        let eng = Principal::new("alice", ["eng"]);
        let anon = Principal::anonymous();
        assert!(Acl::public().allows(&anon));
        assert!(Acl::groups(["eng", "ops"]).allows(&eng));
        assert!(!Acl::groups(["ops"]).allows(&eng));
        assert!(!Acl::groups(["eng"]).allows(&anon));
        assert!(Acl::groups(["x"]).allows(&Principal::operator()));
        assert!(!Acl::default().allows(&eng));
    }

    #[test]
    fn policy_last_rule_wins() {
        let p = AclPolicy {
            default: Acl::public(),
            rules: vec![
                AclRule {
                    pattern: "internal/**".into(),
                    acl: Acl::groups(["eng"]),
                },
                AclRule {
                    pattern: "internal/hr/**".into(),
                    acl: Acl::groups(["hr"]),
                },
            ],
        };
        assert_eq!(p.acl_for("readme.md"), Acl::public());
        assert_eq!(p.acl_for("internal/a.md"), Acl::groups(["eng"]));
        assert_eq!(p.acl_for("internal/hr/pay.md"), Acl::groups(["hr"]));
    }

    #[test]
    fn parses_specs() {
        assert_eq!(Acl::parse("public").unwrap(), Acl::public());
        assert_eq!(Acl::parse("group:b, a").unwrap(), Acl::groups(["a", "b"]));
        assert_eq!(Acl::parse("none").unwrap(), Acl::default());
        assert!(Acl::parse("group:").is_err());
        let r = AclRule::parse("hr/**=group:hr").unwrap();
        assert_eq!(r.pattern, "hr/**");
        assert!(AclRule::parse("nope").is_err());
    }

    #[test]
    fn view_key_distinguishes_groups() {
        assert_ne!(
            Principal::new("a", ["x,y"]).view_key(),
            Principal::new("a", ["x", "y"]).view_key()
        );
        assert_eq!(
            Principal::new("a", ["x"]).view_key(),
            Principal::new("b", ["x"]).view_key()
        );
    }
}
