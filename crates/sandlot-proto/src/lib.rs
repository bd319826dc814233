//! Wire types shared by every Sandlot component.
//!
//! * [`api`]: the request and response bodies of the HTTP API v1 (with the `openapi`
//!   feature, their OpenAPI schemas).
//! * [`spec`]: the sandbox spec, as accepted by `sandlot run`, the HTTP API and spec files.
//! * [`guest`]: the framed, versioned protocol spoken between the host and the in-sandbox agent.
//! * [`clock`]: the wall clock in the unit of the wire's timestamps.
//! * [`units`]: byte sizes and durations as humans write them (`512M`, `30s`).
//! * [`users`]: a spec's user resolved against a sandbox's `/etc/passwd` and `/etc/group`.
//!
//! This crate does no I/O (it reads the clock, nothing else).

#![forbid(unsafe_code)]

pub mod api;
pub mod clock;
pub mod guest;
pub mod spec;
pub mod units;
pub mod users;
