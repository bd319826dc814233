//! Mount application against [`FakeKernel`]: the calls a plan makes, in order and
//! with their flags, and what happens when the kernel refuses one. No root needed.

use std::path::PathBuf;

use super::fake::{Call, Entry, FakeFd, FakeKernel};
use super::*;
use crate::host_path::HostId;

const ROOT_DIR: &str = "/run/sandlot/sandboxes/s1/root";

fn run(kernel: &FakeKernel, ops: &[MountOp]) -> Result<(), MountError> {
    apply_ops(kernel, Path::new(ROOT_DIR), ops, &mut [], None)
}

fn bind(source: &str, path: &str, readonly: bool, required: bool) -> MountOp {
    MountOp::Bind {
        source: PathBuf::from(source),
        path: path.into(),
        readonly,
        kind: Kind::Dir,
        required,
        pinned: None,
    }
}

/// The `(op, path, errno)` of an [`MountError::Apply`].
fn apply_error(e: MountError) -> (&'static str, String, Option<i32>) {
    match e {
        MountError::Apply { op, path, source } => (op, path, source.raw_os_error()),
        other => panic!("not an apply error: {other:?}"),
    }
}

fn mount(source: &str, target: &str, fstype: &str, flags: libc::c_ulong, data: &str) -> Call {
    Call::Mount {
        source: Some(source.into()),
        target: target.into(),
        fstype: Some(fstype.into()),
        flags,
        data: (!data.is_empty()).then(|| data.into()),
    }
}

fn setattr(mount: &str, recursive: bool, set: u64) -> Call {
    Call::MountSetattr {
        mount: mount.into(),
        recursive,
        set,
    }
}

fn onto(tree: &str, target: &str) -> Call {
    Call::MoveMountOnto {
        tree: tree.into(),
        target: target.into(),
    }
}

/// An attach by name in a parent directory kept open.
fn at(tree: &str, target: &str) -> Call {
    Call::MoveMountAt {
        tree: tree.into(),
        target: target.into(),
    }
}

const RO: u64 = sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;

#[test]
fn readonly_bind_is_made_readonly_nosuid_nodev_before_it_is_attached() {
    let k = FakeKernel::new(ROOT_DIR);
    run(&k, &[bind("/srv/data", "/data", true, true)]).unwrap();
    assert_eq!(
        k.mount_calls(),
        [
            Call::OpenTreeClone {
                source: "/srv/data".into()
            },
            setattr("tree:/srv/data", true, RO),
            onto("tree:/srv/data", "/data"),
        ]
    );
    assert_eq!(k.entry("/data"), Some(Entry::Dir), "the target is created");
}

#[test]
fn writable_bind_is_nosuid_and_nodev_unless_its_source_is_a_device() {
    let k = FakeKernel::new(ROOT_DIR)
        .with_dirs(&["/dev"])
        .with_host_device("/dev/fuse");
    let mut fuse = bind("/dev/fuse", "/dev/fuse", false, true);
    if let MountOp::Bind { kind, .. } = &mut fuse {
        *kind = Kind::File;
    }
    run(&k, &[bind("/srv/rw", "/rw", false, true), fuse]).unwrap();
    let setattrs: Vec<_> = k
        .mount_calls()
        .into_iter()
        .filter(|c| matches!(c, Call::MountSetattr { .. }))
        .collect();
    assert_eq!(
        setattrs,
        [
            setattr(
                "tree:/srv/rw",
                true,
                sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV
            ),
            setattr("tree:/dev/fuse", true, sys::MOUNT_ATTR_NOSUID),
        ]
    );
    assert_eq!(k.entry("/dev/fuse"), Some(Entry::File(Vec::new())));
}

