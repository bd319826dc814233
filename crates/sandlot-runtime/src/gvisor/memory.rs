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

/// Room above the declared limit `declared`: a quarter of it, 128 MiB to 1 GiB.
/// Enough for gVisor's own memory and for what a process allocates between the
/// crossing of the line and its kill.
pub fn headroom(declared: u64) -> u64 {
    (declared / 4).clamp(128 * MIB, 1024 * MIB)
}

/// The cgroup's limits for a sandbox declaring `declared` bytes of memory:
/// `memory_bytes` is the hard limit (declared + headroom), `memory_high` the line.
pub fn limits(declared: u64, pids: u32, cpus: Option<f64>) -> CgroupLimits {
    CgroupLimits {
        memory_bytes: declared.saturating_add(headroom(declared)),
        memory_high: Some(declared),
        pids,
        cpus,
    }
}

/// The declared limit whose hard limit is `hard` (what an adopted sandbox's
/// cgroup says), `None` when no declared limit gives it.
pub fn declared_of(hard: u64) -> Option<u64> {
    // declared + headroom(declared) rises strictly with declared: search it.
    let (mut lo, mut hi) = (0u64, hard);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if mid.saturating_add(headroom(mid)) < hard {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    (lo.saturating_add(headroom(lo)) == hard).then_some(lo)
}

#[cfg(test)]
mod tests {
    use super::{declared_of, headroom, limits, MIB};
    use crate::cgroup::{limit_writes, CgroupLayout};

    #[test]
    fn headroom_is_a_quarter_between_128_mib_and_1_gib() {
        assert_eq!(headroom(256 * MIB), 128 * MIB);
        assert_eq!(headroom(2048 * MIB), 512 * MIB);
        assert_eq!(headroom(64 << 30), 1024 * MIB);
    }

    #[test]
    fn v2_hard_limit_has_headroom_and_memory_high_is_the_declared_limit() {
        let l = limits(256 * MIB, 64, None);
        let w = limit_writes(&CgroupLayout::V2 { root: "/x".into() }, &l);
        assert!(
            w.contains(&("", "memory.max", (384 * MIB).to_string())),
            "{w:?}"
        );
        assert!(
            w.contains(&("", "memory.high", (256 * MIB).to_string())),
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
    fn an_adopted_sandbox_s_declared_limit_is_found_from_its_hard_limit() {
        for d in [0, 1, 64 * MIB, 256 * MIB, 511 * MIB + 7, 4 << 30, 64 << 30] {
            assert_eq!(declared_of(limits(d, 1, None).memory_bytes), Some(d), "{d}");
        }
        // A limit no plan makes (below the least headroom).
        assert_eq!(declared_of(MIB), None);
    }
}
