//! Seccomp filters: policies as data, compiled to classic BPF, installed in one place.
//!
//! The sandbox's policy ([`default_policy`]) is a deny list of syscalls modelled on
//! Docker's default profile, adapted to a sandbox whose root is already confined to its
//! own user namespace, plus an allow-list of socket families ([`SOCKET_FAMILIES`]).
//! Each entry carries the reason; `docs/threat-model.md` repeats them. Compilation is
//! pure and unit-tested without root.

use std::io;

/// What the filter does with a matching syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    Errno(u16),
    KillProcess,
}

/// A condition on the low 32 bits of one syscall argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgCheck {
    /// Matches when `(arg & mask) != 0`.
    AnyBits { arg: u8, mask: u32 },
    /// Matches when `arg == value`.
    Equals { arg: u8, value: u32 },
    /// Matches when `arg` is none of `allowed` (an allow-list of values).
    NoneOf {
        arg: u8,
        allowed: &'static [Allowed],
    },
}

/// One entry of a policy: `action` for syscall `nr` when every check matches (a rule
/// without checks matches every call of `nr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub name: &'static str,
    pub nr: i64,
    pub checks: Vec<ArgCheck>,
    pub action: Action,
    pub why: &'static str,
}

/// A filter as data: the first matching rule decides; `default` decides the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub rules: Vec<Rule>,
    pub default: Action,
}

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("compile seccomp filter: {0}")]
    Compile(String),
    #[error("install seccomp filter: {0}")]
    Install(#[source] io::Error),
}

// Classic BPF opcodes.
const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const BPF_JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K
const BPF_JA: u16 = 0x05; // BPF_JMP | BPF_JA

const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;

// Offsets in `struct seccomp_data`.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const OFF_ARGS: u32 = 16;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

/// Syscall numbers at or above this are the x32 ABI on x86_64; they share the
/// x86_64 audit arch, so a deny list must refuse the whole range explicitly.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// `struct sock_filter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

const fn insn(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
    Insn { code, jt, jf, k }
}

fn ret(a: Action) -> Insn {
    let k = match a {
        Action::Allow => SECCOMP_RET_ALLOW,
        Action::Errno(e) => SECCOMP_RET_ERRNO | u32::from(e),
        Action::KillProcess => SECCOMP_RET_KILL_PROCESS,
    };
    insn(BPF_RET_K, 0, 0, k)
}

/// Every namespace-creating clone flag.
pub const CLONE_NEW_ANY: u32 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWCGROUP) as u32
    | 0x80; // CLONE_NEWTIME

const EPERM: u16 = libc::EPERM as u16;
const ENOSYS: u16 = libc::ENOSYS as u16;
const EAFNOSUPPORT: u16 = libc::EAFNOSUPPORT as u16;
const EPROTONOSUPPORT: u16 = libc::EPROTONOSUPPORT as u16;

macro_rules! deny {
    ($name:ident, $why:expr) => {
        Rule {
            name: stringify!($name),
            nr: paste_nr!($name),
            checks: Vec::new(),
            action: Action::Errno(EPERM),
            why: $why,
        }
    };
}

macro_rules! paste_nr {
    (kexec_load) => {
        libc::SYS_kexec_load
    };
    (kexec_file_load) => {
        libc::SYS_kexec_file_load
    };
    (init_module) => {
        libc::SYS_init_module
    };
    (finit_module) => {
        libc::SYS_finit_module
    };
    (delete_module) => {
        libc::SYS_delete_module
    };
    (reboot) => {
        libc::SYS_reboot
    };
    (swapon) => {
        libc::SYS_swapon
    };
    (swapoff) => {
        libc::SYS_swapoff
    };
    (syslog) => {
        libc::SYS_syslog
    };
    (acct) => {
        libc::SYS_acct
    };
    (bpf) => {
        libc::SYS_bpf
    };
    (perf_event_open) => {
        libc::SYS_perf_event_open
    };
    (userfaultfd) => {
        libc::SYS_userfaultfd
    };
    (io_uring_setup) => {
        libc::SYS_io_uring_setup
    };
    (io_uring_enter) => {
        libc::SYS_io_uring_enter
    };
    (io_uring_register) => {
        libc::SYS_io_uring_register
    };
    (open_by_handle_at) => {
        libc::SYS_open_by_handle_at
    };
    (name_to_handle_at) => {
        libc::SYS_name_to_handle_at
    };
    (add_key) => {
        libc::SYS_add_key
    };
    (request_key) => {
        libc::SYS_request_key
    };
    (keyctl) => {
        libc::SYS_keyctl
    };
    (mount) => {
        libc::SYS_mount
    };
    (umount2) => {
        libc::SYS_umount2
    };
    (pivot_root) => {
        libc::SYS_pivot_root
    };
    (move_mount) => {
        libc::SYS_move_mount
    };
    (open_tree) => {
        libc::SYS_open_tree
    };
    (fsopen) => {
        libc::SYS_fsopen
    };
    (fsconfig) => {
        libc::SYS_fsconfig
    };
    (fsmount) => {
        libc::SYS_fsmount
    };
    (fspick) => {
        libc::SYS_fspick
    };
    (mount_setattr) => {
        libc::SYS_mount_setattr
    };
    (setns) => {
        libc::SYS_setns
    };
    (settimeofday) => {
        libc::SYS_settimeofday
    };
    (clock_settime) => {
        libc::SYS_clock_settime
    };
    (quotactl) => {
        libc::SYS_quotactl
    };
    (fanotify_init) => {
        libc::SYS_fanotify_init
    };
    (vhangup) => {
        libc::SYS_vhangup
    };
    (move_pages) => {
        libc::SYS_move_pages
    };
    (migrate_pages) => {
        libc::SYS_migrate_pages
    };
    (lookup_dcookie) => {
        libc::SYS_lookup_dcookie
    };
}

/// A value an allow-list admits, with the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowed {
    pub name: &'static str,
    pub value: u32,
    pub why: &'static str,
}

