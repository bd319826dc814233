//! A minimal rtnetlink client: the few link, address and route requests a network
//! slot needs, sent from the daemon's own threads. Building a slot used to run eight
//! `ip` processes; in the density benchmark those processes were a third of the
//! machine's CPU time.
//!
//! Messages are encoded by pure functions (unit-tested byte for byte without root);
//! [`Rtnl`] sends one request at a time on a `NETLINK_ROUTE` socket and waits for its
//! acknowledgement. A socket belongs to the network namespace of the thread that
//! opened it, which is how requests reach a slot's namespace.

use std::net::Ipv4Addr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::net::netlink::SocketAddrNetlink;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

/// Errors of netlink requests (rtnetlink and nf_tables).
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("open a netlink socket: {0}")]
    Open(#[source] std::io::Error),
    #[error("{op}: {source}")]
    Io {
        op: String,
        #[source]
        source: std::io::Error,
    },
    /// The kernel refused the request (`errno` as the kernel reported it).
    #[error("{op}: {source}")]
    Refused {
        op: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{op}: malformed netlink reply")]
    Malformed { op: String },
    #[error("{op}: no interface named {name:?}")]
    NoSuchLink { op: String, name: String },
}

impl NetlinkError {
    /// The errno of a kernel refusal.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Refused { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

// Message types and flags (linux/netlink.h, linux/rtnetlink.h).
pub(crate) const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;
pub(crate) const NLM_F_REQUEST: u16 = 0x1;
pub(crate) const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
pub(crate) const NLM_F_CREATE: u16 = 0x400;
// Attributes (linux/if_link.h, linux/veth.h, linux/if_addr.h, linux/rtnetlink.h).
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_GATEWAY: u16 = 5;
const AF_UNSPEC: u8 = 0;
const AF_INET: u8 = 2;
const IFF_UP: u32 = 0x1;
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_BOOT: u8 = 3;
const RT_SCOPE_UNIVERSE: u8 = 0;
const RTN_UNICAST: u8 = 1;
pub(crate) const NLMSG_HDRLEN: usize = 16;
/// The loopback device is always interface 1 of a network namespace.
pub const LOOPBACK_INDEX: u32 = 1;

/// One request's body after the header: builds attributes, aligned to 4 bytes.
#[derive(Default)]
pub(crate) struct Body(pub(crate) Vec<u8>);

impl Body {
    pub(crate) fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn pad(&mut self) {
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
    }
    pub(crate) fn attr(&mut self, kind: u16, data: &[u8]) -> &mut Self {
        let len = (4 + data.len()) as u16;
        self.0.extend_from_slice(&len.to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(data);
        self.pad();
        self
    }
    /// A string attribute, NUL-terminated as the kernel's `nla_strscpy` accepts.
    pub(crate) fn attr_str(&mut self, kind: u16, s: &str) -> &mut Self {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        self.attr(kind, &v)
    }
    /// A nested attribute: `f` writes its members.
    pub(crate) fn nest(&mut self, kind: u16, f: impl FnOnce(&mut Body)) -> &mut Self {
        let start = self.0.len();
        self.0.extend_from_slice(&[0, 0]);
        self.0.extend_from_slice(&kind.to_ne_bytes());
        f(self);
        let len = (self.0.len() - start) as u16;
        self.0[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self
    }
}

/// `struct ifinfomsg`.
fn ifinfomsg(index: u32, flags: u32, change: u32) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[0] = AF_UNSPEC;
    m[4..8].copy_from_slice(&(index as i32).to_ne_bytes());
    m[8..12].copy_from_slice(&flags.to_ne_bytes());
    m[12..16].copy_from_slice(&change.to_ne_bytes());
    m
}

/// A whole message: header (length, type, flags, sequence, port 0) and body.
fn message(kind: u16, flags: u16, seq: u32, body: &Body) -> Vec<u8> {
    let len = NLMSG_HDRLEN + body.0.len();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&body.0);
    m
}

/// `ip link add NAME type veth peer name PEER netns NS`.
fn create_veth_msg(seq: u32, name: &str, peer: &str, peer_ns: i32) -> Vec<u8> {
    let mut b = Body::default();
    b.bytes(&ifinfomsg(0, 0, 0))
        .attr_str(IFLA_IFNAME, name)
        .nest(IFLA_LINKINFO, |li| {
            li.attr(IFLA_INFO_KIND, b"veth").nest(IFLA_INFO_DATA, |d| {
                d.nest(VETH_INFO_PEER, |p| {
                    p.bytes(&ifinfomsg(0, 0, 0))
                        .attr_str(IFLA_IFNAME, peer)
                        .attr(IFLA_NET_NS_FD, &(peer_ns as u32).to_ne_bytes());
                });
            });
        });
    message(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, seq, &b)
}

/// `ip link show NAME` (the answer carries the index).
fn get_link_msg(seq: u32, name: &str) -> Vec<u8> {
    let mut b = Body::default();
    b.bytes(&ifinfomsg(0, 0, 0)).attr_str(IFLA_IFNAME, name);
    message(RTM_GETLINK, 0, seq, &b)
}

/// `ip link del NAME`.
fn delete_link_msg(seq: u32, name: &str) -> Vec<u8> {
    let mut b = Body::default();
    b.bytes(&ifinfomsg(0, 0, 0)).attr_str(IFLA_IFNAME, name);
    message(RTM_DELLINK, 0, seq, &b)
}

/// `ip link set dev INDEX up`.
fn set_up_msg(seq: u32, index: u32) -> Vec<u8> {
    let mut b = Body::default();
    b.bytes(&ifinfomsg(index, IFF_UP, IFF_UP));
    message(RTM_NEWLINK, 0, seq, &b)
}

/// `ip addr add ADDR/PREFIX dev INDEX`.
fn add_addr_msg(seq: u32, index: u32, addr: Ipv4Addr, prefix: u8) -> Vec<u8> {
    let mut b = Body::default();
    let mut m = [0u8; 8];
    m[0] = AF_INET;
    m[1] = prefix;
    m[3] = RT_SCOPE_UNIVERSE;
    m[4..8].copy_from_slice(&index.to_ne_bytes());
    b.bytes(&m)
        .attr(IFA_LOCAL, &addr.octets())
        .attr(IFA_ADDRESS, &addr.octets());
    message(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, seq, &b)
}

/// `ip route add default via GATEWAY`.
fn add_default_route_msg(seq: u32, gateway: Ipv4Addr) -> Vec<u8> {
    let mut b = Body::default();
    b.bytes(&[
        AF_INET,
        0, // dst_len: default route
        0,
        0,
        RT_TABLE_MAIN,
        RTPROT_BOOT,
        RT_SCOPE_UNIVERSE,
        RTN_UNICAST,
        0,
        0,
        0,
        0,
    ])
    .attr(RTA_GATEWAY, &gateway.octets());
    message(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, seq, &b)
}

/// What one reply datagram said about request `seq`.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    /// Acknowledged (error 0).
    Ack,
    /// Refused with this errno.
    Errno(i32),
    /// The index of an `RTM_NEWLINK` answer to a `RTM_GETLINK`.
    Link(u32),
    /// Nothing about this request (another sequence number, or a type we skip).
    Other,
}

/// Splits a datagram into messages and reads what each says about `seq`.
fn parse_replies(buf: &[u8], seq: u32) -> Option<Vec<Reply>> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + NLMSG_HDRLEN <= buf.len() {
        let h = &buf[off..];
        let len = u32::from_ne_bytes(h[0..4].try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(h[4..6].try_into().ok()?);
        let mseq = u32::from_ne_bytes(h[8..12].try_into().ok()?);
        if len < NLMSG_HDRLEN || off + len > buf.len() {
            return None;
        }
        let payload = &h[NLMSG_HDRLEN..len];
        let r = if mseq != seq {
            Reply::Other
        } else {
            match kind {
                NLMSG_ERROR => {
                    let e = i32::from_ne_bytes(payload.get(0..4)?.try_into().ok()?);
                    if e == 0 {
                        Reply::Ack
                    } else {
                        Reply::Errno(-e)
                    }
                }
                RTM_NEWLINK => {
                    let i = i32::from_ne_bytes(payload.get(4..8)?.try_into().ok()?);
                    Reply::Link(i as u32)
                }
                NLMSG_DONE => Reply::Ack,
                _ => Reply::Other,
            }
        };
        out.push(r);
        off += (len + 3) & !3;
    }
    Some(out)
}

/// A netlink socket of one protocol, in the network namespace of the thread that
/// opened it; one request at a time.
pub(crate) struct Socket {
    fd: OwnedFd,
    seq: u32,
}

impl Socket {
    /// `protocol` `None` is `NETLINK_ROUTE` (protocol 0).
    pub(crate) fn open(protocol: Option<rustix::net::Protocol>) -> Result<Socket, NetlinkError> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            protocol,
        )
        .map_err(|e| NetlinkError::Open(e.into()))?;
        // A kernel that never answers must not hang a pool thread.
        rustix::net::sockopt::set_socket_timeout(
            &fd,
            rustix::net::sockopt::Timeout::Recv,
            Some(Duration::from_secs(10)),
        )
        .map_err(|e| NetlinkError::Open(e.into()))?;
        Ok(Socket { fd, seq: 0 })
    }

    /// A fresh sequence number for the next request.
    pub(crate) fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Sends `msg` (one datagram: a request, or a batch of them) and waits for the
    /// acknowledgement of sequence number `seq`; returns the index of a link answer
    /// if one came first.
    pub(crate) fn transact(
        &mut self,
        op: &str,
        msg: &[u8],
        seq: u32,
    ) -> Result<Option<u32>, NetlinkError> {
        let io = |e: rustix::io::Errno| NetlinkError::Io {
            op: op.to_string(),
            source: e.into(),
        };
        rustix::net::sendto(
            &self.fd,
            msg,
            SendFlags::empty(),
            &SocketAddrNetlink::new(0, 0),
        )
        .map_err(io)?;
        let mut buf = vec![0u8; 16 * 1024];
        let mut link = None;
        loop {
            let (n, _) =
                rustix::net::recv(&self.fd, &mut buf[..], RecvFlags::empty()).map_err(io)?;
            let replies = parse_replies(&buf[..n], seq)
                .ok_or_else(|| NetlinkError::Malformed { op: op.to_string() })?;
            for r in replies {
                match r {
                    Reply::Ack => return Ok(link),
                    Reply::Errno(e) => {
                        return Err(NetlinkError::Refused {
                            op: op.to_string(),
                            source: std::io::Error::from_raw_os_error(e),
                        })
                    }
                    Reply::Link(i) => link = Some(i),
                    Reply::Other => {}
                }
            }
        }
    }
}

