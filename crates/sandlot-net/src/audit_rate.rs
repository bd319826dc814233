//! How many egress audit entries one sandbox may write: a token bucket per sandbox.
//!
//! Every allowed connection, denial and DNS answer of a sandbox is an entry in the
//! daemon's database, written under its one store lock. A sandbox that connects to a
//! denied name in a loop (each denial takes microseconds) would otherwise write entries
//! as fast as it can: the database grows without bound and every other tenant's
//! requests wait on the lock. Past its budget a sandbox's entries are counted, not
//! written, and the next entry written says how many were left out. Metrics count them.

/// Entries a sandbox may write at once.
pub const BURST: u32 = 200;
/// Entries a second it regains.
pub const PER_SECOND: u32 = 50;

/// One sandbox's budget. Pure: time is given in milliseconds.
#[derive(Debug, Clone)]
pub struct AuditBudget {
    /// Tokens, in thousandths of an entry.
    milli_tokens: u64,
    last_ms: i64,
    /// Entries left out since the last one written.
    dropped: u64,
}

impl Default for AuditBudget {
    fn default() -> AuditBudget {
        AuditBudget {
            milli_tokens: u64::from(BURST) * 1000,
            last_ms: i64::MIN,
            dropped: 0,
        }
    }
}

impl AuditBudget {
    /// An entry at `now_ms`: `Some(n)` to write it, standing for `n` entries left out
    /// before it; `None` to leave it out.
    pub fn admit(&mut self, now_ms: i64) -> Option<u64> {
        if self.last_ms != i64::MIN && now_ms > self.last_ms {
            let gained = (now_ms - self.last_ms) as u64 * u64::from(PER_SECOND);
            self.milli_tokens = (self.milli_tokens + gained).min(u64::from(BURST) * 1000);
        }
        if self.last_ms == i64::MIN || now_ms > self.last_ms {
            self.last_ms = now_ms;
        }
        if self.milli_tokens < 1000 {
            self.dropped += 1;
            return None;
        }
        self.milli_tokens -= 1000;
        Some(std::mem::take(&mut self.dropped))
    }
}

/// The budgets of the attached sandboxes, one each from attach to detach.
#[derive(Debug, Default)]
pub struct AuditBudgets {
    by_sandbox: std::collections::HashMap<String, AuditBudget>,
}

impl AuditBudgets {
    /// Gives sandbox `id` a full budget (at attach).
    pub fn open(&mut self, id: &str) {
        self.by_sandbox
            .insert(id.to_string(), AuditBudget::default());
    }

    /// Forgets sandbox `id`'s budget (at detach).
    pub fn close(&mut self, id: &str) {
        self.by_sandbox.remove(id);
    }

    /// An entry of sandbox `id` at `now_ms`, as [`AuditBudget::admit`]. A sandbox
    /// without a budget has been detached: what it still writes comes from its
    /// connections draining (bounded by its connection cap) and is written, and no
    /// budget is made for it (one made then would never be forgotten).
    pub fn admit(&mut self, id: &str, now_ms: i64) -> Option<u64> {
        match self.by_sandbox.get_mut(id) {
            Some(b) => b.admit(now_ms),
            None => Some(0),
        }
    }

    /// Sandboxes holding a budget.
    pub fn len(&self) -> usize {
        self.by_sandbox.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_sandbox.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_of_a_detached_sandbox_are_written_without_keeping_a_budget_for_it() {
        let mut all = AuditBudgets::default();
        all.open("sb-1");
        for _ in 0..BURST {
            assert_eq!(all.admit("sb-1", 1_000), Some(0));
        }
        assert_eq!(all.admit("sb-1", 1_000), None);
        all.close("sb-1");
        assert!(all.is_empty());
        // Its relays finishing after detach write their entries; nothing is kept.
        for i in 0..1_000 {
            assert_eq!(all.admit(&format!("sb-{i}"), 1_000), Some(0));
        }
        assert!(all.is_empty(), "{} budgets kept", all.len());
    }

    #[test]
    fn a_burst_is_written_then_entries_are_counted_and_reported_with_the_next() {
        let mut b = AuditBudget::default();
        for _ in 0..BURST {
            assert_eq!(b.admit(1_000), Some(0));
        }
        // The loop goes on within the same millisecond: left out, counted.
        for _ in 0..500 {
            assert_eq!(b.admit(1_000), None);
        }
        // A second later the budget has PER_SECOND entries again; the first says 500.
        assert_eq!(b.admit(2_000), Some(500));
        for _ in 1..PER_SECOND {
            assert_eq!(b.admit(2_000), Some(0));
        }
        assert_eq!(b.admit(2_000), None);
        // A quiet minute refills to the burst, never above.
        for _ in 0..BURST {
            assert!(b.admit(62_000).is_some());
        }
        assert_eq!(b.admit(62_000), None);
    }

    #[test]
    fn a_clock_going_back_never_adds_tokens() {
        let mut b = AuditBudget::default();
        for _ in 0..BURST {
            b.admit(10_000);
        }
        assert_eq!(b.admit(5_000), None);
        assert_eq!(b.admit(10_000), None);
    }
}
