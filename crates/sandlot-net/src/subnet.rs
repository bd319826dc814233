//! Which IPv4 subnet a daemon carves its slots' /30s from, so that two daemons on
//! one host never hand out the same addresses (their routes would collide, and one
//! daemon's sandboxes would lose their egress to the other's veths).
//!
//! `network.subnet = "auto"` (the default) takes the first free /16 of
//! [`AUTO_RANGE`]; an explicit subnet is used as given. Either way the daemon holds
//! an exclusive `flock` on `/run/lock/sandlot/subnet-NETNS-A.B.C.D-N.lock` for as long as
//! it runs (and removes the file when it stops), and a subnet that the host already
//! routes to an interface that is not one of this daemon's slots is not used.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use sandlot_proto::spec::Cidr;
use sandlot_runtime::host_lock::HostLock;

use crate::NetError;

/// The `network.subnet` value that lets the daemon choose.
pub const AUTO: &str = "auto";

/// The range automatic subnets come from: 32 /16s, `100.96.0.0/16` first. No
/// sandbox may reach into it (see `policy::Ceiling`), whichever daemon owns a part.
pub const AUTO_RANGE: &str = "100.96.0.0/11";

/// Where the subnet locks live: beside the daemons' id-prefix locks.
pub const LOCK_DIR: &str = "/run/lock/sandlot";

/// A subnet this daemon holds (the lock goes with the value).
#[derive(Debug)]
pub struct HeldSubnet {
    pub cidr: Cidr,
    /// Held for its `Drop`.
    #[cfg_attr(not(test), allow(dead_code))]
    lock: HostLock,
}

/// The automatic candidates, in order.
fn auto_candidates() -> impl Iterator<Item = Cidr> {
    (96u8..128).map(|b| Cidr {
        addr: IpAddr::V4(Ipv4Addr::new(100, b, 0, 0)),
        len: 16,
    })
}

/// A route of the host's main table (`/proc/net/route`) that lies inside `subnet`
/// on an interface whose name does not start with `if_prefix` (this daemon's slots):
/// (interface, route). Broader routes (a default route, a VPN's whole `100.64/10`)
/// do not count: the slots' own /30s are more specific and win.
pub fn foreign_route_in(
    subnet: &Cidr,
    if_prefix: &str,
    proc_net_route: &str,
) -> Option<(String, Cidr)> {
    for line in proc_net_route.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 || f[0].starts_with(if_prefix) {
            continue;
        }
        let hex = |s: &str| u32::from_str_radix(s, 16).ok();
        let (Some(dst), Some(mask)) = (hex(f[1]), hex(f[7])) else {
            continue;
        };
        // The kernel prints the network-order word as a native integer.
        let route = Cidr {
            addr: IpAddr::V4(Ipv4Addr::from(dst.to_ne_bytes())),
            len: mask.count_ones() as u8,
        };
        if route.len >= subnet.len && subnet.contains(route.addr) {
            return Some((f[0].to_string(), route));
        }
    }
    None
}

/// One lock per subnet and network namespace: daemons in different namespaces
/// (the tests' simulated hosts) have routing tables of their own and do not clash.
fn lock_path(dir: &Path, c: &Cidr) -> std::path::PathBuf {
    use std::os::unix::fs::MetadataExt;
    let netns = std::fs::metadata("/proc/thread-self/ns/net").map_or(0, |m| m.ino());
    dir.join(format!("subnet-{netns}-{}-{}.lock", c.addr, c.len))
}

/// Takes `c`'s lock without waiting: `Ok(Err(pid))` when another process holds it.
fn try_lock(dir: &Path, c: &Cidr) -> Result<Result<HostLock, Option<u32>>, NetError> {
    let p = lock_path(dir, c);
    HostLock::try_take(&p).map_err(|source| NetError::Io {
        what: format!("lock {}", p.display()),
        source,
    })
}

