//! Prefetch (`prefetch = k`): a call that asks the coordinator takes up to `k` emissions in that
//! one script call ([`decide`](super::kernel::decide)), and the process hands the ones beyond its
//! own to its next callers of the identity without a round trip.
//!
//! The rules that keep the admissions those of a GCRA:
//! - every emission taken is admitted by the script, at its time, exactly as an arrival then
//!   would be, and only while the burst allows (never one early by the server's clock);
//! - emission `j` is handed out only until its slot starts (the TAT before it), measured on this
//!   process's clock from when the take was *sent*: the script ran after that, so a hand-out is
//!   never later, on the server's clock, than the slot's start (past it, a caller elsewhere may
//!   already have been admitted on the emissions after it, and a late one would be one more
//!   than the window allows);
//! - each emission is taken out of the pool, under its lock, by one caller: never handed out
//!   twice; of those still due, the one whose slot starts soonest goes first, so fewer expire;
//! - when one expires unused while later ones remain and none of the identity's was handed out
//!   (nor a take of it sent) for [`IDLE_INTERVALS`] intervals (the callers here stopped, or come
//!   far slower than the rate),
//!   the rest go back by a compare-and-set ([`give_back`](super::kernel::give_back)): only while
//!   nobody took an emission since, else they expire unused. A caller only somewhat slower than
//!   the rate skips an emission now and then; giving the rest back then would cost it a round
//!   trip for each.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::events;
use super::kernel::Taken;
use super::kernel::give_back::{GiveBack, Unused};
use crate::coordinator::{Coordinator, ForgetsIdle, WeakCoordinator, timer};
use crate::identity::{Identity, KeyBase};
use crate::sync::lock;

/// How many intervals without a hand-out make a take's rest worth a give-back.
const IDLE_INTERVALS: u32 = 2;

/// The emissions one take left this process, not yet handed out.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// The settings it was taken under: a hand-out under others would mix two schedules.
    interval: u64,
    burst: u32,
    /// When the take was sent: the emissions' deadlines count from here.
    sent: Instant,
    taken: Taken,
    /// The next emission to hand out (1 is the first beyond the caller's own).
    next: u32,
}

impl Held {
    /// Until when emission `j` may be handed out: when its slot starts.
    fn deadline(&self, j: u32) -> Instant {
        let later = u64::from(self.taken.extra + 1 - j).saturating_mul(self.interval);
        self.sent + Duration::from_nanos(self.taken.ahead.saturating_sub(later))
    }

    /// Emissions not handed out yet.
    fn left(&self) -> u32 {
        self.taken.extra + 1 - self.next
    }

    /// Passes over the emissions expired at `now` (counted in `expired`); whether one is left.
    fn skip_expired(&mut self, now: Instant, expired: &mut u32) -> bool {
        while self.left() > 0 && self.deadline(self.next) < now {
            self.next += 1;
            *expired += 1;
        }
        self.left() > 0
    }
}

/// The takes one identity has in the pool.
struct Takes {
    /// The identity, to name it in events.
    identity: Identity,
    /// When one of its emissions was last handed out here, since it last had none held: a take
    /// never picked (another's were due sooner) is not idle while its callers are served.
    handed_out: Option<Instant>,
    takes: Vec<Held>,
}

/// The emissions one coordinator's process holds, per identity.
#[derive(Default)]
pub(super) struct Pool {
    held: Mutex<HashMap<KeyBase, Takes>>,
    /// Set when the coordinator shuts down: nothing is held or handed out from then on.
    closed: AtomicBool,
}

impl Pool {
    /// The pool of `coordinator`'s process.
    pub(super) fn of(coordinator: &Coordinator) -> Arc<Self> {
        coordinator.kept_forgetting::<Self>()
    }

    /// Takes an emission of `identity` taken under `interval` and `burst` out of the pool, if
    /// one is still due: whether one was.
    pub(super) fn hand_out(&self, identity: &Identity, interval: u64, burst: u32) -> bool {
        let now = Instant::now();
        let mut expired = 0;
        let found = {
            let mut held = lock(&self.held);
            if self.closed.load(Ordering::Acquire) {
                return false;
            }
            let Some(Takes {
                handed_out, takes, ..
            }) = held.get_mut(&identity.key)
            else {
                return false;
            };
            takes.retain_mut(|take| {
                if (take.interval, take.burst) != (interval, burst) {
                    // Taken under settings since changed: they expire unused.
                    expired += take.left();
                    return false;
                }
                take.skip_expired(now, &mut expired)
            });
            // The soonest due first: it is the first to expire, and the takes were pushed in
            // the order their replies came, not their slots'.
            let found = takes
                .iter_mut()
                .min_by_key(|take| take.deadline(take.next))
                .map(|take| take.next += 1)
                .is_some();
            if found {
                *handed_out = Some(now);
            }
            takes.retain(|take| take.left() > 0);
            if takes.is_empty() {
                held.remove(&identity.key);
            }
            found
        };
        if expired > 0 {
            events::prefetch_expired(&identity.at(), expired);
        }
        if found {
            events::prefetch_used(&identity.at());
        }
        found
    }

