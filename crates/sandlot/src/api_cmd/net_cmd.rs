//! `sandlot net ...`: a sandbox's network policy and egress audit log, and the
//! `--network` / `--allow` flags of `sandlot create`.

use anyhow::{bail, Context};
use serde_json::{json, Value};

use super::client_cmds::Conn;

#[derive(Debug, clap::Subcommand)]
pub enum NetCmd {
    /// The egress audit log: every DNS query and TCP connection attempt.
    Log(LogArgs),
    /// Show a sandbox's network policy.
    Show(ShowArgs),
    /// Replace a running sandbox's network policy (effective immediately).
    Set(SetArgs),
}

#[derive(Debug, clap::Args)]
pub struct LogArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Sandbox id or name.
    pub id: String,
    /// Only entries after this sequence number.
    #[arg(long)]
    pub after: Option<i64>,
    /// At most this many entries (default 1000).
    #[arg(long)]
    pub limit: Option<u32>,
    /// Only denied (and failed) attempts.
    #[arg(long)]
    pub denied: bool,
    /// Print JSON lines.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    #[command(flatten)]
    pub conn: Conn,
    pub id: String,
    /// Print the policy as the API returns it (JSON).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct SetArgs {
    #[command(flatten)]
    pub conn: Conn,
    pub id: String,
    #[command(flatten)]
    pub policy: PolicyFlags,
    /// Print the new policy as the API returns it (JSON).
    #[arg(long)]
    pub json: bool,
}

/// A policy as `net show` prints it: the mode, then each allowed and each denied
/// destination as `--allow` and `--deny` take them.
fn render_policy(v: &Value) -> String {
    let mut out = format!("mode: {}\n", v["mode"].as_str().unwrap_or("?"));
    for list in ["allow", "deny"] {
        render_rules(
            &mut out,
            list,
            v[list].as_array().map(Vec::as_slice).unwrap_or_default(),
        );
    }
    out
}

fn render_rules(out: &mut String, list: &str, rules: &[Value]) {
    if !rules.is_empty() {
        out.push_str(&format!("{list}:\n"));
    }
    for r in rules {
        let dest = r["domain"].as_str().or(r["cidr"].as_str()).unwrap_or("?");
        let ports: Vec<String> = r["ports"]
            .as_array()
            .map(|p| p.iter().map(|n| n.to_string()).collect())
            .unwrap_or_default();
        if ports.is_empty() {
            out.push_str(&format!("  {dest}\n"));
        } else {
            out.push_str(&format!("  {dest}:{}\n", ports.join(",")));
        }
    }
}

fn print_policy(v: &Value, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(v)?);
    } else {
        print!("{}", render_policy(v));
    }
    Ok(())
}

/// `--network MODE` and `--allow RULE` (shared with `sandlot create`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PolicyFlags {
    /// Network mode: none (loopback only), allow (only --allow rules), open
    /// (everything but --deny rules).
    #[arg(long = "network", value_name = "MODE")]
    pub mode: Option<String>,
    /// Deny a destination (same forms as --allow) while the rest stays open.
    /// Repeatable; implies --network open, where --allow rules win over it.
    #[arg(long = "deny", value_name = "RULE")]
    pub deny: Vec<String>,
    /// Allow a destination: DOMAIN, *.DOMAIN or CIDR, optionally with TCP ports
    /// (`api.example.com:443`, `*.example.com`, `203.0.113.0/24:22,80`). Repeatable;
    /// implies --network allow.
    #[arg(long = "allow", value_name = "RULE")]
    pub allow: Vec<String>,
}

/// One `--allow` value as an allow rule.
pub fn parse_rule(s: &str) -> anyhow::Result<Value> {
    let (dest, ports) = match s.rsplit_once(':') {
        // A bare IPv6 address or prefix has colons of its own.
        Some((d, p))
            if !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit() || b == b',')
                && !d.contains(':') =>
        {
            let ports = p
                .split(',')
                .map(|x| {
                    x.parse::<u16>()
                        .ok()
                        .filter(|n| *n > 0)
                        .with_context(|| format!("--allow {s}: {x:?} is not a port"))
                })
                .collect::<anyhow::Result<Vec<u16>>>()?;
            (d, ports)
        }
        _ => (s, Vec::new()),
    };
    if dest.is_empty() {
        bail!("--allow {s:?}: give a domain or a CIDR");
    }
    let is_addr = dest.contains('/') || dest.parse::<std::net::IpAddr>().is_ok();
    let mut r = if is_addr {
        json!({ "cidr": dest })
    } else {
        json!({ "domain": dest.to_ascii_lowercase() })
    };
    if !ports.is_empty() {
        r["ports"] = json!(ports);
    }
    Ok(r)
}

impl PolicyFlags {
    /// The `network` object these flags ask for, if any.
    pub fn to_value(&self) -> anyhow::Result<Option<Value>> {
        if self.mode.is_none() && self.allow.is_empty() && self.deny.is_empty() {
            return Ok(None);
        }
        let implied = if self.deny.is_empty() {
            "allow"
        } else {
            "open"
        };
        let mode = self.mode.clone().unwrap_or_else(|| implied.into());
        if !self.deny.is_empty() && mode != "open" {
            bail!("--deny needs --network open (not {mode})");
        }
        if !self.allow.is_empty() && mode != "allow" && self.deny.is_empty() {
            bail!("--allow needs --network allow, or --deny rules it wins over (not {mode})");
        }
        let parse = |list: &[String]| {
            list.iter()
                .map(|r| parse_rule(r))
                .collect::<anyhow::Result<Vec<_>>>()
        };
        let (rules, denied) = (parse(&self.allow)?, parse(&self.deny)?);
        let mut v = json!({ "mode": mode });
        if !rules.is_empty() {
            v["allow"] = Value::Array(rules);
        }
        if !denied.is_empty() {
            v["deny"] = Value::Array(denied);
        }
        Ok(Some(v))
    }
}