/// Resolves `network.subnet` (`configured`) for a daemon whose slot interfaces
/// start with `if_prefix`. `survivor` is an address of a slot kept from before a
/// restart: an automatic choice stays where that slot is.
pub fn choose(
    configured: &str,
    if_prefix: &str,
    survivor: Option<Ipv4Addr>,
    routes: &str,
    dir: &Path,
) -> Result<HeldSubnet, NetError> {
    let fixed = if configured == AUTO {
        match survivor {
            Some(ip) => Some(
                auto_candidates()
                    .find(|c| c.contains(IpAddr::V4(ip)))
                    .ok_or_else(|| {
                        NetError::Config(format!(
                            "network.subnet \"auto\": the slot of a running sandbox ({ip}) is outside {AUTO_RANGE}; set network.subnet to the subnet it came from"
                        ))
                    })?,
            ),
            None => None,
        }
    } else {
        Some(
            Cidr::parse(configured)
                .map_err(|e| NetError::Config(format!("network.subnet: {e}")))?,
        )
    };
    if let Some(c) = fixed {
        if let Some((iface, route)) = foreign_route_in(&c, if_prefix, routes) {
            return Err(NetError::Config(format!(
                "network.subnet {c}: the host already routes {route} to {iface}, which is not one of this daemon's slots; give this daemon a free subnet (network.subnet, or \"auto\")"
            )));
        }
        return match try_lock(dir, &c)? {
            Ok(lock) => Ok(HeldSubnet { cidr: c, lock }),
            Err(pid) => Err(NetError::Config(format!(
                "network.subnet {c}: another sandlot daemon{} uses it on this host; give each daemon its own subnet (network.subnet, or \"auto\")",
                pid.map_or(String::new(), |p| format!(" (pid {p})"))
            ))),
        };
    }
    for c in auto_candidates() {
        if foreign_route_in(&c, if_prefix, routes).is_some() {
            continue;
        }
        if let Ok(lock) = try_lock(dir, &c)? {
            return Ok(HeldSubnet { cidr: c, lock });
        }
    }
    Err(NetError::Config(format!(
        "network.subnet \"auto\": every /16 of {AUTO_RANGE} is routed or held by another daemon on this host; set network.subnet"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/proc/net/route` as a little-endian host prints it.
    const ROUTES: &str =
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
        eth0\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
        tailscale0\t00004064\t00000000\t0001\t0\t0\t0\t0000C0FF\t0\t0\t0\n\
        sn15aa506d3c00\t00006064\t00000000\t0001\t0\t0\t0\tFCFFFFFF\t0\t0\t0\n\
        snfb4303737f00\t00006164\t00000000\t0001\t0\t0\t0\tFCFFFFFF\t0\t0\t0\n";

    fn cidr(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    #[test]
    fn foreign_routes_are_the_more_specific_ones_on_other_interfaces() {
        if cfg!(target_endian = "big") {
            return;
        }
        // Our own slot's /30 in 100.96/16 does not count; the default route and
        // a VPN's 100.64/10 are broader than the subnet and do not either.
        assert_eq!(
            foreign_route_in(&cidr("100.96.0.0/16"), "sn15aa506d3c", ROUTES),
            None
        );
        // Another daemon's slot in 100.97/16 does.
        assert_eq!(
            foreign_route_in(&cidr("100.97.0.0/16"), "sn15aa506d3c", ROUTES),
            Some(("snfb4303737f00".into(), cidr("100.97.0.0/30")))
        );
        // Seen from that other daemon, ours is foreign.
        assert_eq!(
            foreign_route_in(&cidr("100.96.0.0/16"), "snfb4303737f", ROUTES),
            Some(("sn15aa506d3c00".into(), cidr("100.96.0.0/30")))
        );
    }

    #[test]
    fn two_daemons_get_different_slot_subnets() {
        let dir = std::env::temp_dir().join(format!("sandlot-subnet-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let routes =
            "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n";
        let a = choose(AUTO, "sna", None, routes, &dir).unwrap();
        assert_eq!(a.cidr, cidr("100.96.0.0/16"));
        let b = choose(AUTO, "snb", None, routes, &dir).unwrap();
        assert_eq!(b.cidr, cidr("100.97.0.0/16"));
        // An explicit subnet another daemon holds is refused, naming the holder.
        let e = choose("100.96.0.0/16", "snc", None, routes, &dir)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("(pid {})", std::process::id())), "{e}");
        assert!(e.contains("network.subnet 100.96.0.0/16"), "{e}");
        // A restarted daemon stays where its surviving slots are, unless that is taken.
        let e = choose(
            AUTO,
            "sna",
            Some(Ipv4Addr::new(100, 96, 0, 2)),
            routes,
            &dir,
        )
        .unwrap_err();
        assert!(e.to_string().contains("100.96.0.0/16"), "{e}");
        drop(a);
        let again = choose(
            AUTO,
            "sna",
            Some(Ipv4Addr::new(100, 96, 0, 2)),
            routes,
            &dir,
        )
        .unwrap();
        assert_eq!(again.cidr, cidr("100.96.0.0/16"));
        let e = choose(AUTO, "sna", Some(Ipv4Addr::new(10, 0, 0, 2)), routes, &dir).unwrap_err();
        assert!(e.to_string().contains("outside 100.96.0.0/11"), "{e}");
        let b_lock = b.lock.path().to_path_buf();
        assert!(b_lock.exists());
        drop((b, again));
        // A stopped daemon's lock file goes with it.
        assert!(!b_lock.exists(), "{}", b_lock.display());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn automatic_subnets_skip_routed_ones() {
        if cfg!(target_endian = "big") {
            return;
        }
        let dir =
            std::env::temp_dir().join(format!("sandlot-subnet-route-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // 100.96/16 and 100.97/16 have other daemons' slots (not locked here: say,
        // a daemon killed with SIGKILL): the next free one is 100.98/16.
        let c = choose(AUTO, "sn0000000000", None, ROUTES, &dir).unwrap();
        assert_eq!(c.cidr, cidr("100.98.0.0/16"));
        let e = choose("100.97.0.0/16", "sn0000000000", None, ROUTES, &dir).unwrap_err();
        assert!(
            e.to_string()
                .contains("routes 100.97.0.0/30 to snfb4303737f00"),
            "{e}"
        );
        drop(c);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
