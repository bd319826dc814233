//! A gVisor sandbox as data: the host-side root filesystem (the namespace
//! backend's [`MountPlan`] without what gVisor's own kernel provides) and the OCI
//! bundle's `config.json`. Pure, unit-tested without root.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::cgroup::CgroupLimits;
use crate::mounts::{MountOp, MountPlan};
use crate::plan::AgentSetup;

/// Where the daemon's things live inside a gVisor sandbox: under gVisor's own
/// `/dev` (a file system in the sandbox's kernel): runsc makes only their empty
/// mount points in the root filesystem, which a snapshot leaves out.
pub const AGENT_DIR: &str = "/dev/.sandlot";
/// The `sandlot` binary, bound read-only: PID 1 runs it as `__agent`.
pub const AGENT_EXE: &str = "/dev/.sandlot/sandlot";
/// The directory of the agent's socket, bound from the sandbox's directory on the
/// host (the daemon connects to the socket there).
pub const AGENT_RUN: &str = "/dev/.sandlot/run";
/// The agent's socket inside.
pub const AGENT_SOCKET: &str = "/dev/.sandlot/run/agent.sock";
/// The host's dynamic loader, bound read-only: the `sandlot` binary runs through
/// it with the host's libraries, whatever the image's are (a store image may have
/// another libc, or none).
pub const AGENT_LOADER: &str = "/dev/.sandlot/ld.so";
/// The host's library directories of the `sandlot` binary, bound read-only as
/// `/dev/.sandlot/lib0`, `lib1`, ...
pub const AGENT_LIB_PREFIX: &str = "/dev/.sandlot/lib";
/// The hidden argument of `sandlot` that relays one connection to a port of the
/// sandbox's loopback (`sandlot __port-relay PORT`, see
/// [`crate::PortAccess::Relay`]).
pub const PORT_RELAY_ARG: &str = "__port-relay";

/// What `sandlot __gvisor` does: build the root filesystem at `root_dir` as root
/// of a user namespace mapped to the sandbox's id range, then exec `runsc`
/// (`argv`) in that mount namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchPlan {
    pub root_dir: PathBuf,
    /// The root filesystem is mounted at `root_dir` already (a tmpfs root, which
    /// the backend mounts on the host so that the daemon can read it): the
    /// launcher only applies the mounts on it.
    #[serde(default)]
    pub root_mounted: bool,
    /// First host uid/gid of the sandbox's range: root in the sandbox, and the
    /// owner of everything the launcher makes for it.
    pub id_base: u32,
    /// Directories of the sandbox's cgroup(s): the process that holds the id
    /// range's lock lives there, and dies with the sandbox.
    pub cgroup_dirs: Vec<PathBuf>,
    /// The root filesystem and what is mounted and written into it on the host
    /// ([`host_side`]).
    pub mounts: MountPlan,
    /// `runsc` and its arguments.
    pub argv: Vec<String>,
}

/// Whether `path` is gVisor's own (`/dev`, `/proc`, `/sys` and what is under
/// them): its kernel provides those file systems itself.
fn kernel_provided(path: &str) -> bool {
    ["/dev", "/proc", "/sys"]
        .iter()
        .any(|p| path == *p || path.starts_with(&format!("{p}/")))
}

/// The part of a namespace sandbox's mount plan the host prepares for gVisor: the
/// root (image layers, writable layer, or tmpfs) and every bind, file, directory,
/// tmpfs and secret, but not `/proc`, `/sys`, `/dev` or the masks and devices
/// under them, which gVisor's kernel provides (and never from the host's). Their
/// mount points stay, as directories.
pub fn host_side(plan: &MountPlan) -> MountPlan {
    let mut ops = Vec::new();
    for op in &plan.ops {
        let kept = match op {
            MountOp::Proc { path } | MountOp::Sysfs { path } => Some(MountOp::Dir {
                path: path.clone(),
                mode: 0o555,
                uid: 0,
                gid: 0,
            }),
            MountOp::Tmpfs { path, .. } if path == "/dev" => Some(MountOp::Dir {
                path: path.clone(),
                mode: 0o755,
                uid: 0,
                gid: 0,
            }),
            MountOp::Dir { path, .. } if path == "/dev" => Some(op.clone()),
            MountOp::Devpts { .. } => None,
            MountOp::Dir { path, .. }
            | MountOp::Symlink { path, .. }
            | MountOp::File { path, .. }
            | MountOp::SecretFile { path, .. }
            | MountOp::Bind { path, .. }
            | MountOp::Tmpfs { path, .. }
            | MountOp::MaskFile { path }
            | MountOp::MaskDir { path }
            | MountOp::ReadOnly { path }
            | MountOp::IdmappedBind { path, .. } => (!kernel_provided(path)).then(|| op.clone()),
            MountOp::HostEtc { .. } => Some(op.clone()),
        };
        ops.extend(kept);
    }
    MountPlan {
        root: plan.root.clone(),
        ops,
    }
}