/// The socket families a sandbox may create; every other family is refused with
/// `EAFNOSUPPORT`, what a kernel built without it answers, so programs that probe for
/// one (libaudit, service managers) fall back as they would there. Among those refused:
/// `AF_VSOCK` (binds and connects to the host's vsock ports, whatever the sandbox's
/// network), `AF_PACKET` and `AF_XDP` (raw frames; also need `CAP_NET_RAW`), `AF_KEY`
/// (IPsec keys), `AF_ALG` (the kernel crypto API), `AF_BLUETOOTH`, `AF_TIPC`, `AF_RDS`,
/// `AF_CAN`, `AF_NFC`, `AF_LLC`, `AF_PPPOX`, `AF_AX25` and the other protocol stacks no
/// sandbox needs and whose kernel code has a long record of bugs reachable from a
/// plain `socket()`.
pub const SOCKET_FAMILIES: &[Allowed] = &[
    Allowed {
        name: "AF_UNIX",
        value: libc::AF_UNIX as u32,
        why: "local IPC between the sandbox's processes (abstract names are scoped by Landlock)",
    },
    Allowed {
        name: "AF_INET",
        value: libc::AF_INET as u32,
        why: "TCP and UDP (raw sockets still need CAP_NET_RAW, which sandboxes lack)",
    },
    Allowed {
        name: "AF_INET6",
        value: libc::AF_INET6 as u32,
        why: "TCP and UDP over IPv6 (loopback; slots drop IPv6 on the host side)",
    },
    Allowed {
        name: "AF_NETLINK",
        value: libc::AF_NETLINK as u32,
        why: "only the protocols in NETLINK_PROTOCOLS",
    },
];

/// The netlink protocols a sandbox may open; others are refused with
/// `EPROTONOSUPPORT`. Refused, notably: `NETLINK_GENERIC` (a multiplexer over dozens
/// of kernel subsystems), `NETLINK_NETFILTER`, `NETLINK_XFRM`, `NETLINK_AUDIT`
/// (libaudit treats the refusal as "no audit") and `NETLINK_KOBJECT_UEVENT`.
pub const NETLINK_PROTOCOLS: &[Allowed] = &[
    Allowed {
        name: "NETLINK_ROUTE",
        value: libc::NETLINK_ROUTE as u32,
        why: "addresses and routes of the sandbox's own namespace: getaddrinfo's AI_ADDRCONFIG, ip, ifconfig",
    },
    Allowed {
        name: "NETLINK_SOCK_DIAG",
        value: libc::NETLINK_SOCK_DIAG as u32,
        why: "ss and netstat listing the sandbox's own sockets",
    },
];

/// `socketpair` families: only `AF_UNIX` makes pairs among the allowed ones.
const SOCKETPAIR_FAMILIES: &[Allowed] = &[Allowed {
    name: "AF_UNIX",
    value: libc::AF_UNIX as u32,
    why: "the only family among SOCKET_FAMILIES that makes pairs",
}];

/// The sandbox's policy: Docker's deny decisions that still matter inside a user
/// namespace, refusing new namespaces and io_uring, and the socket family allow-list;
/// everything else is allowed.
pub fn default_policy() -> Policy {
    let mut rules = vec![
        deny!(kexec_load, "replaces the running kernel"),
        deny!(kexec_file_load, "replaces the running kernel"),
        deny!(init_module, "loads kernel code"),
        deny!(finit_module, "loads kernel code"),
        deny!(delete_module, "unloads kernel code"),
        deny!(
            reboot,
            "reboots the host (or the pid namespace: not the sandbox's call to make)"
        ),
        deny!(swapon, "changes host swap"),
        deny!(swapoff, "changes host swap"),
        deny!(syslog, "reads the kernel log, which leaks host addresses"),
        deny!(acct, "switches host process accounting"),
        deny!(
            bpf,
            "loads programs into the kernel; a large attack surface"
        ),
        deny!(
            perf_event_open,
            "observes the host and has a long CVE history"
        ),
        deny!(userfaultfd, "a classic primitive for kernel race exploits"),
        deny!(
            io_uring_setup,
            "bypasses seccomp for the operations it performs; large attack surface"
        ),
        deny!(io_uring_enter, "see io_uring_setup"),
        deny!(io_uring_register, "see io_uring_setup"),
        deny!(
            open_by_handle_at,
            "opens files by handle, escaping mount confinement (the 'shocker' escape)"
        ),
        deny!(name_to_handle_at, "companion of open_by_handle_at"),
        deny!(add_key, "kernel keyrings are not namespaced"),
        deny!(request_key, "kernel keyrings are not namespaced"),
        deny!(keyctl, "kernel keyrings are not namespaced"),
        deny!(
            mount,
            "the sandbox's mounts are declared at construction, never changed from inside"
        ),
        deny!(
            umount2,
            "unmounting could reveal what masks cover (e.g. /proc paths)"
        ),
        deny!(pivot_root, "see mount"),
        deny!(move_mount, "see mount (new mount API)"),
        deny!(open_tree, "see mount (new mount API)"),
        deny!(fsopen, "see mount (new mount API)"),
        deny!(fsconfig, "see mount (new mount API)"),
        deny!(fsmount, "see mount (new mount API)"),
        deny!(fspick, "see mount (new mount API)"),
        deny!(
            mount_setattr,
            "could clear read-only flags on the sandbox's mounts"
        ),
        deny!(setns, "joining other namespaces"),
        deny!(settimeofday, "the clock is the host's"),
        deny!(clock_settime, "the clock is the host's"),
        deny!(quotactl, "host filesystem quotas"),
        deny!(fanotify_init, "filesystem-wide monitoring"),
        deny!(vhangup, "terminal hang-up of the host's terminals"),
        deny!(move_pages, "moves other processes' pages across NUMA nodes"),
        deny!(
            migrate_pages,
            "moves other processes' pages across NUMA nodes"
        ),
        deny!(lookup_dcookie, "kernel profiling interface"),
    ];
    rules.push(Rule {
        name: "unshare",
        nr: libc::SYS_unshare,
        checks: vec![ArgCheck::AnyBits {
            arg: 0,
            mask: CLONE_NEW_ANY,
        }],
        action: Action::Errno(EPERM),
        why: "new namespaces (above all user namespaces) expose kernel code that is otherwise unreachable",
    });
    rules.push(Rule {
        name: "clone",
        nr: libc::SYS_clone,
        checks: vec![ArgCheck::AnyBits {
            arg: CLONE_FLAGS_ARG,
            mask: CLONE_NEW_ANY,
        }],
        action: Action::Errno(EPERM),
        why: "see unshare",
    });
    rules.push(Rule {
        name: "clone3",
        nr: libc::SYS_clone3,
        checks: Vec::new(),
        action: Action::Errno(ENOSYS),
        why: "its flags are behind a pointer seccomp cannot read; ENOSYS makes libc fall back to clone, which is filtered",
    });
    rules.push(Rule {
        name: "ioctl(TIOCSTI)",
        nr: libc::SYS_ioctl,
        checks: vec![ArgCheck::Equals {
            arg: 1,
            value: libc::TIOCSTI as u32,
        }],
        action: Action::Errno(EPERM),
        why: "injects input into a terminal",
    });
    rules.push(Rule {
        name: "ioctl(TIOCLINUX)",
        nr: libc::SYS_ioctl,
        checks: vec![ArgCheck::Equals {
            arg: 1,
            value: libc::TIOCLINUX as u32,
        }],
        action: Action::Errno(EPERM),
        why: "console selection can inject input",
    });
    rules.push(Rule {
        name: "socket(family)",
        nr: libc::SYS_socket,
        checks: vec![ArgCheck::NoneOf {
            arg: 0,
            allowed: SOCKET_FAMILIES,
        }],
        action: Action::Errno(EAFNOSUPPORT),
        why: "socket families are an allow-list (SOCKET_FAMILIES)",
    });
    rules.push(Rule {
        name: "socket(AF_NETLINK, protocol)",
        nr: libc::SYS_socket,
        checks: vec![
            ArgCheck::Equals {
                arg: 0,
                value: libc::AF_NETLINK as u32,
            },
            ArgCheck::NoneOf {
                arg: 2,
                allowed: NETLINK_PROTOCOLS,
            },
        ],
        action: Action::Errno(EPROTONOSUPPORT),
        why: "netlink protocols are an allow-list (NETLINK_PROTOCOLS)",
    });
    rules.push(Rule {
        name: "socketpair(family)",
        nr: libc::SYS_socketpair,
        checks: vec![ArgCheck::NoneOf {
            arg: 0,
            allowed: SOCKETPAIR_FAMILIES,
        }],
        action: Action::Errno(EAFNOSUPPORT),
        why: "pairs of any family but AF_UNIX reach the same code as socket()",
    });
    Policy {
        rules,
        default: Action::Allow,
    }
}

