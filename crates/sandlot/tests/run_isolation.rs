//! Privileged end-to-end tests of `sandlot run`: isolation and security boundaries.
//! Each test runs the real binary as root and asserts the sandbox left nothing behind.

mod common;

use common::*;
use std::os::unix::process::CommandExt;

/// `sandlot run`'s flag for the gVisor backend: the tests taking an isolation run
/// on both.
const GVISOR: &[&str] = &["--isolation", "gvisor"];

#[test]
fn host_processes_are_invisible() {
    host_processes_are_invisible_on(&[]);
}

#[test]
fn host_processes_are_invisible_on_gvisor() {
    host_processes_are_invisible_on(GVISOR);
}

fn host_processes_are_invisible_on(isolation: &[&str]) {
    let marker = format!("sandlot-marker-{}", std::process::id());
    // `$0` of the shell is the marker, so it shows in the host's /proc/*/cmdline.
    // In its own process group with no inherited stdio: the shell's `sleep` child
    // is killed with it and holds none of the test's descriptors.
    let mut host = std::process::Command::new("/bin/sh")
        .args(["-c", "sleep 30", &marker])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(
        !host_processes_matching(&marker).is_empty(),
        "the marker process must be visible on the host"
    );
    let id = unique_id("procs");
    let (code, out, err) = sh(
        &id,
        isolation,
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
    );
    let pgid = rustix::process::Pid::from_raw(host.id() as i32).unwrap();
    rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL).unwrap();
    host.wait().unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains(&marker), "a host process is visible:\n{out}");
    let n = out.lines().filter(|l| !l.trim().is_empty()).count();
    assert!(
        n <= 4,
        "only the agent and the command should be visible, saw {n}:\n{out}"
    );
}

#[test]
fn host_files_outside_mounts_are_unreachable() {
    host_files_outside_mounts_are_unreachable_on(&[]);
}

#[test]
fn host_files_outside_mounts_are_unreachable_on_gvisor() {
    host_files_outside_mounts_are_unreachable_on(GVISOR);
}

fn host_files_outside_mounts_are_unreachable_on(isolation: &[&str]) {
    let secret_dir = std::env::temp_dir().join(format!("sandlot-secret-{}", std::process::id()));
    std::fs::create_dir_all(&secret_dir).unwrap();
    std::fs::write(secret_dir.join("secret"), "hunter2").unwrap();
    let id = unique_id("files");
    let script = format!(
        "cat {0}/secret; echo rc=$?; set -- /root/*; [ -e \"$1\" ] && echo $# || echo 0; \
         cat /etc/shadow; echo shadow=$?; for h in /home/*; do echo ${{h#/home/}}; done; touch /usr/sandlot-probe; echo usr=$?; touch /etc/ld.so.cache; echo etc=$?; \
         test -d /etc/ssl/certs && echo certsdir; touch /etc/ssl/certs/sandlot-probe; echo certs=$?; \
         cat /etc/debian_version; \
         echo ok > /tmp/x && cat /tmp/x",
        secret_dir.display()
    );
    let (code, out, err) = sh(&id, isolation, &script);
    std::fs::remove_dir_all(&secret_dir).unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("hunter2"), "host file leaked: {out}");
    assert!(out.contains("rc=1"), "{out}");
    assert!(
        out.contains("shadow=1"),
        "/etc/shadow must not exist: {out}"
    );
    assert!(out.contains("usr=1"), "/usr must be read-only: {out}");
    assert!(
        out.contains("etc=1"),
        "bound /etc files must be read-only: {out}"
    );
    // A directory entry one level down (`ssl/certs`) is bound read-only too, and a
    // bound file reads as the host's.
    if std::path::Path::new("/etc/ssl/certs").is_dir() {
        assert!(out.contains("certsdir"), "/etc/ssl/certs is missing: {out}");
        assert!(
            out.contains("certs=1"),
            "bound /etc directories must be read-only: {out}"
        );
    }
    if let Ok(v) = std::fs::read_to_string("/etc/debian_version") {
        assert!(out.contains(v.trim()), "/etc/debian_version: {out}");
    }
    assert!(
        out.lines().any(|l| l == "user"),
        "only the sandbox's own home: {out}"
    );
    assert!(
        out.trim_end().ends_with("ok"),
        "/tmp must be writable: {out}"
    );
    assert!(err.contains("Read-only file system"), "{err}");
    assert!(!std::path::Path::new("/usr/sandlot-probe").exists());
}

