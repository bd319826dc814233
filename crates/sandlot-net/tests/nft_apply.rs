//! Privileged: the planned table applies with the real `nft` in a private network
//! namespace of this test (never the host's), slot elements come and go, and the
//! delete leaves nothing.

use std::net::Ipv4Addr;

use sandlot_net::nft::{Nft, TableSpec};

fn in_private_netns<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    assert!(
        rustix::process::geteuid().is_root(),
        "privileged test: run as root (creates a network namespace)"
    );
    sandlot_runtime::netns::in_new_network_namespace(f).expect("a private network namespace")
}

#[test]
fn table_applies_changes_and_deletes_in_a_private_netns() {
    in_private_netns(|| {
        let nft = Nft::default();
        if std::process::Command::new("nft")
            .arg("--version")
            .output()
            .is_err()
        {
            panic!("the nft binary is missing: apt-get install nftables (scripts/setup.sh)");
        }
        let t = TableSpec {
            table: "sandlot_sntest01".into(),
            if_prefix: "sntest01".into(),
            proxy_port: 40001,
            dns_port: 40002,
        };
        let a = ("sntest01000001".to_string(), Ipv4Addr::new(100, 96, 0, 2));
        nft.apply(&t.create(std::slice::from_ref(&a)))
            .expect("create table");
        // Re-creating replaces it (idempotent), with another slot set.
        nft.apply(&t.create(&[])).expect("re-create table");
        nft.apply(&t.add_slots(std::slice::from_ref(&a)))
            .expect("add slot");
        let listing = std::process::Command::new("nft")
            .args(["list", "table", "inet", "sandlot_sntest01"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&listing.stdout);
        assert!(text.contains("sntest01000001"), "{text}");
        assert!(text.contains("redirect to :40001"), "{text}");
        assert!(text.contains("redirect to :40002"), "{text}");
        nft.apply(&t.delete_slots(&[a])).expect("delete slot");
        assert_eq!(nft.tables().unwrap(), vec!["sandlot_sntest01".to_string()]);
        nft.apply(&t.delete()).expect("delete table");
        assert!(nft.tables().unwrap().is_empty());
    });
}
