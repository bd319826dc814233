//! The in-sandbox agent and the host-side client of the guest protocol.
