//! [`FakeKernel`]: a [`MountSyscalls`] for the unit tests. It records every call as
//! a [`Call`], keeps a model of the entries under the sandbox's root (so the
//! decisions that depend on what exists are exercised), and fails the calls it is
//! told to with an errno. Nothing is mounted and no root is needed.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CStr, CString};
use std::io;
use std::path::Path;

use super::MountSyscalls;
use crate::host_path::HostId;

/// A descriptor of the fake: what it names. `/...` is a path under the sandbox's
/// root (`/` the root itself), `host:/...` a host path, `tree:...` a detached mount
/// tree cloned from what follows; tests name the idmapped trees they hand in.
/// [`MountSyscalls::fd_path`] gives the name itself, so a recorded `mount(2)` names
/// its target as a path in the sandbox where the real call has `/proc/self/fd/N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FakeFd(pub String);

/// One system call and its arguments. Descriptors appear as their [`FakeFd`] name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Call {
    OpenPath {
        path: String,
    },
    OpenInRoot {
        path: String,
    },
    ReadInRoot {
        path: String,
    },
    OpenDirNofollow {
        path: String,
    },
    ReopenPinned {
        source: String,
    },
    IsDevice {
        path: String,
    },
    CreateDir {
        path: String,
    },
    Mkdirat {
        path: String,
        mode: u32,
    },
    Touchat {
        path: String,
        mode: u32,
    },
    Symlinkat {
        path: String,
        target: String,
    },
    Rmdirat {
        path: String,
    },
    Unlinkat {
        path: String,
    },
    WriteAt {
        path: String,
        data: Vec<u8>,
        mode: u32,
    },
    WriteOwnedAt {
        path: String,
        data: Vec<u8>,
        mode: u32,
        uid: u32,
        gid: u32,
    },
    Fchmod {
        path: String,
        mode: u32,
    },
    ChmodFdPath {
        path: String,
        mode: u32,
    },
    Fchown {
        path: String,
        uid: u32,
        gid: u32,
    },
    Mount {
        source: Option<String>,
        target: String,
        fstype: Option<String>,
        flags: libc::c_ulong,
        data: Option<String>,
    },
    OpenTreeClone {
        source: String,
    },
    OpenTreeCloneFd {
        source: String,
        recursive: bool,
    },
    MoveMountTo {
        tree: String,
        target: String,
    },
    MoveMountOnto {
        tree: String,
        target: String,
    },
    /// Attached onto an entry by its name in a directory kept open.
    MoveMountAt {
        tree: String,
        target: String,
    },
    MountSetattr {
        mount: String,
        recursive: bool,
        set: u64,
    },
}

impl Call {
    /// Whether the call changes the mount table or a detached tree.
    pub(super) fn is_mount(&self) -> bool {
        matches!(
            self,
            Call::Mount { .. }
                | Call::OpenTreeClone { .. }
                | Call::OpenTreeCloneFd { .. }
                | Call::MoveMountTo { .. }
                | Call::MoveMountOnto { .. }
                | Call::MoveMountAt { .. }
                | Call::MountSetattr { .. }
        )
    }
}

/// An entry under the sandbox's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Entry {
    Dir,
    File(Vec<u8>),
    Symlink(String),
}

type Failure = (Box<dyn Fn(&Call) -> bool>, i32);

pub(super) struct FakeKernel {
    /// The host path of the sandbox's root: `open_path` of it gives the root (`/`).
    root_dir: String,
    entries: RefCell<BTreeMap<String, Entry>>,
    /// Host paths that do not exist (`open_tree_clone` of them fails with ENOENT).
    host_missing: BTreeSet<String>,
    /// Host paths that are device nodes.
    host_devices: BTreeSet<String>,
    failures: RefCell<Vec<Failure>>,
    calls: RefCell<Vec<Call>>,
}

impl FakeKernel {
    /// A root at the host path `root_dir` holding only `/`.
    pub(super) fn new(root_dir: &str) -> FakeKernel {
        FakeKernel {
            root_dir: root_dir.to_string(),
            entries: RefCell::new(BTreeMap::from([("/".to_string(), Entry::Dir)])),
            host_missing: BTreeSet::new(),
            host_devices: BTreeSet::new(),
            failures: RefCell::new(Vec::new()),
            calls: RefCell::new(Vec::new()),
        }
    }