/// An unconditional allow rule.
fn allow(name: &'static str, nr: i64, why: &'static str) -> Rule {
    Rule {
        name,
        nr,
        checks: Vec::new(),
        action: Action::Allow,
        why,
    }
}

/// The `fcntl` commands the collection mount helper may use: no `F_SETOWN` or
/// `F_SETSIG`, which would have the kernel signal another process for it.
const HELPER_FCNTL: &[Allowed] = &[
    Allowed {
        name: "F_GETFD",
        value: libc::F_GETFD as u32,
        why: "the standard library checks close-on-exec",
    },
    Allowed {
        name: "F_SETFD",
        value: libc::F_SETFD as u32,
        why: "close-on-exec",
    },
    Allowed {
        name: "F_GETFL",
        value: libc::F_GETFL as u32,
        why: "status flags",
    },
    Allowed {
        name: "F_SETFL",
        value: libc::F_SETFL as u32,
        why: "non-blocking mode",
    },
    Allowed {
        name: "F_DUPFD_CLOEXEC",
        value: libc::F_DUPFD_CLOEXEC as u32,
        why: "duplicating a descriptor it holds",
    },
];

/// `prctl` options the helper may use.
const HELPER_PRCTL: &[Allowed] = &[Allowed {
    name: "PR_SET_NAME",
    value: libc::PR_SET_NAME as u32,
    why: "the serving threads name themselves (fuser-N)",
}];

