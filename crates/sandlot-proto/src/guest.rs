//! The guest protocol: framed, versioned messages between the host and the in-sandbox
//! agent (`sandlot-guest`), over any reliable byte stream (a Unix socket today; vsock
//! or stdio for other backends). See `docs/protocol.md`.