#[test]
fn missing_bind_source_is_skipped_unless_required() {
    let k = FakeKernel::new(ROOT_DIR).with_host_missing("/srv/gone");
    run(&k, &[bind("/srv/gone", "/opt", true, false)]).unwrap();
    assert_eq!(k.entry("/opt"), None, "no target for a skipped bind");
    assert_eq!(k.mount_calls().len(), 1, "only the failed clone");

    let err = run(&k, &[bind("/srv/gone", "/opt", true, true)]).unwrap_err();
    assert_eq!(
        apply_error(err),
        ("open bind source", "/srv/gone".into(), Some(libc::ENOENT))
    );
}

#[test]
fn failed_bind_attach_names_the_sandbox_path_not_the_host_source() {
    let k =
        FakeKernel::new(ROOT_DIR).fail(libc::EPERM, |c| matches!(c, Call::MoveMountOnto { .. }));
    let err = run(&k, &[bind("/srv/data", "/data", true, true)]).unwrap_err();
    assert_eq!(
        apply_error(err),
        ("bind", "/data".into(), Some(libc::EPERM))
    );
}

#[test]
fn tmpfs_is_nosuid_nodev_with_size_and_mode_and_noexec_when_asked() {
    let k = FakeKernel::new(ROOT_DIR);
    let tmpfs = |path: &str, noexec| MountOp::Tmpfs {
        path: path.into(),
        size: TmpfsLimit::of_size(8 << 20),
        mode: 0o1777,
        noexec,
    };
    run(&k, &[tmpfs("/tmp", true), tmpfs("/work", false)]).unwrap();
    let opts = "size=8388608,nr_inodes=2048,mode=1777";
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    assert_eq!(
        k.mount_calls(),
        [
            mount("tmpfs", "/tmp", "tmpfs", flags | libc::MS_NOEXEC, opts),
            mount("tmpfs", "/work", "tmpfs", flags, opts),
        ]
    );
}

#[test]
fn proc_sysfs_and_devpts_get_their_flags_and_options() {
    let k = FakeKernel::new(ROOT_DIR);
    let ops = [
        MountOp::Proc {
            path: "/proc".into(),
        },
        MountOp::Sysfs {
            path: "/sys".into(),
        },
        MountOp::Devpts {
            path: "/dev/pts".into(),
        },
    ];
    run(&k, &ops).unwrap();
    let hardened = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    assert_eq!(
        k.mount_calls(),
        [
            mount("proc", "/proc", "proc", hardened, ""),
            mount("sysfs", "/sys", "sysfs", hardened | libc::MS_RDONLY, ""),
            mount(
                "devpts",
                "/dev/pts",
                "devpts",
                libc::MS_NOSUID | libc::MS_NOEXEC,
                "newinstance,ptmxmode=0666,mode=0620"
            ),
        ]
    );
    assert_eq!(k.entry("/dev/pts"), Some(Entry::Dir), "parents are created");
}

#[test]
fn refused_sysfs_leaves_sys_empty_and_the_plan_goes_on() {
    let k = FakeKernel::new(ROOT_DIR).fail(
        libc::EPERM,
        |c| matches!(c, Call::Mount { fstype: Some(t), .. } if t == "sysfs"),
    );
    let ops = [
        MountOp::Sysfs {
            path: "/sys".into(),
        },
        MountOp::Proc {
            path: "/proc".into(),
        },
    ];
    run(&k, &ops).unwrap();
    assert_eq!(k.mount_calls().len(), 2, "proc is still mounted");
}

#[test]
fn failing_mount_names_the_step_and_the_sandbox_path() {
    let k = FakeKernel::new(ROOT_DIR).fail(
        libc::EPERM,
        |c| matches!(c, Call::Mount { fstype: Some(t), .. } if t == "proc"),
    );
    let ops = [
        MountOp::Proc {
            path: "/proc".into(),
        },
        MountOp::Devpts {
            path: "/dev/pts".into(),
        },
    ];
    let err = run(&k, &ops).unwrap_err();
    assert_eq!(
        apply_error(err),
        ("mount proc", "/proc".into(), Some(libc::EPERM))
    );
    assert_eq!(k.mount_calls().len(), 1, "nothing after the failure");
}

