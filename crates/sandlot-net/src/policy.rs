//! Policy decisions, pure: which names the resolver answers, which destinations the
//! proxy connects to, and which addresses are off limits whatever the policy says.

use std::net::IpAddr;

use sandlot_proto::spec::{AllowRule, Cidr, NetworkMode, NetworkSpec};

/// A sandbox's network policy, compiled from its [`NetworkSpec`].
///
/// In `allow` mode the allow rules are all that is reachable. In `open` mode
/// everything is reachable but what a deny rule names, unless an allow rule names
/// it too (an allow rule wins, as in E2B). The operator's [`Ceiling`] is checked
/// separately and holds whatever these rules say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub mode: NetworkMode,
    allow: Rules,
    deny: Rules,
}

/// Name and address rules of one list (allow or deny).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Rules {
    domains: Vec<DomainRule>,
    cidrs: Vec<(Cidr, Vec<u16>)>,
}

impl Rules {
    fn compile(rules: &[AllowRule]) -> Rules {
        let mut out = Rules::default();
        for r in rules {
            if let Some(d) = &r.domain {
                let (wildcard, name) = match d.strip_prefix("*.") {
                    Some(n) => (true, n),
                    None => (false, d.as_str()),
                };
                out.domains.push(DomainRule {
                    name: normalize_name(name),
                    wildcard,
                    ports: r.ports.clone(),
                });
            }
            if let Some(c) = r.cidr.as_deref().and_then(|c| Cidr::parse(c).ok()) {
                out.cidrs.push((c, r.ports.clone()));
            }
        }
        out
    }

    /// A name rule names `name` (normalized) on `port`; `None`: on every port.
    fn names(&self, name: &str, port: Option<u16>) -> bool {
        self.domains.iter().any(|d| {
            d.matches(name)
                && match port {
                    Some(p) => port_ok(&d.ports, p),
                    None => d.ports.is_empty(),
                }
        })
    }

    fn addresses(&self, ip: IpAddr, port: u16) -> bool {
        self.cidrs
            .iter()
            .any(|(c, ports)| c.contains(ip) && port_ok(ports, port))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct DomainRule {
    /// Lowercase name without the `*.`.
    name: String,
    wildcard: bool,
    ports: Vec<u16>,
}

impl DomainRule {
    fn matches(&self, name: &str) -> bool {
        if self.wildcard {
            name.len() > self.name.len() + 1
                && name.ends_with(&self.name)
                && name.as_bytes()[name.len() - self.name.len() - 1] == b'.'
        } else {
            name == self.name
        }
    }
}

fn port_ok(ports: &[u16], port: u16) -> bool {
    ports.is_empty() || ports.contains(&port)
}

/// Why `name` (a TLS server name or HTTP `Host`, one trailing dot allowed) is not
/// a host name the proxy resolves or matches against rules: it must be at most
/// 253 bytes of labels of 1 to 63 letters, digits, `-` or `_`. Anything else
/// (control bytes, a label longer than a DNS length byte can say, spaces) could
/// ask the resolver for another name than the one the rules matched.
pub fn host_name_problem(name: &str) -> Option<String> {
    let n = name.strip_suffix('.').unwrap_or(name);
    let shown = || {
        let cut: String = n.chars().take(64).collect();
        let more = if cut.len() < n.len() { "..." } else { "" };
        format!("{cut:?}{more}")
    };
    if n.is_empty() {
        return Some("an empty server name".into());
    }
    if n.len() > 253 {
        return Some(format!(
            "a server name of {} bytes (at most 253): {}",
            n.len(),
            shown()
        ));
    }
    for label in n.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Some(format!(
                "a server name with a label of {} bytes (1 to 63): {}",
                label.len(),
                shown()
            ));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Some(format!(
                "a server name that is not a host name (letters, digits, '-', '_'): {}",
                shown()
            ));
        }
    }
    None
}

/// Lowercases a DNS name and strips one trailing dot.
pub fn normalize_name(name: &str) -> String {
    let n = name.strip_suffix('.').unwrap_or(name);
    n.to_ascii_lowercase()
}

