//! The nftables table of one daemon, planned as data (`nft -j` JSON commands) and
//! applied in one place ([`Nft::apply`]). Everything lives in the daemon's own table
//! `inet sandlot_<prefix>`; other tables are never read or touched.
//!
//! What the table does, for packets arriving on the host side of a slot's veth
//! (interface names `<prefix>*`):
//!
//! * `pre` (filter, priority raw): IPv6 dropped; IPv4 whose source is not the slot's
//!   own address dropped (the `slots` set holds `interface . address` pairs).
//! * `nat` (prerouting, dstnat): DNS (UDP and TCP port 53, to any address) redirected
//!   to the daemon's resolver; every other TCP connection redirected to the daemon's
//!   transparent proxy.
//! * `input`: from slots, only the resolver and proxy ports are accepted; those two
//!   ports are dropped for everybody else.
//! * `forward`: nothing is forwarded from or to a slot (UDP, ICMP and the rest die
//!   here).

use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use crate::NetError;

/// The daemon's table: its name and what its rules point at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSpec {
    /// `sandlot_<prefix>`.
    pub table: String,
    /// Interface name prefix of the slots' host-side veths.
    pub if_prefix: String,
    pub proxy_port: u16,
    pub dns_port: u16,
}

const FAMILY: &str = "inet";
/// The set of `(host veth . sandbox address)` pairs allowed to send.
pub const SLOT_SET: &str = "slots";

fn m(op: &str, left: Value, right: Value) -> Value {
    json!({"match": {"op": op, "left": left, "right": right}})
}

fn meta(key: &str) -> Value {
    json!({"meta": {"key": key}})
}

fn dport(proto: &str) -> Value {
    json!({"payload": {"protocol": proto, "field": "dport"}})
}

impl TableSpec {
    fn rule(&self, chain: &str, expr: Vec<Value>) -> Value {
        json!({"add": {"rule": {"family": FAMILY, "table": self.table, "chain": chain, "expr": expr}}})
    }

    fn chain(&self, name: &str, ty: &str, hook: &str, prio: i32) -> Value {
        json!({"add": {"chain": {"family": FAMILY, "table": self.table, "name": name,
            "type": ty, "hook": hook, "prio": prio, "policy": "accept"}}})
    }

    fn slot_iif(&self) -> Value {
        m("==", meta("iifname"), json!(format!("{}*", self.if_prefix)))
    }

    /// Replaces the table atomically with a fresh one holding `slots`.
    pub fn create(&self, slots: &[(String, Ipv4Addr)]) -> Vec<Value> {
        let t = json!({"family": FAMILY, "name": self.table});
        let mut c = vec![
            // Add-then-delete makes the delete succeed whether or not it existed.
            json!({"add": {"table": t}}),
            json!({"delete": {"table": t}}),
            json!({"add": {"table": t}}),
            json!({"add": {"set": {"family": FAMILY, "table": self.table, "name": SLOT_SET,
                "type": ["ifname", "ipv4_addr"]}}}),
            self.chain("pre", "filter", "prerouting", -300),
            self.chain("nat", "nat", "prerouting", -100),
            self.chain("input", "filter", "input", 0),
            self.chain("forward", "filter", "forward", 0),
        ];
        let drop = json!({"drop": null});
        let accept = json!({"accept": null});
        c.push(self.rule(
            "pre",
            vec![
                self.slot_iif(),
                m("==", meta("nfproto"), json!("ipv6")),
                drop.clone(),
            ],
        ));
        c.push(self.rule(
            "pre",
            vec![
                self.slot_iif(),
                m(
                    "!=",
                    json!({"concat": [meta("iifname"), {"payload": {"protocol": "ip", "field": "saddr"}}]}),
                    json!(format!("@{SLOT_SET}")),
                ),
                drop.clone(),
            ],
        ));
        for proto in ["udp", "tcp"] {
            c.push(self.rule(
                "nat",
                vec![
                    self.slot_iif(),
                    m("==", dport(proto), json!(53)),
                    json!({"redirect": {"port": self.dns_port}}),
                ],
            ));
        }
        c.push(self.rule(
            "nat",
            vec![
                self.slot_iif(),
                m("==", meta("l4proto"), json!("tcp")),
                json!({"redirect": {"port": self.proxy_port}}),
            ],
        ));
        for (proto, port) in [
            ("tcp", self.proxy_port),
            ("udp", self.dns_port),
            ("tcp", self.dns_port),
        ] {
            c.push(self.rule(
                "input",
                vec![
                    self.slot_iif(),
                    m("==", dport(proto), json!(port)),
                    accept.clone(),
                ],
            ));
        }
        c.push(self.rule("input", vec![self.slot_iif(), drop.clone()]));
        for (proto, port) in [
            ("tcp", self.proxy_port),
            ("udp", self.dns_port),
            ("tcp", self.dns_port),
        ] {
            c.push(self.rule(
                "input",
                vec![m("==", dport(proto), json!(port)), drop.clone()],
            ));
        }
        c.push(self.rule("forward", vec![self.slot_iif(), drop.clone()]));
        c.push(self.rule(
            "forward",
            vec![
                m("==", meta("oifname"), json!(format!("{}*", self.if_prefix))),
                drop,
            ],
        ));
        if !slots.is_empty() {
            c.extend(self.add_slots(slots));
        }
        c
    }

