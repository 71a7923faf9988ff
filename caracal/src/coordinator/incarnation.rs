//! Which incarnation of the server this coordinator talks to. A Redis that restarted without
//! persistence, a replica promoted in its primary's place, or a server whose keys were flushed
//! has lost (some of) the state written before: every lease held there is gone at once.
//!
//! A loss is *noticed* in one of these ways, each as soon as it can be:
//! - the `run_id` of a primary changed or the primary is gone: the Redis backend reads every
//!   primary's `run_id` on connecting (a restart breaks the connections, so it is read again at
//!   once), and periodically (a failover no connection ran into);
//! - a marker key of the namespace, read with the fleet's overrides every second, is gone or
//!   was replaced (a `FLUSHALL` or `FLUSHDB` that kept the server);
//! - a lease command found its identity's fencing counter below a token this process knows to
//!   be live (that identity's keys were lost: a flush, an eviction, a deleted key);
//! - another process announced a loss it noticed on the namespace's feed.
//!
//! Every loss this process notices itself is announced on the feed, so the others notice it
//! within one message. Only what a primary answered counts: a primary that could not be asked
//! is neither lost nor confirmed, and is compared once it answers.
//!
//! On a loss the epoch moves on: every lease holder checks it before its body takes another
//! step, so the holders of this process are cancelled at once. And for a while after
//! ([`DataLoss`]: by default a two-second grace) no bulkhead caller is admitted through this
//! process: by then every process that holds a lease and can reach the server has noticed the
//! loss too (at once, through the feed; at the latest at its next periodic check) and cancelled
//! its holders. The marker is learnt anew after every loss, so one restart (which also loses
//! the marker) is noticed once by this process, not again by its next read of the marker.
//!
//! Every reconnection also wakes the holders, so they confirm their leases with a renewal at
//! once instead of at their next period.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::Notified;
use tokio::time::Instant;

use crate::events;
use crate::sync::lock;

/// What a process does after it noticed that the server lost its data: how long it admits no
/// bulkhead caller.
///
/// ```
/// # async fn f() -> Result<(), caracal::Error> {
/// use std::time::Duration;
/// let coordinator = caracal::Coordinator::redis("redis://127.0.0.1:6379")
///     .after_data_loss(caracal::DataLoss::Grace(Duration::from_secs(5)))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DataLoss {
    /// Admit again after this long (the default: 2 s), or after one lease if that is shorter.
    /// Every process that holds a lease and can reach the server cancels its holders within
    /// it: at once when another process announces the loss, at the latest at its next check
    /// (every second). A holder cut off from the server through the loss runs on until its
    /// own trust deadline: the inherent limit that fencing tokens close.
    Grace(Duration),
    /// Admit again after one lease period of the call site, by when every lease granted before
    /// the loss has expired at its holder wherever it is, cut off or not.
    WholeLease,
}

impl DataLoss {
    /// The default grace.
    pub const DEFAULT_GRACE: Duration = Duration::from_secs(2);

    /// How long to admit nothing after a loss, at a call site whose leases last `lease`.
    pub(crate) fn wait(self, lease: Duration) -> Duration {
        match self {
            DataLoss::Grace(grace) => grace.min(lease),
            DataLoss::WholeLease => lease,
        }
    }
}

impl Default for DataLoss {
    fn default() -> Self {
        DataLoss::Grace(Self::DEFAULT_GRACE)
    }
}

/// How a loss was noticed (the `cause` of the `coordinator.data_lost` event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LossCause {
    /// A primary's `run_id` changed: it restarted.
    Restarted,
    /// A primary seen before is no longer one: failed over, or removed.
    PrimaryGone,
    /// The namespace's marker key is gone: the server was flushed.
    Flushed,
    /// An identity's fencing counter was below a live token: its keys were lost.
    KeysLost,
    /// Another process noticed it and announced it.
    Announced,
}

impl LossCause {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LossCause::Restarted => "restarted",
            LossCause::PrimaryGone => "primary_gone",
            LossCause::Flushed => "flushed",
            LossCause::KeysLost => "keys_lost",
            LossCause::Announced => "announced",
        }
    }
}

#[derive(Default)]
pub(crate) struct Incarnation {
    /// The `run_id` of every primary, by node, as last seen (`None` before the first check).
    run_ids: Mutex<Option<BTreeMap<String, String>>>,
    epoch: AtomicU64,
    /// When the last loss was noticed.
    lost_at: Mutex<Option<Instant>>,
    after_loss: DataLoss,
    /// The namespace's marker as last read, and the epoch it was read in.
    marker: Mutex<Option<(String, u64)>>,
    /// Tells the other processes of a loss noticed here.
    announce: OnceLock<Box<dyn Fn() + Send + Sync>>,
    changed: Notify,
    /// How many reconnections there have been.
    reconnections: AtomicU64,
}

impl std::fmt::Debug for Incarnation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incarnation")
            .field("epoch", &self.epoch())
            .field("after_loss", &self.after_loss)
            .finish_non_exhaustive()
    }
}

impl Incarnation {
    pub(crate) fn new(after_loss: DataLoss) -> Self {
        Incarnation {
            after_loss,
            ..Incarnation::default()
        }
    }

    /// The current epoch: it moves on whenever the server is found to have lost its data.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Whether a call site whose leases last `lease` must still admit nobody after the last
    /// loss (see [`DataLoss`]).
    pub(crate) fn waiting_after_loss(&self, lease: Duration) -> bool {
        let wait = self.after_loss.wait(lease);
        self.epoch() > 0 && lock(&self.lost_at).is_some_and(|at| at.elapsed() < wait)
    }

    /// How many reconnections there have been: a kept lease parked before the latest one is not
    /// handed on unconfirmed.
    pub(crate) fn reconnections(&self) -> u64 {
        self.reconnections.load(Ordering::Acquire)
    }