impl Policy {
    /// Compiles a spec that passed [`NetworkSpec::validate`].
    pub fn compile(spec: &NetworkSpec) -> Policy {
        Policy {
            mode: spec.mode,
            allow: Rules::compile(&spec.allow),
            deny: Rules::compile(&spec.deny),
        }
    }

    /// Whether the resolver answers queries for `name` (any record type). In
    /// `open` mode a name denied on every port gets no answer, unless an allow
    /// rule names it on any port; a name denied on some ports only still resolves.
    pub fn resolves(&self, name: &str) -> bool {
        let n = normalize_name(name);
        match self.mode {
            NetworkMode::None => false,
            NetworkMode::Open => {
                !self.deny.names(&n, None) || self.allow.domains.iter().any(|d| d.matches(&n))
            }
            NetworkMode::Allow => self.allow.domains.iter().any(|d| d.matches(&n)),
        }
    }

    /// Whether a TCP connection to `name:port` (name taken from SNI or Host) is allowed.
    pub fn allows_name(&self, name: &str, port: u16) -> bool {
        let n = normalize_name(name);
        match self.mode {
            NetworkMode::None => false,
            NetworkMode::Open => {
                !self.deny.names(&n, Some(port)) || self.allow.names(&n, Some(port))
            }
            NetworkMode::Allow => self.allow.names(&n, Some(port)),
        }
    }

    /// Whether the address rules allow a TCP connection to `ip:port` (open mode:
    /// any address no deny rule names; the off-limits check is separate).
    pub fn allows_addr(&self, ip: IpAddr, port: u16) -> bool {
        match self.mode {
            NetworkMode::None => false,
            NetworkMode::Open => !self.deny.addresses(ip, port) || self.allow.addresses(ip, port),
            NetworkMode::Allow => self.allow.addresses(ip, port),
        }
    }

    /// Whether a connection to `ip:port` that the address rules allow, and whose
    /// first bytes named `name`, is allowed: a deny rule for the name refuses it
    /// unless an allow rule names the name or the address.
    pub fn allows_named_addr(&self, ip: IpAddr, port: u16, name: &str) -> bool {
        self.allows_addr(ip, port)
            && (self.allows_name(name, port)
                || (self.mode == NetworkMode::Open && self.allow.addresses(ip, port)))
    }

    /// Whether a connection the address rules refuse goes on by the name its first
    /// bytes gave (the proxy then resolves the name itself): in `allow` mode an
    /// allowed name; in `open` mode only a name an allow rule names (a name no deny
    /// rule names does not lift a denied address).
    pub fn admits_by_name(&self, name: &str, port: u16) -> bool {
        match self.mode {
            NetworkMode::Open => self.allow.names(&normalize_name(name), Some(port)),
            _ => self.allows_name(name, port),
        }
    }

    /// Whether allow name rules exist: a connection the address rules refuse is
    /// then let through when its SNI or Host names an allowed name (the proxy
    /// resolves that name itself).
    pub fn has_names(&self) -> bool {
        !self.allow.domains.is_empty()
    }

    /// Whether this policy has a deny name rule that `old` lacks: a connection
    /// `old` admitted without reading its name was never checked against it.
    pub fn denies_names_beyond(&self, old: &Policy) -> bool {
        self.screens_names()
            && self
                .deny
                .domains
                .iter()
                .any(|d| !old.screens_names() || !old.deny.domains.contains(d))
    }

    /// Whether deny name rules exist (`open` mode): the proxy reads the name of
    /// every connection the address rules allow and refuses denied names.
    pub fn screens_names(&self) -> bool {
        self.mode == NetworkMode::Open && !self.deny.domains.is_empty()
    }
}

/// Addresses no sandbox may reach, whatever its policy (the operator's ceiling).
#[derive(Debug, Clone)]
pub struct Ceiling {
    /// Never reachable: loopback, link-local and metadata, multicast, unspecified,
    /// the slot subnet (other sandboxes).
    always: Vec<Cidr>,
    /// Private ranges: reachable only when inside `allow_private`.
    private: Vec<Cidr>,
    allow_private: Vec<Cidr>,
}

