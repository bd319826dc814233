//! What a sandbox's memory-backed filesystems may hold.
//!
//! A tmpfs's data and its files (inodes, directory entries, extended attributes)
//! are charged to the memory cgroup of the sandbox that writes them, and nothing
//! reclaims them while they exist: sandboxes get no swap, and killing a process
//! frees none of it. A tmpfs that can hold more than the memory limit lets a write
//! fill the cgroup with pages no OOM kill frees; the kernel then kills process
//! after process, the guest agent (PID 1) last, and the sandbox ends with it.
//!
//! So every tmpfs of a sandbox is sized from one budget: the memory limit less a
//! headroom for the agent and the kernel ([`headroom`]). Full together, they never
//! take more than the budget, and a write past a tmpfs's size or file count fails
//! with `ENOSPC` instead. The writable layer gets what the other tmpfs mounts leave:
//! `resources.disk` of data at most, and as many files as the rest holds. A spec
//! whose own `tmpfs` mounts leave the writable layer less than [`limits::MIN_DISK`]
//! is refused.

use serde::{Deserialize, Serialize};

use super::{limits, MountSpec, SandboxSpec, SpecError, HOST_IMAGE};
use crate::units::ByteSize;

/// What the kernel charges a sandbox for one tmpfs file besides its data (inode and
/// directory entry: about 0.95 KiB on Linux 6; the tmpfs counts each file as 1 KiB
/// of its `nr_inodes` space, extended attributes on top).
pub const FILE_COST: u64 = 1 << 10;
/// A tmpfs holds at least one file per this many bytes of its size (a page: the
/// least a non-empty file takes).
pub const BYTES_PER_FILE: u64 = 4 << 10;
/// Files of even the smallest tmpfs.
const MIN_FILES: u64 = 256;
/// An image's `/dev` tmpfs holds this much besides `/dev/shm`.
pub const DEV_SIZE: u64 = 1 << 20;
/// The tmpfs of secret files (`/run/secrets`).
pub const SECRETS_SIZE: u64 = 1 << 20;

/// The memory a sandbox keeps out of every tmpfs: its agent and what the kernel
/// allocates for it. A sixteenth of the limit, 8 MiB to 64 MiB.
pub fn headroom(memory: u64) -> u64 {
    (memory / 16).clamp(8 << 20, 64 << 20)
}

/// The memory all tmpfs mounts of a sandbox may take together, full.
pub fn budget(memory: u64) -> u64 {
    memory.saturating_sub(headroom(memory))
}

/// How much a tmpfs holds: its `size` and `nr_inodes` mount options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TmpfsLimit {
    pub bytes: u64,
    pub files: u64,
}

impl TmpfsLimit {
    /// A tmpfs of `bytes` with one file per [`BYTES_PER_FILE`].
    pub fn of_size(bytes: u64) -> TmpfsLimit {
        TmpfsLimit {
            bytes,
            files: (bytes / BYTES_PER_FILE).max(MIN_FILES),
        }
    }

    /// The memory it takes when full.
    pub fn cost(&self) -> u64 {
        self.bytes
            .saturating_add(self.files.saturating_mul(FILE_COST))
    }

    /// `size=...,nr_inodes=...` for the mount's data.
    pub fn mount_options(&self) -> String {
        format!("size={},nr_inodes={}", self.bytes, self.files)
    }

    /// The writable layer in `room` bytes of budget: `disk` of data at most (and at
    /// least [`limits::MIN_DISK`]), files from what the data leaves, no fewer than
    /// [`TmpfsLimit::of_size`] gives.
    fn writable(disk: u64, room: u64) -> TmpfsLimit {
        // Data and one file per page take 5/4 of the data: the most data `room`
        // holds, in whole MiB.
        let most = (room / 5 * 4) & !((1 << 20) - 1);
        let bytes = disk.min(most).max(limits::MIN_DISK.bytes());
        let files = (room.saturating_sub(bytes) / FILE_COST).max(TmpfsLimit::of_size(bytes).files);
        TmpfsLimit { bytes, files }
    }
}

