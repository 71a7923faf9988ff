//! Kept leases (`keep = "5ms"`): the leases whose bodies finished, held by this process for a
//! short time so that the next call of the identity here starts without a round trip.
//!
//! A kept lease stays a member of the identity's lease set, so the fleet counts it like a
//! running body's: the pool only decides which of this process's callers holds it next, one at
//! a time (a lease is taken out under the lock before a body runs on it). Whether a lease is
//! still good to hand on (trusted long enough, the same server incarnation) is the holder's
//! rule, passed in as `usable`; what this module adds is the bound: a lease waits at most
//! `keep`, after which its timer takes it out and drops it, which releases it.
//!
//! A kept lease holds a slot no caller uses. Where a slot is wanted — a call of the identity was
//! refused a lease anywhere in the fleet — the fleet's pools return their kept leases of it at
//! once and keep none for [`CONTENDED`]: the refused process notes it here and tells the others
//! on the feed ([`Pool::refused_here`], [`Pool::refused_elsewhere`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::coordinator::{Coordinator, ForgetsIdle, timer};
use crate::identity::KeyBase;
use crate::sync::lock;

/// A kept lease, and until when it may wait for a caller.
struct Parked<L> {
    lease: L,
    until: Instant,
}

/// How long after a refusal of an identity's lease, anywhere in the fleet, no lease of it is
/// kept: the fleet is contended, and a kept lease would hold a slot a caller was refused. Twice
/// the longest a refusing process stays silent ([`Pool::refused_here`]), so a run of refusals
/// keeps every lease of the identity going back at once from the first to the last.
pub(super) const CONTENDED: Duration = Duration::from_millis(100);

/// The kept leases of one identity, and until when none is kept.
struct Shelf<L> {
    leases: Vec<Parked<L>>,
    /// Until when nothing is kept: a call of the identity was refused lately (see
    /// [`CONTENDED`]).
    contended: Option<Instant>,
    /// Until when the other processes keep nothing, from the latest refusal here they were
    /// told of.
    told: Option<Instant>,
}

impl<L> Default for Shelf<L> {
    fn default() -> Self {
        Shelf {
            leases: Vec::new(),
            contended: None,
            told: None,
        }
    }
}

impl<L> Shelf<L> {
    /// Whether it holds nothing worth remembering at `now`.
    fn idle(&self, now: Instant) -> bool {
        self.leases.is_empty() && self.contended.is_none_or(|until| until <= now)
    }
}

/// The kept leases of one coordinator, per identity.
pub(super) struct Pool<L> {
    parked: Mutex<HashMap<KeyBase, Shelf<L>>>,
    /// Set when the coordinator shuts down: from then on nothing is kept or handed on (a
    /// lease kept after the flush would be reused past shutdown, or its release sent after
    /// the backend closed).
    closed: AtomicBool,
    /// Per identity, the highest fencing token a body read here (see [`Pool::highest_read`]).
    reads: Mutex<HashMap<KeyBase, Arc<AtomicU64>>>,
}

impl<L> Default for Pool<L> {
    fn default() -> Self {
        Pool {
            parked: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            reads: Mutex::new(HashMap::new()),
        }
    }
}

