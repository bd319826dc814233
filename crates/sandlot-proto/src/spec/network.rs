//! How a sandbox reaches the network: the egress policy (`NetworkSpec`: mode,
//! allow rules, deny rules) and its pieces (rules, CIDRs, domain patterns). See
//! `docs/networking.md`.

use serde::{Deserialize, Serialize};

use super::SpecError;

/// How the sandbox reaches the network. See `docs/networking.md`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    #[serde(default)]
    pub mode: NetworkMode,
    /// With `mode: allow`: the destinations the sandbox may reach; everything else
    /// is refused. With `mode: open` and `deny` rules: exceptions to the deny rules
    /// (an allow rule wins over a deny rule). Must be empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<AllowRule>,
    /// With `mode: open` only: destinations refused although everything else is
    /// open (names and CIDRs, optionally per port). A deny rule only ever removes
    /// destinations; it never opens one the operator's ceiling forbids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<DenyRule>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// Loopback only.
    #[default]
    None,
    /// Only the destinations listed in `allow` (names and CIDRs, TCP, DNS for the
    /// allowed names).
    Allow,
    /// Outbound TCP to the internet, never the host, the daemon, other sandboxes,
    /// link-local/metadata addresses, or private ranges the operator did not allow.
    Open,
}

impl NetworkMode {
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::None => "none",
            NetworkMode::Allow => "allow",
            NetworkMode::Open => "open",
        }
    }
}

/// One allowed destination: exactly one of `domain` or `cidr`, and optionally the
/// TCP ports (absent or empty: any port).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowRule {
    /// `api.example.com` (exactly that name) or `*.example.com` (any name below
    /// `example.com`, not `example.com` itself). Lowercase, no trailing dot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// `203.0.113.0/24` or `2001:db8::/32` (host bits zero); a bare address is a /32
    /// (/128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
}

/// One denied destination: the same shape as an allow rule (exactly one of
/// `domain` or `cidr`; `ports` absent or empty: every port).
pub type DenyRule = AllowRule;

impl AllowRule {
    /// An allow rule for a domain on any port.
    pub fn domain(d: &str) -> AllowRule {
        AllowRule {
            domain: Some(d.to_string()),
            cidr: None,
            ports: Vec::new(),
        }
    }
}

/// Most allow rules in one spec (and, separately, most deny rules).
pub const MAX_ALLOW_RULES: usize = 256;
/// Most ports in one allow rule.
pub const MAX_RULE_PORTS: usize = 64;

