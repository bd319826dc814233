//! The sandbox's `/etc/passwd` and `/etc/group`, cached; resolution itself is
//! `sandlot_proto::users` (shared with the runtime, which resolves a secret file's
//! default owner the same way).

use sandlot_proto::users::resolve_user;
pub(crate) use sandlot_proto::users::User;

/// `/etc/passwd` and `/etc/group` of the running system (the sandbox's root),
/// re-read only when they change.
#[derive(Default)]
pub(crate) struct UserDb {
    passwd: CachedFile,
    group: CachedFile,
}

#[derive(Default)]
struct CachedFile {
    /// (inode, mtime, mtime nanoseconds, size) of the cached text.
    key: Option<(u64, i64, i64, u64)>,
    text: String,
}

impl CachedFile {
    fn refresh(&mut self, path: &str) {
        use std::os::unix::fs::MetadataExt;
        let key = std::fs::metadata(path)
            .ok()
            .map(|m| (m.ino(), m.mtime(), m.mtime_nsec(), m.size()));
        if key.is_none() || key != self.key {
            self.text = std::fs::read_to_string(path).unwrap_or_default();
            self.key = key;
        }
    }
}

impl UserDb {
    pub fn resolve(&mut self, spec: &str) -> Result<User, String> {
        self.passwd.refresh("/etc/passwd");
        self.group.refresh("/etc/group");
        resolve_user(spec, &self.passwd.text, &self.group.text)
    }
}