/// Whether a bundle joins a network namespace of the host's (a network slot):
/// `runsc` then runs with `--network=sandbox`.
pub fn has_network_path(config: &Value) -> bool {
    config["linux"]["namespaces"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|n| n["type"] == "network" && n.get("path").is_some())
}

/// The first host id of a bundle's user namespace mapping (root inside).
pub fn id_base_of(config: &Value) -> Option<u32> {
    config["linux"]["uidMappings"][0]["hostID"]
        .as_u64()
        .and_then(|v| u32::try_from(v).ok())
}

/// The destinations of a bundle's mounts, relative to the root.
pub fn mount_destinations(config: &Value) -> Vec<PathBuf> {
    config["mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["destination"].as_str())
        .filter_map(|d| Path::new(d).strip_prefix("/").ok().map(Path::to_path_buf))
        .filter(|p| !p.as_os_str().is_empty())
        .collect()
}

/// How the `sandlot` binary runs inside a gVisor sandbox: through the host's
/// loader and libraries (a dynamically linked binary), or alone (a static one).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentRuntime {
    /// The host's loader (`PT_INTERP` of the binary).
    pub loader: Option<PathBuf>,
    /// Host directories of the libraries the binary runs with.
    pub lib_dirs: Vec<PathBuf>,
}

impl AgentRuntime {
    /// The command line inside the sandbox that runs `sandlot` with `args`.
    pub fn argv<I: IntoIterator<Item = String>>(&self, args: I) -> Vec<String> {
        let mut v = Vec::new();
        if self.loader.is_some() {
            v.push(AGENT_LOADER.to_string());
            if !self.lib_dirs.is_empty() {
                v.push("--library-path".into());
                v.push(
                    (0..self.lib_dirs.len())
                        .map(|i| format!("{AGENT_LIB_PREFIX}{i}"))
                        .collect::<Vec<_>>()
                        .join(":"),
                );
            }
        }
        v.push(AGENT_EXE.to_string());
        v.extend(args);
        v
    }

    /// The read-only binds of the loader and the library directories.
    fn mounts(&self) -> Vec<Value> {
        let ro = json!(["rbind", "ro", "nosuid", "nodev"]);
        let mut v = Vec::new();
        if let Some(l) = &self.loader {
            v.push(
                json!({ "destination": AGENT_LOADER, "type": "bind", "source": l, "options": ro }),
            );
            for (i, d) in self.lib_dirs.iter().enumerate() {
                v.push(
                    json!({ "destination": format!("{AGENT_LIB_PREFIX}{i}"), "type": "bind",
                    "source": d, "options": ro }),
                );
            }
        }
        v
    }
}