    /// Holds what `taken` took beyond its caller's own, sent at `sent` under `interval` and
    /// `burst`; a timer on `coordinator`'s background work gives them back when one expires
    /// unused.
    pub(super) fn hold(
        self: &Arc<Self>,
        coordinator: &Coordinator,
        identity: &Identity,
        (interval, burst): (u64, u32),
        sent: Instant,
        taken: Taken,
    ) {
        let take = Held {
            interval,
            burst,
            sent,
            taken,
            next: 1,
        };
        {
            let mut held = lock(&self.held);
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            let Takes { takes, .. } = held.entry(identity.key.clone()).or_insert_with(|| Takes {
                identity: identity.clone(),
                handed_out: None,
                takes: Vec::new(),
            });
            takes.push(take);
        }
        events::prefetched(&identity.at(), taken.extra);
        let (pool, weak) = (Arc::downgrade(self), WeakCoordinator::of(coordinator));
        let identity = identity.clone();
        coordinator.in_background(async move {
            let next = || pool.upgrade()?.next_deadline(&identity.key, taken.tat);
            while let Some(deadline) = next() {
                // Due until its deadline inclusive: expired past it, at the timer's next tick.
                timer::sleep_until(deadline + Duration::from_nanos(1)).await;
                let expiry = pool
                    .upgrade()
                    .and_then(|pool| pool.expired(&identity.key, taken.tat, Instant::now()));
                match (expiry, weak.live()) {
                    (None, _) => {}
                    (Some(Expiry::Idle(unused)), Some(coordinator)) => {
                        return give_back(&coordinator, &identity, unused).await;
                    }
                    (Some(Expiry::Idle(unused)), None) => {
                        return events::prefetch_expired(&identity.at(), unused.count);
                    }
                    (Some(Expiry::Skipped), _) => events::prefetch_expired(&identity.at(), 1),
                }
            }
        });
    }

    /// The deadline of the next emission of the take that left `tat`, while it is held.
    fn next_deadline(&self, key: &KeyBase, tat: u64) -> Option<Instant> {
        let held = lock(&self.held);
        let take = held
            .get(key)?
            .takes
            .iter()
            .find(|take| take.taken.tat == tat)?;
        Some(take.deadline(take.next))
    }

    /// Whether the next emission of the take that left `tat` expired unused by `now`, and
    /// what follows: the take leaves the pool with the rest to give back when later ones are
    /// left and, for [`IDLE_INTERVALS`] intervals, none of the identity's was handed out nor
    /// this take sent; else that one is skipped.
    fn expired(&self, key: &KeyBase, tat: u64, now: Instant) -> Option<Expiry> {
        let mut held = lock(&self.held);
        let Takes {
            handed_out, takes, ..
        } = held.get_mut(key)?;
        let at = takes.iter().position(|take| take.taken.tat == tat)?;
        let take = &mut takes[at];
        if take.deadline(take.next) >= now {
            return None;
        }
        let quiet = Duration::from_nanos(take.interval) * IDLE_INTERVALS;
        let last = handed_out.map_or(take.sent, |at| at.max(take.sent));
        let expiry = if take.left() > 1 && now.duration_since(last) > quiet {
            let unused = Unused {
                interval: take.interval,
                count: take.left(),
                tat,
            };
            take.next = take.taken.extra + 1;
            Expiry::Idle(unused)
        } else {
            take.next += 1;
            Expiry::Skipped
        };
        takes.retain(|take| take.left() > 0);
        if takes.is_empty() {
            held.remove(key);
        }
        Some(expiry)
    }
}

impl Pool {
    /// Keeps the takes `keep` says to (adding to `expired` what it passes over), and counts
    /// what it passed over as expired, per identity.
    fn expire(&self, mut keep: impl FnMut(&mut Held, &mut u32) -> bool) {
        let mut gone = Vec::new();
        {
            let mut held = lock(&self.held);
            for Takes {
                identity, takes, ..
            } in held.values_mut()
            {
                let mut expired = 0;
                takes.retain_mut(|take| keep(take, &mut expired));
                if expired > 0 {
                    gone.push((identity.clone(), expired));
                }
            }
            held.retain(|_, Takes { takes, .. }| !takes.is_empty());
        }
        for (identity, expired) in gone {
            events::prefetch_expired(&identity.at(), expired);
        }
    }
}

/// What became of a take's next emission at its deadline.
enum Expiry {
    /// It expired unused, and so may the rest: they are to go back.
    Idle(Unused),
    /// It expired unused; the next may yet be handed out.
    Skipped,
}

/// Gives `unused` back; whatever the answer, they are out of the pool (expired, if the TAT
/// moved).
async fn give_back(coordinator: &Coordinator, identity: &Identity, unused: Unused) {
    let returned = coordinator.run::<GiveBack>(identity, unused).await;
    let at = identity.at();
    match returned {
        Ok(true) => events::prefetch_returned(&at, unused.count),
        // Nobody else can tell: what did not go back expires.
        Ok(false) | Err(_) => events::prefetch_expired(&at, unused.count),
    }
}

impl ForgetsIdle for Pool {
    /// A take's emissions all expire within `burst − 1` intervals; what a stopped runtime's timer left
    /// behind goes here.
    fn forget_idle(&self) {
        let now = Instant::now();
        self.expire(|take, expired| take.skip_expired(now, expired));
    }

    /// Shutting down: what is held expires unused (a give-back would be sent after the flush).
    fn flush_now(&self) {
        self.closed.store(true, Ordering::Release);
        self.expire(|take, expired| {
            *expired += take.left();
            false
        });
    }
}