/// The collection mount helper's policy (`sandlot __vfs-serve`), installed once its
/// FUSE mount is up and it is confined, before it loads its view and starts its
/// request threads: an allow-list of what that takes, measured with `strace -f`
/// on a helper serving `ls -R`, `find`, `grep -r`, `cat`, `stat`, `dd` and
/// Python's `os.walk` (reads of `/dev/fuse`, replies with `writev`, blobs opened
/// and read with `openat`/`pread64`, thread start-up, the stop-signal wait), plus
/// what paths the measurement did not take need: thread and process exit, the
/// allocator (`brk`, `mremap`, `madvise`), sleeps and clocks without the vDSO,
/// `getrandom`. Everything else is `EPERM`: no `socket`, `connect` or `socketpair`
/// (a path-named Unix socket, such as the daemon's operator socket, is reachable
/// from any network namespace), no `kill`, `ptrace`, `mount`, `unshare` or
/// `setns`, no `execve`.
pub fn fuse_helper_policy() -> Policy {
    let mut rules = vec![
        allow(
            "read",
            libc::SYS_read,
            "requests from /dev/fuse; blob and manifest contents",
        ),
        allow("write", libc::SYS_write, "replies; the log"),
        allow(
            "writev",
            libc::SYS_writev,
            "replies to /dev/fuse (header and payload)",
        ),
        allow("pread64", libc::SYS_pread64, "a byte range of a blob"),
        allow(
            "openat",
            libc::SYS_openat,
            "blobs and the manifest (Landlock: the collection's directory only, read-only)",
        ),
        allow("close", libc::SYS_close, "descriptors it opened"),
        allow("statx", libc::SYS_statx, "sizes of the files it opened"),
        allow(
            "fstat",
            libc::SYS_fstat,
            "as statx, through older library paths",
        ),
        allow(
            "newfstatat",
            libc::SYS_newfstatat,
            "as statx, through older library paths",
        ),
        allow("lseek", libc::SYS_lseek, "file offsets"),
        allow(
            "dup3",
            libc::SYS_dup3,
            "standard output to /dev/null once answered",
        ),
        allow("mmap", libc::SYS_mmap, "memory and thread stacks"),
        allow("munmap", libc::SYS_munmap, "memory"),
        allow("mprotect", libc::SYS_mprotect, "stack guard pages"),
        allow("mremap", libc::SYS_mremap, "the allocator growing a buffer"),
        allow("brk", libc::SYS_brk, "the allocator"),
        allow(
            "madvise",
            libc::SYS_madvise,
            "the allocator and exiting threads give memory back",
        ),
        allow(
            "futex",
            libc::SYS_futex,
            "locks between the request threads",
        ),
        allow(
            "set_robust_list",
            libc::SYS_set_robust_list,
            "thread start-up",
        ),
        allow("rseq", libc::SYS_rseq, "thread start-up"),
        allow(
            "sigaltstack",
            libc::SYS_sigaltstack,
            "thread start-up (stack overflow reports)",
        ),
        allow(
            "sched_getaffinity",
            libc::SYS_sched_getaffinity,
            "thread start-up",
        ),
        allow("sched_yield", libc::SYS_sched_yield, "spinning locks"),
        allow("gettid", libc::SYS_gettid, "thread identity"),
        allow("getpid", libc::SYS_getpid, "process identity"),
        allow(
            "rt_sigaction",
            libc::SYS_rt_sigaction,
            "the threading library's own signals",
        ),
        allow(
            "rt_sigprocmask",
            libc::SYS_rt_sigprocmask,
            "the stop signals stay blocked",
        ),
        allow(
            "rt_sigtimedwait",
            libc::SYS_rt_sigtimedwait,
            "waiting for a stop signal",
        ),
        allow(
            "rt_sigreturn",
            libc::SYS_rt_sigreturn,
            "returning from a signal handler",
        ),
        allow(
            "restart_syscall",
            libc::SYS_restart_syscall,
            "a wait interrupted by a stop",
        ),
        allow(
            "clock_gettime",
            libc::SYS_clock_gettime,
            "time, where the vDSO is missing",
        ),
        allow(
            "gettimeofday",
            libc::SYS_gettimeofday,
            "time, where the vDSO is missing",
        ),
        allow("clock_nanosleep", libc::SYS_clock_nanosleep, "sleeps"),
        allow("nanosleep", libc::SYS_nanosleep, "sleeps"),
        allow("getrandom", libc::SYS_getrandom, "hash map keys"),
        allow("exit", libc::SYS_exit, "a thread ends"),
        allow("exit_group", libc::SYS_exit_group, "the helper ends"),
    ];
    #[cfg(target_arch = "x86_64")]
    rules.push(allow(
        "dup2",
        libc::SYS_dup2,
        "standard output to /dev/null once answered",
    ));
    rules.push(Rule {
        name: "fcntl(command)",
        nr: libc::SYS_fcntl,
        checks: vec![ArgCheck::NoneOf {
            arg: 1,
            allowed: HELPER_FCNTL,
        }],
        action: Action::Errno(EPERM),
        why: "fcntl commands are an allow-list (HELPER_FCNTL)",
    });
    rules.push(allow("fcntl", libc::SYS_fcntl, "HELPER_FCNTL"));
    rules.push(Rule {
        name: "prctl(option)",
        nr: libc::SYS_prctl,
        checks: vec![ArgCheck::NoneOf {
            arg: 0,
            allowed: HELPER_PRCTL,
        }],
        action: Action::Errno(EPERM),
        why: "prctl options are an allow-list (HELPER_PRCTL)",
    });
    rules.push(allow("prctl", libc::SYS_prctl, "HELPER_PRCTL"));
    rules.push(Rule {
        name: "clone3",
        nr: libc::SYS_clone3,
        checks: Vec::new(),
        action: Action::Errno(ENOSYS),
        why: "its flags are behind a pointer; the threading library falls back to clone",
    });
    rules.push(Rule {
        name: "clone(CLONE_NEW*)",
        nr: libc::SYS_clone,
        checks: vec![ArgCheck::AnyBits {
            arg: CLONE_FLAGS_ARG,
            mask: CLONE_NEW_ANY,
        }],
        action: Action::Errno(EPERM),
        why: "no namespaces of its own (a user namespace would give it capabilities there)",
    });
    rules.push(allow("clone", libc::SYS_clone, "the request threads"));
    Policy {
        rules,
        default: Action::Errno(EPERM),
    }
}

/// The flags argument of `clone` (argument 0 on x86_64 and aarch64).
const CLONE_FLAGS_ARG: u8 = 0;

/// Where a jump of a rule's block goes: the next instruction, or past the rule
/// (reloading the syscall number its checks replaced in the accumulator).
#[derive(Clone, Copy)]
enum Jump {
    Next,
    NoMatch,
}

/// How many syscall numbers a leaf of the search tree tests one after another.
const LEAF_NUMBERS: usize = 4;

/// Compiles a policy to BPF: check the architecture (kill on mismatch), refuse x32
/// syscalls, then find the syscall number's rules by a binary search over the
/// numbers the policy names, run them in order, and the default action.
///
/// Rules of different numbers never meet (each begins by testing its number), so
/// grouping them by number, in their order within a number, decides every call as
/// the list in order would. The search matters at install: the kernel's cache of
/// always-allowed calls emulates the filter once per system call number, and a
/// list searched in order makes that the longest part of a sandbox's `prctl`.
pub fn compile(policy: &Policy) -> Result<Vec<Insn>, SeccompError> {
    let mut numbers: std::collections::BTreeMap<u32, Vec<&Rule>> = Default::default();
    for r in &policy.rules {
        let nr = u32::try_from(r.nr)
            .map_err(|_| SeccompError::Compile(format!("bad syscall number for {}", r.name)))?;
        numbers.entry(nr).or_default().push(r);
    }
    let groups: Vec<(u32, Vec<&Rule>)> = numbers.into_iter().collect();
    let mut p = prefix();
    p.extend(search(&groups, policy.default)?);
    finish(p)
}

/// The same filter as one list searched in order, the plain reading of "the first
/// matching rule decides": what [`compile`] is tested and measured against
/// (`cargo bench -p sandlot-runtime --bench seccomp`).
pub fn compile_as_list(policy: &Policy) -> Result<Vec<Insn>, SeccompError> {
    let mut p = prefix();
    p.extend(in_order(policy.rules.iter(), policy.default)?);
    finish(p)
}