/// The program interpreter (`PT_INTERP`) of a 64-bit little-endian ELF file, if it
/// has one. `read_at(offset, len)` gives the file's bytes there (`Ok(None)` if the
/// file ends before): only the header, the program headers and the interpreter's
/// name are read, never the whole (hundreds of megabytes) binary. A read error is
/// an error; a file that is not such an ELF file, or is malformed, has none.
pub fn elf_interpreter(
    read_at: impl Fn(u64, usize) -> std::io::Result<Option<Vec<u8>>>,
) -> std::io::Result<Option<PathBuf>> {
    use std::os::unix::ffi::OsStrExt;
    /// Program headers beyond this are not a binary this daemon runs.
    const MAX_TABLE: usize = 1 << 20;
    /// An ELF64 program header.
    const PHDR_LEN: usize = 56;
    let u16_at = |b: &[u8], o: usize| Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |b: &[u8], o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |b: &[u8], o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
    let Some(head) = read_at(0, 64)? else {
        return Ok(None);
    };
    if head.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        return Ok(None);
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (
        u64_at(&head, 0x20),
        u16_at(&head, 0x36),
        u16_at(&head, 0x38),
    ) else {
        return Ok(None);
    };
    let (phentsize, phnum) = (usize::from(phentsize), usize::from(phnum));
    let table_len = phentsize * phnum; // at most 65,535 squared: no overflow
    if phentsize < PHDR_LEN || table_len > MAX_TABLE {
        return Ok(None);
    }
    let Some(table) = read_at(phoff, table_len)? else {
        return Ok(None);
    };
    for ph in table.chunks_exact(phentsize) {
        if u32_at(ph, 0) != Some(3) {
            continue;
        }
        let (Some(off), Some(size)) = (u64_at(ph, 8), u64_at(ph, 32)) else {
            return Ok(None);
        };
        let size = match usize::try_from(size) {
            Ok(n) if n <= libc::PATH_MAX as usize => n,
            _ => return Ok(None),
        };
        let Some(raw) = read_at(off, size)? else {
            return Ok(None);
        };
        let name = raw.split(|b| *b == 0).next().unwrap_or_default();
        return Ok((!name.is_empty()).then(|| PathBuf::from(std::ffi::OsStr::from_bytes(name))));
    }
    Ok(None)
}

/// The directories of the shared libraries in a `/proc/PID/maps` text (the
/// loader's own left out), in order of appearance.
pub fn library_dirs(maps: &str, loader: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for l in maps.lines() {
        let Some(path) = l.split_whitespace().nth(5) else {
            continue;
        };
        let p = Path::new(path);
        let is_lib = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.contains(".so"));
        if !path.starts_with('/') || !is_lib || p == loader {
            continue;
        }
        if let Some(d) = p.parent() {
            if !dirs.iter().any(|x| x == d) {
                dirs.push(d.to_path_buf());
            }
        }
    }
    dirs
}

/// What the OCI bundle of a gVisor sandbox is made of.
#[derive(Debug, Clone)]
pub struct BundleInput<'a> {
    pub hostname: &'a str,
    /// The root the launcher builds (`LaunchPlan::root_dir`).
    pub root: &'a Path,
    /// The `sandlot` binary on the host.
    pub agent_exe: &'a Path,
    /// How it runs inside.
    pub agent_runtime: &'a AgentRuntime,
    /// The host directory of the agent's socket.
    pub agent_run: &'a Path,
    /// A network namespace to join (`/proc/self/fd/N`), for a network slot.
    pub netns: Option<&'a str>,
    /// `<cgroup parent>/<id>`, created by the runtime beforehand.
    pub cgroups_path: &'a str,
    pub limits: &'a CgroupLimits,
    /// The agent's standard input stays open as its lifeline (`sandlot run`).
    pub lifeline: bool,
    /// The root has a `/tmp` the plan made or mounted: bound over gVisor's own
    /// (`runsc` mounts a tmpfs of its kernel's on a `/tmp` that is no mount of the
    /// bundle's, which no snapshot, disk limit or spec mount would reach).
    pub tmp_in_root: bool,
    /// First host uid/gid of the sandbox's id range (ids 0..65535 of the
    /// sandbox's user namespace, which gVisor's gofer runs in).
    pub id_base: u32,
}

/// Whether `plan` makes or mounts `/tmp` (see [`BundleInput::tmp_in_root`]).
pub fn plan_has_tmp(plan: &MountPlan) -> bool {
    plan.ops.iter().any(|op| match op {
        MountOp::Dir { path, .. }
        | MountOp::Tmpfs { path, .. }
        | MountOp::Bind { path, .. }
        | MountOp::IdmappedBind { path, .. } => path == "/tmp",
        _ => false,
    })
}

