//! The slot set's elements over nf_tables netlink: adding or removing a slot's
//! `(interface . address)` element is one batch on a `NETLINK_NETFILTER` socket
//! instead of an `nft` process (which was the largest single cost left in building a
//! slot). The table itself, created once at start, stays with `nft` (see `nft.rs`).

use std::net::Ipv4Addr;

use crate::rtnl::{
    Body, NetlinkError, Socket, NLMSG_HDRLEN, NLM_F_ACK, NLM_F_CREATE, NLM_F_REQUEST,
};

// linux/netfilter/nfnetlink.h, linux/netfilter/nf_tables.h.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_DATA_VALUE: u16 = 1;
const NLA_F_NESTED: u16 = 1 << 15;
const NFPROTO_INET: u8 = 1;
const AF_UNSPEC: u8 = 0;
/// `IFNAMSIZ`: an `ifname` key component is the name, NUL-padded to 16 bytes.
const IFNAMSIZ: usize = 16;

/// The key of a slot's element in a set of type `ifname . ipv4_addr`: each
/// component padded to 4 bytes, the address in network order.
pub fn slot_key(ifname: &str, addr: Ipv4Addr) -> Result<[u8; IFNAMSIZ + 4], NetlinkError> {
    let name = ifname.as_bytes();
    if name.is_empty() || name.len() >= IFNAMSIZ || name.contains(&0) {
        return Err(NetlinkError::Malformed {
            op: format!("set element key for interface {ifname:?}"),
        });
    }
    let mut k = [0u8; IFNAMSIZ + 4];
    k[..name.len()].copy_from_slice(name);
    k[IFNAMSIZ..].copy_from_slice(&addr.octets());
    Ok(k)
}

/// One nfnetlink message: header, `nfgenmsg` (family, version 0, resource id in
/// network order), attributes.
fn nf_message(kind: u16, flags: u16, seq: u32, family: u8, res_id: u16, attrs: &Body) -> Vec<u8> {
    let len = NLMSG_HDRLEN + 4 + attrs.0.len();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.push(family);
    m.push(0);
    m.extend_from_slice(&res_id.to_be_bytes());
    m.extend_from_slice(&attrs.0);
    m
}

/// The batch that adds (`add`) or deletes elements `keys` of set `set` in inet table
/// `table`. All three messages carry `seq`, so that an error about any of them (the
/// markers are not acknowledged on success) answers the request.
fn set_elems_batch(add: bool, seq: u32, table: &str, set: &str, keys: &[[u8; 20]]) -> Vec<u8> {
    let mut b = Body::default();
    b.attr_str(NFTA_SET_ELEM_LIST_TABLE, table)
        .attr_str(NFTA_SET_ELEM_LIST_SET, set)
        .nest(NFTA_SET_ELEM_LIST_ELEMENTS | NLA_F_NESTED, |els| {
            for k in keys {
                els.nest(NFTA_LIST_ELEM | NLA_F_NESTED, |el| {
                    el.nest(NFTA_SET_ELEM_KEY | NLA_F_NESTED, |key| {
                        key.attr(NFTA_DATA_VALUE, k);
                    });
                });
            }
        });
    let (kind, flags) = if add {
        // CREATE without EXCL: adding an element that exists is not an error.
        (NFT_MSG_NEWSETELEM, NLM_F_CREATE | NLM_F_ACK)
    } else {
        (NFT_MSG_DELSETELEM, NLM_F_ACK)
    };
    let none = Body::default();
    let mut m = nf_message(
        NFNL_MSG_BATCH_BEGIN,
        0,
        seq,
        AF_UNSPEC,
        NFNL_SUBSYS_NFTABLES,
        &none,
    );
    m.extend(nf_message(
        (NFNL_SUBSYS_NFTABLES << 8) | kind,
        flags,
        seq,
        NFPROTO_INET,
        0,
        &b,
    ));
    m.extend(nf_message(
        NFNL_MSG_BATCH_END,
        0,
        seq,
        AF_UNSPEC,
        NFNL_SUBSYS_NFTABLES,
        &none,
    ));
    m
}

/// A `NETLINK_NETFILTER` socket for one set of one inet table.
pub struct SetElements {
    sock: Socket,
    table: String,
    set: String,
}

