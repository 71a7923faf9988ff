//! Events that repeat on every call while a condition lasts (a coordinator outage degrading
//! every admission, an open breaker rejecting every call): emitted once when the condition
//! starts, then as one summary per identity and event every [`PERIOD`], carrying how many
//! were suppressed since (`suppressed = N`). A replica under load through an outage writes a
//! handful of lines, not one per call; what each suppressed call decided is still counted by
//! the metrics.
//!
//! The summary is due at the first occurrence after the period: a condition that ends
//! leaves its last count unsaid until it starts again (no timer runs for it), or until its
//! identity has been idle for [`crate::FORGET_IDLE_AFTER`], when the count is dropped.
//!
//! What the coordinator's loss causes (degraded decisions, failed commands, releases that find
//! their leases gone after it) is one condition of the process, whatever the scope:
//! [`repeat_across`] says it once per policy (kind and name) and summarises it with how many
//! identities it touched, so an outage costs the log the same few lines for a scope per user
//! as for one scope.

use std::collections::{HashMap, HashSet};
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

/// One repeating event of one identity (or of the process, for [`repeat_across`]): when its
/// current period started, how many occurrences it suppressed since, and which identities
/// (by hash) it was seen for.
#[derive(Debug, Clone)]
struct Repeats {
    since: Instant,
    suppressed: u64,
    identities: HashSet<u64>,
}

/// The most identities a process-wide summary tells apart; past it, it says "at least".
const MOST_IDENTITIES: usize = 1024;

/// What a process-wide repeating event says when it is emitted: how many occurrences it
/// suppressed since it was last said, over how many identities (the one it names included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Across {
    pub(crate) suppressed: u64,
    pub(crate) identities: usize,
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
    SUMMARIES.per_identity(event, at, condition, Instant::now())
}

/// An occurrence of `event` about `at` under `condition`, summarised across the policy's
/// operations and scopes rather than per identity (see the module's doc), apart for each
/// `coordinator` (an outage is one coordinator's): `Some` when it is to be emitted.
pub(crate) fn repeat_across(
    event: &'static str,
    at: &At<'_>,
    coordinator: u64,
    condition: &[&str],
) -> Option<Across> {
    SUMMARIES.across(event, at, coordinator, condition, Instant::now())
}

/// Forgets the summaries of conditions quiet for `quiet` (an idle identity's).
pub(crate) fn forget_quiet(quiet: Duration) {
    Summaries::forget_quiet(&mut lock(&SUMMARIES.repeats), Instant::now(), quiet);
}

fn identity<'a>(at: &At<'a>) -> (&'a str, &'a str, &'a str, &'a str) {
    (at.policy, at.name, at.operation, at.scope)
}

impl Summaries {
    fn per_identity(
        &self,
        event: &str,
        at: &At<'_>,
        condition: &[&str],
        now: Instant,
    ) -> Option<u64> {
        let key = self.hasher.hash_one((event, identity(at), condition));
        self.repeat(key, None, now).map(|across| across.suppressed)
    }

    fn across(
        &self,
        event: &str,
        at: &At<'_>,
        coordinator: u64,
        condition: &[&str],
        now: Instant,
    ) -> Option<Across> {
        let key = self
            .hasher
            .hash_one((event, at.policy, at.name, coordinator, condition));
        self.repeat(key, Some(self.hasher.hash_one(identity(at))), now)
    }

    /// Forgets the repeats whose period started `quiet` ago or more: their next occurrence
    /// starts the condition afresh, and a count they left unsaid is dropped.
    fn forget_quiet(repeats: &mut HashMap<u64, Repeats>, now: Instant, quiet: Duration) {
        repeats.retain(|_, seen| now.duration_since(seen.since) < quiet);
        crate::sync::shrink(repeats);
    }

    fn repeat(&self, key: u64, identity: Option<u64>, now: Instant) -> Option<Across> {
        let mut repeats = lock(&self.repeats);
        if repeats.len() >= SWEEP_AT {
            Self::forget_quiet(&mut repeats, now, PERIOD);
        }
        let fresh = Repeats {
            since: now,
            suppressed: 0,
            identities: identity.into_iter().collect(),
        };
        match repeats.get_mut(&key) {
            Some(seen) if now.duration_since(seen.since) < PERIOD => {
                seen.suppressed += 1;
                if let Some(identity) = identity
                    && seen.identities.len() < MOST_IDENTITIES
                {
                    seen.identities.insert(identity);
                }
                None
            }
            Some(seen) => {
                let said = std::mem::replace(seen, fresh);
                Some(Across {
                    suppressed: said.suppressed,
                    identities: said.identities.len().max(1),
                })
            }
            None => {
                repeats.insert(key, fresh);
                Some(Across {
                    suppressed: 0,
                    identities: 1,
                })
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
            shadow: false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_is_emitted_then_one_summary_per_period() {
        let summaries = Summaries::default();
        let mut emitted = Vec::new();
        for _ in 0..250 {
            if let Some(suppressed) = summaries.per_identity("e", &at("a"), &[], Instant::now()) {
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
        assert_eq!(summaries.per_identity("e", &at("a"), &[], now), Some(0));
        assert_eq!(summaries.per_identity("e", &at("b"), &[], now), Some(0));
        assert_eq!(summaries.per_identity("f", &at("a"), &[], now), Some(0));
        assert_eq!(
            summaries.per_identity("e", &at("a"), &["other"], now),
            Some(0)
        );
        assert_eq!(summaries.per_identity("e", &at("a"), &[], now), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_process_wide_condition_is_said_once_for_every_identity() {
        let summaries = Summaries::default();
        let scopes: Vec<String> = (0..10).map(|n| format!("s{n}")).collect();
        let mut emitted = Vec::new();
        for n in 0..200 {
            let at = at(&scopes[n % 10]);
            if let Some(across) = summaries.across("e", &at, 1, &["disconnected"], Instant::now()) {
                emitted.push(across);
            }
            tokio::time::advance(Duration::from_millis(100)).await;
        }
        // 20 s over ten identities: the first, then one summary at 10 s naming all ten.
        let said = |suppressed, identities| Across {
            suppressed,
            identities,
        };
        assert_eq!(emitted, [said(0, 1), said(99, 10)]);
    }
}