impl<L: Send + 'static> Pool<L> {
    /// The pool of `coordinator`'s kept leases of type `L`.
    pub(super) fn of(coordinator: &Coordinator) -> Arc<Self> {
        coordinator.kept_forgetting::<Self>()
    }

    /// Where the bodies of `key` note the highest fencing token they read. Every lease of the
    /// identity holds it, so it is forgotten only once none is left: a lease granted after
    /// that has a token above any read before.
    pub(super) fn highest_read(&self, key: &KeyBase) -> Arc<AtomicU64> {
        Arc::clone(lock(&self.reads).entry(key.clone()).or_default())
    }

    /// A kept lease of `key` that `usable` accepts, taken out of the pool. Those it rejects
    /// are dropped (released), and so are those whose time ran out.
    pub(super) fn take(&self, key: &KeyBase, usable: impl Fn(&L) -> bool) -> Option<L> {
        let now = Instant::now();
        let mut dropped = Vec::new();
        let found = {
            let mut parked = lock(&self.parked);
            if self.closed.load(Ordering::Acquire) {
                return None;
            }
            let shelf = parked.get_mut(key)?;
            let mut found = None;
            // The most recently kept first: it has the longest trust ahead.
            while let Some(kept) = shelf.leases.pop() {
                if kept.until > now && usable(&kept.lease) {
                    found = Some(kept.lease);
                    break;
                }
                dropped.push(kept.lease);
            }
            if shelf.idle(now) {
                parked.remove(key);
            }
            found
        };
        // Released outside the lock: a release queues a command.
        drop(dropped);
        found
    }

    /// Notes that a call of `key` was refused a lease here: this process's kept leases of it
    /// go back and none is kept for [`CONTENDED`]. Whether to tell the other processes (see
    /// [`refused_elsewhere`](Self::refused_elsewhere)): not when they were told less than half
    /// of [`CONTENDED`] ago, so that a run of refusals costs the fleet a message per 50 ms at
    /// most and every process still keeps nothing from the first to the last. When they are
    /// to be told, the mark that keeps the next refusals quiet, for [`untold`](Self::untold)
    /// should the message not go out.
    pub(super) fn refused_here(&self, key: &KeyBase) -> Option<Instant> {
        let now = Instant::now();
        let told = {
            let mut parked = lock(&self.parked);
            let shelf = parked.entry(key.clone()).or_default();
            let tell = shelf.told.is_none_or(|until| until <= now + CONTENDED / 2);
            // Marked before the message is out, so the refusals of a burst, all answered
            // before it, stay quiet behind it.
            tell.then(|| {
                let told = now + CONTENDED;
                shelf.told = Some(told);
                told
            })
        };
        self.contend(key, now);
        told
    }

    /// Notes that the message `told` marked ([`refused_here`](Self::refused_here)) did not go
    /// out: the fleet was not told, so the next refusal here tells it rather than staying quiet
    /// for half of [`CONTENDED`]. A refusal heard since counts as told still.
    pub(super) fn untold(&self, key: &KeyBase, told: Instant) {
        let mut parked = lock(&self.parked);
        if let Some(shelf) = parked.get_mut(key)
            && shelf.told == Some(told)
        {
            shelf.told = None;
        }
    }

    /// Notes that a refusal of `key` was announced: this process's kept leases of it go back
    /// at once, and none is kept for [`CONTENDED`]. The fleet was told just now, so a refusal
    /// here within half of [`CONTENDED`] tells nobody: about one message per identity per
    /// half of it fleet-wide, however many processes are refused.
    pub(super) fn refused_elsewhere(&self, key: &KeyBase) {
        let now = Instant::now();
        {
            let mut parked = lock(&self.parked);
            let shelf = parked.entry(key.clone()).or_default();
            let until = now + CONTENDED;
            shelf.told = Some(shelf.told.map_or(until, |was| was.max(until)));
        }
        self.contend(key, now);
    }

    /// Returns the kept leases of `key` and keeps none until [`CONTENDED`] after `now`.
    fn contend(&self, key: &KeyBase, now: Instant) {
        let returned = {
            let mut parked = lock(&self.parked);
            let shelf = parked.entry(key.clone()).or_default();
            let until = now + CONTENDED;
            shelf.contended = Some(shelf.contended.map_or(until, |was| was.max(until)));
            std::mem::take(&mut shelf.leases)
        };
        // Released outside the lock: a release queues a command.
        drop(returned);
    }

    /// Keeps `lease` of `key` for up to `keep`, after which a timer on `coordinator`'s
    /// background work releases it unless a caller took it; once closed, releases it at once.
    pub(super) fn park(
        self: &Arc<Self>,
        coordinator: &Coordinator,
        key: &KeyBase,
        lease: L,
        keep: Duration,
    ) {
        let until = Instant::now() + keep;
        {
            let mut parked = lock(&self.parked);
            // Checked under the lock `drain` and `contend` take: a lease is either returned by
            // them or never parked.
            let shelf = parked.entry(key.clone()).or_default();
            let contended = shelf.contended.is_some_and(|until| until > Instant::now());
            if contended || self.closed.load(Ordering::Acquire) {
                if shelf.idle(Instant::now()) {
                    parked.remove(key);
                }
                drop(parked);
                drop(lease);
                return;
            }
            shelf.leases.push(Parked { lease, until });
        }
        let pool = Arc::downgrade(self);
        let key = key.clone();
        coordinator.in_background(async move {
            timer::sleep_until(until).await;
            if let Some(pool) = pool.upgrade() {
                pool.expire(&key, Instant::now());
            }
        });
    }

    /// Drops (releases) the leases of `key` whose time ran out by `now`.
    fn expire(&self, key: &KeyBase, now: Instant) {
        let expired: Vec<L> = {
            let mut parked = lock(&self.parked);
            let Some(shelf) = parked.get_mut(key) else {
                return;
            };
            let (out, kept): (Vec<_>, Vec<_>) =
                shelf.leases.drain(..).partition(|p| p.until <= now);
            shelf.leases = kept;
            if shelf.idle(now) {
                parked.remove(key);
            }
            out.into_iter().map(|parked| parked.lease).collect()
        };
        drop(expired);
    }

    /// Drops (releases) every kept lease, and keeps none from then on.
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let all: Vec<_> = lock(&self.parked).drain().collect();
        drop(all);
    }
}