/// A parsed network prefix: address and prefix length, host bits zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    pub addr: std::net::IpAddr,
    pub len: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/n`, `x::y/n`, or a bare address. Host bits must be zero.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: std::net::IpAddr = a
            .parse()
            .map_err(|_| format!("{s:?} is not an IP address or CIDR"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match l {
            None => max,
            Some(l) => l
                .parse::<u8>()
                .ok()
                .filter(|n| *n <= max)
                .ok_or_else(|| format!("{s:?}: prefix length must be 0..={max}"))?,
        };
        if let std::net::IpAddr::V6(v6) = addr {
            // Addresses are compared as IPv4 once unmapped: a mapped entry would
            // never match anything.
            if let Some(v4) = v6.to_ipv4_mapped().filter(|_| len >= 96) {
                return Err(format!(
                    "{s:?} is an IPv4-mapped IPv6 address: write it as IPv4 ({v4}/{})",
                    len - 96
                ));
            }
        }
        let c = Cidr { addr, len };
        if c.network() != addr {
            return Err(format!(
                "{s:?} has host bits set (did you mean {}/{len}?)",
                c.network()
            ));
        }
        Ok(c)
    }

    fn mask_bits(&self) -> u128 {
        let width = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.len == 0 {
            0
        } else {
            (u128::MAX << (width - self.len as u32)) & (u128::MAX >> (128 - width))
        }
    }

    fn bits(a: std::net::IpAddr) -> u128 {
        match a {
            std::net::IpAddr::V4(v) => u32::from(v) as u128,
            std::net::IpAddr::V6(v) => u128::from(v),
        }
    }

    /// The address with its host bits cleared.
    pub fn network(&self) -> std::net::IpAddr {
        let b = Cidr::bits(self.addr) & self.mask_bits();
        match self.addr {
            std::net::IpAddr::V4(_) => std::net::IpAddr::V4((b as u32).into()),
            std::net::IpAddr::V6(_) => std::net::IpAddr::V6(b.into()),
        }
    }

    /// Whether `ip` is inside this prefix (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        let ip = match ip {
            std::net::IpAddr::V6(v) => v.to_ipv4_mapped().map(std::net::IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        if ip.is_ipv4() != self.addr.is_ipv4() {
            return false;
        }
        Cidr::bits(ip) & self.mask_bits() == Cidr::bits(self.addr)
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// Checks a domain pattern: `name.tld` or `*.name.tld`. Returns the problem.
pub fn check_domain_pattern(d: &str) -> Result<(), String> {
    let (wild, name) = match d.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, d),
    };
    if name.is_empty() || name.len() > 253 {
        return Err(format!("{d:?} must be 1 to 253 characters"));
    }
    if name.contains('*') {
        return Err(format!(
            "{d:?}: '*' is only allowed as the whole first label (\"*.example.com\")"
        ));
    }
    let labels: Vec<&str> = name.split('.').collect();
    for l in &labels {
        if l.is_empty() || l.len() > 63 {
            return Err(format!(
                "{d:?}: labels are 1 to 63 characters (no empty label, no trailing dot)"
            ));
        }
        if !l
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(format!(
                "{d:?}: use lowercase letters, digits, '-' and '_' in names"
            ));
        }
        if l.starts_with('-') || l.ends_with('-') {
            return Err(format!("{d:?}: a label may not start or end with '-'"));
        }
    }
    if wild && labels.len() < 2 {
        return Err(format!(
            "{d:?}: a wildcard needs at least two labels after \"*.\" (\"*.example.com\", not \"*.com\")"
        ));
    }
    Ok(())
}

impl NetworkSpec {
    /// Checks the network section; errors name `network.allow[i].domain`,
    /// `network.deny[i].cidr` and so on.
    pub fn validate(&self) -> Result<(), SpecError> {
        let mode = self.mode.as_str();
        if !self.deny.is_empty() && self.mode != NetworkMode::Open {
            let why = match self.mode {
                NetworkMode::Allow => "deny rules need mode \"open\": in mode \"allow\" everything no allow rule names is already refused, and an allow rule wins over a deny rule".to_string(),
                _ => format!("deny rules need mode \"open\" (mode is {mode:?})"),
            };
            return Err(SpecError::new("network.deny", why));
        }
        let allow_ok = match self.mode {
            NetworkMode::Allow => true,
            NetworkMode::Open => !self.deny.is_empty(),
            NetworkMode::None => false,
        };
        if !allow_ok && !self.allow.is_empty() {
            let why = match self.mode {
                NetworkMode::Open => "in mode \"open\" allow rules are exceptions to deny rules, and there are none: drop them, or add deny rules".to_string(),
                _ => format!("allow rules need mode \"allow\", or \"open\" with deny rules (mode is {mode:?})"),
            };
            return Err(SpecError::new("network.allow", why));
        }
        check_rules("network.allow", &self.allow)?;
        check_rules("network.deny", &self.deny)
    }
}

/// Checks a list of rules; errors name `FIELD[i].domain` and so on.
fn check_rules(field: &str, rules: &[AllowRule]) -> Result<(), SpecError> {
    if rules.len() > MAX_ALLOW_RULES {
        return Err(SpecError::new(
            field,
            format!("at most {MAX_ALLOW_RULES} rules"),
        ));
    }
    for (i, r) in rules.iter().enumerate() {
        let f = |k: &str| format!("{field}[{i}]{k}");
        match (&r.domain, &r.cidr) {
            (Some(_), Some(_)) => {
                return Err(SpecError::new(
                    f(""),
                    "give either domain or cidr, not both",
                ))
            }
            (None, None) => return Err(SpecError::new(f(""), "give a domain or a cidr")),
            (Some(d), None) => {
                check_domain_pattern(d).map_err(|p| SpecError::new(f(".domain"), p))?
            }
            (None, Some(c)) => {
                Cidr::parse(c).map_err(|p| SpecError::new(f(".cidr"), p))?;
            }
        }
        if r.ports.len() > MAX_RULE_PORTS {
            return Err(SpecError::new(
                f(".ports"),
                format!("at most {MAX_RULE_PORTS} ports"),
            ));
        }
        if let Some(j) = r.ports.iter().position(|p| *p == 0) {
            return Err(SpecError::new(
                format!("{field}[{i}].ports[{j}]"),
                "port 0 is not a port (1..65535)",
            ));
        }
    }
    Ok(())
}