fn cidrs(list: &[&str]) -> Vec<Cidr> {
    list.iter()
        .map(|c| Cidr::parse(c).expect("built-in CIDR"))
        .collect()
}

/// Ranges no sandbox ever reaches.
pub const ALWAYS_DENIED: &[&str] = &[
    "0.0.0.0/8",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/128",
    "::1/128",
    "fe80::/10",
    "ff00::/8",
    // Cloud metadata and agent endpoints outside link-local: AWS's IPv6 one,
    // Azure's WireServer, Alibaba Cloud's metadata server.
    "fd00:ec2::254/128",
    "168.63.129.16/32",
    "100.100.100.200/32",
];

/// Private ranges, reachable only when the operator lists them in `allow_private`.
pub const PRIVATE: &[&str] = &[
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "192.0.0.0/24",
    "198.18.0.0/15",
    "fc00::/7",
];

impl Ceiling {
    pub fn new(slot_subnet: Cidr, allow_private: Vec<Cidr>) -> Ceiling {
        let mut always = cidrs(ALWAYS_DENIED);
        always.push(slot_subnet);
        // Other daemons' sandboxes, wherever their automatic subnets are.
        always.extend(cidrs(&[crate::subnet::AUTO_RANGE]));
        Ceiling {
            always,
            private: cidrs(PRIVATE),
            allow_private,
        }
    }

    /// Why `ip` is off limits, or `None`. `local` are the host's own addresses (the
    /// daemon listens on some of them).
    pub fn denies(&self, ip: IpAddr, local: &[IpAddr]) -> Option<&'static str> {
        let ip = match ip {
            IpAddr::V6(v) => v.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v => v,
        };
        if ip.is_ipv6() {
            return Some("IPv6 is not routed for sandboxes");
        }
        if local.contains(&ip) {
            return Some("the host itself");
        }
        if self.always.iter().any(|c| c.contains(ip)) {
            return Some("loopback, link-local, metadata, multicast or another sandbox");
        }
        if self.private.iter().any(|c| c.contains(ip))
            && !self.allow_private.iter().any(|c| c.contains(ip))
        {
            return Some("a private range the operator did not allow");
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rules: Vec<AllowRule>) -> NetworkSpec {
        NetworkSpec {
            mode: NetworkMode::Allow,
            allow: rules,
            deny: vec![],
        }
    }

    #[test]
    fn exact_names_match_only_themselves() {
        let p = Policy::compile(&spec(vec![AllowRule::domain("allowed.test")]));
        assert!(p.resolves("allowed.test"));
        assert!(p.resolves("ALLOWED.test."));
        assert!(!p.resolves("x.allowed.test"));
        assert!(!p.resolves("notallowed.test"));
        assert!(!p.resolves("allowed.test.evil"));
        assert!(p.allows_name("allowed.test", 443));
    }

    #[test]
    fn wildcards_match_subdomains_not_the_apex_or_lookalikes() {
        let p = Policy::compile(&spec(vec![AllowRule::domain("*.wild.test")]));
        assert!(p.resolves("a.wild.test"));
        assert!(p.resolves("b.a.wild.test"));
        assert!(!p.resolves("wild.test"));
        assert!(!p.resolves("notwild.test"));
        assert!(!p.resolves("a.wild.test.evil"));
        assert!(!p.resolves("awild.test"));
    }

    #[test]
    fn ports_restrict_connections_not_dns() {
        let mut r = AllowRule::domain("api.test");
        r.ports = vec![443];
        let p = Policy::compile(&spec(vec![r]));
        assert!(p.resolves("api.test"));
        assert!(p.allows_name("api.test", 443));
        assert!(!p.allows_name("api.test", 80));
    }

    #[test]
    fn cidr_rules_match_addresses_and_ports() {
        let r = AllowRule {
            domain: None,
            cidr: Some("203.0.113.0/24".into()),
            ports: vec![22],
        };
        let p = Policy::compile(&spec(vec![r]));
        assert!(p.allows_addr("203.0.113.9".parse().unwrap(), 22));
        assert!(!p.allows_addr("203.0.113.9".parse().unwrap(), 80));
        assert!(!p.allows_addr("203.0.114.9".parse().unwrap(), 22));
        assert!(!p.has_names());
        assert!(!p.resolves("anything.test"));
    }

