//! A running sandbox's CPU and memory over time, in memory and bounded: the owner
//! records a sample every usage interval; when the history is full, every other
//! sample is dropped and only every second interval is recorded from then on, so
//! a sandbox's whole life fits in [`CAPACITY`] samples at a resolution that halves
//! as it ages. A pause or a daemon restart starts a new history.

use std::collections::VecDeque;

use sandlot_proto::api::metrics::MetricsSample;

/// Samples kept per sandbox (about 17 KiB): an hour at 5 s, then coarser.
pub const CAPACITY: usize = 720;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raw {
    pub at_ms: i64,
    pub cpu_usec: u64,
    pub memory_bytes: u64,
}

#[derive(Debug)]
pub struct UsageHistory {
    samples: VecDeque<Raw>,
    /// Record one interval in `stride`.
    stride: u32,
    ticks: u64,
    capacity: usize,
    /// The first sample's predecessor: when the history began and the CPU used
    /// by then (none for a new sandbox; an adopted one's so far).
    base: Raw,
}

impl UsageHistory {
    pub fn new(base: Raw) -> Self {
        Self::with_capacity(base, CAPACITY)
    }

    fn with_capacity(base: Raw, capacity: usize) -> Self {
        UsageHistory {
            samples: VecDeque::with_capacity(capacity.min(64)),
            stride: 1,
            ticks: 0,
            capacity: capacity.max(2),
            base,
        }
    }

    /// One usage interval has passed: keeps `s` if this interval is recorded.
    pub fn tick(&mut self, s: Raw) {
        self.ticks += 1;
        if !self.ticks.is_multiple_of(u64::from(self.stride)) {
            return;
        }
        if self.samples.len() == self.capacity {
            // Keep the newest of each pair, so the spacing stays even up to `s`.
            let mut i = 0usize;
            let keep_parity = (self.samples.len() - 1) % 2;
            self.samples.retain(|_| {
                let kept = i % 2 == keep_parity;
                i += 1;
                kept
            });
            self.stride = self.stride.saturating_mul(2);
        }
        self.samples.push_back(s);
    }

    /// Seconds between recorded samples, for an interval of `interval_s`.
    pub fn spacing_seconds(&self, interval_s: u32) -> u32 {
        interval_s.saturating_mul(self.stride)
    }

    /// The samples taken from `start_ms` to `end_ms` (inclusive; None = open),
    /// then `now` if given and in range; each with its CPU use since the sample
    /// before it (or since the start).
    pub fn range(
        &self,
        start_ms: Option<i64>,
        end_ms: Option<i64>,
        now: Option<Raw>,
    ) -> Vec<MetricsSample> {
        let in_range = |t: i64| start_ms.is_none_or(|s| t >= s) && end_ms.is_none_or(|e| t <= e);
        let mut prev = self.base;
        let mut out = Vec::new();
        for s in self.samples.iter().copied().chain(now) {
            if s.at_ms <= prev.at_ms && s != prev {
                // A live sample taken within the last one's millisecond.
                continue;
            }
            if in_range(s.at_ms) {
                out.push(sample(&prev, &s));
            }
            prev = s;
        }
        out
    }
}

fn sample(prev: &Raw, s: &Raw) -> MetricsSample {
    let dt_us = (s.at_ms - prev.at_ms).max(1) as f64 * 1000.0;
    let used = s.cpu_usec.saturating_sub(prev.cpu_usec) as f64;
    MetricsSample {
        at: crate::timefmt::rfc3339(s.at_ms),
        at_unix_ms: s.at_ms,
        cpu_seconds: s.cpu_usec as f64 / 1e6,
        cpu_cores: used / dt_us,
        memory_bytes: s.memory_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(sec: i64, cpu_ms: u64) -> Raw {
        Raw {
            at_ms: sec * 1000,
            cpu_usec: cpu_ms * 1000,
            memory_bytes: sec as u64,
        }
    }

    #[test]
    fn cpu_cores_are_the_use_between_a_sample_and_the_one_before() {
        let mut h = UsageHistory::new(raw(0, 0));
        h.tick(raw(5, 2500)); // half a core over the first 5 s
        h.tick(raw(10, 12500)); // two cores over the next 5 s
        let r = h.range(None, None, None);
        assert_eq!(r.len(), 2);
        assert!((r[0].cpu_cores - 0.5).abs() < 1e-9, "{r:?}");
        assert!((r[1].cpu_cores - 2.0).abs() < 1e-9, "{r:?}");
        assert!((r[1].cpu_seconds - 12.5).abs() < 1e-9);
        assert_eq!(r[1].at_unix_ms, 10_000);
    }

    #[test]
    fn a_range_keeps_its_samples_and_the_cpu_before_it_counts() {
        let mut h = UsageHistory::new(raw(0, 0));
        for s in 1..=10 {
            h.tick(raw(s * 5, (s as u64) * 5000)); // one core throughout
        }
        let r = h.range(Some(20_000), Some(30_000), None);
        assert_eq!(
            r.iter().map(|s| s.at_unix_ms).collect::<Vec<_>>(),
            [20_000, 25_000, 30_000]
        );
        assert!(r.iter().all(|s| (s.cpu_cores - 1.0).abs() < 1e-9), "{r:?}");
        // A live sample joins an open range, not a closed one that ended before it.
        let now = raw(52, 52_000);
        assert_eq!(h.range(Some(45_000), None, Some(now)).len(), 3);
        assert_eq!(h.range(Some(45_000), Some(50_000), Some(now)).len(), 2);
        assert!(h.range(Some(60_000), None, None).is_empty());
    }

    #[test]
    fn a_full_history_halves_its_resolution_and_keeps_the_whole_life() {
        let mut h = UsageHistory::with_capacity(raw(0, 0), 8);
        for s in 1..=8 {
            h.tick(raw(s, 0));
        }
        assert_eq!(h.spacing_seconds(1), 1);
        h.tick(raw(9, 0)); // full: every other sample goes, 9 comes in
        let at = |h: &UsageHistory| {
            h.range(None, None, None)
                .iter()
                .map(|s| s.at_unix_ms / 1000)
                .collect::<Vec<_>>()
        };
        assert_eq!(at(&h), [2, 4, 6, 8, 9]);
        assert_eq!(h.spacing_seconds(5), 10);
        for s in 10..=13 {
            h.tick(raw(s, 0)); // now only every second interval is recorded
        }
        assert_eq!(at(&h), [2, 4, 6, 8, 9, 10, 12]);
        for s in 12..=200 {
            h.tick(raw(s, 0));
        }
        let kept = at(&h);
        assert!(kept.len() <= 8, "{kept:?}");
        assert!(
            kept[0] <= 64,
            "the oldest kept sample is from early in the life: {kept:?}"
        );
        assert!(*kept.last().unwrap() >= 180, "{kept:?}");
    }
}
