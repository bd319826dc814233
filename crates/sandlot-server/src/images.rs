//! Images, volumes and secrets in the daemon: resolving a spec's image to layer
//! directories, the per-sandbox writable layer (a size-limited tmpfs on the host,
//! idmapped into the sandbox, so that it can be snapshotted), snapshots (freeze,
//! commit, thaw), named volumes, secrets, and the host-mount policy.
//!
//! Data directory layout (besides the daemon's `sandlot.db`):
//!
//! ```text
//! images/                     the image store (crate sandlot-store)
//! rw/<sandbox id>/            writable layer: tmpfs with upper/ and work/
//! volumes/<tenant>/<name>/    meta.json, data/ (and disk.img when size-limited)
//! secrets/<tenant>/<name>     the value, mode 0600 (directory 0700)
//! ```
//!
//! Snapshots hold a tenant's data, so a snapshot image (and every snapshot of a
//! sandbox made from one) belongs to the tenant of the sandbox it was taken from
//! (its owner, recorded with the image in the store): other tenants neither see it
//! nor start sandboxes from it. Tags are per tenant: a tenant's tags are its own,
//! the operator's are the shared ones, and a tenant's name is its own tag first,
//! then the operator's ([`viewer`], `sandlot_store::Viewer`). Every image without
//! an owner is the shared, operator-managed set.
//!
//! What a snapshot, export, diff or copy-out reads is bounded ([`Images::limit`]):
//! by the sandbox's disk limit, and by the operator's `images.max_expanded_size`.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sandlot_proto::spec::{valid_object_name, MountSpec, SandboxSpec, HOST_IMAGE};
use sandlot_proto::units::ByteSize;
use sandlot_runtime::host_path::{self, PinError, PinnedPath};
use sandlot_runtime::mounts::{ImageRoot, SharedDir};
use sandlot_runtime::{CreateOptions, Instance, SecretFile, Secrets};
use sandlot_store::layer::LayerError;
use sandlot_store::{
    Budget, Commit, Digest, ImageInfo, ImageName, ImageStore, LegacyOwners, ScopedTag, SizeLimit,
    StoreError, Viewer,
};
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ErrorCode};

mod host_snapshot;
use host_snapshot::snapshot_source;

/// The daemon's images, volumes and secrets.
pub struct Images {
    pub store: ImageStore,
    data_dir: PathBuf,
    allowed_host_paths: Vec<PathBuf>,
    /// `images.max_expanded_size`.
    ceiling: u64,
    /// Images the daemon committed (a pause's, a checkpoint's, a snapshot's)
    /// whose owner let them go while sandboxes still held them: removed when the
    /// last of those ends ([`Images::release_ended`]). In memory: a
    /// daemon restart forgets them.
    orphans: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Commits hold it shared; freeing a removed image's layers holds it alone
    /// (a commit finding an unused layer already unpacked must not lose it).
    commits: std::sync::RwLock<()>,
}

/// The view of the image set a principal of `scope` takes (`None`: the operator).
pub fn viewer(scope: Option<&str>) -> Viewer<'_> {
    match scope {
        None => Viewer::Operator,
        Some(t) => Viewer::Tenant(t),
    }
}

/// Maps store errors to the API: what the request or its archive got wrong is a 4xx
/// naming it (images, digests, entries of the archive); the host's own failures,
/// which name the daemon's paths, are an opaque 500.
pub fn store_error(e: StoreError) -> ApiError {
    match &e {
        StoreError::Layer(LayerError::TooLarge { .. }) => {
            ApiError::of(ErrorCode::TooLarge, e.to_string())
        }
        StoreError::NotFound(_) => ApiError::not_found(e.to_string()),
        StoreError::Ambiguous(_) | StoreError::BadName(_) => ApiError::bad_request(e.to_string()),
        StoreError::InUse { .. } => ApiError::conflict(e.to_string()),
        StoreError::DigestMismatch { .. }
        | StoreError::Invalid { .. }
        | StoreError::Layer(LayerError::BadEntry { .. }) => ApiError::bad_request(e.to_string()),
        StoreError::Layer(LayerError::Io { .. })
        | StoreError::Sql { .. }
        | StoreError::Io { .. } => ApiError::internal(e),
    }
}

/// The largest `size_limit` of a volume.
pub const MAX_VOLUME_SIZE: u64 = 8 << 40;

/// A named volume.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Volume {
    pub name: String,
    pub tenant: String,
    /// Bytes; absent: limited only by the data directory's filesystem.
    pub size_limit: Option<u64>,
    /// Milliseconds since the epoch.
    pub created_at: i64,
}

/// A secret's metadata (never its value).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SecretInfo {
    pub name: String,
    pub tenant: String,
    pub created_at: i64,
}

use crate::store::now_ms;

/// Directory name of a tenant's volumes and secrets.
fn tenant_dir(tenant: &str) -> String {
    crate::config::tenant_path_component(tenant)
}

fn io_api(what: &str) -> impl FnOnce(io::Error) -> ApiError + '_ {
    move |e| ApiError::internal(format!("{what}: {e}"))
}