/// The sizes of a sandbox's memory-backed filesystems.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryBacked {
    /// The writable layer: the `host` image's root, or an image's or a rootfs
    /// directory's upper layer.
    pub writable: TmpfsLimit,
    /// An image's or a rootfs directory's `/dev`, `/dev/shm` included (the `host`
    /// image's `/dev` is a directory of the writable layer).
    pub dev: Option<TmpfsLimit>,
    /// `/dev/shm`'s share of `dev`.
    pub shm: u64,
    /// `/run/secrets`, when a secret is a file.
    pub secrets: Option<TmpfsLimit>,
    /// The spec's `tmpfs` mounts, in order: (index in `mounts`, limit).
    pub mounts: Vec<(usize, TmpfsLimit)>,
}

impl SandboxSpec {
    /// Whether the root is the `host` image's tmpfs (no image, no rootfs).
    fn host_root(&self) -> bool {
        self.image == HOST_IMAGE && self.rootfs.is_none()
    }

    /// The sizes of this sandbox's tmpfs mounts, all of them together within
    /// [`budget`] (unless the spec's own mounts are too large, which
    /// [`SandboxSpec::validate`] refuses).
    pub fn memory_backed(&self) -> MemoryBacked {
        let memory = self.resources.memory.bytes();
        let budget = budget(memory);
        let shm = (memory / 2).min(64 << 20).min(budget / 4);
        let dev = (!self.host_root()).then(|| TmpfsLimit::of_size(DEV_SIZE + shm));
        let secrets = self
            .secrets
            .iter()
            .any(|s| s.path.is_some())
            .then(|| TmpfsLimit::of_size(SECRETS_SIZE));
        let mounts: Vec<(usize, TmpfsLimit)> = self
            .mounts
            .iter()
            .enumerate()
            .filter_map(|(i, m)| match m {
                MountSpec::Tmpfs { size, .. } => Some((i, TmpfsLimit::of_size(size.bytes()))),
                _ => None,
            })
            .collect();
        let others: u64 = dev
            .iter()
            .chain(secrets.iter())
            .chain(mounts.iter().map(|(_, t)| t))
            .map(TmpfsLimit::cost)
            .fold(0, u64::saturating_add);
        MemoryBacked {
            writable: TmpfsLimit::writable(
                self.resources.disk.bytes(),
                budget.saturating_sub(others),
            ),
            dev,
            shm,
            secrets,
            mounts,
        }
    }