/// Python snippet that calls a raw syscall and prints its errno name.
fn syscall_errno(nr: i64, args: &str) -> String {
    format!(
        "import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\nr = libc.syscall({nr}, {args})\n\
         print('ok' if r == 0 else errno.errorcode[ctypes.get_errno()])\n"
    )
}

#[test]
fn privileged_operations_are_refused() {
    privileged_operations_are_refused_on(&[]);
}

#[test]
fn privileged_operations_are_refused_on_gvisor() {
    privileged_operations_are_refused_on(GVISOR);
}

fn privileged_operations_are_refused_on(isolation: &[&str]) {
    let id = unique_id("privops");
    let checks = [
        ("init_module", syscall_errno(libc::SYS_init_module, "0, 0, 0")),
        ("finit_module", syscall_errno(libc::SYS_finit_module, "0, 0, 0")),
        ("kexec_load", syscall_errno(libc::SYS_kexec_load, "0, 0, 0, 0")),
        ("bpf", syscall_errno(libc::SYS_bpf, "0, 0, 0")),
        ("unshare_user", syscall_errno(libc::SYS_unshare, &libc::CLONE_NEWUSER.to_string())),
        ("mount", "import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\nr = libc.mount(b'none', b'/mnt', b'tmpfs', 0, None)\nprint('ok' if r == 0 else errno.errorcode[ctypes.get_errno()])\n".to_string()),
        ("raw_socket", "import socket\ntry:\n    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)\n    print('ok')\nexcept PermissionError:\n    print('EPERM')\n".to_string()),
        // The family is refused by seccomp before the capability check.
        ("packet_socket", "import errno, socket\ntry:\n    socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)\n    print('ok')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n".to_string()),
        // PTRACE_ATTACH (16) to the agent: it is non-dumpable and CAP_SYS_PTRACE is gone.
        ("ptrace_agent", syscall_errno(libc::SYS_ptrace, "16, 1, 0, 0")),
        ("keyctl", syscall_errno(libc::SYS_keyctl, "0, 0, 0, 0")),
    ];
    let mut script = String::new();
    for (name, py) in &checks {
        script.push_str(&format!(
            "printf '{name}='; python3 -c \"$(cat <<'EOF'\n{py}EOF\n)\"\n"
        ));
    }
    let (code, out, err) = sh(&id, isolation, &script);
    assert_eq!(code, 0, "{out}\n{err}");
    for (name, _) in &checks {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no result for {name}:\n{out}\n{err}"));
        let v = line.split_once('=').unwrap().1;
        // gVisor's kernel makes user namespaces of its own: neither the new
        // namespace nor anything done in it reaches the host kernel.
        if *name == "unshare_user" && isolation == GVISOR {
            assert_eq!(v, "ok", "gVisor's own user namespaces");
            continue;
        }
        assert!(
            v == "EPERM" || v == "EACCES" || v == "EAFNOSUPPORT",
            "{name} must be refused, got {v}"
        );
    }
    // The mount(8) command fails too.
    let (code, _, _) = sh(
        &unique_id("mountcmd"),
        isolation,
        "mount -t tmpfs none /mnt",
    );
    assert_ne!(code, 0);
}

#[test]
fn ptrace_of_host_processes_is_impossible() {
    // Host pids do not exist in the sandbox's pid namespace.
    let target = std::process::id();
    let id = unique_id("ptrace");
    let py = syscall_errno(libc::SYS_ptrace, &format!("16, {target}, 0, 0"));
    let (code, out, err) = sh(
        &id,
        &[],
        &format!("python3 -c \"$(cat <<'EOF'\n{py}EOF\n)\""),
    );
    assert_eq!(code, 0, "{err}");
    let v = out.trim();
    assert!(
        v == "ESRCH" || v == "EPERM",
        "attaching to host pid {target} gave {v}"
    );
}

#[test]
fn hostname_and_network_are_the_sandboxes_own() {
    let id = unique_id("uts");
    let (code, out, err) = sh(
        &id,
        &["--hostname", "agent-box"],
        "hostname; cat /etc/hostname; ls /sys/class/net; cat /proc/net/route | wc -l",
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "agent-box");
    assert_eq!(lines[1], "agent-box");
    assert_eq!(lines[2], "lo", "only loopback: {out}");
    assert_eq!(lines[3], "1", "no routes (header line only): {out}");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_ne!(host.trim(), "agent-box");
}