#[test]
fn masks_skip_missing_paths_and_cover_existing_ones() {
    let k = FakeKernel::new(ROOT_DIR)
        .with_file("/dev/null", "")
        .with_file("/proc/kcore", "")
        .with_dirs(&["/proc/acpi"]);
    let ops = [
        MountOp::MaskFile {
            path: "/proc/kcore".into(),
        },
        MountOp::MaskFile {
            path: "/proc/timer_list".into(),
        },
        MountOp::MaskDir {
            path: "/proc/acpi".into(),
        },
        MountOp::MaskDir {
            path: "/proc/scsi".into(),
        },
    ];
    run(&k, &ops).unwrap();
    let mask = "/dev/.sandlot-mask";
    let tree = format!("tree:{mask}");
    assert_eq!(
        k.mount_calls(),
        [
            Call::Mount {
                source: Some("/dev/null".into()),
                target: "/proc/kcore".into(),
                fstype: None,
                flags: libc::MS_BIND,
                data: None,
            },
            Call::OpenTreeCloneFd {
                source: mask.into(),
                recursive: false,
            },
            setattr(&tree, false, RO | sys::MOUNT_ATTR_NOEXEC),
            onto(&tree, "/proc/acpi"),
        ]
    );
    assert_eq!(
        k.entry("/proc/timer_list"),
        None,
        "no mask creates its path"
    );
    assert_eq!(k.entry("/proc/scsi"), None);
    assert_eq!(k.calls().last(), Some(&Call::Rmdirat { path: mask.into() }));
    assert_eq!(k.entry(mask), None, "the mask source is removed");
}

#[test]
fn masked_dir_falls_back_to_an_empty_readonly_tmpfs_when_the_clone_is_refused() {
    let k = FakeKernel::new(ROOT_DIR)
        .with_dirs(&["/proc/acpi"])
        .fail(libc::EINVAL, |c| matches!(c, Call::OpenTreeCloneFd { .. }));
    run(
        &k,
        &[MountOp::MaskDir {
            path: "/proc/acpi".into(),
        }],
    )
    .unwrap();
    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    assert_eq!(
        k.mount_calls().last(),
        Some(&mount("tmpfs", "/proc/acpi", "tmpfs", flags, "size=0"))
    );
}

fn idmapped(readonly: bool) -> MountOp {
    MountOp::IdmappedBind {
        index: 0,
        source: PathBuf::from("/srv/vol"),
        path: "/data".into(),
        readonly,
    }
}

#[test]
fn idmapped_tree_is_attached_then_made_readonly() {
    let k = FakeKernel::new(ROOT_DIR);
    let mut trees = [Some(FakeFd("idmapped:/srv/vol".into()))];
    apply_ops(&k, Path::new(ROOT_DIR), &[idmapped(true)], &mut trees, None).unwrap();
    assert_eq!(
        k.mount_calls(),
        [
            onto("idmapped:/srv/vol", "/data"),
            setattr("/data", true, RO)
        ]
    );
    assert_eq!(trees[0], None, "the tree is taken");
}

#[test]
fn failed_idmapped_move_falls_back_to_a_plain_bind() {
    let k = FakeKernel::new(ROOT_DIR).fail(
        libc::EINVAL,
        |c| matches!(c, Call::MoveMountOnto { tree, .. } if tree.starts_with("idmapped:")),
    );
    let mut trees = [Some(FakeFd("idmapped:/srv/vol".into()))];
    apply_ops(
        &k,
        Path::new(ROOT_DIR),
        &[idmapped(false)],
        &mut trees,
        None,
    )
    .unwrap();
    assert_eq!(
        k.mount_calls(),
        [
            onto("idmapped:/srv/vol", "/data"),
            Call::Mount {
                source: Some("host:/srv/vol".into()),
                target: "/data".into(),
                fstype: None,
                flags: libc::MS_BIND | libc::MS_REC,
                data: None,
            },
            setattr(
                "/data",
                true,
                sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV
            ),
        ]
    );
}

