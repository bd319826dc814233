//! Privileged: a network slot built over rtnetlink (no `ip` processes) is wired the
//! way sandboxes need it, and releasing it leaves nothing. The host side of the slot
//! lives in a private network namespace of this test, never the host's.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::process::Command;
use std::time::{Duration, Instant};

use sandlot_net::nft::{Nft, TableSpec};
use sandlot_net::slots::{open_netns, AddressPlan, SlotPool, NETNS_DIR};
use sandlot_proto::spec::Cidr;

fn in_private_netns<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    assert!(
        rustix::process::geteuid().is_root(),
        "privileged test: run as root (creates network namespaces)"
    );
    sandlot_runtime::netns::in_new_network_namespace(f).expect("a private network namespace")
}

/// Runs `f` on a thread inside the named slot namespace.
fn in_slot<T: Send>(name: &str, f: impl FnOnce() -> T + Send) -> T {
    let ns = open_netns(name).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            rustix::thread::move_into_link_name_space(
                ns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .unwrap();
            f()
        })
        .join()
        .unwrap()
    })
}

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Removes the slot namespaces of a test's prefix even when an assertion fails
/// half-way. Each test has its own prefix (the tests run at once).
struct Cleanup(&'static str);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let (ns, _) = sandlot_net::slots::existing(self.0);
        for n in ns {
            let _ = sandlot_net::slots::delete_netns(&n);
        }
    }
}

/// A test's nft table (named after `prefix`, its ports `port` and `port + 1`) and a
/// slot pool over `subnet` with target 0: no builder thread, so claims build on the
/// calling thread, in the private namespace that plays the host.
fn table_and_pool(prefix: &str, subnet: &str, port: u16) -> (Nft, TableSpec, SlotPool) {
    let nft = Nft::default();
    let t = TableSpec {
        table: format!("sandlot_{prefix}"),
        if_prefix: prefix.into(),
        proxy_port: port,
        dns_port: port + 1,
    };
    nft.apply(&t.create(&[])).expect("create the nft table");
    let plan = AddressPlan::new(Cidr::parse(subnet).unwrap()).unwrap();
    let pool = SlotPool::start(prefix, plan, 0, t.clone(), &[]);
    (nft, t, pool)
}

#[test]
fn slot_is_wired_over_netlink_and_release_leaves_nothing() {
    let _cleanup = Cleanup("snslt01");
    in_private_netns(|| {
        let (nft, t, pool) = table_and_pool("snslt01", "100.97.0.0/24", 40011);
        let slot = pool.claim().expect("build a slot");
        assert!(std::path::Path::new(&format!("{NETNS_DIR}/{}", slot.name)).exists());

        let host = ip(&["-4", "-o", "addr", "show", "dev", &slot.name]);
        assert!(
            host.contains(&format!("inet {}/30", slot.host_ip)),
            "{host}"
        );
        let link = ip(&["-o", "link", "show", "dev", &slot.name]);
        assert!(link.contains(",UP"), "host end is up: {link}");
        let inside = ip(&["-n", &slot.name, "-4", "-o", "addr", "show", "dev", "eth0"]);
        assert!(
            inside.contains(&format!("inet {}/30", slot.sandbox_ip)),
            "{inside}"
        );
        let lo = ip(&["-n", &slot.name, "-o", "link", "show", "dev", "lo"]);
        assert!(lo.contains(",UP"), "loopback is up: {lo}");
        let route = ip(&["-n", &slot.name, "-4", "route", "show", "default"]);
        assert!(
            route.contains(&format!("default via {} dev eth0", slot.host_ip)),
            "{route}"
        );
        let sysctl = in_slot(&slot.name, || {
            std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start").unwrap()
        });
        assert_eq!(sysctl.trim(), "0");
        // IPv6 is off on both ends of the veth: no addresses, no routes (the host
        // ends' IPv6 routes were a list walked once per slot).
        if std::path::Path::new("/proc/sys/net/ipv6").exists() {
            let read = |p: &str| std::fs::read_to_string(p).unwrap().trim().to_string();
            let host_conf = format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", slot.name);
            assert_eq!(read(&host_conf), "1", "{host_conf}");
            let host6 = ip(&["-6", "-o", "addr", "show", "dev", &slot.name]);
            assert_eq!(host6.trim(), "", "host end has IPv6 addresses");
            let routes6 = ip(&["-6", "route", "show", "table", "all", "dev", &slot.name]);
            assert_eq!(routes6.trim(), "", "host end has IPv6 routes");
            let inside6 = in_slot(&slot.name, || {
                [
                    "all/disable_ipv6",
                    "default/disable_ipv6",
                    "eth0/disable_ipv6",
                    "lo/disable_ipv6",
                ]
                .map(|k| read(&format!("/proc/sys/net/ipv6/conf/{k}")))
            });
            assert_eq!(inside6, ["1", "1", "1", "1"]);
            let addrs6 = ip(&["-n", &slot.name, "-6", "-o", "addr"]);
            assert_eq!(addrs6.trim(), "", "the slot has IPv6 addresses");
        } else {
            eprintln!("SKIPPED the IPv6 checks: this kernel has no IPv6");
        }

        // Traffic flows: a connection from inside the slot to any address goes through
        // the veth and the default route, and the table redirects it to the egress
        // proxy's port on the host end (here a plain listener).
        let l = TcpListener::bind(SocketAddr::from((slot.host_ip, t.proxy_port))).unwrap();
        let port = 443;
        let server = std::thread::spawn(move || {
            let (mut c, peer) = l.accept().unwrap();
            c.write_all(b"pong").unwrap();
            peer
        });
        let got = in_slot(&slot.name, || {
            let mut c = TcpStream::connect_timeout(
                &SocketAddr::from((slot.host_ip, port)),
                Duration::from_secs(5),
            )
            .expect("connect from inside the slot");
            let mut b = String::new();
            c.read_to_string(&mut b).unwrap();
            b
        });
        assert_eq!(got, "pong");
        let peer = server.join().unwrap();
        assert_eq!(peer.ip(), std::net::IpAddr::V4(slot.sandbox_ip));

        // The nft set holds the slot while it lives.
        let listing = Command::new("nft")
            .args(["list", "table", "inet", "sandlot_snslt01"])
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&listing.stdout).contains(&slot.name));

        let name = slot.name.clone();
        pool.release(slot);
        pool.stop(Duration::from_secs(10));
        assert!(!std::path::Path::new(&format!("{NETNS_DIR}/{name}")).exists());
        // The kernel destroys the namespace, and the veth with it, asynchronously.
        let deadline = Instant::now() + Duration::from_secs(10);
        let link_exists = || {
            Command::new("ip")
                .args(["link", "show", "dev", &name])
                .output()
                .unwrap()
                .status
                .success()
        };
        while link_exists() {
            assert!(Instant::now() < deadline, "veth {name} outlived its slot");
            std::thread::sleep(Duration::from_millis(20));
        }
        let listing = Command::new("nft")
            .args(["list", "table", "inet", "sandlot_snslt01"])
            .output()
            .unwrap();
        assert!(!String::from_utf8_lossy(&listing.stdout).contains(&name));
        nft.apply(&t.delete()).expect("delete the nft table");
    })
}