    /// Adds directories under the root (and their parents).
    pub(super) fn with_dirs(self, paths: &[&str]) -> FakeKernel {
        for p in paths {
            self.add_parents(p);
            self.entries.borrow_mut().insert(p.to_string(), Entry::Dir);
        }
        self
    }

    /// Adds a file under the root (and its parents).
    pub(super) fn with_file(self, path: &str, contents: &str) -> FakeKernel {
        self.add_parents(path);
        self.entries
            .borrow_mut()
            .insert(path.to_string(), Entry::File(contents.as_bytes().to_vec()));
        self
    }

    /// Adds a symbolic link under the root (and its parents).
    pub(super) fn with_symlink(self, path: &str, target: &str) -> FakeKernel {
        self.add_parents(path);
        self.entries
            .borrow_mut()
            .insert(path.to_string(), Entry::Symlink(target.to_string()));
        self
    }

    /// Marks a host path as missing.
    pub(super) fn with_host_missing(mut self, path: &str) -> FakeKernel {
        self.host_missing.insert(path.to_string());
        self
    }

    /// Marks a host path as a device node.
    pub(super) fn with_host_device(mut self, path: &str) -> FakeKernel {
        self.host_devices.insert(path.to_string());
        self
    }

    /// Fails every call `which` matches with `errno` (the call is still recorded).
    pub(super) fn fail(self, errno: i32, which: impl Fn(&Call) -> bool + 'static) -> FakeKernel {
        self.failures.borrow_mut().push((Box::new(which), errno));
        self
    }

    pub(super) fn calls(&self) -> Vec<Call> {
        self.calls.borrow().clone()
    }

    /// The calls that change the mount table or a detached tree, in order.
    pub(super) fn mount_calls(&self) -> Vec<Call> {
        self.calls().into_iter().filter(Call::is_mount).collect()
    }

    pub(super) fn entry(&self, path: &str) -> Option<Entry> {
        self.entries.borrow().get(path).cloned()
    }

    fn add_parents(&self, path: &str) {
        let mut p = Path::new(path);
        while let Some(parent) = p.parent() {
            self.entries
                .borrow_mut()
                .entry(parent.to_str().expect("UTF-8").to_string())
                .or_insert(Entry::Dir);
            p = parent;
        }
    }

    /// Records `call`; the errno it is told to fail it with, if any.
    fn record(&self, call: Call) -> io::Result<()> {
        let failed = self
            .failures
            .borrow()
            .iter()
            .find(|(which, _)| which(&call))
            .map(|(_, errno)| *errno);
        self.calls.borrow_mut().push(call);
        match failed {
            Some(errno) => Err(io::Error::from_raw_os_error(errno)),
            None => Ok(()),
        }
    }

    /// The path under the root of `name` in the directory `dir`.
    fn join(dir: &FakeFd, name: &CStr) -> String {
        let name = text(name);
        match dir.0.as_str() {
            "/" => format!("/{name}"),
            d => format!("{d}/{name}"),
        }
    }