#[test]
fn read_only_op_rebinds_an_existing_path_and_skips_a_missing_one() {
    let k = FakeKernel::new(ROOT_DIR).with_dirs(&["/usr"]);
    let ops = [
        MountOp::ReadOnly {
            path: "/usr".into(),
        },
        MountOp::ReadOnly {
            path: "/opt".into(),
        },
    ];
    run(&k, &ops).unwrap();
    assert_eq!(
        k.mount_calls(),
        [
            Call::Mount {
                source: Some("/usr".into()),
                target: "/usr".into(),
                fstype: None,
                flags: libc::MS_BIND | libc::MS_REC,
                data: None,
            },
            setattr("/usr", true, RO),
        ]
    );
    assert_eq!(k.entry("/opt"), None);
}

fn secret(uid: Option<u32>, gid: Option<u32>, user: &str) -> MountOp {
    MountOp::SecretFile {
        path: "/run/secrets/token".into(),
        contents: super::super::SecretText("s3cret".into()),
        mode: 0o400,
        uid,
        gid,
        user: user.into(),
    }
}

fn owned_writes(k: &FakeKernel) -> Vec<(String, u32, u32, u32)> {
    k.calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::WriteOwnedAt {
                path,
                mode,
                uid,
                gid,
                ..
            } => Some((path, mode, uid, gid)),
            _ => None,
        })
        .collect()
}

#[test]
fn secret_file_gets_the_sandbox_users_owner_and_its_mode() {
    let k = FakeKernel::new(ROOT_DIR)
        .with_file("/etc/passwd", "app:x:1500:1600::/home/app:/bin/sh\n")
        .with_file("/etc/group", "app:x:1600:\n");
    run(&k, &[secret(None, None, "app")]).unwrap();
    assert_eq!(
        owned_writes(&k),
        [("/run/secrets/token".into(), 0o400, 1500, 1600)]
    );
    assert_eq!(
        k.entry("/run/secrets/token"),
        Some(Entry::File(b"s3cret".to_vec()))
    );
}

#[test]
fn secret_file_with_explicit_ids_reads_no_account_database() {
    let k = FakeKernel::new(ROOT_DIR);
    run(&k, &[secret(Some(42), Some(43), "app")]).unwrap();
    assert_eq!(
        owned_writes(&k),
        [("/run/secrets/token".into(), 0o400, 42, 43)]
    );
    assert!(!k
        .calls()
        .iter()
        .any(|c| matches!(c, Call::ReadInRoot { .. })));
}

#[test]
fn existing_secret_file_is_refused_not_overwritten() {
    let k = FakeKernel::new(ROOT_DIR).with_file("/run/secrets/token", "planted");
    let err = run(&k, &[secret(Some(42), Some(43), "app")]).unwrap_err();
    assert_eq!(
        apply_error(err),
        ("write", "/run/secrets/token".into(), Some(libc::EEXIST))
    );
}

fn host_etc() -> MountOp {
    MountOp::HostEtc {
        entries: vec![
            ("hosts".into(), HostEntry::File),
            ("ssl".into(), HostEntry::Dir),
            (
                "localtime".into(),
                HostEntry::Symlink("/usr/share/zoneinfo/UTC".into()),
            ),
        ],
        use_view: true,
    }
}

fn symlinks(k: &FakeKernel) -> Vec<(String, String)> {
    k.calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Symlinkat { path, target } => Some((path, target)),
            _ => None,
        })
        .collect()
}

#[test]
fn host_etc_view_is_attached_once_and_entries_link_into_it() {
    let k = FakeKernel::new(ROOT_DIR);
    let view = Some(FakeFd("etc-view".into()));
    apply_ops(&k, Path::new(ROOT_DIR), &[host_etc()], &mut [], view).unwrap();
    assert_eq!(k.mount_calls(), [onto("etc-view", HOST_ETC_VIEW)]);
    assert_eq!(
        symlinks(&k),
        [
            ("/etc/hosts".into(), format!("{HOST_ETC_VIEW}/hosts")),
            ("/etc/ssl".into(), format!("{HOST_ETC_VIEW}/ssl")),
            ("/etc/localtime".into(), "/usr/share/zoneinfo/UTC".into()),
        ]
    );
}

