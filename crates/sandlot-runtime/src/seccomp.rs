//! The seccomp filter: a policy as data, compiled to classic BPF, installed in one place.
//!
//! The policy is a deny list modelled on Docker's default profile, adapted to a sandbox
//! whose root is already confined to its own user namespace. Each entry carries the
//! reason it is refused; `docs/threat-model.md` repeats them. Compilation is pure and
//! unit-tested without root.

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
}

/// One entry of the deny list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub name: &'static str,
    pub nr: i64,
    pub check: Option<ArgCheck>,
    pub action: Action,
    pub why: &'static str,
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

macro_rules! deny {
    ($name:ident, $why:expr) => {
        Rule {
            name: stringify!($name),
            nr: paste_nr!($name),
            check: None,
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

/// The default policy: Docker's deny decisions that still matter inside a user
/// namespace, plus refusing new namespaces and io_uring.
pub fn default_policy() -> Vec<Rule> {
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
        check: Some(ArgCheck::AnyBits {
            arg: 0,
            mask: CLONE_NEW_ANY,
        }),
        action: Action::Errno(EPERM),
        why: "new namespaces (above all user namespaces) expose kernel code that is otherwise unreachable",
    });
    rules.push(Rule {
        name: "clone",
        nr: libc::SYS_clone,
        check: Some(ArgCheck::AnyBits {
            arg: CLONE_FLAGS_ARG,
            mask: CLONE_NEW_ANY,
        }),
        action: Action::Errno(EPERM),
        why: "see unshare",
    });
    rules.push(Rule {
        name: "clone3",
        nr: libc::SYS_clone3,
        check: None,
        action: Action::Errno(ENOSYS),
        why: "its flags are behind a pointer seccomp cannot read; ENOSYS makes libc fall back to clone, which is filtered",
    });
    rules.push(Rule {
        name: "ioctl(TIOCSTI)",
        nr: libc::SYS_ioctl,
        check: Some(ArgCheck::Equals {
            arg: 1,
            value: libc::TIOCSTI as u32,
        }),
        action: Action::Errno(EPERM),
        why: "injects input into a terminal",
    });
    rules.push(Rule {
        name: "ioctl(TIOCLINUX)",
        nr: libc::SYS_ioctl,
        check: Some(ArgCheck::Equals {
            arg: 1,
            value: libc::TIOCLINUX as u32,
        }),
        action: Action::Errno(EPERM),
        why: "console selection can inject input",
    });
    rules
}

/// The flags argument of `clone` (argument 0 on x86_64 and aarch64).
const CLONE_FLAGS_ARG: u8 = 0;

/// Compiles a deny list to BPF: check the architecture (kill on mismatch), refuse
/// x32 syscalls, then one block per rule, and allow the rest.
pub fn compile(rules: &[Rule]) -> Result<Vec<Insn>, SeccompError> {
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
    for r in rules {
        let nr = u32::try_from(r.nr)
            .map_err(|_| SeccompError::Compile(format!("bad syscall number for {}", r.name)))?;
        match r.check {
            None => {
                p.push(insn(BPF_JEQ_K, 0, 1, nr));
                p.push(ret(r.action));
            }
            Some(check) => {
                let (arg, op, k) = match check {
                    ArgCheck::AnyBits { arg, mask } => (arg, BPF_JSET_K, mask),
                    ArgCheck::Equals { arg, value } => (arg, BPF_JEQ_K, value),
                };
                if arg > 5 {
                    return Err(SeccompError::Compile(format!(
                        "argument {arg} out of range for {}",
                        r.name
                    )));
                }
                // Low 32 bits of the argument (little-endian layout).
                let off = OFF_ARGS + 8 * u32::from(arg);
                p.push(insn(BPF_JEQ_K, 0, 4, nr));
                p.push(insn(BPF_LD_W_ABS, 0, 0, off));
                p.push(insn(op, 0, 1, k));
                p.push(ret(r.action));
                p.push(insn(BPF_LD_W_ABS, 0, 0, OFF_NR));
            }
        }
    }
    p.push(ret(Action::Allow));
    if p.len() > 4096 {
        return Err(SeccompError::Compile(
            "filter longer than 4096 instructions".into(),
        ));
    }
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
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        let mut acc = 0u32;
        let mut pc = 0usize;
        loop {
            let i = prog[pc];
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
                BPF_RET_K => return i.k,
                c => panic!("unexpected opcode {c:#x}"),
            }
        }
    }

    fn prog() -> Vec<Insn> {
        compile(&default_policy()).unwrap()
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

    #[test]
    fn every_rule_has_a_reason() {
        for r in default_policy() {
            assert!(!r.why.is_empty(), "{} has no reason", r.name);
        }
    }
}
