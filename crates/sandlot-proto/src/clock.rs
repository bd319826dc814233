//! The wall clock as the wire's timestamps count it.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 for a clock set before it), the unit of
/// every `*_ms` timestamp Sandlot records or sends.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_is_after_the_time_this_was_written_and_does_not_go_back() {
        // 2026-01-01T00:00:00Z.
        let a = now_ms();
        assert!(a > 1_767_225_600_000, "{a}");
        assert!(now_ms() >= a);
    }
}