#[test]
fn host_etc_falls_back_to_readonly_binds_when_attaching_the_view_fails() {
    let k = FakeKernel::new(ROOT_DIR).fail(
        libc::EINVAL,
        |c| matches!(c, Call::MoveMountOnto { tree, .. } if tree == "etc-view"),
    );
    let view = Some(FakeFd("etc-view".into()));
    apply_ops(&k, Path::new(ROOT_DIR), &[host_etc()], &mut [], view).unwrap();
    let attached = attaches(&k);
    assert_eq!(
        attached,
        [
            onto("etc-view", HOST_ETC_VIEW),
            at("tree:/etc/hosts", "/etc/hosts"),
            at("tree:/etc/ssl", "/etc/ssl"),
        ]
    );
    assert!(k
        .mount_calls()
        .contains(&setattr("tree:/etc/hosts", true, RO)));
    assert_eq!(
        symlinks(&k),
        [("/etc/localtime".into(), "/usr/share/zoneinfo/UTC".into())]
    );
    assert_eq!(k.entry("/etc/hosts"), Some(Entry::File(Vec::new())));
}

#[test]
fn host_etc_without_the_view_binds_and_attaches_nothing() {
    let k = FakeKernel::new(ROOT_DIR);
    let mut op = host_etc();
    if let MountOp::HostEtc { use_view, .. } = &mut op {
        *use_view = false;
    }
    let view = Some(FakeFd("etc-view".into()));
    apply_ops(&k, Path::new(ROOT_DIR), &[op], &mut [], view).unwrap();
    assert!(!k.mount_calls().contains(&onto("etc-view", HOST_ETC_VIEW)));
    assert_eq!(k.entry(HOST_ETC_VIEW), None);
}

#[test]
fn new_dir_gets_its_mode_and_owner() {
    let k = FakeKernel::new(ROOT_DIR).with_dirs(&["/home"]);
    let ops = [MountOp::Dir {
        path: "/home/user".into(),
        mode: 0o750,
        uid: 1000,
        gid: 1000,
    }];
    run(&k, &ops).unwrap();
    let effects: Vec<_> = k
        .calls()
        .into_iter()
        .filter(|c| {
            matches!(
                c,
                Call::Mkdirat { .. } | Call::Fchmod { .. } | Call::Fchown { .. }
            )
        })
        .collect();
    assert_eq!(
        effects,
        [
            Call::Mkdirat {
                path: "/home/user".into(),
                mode: 0o700
            },
            Call::Fchmod {
                path: "/home/user".into(),
                mode: 0o750
            },
            Call::Fchown {
                path: "/home/user".into(),
                uid: 1000,
                gid: 1000
            },
        ]
    );
}

#[test]
fn tmpfs_root_is_nosuid_nodev_with_its_size() {
    let k = FakeKernel::new(ROOT_DIR);
    let root = RootFs::Tmpfs {
        size: TmpfsLimit::of_size(8 << 20),
    };
    let info = mount_root_with(&k, &root, Path::new(ROOT_DIR), None).unwrap();
    assert!(!info.idmapped);
    assert_eq!(
        k.mount_calls(),
        [mount(
            "sandlot",
            ROOT_DIR,
            "tmpfs",
            libc::MS_NOSUID | libc::MS_NODEV,
            "size=8388608,nr_inodes=2048,mode=0755"
        )]
    );
}