/// The checks every filter starts with, leaving the syscall number in the
/// accumulator.
fn prefix() -> Vec<Insn> {
    let mut p = vec![
        insn(BPF_LD_W_ABS, 0, 0, OFF_ARCH),
        insn(BPF_JEQ_K, 1, 0, AUDIT_ARCH),
        ret(Action::KillProcess),
        insn(BPF_LD_W_ABS, 0, 0, OFF_NR),
    ];
    #[cfg(target_arch = "x86_64")]
    {
        p.push(insn(BPF_JGE_K, 0, 1, X32_SYSCALL_BIT));
        p.push(ret(Action::Errno(ENOSYS)));
    }
    p
}

fn finish(p: Vec<Insn>) -> Result<Vec<Insn>, SeccompError> {
    if p.len() > 4096 {
        return Err(SeccompError::Compile(
            "filter longer than 4096 instructions".into(),
        ));
    }
    Ok(p)
}

/// A binary search over `groups` (sorted by number; the accumulator holds the
/// syscall number): one `JGE` per level, the last few numbers' rules in order, then
/// `default`.
fn search(groups: &[(u32, Vec<&Rule>)], default: Action) -> Result<Vec<Insn>, SeccompError> {
    if groups.len() <= LEAF_NUMBERS {
        return in_order(
            groups.iter().flat_map(|(_, rules)| rules.iter().copied()),
            default,
        );
    }
    let mid = groups.len() / 2;
    let (left, right) = (
        search(&groups[..mid], default)?,
        search(&groups[mid..], default)?,
    );
    let pivot = groups[mid].0;
    let mut p = Vec::with_capacity(2 + left.len() + right.len());
    match u8::try_from(left.len()) {
        // At or above the pivot: past the lower half.
        Ok(skip) => p.push(insn(BPF_JGE_K, skip, 0, pivot)),
        // Too far for a conditional jump: through an unconditional one.
        Err(_) => {
            p.push(insn(BPF_JGE_K, 0, 1, pivot));
            let skip = u32::try_from(left.len())
                .map_err(|_| SeccompError::Compile("filter too long".into()))?;
            p.push(insn(BPF_JA, 0, 0, skip));
        }
    }
    p.extend(left);
    p.extend(right);
    Ok(p)
}

/// `rules` one after another, each testing its number first, then `default`.
fn in_order<'a>(
    rules: impl Iterator<Item = &'a Rule>,
    default: Action,
) -> Result<Vec<Insn>, SeccompError> {
    let mut p = Vec::new();
    for r in rules {
        let nr = u32::try_from(r.nr)
            .map_err(|_| SeccompError::Compile(format!("bad syscall number for {}", r.name)))?;
        if r.checks.is_empty() {
            p.push(insn(BPF_JEQ_K, 0, 1, nr));
            p.push(ret(r.action));
            continue;
        }
        // The block after the syscall number matched: each check loads its argument
        // and jumps to the reload at the end when it does not match.
        let mut block: Vec<(u16, Jump, Jump, u32)> = Vec::new();
        for check in &r.checks {
            let arg = match *check {
                ArgCheck::AnyBits { arg, .. }
                | ArgCheck::Equals { arg, .. }
                | ArgCheck::NoneOf { arg, .. } => arg,
            };
            if arg > 5 {
                return Err(SeccompError::Compile(format!(
                    "argument {arg} out of range for {}",
                    r.name
                )));
            }
            // Low 32 bits of the argument (little-endian layout).
            let off = OFF_ARGS + 8 * u32::from(arg);
            block.push((BPF_LD_W_ABS, Jump::Next, Jump::Next, off));
            match *check {
                ArgCheck::AnyBits { mask, .. } => {
                    block.push((BPF_JSET_K, Jump::Next, Jump::NoMatch, mask))
                }
                ArgCheck::Equals { value, .. } => {
                    block.push((BPF_JEQ_K, Jump::Next, Jump::NoMatch, value))
                }
                ArgCheck::NoneOf { allowed, .. } => {
                    for a in allowed {
                        block.push((BPF_JEQ_K, Jump::NoMatch, Jump::Next, a.value));
                    }
                }
            }
        }
        // The matched action, then the reload every non-match jumps to.
        let reload = block.len() + 1;
        let skip = u8::try_from(reload + 1)
            .map_err(|_| SeccompError::Compile(format!("rule {} is too long", r.name)))?;
        p.push(insn(BPF_JEQ_K, 0, skip, nr));
        for (i, (code, jt, jf, k)) in block.into_iter().enumerate() {
            let off = |j: Jump| match j {
                Jump::Next => Ok(0),
                Jump::NoMatch => u8::try_from(reload - i - 1)
                    .map_err(|_| SeccompError::Compile(format!("rule {} is too long", r.name))),
            };
            p.push(insn(code, off(jt)?, off(jf)?, k));
        }
        p.push(ret(r.action));
        p.push(insn(BPF_LD_W_ABS, 0, 0, OFF_NR));
    }
    p.push(ret(default));
    Ok(p)
}