    fn elems(slots: &[(String, Ipv4Addr)]) -> Value {
        Value::Array(
            slots
                .iter()
                .map(|(i, a)| json!({"concat": [i, a.to_string()]}))
                .collect(),
        )
    }

    /// Lets a slot's veth send from its address.
    pub fn add_slots(&self, slots: &[(String, Ipv4Addr)]) -> Vec<Value> {
        vec![
            json!({"add": {"element": {"family": FAMILY, "table": self.table,
            "name": SLOT_SET, "elem": TableSpec::elems(slots)}}}),
        ]
    }

    pub fn delete_slots(&self, slots: &[(String, Ipv4Addr)]) -> Vec<Value> {
        vec![
            json!({"delete": {"element": {"family": FAMILY, "table": self.table,
            "name": SLOT_SET, "elem": TableSpec::elems(slots)}}}),
        ]
    }

    /// Removes the table (and with it every rule of this daemon).
    pub fn delete(&self) -> Vec<Value> {
        let t = json!({"family": FAMILY, "name": self.table});
        vec![
            json!({"add": {"table": t}}),
            json!({"delete": {"table": t}}),
        ]
    }
}

/// The `nft` binary.
#[derive(Debug, Clone)]
pub struct Nft {
    pub exe: String,
}

impl Default for Nft {
    fn default() -> Self {
        Nft { exe: "nft".into() }
    }
}

impl Nft {
    /// Applies commands as one transaction (`nft -j -f -`): all or nothing.
    pub fn apply(&self, cmds: &[Value]) -> Result<(), NetError> {
        let doc = json!({"nftables": cmds}).to_string();
        let what = || format!("{} -j -f -", self.exe);
        let mut child = Command::new(&self.exe)
            .args(["-j", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| NetError::Command {
                cmd: what(),
                message: format!("{e} (install the nftables package)"),
            })?;
        if let Some(mut i) = child.stdin.take() {
            let _ = i.write_all(doc.as_bytes());
        }
        let out = child.wait_with_output().map_err(|e| NetError::Command {
            cmd: what(),
            message: e.to_string(),
        })?;
        if !out.status.success() {
            return Err(NetError::Command {
                cmd: what(),
                message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(())
    }

    /// Names of the `inet` tables in this network namespace.
    pub fn tables(&self) -> Result<Vec<String>, NetError> {
        let out = Command::new(&self.exe)
            .args(["-j", "list", "tables", "inet"])
            .output()
            .map_err(|e| NetError::Command {
                cmd: format!("{} -j list tables", self.exe),
                message: e.to_string(),
            })?;
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        Ok(v["nftables"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e["table"]["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TableSpec {
        TableSpec {
            table: "sandlot_snab12cd".into(),
            if_prefix: "snab12cd".into(),
            proxy_port: 40001,
            dns_port: 40002,
        }
    }

    #[test]
    fn the_table_is_replaced_atomically_and_scoped_to_the_prefix() {
        let c = spec().create(&[("snab12cd000001".into(), Ipv4Addr::new(100, 96, 0, 2))]);
        // add, delete, add: one transaction that works whether or not it existed.
        assert!(c[0]["add"]["table"].is_object());
        assert!(c[1]["delete"]["table"].is_object());
        let text = serde_json::to_string(&c).unwrap();
        // Every rule is in our table and every match on interfaces uses our prefix.
        for cmd in &c {
            if let Some(r) = cmd["add"]["rule"].as_object() {
                assert_eq!(r["table"], "sandlot_snab12cd");
            }
        }
        assert!(!text.contains("\"flush\""), "never flushes a ruleset");
        assert!(text.contains("\"snab12cd*\""));
        assert!(text.contains("{\"redirect\":{\"port\":40001}}"));
        assert!(text.contains("{\"redirect\":{\"port\":40002}}"));
        assert!(text.contains("\"ipv6\""));
        let last = c.last().unwrap();
        assert_eq!(
            last["add"]["element"]["elem"][0]["concat"],
            json!(["snab12cd000001", "100.96.0.2"])
        );
    }

    #[test]
    fn slot_changes_touch_only_the_set() {
        let s = spec();
        let one = [("snab12cd000002".to_string(), Ipv4Addr::new(100, 96, 0, 6))];
        let add = s.add_slots(&one);
        let del = s.delete_slots(&one);
        assert_eq!(add.len(), 1);
        assert_eq!(add[0]["add"]["element"]["name"], "slots");
        assert_eq!(del[0]["delete"]["element"]["name"], "slots");
        assert_eq!(s.delete()[1]["delete"]["table"]["name"], "sandlot_snab12cd");
    }
}