#[test]
fn writable_layer_that_cannot_be_idmapped_is_refused_when_idmapping_is_required() {
    let root = RootFs::Layers {
        lowers: vec![PathBuf::from("/var/lib/sandlot/layers/a")],
        rw: Some(PathBuf::from("/var/lib/sandlot/rw/s1")),
        size: TmpfsLimit::of_size(8 << 20),
    };
    let refuse_idmap = |c: &Call| matches!(c, Call::MoveMountTo { .. });
    let at = Path::new(ROOT_DIR);

    let k = FakeKernel::new(ROOT_DIR).fail(libc::EINVAL, refuse_idmap);
    let mut trees = [
        Some(FakeFd("idmapped:a".into())),
        Some(FakeFd("idmapped:rw".into())),
    ];
    let err = mount_layers_with(&k, &root, at, &mut trees, true).unwrap_err();
    assert_eq!(apply_error(err).0, "idmap the writable layer",);

    let k = FakeKernel::new(ROOT_DIR).fail(libc::EINVAL, refuse_idmap);
    let mut trees = [
        Some(FakeFd("idmapped:a".into())),
        Some(FakeFd("idmapped:rw".into())),
    ];
    let info = mount_layers_with(&k, &root, at, &mut trees, false).unwrap();
    assert!(!info.idmapped, "plain binds");
    let Some(Call::Mount {
        data: Some(opts), ..
    }) = k.mount_calls().pop()
    else {
        panic!("no overlay mount");
    };
    assert_eq!(
        opts,
        format!(
            "lowerdir={ROOT_DIR}/.sandlot-l0,upperdir={ROOT_DIR}/.sandlot-rw/upper,\
             workdir={ROOT_DIR}/.sandlot-rw/work,userxattr"
        )
    );
}

#[test]
fn pinned_bind_clones_the_reopened_file_never_the_path() {
    let k = FakeKernel::new(ROOT_DIR).with_host_device("/dev/kvm");
    let op = MountOp::Bind {
        source: PathBuf::from("/dev/kvm"),
        path: "/dev/kvm".into(),
        readonly: false,
        kind: Kind::File,
        required: true,
        pinned: Some(HostId { dev: 5, ino: 77 }),
    };
    run(&k, &[op]).unwrap();
    assert_eq!(
        k.mount_calls(),
        [
            Call::OpenTreeCloneFd {
                source: "host:/dev/kvm".into(),
                recursive: true,
            },
            // A device node: nosuid, but not nodev.
            setattr("tree:host:/dev/kvm", true, sys::MOUNT_ATTR_NOSUID),
            onto("tree:host:/dev/kvm", "/dev/kvm"),
        ]
    );
    assert!(k.calls().contains(&Call::ReopenPinned {
        source: "/dev/kvm".into()
    }));
}

#[test]
fn a_parent_opened_before_a_mount_is_opened_again_after_it() {
    // A descriptor of /etc taken before a tmpfs is mounted on /etc names the
    // covered directory: files made after the mount must go into the tmpfs.
    let k = FakeKernel::new(ROOT_DIR).with_dirs(&["/etc"]);
    let file = |path: &str| MountOp::File {
        path: path.into(),
        contents: "x\n".into(),
        mode: 0o644,
    };
    let ops = [
        file("/etc/a"),
        MountOp::Tmpfs {
            path: "/etc".into(),
            size: TmpfsLimit::of_size(1 << 20),
            mode: 0o755,
            noexec: false,
        },
        file("/etc/b"),
    ];
    run(&k, &ops).unwrap();
    let opens_of_etc = k
        .calls()
        .into_iter()
        .filter(|c| matches!(c, Call::OpenInRoot { path } if path == "/etc"))
        .count();
    assert_eq!(opens_of_etc, 3, "{:?}", k.calls());
    let mounted_at = k
        .calls()
        .iter()
        .position(|c| matches!(c, Call::Mount { fstype: Some(t), .. } if t == "tmpfs"))
        .unwrap();
    let reopened = k
        .calls()
        .iter()
        .rposition(|c| matches!(c, Call::OpenInRoot { path } if path == "/etc"))
        .unwrap();
    assert!(reopened > mounted_at, "{:?}", k.calls());
}