/// Inodes of the `NETLINK_NETFILTER` sockets this process holds, in the calling
/// thread's network namespace.
fn netfilter_sockets_held() -> Vec<u64> {
    let held: std::collections::BTreeSet<u64> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect();
    std::fs::read_to_string("/proc/thread-self/net/netlink")
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let inode: u64 = f.last()?.parse().ok()?;
            (f.get(1) == Some(&"12") && held.contains(&inode)).then_some(inode)
        })
        .collect()
}

/// Closing a netfilter netlink socket makes the kernel wait for an RCU
/// grace period under the nf_tables commit mutex, which every veth creation takes;
/// a socket per set update stalled slot builds and teardowns (allow creates p99
/// 25-30 ms). The pool keeps one socket for all of its set updates.
#[test]
fn slot_builds_and_teardowns_share_one_kept_netfilter_socket() {
    let _cleanup = Cleanup("snslt02");
    in_private_netns(|| {
        let (nft, t, pool) = table_and_pool("snslt02", "100.97.1.0/24", 40013);
        assert_eq!(netfilter_sockets_held(), Vec::<u64>::new());
        let first = pool.claim().expect("build a slot");
        let kept = netfilter_sockets_held();
        assert_eq!(kept.len(), 1, "one netfilter socket stays open: {kept:?}");
        let mut names = vec![first.name.clone()];
        pool.release(first);
        for _ in 0..3 {
            let s = pool.claim().expect("build a slot");
            names.push(s.name.clone());
            pool.release(s);
        }
        // The teardown worker has deleted the released slots' set elements.
        let deadline = Instant::now() + Duration::from_secs(10);
        let listed = || {
            let out = Command::new("nft")
                .args(["list", "set", "inet", "sandlot_snslt02", "slots"])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        while names.iter().any(|n| listed().contains(n.as_str())) {
            assert!(
                Instant::now() < deadline,
                "set elements outlived their slots"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            netfilter_sockets_held(),
            kept,
            "builds and teardowns used the kept socket"
        );
        pool.stop(Duration::from_secs(10));
        nft.apply(&t.delete()).expect("delete the nft table");
    })
}

/// With every address of a small subnet in use, a claim right after a release
/// waits for that slot's teardown to give its address back instead of failing.
#[test]
fn a_claim_at_capacity_gets_the_address_a_release_is_giving_back() {
    let _cleanup = Cleanup("snslt03");
    in_private_netns(|| {
        // A /28: four slots.
        let (nft, t, pool) = table_and_pool("snslt03", "100.97.2.0/28", 40015);
        let mut held: Vec<_> = (0..4)
            .map(|_| pool.claim().expect("build a slot"))
            .collect();
        for round in 0..5 {
            let gone = held.remove(0);
            let index = gone.index;
            pool.release(gone);
            let s = pool.claim().unwrap_or_else(|e| {
                panic!("round {round}: claim after a release at capacity: {e}")
            });
            assert_eq!(s.index, index, "the only free address is the released one");
            held.push(s);
        }
        // Nothing is being torn down or built: a claim at capacity fails at once.
        let t0 = Instant::now();
        assert!(matches!(
            pool.claim(),
            Err(sandlot_net::NetError::Exhausted)
        ));
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        for s in held {
            pool.release(s);
        }
        pool.stop(Duration::from_secs(10));
        nft.apply(&t.delete()).expect("delete the nft table");
    })
}
