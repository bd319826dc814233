//! Resolution of a user as written in a spec (`root`, `user`, `UID[:GID]` or a name)
//! against the text of a sandbox's `/etc/passwd` and `/etc/group`. Pure: the callers
//! read the files (the agent, for every process it starts; the runtime, for the default
//! owner of secret files).

use crate::spec::parse_user;

/// A user to run as or to act for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, including the primary group, without duplicates.
    pub groups: Vec<u32>,
    /// Login name, if known.
    pub name: Option<String>,
    /// Home directory from `/etc/passwd`, if known.
    pub home: Option<String>,
}

impl User {
    /// `USER` and `LOGNAME`: the name, else the numeric uid.
    pub fn login_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.uid.to_string())
    }
}

struct PasswdEntry<'a> {
    name: &'a str,
    uid: u32,
    gid: u32,
    home: &'a str,
}

fn passwd_entries(passwd: &str) -> impl Iterator<Item = PasswdEntry<'_>> {
    passwd.lines().filter_map(|l| {
        let l = l.trim_end_matches('\r');
        if l.starts_with('#') {
            return None;
        }
        let f: Vec<&str> = l.split(':').collect();
        if f.len() < 7 {
            return None;
        }
        Some(PasswdEntry {
            name: f[0],
            uid: f[2].parse().ok()?,
            gid: f[3].parse().ok()?,
            home: f[5],
        })
    })
}

/// Groups (by gid) that list `name` as a member.
fn member_groups(group: &str, name: &str) -> Vec<u32> {
    group
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.trim_end_matches('\r').split(':').collect();
            if f.len() < 4 || l.starts_with('#') {
                return None;
            }
            let gid: u32 = f[2].parse().ok()?;
            f[3].split(',').any(|m| m.trim() == name).then_some(gid)
        })
        .collect()
}

fn all_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// Resolves `spec` (`root`, `user`, `UID[:GID]` or a name) given the contents of
/// `/etc/passwd` and `/etc/group` (empty strings if missing).
pub fn resolve_user(spec: &str, passwd: &str, group: &str) -> Result<User, String> {
    let numeric = spec
        .split_once(':')
        .map(|(u, g)| all_digits(u) && all_digits(g))
        .unwrap_or_else(|| all_digits(spec));
    let (uid, gid, entry) = if numeric {
        let ids =
            parse_user(spec).ok_or_else(|| format!("user {spec:?}: ids must be at most 65534"))?;
        let entry = passwd_entries(passwd).find(|e| e.uid == ids.uid);
        // Without an explicit group, the passwd entry's primary group wins.
        let gid = match (spec.contains(':'), &entry) {
            (false, Some(e)) => e.gid,
            _ => ids.gid,
        };
        (ids.uid, gid, entry)
    } else if let Some(e) = passwd_entries(passwd).find(|e| e.name == spec) {
        (e.uid, e.gid, Some(e))
    } else if let Some(ids) = parse_user(spec) {
        // `root` and `user` are known even without an /etc/passwd entry.
        match passwd_entries(passwd).find(|e| e.uid == ids.uid) {
            Some(e) => (ids.uid, e.gid, Some(e)),
            None => {
                let home = if ids.uid == 0 { "/root" } else { "/home/user" };
                return Ok(User {
                    uid: ids.uid,
                    gid: ids.gid,
                    groups: vec![ids.gid],
                    name: Some(spec.to_string()),
                    home: Some(home.to_string()),
                });
            }
        }
    } else {
        return Err(format!(
            "unknown user {spec:?}: not in the sandbox's /etc/passwd (use root, user, a name from /etc/passwd or UID[:GID])"
        ));
    };
    if uid == u32::MAX || gid == u32::MAX {
        return Err(format!("user {spec:?}: invalid id"));
    }
    let name = entry.as_ref().map(|e| e.name.to_string());
    let mut groups = vec![gid];
    if let Some(n) = &name {
        for g in member_groups(group, n) {
            if !groups.contains(&g) {
                groups.push(g);
            }
        }
    }
    Ok(User {
        uid,
        gid,
        groups,
        home: entry
            .as_ref()
            .map(|e| e.home.to_string())
            .filter(|h| !h.is_empty()),
        name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
        # comment\n\
        daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n\
        user:x:1000:1000::/home/user:/bin/sh\n\
        alice:x:1001:100::/home/alice:/bin/sh\n\
        broken:line\n";
    const GROUP: &str = "root:x:0:\n\
        users:x:100:\n\
        user:x:1000:\n\
        docker:x:999:user,alice\n\
        audio:x:29: alice \n";

    #[test]
    fn names_resolve_with_supplementary_groups() {
        let u = resolve_user("alice", PASSWD, GROUP).unwrap();
        assert_eq!((u.uid, u.gid), (1001, 100));
        assert_eq!(u.groups, vec![100, 999, 29]);
        assert_eq!(u.home.as_deref(), Some("/home/alice"));
        assert_eq!(u.login_name(), "alice");
        let u = resolve_user("user", PASSWD, GROUP).unwrap();
        assert_eq!(
            (u.uid, u.gid, u.groups.clone()),
            (1000, 1000, vec![1000, 999])
        );
    }

    #[test]
    fn numeric_ids_use_passwd_when_present() {
        let u = resolve_user("1001", PASSWD, GROUP).unwrap();
        assert_eq!((u.uid, u.gid), (1001, 100));
        assert_eq!(u.name.as_deref(), Some("alice"));
        let u = resolve_user("1001:5", PASSWD, GROUP).unwrap();
        assert_eq!((u.uid, u.gid), (1001, 5));
        assert_eq!(u.groups, vec![5, 999, 29]);
        let u = resolve_user("4242", PASSWD, GROUP).unwrap();
        assert_eq!((u.uid, u.gid, u.groups.clone()), (4242, 4242, vec![4242]));
        assert_eq!(u.home, None);
        assert_eq!(u.login_name(), "4242");
    }

    #[test]
    fn root_and_user_work_without_passwd() {
        let u = resolve_user("user", "", "").unwrap();
        assert_eq!((u.uid, u.gid), (1000, 1000));
        assert_eq!(u.home.as_deref(), Some("/home/user"));
        let r = resolve_user("root", "", "").unwrap();
        assert_eq!((r.uid, r.gid), (0, 0));
        // A passwd entry for uid 1000 under another name is used for `user`.
        let p = "cloud:x:1000:1000::/home/cloud:/bin/sh\n";
        let u = resolve_user("user", p, "").unwrap();
        assert_eq!(u.home.as_deref(), Some("/home/cloud"));
        assert_eq!(u.name.as_deref(), Some("cloud"));
    }

    #[test]
    fn bad_users_are_refused_with_a_clear_message() {
        let e = resolve_user("mallory", PASSWD, GROUP).unwrap_err();
        assert!(e.contains("unknown user \"mallory\""), "{e}");
        let e = resolve_user("70000", PASSWD, GROUP).unwrap_err();
        assert!(e.contains("65534"), "{e}");
        assert!(resolve_user("12:ab", PASSWD, GROUP).is_err());
    }
}
