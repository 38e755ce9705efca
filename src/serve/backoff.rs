//! Exponential backoff with jitter: for leadership terms that fail, and for
//! each object whose reconcile fails.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Waits that double from `first` up to `max`, each within ±20 % so that
/// replicas (or objects) do not retry in step.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    first: Duration,
    max: Duration,
}

impl Backoff {
    /// A backoff from `first` to `max`.
    pub const fn new(first: Duration, max: Duration) -> Self {
        Backoff { first, max }
    }

    /// The wait before retry number `attempt` (0: the first retry).
    pub fn wait(&self, attempt: u32) -> Duration {
        let base = self
            .first
            .saturating_mul(1 << attempt.min(16))
            .min(self.max);
        // The uuid's random bits are this process's dice.
        let unit = (uuid::Uuid::new_v4().as_u128() % 1000) as f64 / 1000.0;
        base.mul_f64(0.8 + 0.4 * unit)
    }
}

/// Failures in a row per object, for the reconcile error policy; an
/// object's count is forgotten once it reconciles.
#[derive(Debug, Default)]
pub struct Failures {
    counts: Mutex<HashMap<String, u32>>,
}

impl Failures {
    /// Counts a failure of `key`; returns how many came before it in a row.
    pub fn failed(&self, key: &str) -> u32 {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(key.to_owned()).or_default();
        let before = *count;
        *count = count.saturating_add(1);
        before
    }

    /// `key` reconciled: its next failure starts afresh.
    pub fn succeeded(&self, key: &str) {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_within_jitter_up_to_the_maximum() {
        let backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(60));
        for attempt in 0..20 {
            let base = Duration::from_millis(200)
                .saturating_mul(1 << attempt.min(16))
                .min(Duration::from_secs(60));
            let wait = backoff.wait(attempt);
            assert!(
                wait >= base.mul_f64(0.8) && wait <= base.mul_f64(1.2),
                "attempt {attempt}: {wait:?} not within 20 % of {base:?}"
            );
        }
        let distinct: std::collections::HashSet<_> = (0..20).map(|_| backoff.wait(3)).collect();
        assert!(distinct.len() > 1, "no jitter");
    }

    #[test]
    fn failures_count_per_object_and_reset_on_success() {
        let failures = Failures::default();
        assert_eq!(failures.failed("Barrier/a/x"), 0);
        assert_eq!(failures.failed("Barrier/a/x"), 1);
        assert_eq!(
            failures.failed("Barrier/a/y"),
            0,
            "another object counts apart"
        );
        failures.succeeded("Barrier/a/x");
        assert_eq!(failures.failed("Barrier/a/x"), 0);
    }
}
