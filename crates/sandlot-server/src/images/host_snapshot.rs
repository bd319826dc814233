//! Snapshots of `host` image sandboxes. Their writable layer is the root tmpfs PID 1
//! mounted in its own mount namespace, with the host's `/usr`, the `/etc` entries,
//! `/proc`, `/dev` and every volume mounted on it. The daemon reads it through
//! `/proc/PID/root` with the sandbox frozen, its own filesystem only (every entry on
//! another device, a mount point, is left out), and records the in-sandbox owner of
//! each file (the tmpfs holds the host ids of the sandbox's id range). The image has
//! that one layer and no parent; it is marked to go on top of the `host` image
//! (`ImageConfig::host_base`), so a sandbox of it gets the host's entries bound over
//! the layer and `/etc` synthesized again, as a `host` sandbox does. It depends on
//! the host it is restored on: its programs and libraries are that host's.

use std::collections::BTreeSet;
use std::fs;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sandlot_store::{Commit, IdMap, ImageConfig, ImageInfo, ImageName, PackSource, ScopedTag};

use super::{store_error, Images};
use crate::error::ApiError;

/// A sandbox's PID 1, as a snapshot needs it.
pub struct HostRoot<'a> {
    pub pid: i32,
    /// Its pidfd: `pid` is read only while it is still this process.
    pub pidfd: &'a OwnedFd,
}

impl HostRoot<'_> {
    /// The paths (relative to the sandbox's root) where something is mounted in
    /// sandbox `id`, as its PID 1 sees them: where the runtime made stubs to mount
    /// on in its writable layer.
    pub fn mount_points(&self, id: &str) -> Result<BTreeSet<PathBuf>, ApiError> {
        let gone = || ApiError::conflict(format!("sandbox {id} is stopping"));
        let text =
            fs::read_to_string(format!("/proc/{}/mountinfo", self.pid)).map_err(|_| gone())?;
        // Read while the pidfd says PID 1 has not exited: the text is this sandbox's.
        if exited(self.pidfd) {
            return Err(gone());
        }
        Ok(
            crate::collection_mount::mount_points_under(&text, Path::new("/"))
                .into_iter()
                .filter_map(|p| p.strip_prefix("/").ok().map(Path::to_path_buf))
                .filter(|p| !p.as_os_str().is_empty())
                .collect(),
        )
    }
}

impl Images {
    /// Turns a running `host` sandbox's writable layer into a new image (one
    /// layer, no parent, on top of the `host` image) owned by `tenant`, tagged
    /// `tag` in `scope`'s namespace. Bounded by the sandbox's disk limit `disk`
    /// like any snapshot (413 past it, nothing stored).
    #[allow(clippy::too_many_arguments)]
    pub fn snapshot_host(
        &self,
        id: &str,
        root: HostRoot<'_>,
        tenant: &str,
        scope: Option<&str>,
        cgroup: &sandlot_runtime::cgroup::Cgroup,
        tag: Option<&ImageName>,
        disk: u64,
    ) -> Result<(ImageInfo, Duration), ApiError> {
        let gone = || ApiError::conflict(format!("sandbox {id} is stopping"));
        // /proc/PID, opened while the pidfd says the process has not exited: the
        // directory is this sandbox's PID 1 even if the pid is reused later.
        let proc_dir = fs::File::open(format!("/proc/{}", root.pid)).map_err(|_| gone())?;
        if exited(root.pidfd) {
            return Err(gone());
        }
        let proc_path = PathBuf::from(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&proc_dir)
        ));
        let map = |name: &str| fs::read_to_string(proc_path.join(name)).map_err(|_| gone());
        let ids = IdMap::parse(&map("uid_map")?, &map("gid_map")?).ok_or_else(|| {
            ApiError::internal(format!("sandbox {id}: unreadable uid_map or gid_map"))
        })?;
        let source = PackSource {
            one_filesystem: true,
            ids: Some(ids),
            ..Default::default()
        };
        let (packed, took) =
            self.pack_frozen(id, cgroup, &proc_path.join("root"), &source, disk)?;
        let config = ImageConfig {
            host_base: true,
            ..Default::default()
        };
        let img = self
            .store
            .commit_packed_root(
                packed,
                &Commit {
                    config: &config,
                    comment: &format!("snapshot of sandbox {id} (on the host image)"),
                    source: "snapshot",
                    tag: tag.map(|name| ScopedTag {
                        tenant: scope,
                        name,
                    }),
                    owner: Some(tenant),
                },
            )
            .map_err(store_error)?;
        Ok((img, took))
    }
}

/// Whether the process behind `pidfd` has exited (its pidfd is readable then,
/// reaped or not).
fn exited(pidfd: &OwnedFd) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        pidfd,
        rustix::event::PollFlags::IN,
    )];
    let now = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&now)).unwrap_or(1) > 0
}
