//! The JSON types of the HTTP API v1. They are defined in [`sandlot_proto::api`]
//! (shared with the server) and re-exported here, so `sandlot_client::api::Sandbox`
//! and `sandlot_client::Sandbox` name the same types.

pub use sandlot_proto::api::*;
