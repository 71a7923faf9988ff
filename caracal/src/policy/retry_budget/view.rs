//! What this process knows of each fleet-wide window of deposits and withdrawals, so that
//! neither costs an awaited round trip.
//!
//! A view holds the fleet's totals as the coordinator last answered them, and this process's
//! own counts since: those sent and not yet answered, and those not yet sent. A withdrawal is
//! decided from their sum at once. Counts go out in the background, at most one batch per
//! identity in flight, [`REFRESH`] after the first count a batch holds; each answer is the
//! fleet's new totals. (A batch is never sent sooner for holding many counts: that made a busy
//! process send one per round trip, which cost its calls more than the rest of the budget, and
//! the staleness the kind bounds is one of time, which the timer bounds alone.) What a view cannot see is what the
//! other processes counted since its last answer: that is the staleness the module docs of the
//! kind bound.
//!
//! **Outages.** A batch that fails keeps its retries: they go out again with the next batch, so
//! the fleet's window learns them when the link returns (counted twice if the failed batch was
//! applied after all, which only tightens the budget). Its first attempts are dropped: counted
//! twice they would loosen it, and a link that applies every batch but answers none in time
//! would count them again at every batch. While its batches fail, or the fleet's totals it
//! learnt are a window old, a process decides on its **local share**: its own counts over the
//! window (the same kernel on its own clock) against `percent`% of its own first attempts plus
//! its [`Share`] of the floor, its part of the fleet's first attempts as last learnt. The local
//! shares of the fleet add up to the budget: an outage never grants the floor again per batch
//! (the view forgot its own counts as each batch failed, and the fleet made ~4× its budget),
//! nor stops the retries until the link returns. And a view never counts fewer than this
//! process's own counts in the window, so a server that lost its data grants nothing new.
//!
//! Every call deposits and few withdraw, so a deposit takes no lock: it adds to an atomic
//! count, which a batch takes whole. The count and the flag saying a send is due are
//! sequentially consistent: whoever clears the flag reads the count after, and a deposit
//! reads the flag after counting, so no count is left without a send coming.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::kernel::{Allowance, Record, Share, Slide, Totals, Window, allows, allows_locally};
use crate::coordinator::{Coordinator, FORGET_IDLE_AFTER, ForgetsIdle, timer};
use crate::error::Error;
use crate::identity::{Identity, KeyBase};
use crate::kernel::{Kernel, Now, Seen};
use crate::metrics;
use crate::sync::lock;

/// How long counts wait to be sent together.
pub(crate) const REFRESH: Duration = Duration::from_millis(100);

/// A coordinator's views, one per identity.
#[derive(Debug, Default)]
pub(crate) struct Views(Mutex<HashMap<KeyBase, Arc<View>>>);

impl Views {
    /// `identity`'s view in `coordinator`, made on first use.
    pub(crate) fn of(coordinator: &Coordinator, identity: &Identity) -> Arc<View> {
        let views = coordinator.kept_forgetting::<Views>();
        let mut views = lock(&views.0);
        let view = views
            .entry(identity.key.clone())
            .or_insert_with(|| Arc::new(View::new(identity.clone())));
        Arc::clone(view)
    }
}

impl ForgetsIdle for Views {
    /// Forgets the views of idle identities: held by nothing but the map (no call, no timer,
    /// no batch in flight), with nothing left to send, and that learnt nothing for
    /// [`FORGET_IDLE_AFTER`] nor the budget's window (so no count of its own window is lost).
    fn forget_idle(&self) {
        let mut views = lock(&self.0);
        let now = Instant::now();
        views.retain(|_, view| Arc::strong_count(view) > 1 || !view.idle(now));
        crate::sync::shrink(&mut views);
    }
}

/// What this process knows of one identity's window.
#[derive(Debug)]
pub(crate) struct View {
    identity: Identity,
    /// First attempts counted and not yet sent.
    deposits: AtomicU64,
    /// Whether a send is due: its timer runs, or a batch is in flight and sends on its answer.
    due: AtomicBool,
    /// The window the identity's values last said, which batches are counted in.
    window_ms: AtomicU64,
    /// The zero of the clock the own window is counted on.
    born: Instant,
    known: Mutex<Known>,
}

#[derive(Debug)]
struct Known {
    /// The fleet's totals as last answered, and when.
    learnt: Totals,
    learnt_at: Option<Instant>,
    /// This process's part of the fleet's first attempts when it last learnt them.
    share: Share,
    /// Sent, not yet answered.
    in_flight: Option<Totals>,
    /// Retries counted and not yet sent.
    withdrawals: u64,
    /// Retries of failed batches, to be sent again (counted in `own` already).
    carried: u64,
    /// This process's counts as batches took them, over the window, on its own clock.
    own: Window,
    /// Whether the last batch failed: decisions are then made from a view not refreshed.
    failing: bool,
    /// Whether the timer fired while a batch was in flight: the batch's answer then clears
    /// `due` and starts the timer again.
    waiting: bool,
}