    /// Completes at the next reconnection (or epoch change) after this call.
    pub(crate) fn changed(&self) -> Pin<Box<Notified<'_>>> {
        let mut notified = Box::pin(self.changed.notified());
        notified.as_mut().enable();
        notified
    }

    /// How this process tells the others of a loss it noticed; set once, by the backend.
    pub(crate) fn announce_with(&self, announce: impl Fn() + Send + Sync + 'static) {
        let _ = self.announce.set(Box::new(announce));
    }

    /// Records what a check of the server found: `primaries`, the nodes serving its data now,
    /// and the `run_id`s of those that answered, by node. A primary seen before that is no
    /// longer one (failed over, or removed) or that answered with another `run_id` (restarted)
    /// means lost data. Called before anything checked is served, so no call can be admitted
    /// through it before the epoch has moved on.
    pub(crate) fn observe(&self, primaries: &BTreeSet<String>, run_ids: &BTreeMap<String, String>) {
        let lost = {
            let mut guard = lock(&self.run_ids);
            let known = guard.take().unwrap_or_default();
            let gone = known.keys().any(|node| !primaries.contains(node));
            let restarted = known
                .iter()
                .any(|(node, id)| run_ids.get(node).is_some_and(|seen| seen != id));
            let now = primaries.iter().filter_map(|node| {
                let id = run_ids.get(node).or_else(|| known.get(node))?;
                Some((node.clone(), id.clone()))
            });
            *guard = Some(now.collect());
            if restarted {
                Some(LossCause::Restarted)
            } else {
                gone.then_some(LossCause::PrimaryGone)
            }
        };
        if let Some(cause) = lost {
            self.lost(cause);
        }
    }

    /// The server lost its data, as `cause` tells: a new epoch. A loss noticed here is
    /// announced to the other processes.
    pub(crate) fn lost(&self, cause: LossCause) {
        *lock(&self.lost_at) = Some(Instant::now());
        // Whatever marker was read before is of the old data: learnt again, not compared.
        *lock(&self.marker) = None;
        let epoch = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        events::coordinator_data_lost(epoch, cause.as_str());
        self.changed.notify_waiters();
        if cause != LossCause::Announced
            && let Some(announce) = self.announce.get()
        {
            announce();
        }
    }

    /// The marker to send with the next read of it, and the epoch to hand back with what it
    /// read.
    pub(crate) fn marker(&self) -> (Option<String>, u64) {
        let epoch = self.epoch();
        let known = lock(&self.marker)
            .as_ref()
            .filter(|(_, read_in)| *read_in == epoch)
            .map(|(marker, _)| marker.clone());
        (known, epoch)
    }

    /// The namespace's marker read `read`, by a read that started in `epoch` knowing `known`:
    /// another marker than the one known means the keys were flushed. A read that a loss
    /// overtook tells nothing, and is learnt from next time.
    pub(crate) fn marker_read(&self, known: Option<&str>, read: String, epoch: u64) {
        let flushed = {
            let mut marker = lock(&self.marker);
            if self.epoch() != epoch {
                *marker = None;
                return;
            }
            let flushed = known.is_some_and(|known| known != read);
            *marker = Some((read, epoch));
            flushed
        };
        if flushed {
            self.lost(LossCause::Flushed);
        }
    }

    /// Wakes the holders after a reconnection, once what it found has been observed.
    pub(crate) fn reconnected(&self) {
        self.reconnections.fetch_add(1, Ordering::AcqRel);
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
        assert!(!incarnation.waiting_after_loss(Duration::from_secs(1)));
        all(&incarnation, &[("n1", "a"), ("n2", "d"), ("n3", "c")]);
        assert_eq!(incarnation.epoch(), 1, "n2 restarted");
        assert!(incarnation.waiting_after_loss(Duration::from_secs(1)));
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

    /// A marker other than the one read before is a flush; the first read, or one that a loss
    /// overtook, only learns it.
    #[test]
    fn a_replaced_marker_is_a_flush_once() {
        let incarnation = Incarnation::default();
        let (known, epoch) = incarnation.marker();
        assert_eq!(known, None);
        incarnation.marker_read(None, "m1".into(), epoch);
        let (known, epoch) = incarnation.marker();
        assert_eq!(known.as_deref(), Some("m1"));
        incarnation.marker_read(known.as_deref(), "m1".into(), epoch);
        assert_eq!(incarnation.epoch(), 0);
        incarnation.marker_read(Some("m1"), "m2".into(), epoch);
        assert_eq!(incarnation.epoch(), 1, "flushed");
        assert!(incarnation.waiting_after_loss(Duration::from_secs(1)));
        assert_eq!(incarnation.marker(), (None, 1), "learnt anew after a loss");
        let (known, epoch) = incarnation.marker();
        incarnation.lost(LossCause::Restarted);
        incarnation.marker_read(known.as_deref(), "m3".into(), epoch);
        assert_eq!(
            incarnation.epoch(),
            2,
            "a read a loss overtook tells nothing"
        );
        assert_eq!(incarnation.marker(), (None, 2));
    }

    #[test]
    fn the_wait_after_a_loss_is_the_grace_or_the_lease() {
        let lease = Duration::from_secs(30);
        assert_eq!(DataLoss::default().wait(lease), Duration::from_secs(2));
        let short = Duration::from_secs(1);
        assert_eq!(DataLoss::default().wait(short), short, "never past a lease");
        assert_eq!(DataLoss::WholeLease.wait(lease), lease);
        let incarnation = Incarnation::new(DataLoss::WholeLease);
        incarnation.lost(LossCause::KeysLost);
        assert!(incarnation.waiting_after_loss(lease));
    }
}