impl SetElements {
    pub fn open(table: &str, set: &str) -> Result<SetElements, NetlinkError> {
        Ok(SetElements {
            sock: Socket::open(Some(rustix::net::netlink::NETFILTER))?,
            table: table.to_string(),
            set: set.to_string(),
        })
    }

    /// Adds the `(interface . address)` elements, all or none (one transaction).
    pub fn add(&mut self, elems: &[(String, Ipv4Addr)]) -> Result<(), NetlinkError> {
        self.change(true, elems)
    }

    /// Removes the elements, all or none: one missing element fails them all.
    pub fn delete(&mut self, elems: &[(String, Ipv4Addr)]) -> Result<(), NetlinkError> {
        self.change(false, elems)
    }

    fn change(&mut self, add: bool, elems: &[(String, Ipv4Addr)]) -> Result<(), NetlinkError> {
        if elems.is_empty() {
            return Ok(());
        }
        let keys = elems
            .iter()
            .map(|(i, a)| slot_key(i, *a))
            .collect::<Result<Vec<_>, _>>()?;
        let seq = self.sock.next_seq();
        let op = format!(
            "{} {} element(s) of set {} in table inet {}",
            if add { "add" } else { "delete" },
            elems.len(),
            self.set,
            self.table
        );
        let msg = set_elems_batch(add, seq, &self.table, &self.set, &keys);
        self.sock.transact(&op, &msg, seq).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u16_at(b: &[u8], i: usize) -> u16 {
        u16::from_ne_bytes([b[i], b[i + 1]])
    }
    fn u32_at(b: &[u8], i: usize) -> u32 {
        u32::from_ne_bytes(b[i..i + 4].try_into().unwrap())
    }

    #[test]
    fn slot_key_pads_the_name_and_appends_the_address() {
        let k = slot_key("snab000001", Ipv4Addr::new(100, 96, 0, 2)).unwrap();
        assert_eq!(&k[..10], b"snab000001");
        assert!(k[10..16].iter().all(|b| *b == 0));
        assert_eq!(&k[16..], &[100, 96, 0, 2]);
        assert!(slot_key("", Ipv4Addr::LOCALHOST).is_err());
        assert!(slot_key("sixteen-bytes-xx", Ipv4Addr::LOCALHOST).is_err());
    }

    #[test]
    fn batch_wraps_one_element_message_between_begin_and_end() {
        let k = slot_key("snab000001", Ipv4Addr::new(100, 96, 0, 2)).unwrap();
        let m = set_elems_batch(true, 8, "sandlot_x", "slots", &[k, k]);
        // Begin: header + nfgenmsg only, resource id = nftables subsystem (big endian).
        assert_eq!(u32_at(&m, 0), 20);
        assert_eq!(u16_at(&m, 4), NFNL_MSG_BATCH_BEGIN);
        assert_eq!(u32_at(&m, 8), 8);
        assert_eq!(&m[18..20], &10u16.to_be_bytes());
        // The element message.
        let e = 20;
        let elen = u32_at(&m, e) as usize;
        assert_eq!(u16_at(&m, e + 4), (10 << 8) | NFT_MSG_NEWSETELEM);
        assert_eq!(u16_at(&m, e + 6), NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK);
        assert_eq!(u32_at(&m, e + 8), 8);
        assert_eq!(m[e + 16], NFPROTO_INET);
        let body = &m[e + 20..e + elen];
        assert_eq!(u16_at(body, 2), NFTA_SET_ELEM_LIST_TABLE);
        assert_eq!(&body[4..14], b"sandlot_x\0");
        // The two keys are in the element list, 20 bytes each.
        let found = body.windows(20).filter(|w| *w == k).count();
        assert_eq!(found, 2);
        // End.
        let end = e + elen;
        assert_eq!(u16_at(&m, end + 4), NFNL_MSG_BATCH_END);
        assert_eq!(u32_at(&m, end + 8), 8);
        assert_eq!(end + 20, m.len());
        let del = set_elems_batch(false, 8, "sandlot_x", "slots", &[k]);
        assert_eq!(u16_at(&del, 24), (10 << 8) | NFT_MSG_DELSETELEM);
        assert_eq!(u16_at(&del, 26), NLM_F_REQUEST | NLM_F_ACK);
    }
}