/// A withdrawal's decision: whether it was made, what the view said and what that allowed, and
/// whether the view was refreshed by its last batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decided {
    pub(crate) allowed: bool,
    pub(crate) seen: Totals,
    pub(crate) allowance: u64,
    pub(crate) stale: bool,
}

/// A batch's answer, handed to whoever reports failures.
pub(crate) type OnFailure = fn(&Identity, &Error);

impl View {
    fn idle(&self, now: Instant) -> bool {
        let window = Duration::from_millis(self.window_ms.load(Ordering::Relaxed));
        let known = lock(&self.known);
        let last = known.learnt_at.unwrap_or(self.born);
        self.deposits.load(Ordering::Relaxed) == 0
            && !self.due.load(Ordering::Relaxed)
            && known.in_flight.is_none()
            && known.withdrawals == 0
            && known.carried == 0
            && now.duration_since(last) >= FORGET_IDLE_AFTER.max(window)
    }

    fn new(identity: Identity) -> Self {
        View {
            identity,
            deposits: AtomicU64::new(0),
            due: AtomicBool::new(false),
            window_ms: AtomicU64::new(0),
            born: Instant::now(),
            known: Mutex::new(Known {
                learnt: Totals::default(),
                learnt_at: None,
                share: Share::WHOLE,
                in_flight: None,
                withdrawals: 0,
                carried: 0,
                own: Window::default(),
                failing: false,
                waiting: false,
            }),
        }
    }

    /// Steps the own window at `now`, adding `counts`: its totals after.
    fn own(&self, known: &mut Known, now: Instant, counts: Totals) -> Totals {
        let ms = u64::try_from(now.duration_since(self.born).as_millis()).unwrap_or(u64::MAX);
        let now = Now {
            ms,
            ns: 0,
            order: 0,
        };
        let record = Record::new(counts, self.window_ms.load(Ordering::Relaxed));
        Slide::step(&mut known.own, &record, now, &mut Seen::default())
    }

    pub(crate) fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The window later batches are counted in.
    pub(crate) fn set_window(&self, window: Duration) {
        let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
        self.window_ms.store(window_ms, Ordering::Relaxed);
    }

    /// Counts one first attempt, and sends what is due.
    pub(crate) fn deposit(self: &Arc<Self>, coordinator: &Coordinator, on_failure: OnFailure) {
        self.deposits.fetch_add(1, Ordering::SeqCst);
        self.schedule(coordinator, on_failure);
    }

    /// Counts one retry if `allowance` allows it over the view's totals at `window`.
    pub(crate) fn withdraw(
        self: &Arc<Self>,
        coordinator: &Coordinator,
        window: Duration,
        allowance: &Allowance,
        on_failure: OnFailure,
    ) -> Decided {
        let decided = {
            let mut known = lock(&self.known);
            let now = Instant::now();
            let unsent = Totals {
                deposits: self.deposits.load(Ordering::SeqCst),
                withdrawals: known.withdrawals,
            };
            let own = self.own(&mut known, now, Totals::default()).plus(unsent);
            let (allowed, seen, allowance) = if known.on_local_share(now, window) {
                let allowed = allows_locally(own, known.share, allowance);
                (allowed, own, allowance.local(own.deposits, known.share))
            } else {
                let seen = known.totals(now, window).plus(Totals {
                    deposits: unsent.deposits,
                    withdrawals: 0,
                });
                let seen = seen.at_least(own);
                (allows(seen, allowance), seen, allowance.of(seen.deposits))
            };
            known.withdrawals += u64::from(allowed);
            Decided {
                allowed,
                seen,
                allowance,
                stale: known.failing,
            }
        };
        if decided.allowed {
            self.schedule(coordinator, on_failure);
        }
        decided
    }

    fn unsent(&self, known: &Known) -> u64 {
        known.withdrawals + self.deposits.load(Ordering::SeqCst)
    }

    /// Starts the batch timer unless a send is due already. At most one timer is pending:
    /// `due` is cleared only by the timer when it fires, or by the answer of the batch it
    /// found in flight (see [`Known::waiting`]).
    fn schedule(self: &Arc<Self>, coordinator: &Coordinator, on_failure: OnFailure) {
        if self.due.load(Ordering::SeqCst) || self.due.swap(true, Ordering::SeqCst) {
            return;
        }
        let timer = Pending::new(self, Stage::Timer, on_failure);
        let later = coordinator.clone();
        coordinator.in_background(async move {
            timer::sleep_until(Instant::now() + REFRESH).await;
            if let Some(view) = timer.finish() {
                view.fire(&later, on_failure);
            }
        });
    }

