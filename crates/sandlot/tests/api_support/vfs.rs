//! Collection fixtures shared by the virtual filesystem tests (`api_vfs`,
//! `api_vfs_mount`): tar uploads and the ACL they are ingested with.

use bytes::Bytes;
use sandlot_client::vfs::{VfsAcl, VfsAclRule};

/// A tar archive of `files` (path, content), mtime fixed so re-uploads match.
pub fn tar_of(files: &[(&str, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (p, c) in files {
        let mut h = tar::Header::new_ustar();
        h.set_size(c.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(1_700_000_000);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, p, c.as_bytes()).unwrap();
    }
    b.into_inner().unwrap()
}

/// An upload body of one chunk.
pub fn body(
    v: Vec<u8>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + Sync {
    futures_util::stream::iter(vec![Ok(Bytes::from(v))])
}

/// Public by default; `internal/**` readable by group `eng` only.
pub fn acl() -> VfsAcl {
    VfsAcl {
        default: Some("public".into()),
        rules: vec![VfsAclRule {
            pattern: "internal/**".into(),
            acl: "group:eng".into(),
        }],
    }
}