#[test]
fn files_on_rw_mounts_belong_to_the_mapped_uid() {
    let dir = std::env::temp_dir().join(format!("sandlot-rw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The sandbox's root maps to an unprivileged host uid, which needs write access.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let id = unique_id("uidmap");
    let mount = format!("{}:/data:rw", dir.display());
    let (code, out, err) = sh(
        &id,
        &["--mount", &mount],
        "id -u; echo hi > /data/made-inside; awk '$5 == \"/data\" {print $6}' /proc/self/mountinfo",
    );
    assert_eq!(code, 0, "{err}");
    // Found by probing: writable binds lacked `nosuid,nodev`, which every other
    // mount of a sandbox has.
    let opts = out.lines().nth(1).unwrap_or_default();
    assert!(
        opts.starts_with("rw,") && opts.contains("nosuid") && opts.contains("nodev"),
        "{out}"
    );
    let md = std::fs::metadata(dir.join("made-inside")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert!(
        md.uid() >= 1 << 20,
        "owned by host uid {}, expected the mapped range",
        md.uid()
    );
    assert_ne!(md.uid(), 0);
    std::fs::remove_dir_all(&dir).unwrap();

    // A read-only mount refuses writes.
    let ro = std::env::temp_dir().join(format!("sandlot-ro-{}", std::process::id()));
    std::fs::create_dir_all(&ro).unwrap();
    let mount = format!("{}:/data:ro", ro.display());
    let (code, _, err) = sh(&unique_id("romount"), &["--mount", &mount], "touch /data/x");
    assert_ne!(code, 0);
    assert!(err.contains("Read-only"), "{err}");
    std::fs::remove_dir_all(&ro).unwrap();
}

#[test]
fn bad_input_gets_one_clear_line() {
    let cases: &[(&[&str], &str)] = &[
        (&["--memory", "0", "--", "true"], "resources.memory"),
        (&["--memory", "lots", "--", "true"], "lots"),
        (
            &["--mount", "/nonexistent-src:/x", "--", "true"],
            "/nonexistent-src",
        ),
        (
            &["--mount", "/tmp:../etc", "--", "true"],
            "mounts[0].target",
        ),
        (&["--env", "1BAD=x", "--", "true"], "env.1BAD"),
        (&["--rootfs", "/no/such/dir", "--", "true"], "/no/such/dir"),
        (&["--pids", "0", "--", "true"], "resources.pids"),
    ];
    for (args, needle) in cases {
        let id = unique_id("bad");
        let o = run(&id, args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(125), "{args:?}: {err}");
        assert!(
            err.contains(needle),
            "{args:?}: error should name {needle}: {err}"
        );
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: one line: {err}"
        );
    }
    // A command that does not exist, one that is not executable: the shell's codes,
    // and the agent's reason on one line.
    let o = run(&unique_id("noexec"), &["--", "/no/such/program"]);
    assert_eq!(o.status.code(), Some(127), "{}", stderr(&o));
    assert!(stderr(&o).contains("/no/such/program"), "{}", stderr(&o));
    assert!(stderr(&o).starts_with("sandlot: exec "), "{}", stderr(&o));
    let o = run(&unique_id("noexec"), &["--", "/etc/hostname"]);
    assert_eq!(o.status.code(), Some(126), "{}", stderr(&o));
    assert!(stderr(&o).contains("/etc/hostname"), "{}", stderr(&o));
}

#[test]
fn rootfs_directory_is_an_idmapped_overlay() {
    let rfs = std::env::temp_dir().join(format!("sandlot-rootfs-{}", std::process::id()));
    minimal_rootfs(&rfs, &["/bin/sh", "/bin/cat", "/usr/bin/stat"]);
    std::fs::create_dir_all(rfs.join("etc")).unwrap();
    std::fs::create_dir_all(rfs.join("usr")).unwrap();
    std::fs::write(rfs.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    let id = unique_id("rootfs");
    let (code, out, err) = sh(
        &id,
        &["--rootfs", rfs.to_str().unwrap()],
        "stat -c %U /etc/passwd; echo changed > /etc/passwd; cat /etc/passwd; echo new > /usr/newfile; cat /usr/newfile; cat /etc/hostname",
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("root\nchanged\nnew\nsandlot-"), "{out}");
    // The rootfs on the host is untouched.
    assert_eq!(
        std::fs::read_to_string(rfs.join("etc/passwd")).unwrap(),
        "root:x:0:0:root:/root:/bin/sh\n"
    );
    assert!(!rfs.join("usr/newfile").exists());
    std::fs::remove_dir_all(&rfs).unwrap();
}

/// Programs in a sandbox can rename and hard-link files across directories (pip,
/// git, write-temp-then-rename): the landlock ruleset grants REFER. Device nodes
/// stay refused.
#[test]
fn rename_across_directories_works_for_sandboxed_code() {
    let id = unique_id("rename");
    let script = r#"python3 - <<'EOF'
import os
os.makedirs('/tmp/a/deep'); os.makedirs('/tmp/b')
open('/tmp/a/deep/f', 'w').write('moved')
os.rename('/tmp/a/deep/f', '/tmp/b/g')
print(open('/tmp/b/g').read())
os.rename('/tmp/a/deep', '/tmp/b/deep')
os.link('/tmp/b/g', '/tmp/a/h')
print(os.stat('/tmp/a/h').st_nlink)
try:
    os.mknod('/tmp/dev', 0o600 | 0o020000, os.makedev(1, 3))
    print('mknod ok')
except PermissionError:
    print('mknod refused')
EOF"#;
    let (code, out, err) = sh(&id, &[], script);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(out, "moved\n2\nmknod refused\n", "{err}");
    assert_no_leftovers(&id);
}

/// The directories the mount plan makes (`MountOp::Dir`) get their modes and owners,
/// whether they are new (the `host` image), already there with another mode, or a
/// symlink to another directory of the image (`--rootfs`).
#[test]
fn skeleton_directories_keep_their_modes_and_owners() {
    let probe = "stat -c '%a %U %G %n' /etc /tmp /var/tmp /root /home/user /run";
    let id = unique_id("skel");
    let (code, out, err) = sh(&id, &[], probe);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "755 root root /etc\n1777 root root /tmp\n1777 root root /var/tmp\n\
         700 root root /root\n755 user user /home/user\n755 root root /run\n"
    );

    // An image whose /tmp exists with mode 0700 and whose /var/tmp is a symlink.
    let rfs = std::env::temp_dir().join(format!("sandlot-skel-{}", std::process::id()));
    for d in ["bin", "etc", "usr", "var"] {
        std::fs::create_dir_all(rfs.join(d)).unwrap();
    }
    std::fs::create_dir_all(rfs.join("tmp")).unwrap();
    std::fs::set_permissions(
        rfs.join("tmp"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    std::os::unix::fs::symlink("../tmp", rfs.join("var/tmp")).unwrap();
    minimal_rootfs(&rfs, &["/bin/sh", "/usr/bin/stat"]);
    let id = unique_id("skelfs");
    let (code, out, err) = sh(
        &id,
        &["--rootfs", rfs.to_str().unwrap()],
        "stat -c '%a %n' /tmp; stat -L -c '%a %n' /var/tmp; test -L /var/tmp && echo link",
    );
    std::fs::remove_dir_all(&rfs).unwrap();
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "1777 /tmp\n1777 /var/tmp\nlink\n");
}

/// The sandbox's own superblocks (distinct devices of its tmpfs, devpts, proc and
/// sysfs mounts), from its `/proc/self/mountinfo`.
fn own_superblocks(mountinfo: &str) -> Vec<(String, String)> {
    let mut seen: Vec<(String, String)> = Vec::new();
    for line in mountinfo.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let Some(dash) = f.iter().position(|x| *x == "-") else {
            continue;
        };
        let (dev, fstype) = (f[2].to_string(), f[dash + 1].to_string());
        if ["tmpfs", "devpts", "proc", "sysfs"].contains(&fstype.as_str())
            && !seen.iter().any(|(d, _)| *d == dev)
        {
            seen.push((dev, fstype));
        }
    }
    seen
}

/// Every superblock a sandbox mounts costs each memory cgroup on the host shrinker
/// bookkeeping, so masks are binds of one removed empty directory and `/dev`,
/// `/dev/shm` are directories of the root. They must still behave: the masked
/// directory is empty and refuses new entries, `/dev/shm` is a sticky directory any
/// user can write, and nothing of the mask source is left in `/dev`.
#[test]
fn masks_and_dev_make_no_superblocks_of_their_own() {
    let script = "cat /proc/self/mountinfo; echo ===; \
         ls -A /proc/acpi 2>&1 | wc -l; mkdir /proc/acpi/x 2>/dev/null && echo acpi-writable; \
         ls -A /dev | tr '\\n' ' '; echo; stat -c '%a' /dev/shm; \
         su_ok=$(cd /dev/shm && echo data > f && cat f); echo \"$su_ok\"";
    let id = unique_id("sblocks");
    let (code, out, err) = sh(&id, &["--user", "user"], script);
    assert_eq!(code, 0, "{err}");
    assert_no_leftovers(&id);
    let (mountinfo, rest) = out.split_once("===\n").expect("marker");
    let fstypes: Vec<String> = own_superblocks(mountinfo)
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    let sysfs = usize::from(fstypes.iter().any(|t| t == "sysfs"));
    assert_eq!(
        fstypes.len(),
        3 + sysfs,
        "root, devpts, proc (and sysfs when the kernel allows it), got {fstypes:?}\n{mountinfo}"
    );
    let lines: Vec<&str> = rest.lines().collect();
    assert_eq!(lines[0], "0", "a masked /proc/acpi must be empty: {rest}");
    assert!(!rest.contains("acpi-writable"), "{rest}");
    assert!(
        !lines[1].contains("sandlot"),
        "mask source left in /dev: {}",
        lines[1]
    );
    assert!(
        lines[1].contains("shm ") && lines[1].contains("pts "),
        "{}",
        lines[1]
    );
    assert_eq!(&lines[2..], ["1777", "data"], "{rest}");
    if std::path::Path::new("/proc/acpi").is_dir() {
        let acpi = mountinfo
            .lines()
            .find(|l| l.split_whitespace().nth(4) == Some("/proc/acpi"));
        let opts = acpi
            .and_then(|l| l.split_whitespace().nth(5))
            .unwrap_or_default();
        assert!(
            opts.split(',').any(|o| o == "ro"),
            "/proc/acpi must be masked read-only: {acpi:?}"
        );
    }
}

/// A minimal rootfs in `rfs`: host programs under `/bin` and the libraries they load
/// (no download).
fn minimal_rootfs(rfs: &std::path::Path, progs: &[&str]) {
    std::fs::create_dir_all(rfs.join("bin")).unwrap();
    let mut libs: Vec<String> = Vec::new();
    for prog in progs {
        let real = std::fs::canonicalize(prog).unwrap();
        let name = std::path::Path::new(prog).file_name().unwrap();
        std::fs::copy(&real, rfs.join("bin").join(name)).unwrap();
        let ldd = std::process::Command::new("ldd")
            .arg(&real)
            .output()
            .unwrap();
        for tok in String::from_utf8_lossy(&ldd.stdout).split_whitespace() {
            if tok.starts_with('/') {
                libs.push(tok.to_string());
            }
        }
    }
    for f in libs {
        let dst = rfs.join(f.trim_start_matches('/'));
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(std::fs::canonicalize(&f).unwrap(), &dst).unwrap();
    }
}

/// `sandlot run` started at a raised OOM score: the command starts at 0 (it may
/// not reset its own score: the agent is not dumpable), the agent keeps its own.
#[test]
fn commands_start_at_oom_score_0_whatever_sandlot_runs_at() {
    require_root();
    let id = unique_id("oom");
    let o = std::process::Command::new("/bin/sh")
        .args([
            "-c",
            r#"echo 300 > /proc/self/oom_score_adj && exec "$@""#,
            "sh",
        ])
        .arg(sandlot())
        .args(["run", "--id", &id, "--", "/bin/sh", "-c"])
        .arg(format!(
            "cat /proc/self/oom_score_adj\n{}sh -c 'cat /proc/self/oom_score_adj'",
            include_str!("scripts/agent_oom_score.sh")
        ))
        .output()
        .unwrap();
    assert_no_leftovers(&id);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert_eq!(lines[0], "0", "the command's score: {out}");
    // The helper's -999 takes where sandlot has CAP_SYS_RESOURCE.
    assert!(
        lines[1] == "300" || lines[1] == "-999",
        "the agent keeps its own score: {out}"
    );
    assert_eq!(lines[2], "0", "a grandchild's score: {out}");
}

/// A sandbox (network `none` here) may open only the socket families it needs. Found
/// by a review: `AF_VSOCK` was allowed, so a sandbox could bind the host's vsock ports
/// (the host's own bind then failed with `EADDRINUSE`).
#[test]
fn sockets_of_families_sandboxes_do_not_need_are_refused() {
    let script = r#"python3 - <<'EOF'
import errno, os, socket, threading
def attempt(fam, typ, proto=0, bind=None):
    try:
        s = socket.socket(fam, typ, proto)
    except OSError as e:
        return errno.errorcode[e.errno]
    try:
        if bind is not None:
            s.bind(bind)
        return 'ok'
    except OSError as e:
        return 'socket-ok-bind-' + errno.errorcode[e.errno]
    finally:
        s.close()
# The attack: bind a vsock port of the host (any CID, a fixed port).
print('vsock', attempt(40, socket.SOCK_STREAM, 0, (0xFFFFFFFF, 5005)))
print('vsock_dgram', attempt(40, socket.SOCK_DGRAM))
for name, fam, typ in [('packet', 17, socket.SOCK_RAW), ('xdp', 44, socket.SOCK_RAW),
                       ('alg', 38, socket.SOCK_SEQPACKET), ('key', 15, socket.SOCK_RAW),
                       ('tipc', 30, socket.SOCK_RDM), ('rds', 21, socket.SOCK_SEQPACKET),
                       ('bluetooth', 31, socket.SOCK_RAW), ('can', 29, socket.SOCK_RAW),
                       ('nfc', 39, socket.SOCK_DGRAM), ('llc', 26, socket.SOCK_DGRAM),
                       ('pppox', 24, socket.SOCK_STREAM), ('ax25', 3, socket.SOCK_SEQPACKET)]:
    print(name, attempt(fam, typ))
print('netlink_generic', attempt(16, socket.SOCK_RAW, 16))
print('netlink_netfilter', attempt(16, socket.SOCK_RAW, 12))
try:
    socket.socketpair(30, socket.SOCK_STREAM)
    print('tipc_pair ok')
except OSError as e:
    print('tipc_pair', errno.errorcode[e.errno])
# What sandboxes need still works: TCP, UDP, Unix sockets and route netlink.
srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen()
c = socket.create_connection(srv.getsockname()); a, _ = srv.accept()
c.sendall(b'tcp'); print('tcp', a.recv(3).decode())
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(('127.0.0.1', 0))
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'udp', u.getsockname())
print('udp', u.recv(3).decode())
print('inet6', attempt(socket.AF_INET6, socket.SOCK_STREAM))
l = socket.socket(socket.AF_UNIX); l.bind('/tmp/s'); l.listen()
c = socket.socket(socket.AF_UNIX); c.connect('/tmp/s'); a, _ = l.accept()
c.sendall(b'unix'); print('unix', a.recv(4).decode())
x, y = socket.socketpair(); x.sendall(b'pair'); print('pair', y.recv(4).decode())
print('netlink_route', attempt(16, socket.SOCK_RAW, 0))
print('getaddrinfo', len(socket.getaddrinfo('localhost', 80, flags=socket.AI_ADDRCONFIG)) > 0)
EOF"#;
    let (code, out, err) = sh(&unique_id("sockfam"), &[], script);
    assert_eq!(code, 0, "{out}\n{err}");
    let result = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no result for {name}:\n{out}\n{err}"))
            .to_string()
    };
    for name in [
        "vsock",
        "vsock_dgram",
        "packet",
        "xdp",
        "alg",
        "key",
        "tipc",
        "rds",
        "bluetooth",
        "can",
        "nfc",
        "llc",
        "pppox",
        "ax25",
        "tipc_pair",
    ] {
        let r = result(name);
        assert!(
            r == "EAFNOSUPPORT" || r == "EPERM",
            "{name} must be refused, got {r}"
        );
    }
    for name in ["netlink_generic", "netlink_netfilter"] {
        assert_eq!(result(name), "EPROTONOSUPPORT", "{name}");
    }
    for (name, want) in [
        ("tcp", "tcp"),
        ("udp", "udp"),
        ("inet6", "ok"),
        ("unix", "unix"),
        ("pair", "pair"),
        ("netlink_route", "ok"),
        ("getaddrinfo", "True"),
    ] {
        assert_eq!(result(name), want, "{name}: {out}");
    }
}

