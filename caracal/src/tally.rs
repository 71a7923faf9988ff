//! This process's decisions per distributed identity since its last report, for `caracal top`:
//! each report of an identity's use (see `coordinator::registry`) takes its counts and sends
//! them as rates, and `top` adds up the fleet's.
//!
//! A decision costs a hash of the identity's parts and a read lock; only distributed
//! policies count (a local one is in no registry), and only its first decision of an identity
//! takes the write lock.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::labels::{At, Decision};
use crate::priority::Priority;
use crate::sync::lock;

/// How long after a process last decided on a retry budget's local share its reports still
/// say so: long enough for an operator to see an outage after it.
const LOCAL_SHARE_SHOWN: Duration = Duration::from_secs(300);

/// The most identities counted at once: past it the counts start again (an identity's next
/// report then shows no decisions), so scopes made per call cannot grow the map for ever.
const MOST_IDENTITIES: usize = 10_000;

/// What one identity decided since its counts were last taken.
#[derive(Debug)]
struct Counts {
    parts: [String; 4],
    admitted: AtomicU64,
    /// Rejections and degraded decisions, by decision and reason.
    other: Mutex<Vec<(Decision, &'static str, u64)>>,
    /// For a kind that decides by class: admitted and rejected calls per class, in
    /// [`Priority::ALL`]'s order.
    classes: [[AtomicU64; 2]; 3],
    since: Mutex<Instant>,
    /// A retry budget's latest run on its local share (not taken: it outlives reports).
    local_share: Mutex<LocalShare>,
}

/// When a retry budget last ran on its local share.
#[derive(Debug, Default)]
struct LocalShare {
    /// Since when it does, while it does.
    since: Option<Instant>,
    /// Its last run that ended: how long, and when it ended.
    last: Option<(Duration, Instant)>,
}

/// Per hash of the identity's parts: hashes that collide share a bucket.
type Buckets = HashMap<u64, Vec<Counts>>;

static TALLY: LazyLock<(RandomState, RwLock<Buckets>)> =
    LazyLock::new(|| (RandomState::new(), RwLock::default()));

fn key(parts: [&str; 4]) -> u64 {
    TALLY.0.hash_one(parts)
}

fn same(counts: &Counts, parts: [&str; 4]) -> bool {
    counts.parts.iter().zip(parts).all(|(a, b)| a == b)
}

/// Counts one decision of the identity at `at` if it is distributed, with the call's class
/// (for a kind that decides by class).
// Inlined, the rest not: a local policy's every decision passes here, and its whole cost
// should be this comparison (the class is not asked for what is not counted).
#[inline(always)]
pub(crate) fn count(at: &At<'_>, decision: Decision, reason: &'static str) {
    if at.coordination == "distributed" {
        count_distributed(at, at.priority(), decision, reason);
    }
}

#[inline(never)]
fn count_distributed(
    at: &At<'_>,
    priority: Option<Priority>,
    decision: Decision,
    reason: &'static str,
) {
    let add = |counts: &Counts| match decision {
        Decision::Admitted => {
            counts.admitted.fetch_add(1, Ordering::Relaxed);
            if let Some(priority) = priority {
                counts.classes[class(priority)][0].fetch_add(1, Ordering::Relaxed);
            }
        }
        _ => {
            let mut other = lock(&counts.other);
            match other
                .iter_mut()
                .find(|(d, r, _)| *d == decision && *r == reason)
            {
                Some((_, _, n)) => *n += 1,
                None => other.push((decision, reason, 1)),
            }
            if let (Some(priority), Decision::Rejected) = (priority, decision) {
                counts.classes[class(priority)][1].fetch_add(1, Ordering::Relaxed);
            }
        }
    };
    with_counts(at, add);
}

/// Notes whether the distributed retry budget at `at` decides on its local share now: its
/// reports say how long it last did, and how long ago that ended.
pub(crate) fn local_share(at: &At<'_>, on: bool) {
    if at.coordination != "distributed" {
        return;
    }
    with_counts(at, |counts| {
        let mut local = lock(&counts.local_share);
        let now = Instant::now();
        match (on, local.since) {
            (true, None) => local.since = Some(now),
            (false, Some(since)) => {
                local.since = None;
                local.last = Some((now.duration_since(since), now));
            }
            _ => {}
        }
    });
}

/// Runs `f` on the counts of the identity at `at`, made on first use.
fn with_counts(at: &At<'_>, f: impl FnOnce(&Counts)) {
    let parts = [at.policy, at.name, at.operation, at.scope];
    let hash = key(parts);
    {
        let buckets = TALLY.1.read().unwrap_or_else(|e| e.into_inner());
        if let Some(counts) = buckets
            .get(&hash)
            .and_then(|bucket| bucket.iter().find(|c| same(c, parts)))
        {
            f(counts);
            return;
        }
    }
    let mut buckets = TALLY.1.write().unwrap_or_else(|e| e.into_inner());
    if buckets.len() >= MOST_IDENTITIES {
        buckets.clear();
    }
    let bucket = buckets.entry(hash).or_default();
    if !bucket.iter().any(|c| same(c, parts)) {
        bucket.push(Counts {
            parts: parts.map(str::to_owned),
            admitted: AtomicU64::new(0),
            other: Mutex::default(),
            classes: Default::default(),
            since: Mutex::new(Instant::now()),
            local_share: Mutex::default(),
        });
    }
    if let Some(counts) = bucket.iter().find(|c| same(c, parts)) {
        f(counts);
    }
}

/// Forgets the identities that decided nothing since their counts were last taken, at least
/// `idle` ago.
pub(crate) fn forget_idle(idle: std::time::Duration) {
    let now = Instant::now();
    let mut buckets = TALLY.1.write().unwrap_or_else(|e| e.into_inner());
    buckets.retain(|_, bucket| {
        bucket.retain(|counts| {
            counts.admitted.load(Ordering::Relaxed) > 0
                || !lock(&counts.other).is_empty()
                || now.duration_since(*lock(&counts.since)) < idle
                || lock(&counts.local_share).since.is_some()
        });
        !bucket.is_empty()
    });
    crate::sync::shrink(&mut buckets);
}

/// How many identities of the policy `name` are counted.
#[cfg(test)]
pub(crate) fn counted(name: &str) -> usize {
    let buckets = TALLY.1.read().unwrap_or_else(|e| e.into_inner());
    buckets
        .values()
        .flatten()
        .filter(|c| c.parts[1] == name)
        .count()
}

/// An identity's decisions per second since they were last taken.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Rates {
    pub(crate) admitted: f64,
    /// Per reason.
    pub(crate) rejected: Vec<(&'static str, f64)>,
    /// Per reason.
    pub(crate) degraded: Vec<(&'static str, f64)>,
    /// Per reason: what a policy in shadow mode would have refused.
    pub(crate) would_reject: Vec<(&'static str, f64)>,
    /// Per class that decided anything (a kind that decides by class), highest first:
    /// admitted, rejected.
    pub(crate) classes: Vec<(Priority, f64, f64)>,
    /// A retry budget's latest run on its local share, if it ran on it within
    /// [`LOCAL_SHARE_SHOWN`]: how long, and how long since it ended (0 while it runs), in
    /// seconds.
    pub(crate) local_share: Option<(f64, f64)>,
}

/// Where `priority`'s counts are.
fn class(priority: Priority) -> usize {
    Priority::ALL
        .iter()
        .position(|class| *class == priority)
        .unwrap_or_default()
}

/// Takes the decisions of the identity with these parts (kind, name, operation, scope) made
/// since they were last taken, as rates; none if it made none.
pub(crate) fn take(parts: [&str; 4]) -> Rates {
    let buckets = TALLY.1.read().unwrap_or_else(|e| e.into_inner());
    let Some(counts) = buckets
        .get(&key(parts))
        .and_then(|bucket| bucket.iter().find(|c| same(c, parts)))
    else {
        return Rates::default();
    };
    let now = Instant::now();
    let local_share = {
        let local = lock(&counts.local_share);
        match (local.since, local.last) {
            (Some(since), _) => Some((now.duration_since(since), Duration::ZERO)),
            (None, Some((ran, ended))) if now.duration_since(ended) < LOCAL_SHARE_SHOWN => {
                Some((ran, now.duration_since(ended)))
            }
            _ => None,
        }
    };
    let local_share = local_share.map(|(ran, ago)| (ran.as_secs_f64(), ago.as_secs_f64()));
    let since = std::mem::replace(&mut *lock(&counts.since), now);
    let seconds = now.duration_since(since).as_secs_f64();
    if seconds <= 0.0 {
        return Rates {
            local_share,
            ..Rates::default()
        };
    }
    let per_second = |n: u64| n as f64 / seconds;
    let mut rates = Rates {
        admitted: per_second(counts.admitted.swap(0, Ordering::Relaxed)),
        local_share,
        ..Rates::default()
    };
    for (decision, reason, n) in std::mem::take(&mut *lock(&counts.other)) {
        let rate = (reason, per_second(n));
        match decision {
            Decision::Degraded => rates.degraded.push(rate),
            Decision::WouldReject => rates.would_reject.push(rate),
            _ => rates.rejected.push(rate),
        }
    }
    // Highest class first, as `top` lists them.
    for (priority, [admitted, rejected]) in Priority::ALL.into_iter().zip(&counts.classes).rev() {
        let [admitted, rejected] = [admitted, rejected].map(|n| n.swap(0, Ordering::Relaxed));
        if admitted + rejected > 0 {
            rates
                .classes
                .push((priority, per_second(admitted), per_second(rejected)));
        }
    }
    rates
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at<'a>(scope: &'a str, coordination: &'static str) -> At<'a> {
        At {
            policy: "bulkhead",
            name: "tally",
            operation: "tally",
            scope,
            coordination,
            shadow: false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn decisions_are_taken_once_as_rates_over_the_time_since() {
        let scope = "tally-rates";
        let parts = ["bulkhead", "tally", "tally", scope];
        let at = at(scope, "distributed");
        for _ in 0..20 {
            count_distributed(
                &at,
                Some(Priority::Critical),
                Decision::Admitted,
                "admitted",
            );
        }
        for _ in 0..4 {
            count_distributed(
                &at,
                Some(Priority::Sheddable),
                Decision::Rejected,
                "capacity",
            );
        }
        count_distributed(&at, Some(Priority::Normal), Decision::Degraded, "fail_open");
        count_distributed(&at, None, Decision::WouldReject, "capacity");
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        let rates = take(parts);
        assert_eq!(rates.admitted, 10.0);
        assert_eq!(rates.rejected, [("capacity", 2.0)]);
        assert_eq!(rates.degraded, [("fail_open", 0.5)]);
        assert_eq!(rates.would_reject, [("capacity", 0.5)]);
        assert_eq!(
            rates.classes,
            [
                (Priority::Critical, 10.0, 0.0),
                (Priority::Sheddable, 0.0, 2.0)
            ],
            "a degraded call is neither admitted nor refused by its class"
        );
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert_eq!(take(parts), Rates::default(), "taken already");
    }

    /// A retry budget's reports say how long it last ran on its local share and how long ago
    /// that ended, for a while after it, and take nothing of it.
    #[tokio::test(start_paused = true)]
    async fn a_run_on_the_local_share_is_reported_until_long_after_it_ends() {
        let scope = "tally-local-share";
        let parts = ["retry_budget", "tally", "tally", scope];
        let at = At {
            policy: "retry_budget",
            ..at(scope, "distributed")
        };
        let seconds = |n| tokio::time::sleep(Duration::from_secs(n));
        local_share(&at, false);
        seconds(1).await;
        assert_eq!(take(parts).local_share, None, "never on it");
        local_share(&at, true);
        seconds(3).await;
        local_share(&at, true);
        seconds(9).await;
        assert_eq!(take(parts).local_share, Some((12.0, 0.0)), "on it still");
        local_share(&at, false);
        seconds(40).await;
        local_share(&at, false);
        assert_eq!(take(parts).local_share, Some((12.0, 40.0)));
        assert_eq!(take(parts).local_share, Some((12.0, 40.0)), "not taken");
        seconds(300).await;
        assert_eq!(take(parts).local_share, None, "long ago");
    }

    /// What a policy counts through [`count`] carries its caller's class, read there.
    #[tokio::test(start_paused = true)]
    async fn a_decision_is_counted_under_the_callers_class() {
        let scope = "tally-class";
        let at = at(scope, "distributed");
        crate::priority::with_priority(Priority::Sheddable, async {
            count(&at, Decision::Admitted, "admitted");
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let rates = take(["bulkhead", "tally", "tally", scope]);
        assert_eq!(rates.admitted, 1.0);
        assert_eq!(rates.classes, [(Priority::Sheddable, 1.0, 0.0)]);
    }

    #[test]
    fn a_local_policy_is_not_counted() {
        let scope = "tally-local";
        count(&at(scope, "local"), Decision::Admitted, "admitted");
        assert_eq!(
            take(["bulkhead", "tally", "tally", scope]),
            Rates::default()
        );
    }
}
