//! Capabilities and landlock: the process-level confinement applied after the mounts.
//!
//! Capabilities here are those of the sandbox's user namespace; they already give no
//! power over the host. The bounding set is still cut to Docker's default minus
//! `NET_RAW`, so that root in the sandbox cannot mount, trace the agent, or use raw
//! sockets, whatever the user namespace would allow.

use std::io;
use std::path::Path;

/// Capabilities kept in the bounding set (numbers from `linux/capability.h`).
pub const KEPT_CAPS: &[(u32, &str, &str)] = &[
    (0, "CHOWN", "package managers and tar chown files"),
    (
        1,
        "DAC_OVERRIDE",
        "root reads and writes files of other users in the sandbox",
    ),
    (3, "FOWNER", "chmod and utime on files root does not own"),
    (4, "FSETID", "keep setgid bits when root edits files"),
    (
        5,
        "KILL",
        "root signals processes of other users in the sandbox",
    ),
    (
        6,
        "SETGID",
        "drop to another group (su, the agent's exec as user)",
    ),
    (7, "SETUID", "drop to another user"),
    (8, "SETPCAP", "drop capabilities further"),
    (10, "NET_BIND_SERVICE", "servers on ports below 1024"),
    (18, "SYS_CHROOT", "build tools that chroot"),
    (
        27,
        "MKNOD",
        "mknod of fifos by root (device nodes stay refused by the kernel and landlock)",
    ),
    (29, "AUDIT_WRITE", "login-style tools write audit records"),
    (31, "SETFCAP", "package installs that set file capabilities"),
];

#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    #[error("drop capability {cap} from the bounding set: {source}")]
    Bounding { cap: u32, source: io::Error },
    #[error("set process capabilities: {0}")]
    Capset(#[source] io::Error),
    #[error("landlock {op}: {source}")]
    Landlock { op: &'static str, source: io::Error },
    #[error("set process attribute {what}: {source}")]
    Prctl {
        what: &'static str,
        source: io::Error,
    },
}

fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

/// The bitmask of [`KEPT_CAPS`].
pub fn kept_mask() -> u64 {
    KEPT_CAPS.iter().fold(0u64, |m, (c, _, _)| m | (1 << c))
}

/// Drops every capability outside [`KEPT_CAPS`] from the bounding set, clears the
/// ambient set, and limits the permitted, effective and inheritable sets.
pub fn drop_capabilities() -> Result<(), SecurityError> {
    let keep = kept_mask();
    for cap in 0..=last_cap() {
        if keep & (1 << cap) != 0 {
            continue;
        }
        match crate::sys::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0) {
            Ok(_) => {}
            // Capabilities the kernel does not know about are fine.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(source) => return Err(SecurityError::Bounding { cap, source }),
        }
    }
    crate::sys::prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
        0,
    )
    .map_err(|source| SecurityError::Prctl {
        what: "clear ambient capabilities",
        source,
    })?;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let hdr = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let lo = keep as u32;
    let hi = (keep >> 32) as u32;
    let data = [
        Data {
            effective: lo,
            permitted: lo,
            inheritable: 0,
        },
        Data {
            effective: hi,
            permitted: hi,
            inheritable: 0,
        },
    ];
    // SAFETY: header and two data structs are laid out as the v3 capset ABI expects
    // and live for the duration of the call.
    let r = unsafe { libc::syscall(libc::SYS_capset, &hdr as *const Header, data.as_ptr()) };
    if r != 0 {
        return Err(SecurityError::Capset(io::Error::last_os_error()));
    }
    Ok(())
}

/// Makes the calling process non-dumpable, so that processes in the sandbox (which
/// lack `CAP_SYS_PTRACE`) cannot trace the agent or read its `/proc/1/fd`.
pub fn set_non_dumpable() -> Result<(), SecurityError> {
    crate::sys::prctl(libc::PR_SET_DUMPABLE, 0, 0).map_err(|source| SecurityError::Prctl {
        what: "non-dumpable",
        source,
    })?;
    Ok(())
}

const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
const ACCESS_FS_MAKE_CHAR: u64 = 1 << 6;
const ACCESS_FS_MAKE_BLOCK: u64 = 1 << 11;
const ACCESS_FS_REFER: u64 = 1 << 13;
const RULE_PATH_BENEATH: u32 = 1;
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
const SCOPE_SIGNAL: u64 = 1 << 1;