    /// The timer fired: sends the unsent counts, or leaves them to the answer of the batch in
    /// flight.
    fn fire(self: &Arc<Self>, coordinator: &Coordinator, on_failure: OnFailure) {
        let counts = {
            let mut known = lock(&self.known);
            if known.in_flight.is_some() {
                // The send stays due: the batch's answer clears it and starts the timer again.
                known.waiting = true;
                return;
            }
            // Cleared before the counts are taken, so a count made in between either goes
            // out with them or starts the timer itself.
            self.due.store(false, Ordering::SeqCst);
            let fresh = Totals {
                deposits: self.deposits.swap(0, Ordering::SeqCst),
                withdrawals: std::mem::take(&mut known.withdrawals),
            };
            let own = self.own(&mut known, Instant::now(), fresh);
            // Carried retries that have left the window would have left the fleet's too.
            let carried = std::mem::take(&mut known.carried).min(own.withdrawals);
            let counts = fresh.plus(Totals {
                deposits: 0,
                withdrawals: carried,
            });
            if counts == Totals::default() {
                return;
            }
            known.in_flight = Some(counts);
            counts
        };
        self.send(coordinator, counts, on_failure);
    }

    /// Sends `counts` in the background; the answer refreshes the view.
    fn send(self: &Arc<Self>, coordinator: &Coordinator, counts: Totals, on_failure: OnFailure) {
        let window_ms = self.window_ms.load(Ordering::Relaxed);
        let batch = Pending::new(self, Stage::Batch, on_failure);
        let sender = coordinator.clone();
        coordinator.in_background(async move {
            let Some(view) = batch.view.as_ref() else {
                return;
            };
            let reply = sender
                .run::<Slide>(&view.identity, Record::new(counts, window_ms))
                .await;
            if let Err(error) = &reply {
                on_failure(&view.identity, error);
            }
            if let Some(view) = batch.finish() {
                view.answered(Some(&sender), reply.ok(), on_failure);
            }
        });
    }

    /// A batch's answer (`None`: it failed, or never came): refreshes the view, and if the
    /// timer found the batch in flight, starts it again for what gathered meanwhile.
    fn answered(
        self: &Arc<Self>,
        coordinator: Option<&Coordinator>,
        totals: Option<Totals>,
        on_failure: OnFailure,
    ) {
        let waiting = {
            let mut known = lock(&self.known);
            let sent = known.in_flight.take().unwrap_or_default();
            match totals {
                Some(totals) => {
                    let now = Instant::now();
                    let own = self.own(&mut known, now, Totals::default());
                    if let Some(share) = Share::of(own.deposits, totals.deposits) {
                        known.share = share;
                    }
                    known.learnt = totals;
                    known.learnt_at = Some(now);
                    known.failing = false;
                }
                // Whether the server counted them is unknown: the retries go out again (twice
                // counted, they only tighten the budget), the first attempts are dropped
                // (twice counted, they would loosen it).
                None => {
                    known.carried += sent.withdrawals;
                    known.failing = true;
                }
            }
            let at = self.identity.at();
            metrics::retry_budget_local_share(&at, known.failing);
            crate::tally::local_share(&at, known.failing);
            std::mem::take(&mut known.waiting)
        };
        if !waiting {
            return;
        }
        // Cleared before the unsent counts are read, so a count made in between either is
        // read here or starts the timer itself.
        self.due.store(false, Ordering::SeqCst);
        if let Some(coordinator) = coordinator
            && self.unsent(&lock(&self.known)) > 0
        {
            self.schedule(coordinator, on_failure);
        }
    }
}

/// What a view's background task is for.
#[derive(Debug, Clone, Copy)]
enum Stage {
    Timer,
    Batch,
}

/// A view's pending timer or batch. A task dropped unfinished (its runtime shut down) leaves
/// the view as if its timer had never started, or its batch were lost: never with a send due
/// that nothing will make, which would keep every later count unsent.
struct Pending {
    view: Option<Arc<View>>,
    stage: Stage,
    on_failure: OnFailure,
}

impl Pending {
    fn new(view: &Arc<View>, stage: Stage, on_failure: OnFailure) -> Self {
        Pending {
            view: Some(Arc::clone(view)),
            stage,
            on_failure,
        }
    }

    /// The task finished: the view, to carry on with.
    fn finish(mut self) -> Option<Arc<View>> {
        self.view.take()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(view) = self.view.take() else {
            return;
        };
        match self.stage {
            Stage::Timer => view.due.store(false, Ordering::SeqCst),
            Stage::Batch => view.answered(None, None, self.on_failure),
        }
    }
}

impl Known {
    /// Whether decisions are made on the local share: the last batch failed, or the fleet's
    /// totals learnt last (if ever) are a window old.
    fn on_local_share(&self, now: Instant, window: Duration) -> bool {
        self.failing
            || self
                .learnt_at
                .is_none_or(|at| now.duration_since(at) >= window)
    }

    /// What the view says the window holds at `now`, but for the unsent deposits: the fleet's
    /// last totals (none once they are a window old) and every own count since.
    fn totals(&self, now: Instant, window: Duration) -> Totals {
        let learnt = match self.learnt_at {
            Some(at) if now.duration_since(at) < window => self.learnt,
            _ => Totals::default(),
        };
        learnt
            .plus(self.in_flight.unwrap_or_default())
            .plus(Totals {
                deposits: 0,
                withdrawals: self.withdrawals + self.carried,
            })
    }
}