#[test]
fn a_file_and_a_symlink_are_made_in_their_parent_directory() {
    let k = FakeKernel::new(ROOT_DIR).with_dirs(&["/etc"]);
    let ops = [
        MountOp::File {
            path: "/etc/hostname".into(),
            contents: "sb\n".into(),
            mode: 0o644,
        },
        MountOp::Symlink {
            path: "/etc/mtab".into(),
            target: "/proc/self/mounts".into(),
        },
    ];
    run(&k, &ops).unwrap();
    let made: Vec<_> = k
        .calls()
        .into_iter()
        .filter(|c| matches!(c, Call::WriteAt { .. } | Call::Symlinkat { .. }))
        .collect();
    assert_eq!(
        made,
        [
            Call::WriteAt {
                path: "/etc/hostname".into(),
                data: b"sb\n".to_vec(),
                mode: 0o644
            },
            Call::Symlinkat {
                path: "/etc/mtab".into(),
                target: "/proc/self/mounts".into()
            },
        ]
    );
}

#[test]
fn host_etc_binds_go_through_the_parent_kept_open_not_a_lookup_per_entry() {
    let k = FakeKernel::new(ROOT_DIR);
    let op = MountOp::HostEtc {
        entries: vec![
            ("hosts".into(), HostEntry::File),
            ("services".into(), HostEntry::File),
            ("ssl/certs".into(), HostEntry::Dir),
            ("ssl/openssl.cnf".into(), HostEntry::File),
        ],
        use_view: false,
    };
    apply_ops(&k, Path::new(ROOT_DIR), &[op], &mut [], None).unwrap();
    let attached = attaches(&k);
    assert_eq!(
        attached,
        [
            at("tree:/etc/hosts", "/etc/hosts"),
            at("tree:/etc/services", "/etc/services"),
            at("tree:/etc/ssl/certs", "/etc/ssl/certs"),
            at("tree:/etc/ssl/openssl.cnf", "/etc/ssl/openssl.cnf"),
        ]
    );
    for ro in ["hosts", "services", "ssl/certs", "ssl/openssl.cnf"] {
        let tree = format!("tree:/etc/{ro}");
        assert!(k.mount_calls().contains(&setattr(&tree, true, RO)), "{ro}");
    }
    assert_eq!(k.entry("/etc/hosts"), Some(Entry::File(Vec::new())));
    assert_eq!(k.entry("/etc/ssl/certs"), Some(Entry::Dir));
    let lookups: Vec<String> = k
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::OpenInRoot { path } => Some(path),
            _ => None,
        })
        .collect();
    // Each directory is resolved from the root while it is made, never an entry.
    assert_eq!(
        lookups,
        ["/etc", "/", "/etc", "/etc/ssl", "/etc", "/etc/ssl"],
        "{lookups:?}"
    );
}

#[test]
fn a_host_etc_entry_the_root_has_already_is_resolved_in_the_root_and_kept() {
    // An image's own `/etc/hosts` (a root with layers).
    let k = FakeKernel::new(ROOT_DIR).with_file("/etc/hosts", "image");
    let op = MountOp::HostEtc {
        entries: vec![
            ("hosts".into(), HostEntry::File),
            ("services".into(), HostEntry::File),
        ],
        use_view: false,
    };
    apply_ops(&k, Path::new(ROOT_DIR), &[op], &mut [], None).unwrap();
    // Neither truncated nor replaced: bound over, as before.
    assert_eq!(k.entry("/etc/hosts"), Some(Entry::File(b"image".to_vec())));
    let attached = attaches(&k);
    assert_eq!(
        attached,
        [
            onto("tree:/etc/hosts", "/etc/hosts"),
            at("tree:/etc/services", "/etc/services"),
        ]
    );
    assert!(k.calls().contains(&Call::OpenInRoot {
        path: "/etc/hosts".into()
    }));
    assert!(!k.calls().contains(&Call::OpenInRoot {
        path: "/etc/services".into()
    }));
}