/// The OCI runtime spec (`config.json`) of a gVisor sandbox: PID 1 is the guest
/// agent (`sandlot __agent`, reading its process defaults from its standard
/// input), root in gVisor with the namespace backend's capabilities and no new
/// privileges; gVisor's own `/proc`, `/sys` and `/dev`; the cgroup and limits; a
/// user namespace mapping ids 0..65535 to the sandbox's range on the host, which
/// `runsc` starts its gofer in, so that the files it opens for the sandbox are
/// opened as the range's ids, never as host root.
pub fn oci_config(b: &BundleInput<'_>) -> Value {
    let caps: Vec<String> = crate::security::KEPT_CAPS
        .iter()
        .map(|(_, name, _)| format!("CAP_{name}"))
        .collect();
    let mut args = b.agent_runtime.argv([
        "__agent".to_string(),
        "--listen".into(),
        AGENT_SOCKET.into(),
        // Off runsc's standard output and error (a host file).
        "--pid1".into(),
    ]);
    if b.lifeline {
        args.push("--lifeline-stdin".into());
    }
    let ids = json!([{ "containerID": 0, "hostID": b.id_base, "size": crate::plan::ID_RANGE }]);
    let mut network = json!({ "type": "network" });
    if let Some(p) = b.netns {
        network["path"] = json!(p);
    }
    const PERIOD: u64 = 100_000;
    let mut resources = json!({
        "memory": { "limit": b.limits.memory_bytes },
        "pids": { "limit": b.limits.pids },
    });
    if let Some(c) = b.limits.cpus {
        resources["cpu"] = json!({
            "quota": ((c * PERIOD as f64).round() as i64).max(1000),
            "period": PERIOD,
        });
    }
    let mut mounts = json!([
            { "destination": "/proc", "type": "proc", "source": "proc" },
            { "destination": "/dev", "type": "tmpfs", "source": "tmpfs",
              "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] },
            { "destination": "/dev/pts", "type": "devpts", "source": "devpts",
              "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"] },
            { "destination": "/dev/shm", "type": "tmpfs", "source": "shm",
              "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"] },
            { "destination": "/sys", "type": "sysfs", "source": "sysfs",
              "options": ["nosuid", "noexec", "nodev", "ro"] },
            { "destination": AGENT_EXE, "type": "bind", "source": b.agent_exe,
              "options": ["rbind", "ro", "nosuid", "nodev"] },
            { "destination": AGENT_RUN, "type": "bind", "source": b.agent_run,
              "options": ["rbind", "rw", "nosuid", "nodev", "noexec"] },
    ]);
    if let Some(m) = mounts.as_array_mut() {
        m.extend(b.agent_runtime.mounts());
        if b.tmp_in_root {
            m.push(json!({ "destination": "/tmp", "type": "bind",
                "source": b.root.join("tmp"),
                "options": ["rbind", "rw", "nosuid", "nodev"] }));
        }
    }
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": { "uid": 0, "gid": 0 },
            "args": args,
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": "/",
            "capabilities": {
                "bounding": caps,
                "effective": caps,
                "permitted": caps,
                "inheritable": [],
                "ambient": [],
            },
            "noNewPrivileges": true,
        },
        "root": { "path": b.root, "readonly": false },
        "hostname": b.hostname,
        "mounts": mounts,
        "linux": {
            "namespaces": [
                { "type": "pid" }, { "type": "mount" }, { "type": "ipc" }, { "type": "uts" },
                network, { "type": "user" },
            ],
            "uidMappings": ids,
            "gidMappings": ids,
            "cgroupsPath": b.cgroups_path,
            "resources": resources,
        },
    })
}