/// What landlock enforced, for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LandlockStatus {
    pub abi: u32,
    pub device_nodes_refused: bool,
    pub signals_scoped: bool,
    pub abstract_sockets_scoped: bool,
}

/// Applies the landlock policy: no device nodes anywhere (files may still be moved
/// and linked across directories), and (ABI 6, Linux 6.12+)
/// signals and abstract Unix sockets scoped to the sandbox. Everything else about
/// files is already enforced by the mount table. Kernels without landlock get a
/// status with `abi == 0`.
pub fn apply_landlock() -> Result<LandlockStatus, SecurityError> {
    // SAFETY: a null attribute with size 0 and the VERSION flag queries the ABI.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if abi < 1 {
        return Ok(LandlockStatus::default());
    }
    let abi = abi as u32;
    if abi < 2 {
        // ABI 1 cannot grant LANDLOCK_ACCESS_FS_REFER: any ruleset there refuses
        // every rename or link across directories (EXDEV), which breaks ordinary
        // programs. The device-node rule is defence in depth only (the kernel
        // refuses device nodes in a user namespace anyway), so skip landlock.
        return Ok(LandlockStatus {
            abi,
            ..Default::default()
        });
    }
    // restrict_self needs no_new_privs once CAP_SYS_ADMIN is gone.
    crate::sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0).map_err(|source| SecurityError::Prctl {
        what: "no_new_privs",
        source,
    })?;
    #[repr(C)]
    struct Attr {
        handled_access_fs: u64,
        handled_access_net: u64,
        scoped: u64,
    }
    let scoped = if abi >= 6 {
        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    } else {
        0
    };
    // REFER is handled so that it can be granted below: a ruleset that handles
    // any file access but does not grant REFER refuses cross-directory renames.
    let attr = Attr {
        handled_access_fs: ACCESS_FS_MAKE_CHAR | ACCESS_FS_MAKE_BLOCK | ACCESS_FS_REFER,
        handled_access_net: 0,
        scoped,
    };
    // Older ABIs do not know the `scoped` field: pass the shorter struct.
    let size = if abi >= 6 {
        std::mem::size_of::<Attr>()
    } else if abi >= 4 {
        16
    } else {
        8
    };
    // SAFETY: `attr` is a valid ruleset attribute of at least `size` bytes.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const Attr,
            size,
            0u32,
        )
    };
    if fd < 0 {
        return Err(SecurityError::Landlock {
            op: "create ruleset",
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: fresh fd from the kernel, owned here.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
    use std::os::fd::AsRawFd;
    // Renames and links may move files between any directories: REFER beneath /.
    #[repr(C, packed)]
    struct PathBeneath {
        allowed_access: u64,
        parent_fd: i32,
    }
    let root = std::fs::File::open("/").map_err(|source| SecurityError::Landlock {
        op: "open / for the refer rule",
        source,
    })?;
    let rule = PathBeneath {
        allowed_access: ACCESS_FS_REFER,
        parent_fd: root.as_raw_fd(),
    };
    // SAFETY: `rule` is a valid landlock_path_beneath_attr (packed, 12 bytes) whose
    // parent_fd stays open (`root`) for the duration of the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            fd.as_raw_fd(),
            RULE_PATH_BENEATH,
            &rule as *const PathBeneath,
            0u32,
        )
    };
    if r != 0 {
        return Err(SecurityError::Landlock {
            op: "add the refer rule",
            source: io::Error::last_os_error(),
        });
    }
    drop(root);
    // SAFETY: restrict_self takes the ruleset fd and flags only.
    let r = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0u32) };
    if r != 0 {
        return Err(SecurityError::Landlock {
            op: "restrict self",
            source: io::Error::last_os_error(),
        });
    }
    Ok(LandlockStatus {
        abi,
        device_nodes_refused: true,
        signals_scoped: scoped != 0,
        abstract_sockets_scoped: scoped != 0,
    })
}

/// Landlock rights of the read-only ruleset (`linux/landlock.h`).
mod ruleset {
    pub const CREATE_RULESET_VERSION: u32 = 1;
    pub const RULE_PATH_BENEATH: u32 = 1;
    pub const ACCESS_FS_READ_FILE: u64 = 1 << 2;
    pub const ACCESS_FS_READ_DIR: u64 = 1 << 3;
    /// Every filesystem right of ABI 1 (execute .. make_sym).
    pub const ACCESS_FS_V1: u64 = (1 << 13) - 1;
    pub const ACCESS_FS_REFER: u64 = 1 << 13;
    pub const ACCESS_FS_TRUNCATE: u64 = 1 << 14;
    pub const ACCESS_FS_IOCTL_DEV: u64 = 1 << 15;
    pub const ACCESS_NET_BIND_TCP: u64 = 1 << 0;
    pub const ACCESS_NET_CONNECT_TCP: u64 = 1 << 1;
    pub const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
    pub const SCOPE_SIGNAL: u64 = 1 << 1;