pub async fn run(cmd: NetCmd) -> anyhow::Result<i32> {
    match cmd {
        NetCmd::Log(a) => {
            let c = a.conn.client()?;
            let log = c.network_log(&a.id, a.after, a.limit).await?;
            let entries: Vec<_> = log
                .entries
                .into_iter()
                .filter(|e| !a.denied || e.decision != "allowed")
                .collect();
            if a.json {
                for e in &entries {
                    println!("{}", serde_json::to_string(e)?);
                }
                return Ok(0);
            }
            let rows: Vec<Vec<String>> = entries
                .iter()
                .map(|e| {
                    let dest = match (&e.addr, e.port) {
                        (Some(a), Some(p)) => format!("{a}:{p}"),
                        (None, Some(p)) => format!(":{p}"),
                        (Some(a), None) => a.clone(),
                        (None, None) => String::new(),
                    };
                    vec![
                        e.seq.to_string(),
                        e.at.clone(),
                        e.kind.clone(),
                        e.decision.clone(),
                        e.name.clone().unwrap_or_default(),
                        dest,
                        format!(
                            "{}/{}",
                            super::render::human_bytes(e.bytes_out),
                            super::render::human_bytes(e.bytes_in)
                        ),
                        e.reason.clone(),
                    ]
                })
                .collect();
            super::render::table(
                &[
                    "SEQ", "TIME", "KIND", "DECISION", "NAME", "DEST", "OUT/IN", "REASON",
                ],
                &rows,
            );
            Ok(0)
        }
        NetCmd::Show(a) => {
            let v = a.conn.client()?.get_network(&a.id).await?;
            print_policy(&v, a.json)?;
            Ok(0)
        }
        NetCmd::Set(a) => {
            let Some(v) = a.policy.to_value()? else {
                bail!("give --network MODE and/or --allow RULE");
            };
            let v = a.conn.client()?.set_network(&a.id, &v).await?;
            print_policy(&v, a.json)?;
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_flags_parse() {
        assert_eq!(
            parse_rule("api.example.com").unwrap(),
            json!({"domain": "api.example.com"})
        );
        assert_eq!(
            parse_rule("*.Example.com:443,80").unwrap(),
            json!({"domain": "*.example.com", "ports": [443, 80]})
        );
        assert_eq!(
            parse_rule("203.0.113.0/24:22").unwrap(),
            json!({"cidr": "203.0.113.0/24", "ports": [22]})
        );
        assert_eq!(
            parse_rule("2001:db8::/32").unwrap(),
            json!({"cidr": "2001:db8::/32"})
        );
        assert!(parse_rule("a.test:0").is_err());
        assert!(parse_rule(":443").is_err());
        let f = PolicyFlags {
            mode: None,
            allow: vec!["a.test".into()],
            deny: vec![],
        };
        assert_eq!(
            f.to_value().unwrap().unwrap(),
            json!({"mode": "allow", "allow": [{"domain": "a.test"}]})
        );
        let f = PolicyFlags {
            mode: Some("open".into()),
            allow: vec!["a.test".into()],
            deny: vec![],
        };
        assert!(f.to_value().is_err());
        // --deny implies open, where --allow rules are its exceptions.
        let f = PolicyFlags {
            mode: None,
            allow: vec!["ok.denied.test".into()],
            deny: vec!["denied.test".into(), "203.0.113.0/24:22".into()],
        };
        assert_eq!(
            f.to_value().unwrap().unwrap(),
            json!({"mode": "open", "allow": [{"domain": "ok.denied.test"}],
                   "deny": [{"domain": "denied.test"}, {"cidr": "203.0.113.0/24", "ports": [22]}]})
        );
        let f = PolicyFlags {
            mode: Some("allow".into()),
            allow: vec![],
            deny: vec!["denied.test".into()],
        };
        assert!(f
            .to_value()
            .unwrap_err()
            .to_string()
            .contains("--deny needs --network open"));
        assert_eq!(PolicyFlags::default().to_value().unwrap(), None);
    }

    /// `net show` prints each rule as `--allow` takes it; `--json` the API's body.
    #[test]
    fn policies_render_as_their_flags() {
        let v = json!({"mode": "allow", "allow": [
            {"domain": "api.example.com", "ports": [443]},
            {"cidr": "203.0.113.0/24", "ports": [22, 80]},
            {"domain": "*.example.com"},
        ]});
        assert_eq!(
            render_policy(&v),
            "mode: allow\nallow:\n  api.example.com:443\n  203.0.113.0/24:22,80\n  *.example.com\n"
        );
        assert_eq!(render_policy(&json!({"mode": "none"})), "mode: none\n");
        let v = json!({"mode": "open", "deny": [{"domain": "denied.test"}]});
        assert_eq!(render_policy(&v), "mode: open\ndeny:\n  denied.test\n");
        #[derive(clap::Parser)]
        struct Net {
            #[command(subcommand)]
            cmd: NetCmd,
        }
        let shown = <Net as clap::Parser>::try_parse_from(["net", "show", "sb-1", "--json"]);
        assert!(matches!(
            shown.map(|n| n.cmd),
            Ok(NetCmd::Show(ShowArgs { json: true, .. }))
        ));
    }
}