impl Images {
    /// Opens the store (moving owner records of an earlier version into it).
    pub fn open(
        data_dir: &Path,
        allowed_host_paths: Vec<PathBuf>,
        max_expanded_size: u64,
    ) -> Result<Images, StoreError> {
        let store = ImageStore::open_with(
            &data_dir.join("images"),
            Some(LegacyOwners {
                dir: &data_dir.join("image-owners"),
                operator_tenant: crate::auth::DEFAULT_TENANT,
            }),
        )?;
        for d in ["rw", "volumes", "secrets"] {
            let p = data_dir.join(d);
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&p)
                .map_err(|source| StoreError::Io {
                    op: "create",
                    path: p.display().to_string(),
                    source,
                })?;
            let _ = fs::set_permissions(&p, fs::Permissions::from_mode(0o700));
        }
        // Orphans recorded before a restart still go with their last holder.
        let orphans = store.orphans().unwrap_or_else(|e| {
            tracing::warn!("list the orphan images: {e}");
            Vec::new()
        });
        Ok(Images {
            store,
            data_dir: data_dir.to_path_buf(),
            allowed_host_paths,
            ceiling: max_expanded_size,
            orphans: std::sync::Mutex::new(orphans.into_iter().collect()),
            commits: Default::default(),
        })
    }

    /// What a snapshot or copy-out of a sandbox with disk limit `disk` may expand
    /// to (`None`: no sandbox, e.g. an image's export or diff): the smaller of
    /// that and the operator's ceiling, named for the error.
    pub fn limit(&self, disk: Option<u64>) -> SizeLimit {
        match disk {
            Some(d) if d <= self.ceiling => SizeLimit {
                bytes: d,
                name: format!(
                    "the sandbox's disk limit (resources.disk = {})",
                    ByteSize(d)
                ),
            },
            _ => SizeLimit {
                bytes: self.ceiling,
                name: format!(
                    "the operator's limit (images.max_expanded_size = {})",
                    ByteSize(self.ceiling)
                ),
            },
        }
    }

    fn rw_dir(&self, id: &str) -> PathBuf {
        self.data_dir.join("rw").join(id)
    }

    /// The spec's host paths (bind sources, the rootfs), each resolved once and
    /// checked against `[mounts] allowed_host_paths`: it must exist, lie under an
    /// allowed path as written and once links are resolved, and be reached from
    /// that allowed path through real directories only. The runtime mounts exactly
    /// these (their canonical paths, reopened without following a link and refused
    /// if they name another file by then), so a link swapped in after the check
    /// (by a sandbox with a writable bind of the directory) is never followed.
    /// No work for a spec without host paths.
    pub fn pin_host_paths(&self, spec: &SandboxSpec) -> Result<Vec<PinnedPath>, ApiError> {
        let mut pins = Vec::new();
        for (i, m) in spec.mounts.iter().enumerate() {
            if let MountSpec::Bind { source, .. } = m {
                pins.push(self.pin(&format!("mounts[{i}].source"), source)?);
            }
        }
        if let Some(r) = &spec.rootfs {
            let pin = self.pin("rootfs", r)?;
            if !pin.dir {
                return Err(ApiError::invalid(
                    "rootfs",
                    "is not a directory on the host",
                ));
            }
            pins.push(pin);
        }
        Ok(pins)
    }

    /// `requested` resolved beneath the allowed host path it lies under (400 naming
    /// `field` otherwise).
    fn pin(&self, field: &str, requested: &str) -> Result<PinnedPath, ApiError> {
        let not_allowed = || {
            ApiError::invalid(
                field,
                // Neither the path (a host path) nor the allowed paths (the operator's
                // to tell) are shown to the tenant; the caller knows which path it gave.
                "is not under a host path the operator allows (mounts.allowed_host_paths)",
            )
        };
        // Lexically first (validate refused `..`), then resolved beneath the allowed
        // path (its real path: the operator's may name it through a link).
        let p = Path::new(requested);
        for a in &self.allowed_host_paths {
            let Ok(root) = std::fs::canonicalize(a) else {
                continue;
            };
            let Some(rel) = p.strip_prefix(a).or_else(|_| p.strip_prefix(&root)).ok() else {
                continue;
            };
            let beneath = root.join(rel);
            match host_path::pin(&beneath.to_string_lossy(), Some(&root)) {
                Ok(mut pin) => {
                    pin.requested = requested.to_string();
                    return Ok(pin);
                }
                Err(PinError::Outside { .. }) => continue,
                Err(PinError::Missing { .. }) => {
                    return Err(ApiError::invalid(field, "does not exist on the host"))
                }
                Err(e @ PinError::Changed { .. }) => {
                    return Err(
                        ApiError::invalid(field, "changed while it was being checked")
                            .with_detail(e),
                    )
                }
                Err(e @ PinError::Io { .. }) => {
                    return Err(ApiError::internal(format!("{field}: {e}")))
                }
            }
        }
        Err(not_allowed())
    }

    /// [`ImageStore::resolve_as`].
    pub fn resolve_for(&self, viewer: Viewer, reference: &str) -> Result<ImageInfo, StoreError> {
        self.store.resolve_as(viewer, reference)
    }

    /// The spec's image in `viewer`'s view (`None`: the host image), or 400 naming
    /// the field.
    fn spec_image(
        &self,
        viewer: Viewer,
        spec: &SandboxSpec,
    ) -> Result<Option<ImageInfo>, ApiError> {
        if spec.image == HOST_IMAGE {
            return Ok(None);
        }
        self.resolve_for(viewer, &spec.image)
            .map(Some)
            .map_err(|e| match e {
                StoreError::NotFound(_) | StoreError::BadName(_) | StoreError::Ambiguous(_) => {
                    ApiError::invalid("image", e.to_string())
                }
                e => store_error(e),
            })
    }

    /// What can be checked before admission: host paths against the policy, and
    /// that the image (as `viewer` names it), volumes and secrets (`tenant`'s)
    /// exist (400 naming the field). Returns the image's id.
    pub fn precheck(
        &self,
        viewer: Viewer,
        tenant: &str,
        spec: &SandboxSpec,
    ) -> Result<Option<Digest>, ApiError> {
        self.pin_host_paths(spec)?;
        let image = self.spec_image(viewer, spec)?.map(|i| i.id);
        for (i, v) in spec.volumes.iter().enumerate() {
            let meta = self
                .volume_dir(tenant, &v.name)
                .map(|d| d.join("meta.json"));
            if !meta.is_some_and(|m| m.is_file()) {
                return Err(ApiError::invalid(
                    format!("volumes[{i}].name"),
                    format!("no volume {:?}", v.name),
                ));
            }
        }
        for (i, s) in spec.secrets.iter().enumerate() {
            if !self
                .secret_path(tenant, &s.name)
                .is_some_and(|p| p.is_file())
            {
                return Err(ApiError::invalid(
                    format!("secrets[{i}].name"),
                    format!("no secret {:?}", s.name),
                ));
            }
        }
        Ok(image)
    }

    /// Resolves the spec's image (in `viewer`'s view), volumes and secrets
    /// (`tenant`'s) into runtime options, and prepares the writable layer. Undone
    /// by [`release`](Self::release).
    pub fn prepare(
        &self,
        id: &str,
        tenant: &str,
        viewer: Viewer,
        spec: &SandboxSpec,
    ) -> Result<CreateOptions, ApiError> {
        self.prepare_layer(id, tenant, viewer, spec, false)
    }

    /// [`prepare`](Self::prepare) for a sandbox that starts again from what its
    /// pause kept: with `kept`, its writable layer and image lease are the ones it
    /// has (a memory pause), neither made anew nor released on failure.
    pub fn prepare_resume(
        &self,
        id: &str,
        tenant: &str,
        viewer: Viewer,
        spec: &SandboxSpec,
        kept: bool,
    ) -> Result<CreateOptions, ApiError> {
        self.prepare_layer(id, tenant, viewer, spec, kept)
    }

    fn prepare_layer(
        &self,
        id: &str,
        tenant: &str,
        viewer: Viewer,
        spec: &SandboxSpec,
        kept: bool,
    ) -> Result<CreateOptions, ApiError> {
        let mut opts = CreateOptions {
            pinned: Some(self.pin_host_paths(spec)?),
            ..Default::default()
        };
        let r = (|| {
            for (i, v) in spec.volumes.iter().enumerate() {
                let vol = self.volume_dir(tenant, &v.name);
                let Some(vol) = vol.filter(|d| d.join("meta.json").is_file()) else {
                    return Err(ApiError::invalid(
                        format!("volumes[{i}].name"),
                        format!("no volume {:?}", v.name),
                    ));
                };
                self.ensure_volume_mounted(&vol)?;
                opts.volumes.push(SharedDir {
                    source: vol.join("data"),
                    target: v.target.clone(),
                    readonly: v.read_only,
                });
            }
            let mut secrets = Secrets::default();
            for (i, s) in spec.secrets.iter().enumerate() {
                let value = self.secret_value(tenant, &s.name).map_err(|_| {
                    ApiError::invalid(
                        format!("secrets[{i}].name"),
                        format!("no secret {:?}", s.name),
                    )
                })?;
                if let Some(e) = &s.env {
                    secrets.env.push((e.clone(), value));
                } else if let Some(p) = &s.path {
                    secrets.files.push(SecretFile {
                        path: sandlot_proto::spec::normalize_sandbox_path(p),
                        contents: value,
                        mode: s
                            .mode
                            .map_or(sandlot_proto::spec::SECRET_FILE_MODE, |m| m.0),
                        uid: s.uid,
                        gid: s.gid,
                    });
                }
            }
            opts.secrets = secrets;
            // A kept layer goes with the image it was leased with, whatever the
            // spec's name means now.
            let img = match (kept, self.image_of(id)) {
                (true, Some(d)) => Some(self.store.get(&d).map_err(store_error)?),
                (true, None) => None,
                (false, _) => self.spec_image(viewer, spec)?,
            };
            if let Some(img) = img {
                let rw = self.rw_dir(id);
                if !kept {
                    self.store.lease(id, &img.id).map_err(store_error)?;
                    mount_rw(&rw, spec.memory_backed().writable)?;
                }
                opts.image = Some(ImageRoot {
                    layers: self.store.layer_dirs(&img),
                    rw: Some(rw),
                    env: img.config.env.clone(),
                    workdir: img.config.workdir.clone(),
                    user: img.config.user.clone(),
                    on_host: img.config.host_base,
                });
            }
            Ok(())
        })();
        if let Err(e) = r {
            if !kept {
                self.release(id);
            }
            return Err(e);
        }
        Ok(opts)
    }

    /// Whether sandbox `id`'s writable layer is mounted (a host restart unmounts
    /// the tmpfs, and what was in it is gone) and whole (no copy into it was cut
    /// short: `kept_copy::layer_whole`).
    pub fn writable_layer_mounted(&self, id: &str) -> bool {
        let rw = self.rw_dir(id);
        is_mount_point(&rw) && sandlot_runtime::gvisor::kept_copy::layer_whole(&rw)
    }

    /// Bytes a copy of sandbox `id`'s writable layer may take: what its tmpfs
    /// uses (holes of sparse files cost nothing) and a block for each inode it
    /// uses (a directory takes a block on the disk the copy goes to).
    pub fn writable_layer_bytes(&self, id: &str) -> u64 {
        rustix::fs::statvfs(self.rw_dir(id))
            .map(|v| {
                let blocks = v
                    .f_blocks
                    .saturating_sub(v.f_bfree)
                    .saturating_mul(v.f_frsize);
                let inodes = v.f_files.saturating_sub(v.f_ffree).saturating_mul(4096);
                blocks.saturating_add(inodes)
            })
            .unwrap_or(0)
    }

    /// The upper directory of sandbox `id`'s writable layer (its changes to its
    /// image's files, in overlay format).
    pub fn writable_upper(&self, id: &str) -> PathBuf {
        self.rw_dir(id).join("upper")
    }

    /// Makes sandbox `id`'s writable layer (a tmpfs of `size`, which must not
    /// exist yet) from the layer checkpoint copy `saved` keeps. On failure
    /// nothing of it is left. Blocking.
    pub fn restore_writable_layer(
        &self,
        id: &str,
        size: sandlot_proto::spec::TmpfsLimit,
        saved: &Path,
    ) -> Result<(), ApiError> {
        let rw = self.rw_dir(id);
        if rw.exists() {
            unmount_rw(&rw).map_err(io_api("remove a leftover writable layer"))?;
        }
        mount_rw(&rw, size)?;
        if let Err(e) = sandlot_runtime::gvisor::kept_copy::fill_layer(saved, &rw) {
            if let Err(e2) = unmount_rw(&rw) {
                tracing::warn!(sandbox_id = id, "remove a writable layer cut short: {e2}");
            }
            return Err(crate::checkpoint::copy_error(e));
        }
        Ok(())
    }

    /// Marks sandbox `id`'s writable layer whole again once what goes with it
    /// (its memory image) is in place too. Blocking.
    pub fn complete_writable_layer(&self, id: &str) -> Result<(), ApiError> {
        sandlot_runtime::gvisor::kept_copy::mark_layer_whole(&self.rw_dir(id))
            .map_err(ApiError::internal)
    }

    /// Replaces paused sandbox `id`'s writable layer by the one checkpoint copy
    /// `saved` keeps, in place: the old layer is marked incomplete (from here a
    /// failure or a crash leaves a layer no resume takes, and a restore again
    /// mends it), unmounted, the bare directory marked incomplete too, a fresh
    /// tmpfs mounted over it and filled, and the result left marked incomplete
    /// until the caller has put the memory image that goes with it in place and
    /// calls [`Images::complete_writable_layer`]. Nothing is moved between
    /// mounts: a mount move fails under a shared parent mount (systemd makes `/`
    /// shared). Blocking.
    pub fn replace_writable_layer(
        &self,
        id: &str,
        size: sandlot_proto::spec::TmpfsLimit,
        saved: &Path,
    ) -> Result<(), ApiError> {
        use sandlot_runtime::gvisor::kept_copy;
        let rw = self.rw_dir(id);
        if is_mount_point(&rw) {
            kept_copy::mark_layer_incomplete(&rw).map_err(ApiError::internal)?;
            rustix::mount::unmount(&rw, rustix::mount::UnmountFlags::DETACH).map_err(|e| {
                ApiError::internal(format!(
                    "unmount the replaced writable layer {}: {e}",
                    rw.display()
                ))
            })?;
        }
        match fs::DirBuilder::new().mode(0o700).create(&rw) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                return Err(io_api("create writable layer")(e))
            }
            _ => {}
        }
        // Under the tmpfs about to be mounted: what a crash before it is whole
        // leaves.
        kept_copy::mark_layer_incomplete(&rw).map_err(ApiError::internal)?;
        mount_tmpfs_rw(&rw, size)?;
        // The tmpfs carries its own marker while it is filled (and keeps it on
        // a failure): the sandbox stays on a layer no resume takes.
        kept_copy::fill_layer(saved, &rw).map_err(crate::checkpoint::copy_error)?;
        kept_copy::mark_layer_incomplete(&rw).map_err(ApiError::internal)
    }

    /// Removes a sandbox's writable layer and keeps its image lease (a sandbox
    /// whose pause committed its files to an image, which it holds).
    pub fn drop_writable_layer(&self, id: &str) {
        let rw = self.rw_dir(id);
        if rw.exists() {
            if let Err(e) = unmount_rw(&rw) {
                tracing::warn!(sandbox_id = id, "remove the writable layer: {e}");
            }
        }
    }

    /// Removes a sandbox's writable layer and lease (after it is terminated).
    pub fn release(&self, id: &str) {
        let rw = self.rw_dir(id);
        if rw.exists() {
            if let Err(e) = unmount_rw(&rw) {
                tracing::warn!(sandbox_id = id, "remove the writable layer: {e}");
            }
        }
        if let Err(e) = self.store.release(id) {
            tracing::warn!(sandbox_id = id, "release image lease: {e}");
        }
    }

    /// [`Images::release`] for sandbox `id`, which ended: the image it held goes
    /// too if it is an orphan ([`Images::orphan`]) nothing else holds.
    pub fn release_ended(&self, id: &str) {
        let held = self.image_of(id);
        self.release(id);
        if let Some(img) = held {
            self.remove_orphan(&img.to_string());
        }
    }

    /// Held while the daemon commits a layer to the store (a pause, a checkpoint,
    /// a snapshot, a build step): [`Images::remove_committed`] waits for it.
    pub fn committing(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.commits.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Held while the whole store is pruned (the operator's prune): no commit
    /// runs meanwhile.
    pub fn pruning(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        self.commits.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Removes image `reference` (an image the daemon committed) and, at once,
    /// its layers no other image uses, so that the disk it held is free when its
    /// owner's quota is. Blocking.
    pub fn remove_committed(&self, reference: &str) -> Result<sandlot_store::Removal, StoreError> {
        let _alone = self.pruning();
        let r = self.store.remove(reference)?;
        if r.image_removed {
            match self.store.remove_unused_layers(&r.image.layers) {
                Ok(freed) => {
                    tracing::debug!(image = reference, freed, "freed a removed image's layers")
                }
                Err(e) => tracing::warn!(image = reference, "free a removed image's layers: {e}"),
            }
        }
        Ok(r)
    }

    /// Bytes image `reference`'s own (top) layer takes on the disk: its blob and
    /// its unpacked files. What a commit of a sandbox's files added. Blocking.
    pub fn committed_bytes(&self, reference: &str) -> u64 {
        let Some(img) = reference.parse().ok().and_then(|d| self.store.get(&d).ok()) else {
            return 0;
        };
        img.layers.last().map_or(0, |l| {
            l.blob_size + sandlot_store::dir_size(&self.store.layer_dir(&l.diff_id))
        })
    }

    /// Image `reference`, committed by the daemon and let go by its owner but
    /// still held by sandboxes: removed once none holds it.
    pub fn orphan(&self, reference: &str) {
        if let Err(e) = self.store.mark_orphan(reference) {
            tracing::warn!(image = reference, "record an orphan image: {e}");
        }
        self.orphans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(reference.to_string());
        self.remove_orphan(reference);
    }

    /// Removes the orphan images nothing holds any more (after a restart: their
    /// holders may have ended while the daemon was down).
    fn remove_free_orphans(&self) {
        let all: Vec<String> = self
            .orphans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        for reference in all {
            self.remove_orphan(&reference);
        }
    }

    /// Forgets that `reference` is an orphan.
    fn forget_orphan(&self, o: &mut std::collections::HashSet<String>, reference: &str) {
        o.remove(reference);
        if let Err(e) = self.store.unmark_orphan(reference) {
            tracing::warn!(image = reference, "forget an orphan image: {e}");
        }
    }

    /// Removes orphan image `reference` if nothing holds or names it any more.
    fn remove_orphan(&self, reference: &str) {
        let mut o = self.orphans.lock().unwrap_or_else(|e| e.into_inner());
        if !o.contains(reference) {
            return;
        }
        let untagged = self
            .store
            .resolve(reference)
            .is_ok_and(|i| i.tags.is_empty() && i.tenant_tags.is_empty());
        if !untagged {
            self.forget_orphan(&mut o, reference);
            return;
        }
        match self.remove_committed(reference) {
            Ok(_) => {
                self.forget_orphan(&mut o, reference);
                tracing::info!(
                    image = reference,
                    "removed a committed image once its last holder let it go"
                );
            }
            Err(StoreError::InUse { .. }) => {}
            Err(e) => {
                self.forget_orphan(&mut o, reference);
                tracing::debug!(image = reference, "keep a committed image: {e}");
            }
        }
    }

    /// After a restart: releases writable layers and leases of sandboxes that are
    /// gone (`live`: the ids re-adopted).
    pub fn reconcile(&self, live: &[String]) {
        if let Ok(rd) = fs::read_dir(self.data_dir.join("rw")) {
            for e in rd.flatten() {
                let id = e.file_name().to_string_lossy().into_owned();
                if !live.contains(&id) {
                    self.release(&id);
                }
            }
        }
        if let Ok(leases) = self.store.leases() {
            for (holder, _) in leases {
                if !live.contains(&holder) {
                    let _ = self.store.release(&holder);
                }
            }
        }
        self.remove_free_orphans();
        // Size-limited volumes whose filesystem is not mounted (host reboot).
        if let Ok(rd) = fs::read_dir(self.data_dir.join("volumes")) {
            for t in rd.flatten() {
                for v in fs::read_dir(t.path()).into_iter().flatten().flatten() {
                    if let Err(e) = self.ensure_volume_mounted(&v.path()) {
                        tracing::warn!(volume = %v.path().display(), "mount volume: {}", e.message);
                    }
                }
            }
        }
    }

    /// Turns a running sandbox's writable layer into a new image whose parent is
    /// the sandbox's image. The sandbox is held still while the layer is read. The image
    /// belongs to `tenant`, the sandbox's (see the module's notes); `tag` is in the
    /// namespace of whoever asked (`scope`; `None`: the operator's, shared). What
    /// the layer expands to is bounded by the sandbox's disk limit `disk` (and the
    /// operator's ceiling): past it, 413 and nothing stored.
    #[allow(clippy::too_many_arguments)]
    pub fn snapshot(
        &self,
        id: &str,
        inst: &dyn Instance,
        hostname: &str,
        tenant: &str,
        scope: Option<&str>,
        tag: Option<&ImageName>,
        disk: u64,
    ) -> Result<(ImageInfo, Duration), ApiError> {
        self.snapshot_as(
            id,
            inst,
            hostname,
            disk,
            Commit {
                config: &Default::default(),
                comment: &format!("snapshot of sandbox {id}"),
                source: "snapshot",
                tag: tag.map(|name| ScopedTag {
                    tenant: scope,
                    name,
                }),
                owner: Some(tenant),
            },
        )
    }

    /// Packs sandbox `id`'s writable layer at `dir`, read as `source` says and
    /// bounded by its disk limit `disk`, with the sandbox frozen meanwhile; how long
    /// it was frozen. Only the reading needs the freeze: storing and unpacking the
    /// layer happen after the thaw.
    pub(crate) fn pack_frozen(
        &self,
        id: &str,
        inst: &dyn Instance,
        dir: &Path,
        source: &sandlot_store::PackSource,
        disk: u64,
    ) -> Result<(sandlot_store::PackedLayer, Duration), ApiError> {
        let limit = self.limit(Some(disk));
        let what = format!("the writable layer of sandbox {id}");
        let t0 = Instant::now();
        let still = inst
            .hold_still(Duration::from_secs(5))
            .map_err(|e| ApiError::internal(format!("freeze sandbox {id}: {e}")))?;
        let packed = self
            .store
            .pack_dir_from(dir, source, &mut Budget::new(Some(&limit), &what));
        let thawed = still.release();
        let took = t0.elapsed();
        thawed.map_err(|e| ApiError::internal(format!("thaw sandbox {id}: {e}")))?;
        Ok((packed.map_err(store_error)?, took))
    }

    /// [`snapshot`](Self::snapshot) recording `c` (its config is replaced by the
    /// base image's; a build step records its step and its builder as owner).
    #[allow(clippy::too_many_arguments)]
    pub fn snapshot_as(
        &self,
        id: &str,
        inst: &dyn Instance,
        hostname: &str,
        disk: u64,
        c: Commit,
    ) -> Result<(ImageInfo, Duration), ApiError> {
        let base = self
            .store
            .leases()
            .map_err(store_error)?
            .into_iter()
            .find(|(h, _)| h == id)
            .map(|(_, d)| d)
            .ok_or_else(|| {
                ApiError::conflict(format!(
                    "sandbox {id} runs a rootfs directory: only sandboxes of an image (host or from the store) can be snapshotted"
                ))
            })?;
        let base = self.store.get(&base).map_err(store_error)?;
        let upper = self.rw_dir(id).join("upper");
        // What the runtime made in the writable layer to mount on, or wrote there
        // (the sandbox's identity files, `hostname` its host name), is not the
        // sandbox's change.
        let source = sandlot_store::PackSource {
            stubs: snapshot_source(inst)?.mount_points,
            written: sandlot_runtime::hostimage::image_identity_files(hostname)
                .into_iter()
                .map(|(name, contents, _)| (Path::new("etc").join(name), contents.into_bytes()))
                .collect(),
            ..Default::default()
        };
        let (packed, took) = self.pack_frozen(id, inst, &upper, &source, disk)?;
        let _committing = self.committing();
        let img = self
            .store
            .commit_packed(
                &base,
                packed,
                &Commit {
                    config: &base.config,
                    ..c
                },
            )
            .map_err(store_error)?;
        Ok((img, took))
    }

    // ---- volumes ----

    /// `data_dir/KIND/TENANT/NAME`, the place of `tenant`'s volume or secret
    /// `name`; `None` for a name that is not a valid one (a request's name is
    /// never joined to a host path unchecked: a `..` or a `/` in it would reach
    /// another tenant's objects).
    fn tenant_object(&self, kind: &str, tenant: &str, name: &str) -> Option<PathBuf> {
        valid_object_name(name)
            .then(|| self.data_dir.join(kind).join(tenant_dir(tenant)).join(name))
    }

    /// The directory of `tenant`'s volume `name` (see [`Self::tenant_object`]).
    fn volume_dir(&self, tenant: &str, name: &str) -> Option<PathBuf> {
        self.tenant_object("volumes", tenant, name)
    }

    pub fn create_volume(
        &self,
        tenant: &str,
        name: &str,
        size_limit: Option<u64>,
    ) -> Result<Volume, ApiError> {
        let Some(dir) = self.volume_dir(tenant, name) else {
            return Err(ApiError::invalid(
                "name",
                format!("{name:?}: use 1 to 64 letters, digits, '-', '_' or '.'"),
            ));
        };
        if let Some(s) = size_limit {
            if s < 8 << 20 {
                return Err(ApiError::invalid("size_limit", "at least 8M"));
            }
            // The volume is an ext4 filesystem in a sparse file, whose size the
            // data directory's filesystem must allow (16T less a block on ext4).
            if s > MAX_VOLUME_SIZE {
                return Err(ApiError::invalid("size_limit", "at most 8T"));
            }
        }
        if dir.exists() {
            return Err(ApiError::conflict(format!("volume {name} exists")));
        }
        let parent = dir.parent().expect("has parent");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(io_api("create volume directory"))?;
        let tmp = parent.join(format!(".new-{name}"));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir(&tmp).map_err(io_api("create volume"))?;
        let vol = Volume {
            name: name.to_string(),
            tenant: tenant.to_string(),
            size_limit,
            created_at: now_ms(),
        };
        let r = (|| {
            fs::DirBuilder::new()
                .mode(0o755)
                .create(tmp.join("data"))
                .map_err(io_api("create volume data"))?;
            if let Some(size) = size_limit {
                // A filesystem of exactly that size, in a sparse file: the limit is
                // the filesystem's (ENOSPC), for every sandbox sharing the volume.
                let img = tmp.join("disk.img");
                let f = fs::File::create(&img).map_err(io_api("create volume image"))?;
                f.set_len(size).map_err(io_api("size volume image"))?;
                drop(f);
                run_tool(
                    Command::new("mkfs.ext4")
                        .args(["-q", "-F", "-m", "0", "-E", "root_owner=0:0"])
                        .arg(&img),
                    "mkfs.ext4",
                )?;
            }
            let meta = serde_json::to_vec(&vol).expect("json");
            fs::write(tmp.join("meta.json"), meta).map_err(io_api("write volume metadata"))?;
            fs::rename(&tmp, &dir).map_err(io_api("publish volume"))?;
            self.ensure_volume_mounted(&dir)
        })();
        if let Err(e) = r {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
        Ok(vol)
    }

    /// Mounts a size-limited volume's filesystem on its `data/` if it is not.
    fn ensure_volume_mounted(&self, dir: &Path) -> Result<(), ApiError> {
        let img = dir.join("disk.img");
        if !img.is_file() {
            return Ok(());
        }
        let data = dir.join("data");
        if is_mount_point(&data) {
            return Ok(());
        }
        run_tool(
            Command::new("mount")
                .args(["-o", "loop,nosuid,nodev", "-t", "ext4"])
                .arg(&img)
                .arg(&data),
            "mount",
        )
    }

    pub fn list_volumes(&self, scope: Option<&str>) -> Vec<Volume> {
        let mut out = Vec::new();
        let base = self.data_dir.join("volumes");
        let tenants: Vec<PathBuf> = match scope {
            Some(t) => vec![base.join(tenant_dir(t))],
            None => fs::read_dir(&base)
                .map(|rd| rd.flatten().map(|e| e.path()).collect())
                .unwrap_or_default(),
        };
        for t in tenants {
            for e in fs::read_dir(&t).into_iter().flatten().flatten() {
                if let Ok(b) = fs::read(e.path().join("meta.json")) {
                    if let Ok(v) = serde_json::from_slice::<Volume>(&b) {
                        out.push(v);
                    }
                }
            }
        }
        out.sort_by(|a, b| (&a.tenant, &a.name).cmp(&(&b.tenant, &b.name)));
        out
    }

    pub fn get_volume(&self, tenant: &str, name: &str) -> Option<Volume> {
        let b = fs::read(self.volume_dir(tenant, name)?.join("meta.json")).ok()?;
        serde_json::from_slice(&b).ok()
    }

    /// Removes a volume and its data. `users`: live sandboxes that mount it.
    pub fn remove_volume(
        &self,
        tenant: &str,
        name: &str,
        users: &[String],
    ) -> Result<Volume, ApiError> {
        let v = self
            .get_volume(tenant, name)
            .ok_or_else(|| ApiError::not_found(format!("no volume {name}")))?;
        if !users.is_empty() {
            return Err(ApiError::conflict(format!(
                "volume {name} is in use by {}",
                users.join(", ")
            )));
        }
        let dir = self
            .volume_dir(tenant, name)
            .ok_or_else(|| ApiError::not_found(format!("no volume {name}")))?;
        let data = dir.join("data");
        if is_mount_point(&data) {
            run_tool(Command::new("umount").arg(&data), "umount")?;
        }
        fs::remove_dir_all(&dir).map_err(io_api("remove volume"))?;
        Ok(v)
    }

    // ---- secrets ----

    /// The file of `tenant`'s secret `name` (see [`Self::tenant_object`]).
    fn secret_path(&self, tenant: &str, name: &str) -> Option<PathBuf> {
        self.tenant_object("secrets", tenant, name)
    }

    pub fn create_secret(
        &self,
        tenant: &str,
        name: &str,
        value: &str,
    ) -> Result<SecretInfo, ApiError> {
        let Some(p) = self.secret_path(tenant, name) else {
            return Err(ApiError::invalid(
                "name",
                format!("{name:?}: use 1 to 64 letters, digits, '-', '_' or '.'"),
            ));
        };
        if value.len() > 64 << 10 {
            return Err(ApiError::invalid("value", "at most 64K"));
        }
        if value.contains('\0') {
            return Err(ApiError::invalid("value", "contains a NUL byte"));
        }
        let parent = p.parent().expect("has parent");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(io_api("create secrets directory"))?;
        if p.exists() {
            return Err(ApiError::conflict(format!(
                "secret {name} exists: delete it first"
            )));
        }
        let tmp = parent.join(format!(".new-{name}"));
        {
            use std::io::Write;
            let mut f = fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(io_api("write secret"))?;
            f.write_all(value.as_bytes())
                .map_err(io_api("write secret"))?;
            f.sync_all().map_err(io_api("write secret"))?;
        }
        fs::rename(&tmp, &p).map_err(io_api("store secret"))?;
        Ok(SecretInfo {
            name: name.to_string(),
            tenant: tenant.to_string(),
            created_at: now_ms(),
        })
    }

    fn secret_value(&self, tenant: &str, name: &str) -> io::Result<String> {
        let p = self.secret_path(tenant, name).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("no secret {name:?}"))
        })?;
        fs::read_to_string(p)
    }

    pub fn list_secrets(&self, scope: Option<&str>) -> Vec<SecretInfo> {
        let base = self.data_dir.join("secrets");
        let dirs: Vec<(String, PathBuf)> = match scope {
            Some(t) => vec![(t.to_string(), base.join(tenant_dir(t)))],
            None => fs::read_dir(&base)
                .map(|rd| {
                    rd.flatten()
                        .map(|e| {
                            let dir = e.file_name().to_string_lossy().into_owned();
                            (crate::config::tenant_of_path_component(&dir), e.path())
                        })
                        .collect()
                })
                .unwrap_or_default(),
        };
        let mut out = Vec::new();
        for (tenant, d) in dirs {
            for e in fs::read_dir(&d).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') {
                    continue;
                }
                let created_at = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map(|d| d.as_millis() as i64)
                    .unwrap_or(0);
                out.push(SecretInfo {
                    name,
                    tenant: tenant.clone(),
                    created_at,
                });
            }
        }
        out.sort_by(|a, b| (&a.tenant, &a.name).cmp(&(&b.tenant, &b.name)));
        out
    }

    pub fn remove_secret(&self, tenant: &str, name: &str) -> Result<(), ApiError> {
        let p = self
            .secret_path(tenant, name)
            .ok_or_else(|| ApiError::not_found(format!("no secret {name}")))?;
        fs::remove_file(p).map_err(|_| ApiError::not_found(format!("no secret {name}")))
    }

    /// Image id a sandbox was created from (its lease).
    pub fn image_of(&self, id: &str) -> Option<Digest> {
        self.store
            .leases()
            .ok()?
            .into_iter()
            .find(|(h, _)| h == id)
            .map(|(_, d)| d)
    }
}