/// The agent's process defaults as the line its standard input starts with.
pub fn setup_line(setup: &AgentSetup) -> Vec<u8> {
    let mut v = serde_json::to_vec(setup).expect("agent setup serializes");
    v.push(b'\n');
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mounts::{Kind, RootFs};

    fn plan(ops: Vec<MountOp>) -> MountPlan {
        MountPlan {
            root: RootFs::Tmpfs {
                size: sandlot_proto::spec::TmpfsLimit::of_size(1 << 20),
            },
            ops,
        }
    }

    #[test]
    fn the_host_prepares_everything_but_the_kernels_own_file_systems() {
        let bind = |src: &str, path: &str| MountOp::Bind {
            source: src.into(),
            path: path.into(),
            readonly: true,
            kind: Kind::Dir,
            required: true,
            pinned: None,
        };
        let p = plan(vec![
            bind("/usr", "/usr"),
            MountOp::Dir {
                path: "/dev".into(),
                mode: 0o755,
                uid: 0,
                gid: 0,
            },
            bind("/dev/null", "/dev/null"),
            MountOp::Symlink {
                path: "/dev/fd".into(),
                target: "/proc/self/fd".into(),
            },
            MountOp::Devpts {
                path: "/dev/pts".into(),
            },
            MountOp::Proc {
                path: "/proc".into(),
            },
            MountOp::MaskFile {
                path: "/proc/kcore".into(),
            },
            MountOp::Sysfs {
                path: "/sys".into(),
            },
            MountOp::MaskDir {
                path: "/sys/firmware".into(),
            },
            MountOp::Tmpfs {
                path: "/run/secrets".into(),
                size: sandlot_proto::spec::TmpfsLimit::of_size(1 << 20),
                mode: 0o755,
                noexec: true,
            },
            // A path that only starts like one of gVisor's stays.
            bind("/data", "/devices"),
        ]);
        assert_eq!(host_side(&p).root, p.root);
        let kept = host_side(&p).ops;
        assert_eq!(kept.len(), 6, "{kept:#?}");
        assert!(matches!(&kept[0], MountOp::Bind { path, .. } if path == "/usr"));
        assert!(matches!(&kept[1], MountOp::Dir { path, .. } if path == "/dev"));
        assert!(matches!(&kept[2], MountOp::Dir { path, mode: 0o555, .. } if path == "/proc"));
        assert!(matches!(&kept[3], MountOp::Dir { path, .. } if path == "/sys"));
        assert!(matches!(&kept[4], MountOp::Tmpfs { path, .. } if path == "/run/secrets"));
        assert!(matches!(&kept[5], MountOp::Bind { path, .. } if path == "/devices"));
    }

    #[test]
    fn the_bundle_runs_the_agent_as_pid_1_with_the_sandbox_limits_and_id_range() {
        let limits = CgroupLimits {
            memory_bytes: 256 << 20,
            memory_high: None,
            pids: 512,
            cpus: Some(0.5),
        };
        let c = oci_config(&BundleInput {
            hostname: "sandlot-x",
            root: Path::new("/run/sandlot/gvisor/x/root"),
            agent_exe: Path::new("/usr/bin/sandlot"),
            agent_runtime: &AgentRuntime::default(),
            agent_run: Path::new("/run/sandlot/gvisor/x/agent"),
            netns: Some("/proc/self/fd/4"),
            cgroups_path: "sandlot/x",
            limits: &limits,
            lifeline: false,
            tmp_in_root: false,
            id_base: 1 << 20,
        });
        assert_eq!(
            c["process"]["args"],
            json!([AGENT_EXE, "__agent", "--listen", AGENT_SOCKET, "--pid1"])
        );
        assert_eq!(c["process"]["noNewPrivileges"], true);
        let caps = c["process"]["capabilities"]["bounding"].as_array().unwrap();
        assert!(caps.contains(&json!("CAP_SETUID")));
        assert!(!caps.contains(&json!("CAP_SYS_ADMIN")));
        assert_eq!(c["hostname"], "sandlot-x");
        // gVisor's gofer opens the sandbox's files as the sandbox's id range:
        // root inside is host uid 2^20, never host root.
        assert!(c["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .contains(&json!({"type": "user"})));
        for m in ["uidMappings", "gidMappings"] {
            assert_eq!(
                c["linux"][m],
                json!([{"containerID": 0, "hostID": 1 << 20, "size": 65536}]),
                "{m}"
            );
        }
        assert_eq!(c["linux"]["cgroupsPath"], "sandlot/x");
        assert_eq!(c["linux"]["resources"]["memory"]["limit"], 256 << 20);
        assert_eq!(c["linux"]["resources"]["pids"]["limit"], 512);
        assert_eq!(c["linux"]["resources"]["cpu"]["quota"], 50_000);
        let net = &c["linux"]["namespaces"][4];
        assert_eq!(
            (net["type"].as_str(), net["path"].as_str()),
            (Some("network"), Some("/proc/self/fd/4"))
        );
        // The agent's socket directory is the only writable host path, and no
        // exec happens from it.
        let run = c["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == AGENT_RUN)
            .unwrap();
        assert!(run["options"]
            .as_array()
            .unwrap()
            .contains(&json!("noexec")));
        // Without a slot: a network namespace of gVisor's own, no path.
        let c = oci_config(&BundleInput {
            netns: None,
            lifeline: true,
            tmp_in_root: false,
            ..BundleInput {
                hostname: "h",
                root: Path::new("/r"),
                agent_exe: Path::new("/s"),
                agent_runtime: &AgentRuntime::default(),
                agent_run: Path::new("/a"),
                netns: None,
                cgroups_path: "p/x",
                limits: &limits,
                lifeline: true,
                tmp_in_root: false,
                id_base: 1 << 20,
            }
        });
        assert!(c["linux"]["namespaces"][4].get("path").is_none());
        assert_eq!(c["process"]["args"][5], "--lifeline-stdin");
    }

    #[test]
    fn the_agent_runs_through_the_hosts_loader_and_library_directories() {
        use std::os::unix::fs::FileExt;
        let me = std::fs::File::open("/proc/self/exe").unwrap();
        let reads = std::cell::Cell::new(0);
        let loader = elf_interpreter(|off, len| {
            reads.set(reads.get() + len);
            let mut b = vec![0; len];
            me.read_exact_at(&mut b, off).map(|_| Some(b))
        })
        .unwrap()
        .expect("a dynamically linked test binary");
        assert!(loader.is_absolute(), "{}", loader.display());
        assert!(
            reads.get() < 8192,
            "read {} bytes of the binary",
            reads.get()
        );
        // In memory, with the largest read asked for.
        let largest = std::cell::Cell::new(0);
        let in_memory = |b: Vec<u8>| {
            let largest = &largest;
            move |off: u64, len: usize| {
                largest.set(largest.get().max(len));
                let off = usize::try_from(off).unwrap();
                Ok(b.get(off..off + len).map(<[u8]>::to_vec))
            }
        };
        assert_eq!(
            elf_interpreter(in_memory(b"#!/bin/sh\n".to_vec())).unwrap(),
            None
        );
        let mut header = vec![0u8; 64];
        header[..6].copy_from_slice(b"\x7fELF\x02\x01");
        header[0x20] = 64;
        // Program headers of size 0 (would be an endless walk), past the end, and a
        // table of 65,535 entries (3.6 MB, never asked for).
        let mut zero = header.clone();
        zero[0x38] = 1;
        assert_eq!(elf_interpreter(in_memory(zero)).unwrap(), None);
        let mut past_end = header.clone();
        past_end[0x36] = 56;
        past_end[0x38] = 1;
        assert_eq!(elf_interpreter(in_memory(past_end)).unwrap(), None);
        let mut giant = header.clone();
        giant[0x36] = 56;
        giant[0x38..0x3a].copy_from_slice(&u16::MAX.to_le_bytes());
        giant.resize(64 + 56 * 65_535, 0);
        assert_eq!(elf_interpreter(in_memory(giant)).unwrap(), None);
        assert!(largest.get() <= 64, "asked for {} bytes", largest.get());
        // An interpreter whose name is found through the program header.
        let mut tiny = header;
        tiny[0x36] = 56;
        tiny[0x38] = 1;
        tiny.resize(64 + 56, 0);
        tiny[64] = 3; // PT_INTERP
        tiny[64 + 8] = 120; // at offset 120
        tiny[64 + 32] = 9; // 9 bytes
        tiny.extend_from_slice(b"/lib/ld\0\0");
        assert_eq!(
            elf_interpreter(in_memory(tiny)).unwrap(),
            Some(PathBuf::from("/lib/ld"))
        );
        // A read error is an error, not "no interpreter".
        let failing = |_: u64, _: usize| Err(std::io::Error::other("disk gone"));
        assert!(elf_interpreter(failing).is_err());
        let maps = "7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6
7f02-7f03 r-xp 0 08:01 2 /usr/lib/x86_64-linux-gnu/libm.so.6
7f04-7f05 r-xp 0 08:01 3 /opt/x/libz.so.1.2
7f06-7f07 r-xp 0 08:01 4 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
7f08-7f09 rw-p 0 00:00 0 [heap]
7f0a-7f0b r-xp 0 08:01 5 /usr/bin/sandlot
";
        let dirs = library_dirs(
            maps,
            Path::new("/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
        );
        assert_eq!(
            dirs,
            vec![
                PathBuf::from("/usr/lib/x86_64-linux-gnu"),
                PathBuf::from("/opt/x")
            ]
        );
        let rt = AgentRuntime {
            loader: Some(loader),
            lib_dirs: dirs,
        };
        assert_eq!(
            rt.argv(["__agent".to_string()]),
            vec![
                AGENT_LOADER,
                "--library-path",
                "/dev/.sandlot/lib0:/dev/.sandlot/lib1",
                AGENT_EXE,
                "__agent"
            ]
        );
        assert_eq!(rt.mounts().len(), 3);
        assert_eq!(
            AgentRuntime::default().argv(["x".to_string()]),
            vec![AGENT_EXE, "x"]
        );
    }
}