    /// Refuses `tmpfs` mounts that leave the writable layer less than
    /// [`limits::MIN_DISK`] of the budget, naming the first that does not fit.
    pub(super) fn check_memory_backed(&self) -> Result<(), SpecError> {
        let memory = self.resources.memory.bytes();
        let budget = budget(memory);
        let mb = self.memory_backed();
        let fixed = mb
            .dev
            .iter()
            .chain(mb.secrets.iter())
            .map(TmpfsLimit::cost)
            .sum::<u64>()
            + TmpfsLimit::of_size(limits::MIN_DISK.bytes()).cost();
        let mut taken = fixed;
        for (i, t) in &mb.mounts {
            taken = taken.saturating_add(t.cost());
            if taken > budget {
                return Err(SpecError::new(
                    format!("mounts[{i}].size"),
                    format!(
                        "tmpfs mounts are memory: with resources.memory = {} they may hold \
                         about {} together (the memory limit less {} for the sandbox's agent \
                         and room for the writable layer and its files); lower their sizes \
                         or raise resources.memory",
                        ByteSize(memory),
                        ByteSize(budget.saturating_sub(fixed) / 5 * 4),
                        ByteSize(headroom(memory)),
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> SandboxSpec {
        serde_json::from_str(json).unwrap()
    }

    fn total_cost(mb: &MemoryBacked) -> u64 {
        std::iter::once(&mb.writable)
            .chain(mb.dev.iter())
            .chain(mb.secrets.iter())
            .chain(mb.mounts.iter().map(|(_, t)| t))
            .map(TmpfsLimit::cost)
            .sum()
    }

    #[test]
    fn the_default_writable_layer_fits_in_the_default_memory() {
        let s = SandboxSpec::default();
        let mb = s.memory_backed();
        // 512M less 32M of headroom: 480M, of which 384M of data and 96K files.
        assert_eq!(mb.writable.bytes, 384 << 20);
        assert_eq!(mb.writable.files, 96 << 10);
        assert_eq!(mb.dev, None);
        assert!(total_cost(&mb) <= budget(s.resources.memory.bytes()));
    }

    #[test]
    fn a_small_disk_keeps_its_size_and_gets_more_files() {
        let s = spec(r#"{"resources":{"disk":"64M"}}"#);
        let mb = s.memory_backed();
        assert_eq!(mb.writable.bytes, 64 << 20);
        assert_eq!(mb.writable.files, (480 - 64) << 10);
        assert!(total_cost(&mb) <= budget(512 << 20));
    }

    #[test]
    fn every_tmpfs_together_stays_within_the_budget() {
        for json in [
            r#"{}"#,
            r#"{"resources":{"memory":"16M"}}"#,
            r#"{"resources":{"memory":"16M","disk":"1M"},"image":"x/y:1"}"#,
            r#"{"image":"x/y:1","secrets":[{"name":"a","path":"/run/secrets/a"}]}"#,
            r#"{"resources":{"memory":"2G","disk":"1T"},"mounts":[{"type":"tmpfs","target":"/a","size":"1G"}]}"#,
            r#"{"resources":{"memory":"1T"}}"#,
            r#"{"rootfs":"/srv/root","resources":{"memory":"100M"}}"#,
        ] {
            let s = spec(json);
            s.validate().unwrap();
            let mb = s.memory_backed();
            let memory = s.resources.memory.bytes();
            assert!(total_cost(&mb) <= budget(memory), "{json}: {mb:?}");
            assert!(mb.writable.bytes >= limits::MIN_DISK.bytes(), "{json}");
            assert!(
                mb.writable.files >= mb.writable.bytes / BYTES_PER_FILE,
                "{json}"
            );
        }
    }

    #[test]
    fn images_have_a_dev_tmpfs_the_host_image_does_not() {
        let img = spec(r#"{"image":"x/y:1"}"#).memory_backed();
        assert_eq!(img.shm, 64 << 20);
        assert_eq!(img.dev, Some(TmpfsLimit::of_size(DEV_SIZE + (64 << 20))));
        let host = SandboxSpec::default().memory_backed();
        assert!(img.writable.bytes < host.writable.bytes);
        let tiny = spec(r#"{"image":"x/y:1","resources":{"memory":"16M"}}"#).memory_backed();
        assert_eq!(tiny.shm, 2 << 20);
    }

    #[test]
    fn tmpfs_mounts_that_do_not_fit_are_refused_by_name() {
        let s = spec(
            r#"{"mounts":[{"type":"tmpfs","target":"/a","size":"100M"},{"type":"tmpfs","target":"/b","size":"300M"}]}"#,
        );
        let e = s.validate().unwrap_err();
        assert_eq!(e.field(), "mounts[1].size", "{e}");
        assert!(e.to_string().contains("resources.memory = 512M"), "{e}");
        let s = spec(
            r#"{"resources":{"memory":"1G"},"mounts":[{"type":"tmpfs","target":"/a","size":"100M"},{"type":"tmpfs","target":"/b","size":"300M"}]}"#,
        );
        s.validate().unwrap();
    }

    #[test]
    fn mount_options_carry_size_and_files() {
        assert_eq!(
            TmpfsLimit::of_size(8 << 20).mount_options(),
            "size=8388608,nr_inodes=2048"
        );
    }
}