/// A `NETLINK_ROUTE` socket in the network namespace of the thread that opened it.
pub struct Rtnl {
    sock: Socket,
}

impl Rtnl {
    pub fn open() -> Result<Rtnl, NetlinkError> {
        Ok(Rtnl {
            sock: Socket::open(None)?,
        })
    }

    /// Sends one request and waits for its acknowledgement.
    fn request(
        &mut self,
        op: &str,
        make: impl FnOnce(u32) -> Vec<u8>,
    ) -> Result<Option<u32>, NetlinkError> {
        let seq = self.sock.next_seq();
        let msg = make(seq);
        self.sock.transact(op, &msg, seq)
    }

    /// Creates veth `name` here, its peer `peer` in the namespace `peer_ns`.
    pub fn create_veth(
        &mut self,
        name: &str,
        peer: &str,
        peer_ns: BorrowedFd<'_>,
    ) -> Result<(), NetlinkError> {
        use std::os::fd::AsRawFd;
        let fd = peer_ns.as_fd().as_raw_fd();
        self.request(&format!("create veth {name} (peer {peer})"), |s| {
            create_veth_msg(s, name, peer, fd)
        })
        .map(|_| ())
    }

    /// The index of interface `name`.
    pub fn link_index(&mut self, name: &str) -> Result<u32, NetlinkError> {
        let op = format!("look up interface {name}");
        match self.request(&op, |s| get_link_msg(s, name)) {
            Ok(Some(i)) => Ok(i),
            Ok(None) => Err(NetlinkError::Malformed { op }),
            Err(e) if e.errno() == Some(libc_enodev()) => Err(NetlinkError::NoSuchLink {
                op,
                name: name.to_string(),
            }),
            Err(e) => Err(e),
        }
    }

