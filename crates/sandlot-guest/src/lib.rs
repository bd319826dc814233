//! The host-side client of the guest protocol, and the framing both of its ends
//! speak.
//!
//! * [`client::GuestClient`] speaks it from the host, over any byte stream, to an
//!   agent it does not trust (a sandbox's processes may be that agent).
//! * [`wire`]: frames read and written, shared with the agent (`sandlot-agent`).
//!
//! The wire format is specified in `docs/protocol.md`; its types are in
//! [`sandlot_proto::guest`] (re-exported as [`proto`]).

#![forbid(unsafe_code)]

pub mod client;
pub mod wire;

pub use sandlot_proto::guest as proto;

/// `sandlot-guest VERSION`, as announced in the handshake.
pub fn software() -> String {
    concat!("sandlot-guest ", env!("CARGO_PKG_VERSION")).to_string()
}