    /// Creates the entry `path` if its parent is a directory and it does not exist.
    fn create(&self, path: &str, entry: Entry) -> io::Result<()> {
        let mut entries = self.entries.borrow_mut();
        let parent = Path::new(path)
            .parent()
            .and_then(Path::to_str)
            .unwrap_or("/");
        match entries.get(parent) {
            Some(Entry::Dir) => {}
            Some(_) => return Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
            None => return Err(io::Error::from_raw_os_error(libc::ENOENT)),
        }
        if entries.contains_key(path) {
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
        entries.insert(path.to_string(), entry);
        Ok(())
    }
}

fn text(c: &CStr) -> String {
    c.to_str().expect("UTF-8").to_string()
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

impl MountSyscalls for FakeKernel {
    type Fd = FakeFd;

    fn open_path(&self, path: &CStr, _nofollow: bool) -> io::Result<FakeFd> {
        let path = text(path);
        self.record(Call::OpenPath { path: path.clone() })?;
        if path == self.root_dir {
            return Ok(FakeFd("/".into()));
        }
        if self.host_missing.contains(&path) {
            return Err(errno(libc::ENOENT));
        }
        Ok(FakeFd(format!("host:{path}")))
    }

    fn open_in_root(&self, root: &FakeFd, path: &CStr) -> io::Result<FakeFd> {
        assert_eq!(root.0, "/", "resolved under something else than the root");
        let path = text(path);
        self.record(Call::OpenInRoot { path: path.clone() })?;
        match self.entry(&path) {
            Some(_) => Ok(FakeFd(path)),
            None => Err(errno(libc::ENOENT)),
        }
    }

    fn read_in_root(&self, _root: &FakeFd, path: &CStr, _limit: u64) -> io::Result<Vec<u8>> {
        let path = text(path);
        self.record(Call::ReadInRoot { path: path.clone() })?;
        match self.entry(&path) {
            Some(Entry::File(data)) => Ok(data),
            Some(_) => Err(errno(libc::EISDIR)),
            None => Err(errno(libc::ENOENT)),
        }
    }

    fn open_dir_nofollow(&self, dir: &FakeFd, name: &CStr) -> io::Result<FakeFd> {
        let path = Self::join(dir, name);
        self.record(Call::OpenDirNofollow { path: path.clone() })?;
        match self.entry(&path) {
            Some(Entry::Dir) => Ok(FakeFd(path)),
            Some(Entry::Symlink(_)) => Err(errno(libc::ELOOP)),
            Some(Entry::File(_)) => Err(errno(libc::ENOTDIR)),
            None => Err(errno(libc::ENOENT)),
        }
    }

    fn reopen_pinned(&self, source: &Path, _id: HostId) -> io::Result<(FakeFd, u32)> {
        let source = source.to_str().expect("UTF-8").to_string();
        self.record(Call::ReopenPinned {
            source: source.clone(),
        })?;
        if self.host_missing.contains(&source) {
            return Err(errno(libc::ENOENT));
        }
        let mode = if self.host_devices.contains(&source) {
            libc::S_IFCHR | 0o666
        } else {
            libc::S_IFDIR | 0o755
        };
        Ok((FakeFd(format!("host:{source}")), mode))
    }

    fn fd_path(&self, fd: &FakeFd) -> CString {
        CString::new(fd.0.clone()).expect("no NUL")
    }

    fn is_device(&self, path: &Path) -> bool {
        let path = path.to_str().expect("UTF-8").to_string();
        let device = self.host_devices.contains(&path);
        let _ = self.record(Call::IsDevice { path });
        device
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        self.record(Call::CreateDir {
            path: path.to_str().expect("UTF-8").to_string(),
        })
    }

    fn mkdirat(&self, dir: &FakeFd, name: &CStr, mode: u32) -> io::Result<()> {
        let path = Self::join(dir, name);
        self.record(Call::Mkdirat {
            path: path.clone(),
            mode,
        })?;
        self.create(&path, Entry::Dir)
    }

    fn touchat(&self, dir: &FakeFd, name: &CStr, mode: u32) -> io::Result<()> {
        let path = Self::join(dir, name);
        self.record(Call::Touchat {
            path: path.clone(),
            mode,
        })?;
        match self.create(&path, Entry::File(Vec::new())) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            r => r,
        }
    }

    fn create_file_at(&self, dir: &FakeFd, name: &CStr, mode: u32) -> io::Result<()> {
        let path = Self::join(dir, name);
        self.record(Call::Touchat {
            path: path.clone(),
            mode,
        })?;
        self.create(&path, Entry::File(Vec::new()))
    }

    fn symlinkat(&self, dir: &FakeFd, name: &CStr, target: &CStr) -> io::Result<()> {
        let path = Self::join(dir, name);
        self.record(Call::Symlinkat {
            path: path.clone(),
            target: text(target),
        })?;
        self.create(&path, Entry::Symlink(text(target)))
    }

    fn rmdirat(&self, dir: &FakeFd, name: &CStr) -> io::Result<()> {
        let path = Self::join(dir, name);
        self.record(Call::Rmdirat { path: path.clone() })?;
        match self.entries.borrow_mut().remove(&path) {
            Some(Entry::Dir) => Ok(()),
            _ => Err(errno(libc::ENOENT)),
        }
    }

    fn unlinkat(&self, dir: &FakeFd, name: &CStr) -> io::Result<()> {
        let path = Self::join(dir, name);
        self.record(Call::Unlinkat { path: path.clone() })?;
        match self.entry(&path) {
            Some(Entry::Dir) => Err(errno(libc::EISDIR)),
            Some(_) => {
                self.entries.borrow_mut().remove(&path);
                Ok(())
            }
            None => Err(errno(libc::ENOENT)),
        }
    }

    fn write_at(&self, dir: &FakeFd, name: &CStr, data: &[u8], mode: u32) -> io::Result<()> {
        let path = Self::join(dir, name);
        self.record(Call::WriteAt {
            path: path.clone(),
            data: data.to_vec(),
            mode,
        })?;
        match self.entry(&path) {
            Some(Entry::Dir) => return Err(errno(libc::EISDIR)),
            Some(Entry::Symlink(_)) => return Err(errno(libc::ELOOP)),
            _ => {}
        }
        self.entries.borrow_mut().remove(&path);
        self.create(&path, Entry::File(data.to_vec()))
    }

    fn write_owned_at(
        &self,
        dir: &FakeFd,
        name: &CStr,
        data: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> io::Result<()> {
        let path = Self::join(dir, name);
        self.record(Call::WriteOwnedAt {
            path: path.clone(),
            data: data.to_vec(),
            mode,
            uid,
            gid,
        })?;
        self.create(&path, Entry::File(data.to_vec()))
    }

    fn fchmod(&self, fd: &FakeFd, mode: u32) -> io::Result<()> {
        self.record(Call::Fchmod {
            path: fd.0.clone(),
            mode,
        })
    }

    fn chmod_fd_path(&self, fd: &FakeFd, mode: u32) -> io::Result<()> {
        self.record(Call::ChmodFdPath {
            path: fd.0.clone(),
            mode,
        })
    }

    fn fchown(&self, fd: &FakeFd, uid: u32, gid: u32) -> io::Result<()> {
        self.record(Call::Fchown {
            path: fd.0.clone(),
            uid,
            gid,
        })
    }

    fn mount(
        &self,
        source: Option<&CStr>,
        target: &CStr,
        fstype: Option<&CStr>,
        flags: libc::c_ulong,
        data: Option<&CStr>,
    ) -> io::Result<()> {
        self.record(Call::Mount {
            source: source.map(text),
            target: text(target),
            fstype: fstype.map(text),
            flags,
            data: data.map(text),
        })
    }

    fn open_tree_clone(&self, path: &CStr) -> io::Result<FakeFd> {
        let source = text(path);
        self.record(Call::OpenTreeClone {
            source: source.clone(),
        })?;
        if self.host_missing.contains(&source) {
            return Err(errno(libc::ENOENT));
        }
        Ok(FakeFd(format!("tree:{source}")))
    }

    fn open_tree_clone_fd(&self, fd: &FakeFd, recursive: bool) -> io::Result<FakeFd> {
        self.record(Call::OpenTreeCloneFd {
            source: fd.0.clone(),
            recursive,
        })?;
        Ok(FakeFd(format!("tree:{}", fd.0)))
    }

    fn move_mount_to(&self, tree: &FakeFd, target: &CStr) -> io::Result<()> {
        self.record(Call::MoveMountTo {
            tree: tree.0.clone(),
            target: text(target),
        })
    }

    fn move_mount_onto(&self, tree: &FakeFd, target: &FakeFd) -> io::Result<()> {
        self.record(Call::MoveMountOnto {
            tree: tree.0.clone(),
            target: target.0.clone(),
        })
    }

    fn move_mount_at(&self, tree: &FakeFd, dir: &FakeFd, name: &CStr) -> io::Result<()> {
        self.record(Call::MoveMountAt {
            tree: tree.0.clone(),
            target: Self::join(dir, name),
        })
    }

    fn mount_setattr(&self, fd: &FakeFd, recursive: bool, set: u64) -> io::Result<()> {
        self.record(Call::MountSetattr {
            mount: fd.0.clone(),
            recursive,
            set,
        })
    }
}