    #[test]
    fn modes_none_and_open() {
        let none = Policy::compile(&NetworkSpec::default());
        assert!(!none.resolves("a.test") && !none.allows_name("a.test", 80));
        let open = Policy::compile(&NetworkSpec {
            mode: NetworkMode::Open,
            allow: vec![],
            deny: vec![],
        });
        assert!(open.resolves("a.test") && open.allows_addr("8.8.8.8".parse().unwrap(), 53));
    }

    fn cidr(c: &str, ports: Vec<u16>) -> AllowRule {
        AllowRule {
            domain: None,
            cidr: Some(c.into()),
            ports,
        }
    }

    fn open_denying(deny: Vec<AllowRule>, allow: Vec<AllowRule>) -> Policy {
        let s = NetworkSpec {
            mode: NetworkMode::Open,
            allow,
            deny,
        };
        s.validate().unwrap();
        Policy::compile(&s)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn open_mode_refuses_denied_addresses_and_keeps_the_rest() {
        let p = open_denying(
            vec![
                cidr("203.0.113.0/24", vec![]),
                cidr("198.51.100.7", vec![22]),
            ],
            vec![],
        );
        assert!(!p.allows_addr(ip("203.0.113.9"), 443));
        assert!(p.allows_addr(ip("203.0.114.9"), 443));
        assert!(!p.allows_addr(ip("198.51.100.7"), 22), "denied port");
        assert!(p.allows_addr(ip("198.51.100.7"), 443), "other port");
        assert!(!p.screens_names() && !p.has_names());
        assert!(p.resolves("anything.test"));
    }

    #[test]
    fn open_mode_denied_names_get_no_answer_and_no_connection() {
        let mut ssh_only = AllowRule::domain("git.test");
        ssh_only.ports = vec![22];
        let p = open_denying(
            vec![
                AllowRule::domain("denied.test"),
                AllowRule::domain("*.wild.test"),
                ssh_only,
            ],
            vec![],
        );
        assert!(p.screens_names());
        assert!(!p.resolves("denied.test") && !p.resolves("DENIED.test."));
        assert!(!p.resolves("a.wild.test"));
        assert!(p.resolves("wild.test") && p.resolves("other.test"));
        assert!(
            p.resolves("git.test"),
            "denied on one port only: still resolves"
        );
        assert!(!p.allows_name("git.test", 22) && p.allows_name("git.test", 443));
        let a = ip("203.0.113.9");
        assert!(!p.allows_named_addr(a, 443, "denied.test"));
        assert!(!p.allows_named_addr(a, 80, "x.wild.test"));
        assert!(p.allows_named_addr(a, 443, "other.test"));
        assert!(p.allows_addr(a, 443), "a literal address carries no name");
    }

    #[test]
    fn open_mode_allow_rules_win_over_deny_rules() {
        let p = open_denying(
            vec![
                cidr("203.0.113.0/24", vec![]),
                AllowRule::domain("*.corp.test"),
            ],
            vec![
                cidr("203.0.113.5", vec![]),
                AllowRule::domain("api.corp.test"),
            ],
        );
        assert!(p.allows_addr(ip("203.0.113.5"), 443));
        assert!(!p.allows_addr(ip("203.0.113.6"), 443));
        assert!(p.resolves("api.corp.test") && !p.resolves("www.corp.test"));
        assert!(p.allows_name("api.corp.test", 443));
        assert!(p.has_names(), "an allowed name rescues a denied address");
        assert!(p.admits_by_name("api.corp.test", 443));
        assert!(
            !p.admits_by_name("other.test", 443),
            "a name no rule names does not lift a denied address"
        );
        // An allowed address wins over a denied name on it.
        assert!(p.allows_named_addr(ip("203.0.113.5"), 443, "www.corp.test"));
        assert!(!p.allows_named_addr(ip("192.0.2.1"), 443, "www.corp.test"));
    }

    #[test]
    fn deny_rules_are_refused_outside_open_mode() {
        for mode in [NetworkMode::None, NetworkMode::Allow] {
            let s = NetworkSpec {
                mode,
                allow: vec![],
                deny: vec![cidr("203.0.113.0/24", vec![])],
            };
            assert_eq!(s.validate().unwrap_err().field(), "network.deny");
        }
        let s = NetworkSpec {
            mode: NetworkMode::Open,
            allow: vec![AllowRule::domain("a.test")],
            deny: vec![],
        };
        assert_eq!(s.validate().unwrap_err().field(), "network.allow");
        let s = NetworkSpec {
            mode: NetworkMode::Open,
            allow: vec![],
            deny: vec![cidr("ok.test", vec![])],
        };
        assert_eq!(s.validate().unwrap_err().field(), "network.deny[0].cidr");
    }

    #[test]
    fn ipv4_mapped_ipv6_entries_are_refused_by_name() {
        for (i, entry) in [
            "::ffff:203.0.113.5",
            "::ffff:0:0/96",
            "::ffff:203.0.113.0/120",
        ]
        .into_iter()
        .enumerate()
        {
            let mut deny: Vec<AllowRule> =
                (0..i).map(|_| cidr("198.51.100.0/24", vec![])).collect();
            deny.push(cidr(entry, vec![]));
            let s = NetworkSpec {
                mode: NetworkMode::Open,
                allow: vec![],
                deny,
            };
            let e = s.validate().unwrap_err();
            assert_eq!(e.field(), format!("network.deny[{i}].cidr"));
            assert!(e.to_string().contains(entry), "{e}");
        }
        assert!(Cidr::parse("2001:db8::/32").is_ok());
        assert!(Cidr::parse("::/0").is_ok());
    }

    #[test]
    fn an_allow_exception_on_some_ports_still_resolves_a_denied_name() {
        let mut api = AllowRule::domain("api.corp.test");
        api.ports = vec![443];
        let p = open_denying(vec![AllowRule::domain("*.corp.test")], vec![api]);
        assert!(p.resolves("api.corp.test"));
        assert!(!p.resolves("www.corp.test"));
        assert!(p.allows_name("api.corp.test", 443));
        assert!(!p.allows_name("api.corp.test", 80));
    }

    #[test]
    fn the_ceiling_holds_whatever_the_policy() {
        let c = Ceiling::new(
            Cidr::parse("100.96.0.0/16").unwrap(),
            vec![
                Cidr::parse("10.99.0.0/16").unwrap(),
                Cidr::parse("100.64.0.0/10").unwrap(),
            ],
        );
        let local: Vec<IpAddr> = vec!["10.99.0.1".parse().unwrap()];
        let d = |s: &str| c.denies(s.parse().unwrap(), &local);
        assert!(d("169.254.169.254").is_some());
        assert!(d("127.0.0.1").is_some());
        assert!(d("::ffff:127.0.0.1").is_some());
        assert!(d("fd00:ec2::254").is_some());
        assert!(d("168.63.129.16").is_some(), "Azure's WireServer");
        assert!(d("168.63.129.17").is_none());
        // Even where the operator allows 100.64/10, which holds it.
        assert!(d("100.100.100.200").is_some(), "Alibaba Cloud's metadata");
        assert!(d("100.96.0.6").is_some(), "another sandbox");
        // Even where the operator allows 100.64/10: another daemon's automatic subnet.
        assert!(d("100.97.0.2").is_some(), "another daemon's sandbox");
        assert!(
            d("100.65.0.1").is_none(),
            "private, allowed by the operator"
        );
        assert!(d("10.99.0.1").is_some(), "the host");
        assert!(d("192.168.1.1").is_some(), "private, not allowed");
        assert!(d("10.1.2.3").is_some(), "private, not allowed");
        assert!(
            d("10.99.1.10").is_none(),
            "private, allowed by the operator"
        );
        assert!(d("203.0.113.7").is_none());
        assert!(d("2001:db8::1").is_some(), "IPv6");
    }
}