    #[repr(C)]
    #[derive(Default)]
    pub struct RulesetAttr {
        pub handled_access_fs: u64,
        pub handled_access_net: u64,
        pub scoped: u64,
    }

    #[repr(C, packed)]
    pub struct PathBeneathAttr {
        pub allowed_access: u64,
        pub parent_fd: i32,
    }

    /// The ruleset for ABI `abi` and how many bytes of it that ABI reads.
    pub fn ruleset(abi: i64) -> (RulesetAttr, usize) {
        let mut fs = ACCESS_FS_V1;
        if abi >= 2 {
            fs |= ACCESS_FS_REFER;
        }
        if abi >= 3 {
            fs |= ACCESS_FS_TRUNCATE;
        }
        if abi >= 5 {
            fs |= ACCESS_FS_IOCTL_DEV;
        }
        let mut attr = RulesetAttr {
            handled_access_fs: fs,
            ..Default::default()
        };
        let mut size = 8;
        if abi >= 4 {
            attr.handled_access_net = ACCESS_NET_BIND_TCP | ACCESS_NET_CONNECT_TCP;
            size = 16;
        }
        if abi >= 6 {
            attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL;
            size = 24;
        }
        (attr, size)
    }
}

/// Restricts the calling thread (and the threads and children it starts afterwards)
/// to reading files and directories beneath `dir`; where the kernel can (ABI 4 and
/// later) it may neither bind nor connect TCP sockets, and from ABI 6 abstract unix
/// sockets and signals are scoped to it. `no_new_privs` must be set first. The ABI
/// version, or `None` where the kernel has no Landlock (not an error: the caller's
/// other confinement still applies). Used by the collection-mount helper.
pub fn landlock_read_only_beneath(dir: &Path) -> Result<Option<i64>, SecurityError> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::fs::OpenOptionsExt;
    let ll = |op: &'static str| move |source: io::Error| SecurityError::Landlock { op, source };
    // SAFETY: a null attribute with size 0 and the VERSION flag only queries the ABI.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<ruleset::RulesetAttr>(),
            0usize,
            ruleset::CREATE_RULESET_VERSION,
        )
    };
    if abi < 1 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) => Ok(None),
            _ => Err(ll("query the ABI")(e)),
        };
    }
    let (attr, size) = ruleset::ruleset(abi);
    // SAFETY: `attr` is a valid ruleset attribute of at least `size` bytes.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const ruleset::RulesetAttr,
            size,
            0u32,
        )
    };
    if fd < 0 {
        return Err(ll("create a ruleset")(io::Error::last_os_error()));
    }
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    let ruleset = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let parent = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(dir)
        .map_err(ll("open the allowed directory"))?;
    let rule = ruleset::PathBeneathAttr {
        allowed_access: ruleset::ACCESS_FS_READ_FILE | ruleset::ACCESS_FS_READ_DIR,
        parent_fd: parent.as_raw_fd(),
    };
    // SAFETY: `ruleset` and `parent` are open descriptors; `rule` is a valid
    // path-beneath attribute for the duration of the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            ruleset::RULE_PATH_BENEATH,
            &rule as *const ruleset::PathBeneathAttr,
            0u32,
        )
    };
    if r != 0 {
        return Err(ll("add the rule for the allowed directory")(
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: `ruleset` is an open ruleset descriptor; no_new_privs is set.
    let r = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32) };
    if r != 0 {
        return Err(ll("restrict the thread")(io::Error::last_os_error()));
    }
    Ok(Some(abi))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_caps_exclude_the_dangerous_ones() {
        let m = kept_mask();
        for (cap, name) in [
            (21, "SYS_ADMIN"),
            (13, "NET_RAW"),
            (19, "SYS_PTRACE"),
            (16, "SYS_MODULE"),
            (12, "NET_ADMIN"),
        ] {
            assert_eq!(m & (1 << cap), 0, "{name} must be dropped");
        }
        assert_ne!(m & (1 << 7), 0, "SETUID is needed to exec as another user");
    }
}