impl<L: Send + 'static> ForgetsIdle for Pool<L> {
    /// A lease waits at most `keep`; its own timer returns it, so an idle sweep has only what a
    /// stopped runtime's timer left behind to return.
    fn forget_idle(&self) {
        let now = Instant::now();
        lock(&self.reads).retain(|_, highest| Arc::strong_count(highest) > 1);
        let keys: Vec<KeyBase> = lock(&self.parked).keys().cloned().collect();
        for key in keys {
            self.expire(&key, now);
        }
    }

    fn flush_now(&self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of refusals here tells the fleet once per half of [`CONTENDED`]: each message
    /// keeps the other processes from keeping for a whole [`CONTENDED`], so none keeps a lease
    /// between the first refusal and the last.
    #[tokio::test(start_paused = true)]
    async fn refusals_here_are_told_at_most_once_per_half_of_contended() {
        let pool = Pool::<()>::default();
        let key = KeyBase::namespace("unit-keep-told");
        assert!(pool.refused_here(&key).is_some(), "the first is told");
        tokio::time::sleep(CONTENDED / 2 - Duration::from_millis(1)).await;
        assert!(
            pool.refused_here(&key).is_none(),
            "the fleet heard one just now"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(
            pool.refused_here(&key).is_some(),
            "half of CONTENDED after the last told"
        );
    }

    /// A refusal heard from the fleet counts as told: a process refused right after stays
    /// quiet for half of [`CONTENDED`], so the fleet as a whole sends about one message per
    /// identity per half of it, not one per refused process.
    #[tokio::test(start_paused = true)]
    async fn a_refusal_heard_from_the_fleet_counts_as_told() {
        let pool = Pool::<()>::default();
        let key = KeyBase::namespace("unit-keep-heard");
        pool.refused_elsewhere(&key);
        assert!(
            pool.refused_here(&key).is_none(),
            "the fleet heard one just now"
        );
        tokio::time::sleep(CONTENDED / 2).await;
        assert!(
            pool.refused_here(&key).is_some(),
            "half of CONTENDED after the heard one"
        );
    }

    /// A refusal whose message did not go out (Redis down, the link broken) told nobody: the
    /// next refusal tells the fleet, however soon, instead of staying quiet for half of
    /// [`CONTENDED`] behind a message nobody heard.
    #[tokio::test(start_paused = true)]
    async fn a_refusal_whose_message_did_not_go_out_leaves_the_next_to_tell() {
        let pool = Pool::<()>::default();
        let key = KeyBase::namespace("unit-keep-unsent");
        let told = pool.refused_here(&key).expect("the first is told");
        pool.untold(&key, told);
        assert!(
            pool.refused_here(&key).is_some(),
            "the fleet heard nothing yet"
        );
    }

    /// A refusal heard from the fleet while this process's message failed still counts as
    /// told: the fleet heard of a refusal, so this process stays quiet.
    #[tokio::test(start_paused = true)]
    async fn a_refusal_heard_while_a_message_failed_still_counts_as_told() {
        let pool = Pool::<()>::default();
        let key = KeyBase::namespace("unit-keep-unsent-heard");
        let told = pool.refused_here(&key).expect("the first is told");
        tokio::time::sleep(Duration::from_millis(1)).await;
        pool.refused_elsewhere(&key);
        pool.untold(&key, told);
        assert!(
            pool.refused_here(&key).is_none(),
            "the fleet heard one just now"
        );
    }
}
