//! E2B's sandbox network options (`allow_internet_access`, `network.allowOut`,
//! `denyOut`, `allowPublicTraffic`) mapped onto Sandlot's egress policies
//! (`NetworkSpec`, `docs/networking.md`), and back for `get_info`.
//!
//! E2B filters by deny and allow lists where an allow entry wins over a deny entry.
//! The mapping: everything open (`open`); everything denied (`denyOut` holds
//! `0.0.0.0/0`, or `allow_internet_access: false`) except the `allowOut` entries
//! (`allow`, one rule each: an IP or CIDR is a `cidr` rule, a name a `domain` rule,
//! `*.example.com` included); some destinations denied and the rest open (`open`
//! with one `deny` rule per `denyOut` entry and the `allowOut` entries as `allow`
//! rules, which win over the deny rules in that mode too).
//!
//! `allowPublicTraffic: true` becomes `ports.public` ([`public_ports`]); absent or
//! false leaves ports behind the traffic access token or the key.

use serde_json::{json, Map, Value};

use sandlot_proto::spec::{check_domain_pattern, AllowRule, Cidr, NetworkMode, NetworkSpec};

/// E2B's selector for all traffic (`ctx.all_traffic`).
pub const ALL_TRAFFIC: &str = "0.0.0.0/0";

fn is_all(s: &str) -> bool {
    matches!(s.trim(), ALL_TRAFFIC | "::/0")
}

/// The strings of a list field (`network.allowOut`), or an error naming it.
fn strings(field: &str, v: Option<&Value>) -> Result<Vec<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, e)| {
                e.as_str()
                    .map(|s| s.trim().to_string())
                    .ok_or_else(|| format!("{field}[{i}]: expected a string, got {e}"))
            })
            .collect(),
        Some(other) => Err(format!("{field}: expected a list of strings, got {other}")),
    }
}

/// One `allowOut` or `denyOut` entry as a rule: an address or CIDR, else a name.
fn rule(field: &str, s: &str) -> Result<AllowRule, String> {
    let looks_numeric = s.contains('/')
        || s.contains(':')
        || s.parse::<std::net::IpAddr>().is_ok()
        || s.bytes().all(|c| c.is_ascii_digit() || c == b'.');
    if looks_numeric {
        Cidr::parse(s).map_err(|e| format!("{field}: {e}"))?;
        return Ok(AllowRule {
            domain: None,
            cidr: Some(s.to_string()),
            ports: Vec::new(),
        });
    }
    let d = s.to_ascii_lowercase();
    check_domain_pattern(&d).map_err(|e| format!("{field}: {e}"))?;
    Ok(AllowRule::domain(&d))
}

/// Fields of E2B's network configuration that Sandlot has nothing for.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("egressProxy", "tunnelling egress through a proxy of yours"),
    ("rules", "per-host request transforms"),
    ("maskRequestHost", "a custom host for sandbox URLs"),
];

/// The policy an E2B create or network update asks for. `None`: the request says
/// nothing about the network (a create then gets the operator's default). Errors
/// name the field.
pub fn policy(
    allow_internet_access: Option<&Value>,
    network: Option<&Value>,
) -> Result<Option<NetworkSpec>, String> {
    let internet = match allow_internet_access {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => {
            return Err(format!(
                "allow_internet_access: expected true or false, got {other}"
            ))
        }
    };
    let empty = Map::new();
    let net = match network {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(o)) => o,
        Some(other) => return Err(format!("network: expected an object, got {other}")),
    };
    for (k, what) in UNSUPPORTED {
        if net.get(*k).is_some_and(|v| !v.is_null()) {
            return Err(format!("network.{k}: {what} is not supported by Sandlot"));
        }
    }
    let allow = strings("network.allowOut", net.get("allowOut"))?;
    let deny = strings("network.denyOut", net.get("denyOut"))?;
    let deny_all = internet == Some(false) || deny.iter().any(|s| is_all(s));
    if allow.iter().any(|s| is_all(s)) {
        return Ok(Some(open()));
    }
    let rules = |field: &str, list: &[String]| {
        list.iter()
            .enumerate()
            .map(|(i, s)| rule(&format!("{field}[{i}]"), s))
            .collect::<Result<Vec<_>, _>>()
    };
    if deny_all {
        return Ok(Some(NetworkSpec {
            mode: NetworkMode::Allow,
            allow: rules("network.allowOut", &allow)?,
            deny: Vec::new(),
        }));
    }
    if !deny.is_empty() {
        // Some destinations denied, the rest open; allowOut entries win.
        return Ok(Some(NetworkSpec {
            mode: NetworkMode::Open,
            allow: rules("network.allowOut", &allow)?,
            deny: rules("network.denyOut", &deny)?,
        }));
    }
    if internet == Some(true) || !allow.is_empty() {
        // An allow list without a deny list allows everything, as in E2B.
        return Ok(Some(open()));
    }
    Ok(None)
}