    /// Deletes interface `name` (a veth takes its peer with it).
    pub fn delete_link(&mut self, name: &str) -> Result<(), NetlinkError> {
        self.request(&format!("delete interface {name}"), |s| {
            delete_link_msg(s, name)
        })
        .map(|_| ())
    }

    pub fn set_up(&mut self, index: u32) -> Result<(), NetlinkError> {
        self.request(&format!("set interface {index} up"), |s| {
            set_up_msg(s, index)
        })
        .map(|_| ())
    }

    pub fn add_addr(&mut self, index: u32, addr: Ipv4Addr, prefix: u8) -> Result<(), NetlinkError> {
        self.request(
            &format!("add address {addr}/{prefix} to interface {index}"),
            |s| add_addr_msg(s, index, addr, prefix),
        )
        .map(|_| ())
    }

    pub fn add_default_route(&mut self, gateway: Ipv4Addr) -> Result<(), NetlinkError> {
        self.request(&format!("add default route via {gateway}"), |s| {
            add_default_route_msg(s, gateway)
        })
        .map(|_| ())
    }
}

fn libc_enodev() -> i32 {
    rustix::io::Errno::NODEV.raw_os_error()
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
    fn header_carries_length_type_flags_and_sequence() {
        let m = set_up_msg(7, 42);
        assert_eq!(u32_at(&m, 0) as usize, m.len());
        assert_eq!(m.len(), 16 + 16);
        assert_eq!(u16_at(&m, 4), RTM_NEWLINK);
        assert_eq!(u16_at(&m, 6), NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(u32_at(&m, 8), 7);
        // ifinfomsg: index 42, flags and change mask IFF_UP.
        assert_eq!(u32_at(&m, 20), 42);
        assert_eq!(u32_at(&m, 24), IFF_UP);
        assert_eq!(u32_at(&m, 28), IFF_UP);
    }

    #[test]
    fn veth_request_nests_the_peer_with_its_name_and_namespace() {
        let m = create_veth_msg(1, "snab", "eth0", 9);
        assert_eq!(u32_at(&m, 0) as usize, m.len());
        assert_eq!(
            u16_at(&m, 6),
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
        );
        // After header (16) and ifinfomsg (16): IFLA_IFNAME "snab\0" padded to 8.
        assert_eq!(u16_at(&m, 32), 9);
        assert_eq!(u16_at(&m, 34), IFLA_IFNAME);
        assert_eq!(&m[36..41], b"snab\0");
        // IFLA_LINKINFO spans the rest of the message.
        let li = 44;
        assert_eq!(u16_at(&m, li + 2), IFLA_LINKINFO);
        assert_eq!(u16_at(&m, li) as usize, m.len() - li);
        assert_eq!(u16_at(&m, li + 4), 8);
        assert_eq!(u16_at(&m, li + 6), IFLA_INFO_KIND);
        assert_eq!(&m[li + 8..li + 12], b"veth");
        let data = li + 12;
        assert_eq!(u16_at(&m, data + 2), IFLA_INFO_DATA);
        assert_eq!(u16_at(&m, data) as usize, m.len() - data);
        let peer = data + 4;
        assert_eq!(u16_at(&m, peer + 2), VETH_INFO_PEER);
        // The peer: an ifinfomsg, then its name, then the namespace fd.
        let name = peer + 4 + 16;
        assert_eq!(u16_at(&m, name + 2), IFLA_IFNAME);
        assert_eq!(&m[name + 4..name + 9], b"eth0\0");
        let ns = name + 12;
        assert_eq!(u16_at(&m, ns + 2), IFLA_NET_NS_FD);
        assert_eq!(u32_at(&m, ns + 4), 9);
        assert_eq!(ns + 8, m.len());
    }

    #[test]
    fn address_and_route_requests_carry_the_ipv4_addresses() {
        let a = Ipv4Addr::new(100, 96, 0, 9);
        let m = add_addr_msg(3, 5, a, 30);
        assert_eq!(u16_at(&m, 4), RTM_NEWADDR);
        assert_eq!(m[16], AF_INET);
        assert_eq!(m[17], 30);
        assert_eq!(u32_at(&m, 20), 5);
        assert_eq!(u16_at(&m, 26), IFA_LOCAL);
        assert_eq!(&m[28..32], &a.octets());
        assert_eq!(u16_at(&m, 34), IFA_ADDRESS);
        assert_eq!(&m[36..40], &a.octets());
        let r = add_default_route_msg(4, a);
        assert_eq!(u16_at(&r, 4), RTM_NEWROUTE);
        assert_eq!(r[16], AF_INET);
        assert_eq!(r[17], 0, "default route: destination length 0");
        assert_eq!(r[20], RT_TABLE_MAIN);
        assert_eq!(r[23], RTN_UNICAST);
        assert_eq!(u16_at(&r, 30), RTA_GATEWAY);
        assert_eq!(&r[32..36], &a.octets());
    }

    fn reply(kind: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&((16 + payload.len()) as u32).to_ne_bytes());
        v.extend_from_slice(&kind.to_ne_bytes());
        v.extend_from_slice(&0u16.to_ne_bytes());
        v.extend_from_slice(&seq.to_ne_bytes());
        v.extend_from_slice(&0u32.to_ne_bytes());
        v.extend_from_slice(payload);
        while v.len() % 4 != 0 {
            v.push(0);
        }
        v
    }

    #[test]
    fn replies_are_matched_to_their_sequence() {
        let mut d = reply(RTM_NEWLINK, 5, &ifinfomsg(17, 0, 0));
        d.extend(reply(NLMSG_ERROR, 4, &(-17i32).to_ne_bytes()));
        d.extend(reply(NLMSG_ERROR, 5, &0i32.to_ne_bytes()));
        assert_eq!(
            parse_replies(&d, 5).unwrap(),
            vec![Reply::Link(17), Reply::Other, Reply::Ack]
        );
        let e = reply(NLMSG_ERROR, 9, &(-17i32).to_ne_bytes());
        assert_eq!(parse_replies(&e, 9).unwrap(), vec![Reply::Errno(17)]);
        // A length running past the datagram is malformed, not an endless loop.
        let mut bad = reply(NLMSG_ERROR, 9, &0i32.to_ne_bytes());
        bad[0] = 200;
        assert!(parse_replies(&bad, 9).is_none());
    }
}