fn is_mount_point(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(p), p.parent().map(fs::metadata)) {
        (Ok(a), Some(Ok(b))) => a.dev() != b.dev(),
        _ => false,
    }
}

fn run_tool(cmd: &mut Command, what: &str) -> Result<(), ApiError> {
    let out = cmd
        .output()
        .map_err(|e| ApiError::internal(format!("run {what}: {e}")))?;
    if !out.status.success() {
        return Err(ApiError::internal(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Mounts the writable layer of a sandbox: a tmpfs of `size` bytes (charged to
/// the memory cgroup of whoever writes to it: the sandbox) holding `upper/` and
/// `work/`.
/// The writable layer of an image sandbox: a tmpfs of the size and file count
/// [`SandboxSpec::memory_backed`] gives (its pages are charged to the sandbox that
/// writes them, so it never holds more than the sandbox's memory leaves it).
fn mount_rw(dir: &Path, size: sandlot_proto::spec::TmpfsLimit) -> Result<(), ApiError> {
    fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(io_api("create writable layer"))?;
    mount_tmpfs_rw(dir, size)
}

/// Mounts a writable layer's tmpfs of `size` on existing directory `dir`, with
/// its `upper` and `work` directories.
fn mount_tmpfs_rw(dir: &Path, size: sandlot_proto::spec::TmpfsLimit) -> Result<(), ApiError> {
    use rustix::mount::{mount, MountFlags};
    let opts =
        std::ffi::CString::new(format!("{},mode=0755", size.mount_options())).expect("no NUL");
    mount(
        "sandlot-rw",
        dir,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        Some(opts.as_c_str()),
    )
    .map_err(|e| {
        ApiError::internal(format!(
            "mount the writable layer at {}: {e}",
            dir.display()
        ))
    })?;
    for d in ["upper", "work"] {
        fs::DirBuilder::new()
            .mode(0o755)
            .create(dir.join(d))
            .map_err(io_api("create writable layer"))?;
    }
    Ok(())
}

fn unmount_rw(dir: &Path) -> io::Result<()> {
    use rustix::mount::{unmount, UnmountFlags};
    if is_mount_point(dir) {
        unmount(dir, UnmountFlags::DETACH).map_err(io::Error::from)?;
    }
    fs::remove_dir_all(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_naming_host_paths_are_opaque() {
        let io = || io::Error::from(io::ErrorKind::InvalidData);
        let path = "/var/lib/sandlot/rw/sb-1/upper/x".to_string();
        for e in [
            StoreError::Layer(LayerError::Io {
                op: "pack",
                path: path.clone(),
                source: io(),
            }),
            StoreError::Io {
                op: "read",
                path: path.clone(),
                source: io(),
            },
        ] {
            let api = store_error(e);
            assert_eq!(api.status.as_u16(), 500);
            assert!(!api.message.contains("/var/lib"), "{}", api.message);
        }
        // What the archive or request got wrong is named (paths inside the layer).
        let api = store_error(StoreError::Layer(LayerError::BadEntry {
            path: "../etc/passwd".into(),
            problem: "path escapes the layer".into(),
        }));
        assert_eq!(api.status.as_u16(), 400);
        assert!(api.message.contains("../etc/passwd"), "{}", api.message);
    }
}
