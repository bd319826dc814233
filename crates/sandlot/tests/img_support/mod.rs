//! Helpers of the image tests: a small root filesystem made of host programs and
//! their libraries, and OCI archives built with the image store itself (there is no
//! docker here).

#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use sandlot_store::{oci, ImageConfig, ImageName, ImageStore, LayerInfo};

/// Programs the tests run inside image sandboxes.
pub const PROGRAMS: &[&str] = &[
    "sh", "cat", "ls", "echo", "id", "stat", "mkdir", "rm", "dd", "printenv", "touch", "sleep",
    "head", "wc", "pwd", "env", "true", "chmod", "ln",
];

fn copy_with_parents(src: &Path, root: &Path) {
    let dst = root.join(src.strip_prefix("/").unwrap());
    fs::create_dir_all(dst.parent().unwrap()).unwrap();
    fs::copy(src, &dst).unwrap_or_else(|e| panic!("copy {}: {e}", src.display()));
}

/// A merged-/usr root filesystem with [`PROGRAMS`] and their shared libraries.
pub fn mini_rootfs(root: &Path) {
    fs::create_dir_all(root.join("usr/bin")).unwrap();
    for (l, t) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("sbin", "usr/bin"),
    ] {
        let _ = std::os::unix::fs::symlink(t, root.join(l));
    }
    for d in [
        "etc",
        "tmp",
        "root",
        "home/user",
        "run",
        "var/tmp",
        "proc",
        "sys",
        "dev",
        "opt",
    ] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    fs::set_permissions(root.join("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n",
    )
    .unwrap();
    fs::write(root.join("etc/group"), "root:x:0:\nuser:x:1000:\n").unwrap();
    fs::write(root.join("etc/os-release"), "ID=sandlot-test\n").unwrap();
    let mut libs = std::collections::BTreeSet::new();
    for p in PROGRAMS {
        let src = PathBuf::from("/usr/bin").join(p);
        fs::copy(&src, root.join("usr/bin").join(p))
            .unwrap_or_else(|e| panic!("copy {}: {e}", src.display()));
        let out = Command::new("ldd").arg(&src).output().unwrap();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let path = line
                .split("=>")
                .last()
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap_or("");
            if path.starts_with('/') {
                libs.insert(PathBuf::from(path));
            }
        }
    }
    for l in libs {
        // Copy to the real (merged-/usr) path; /lib and /lib64 are symlinks there.
        let real = fs::canonicalize(l.parent().unwrap())
            .unwrap()
            .join(l.file_name().unwrap());
        copy_with_parents(&real, root);
    }
}

/// Builds an image of `layers` (directories, bottom first) in a temporary store and
/// writes it as an OCI/docker archive to `out`.
pub fn archive_of(tmp: &Path, layers: &[PathBuf], cfg: &ImageConfig, name: &str, out: &Path) {
    let store = ImageStore::open(&tmp.join("build-store")).unwrap();
    let ls: Vec<LayerInfo> = layers
        .iter()
        .map(|d| store.layer_from_dir(d).unwrap())
        .collect();
    let n = ImageName::parse(name).unwrap();
    let img = store
        .add_image(&ls, cfg, "test", None, "directory", Some(&n))
        .unwrap();
    let f = fs::File::create(out).unwrap();
    oci::export(&store, &img, &[n], f, &|_| {}).unwrap();
    fs::remove_dir_all(tmp.join("build-store")).unwrap();
}

/// A base image archive: the mini rootfs plus `extra` small layers.
pub fn base_archive(tmp: &Path, name: &str, extra_layers: usize) -> PathBuf {
    let root = tmp.join("rootfs");
    mini_rootfs(&root);
    let mut layers = vec![root];
    for i in 0..extra_layers {
        let d = tmp.join(format!("layer{i}"));
        fs::create_dir_all(d.join("opt/layers")).unwrap();
        fs::write(d.join(format!("opt/layers/{i}")), format!("layer {i}\n")).unwrap();
        layers.push(d);
    }
    let cfg = ImageConfig {
        env: vec!["PATH=/usr/bin:/bin".into(), "FROM_IMAGE=yes".into()],
        workdir: Some("/opt".into()),
        user: None,
        entrypoint: vec![],
        cmd: vec!["/bin/sh".into()],
        host_base: false,
    };
    let out = tmp.join(format!("{}.tar", name.replace(['/', ':'], "_")));
    archive_of(tmp, &layers, &cfg, name, &out);
    out
}