#[test]
fn a_link_an_image_put_at_a_host_etc_entry_is_resolved_in_the_root_never_attached_by_name() {
    // A root with layers whose `/etc/hosts` is a link out of it: the target is
    // resolved in the root (`RESOLVE_IN_ROOT` in the kernel), never attached onto
    // the link's name nor created through it.
    let k = FakeKernel::new(ROOT_DIR).with_symlink("/etc/hosts", "../../../etc/shadow");
    let op = MountOp::HostEtc {
        entries: vec![("hosts".into(), HostEntry::File)],
        use_view: false,
    };
    apply_ops(&k, Path::new(ROOT_DIR), &[op], &mut [], None).unwrap();
    assert_eq!(
        k.entry("/etc/hosts"),
        Some(Entry::Symlink("../../../etc/shadow".into()))
    );
    assert!(k.calls().contains(&Call::OpenInRoot {
        path: "/etc/hosts".into()
    }));
    let attached = attaches(&k);
    assert_eq!(attached, [onto("tree:/etc/hosts", "/etc/hosts")]);
}

/// The attaches of detached trees `k` made, in order, by descriptor or by name.
fn attaches(k: &FakeKernel) -> Vec<Call> {
    k.mount_calls()
        .into_iter()
        .filter(|c| matches!(c, Call::MoveMountOnto { .. } | Call::MoveMountAt { .. }))
        .collect()
}

#[test]
fn a_link_loop_in_the_image_is_the_images_problem_and_a_host_refusal_is_not() {
    let dir = MountOp::Dir {
        path: "/tmp".into(),
        mode: 0o1777,
        uid: 0,
        gid: 0,
    };
    // `/tmp` a loop of links: the fast path and the walk in the root both meet ELOOP.
    let k = FakeKernel::new(ROOT_DIR).fail(libc::ELOOP, |c| {
        matches!(c, Call::OpenDirNofollow { .. } | Call::OpenInRoot { .. })
    });
    match run(&k, std::slice::from_ref(&dir)).unwrap_err() {
        MountError::InRoot {
            op, path, problem, ..
        } => {
            assert_eq!((op, path.as_str()), ("mkdir", "/tmp"));
            assert!(problem.contains("symbolic link"), "{problem}");
        }
        other => panic!("not the image's problem: {other:?}"),
    }
    // The same step refused by the kernel for want of rights is the daemon's.
    let k = FakeKernel::new(ROOT_DIR).fail(libc::EPERM, |c| {
        matches!(c, Call::OpenDirNofollow { .. } | Call::OpenInRoot { .. })
    });
    assert_eq!(
        apply_error(run(&k, &[dir]).unwrap_err()),
        ("mkdir", "/tmp".into(), Some(libc::EPERM))
    );
}

#[test]
fn the_runtimes_file_replaces_a_link_the_image_has_there_never_writing_through_it() {
    let k = FakeKernel::new(ROOT_DIR)
        .with_dirs(&["/etc", "/run"])
        .with_symlink("/etc/resolv.conf", "../run/elsewhere/resolv.conf");
    let ops = [MountOp::File {
        path: "/etc/resolv.conf".into(),
        contents: "nameserver 10.0.0.1\n".into(),
        mode: 0o644,
    }];
    run(&k, &ops).unwrap();
    assert!(k.calls().contains(&Call::Unlinkat {
        path: "/etc/resolv.conf".into()
    }));
    assert_eq!(
        k.entry("/etc/resolv.conf"),
        Some(Entry::File(b"nameserver 10.0.0.1\n".to_vec()))
    );
    assert!(k.entry("/run/elsewhere/resolv.conf").is_none());
    // A directory there is the image's to mend: a 400 naming the path.
    let k = FakeKernel::new(ROOT_DIR).with_dirs(&["/etc", "/etc/resolv.conf"]);
    match run(&k, &ops).unwrap_err() {
        MountError::InRoot { path, problem, .. } => {
            assert_eq!(path, "/etc/resolv.conf");
            assert!(
                problem.contains("a directory where a file must be"),
                "{problem}"
            );
        }
        other => panic!("{other:?}"),
    }
}
