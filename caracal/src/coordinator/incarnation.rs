//! Which incarnation of the server this coordinator talks to. A Redis that restarted without
//! persistence, or a replica promoted in its place, has lost (some of) the state written to
//! its predecessor: every lease held there is gone at once. The Redis backend reports the
//! `run_id` of every primary it checks (on connecting; on a cluster, also after a node failed
//! or the slots moved, and periodically); a change starts a new epoch, which every holder of a
//! lease checks before its body takes another step. Only what a primary answered counts: a
//! primary that could not be asked is neither lost nor confirmed, and is compared once it
//! answers.
//!
//! Every reconnection also wakes the holders, so they confirm their leases with a renewal at
//! once instead of at their next period.
//!
//! A server that lost its data also forgot the leases of holders this process cannot reach or
//! cancel (in other processes, some perhaps partitioned away): they run on until their own
//! deadlines. So after a loss, a bulkhead admits nothing through this process until one lease
//! period has passed ([`Incarnation::lost_within`]): by then every lease granted before the
//! loss has expired at its holder.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::Notified;
use tokio::time::Instant;

use crate::events;
use crate::sync::lock;

#[derive(Debug, Default)]
pub(crate) struct Incarnation {
    /// The `run_id` of every primary, by node, as last seen (`None` before the first check).
    run_ids: Mutex<Option<BTreeMap<String, String>>>,
    epoch: AtomicU64,
    /// When the last loss was noticed.
    lost_at: Mutex<Option<Instant>>,
    changed: Notify,
}

impl Incarnation {
    /// The current epoch: it moves on whenever the server is found to have lost its data.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Whether the server was found to have lost its data less than `period` ago.
    pub(crate) fn lost_within(&self, period: Duration) -> bool {
        self.epoch() > 0 && lock(&self.lost_at).is_some_and(|at| at.elapsed() < period)
    }

    /// Completes at the next reconnection (or epoch change) after this call.
    pub(crate) fn changed(&self) -> Pin<Box<Notified<'_>>> {
        let mut notified = Box::pin(self.changed.notified());
        notified.as_mut().enable();
        notified
    }

    /// Records what a check of the server found: `primaries`, the nodes serving its data now,
    /// and the `run_id`s of those that answered, by node. A primary seen before that is no
    /// longer one (failed over, or removed) or that answered with another `run_id` (restarted)
    /// means lost data: a new epoch. Called before anything checked is served, so no call can
    /// be admitted through it before the epoch has moved on.
    pub(crate) fn observe(&self, primaries: &BTreeSet<String>, run_ids: &BTreeMap<String, String>) {
        let lost = {
            let mut guard = lock(&self.run_ids);
            let known = guard.take().unwrap_or_default();
            let lost = known.iter().any(|(node, id)| {
                !primaries.contains(node) || run_ids.get(node).is_some_and(|seen| seen != id)
            });
            let now = primaries.iter().filter_map(|node| {
                let id = run_ids.get(node).or_else(|| known.get(node))?;
                Some((node.clone(), id.clone()))
            });
            *guard = Some(now.collect());
            lost
        };
        if lost {
            *lock(&self.lost_at) = Some(Instant::now());
            let epoch = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
            events::coordinator_data_lost(epoch);
            self.changed.notify_waiters();
        }
    }

    /// Wakes the holders after a reconnection, once what it found has been observed.
    pub(crate) fn reconnected(&self) {
        self.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(nodes: &[&str]) -> BTreeSet<String> {
        nodes.iter().map(|node| (*node).to_owned()).collect()
    }

    fn ids(ids: &[(&str, &str)]) -> BTreeMap<String, String> {
        ids.iter()
            .map(|(node, id)| ((*node).to_owned(), (*id).to_owned()))
            .collect()
    }

    #[test]
    fn a_changed_or_missing_primary_starts_a_new_epoch() {
        let incarnation = Incarnation::default();
        let all = |i: &Incarnation, seen: &[(&str, &str)]| {
            let seen = ids(seen);
            i.observe(&seen.keys().cloned().collect(), &seen);
        };
        all(&incarnation, &[("n1", "a"), ("n2", "b")]);
        assert_eq!(incarnation.epoch(), 0, "the first sight is no loss");
        all(&incarnation, &[("n1", "a"), ("n2", "b"), ("n3", "c")]);
        assert_eq!(incarnation.epoch(), 0, "a node added loses nothing");
        assert!(!incarnation.lost_within(Duration::from_secs(1)));
        all(&incarnation, &[("n1", "a"), ("n2", "d"), ("n3", "c")]);
        assert_eq!(incarnation.epoch(), 1, "n2 restarted");
        assert!(incarnation.lost_within(Duration::from_secs(1)));
        all(&incarnation, &[("n1", "a"), ("n3", "c"), ("n4", "e")]);
        assert_eq!(incarnation.epoch(), 2, "n2 was replaced");
        all(&incarnation, &[("n1", "a"), ("n3", "c"), ("n4", "e")]);
        assert_eq!(incarnation.epoch(), 2);
    }

    /// A primary that did not answer a check used to drop out of the known set: that read as
    /// lost data, and then its restart went unnoticed.
    #[test]
    fn a_primary_that_did_not_answer_is_compared_once_it_does() {
        let incarnation = Incarnation::default();
        let primaries = nodes(&["n1", "n2"]);
        incarnation.observe(&primaries, &ids(&[("n1", "a"), ("n2", "b")]));
        incarnation.observe(&primaries, &ids(&[("n1", "a")]));
        incarnation.observe(&primaries, &BTreeMap::new());
        assert_eq!(incarnation.epoch(), 0, "no answer is no loss");
        incarnation.observe(&primaries, &ids(&[("n2", "c")]));
        assert_eq!(
            incarnation.epoch(),
            1,
            "n2 restarted while it did not answer"
        );
    }

    #[tokio::test]
    async fn a_loss_or_a_reconnection_wakes_the_holders() {
        let incarnation = Incarnation::default();
        let changed = incarnation.changed();
        incarnation.reconnected();
        changed.await;
        let primaries = nodes(&[""]);
        incarnation.observe(&primaries, &ids(&[("", "a")]));
        let changed = incarnation.changed();
        incarnation.observe(&primaries, &ids(&[("", "b")]));
        changed.await;
    }
}
