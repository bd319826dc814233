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

use std::path::PathBuf;
use std::time::Duration;

use sandlot_runtime::{Instance, RuntimeError, SnapshotSource};
use sandlot_store::{Commit, IdMap, ImageConfig, ImageInfo, ImageName, PackSource, ScopedTag};

use super::{store_error, Images};
use crate::error::ApiError;

/// What a snapshot reads of sandbox `id` through its instance: 409 when it is
/// stopping (or its backend cannot say).
pub(crate) fn snapshot_source(inst: &dyn Instance) -> Result<SnapshotSource, ApiError> {
    inst.snapshot_source().map_err(|e| match e {
        RuntimeError::Unsupported { .. } => {
            ApiError::conflict(format!("sandbox {}: {e}", inst.id()))
        }
        _ => ApiError::conflict(format!("sandbox {} is stopping", inst.id())),
    })
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
        inst: &dyn Instance,
        tenant: &str,
        scope: Option<&str>,
        tag: Option<&ImageName>,
        disk: u64,
    ) -> Result<(ImageInfo, Duration), ApiError> {
        let src = snapshot_source(inst)?;
        let root = src.live_root.ok_or_else(|| {
            ApiError::internal(format!("sandbox {id}: its backend gave no root to read"))
        })?;
        let ids = match &root.id_maps {
            Some((uid_map, gid_map)) => Some(IdMap::parse(uid_map, gid_map).ok_or_else(|| {
                ApiError::internal(format!("sandbox {id}: unreadable uid_map or gid_map"))
            })?),
            None => None,
        };
        let root_path = PathBuf::from(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&root.dir)
        ));
        // Mount points are left out as entries of another filesystem; where the
        // plan's mounts are not the host's (gVisor's), as the stubs they are.
        let source = PackSource {
            one_filesystem: true,
            ids,
            stubs: src.mount_points,
            ..Default::default()
        };
        let (packed, took) = self.pack_frozen(id, inst, &root_path, &source, disk)?;
        let config = ImageConfig {
            host_base: true,
            ..Default::default()
        };
        let _committing = self.committing();
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