/// Sets `no_new_privs` and installs `prog` for the calling thread (the sandbox init is
/// single-threaded, so this covers every process it will start).
pub fn install(prog: &[Insn]) -> Result<(), SeccompError> {
    crate::sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0).map_err(SeccompError::Install)?;
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `Insn` has the layout of `struct sock_filter`; `fprog` points into
    // `prog`, which outlives the call; the kernel copies the program.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER as libc::c_ulong,
            &fprog as *const libc::sock_fprog,
        )
    };
    if r != 0 {
        return Err(SeccompError::Install(io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny classic-BPF interpreter, enough to run our filters in unit tests.
    fn run(prog: &[Insn], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        run_counted(prog, arch, nr, args).0
    }

    /// The filter's answer and how many instructions it ran to reach it.
    fn run_counted(prog: &[Insn], arch: u32, nr: u32, args: [u64; 6]) -> (u32, usize) {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        let mut acc = 0u32;
        let mut pc = 0usize;
        let mut steps = 0;
        loop {
            let i = prog[pc];
            steps += 1;
            match i.code {
                BPF_LD_W_ABS => {
                    let o = i.k as usize;
                    acc = u32::from_le_bytes(data[o..o + 4].try_into().unwrap());
                    pc += 1;
                }
                BPF_JEQ_K | BPF_JGE_K | BPF_JSET_K => {
                    let t = match i.code {
                        BPF_JEQ_K => acc == i.k,
                        BPF_JGE_K => acc >= i.k,
                        _ => acc & i.k != 0,
                    };
                    pc += 1 + usize::from(if t { i.jt } else { i.jf });
                }
                BPF_JA => pc += 1 + i.k as usize,
                BPF_RET_K => return (i.k, steps),
                c => panic!("unexpected opcode {c:#x}"),
            }
        }
    }

    fn prog() -> Vec<Insn> {
        compile(&default_policy()).unwrap()
    }

    fn in_list_order(policy: &Policy) -> Vec<Insn> {
        compile_as_list(policy).unwrap()
    }

    /// Argument vectors that reach every branch of `policy`'s checks: each value a
    /// check names, in its argument, alone and with a neighbour's bits.
    fn probing_args(policy: &Policy) -> Vec<[u64; 6]> {
        let mut v = vec![[0; 6], [u64::MAX; 6]];
        for r in &policy.rules {
            // Per check: its argument and the values that match it or just miss.
            let per_check: Vec<(usize, Vec<u64>)> = r
                .checks
                .iter()
                .map(|c| {
                    let (arg, values): (u8, Vec<u32>) = match *c {
                        ArgCheck::AnyBits { arg, mask, .. } => {
                            (arg, vec![mask, mask & mask.wrapping_neg(), !mask])
                        }
                        ArgCheck::Equals { arg, value, .. } => (arg, vec![value]),
                        ArgCheck::NoneOf { arg, allowed, .. } => {
                            (arg, allowed.iter().map(|a| a.value).collect())
                        }
                    };
                    let near = values
                        .iter()
                        .flat_map(|&x| [x, x ^ 1, x.wrapping_add(1)])
                        .map(u64::from)
                        .collect();
                    (usize::from(arg), near)
                })
                .collect();
            // Every combination across the rule's checks, so a rule with two
            // checks is reached past its first (an `AF_NETLINK` socket with a
            // protocol outside the list).
            let mut combos = vec![[0u64; 6]];
            for (arg, values) in &per_check {
                combos = combos
                    .iter()
                    .flat_map(|c| {
                        values.iter().map(move |&x| {
                            let mut c = *c;
                            c[*arg] = x;
                            c
                        })
                    })
                    .collect();
            }
            v.extend(combos);
        }
        v
    }

    #[test]
    fn the_search_tree_decides_every_call_as_the_rules_in_order_would() {
        for (name, policy) in [
            ("sandbox", default_policy()),
            ("fuse helper", fuse_helper_policy()),
        ] {
            let (tree, list) = (compile(&policy).unwrap(), in_list_order(&policy));
            assert_ne!(tree, list, "{name}: the filter is not a list");
            let args = probing_args(&policy);
            let numbers = (0..1100u32).chain([0x4000_0000, 0x4000_0001, u32::MAX, 0x7fff_ffff]);
            for nr in numbers {
                for a in &args {
                    for arch in [AUDIT_ARCH, 0x4000_0003] {
                        assert_eq!(
                            run(&tree, arch, nr, *a),
                            run(&list, arch, nr, *a),
                            "{name}: nr {nr} args {a:x?} arch {arch:#x}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_call_is_decided_in_a_few_steps_not_a_walk_of_every_rule() {
        let (tree, list) = (prog(), in_list_order(&default_policy()));
        // What the kernel's cache of always-allowed calls runs at install: every
        // number once.
        let total = |p: &[Insn]| -> usize {
            (0..600u32)
                .map(|nr| run_counted(p, AUDIT_ARCH, nr, [0; 6]).1)
                .sum()
        };
        let (tree_steps, list_steps) = (total(&tree), total(&list));
        assert!(
            tree_steps * 3 < list_steps,
            "the search runs {tree_steps} steps over 600 numbers, the list {list_steps}"
        );
    }

    /// Every even number below 1,200 refused, the rest allowed: 600 numbers, each
    /// its own rule, so subtrees past 255 instructions need the unconditional jump.
    fn even_numbers_refused() -> Vec<Insn> {
        let rules = (0..600i64)
            .map(|n| Rule {
                name: "many",
                nr: n * 2,
                checks: vec![],
                action: Action::Errno(EPERM),
                why: "test",
            })
            .collect();
        let p = compile(&Policy {
            rules,
            default: Action::Allow,
        })
        .unwrap();
        assert!(
            p.iter().any(|i| i.code == BPF_JA),
            "no long jump in {} instructions",
            p.len()
        );
        p
    }

    #[test]
    fn a_filter_longer_than_a_conditional_jump_reaches_every_rule() {
        let p = even_numbers_refused();
        for nr in 0..1300u32 {
            let want = if nr % 2 == 0 && nr < 1200 {
                DENY
            } else {
                SECCOMP_RET_ALLOW
            };
            assert_eq!(run(&p, AUDIT_ARCH, nr, [0; 6]), want, "nr {nr}");
        }
    }

    /// The kernel takes the long jump as the interpreter does: a filter with one,
    /// installed in a forked child, refuses an even number and lets an odd one
    /// through. Needs no privilege (`no_new_privs` comes first).
    #[test]
    fn the_kernel_accepts_and_obeys_a_filter_with_a_long_jump() {
        let p = even_numbers_refused();
        // getppid (110) is even, getpid (39), write (1) and exit_group (231) odd.
        assert_eq!((libc::SYS_getppid % 2, libc::SYS_getpid % 2), (0, 1));
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child makes raw system calls only (no allocation, no lock)
        // and ends with `_exit`, so the test harness's other threads cannot matter.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: as above; `fds[1]` is the pipe's write end.
            unsafe {
                let installed = install(&p).is_ok();
                let ppid = libc::syscall(libc::SYS_getppid);
                let errno = *libc::__errno_location();
                let me = libc::syscall(libc::SYS_getpid);
                let out = [installed as i64, ppid, i64::from(errno), me];
                libc::write(fds[1], out.as_ptr().cast(), std::mem::size_of_val(&out));
                libc::_exit(0)
            }
        }
        let mut out = [0i64; 4];
        // SAFETY: reads into `out`, waits for the child once, closes both ends once.
        let n = unsafe {
            libc::close(fds[1]);
            let n = libc::read(fds[0], out.as_mut_ptr().cast(), std::mem::size_of_val(&out));
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            libc::close(fds[0]);
            n
        };
        assert_eq!(n, 32, "the child reported nothing");
        assert_eq!(out[0], 1, "the kernel refused the filter");
        assert_eq!(
            (out[1], out[2]),
            (-1, i64::from(libc::EPERM)),
            "getppid got through"
        );
        assert_eq!(out[3], i64::from(pid), "getpid was refused");
    }

    const DENY: u32 = SECCOMP_RET_ERRNO | libc::EPERM as u32;

    #[test]
    fn allows_ordinary_syscalls() {
        let p = prog();
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_execve,
            libc::SYS_ptrace,
        ] {
            assert_eq!(
                run(&p, AUDIT_ARCH, nr as u32, [0; 6]),
                SECCOMP_RET_ALLOW,
                "nr {nr}"
            );
        }
    }

    #[test]
    fn refuses_dangerous_syscalls() {
        let p = prog();
        for nr in [
            libc::SYS_kexec_load,
            libc::SYS_init_module,
            libc::SYS_finit_module,
            libc::SYS_bpf,
            libc::SYS_mount,
            libc::SYS_keyctl,
            libc::SYS_open_by_handle_at,
            libc::SYS_setns,
            libc::SYS_io_uring_setup,
        ] {
            assert_eq!(run(&p, AUDIT_ARCH, nr as u32, [0; 6]), DENY, "nr {nr}");
        }
    }

    #[test]
    fn refuses_namespace_flags_only() {
        let p = prog();
        let unshare = libc::SYS_unshare as u32;
        assert_eq!(
            run(
                &p,
                AUDIT_ARCH,
                unshare,
                [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0]
            ),
            DENY
        );
        assert_eq!(
            run(
                &p,
                AUDIT_ARCH,
                unshare,
                [libc::CLONE_NEWNET as u64, 0, 0, 0, 0, 0]
            ),
            DENY
        );
        // CLONE_FILES alone is harmless.
        assert_eq!(
            run(
                &p,
                AUDIT_ARCH,
                unshare,
                [libc::CLONE_FILES as u64, 0, 0, 0, 0, 0]
            ),
            SECCOMP_RET_ALLOW
        );
        let clone = libc::SYS_clone as u32;
        let thread = (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_SIGHAND) as u64;
        assert_eq!(
            run(&p, AUDIT_ARCH, clone, [thread, 0, 0, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        );
        assert_eq!(
            run(
                &p,
                AUDIT_ARCH,
                clone,
                [thread | libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0]
            ),
            DENY
        );
        assert_eq!(
            run(&p, AUDIT_ARCH, libc::SYS_clone3 as u32, [0; 6]),
            SECCOMP_RET_ERRNO | libc::ENOSYS as u32
        );
    }

    #[test]
    // The ioctl numbers' type differs between architectures.
    #[allow(clippy::unnecessary_cast)]
    fn refuses_tiocsti_but_not_other_ioctls() {
        let p = prog();
        let ioctl = libc::SYS_ioctl as u32;
        assert_eq!(
            run(&p, AUDIT_ARCH, ioctl, [0, libc::TIOCSTI as u64, 0, 0, 0, 0]),
            DENY
        );
        assert_eq!(
            run(
                &p,
                AUDIT_ARCH,
                ioctl,
                [0, libc::TIOCGWINSZ as u64, 0, 0, 0, 0]
            ),
            SECCOMP_RET_ALLOW
        );
    }

    #[test]
    fn kills_on_foreign_arch() {
        let p = prog();
        assert_eq!(run(&p, 0x4000_0003, 0, [0; 6]), SECCOMP_RET_KILL_PROCESS);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn refuses_x32_abi() {
        let p = prog();
        let x32_mount = X32_SYSCALL_BIT | libc::SYS_mount as u32;
        assert_eq!(
            run(&p, AUDIT_ARCH, x32_mount, [0; 6]),
            SECCOMP_RET_ERRNO | libc::ENOSYS as u32
        );
    }

    const NO_FAMILY: u32 = SECCOMP_RET_ERRNO | libc::EAFNOSUPPORT as u32;

    #[test]
    fn socket_families_are_an_allow_list() {
        let p = prog();
        let socket = libc::SYS_socket as u32;
        let stream = libc::SOCK_STREAM as u64 | libc::SOCK_CLOEXEC as u64;
        for fam in [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6] {
            assert_eq!(
                run(&p, AUDIT_ARCH, socket, [fam as u64, stream, 0, 0, 0, 0]),
                SECCOMP_RET_ALLOW,
                "family {fam}"
            );
        }
        for fam in [
            libc::AF_VSOCK,
            libc::AF_PACKET,
            libc::AF_KEY,
            libc::AF_ALG,
            libc::AF_BLUETOOTH,
            libc::AF_TIPC,
            libc::AF_RDS,
            libc::AF_XDP,
            libc::AF_CAN,
            libc::AF_NFC,
            libc::AF_LLC,
            libc::AF_PPPOX,
            libc::AF_AX25,
            libc::AF_APPLETALK,
            libc::AF_X25,
            libc::AF_PHONET,
            libc::AF_IEEE802154,
            libc::AF_ISDN,
            libc::AF_NETROM,
            libc::AF_ROSE,
            libc::AF_ATMPVC,
            libc::AF_IPX,
            libc::AF_IUCV,
            libc::AF_RXRPC,
            libc::AF_CAIF,
            libc::AF_MPLS,
            44, // AF_XDP where libc lacks it
            45, // AF_MCTP
            46, // one past the kernel's families today
            0,  // AF_UNSPEC
        ] {
            assert_eq!(
                run(&p, AUDIT_ARCH, socket, [fam as u64, stream, 0, 0, 0, 0]),
                NO_FAMILY,
                "family {fam}"
            );
        }
    }

    #[test]
    fn netlink_protocols_are_an_allow_list() {
        let p = prog();
        let socket = libc::SYS_socket as u32;
        let nl = libc::AF_NETLINK as u64;
        let raw = libc::SOCK_RAW as u64;
        for proto in [libc::NETLINK_ROUTE, libc::NETLINK_SOCK_DIAG] {
            assert_eq!(
                run(&p, AUDIT_ARCH, socket, [nl, raw, proto as u64, 0, 0, 0]),
                SECCOMP_RET_ALLOW,
                "protocol {proto}"
            );
        }
        for proto in [
            libc::NETLINK_GENERIC,
            libc::NETLINK_NETFILTER,
            libc::NETLINK_XFRM,
            libc::NETLINK_AUDIT,
            libc::NETLINK_KOBJECT_UEVENT,
            libc::NETLINK_CRYPTO,
            libc::NETLINK_RDMA,
        ] {
            assert_eq!(
                run(&p, AUDIT_ARCH, socket, [nl, raw, proto as u64, 0, 0, 0]),
                SECCOMP_RET_ERRNO | libc::EPROTONOSUPPORT as u32,
                "protocol {proto}"
            );
        }
        // The protocol argument only matters for netlink.
        assert_eq!(
            run(
                &p,
                AUDIT_ARCH,
                socket,
                [
                    libc::AF_INET as u64,
                    raw,
                    libc::NETLINK_GENERIC as u64,
                    0,
                    0,
                    0
                ]
            ),
            SECCOMP_RET_ALLOW
        );
    }

    #[test]
    fn socketpair_is_unix_only() {
        let p = prog();
        let pair = libc::SYS_socketpair as u32;
        let stream = libc::SOCK_STREAM as u64;
        assert_eq!(
            run(
                &p,
                AUDIT_ARCH,
                pair,
                [libc::AF_UNIX as u64, stream, 0, 0, 0, 0]
            ),
            SECCOMP_RET_ALLOW
        );
        for fam in [libc::AF_TIPC, libc::AF_VSOCK, libc::AF_INET] {
            assert_eq!(
                run(&p, AUDIT_ARCH, pair, [fam as u64, stream, 0, 0, 0, 0]),
                NO_FAMILY,
                "family {fam}"
            );
        }
    }

    #[test]
    fn an_allow_list_policy_refuses_everything_else() {
        let policy = Policy {
            rules: vec![Rule {
                name: "read",
                nr: libc::SYS_read,
                checks: Vec::new(),
                action: Action::Allow,
                why: "test",
            }],
            default: Action::Errno(EPERM),
        };
        let p = compile(&policy).unwrap();
        assert_eq!(
            run(&p, AUDIT_ARCH, libc::SYS_read as u32, [0; 6]),
            SECCOMP_RET_ALLOW
        );
        assert_eq!(run(&p, AUDIT_ARCH, libc::SYS_write as u32, [0; 6]), DENY);
    }

    #[test]
    fn the_fuse_helper_may_serve_and_nothing_more() {
        let p = compile(&fuse_helper_policy()).unwrap();
        let ok = |nr: i64, args: [u64; 6]| run(&p, AUDIT_ARCH, nr as u32, args);
        for nr in [
            libc::SYS_read,
            libc::SYS_writev,
            libc::SYS_pread64,
            libc::SYS_openat,
            libc::SYS_futex,
            libc::SYS_rt_sigtimedwait,
            libc::SYS_exit_group,
        ] {
            assert_eq!(ok(nr, [0; 6]), SECCOMP_RET_ALLOW, "nr {nr}");
        }
        // Sockets (a path-named Unix socket is reachable from any network
        // namespace), signals, processes, namespaces, mounts: refused.
        for nr in [
            libc::SYS_socket,
            libc::SYS_socketpair,
            libc::SYS_connect,
            libc::SYS_sendmsg,
            libc::SYS_kill,
            libc::SYS_tgkill,
            libc::SYS_ptrace,
            libc::SYS_execve,
            libc::SYS_unshare,
            libc::SYS_setns,
            libc::SYS_mount,
            libc::SYS_umount2,
            libc::SYS_ioctl,
            libc::SYS_bpf,
            libc::SYS_io_uring_setup,
        ] {
            assert_eq!(ok(nr, [0; 6]), DENY, "nr {nr}");
        }
        // Threads, but no namespaces; clone3 is answered ENOSYS (libc falls back).
        let thread = (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_SIGHAND) as u64;
        assert_eq!(
            ok(libc::SYS_clone, [thread, 0, 0, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        );
        assert_eq!(
            ok(
                libc::SYS_clone,
                [thread | libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0]
            ),
            DENY
        );
        assert_eq!(
            ok(libc::SYS_clone3, [0; 6]),
            SECCOMP_RET_ERRNO | libc::ENOSYS as u32
        );
        // fcntl and prctl: the listed commands only.
        let fcntl = |cmd: i32| ok(libc::SYS_fcntl, [3, cmd as u64, 0, 0, 0, 0]);
        assert_eq!(fcntl(libc::F_GETFD), SECCOMP_RET_ALLOW);
        assert_eq!(fcntl(libc::F_SETOWN), DENY);
        assert_eq!(fcntl(10), DENY); // F_SETSIG
        let prctl = |opt: i32| ok(libc::SYS_prctl, [opt as u64, 0, 0, 0, 0, 0]);
        assert_eq!(prctl(libc::PR_SET_NAME), SECCOMP_RET_ALLOW);
        assert_eq!(prctl(libc::PR_SET_DUMPABLE), DENY);
        assert_eq!(prctl(libc::PR_CAP_AMBIENT), DENY);
        // Foreign architectures are killed as in the sandbox's filter.
        assert_eq!(run(&p, 0x4000_0003, 0, [0; 6]), SECCOMP_RET_KILL_PROCESS);
    }

    #[test]
    fn every_rule_has_a_reason() {
        for r in fuse_helper_policy().rules {
            assert!(!r.why.is_empty(), "{} has no reason", r.name);
        }
        for a in SOCKET_FAMILIES.iter().chain(NETLINK_PROTOCOLS) {
            assert!(!a.why.is_empty(), "{} has no reason", a.name);
        }
        for r in default_policy().rules {
            assert!(!r.why.is_empty(), "{} has no reason", r.name);
        }
    }
}
