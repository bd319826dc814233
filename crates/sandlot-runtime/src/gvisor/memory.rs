//! A gVisor sandbox's memory limits, planned (no I/O).
//!
//! gVisor's sentry is one host process holding all the sandbox's memory, and
//! gVisor has no OOM killer: were the cgroup's hard limit the declared one, the
//! host kernel would kill the sentry (the whole sandbox) when the sandboxed
//! processes reach it. So the cgroup's hard limit is the declared limit plus a
//! headroom ([`headroom`]), and a watcher (`crate::memory_watch`) has the
//! sandbox's agent kill the largest process once the use passes the declared
//! limit (the line). Past the hard limit the host kernel still kills the sentry.

use crate::cgroup::CgroupLimits;

const MIB: u64 = 1 << 20;

/// Room above the declared limit `declared`: a quarter of it, at most 1 GiB, and
/// at least the declared limit itself up to 128 MiB (never under 32 MiB). It
/// holds what a process allocates between its crossing of the line and its kill
/// (gVisor's own memory, about 16 MiB idle, is counted under the line). A hard
/// limit is at most three times the declared one (the 16 MiB smallest sandbox
/// gets 48 MiB), at most twice from 32 MiB up.
pub fn headroom(declared: u64) -> u64 {
    let floor = declared.clamp(32 * MIB, 128 * MIB);
    (declared / 4).max(floor).min(1024 * MIB)
}

/// How far above the declared limit v2's `memory.high` sits: a margin that only
/// a use already well past the line reaches, so the kernel's throttling (of the
/// whole sentry, the agent included) starts after the watcher has had its turn.
pub fn high_margin(declared: u64) -> u64 {
    headroom(declared) / 2
}

/// The cgroup's limits for a sandbox declaring `declared` bytes of memory:
/// `memory_bytes` is the hard limit (declared + headroom), `memory_high` (v2) half
/// way up the headroom ([`high_margin`]).
pub fn limits(declared: u64, pids: u32, cpus: Option<f64>) -> CgroupLimits {
    CgroupLimits {
        memory_bytes: declared.saturating_add(headroom(declared)),
        memory_high: Some(declared.saturating_add(high_margin(declared))),
        pids,
        cpus,
    }
}

/// Whether a cgroup whose hard limit is `hard` leaves headroom above the declared
/// limit `declared`, so that the watcher may act at `declared` before the host
/// kernel kills the sentry. A sandbox started before the memory guard has a hard
/// limit equal to its declared one: it is not watched.
pub fn leaves_headroom(declared: u64, hard: u64) -> bool {
    hard > declared
}

#[cfg(test)]
mod tests {
    use super::{headroom, leaves_headroom, limits, MIB};
    use crate::cgroup::{limit_writes, CgroupLayout};

    #[test]
    fn headroom_is_a_quarter_up_to_1_gib_and_small_sandboxes_stay_within_three_times() {
        assert_eq!(headroom(16 * MIB), 32 * MIB);
        assert_eq!(headroom(64 * MIB), 64 * MIB);
        assert_eq!(headroom(256 * MIB), 128 * MIB);
        assert_eq!(headroom(2048 * MIB), 512 * MIB);
        assert_eq!(headroom(64 << 30), 1024 * MIB);
        for d in (16..=4096).map(|m| m * MIB) {
            let hard = limits(d, 1, None).memory_bytes;
            assert!(hard <= 3 * d, "{d}");
            assert!(d < 32 * MIB || hard <= 2 * d, "{d}");
        }
    }

    #[test]
    fn v2_hard_limit_has_headroom_and_memory_high_is_half_way_up_it() {
        let l = limits(256 * MIB, 64, None);
        let w = limit_writes(&CgroupLayout::V2 { root: "/x".into() }, &l);
        assert!(
            w.contains(&("", "memory.max", (384 * MIB).to_string())),
            "{w:?}"
        );
        assert!(
            w.contains(&("", "memory.high", (320 * MIB).to_string())),
            "{w:?}"
        );
        assert!(w.contains(&("", "memory.swap.max", "0".into())), "{w:?}");
    }

    #[test]
    fn v1_hard_limit_has_headroom_and_no_high_file() {
        let l = limits(256 * MIB, 64, None);
        let w = limit_writes(
            &CgroupLayout::V1 {
                controllers: vec![],
            },
            &l,
        );
        let hard = (384 * MIB).to_string();
        assert!(
            w.contains(&("memory", "memory.limit_in_bytes", hard.clone())),
            "{w:?}"
        );
        assert!(
            w.contains(&("memory", "memory.memsw.limit_in_bytes", hard)),
            "{w:?}"
        );
        assert!(!w.iter().any(|(_, f, _)| f.contains("high")), "{w:?}");
    }

    #[test]
    fn only_a_cgroup_with_headroom_above_the_declared_limit_is_watched() {
        let d = 256 * MIB;
        assert!(leaves_headroom(d, limits(d, 1, None).memory_bytes));
        // An earlier plan's headroom still leaves room to act at the line.
        assert!(leaves_headroom(d, d + 64 * MIB));
        // Started before the memory guard: the hard limit is the declared one.
        assert!(!leaves_headroom(d, d));
        assert!(!leaves_headroom(d, 128 * MIB));
    }
}
