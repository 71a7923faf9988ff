//! Kept leases (`keep = "5ms"`): the leases whose bodies finished, held by this process for a
//! short time so that the next call of the identity here starts without a round trip.
//!
//! A kept lease stays a member of the identity's lease set, so the fleet counts it like a
//! running body's: the pool only decides which of this process's callers holds it next, one at
//! a time (a lease is taken out under the lock before a body runs on it). Whether a lease is
//! still good to hand on (trusted long enough, the same server incarnation) is the holder's
//! rule, passed in as `usable`; what this module adds is the bound: a lease waits at most
//! `keep`, after which its timer takes it out and drops it, which releases it.

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

/// The kept leases of one coordinator, per identity.
pub(super) struct Pool<L> {
    parked: Mutex<HashMap<KeyBase, Vec<Parked<L>>>>,
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
            let leases = parked.get_mut(key)?;
            let mut found = None;
            // The most recently kept first: it has the longest trust ahead.
            while let Some(kept) = leases.pop() {
                if kept.until > now && usable(&kept.lease) {
                    found = Some(kept.lease);
                    break;
                }
                dropped.push(kept.lease);
            }
            if leases.is_empty() {
                parked.remove(key);
            }
            found
        };
        // Released outside the lock: a release queues a command.
        drop(dropped);
        found
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
            // Checked under the lock `drain` takes after closing: a lease is either drained or
            // never parked.
            if self.closed.load(Ordering::Acquire) {
                drop(parked);
                drop(lease);
                return;
            }
            parked
                .entry(key.clone())
                .or_default()
                .push(Parked { lease, until });
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
            let Some(leases) = parked.get_mut(key) else {
                return;
            };
            let (out, kept): (Vec<_>, Vec<_>) = leases.drain(..).partition(|p| p.until <= now);
            *leases = kept;
            if leases.is_empty() {
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
