//! Sandlot virtual filesystem: named, versioned collections of documents that
//! agents browse with ordinary shell commands, answered in-process from an
//! immutable manifest, a content store and a trigram index, or through a
//! read-only FUSE mount.
//!
//! The daemon-facing API:
//! ```no_run
//! use sandlot_vfs::{Store, Source, IngestOptions, Principal, Limits};
//! let store = Store::open("/var/lib/sandlot/vfs")?;
//! store.create("docs", Source::parse("./site", Default::default())?, IngestOptions::default())?;
//! let coll = store.collection("docs")?;
//! let mut session = coll.open_session(Principal::new("alice", ["eng"]), Limits::default())?;
//! let out = session.run("grep -rn 'rate limit' / | head")?;
//! println!("{}", String::from_utf8_lossy(&out.stdout));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

pub mod acl;
pub mod audit;
pub mod blob;
#[cfg(feature = "fuse")]
pub mod fuse;
pub mod glob;
pub mod index;
pub mod ingest;
pub mod manifest;
#[cfg(feature = "mount-helper")]
pub mod mount_helper;
pub mod shell;
pub mod store;

pub use acl::{Acl, AclPolicy, AclRule, Principal};
pub use audit::{format_utc, AuditError, AuditFilter, AuditLog, AuditRecord, AuditSink};
pub use ingest::{
    IngestError, IngestLimits, IngestOptions, IngestReport, S3Credentials, S3Options, Source,
};
pub use manifest::{DocEntry, Manifest};
pub use shell::{Limits, Output, ScratchLimits, ScratchUsage, Session, SessionError};
pub use store::{
    Collection, CollectionConfig, CollectionInfo, IngestMode, Store, StoreError, Version, View,
};

/// `e` and its sources, one line (a source already in the text is not repeated).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn daemon_facing_types_are_send_and_sync() {
        send_sync::<crate::Store>();
        send_sync::<crate::Collection>();
        send_sync::<crate::View>();
        send_sync::<crate::Session>();
        send_sync::<crate::AuditLog>();
    }
}
