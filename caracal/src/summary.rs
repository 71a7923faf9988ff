//! Events that repeat on every call while a condition lasts (a coordinator outage degrading
//! every admission, an open breaker rejecting every call): emitted once when the condition
//! starts, then as one summary per identity and event every [`PERIOD`], carrying how many
//! were suppressed since (`suppressed = N`). A replica under load through an outage writes a
//! handful of lines, not one per call; what each suppressed call decided is still counted by
//! the metrics.
//!
//! The summary is due at the first occurrence after the period: a condition that ends
//! leaves its last count unsaid until it starts again (no timer runs for it).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::labels::At;
use crate::sync::lock;

/// How often a repeating event is summarised, per identity and event.
pub(crate) const PERIOD: Duration = Duration::from_secs(10);

/// How many identities' repeating events are tracked before the quiet ones are forgotten.
const SWEEP_AT: usize = 4096;

/// One repeating event of one identity: when its current period started, and how many
/// occurrences it suppressed since.
#[derive(Debug, Clone, Copy)]
struct Repeats {
    since: Instant,
    suppressed: u64,
}

#[derive(Debug, Default)]
struct Summaries {
    hasher: RandomState,
    repeats: Mutex<HashMap<u64, Repeats>>,
}

static SUMMARIES: LazyLock<Summaries> = LazyLock::new(Summaries::default);

/// An occurrence of `event` about `at` under `condition` (its reason, the failure: what tells
/// one condition from another): `Some(suppressed)` when it is to be emitted (`0` for the
/// first of a condition, else the count suppressed since the last one emitted), `None` when
/// it is suppressed.
pub(crate) fn repeat(event: &'static str, at: &At<'_>, condition: &[&str]) -> Option<u64> {
    SUMMARIES.repeat(event, at, condition, Instant::now())
}

impl Summaries {
    fn key(&self, event: &str, at: &At<'_>, condition: &[&str]) -> u64 {
        self.hasher
            .hash_one((event, at.policy, at.name, at.operation, at.scope, condition))
    }

    fn repeat(
        &self,
        event: &'static str,
        at: &At<'_>,
        condition: &[&str],
        now: Instant,
    ) -> Option<u64> {
        let key = self.key(event, at, condition);
        let mut repeats = lock(&self.repeats);
        if repeats.len() >= SWEEP_AT {
            repeats.retain(|_, seen| now.duration_since(seen.since) < PERIOD);
        }
        let fresh = Repeats {
            since: now,
            suppressed: 0,
        };
        match repeats.get_mut(&key) {
            Some(seen) if now.duration_since(seen.since) < PERIOD => {
                seen.suppressed += 1;
                None
            }
            Some(seen) => Some(std::mem::replace(seen, fresh).suppressed),
            None => {
                repeats.insert(key, fresh);
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(scope: &str) -> At<'_> {
        At {
            policy: "bulkhead",
            name: "n",
            operation: "o",
            scope,
            coordination: "distributed",
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_is_emitted_then_one_summary_per_period() {
        let summaries = Summaries::default();
        let mut emitted = Vec::new();
        for _ in 0..250 {
            if let Some(suppressed) = summaries.repeat("e", &at("a"), &[], Instant::now()) {
                emitted.push(suppressed);
            }
            tokio::time::advance(Duration::from_millis(100)).await;
        }
        // 25 s of one occurrence per 100 ms: the first, then one at 10 s and one at 20 s, each
        // counting the 99 suppressed before it.
        assert_eq!(emitted, [0, 99, 99]);
    }

    #[tokio::test(start_paused = true)]
    async fn identities_events_and_conditions_are_summarised_apart() {
        let summaries = Summaries::default();
        let now = Instant::now();
        assert_eq!(summaries.repeat("e", &at("a"), &[], now), Some(0));
        assert_eq!(summaries.repeat("e", &at("b"), &[], now), Some(0));
        assert_eq!(summaries.repeat("f", &at("a"), &[], now), Some(0));
        assert_eq!(summaries.repeat("e", &at("a"), &["other"], now), Some(0));
        assert_eq!(summaries.repeat("e", &at("a"), &[], now), None);
    }
}