/// PID 1's command line names no host path (it named the `sandlot` binary's), and
/// its other `/proc` entries that would (`environ`, `maps`, `exe`, `cwd`, `root`,
/// `fd`) stay closed to sandbox processes: the agent is non-dumpable.
#[test]
fn pid1_shows_no_host_path() {
    let bin = std::fs::canonicalize(sandlot()).unwrap();
    let (code, out, err) = sh(
        &unique_id("pid1cmd"),
        &[],
        "tr '\\0' ' ' </proc/1/cmdline; echo; \
         for f in environ maps exe cwd root fd/3; do cat /proc/1/$f || readlink /proc/1/$f || echo closed; done",
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("sandlot __init "), "{out}");
    assert_eq!(
        out.lines().filter(|l| *l == "closed").count(),
        6,
        "{out}\n{err}"
    );
    let bin = bin.display().to_string();
    assert!(!out.contains(&bin) && !err.contains(&bin), "{out}\n{err}");
}

/// `sandlot run` forks the sandbox's helper from itself: nothing of the caller's
/// environment reaches the sandbox's processes, PID 1 included, whose `environ`
/// the host reads here (as root) while the command runs. The command's own
/// environment is the spec's.
#[test]
fn the_callers_environment_reaches_no_process_of_the_sandbox() {
    use std::io::{BufRead, BufReader};
    require_root();
    let id = unique_id("callerenv");
    let marker = "sandlot-caller-secret-7f3a";
    let mut child = std::process::Command::new(sandlot())
        .args(["run", "--id", &id, "--", "/bin/sh", "-c"])
        .arg("env; echo up; read x || :")
        .env("SANDLOT_TEST_CALLER_SECRET", marker)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn sandlot run");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut inside = String::new();
    for l in lines.by_ref() {
        let l = l.unwrap();
        if l == "up" {
            break;
        }
        inside.push_str(&l);
        inside.push('\n');
    }
    assert!(!inside.contains(marker), "{inside}");
    // Every process of the sandbox, by its cgroup on the host.
    let mut pids = Vec::new();
    for root in ["/sys/fs/cgroup/pids", "/sys/fs/cgroup"] {
        let procs = std::path::Path::new(root)
            .join("sandlot")
            .join(&id)
            .join("cgroup.procs");
        if let Ok(t) = std::fs::read_to_string(procs) {
            pids.extend(t.lines().map(str::to_string));
            break;
        }
    }
    assert!(pids.len() >= 2, "PID 1 and the shell: {pids:?}");
    for pid in &pids {
        for file in ["environ", "cmdline"] {
            let Ok(bytes) = std::fs::read(format!("/proc/{pid}/{file}")) else {
                continue;
            };
            let text = String::from_utf8_lossy(&bytes);
            assert!(!text.contains(marker), "/proc/{pid}/{file}: {text}");
        }
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_no_leftovers(&id);
}

#[test]
fn pid_1s_command_line_tells_nothing_of_the_callers_arguments_nor_blocks_its_signals() {
    require_root();
    // The same command line whatever the length of what `sandlot run` was given
    // (a secret's length is not shown), and PID 1 blocks no signal even when its
    // caller blocked some (it would never reap).
    let mut seen = Vec::new();
    for n in [8usize, 800] {
        let id = unique_id("pid1cmd");
        let secret = "x".repeat(n);
        let script = r#"
import signal, subprocess, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD, signal.SIGTERM, signal.SIGUSR1})
r = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=60)
sys.stdout.write(r.stdout)
sys.exit(r.returncode)
"#;
        let out = std::process::Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(sandlot())
            .args(["run", "--id", &id, "--env"])
            .arg(format!("TOKEN={secret}"))
            .args(["--", "/bin/sh", "-c"])
            .arg(
                "tr '\\0' ' ' </proc/1/cmdline; echo; grep SigBlk /proc/1/status; sleep 0.1 & wait",
            )
            .output()
            .expect("run sandlot run under a caller blocking signals");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut lines = text.lines();
        seen.push(lines.next().unwrap_or_default().to_string());
        assert_eq!(
            lines
                .next()
                .map(str::split_whitespace)
                .and_then(|mut w| w.nth(1)),
            Some("0000000000000000"),
            "{text}"
        );
        assert_no_leftovers(&id);
    }
    assert_eq!(
        seen[0], seen[1],
        "PID 1's command line grew with the caller's arguments"
    );
    assert_eq!(seen[0].trim_end(), "sandlot __init");
}