/// Everything open (E2B's default).
pub fn open() -> NetworkSpec {
    NetworkSpec {
        mode: NetworkMode::Open,
        allow: Vec::new(),
        deny: Vec::new(),
    }
}

/// Whether a create asks for public ports (`network.allowPublicTraffic: true`).
/// Absent or false: no (ports need the traffic access token or the key).
pub fn public_ports(network: Option<&Value>) -> Result<bool, String> {
    match network.and_then(|n| n.get("allowPublicTraffic")) {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(false),
        Some(Value::Bool(true)) => Ok(true),
        Some(other) => Err(format!(
            "network.allowPublicTraffic: expected true or false, got {other}"
        )),
    }
}

fn entries(rules: &[sandlot_proto::spec::AllowRule]) -> Vec<String> {
    rules
        .iter()
        .filter_map(|r| r.domain.clone().or_else(|| r.cidr.clone()))
        .collect()
}

/// `allowInternetAccess` and `network` of `get_info` for a sandbox's policy.
pub fn describe(n: &NetworkSpec) -> (bool, Value) {
    match n.mode {
        NetworkMode::Open => (
            true,
            json!({"allowOut": entries(&n.allow), "denyOut": entries(&n.deny)}),
        ),
        NetworkMode::None => (false, json!({"allowOut": [], "denyOut": [ALL_TRAFFIC]})),
        NetworkMode::Allow => (
            false,
            json!({"allowOut": entries(&n.allow), "denyOut": [ALL_TRAFFIC]}),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(internet: Value, net: Value) -> Result<Option<NetworkSpec>, String> {
        policy(Some(&internet), Some(&net))
    }

    #[test]
    fn nothing_asked_leaves_the_operator_default() {
        assert_eq!(policy(None, None).unwrap(), None);
        assert_eq!(p(Value::Null, json!({})).unwrap(), None);
        assert_eq!(
            p(Value::Null, json!({"allowPublicTraffic": false})).unwrap(),
            None
        );
        assert_eq!(
            p(Value::Null, json!({"allowPublicTraffic": true})).unwrap(),
            None
        );
    }

    #[test]
    fn public_traffic_is_an_opt_in_and_absent_means_private() {
        assert!(!public_ports(None).unwrap());
        assert!(!public_ports(Some(&json!({}))).unwrap());
        assert!(!public_ports(Some(&json!({"allowPublicTraffic": false}))).unwrap());
        assert!(public_ports(Some(&json!({"allowPublicTraffic": true}))).unwrap());
        let e = public_ports(Some(&json!({"allowPublicTraffic": "yes"}))).unwrap_err();
        assert!(e.starts_with("network.allowPublicTraffic"), "{e}");
    }

    #[test]
    fn deny_list_with_the_rest_open_is_an_open_policy_with_deny_rules() {
        let n = p(
            Value::Null,
            json!({"denyOut": ["8.8.8.8", "10.0.0.0/8", "Denied.TEST", "*.wild.test"],
                   "allowOut": ["ok.wild.test"], "allowPublicTraffic": true}),
        )
        .unwrap()
        .unwrap();
        assert_eq!(n.mode, NetworkMode::Open);
        assert_eq!(n.deny[0].cidr.as_deref(), Some("8.8.8.8"));
        assert_eq!(n.deny[1].cidr.as_deref(), Some("10.0.0.0/8"));
        assert_eq!(n.deny[2].domain.as_deref(), Some("denied.test"));
        assert_eq!(n.deny[3].domain.as_deref(), Some("*.wild.test"));
        assert_eq!(n.allow[0].domain.as_deref(), Some("ok.wild.test"));
        n.validate().unwrap();
        let (i, v) = describe(&n);
        assert!(i);
        assert_eq!(
            v,
            json!({"allowOut": ["ok.wild.test"],
                   "denyOut": ["8.8.8.8", "10.0.0.0/8", "denied.test", "*.wild.test"]})
        );
        let e = p(Value::Null, json!({"denyOut": ["8.8.8.8", "10.0.0.1/8"]})).unwrap_err();
        assert!(e.starts_with("network.denyOut[1]"), "{e}");
        let e = p(Value::Null, json!({"denyOut": ["*.com"]})).unwrap_err();
        assert!(e.starts_with("network.denyOut[0]"), "{e}");
        let e = p(
            Value::Null,
            json!({"denyOut": ["8.8.8.8", "::ffff:203.0.113.5"]}),
        )
        .unwrap_err();
        assert!(
            e.starts_with("network.denyOut[1]") && e.contains("::ffff:203.0.113.5"),
            "{e}"
        );
    }

    #[test]
    fn internet_access_is_open_or_nothing() {
        assert_eq!(
            p(json!(true), Value::Null).unwrap().unwrap().mode,
            NetworkMode::Open
        );
        let n = p(json!(false), Value::Null).unwrap().unwrap();
        assert_eq!((n.mode, n.allow.len()), (NetworkMode::Allow, 0));
        assert!(p(json!("yes"), Value::Null)
            .unwrap_err()
            .contains("allow_internet_access"));
    }

    #[test]
    fn deny_all_with_allow_list_is_an_allow_policy() {
        let n = p(
            Value::Null,
            json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["10.99.1.10", "203.0.113.0/24", "Allowed.TEST", "*.wild.test"]}),
        )
        .unwrap()
        .unwrap();
        assert_eq!(n.mode, NetworkMode::Allow);
        assert_eq!(n.allow[0].cidr.as_deref(), Some("10.99.1.10"));
        assert_eq!(n.allow[1].cidr.as_deref(), Some("203.0.113.0/24"));
        assert_eq!(n.allow[2].domain.as_deref(), Some("allowed.test"));
        assert_eq!(n.allow[3].domain.as_deref(), Some("*.wild.test"));
        n.validate().unwrap();
        // allow_internet_access=false is the same as denying all traffic.
        let m = p(json!(false), json!({"allowOut": ["allowed.test"]}))
            .unwrap()
            .unwrap();
        assert_eq!(m.mode, NetworkMode::Allow);
        assert_eq!(m.allow.len(), 1);
    }

    #[test]
    fn allow_wins_over_deny_and_allow_alone_is_open() {
        let all = p(
            Value::Null,
            json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["0.0.0.0/0"]}),
        );
        assert_eq!(all.unwrap().unwrap().mode, NetworkMode::Open);
        let alone = p(Value::Null, json!({"allowOut": ["1.2.3.4"]}));
        assert_eq!(alone.unwrap().unwrap().mode, NetworkMode::Open);
    }

    #[test]
    fn what_has_no_policy_is_refused_by_name() {
        let e = p(
            Value::Null,
            json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["10.0.0.1/8"]}),
        )
        .unwrap_err();
        assert!(e.starts_with("network.allowOut[0]"), "{e}");
        let e = p(
            Value::Null,
            json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["*.com"]}),
        )
        .unwrap_err();
        assert!(e.starts_with("network.allowOut[0]"), "{e}");
        let e = p(Value::Null, json!({"allowOut": [1]})).unwrap_err();
        assert!(e.starts_with("network.allowOut[0]"), "{e}");
        for k in ["egressProxy", "rules", "maskRequestHost"] {
            let e = p(Value::Null, json!({ k: {"a": 1} })).unwrap_err();
            assert!(e.starts_with(&format!("network.{k}")), "{e}");
        }
    }

    #[test]
    fn policies_describe_back_in_e2b_terms() {
        let (i, v) = describe(&open());
        assert!(i);
        assert_eq!(v["denyOut"], json!([]));
        let n = p(json!(false), json!({"allowOut": ["allowed.test"]}))
            .unwrap()
            .unwrap();
        let (i, v) = describe(&n);
        assert!(!i);
        assert_eq!(
            v,
            json!({"allowOut": ["allowed.test"], "denyOut": [ALL_TRAFFIC]})
        );
    }
}
