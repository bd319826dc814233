//! The network namespace stock (root only): loopback-only namespaces made ahead of
//! time for sandboxes with network `none`.

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use sandlot_runtime::netns::{in_network_namespace, namespace_inode, NetnsStock};

fn wait_ready(stock: &NetnsStock, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while stock.ready() < n {
        assert!(Instant::now() < deadline, "the stock never reached {n}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn netns_stock_hands_out_fresh_loopback_namespaces_once() {
    assert!(
        running_as_root(),
        "privileged test: run as root (it creates network namespaces); CI runs as root"
    );
    let host_before =
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start").unwrap();
    let stock = NetnsStock::start(2).expect("a stock of 2");
    wait_ready(&stock, 2);
    let a = stock.take().expect("a stocked namespace");
    let b = stock.take().expect("a second one");
    let own = std::fs::File::open("/proc/self/ns/net").unwrap();
    let (ia, ib, io) = (
        namespace_inode(a.as_fd()).unwrap(),
        namespace_inode(b.as_fd()).unwrap(),
        namespace_inode(own.as_fd()).unwrap(),
    );
    assert!(ia != ib && ia != io && ib != io, "{ia} {ib} {io}");

    let inside = in_network_namespace(a.as_fd(), || {
        // Only lo, and it is up: a TCP round trip over 127.0.0.1 works.
        let dev = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
        let ifaces: Vec<String> = dev
            .lines()
            .skip(2)
            .filter_map(|l| l.split(':').next().map(|s| s.trim().to_string()))
            .collect();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).is_ok();
        let ports =
            std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start").unwrap();
        (ifaces, c, ports.trim().to_string())
    })
    .unwrap();
    assert_eq!(inside.0, ["lo"], "only loopback");
    assert!(inside.1, "lo is up");
    assert_eq!(inside.2, "0", "ports below 1024 need no capability");
    // The host's own setting is untouched.
    let host = std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start").unwrap();
    assert_eq!(host, host_before);

    // Taking refills; a namespace is never handed out twice.
    wait_ready(&stock, 2);
    let c = stock.take().unwrap();
    let ic = namespace_inode(c.as_fd()).unwrap();
    assert!(ic != ia && ic != ib);
    drop(stock);
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next().map(|u| u == "0"))
        .unwrap_or(false)
}
