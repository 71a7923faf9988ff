//! `limit = adaptive(min, initial, max)`: one limit per identity for the whole fleet, computed
//! by the coordinator from every process's observations (the [`Adapt`] kernel's module docs
//! give the algorithm) and applied by every process's admissions.
//!
//! A process keeps a view per identity: the limit as the coordinator last answered it, and
//! what its calls showed since (bodies' latencies, failures, the fleet occupancy lease replies
//! gave). Nothing of it is on a call's critical path but a lock held for an addition: the
//! observations go out every [`REPORT_EVERY`] in the background, while the identity has any,
//! and each answer is the limit in force. Only a call that finds no limit learnt in the last
//! [`FRESH_FOR`] (the process's first, or its first after a pause) waits for a report's
//! answer, so a process that joins a running fleet admits within the fleet's limit from its
//! first call, not from `initial`. An answer may also bound how many calls this process holds
//! ([`Share`]): past it a call is refused here, without a round trip.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::events;
use super::kernel::adaptive::share::Share;
use super::kernel::adaptive::vote::Sampling;
use super::kernel::adaptive::{Adapt, Bounds, Learnt, Report};
use crate::coordinator::{Coordinator, WeakCoordinator};
use crate::error::Error;
use crate::identity::{Identity, KeyBase};
use crate::sync::lock;

/// How often a process sends what its calls showed.
pub(crate) const REPORT_EVERY: Duration = Duration::from_millis(250);
/// The least time between two updates of an identity's limit, in milliseconds.
pub(crate) const UPDATE_EVERY_MS: u64 = 1_000;
/// How long a learnt limit is used without a newer answer.
pub(crate) const FRESH_FOR: Duration = Duration::from_secs(2);
/// How many empty rounds a reporter waits before it stops (it starts again with the next call).
const IDLE_ROUNDS: u32 = 40;

/// A coordinator's views, one per identity.
#[derive(Debug, Default)]
pub(crate) struct Views(Mutex<HashMap<KeyBase, Arc<View>>>);

impl Views {
    /// `identity`'s view in `coordinator`, made on first use.
    pub(crate) fn of(coordinator: &Coordinator, identity: &Identity) -> Arc<View> {
        let views = coordinator.kept::<Views>();
        let mut views = lock(&views.0);
        let view = views
            .entry(identity.key.clone())
            .or_insert_with(|| Arc::new(View::new(identity.clone())));
        Arc::clone(view)
    }
}

/// What this process knows of one identity's adaptive limit.
#[derive(Debug)]
pub(crate) struct View {
    identity: Identity,
    known: Mutex<Known>,
    /// Held by the call that waits for a report's answer, so that callers finding no fresh
    /// limit at once wait for one answer, not one each.
    asking: tokio::sync::Mutex<()>,
    /// This process's calls counted against its share ([`Held`]).
    held: AtomicU32,
    /// The most of them it may hold ([`Share`]; `u32::MAX`: no bound), as the last answer
    /// left it.
    share: AtomicU32,
}

#[derive(Debug, Default)]
struct Known {
    /// What its calls showed: since the last report, and its base.
    sampling: Sampling,
    /// The bounds of the calls that observed (the latest site's: sites of one identity agree
    /// but under drift).
    bounds: Option<Bounds>,
    learnt: Option<(Learnt, Instant)>,
    /// The last limit an event announced.
    announced: Option<u32>,
    /// The last report that failed, and when.
    failed: Option<(Error, Instant)>,
    /// Reports sent, and the latest whose answer was learnt: an answer that overtook an older
    /// one's is kept, the older dropped (the reporter and a first call may both be asking).
    sent: u64,
    answered: u64,
    /// Whether the background reporter runs.
    reporting: bool,
    /// The window its last report that asked for slots joined ([`Report::joined_ms`]).
    joined_ms: u64,
    /// How its calls compare with the fleet's.
    share: Share,
}

impl View {
    fn new(identity: Identity) -> Self {
        View {
            identity,
            known: Mutex::default(),
            asking: tokio::sync::Mutex::new(()),
            held: AtomicU32::new(0),
            share: AtomicU32::new(u32::MAX),
        }
    }

    /// Counts a call against this process's share, unless it holds its share of a saturated
    /// fleet already (`None`: the call is refused here, so that the slots it lets go go to the
    /// other processes' calls). Counted from before its acquire is sent, so that calls admitted
    /// together (a paused process's tasks resuming at once) cannot pass the share together.
    pub(crate) fn hold(&self) -> Option<Held<'_>> {
        let share = self.share.load(Ordering::Relaxed);
        self.held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                (held < share).then_some(held + 1)
            })
            .ok()?;
        Some(Held(self))
    }

    /// Bounds this process's bodies to `share`, as an answer would.
    #[cfg(test)]
    pub(crate) fn hold_to(&self, share: u32) {
        self.share.store(share, Ordering::Relaxed);
    }

    /// The calls counted against this process's share now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> u32 {
        self.held.load(Ordering::Relaxed)
    }

    /// The highest fleet occupancy this process noted since its last report.
    #[cfg(test)]
    pub(crate) fn peak(&self) -> u64 {
        lock(&self.known).sampling.peak()
    }

    /// The calls the fleet was full for that this process noted since its last report.
    #[cfg(test)]
    pub(crate) fn refused(&self) -> u64 {
        lock(&self.known).sampling.refused()
    }

    /// The limit in force for a call under `bounds`: the one learnt, if fresh; else the
    /// answer to a report sent now. Callers that queued behind a report that failed share its
    /// error rather than each waiting for one of their own (through an outage they would
    /// otherwise wait one command timeout each, in turn).
    pub(crate) async fn limit(
        self: &Arc<Self>,
        coordinator: &Coordinator,
        bounds: Bounds,
    ) -> Result<Learnt, Error> {
        if let Some(learnt) = self.fresh(bounds) {
            return Ok(learnt);
        }
        let arrived = Instant::now();
        let _asking = self.asking.lock().await;
        if let Some(learnt) = self.fresh(bounds) {
            return Ok(learnt);
        }
        if let Some((error, at)) = &lock(&self.known).failed
            && *at >= arrived
        {
            return Err(error.clone());
        }
        let answer = self.report(coordinator, bounds).await;
        if let Err(error) = &answer {
            lock(&self.known).failed = Some((error.clone(), Instant::now()));
        }
        answer
    }

    fn fresh(&self, bounds: Bounds) -> Option<Learnt> {
        let mut known = lock(&self.known);
        known.bounds = Some(bounds);
        match known.learnt {
            Some((learnt, at)) if at.elapsed() < FRESH_FOR => Some(Learnt {
                limit: learnt.limit.clamp(bounds.min, bounds.max),
                full: learnt.full.clamp(bounds.min, bounds.max),
                ..learnt
            }),
            _ => None,
        }
    }

    /// Notes what one call showed (`record` adds it), and keeps the reporter running.
    pub(crate) fn observe(
        self: &Arc<Self>,
        coordinator: &Coordinator,
        record: impl FnOnce(&mut Sampling),
    ) {
        // Without a runtime nothing could report: left for a call that has one.
        let runtime = tokio::runtime::Handle::try_current().ok();
        let start = {
            let mut known = lock(&self.known);
            record(&mut known.sampling);
            runtime.is_some() && !std::mem::replace(&mut known.reporting, true)
        };
        if let (true, Some(runtime)) = (start, runtime) {
            // Not the coordinator's tracked background work: a shutdown's flush would wait
            // for a loop that runs while calls are made.
            let reporter = Reporter(Arc::clone(self), Ended::Running);
            runtime.spawn(reporter.run(WeakCoordinator::of(coordinator)));
        }
    }

    /// Removes this view from `coordinator`'s once nothing but the map and `reporter` holds
    /// it: a process that meets many scopes keeps the views of those in use only.
    fn forget(self: &Arc<Self>, coordinator: &Coordinator) {
        let views = coordinator.kept::<Views>();
        let mut views = lock(&views.0);
        if let Some(kept) = views.get(&self.identity.key)
            && Arc::ptr_eq(kept, self)
            && Arc::strong_count(self) <= 2
        {
            views.remove(&self.identity.key);
        }
    }

    /// Sends what was observed and learns the answer.
    async fn report(&self, coordinator: &Coordinator, bounds: Bounds) -> Result<Learnt, Error> {
        let (report, number, mean_us) = {
            let mut known = lock(&self.known);
            known.sent += 1;
            let cut = known
                .learnt
                .is_some_and(|(learnt, _)| learnt.limit < learnt.full);
            let report = Report {
                observed: known.sampling.report(cut),
                bounds,
                window_ms: UPDATE_EVERY_MS,
                joined_ms: known.joined_ms,
            };
            (report, known.sent, known.sampling.last_mean_us())
        };
        let learnt = coordinator.run::<Adapt>(&self.identity, report).await?;
        let announce = {
            let mut known = lock(&self.known);
            // Even from an answer a newer one overtook: the window it joined counted this
            // process, and a later report must not count it again.
            if report.observed.asked() {
                known.joined_ms = known.joined_ms.max(learnt.joined_ms);
            }
            if number < known.answered {
                return Ok(learnt);
            }
            known.answered = number;
            known.learnt = Some((learnt, Instant::now()));
            known.sampling.fleet_base(learnt.base_us);
            let held = self.held.load(Ordering::Relaxed);
            let share = known
                .share
                .learn(mean_us, report.observed.peak, held, &learnt);
            self.share
                .store(share.unwrap_or(u32::MAX), Ordering::Relaxed);
            // The first limit learnt is where this process starts, not a change.
            // A cut window's limit is a measurement, not a change.
            let was = *known.announced.get_or_insert(learnt.full);
            let changed = learnt.full.abs_diff(was) * 10 > was;
            changed
                .then(|| known.announced.replace(learnt.full))
                .flatten()
        };
        if let Some(from) = announce {
            events::limit_changed(&self.identity.at(), from, &learnt);
        }
        Ok(learnt)
    }
}

/// One call counted against its process's share ([`View::hold`]), until dropped: when its
/// acquire is refused or fails, or when its body ends.
#[derive(Debug)]
pub(crate) struct Held<'a>(&'a View);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A view's background reporter. However it ends (idle, its coordinator gone, or dropped with
/// its runtime) the view is left with no reporter running, so the next observation starts one.
struct Reporter(Arc<View>, Ended);

/// Whether a reporter stopped itself (and so already said so under the view's lock).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ended {
    Running,
    Stopped,
}

impl Reporter {
    /// Sends what was observed every [`REPORT_EVERY`], and an empty report when the limit
    /// learnt would go stale before the next, until nothing was observed for a while or the
    /// coordinator is gone.
    async fn run(mut self, coordinator: WeakCoordinator) {
        let view = &self.0;
        let mut empty = 0;
        loop {
            tokio::time::sleep(REPORT_EVERY).await;
            let Some(live) = coordinator.live() else {
                return;
            };
            let bounds = {
                let known = lock(&view.known);
                let quiet = known.sampling.is_empty();
                empty = if quiet { empty + 1 } else { 0 };
                if quiet && empty >= IDLE_ROUNDS {
                    None
                } else {
                    let ageing = known
                        .learnt
                        .is_none_or(|(_, at)| at.elapsed() + REPORT_EVERY * 2 >= FRESH_FOR);
                    match known.bounds {
                        Some(bounds) if !quiet || ageing => Some(Some(bounds)),
                        _ => Some(None),
                    }
                }
            };
            match bounds {
                // A failed report drops what it carried, as a lost one would: the limit is an
                // estimate, and a report sent twice would count twice.
                Some(Some(bounds)) => drop(view.report(&live, bounds).await),
                Some(None) => {}
                None => {
                    // Stopped under the lock, so an observation made after the check starts
                    // another reporter; the view is forgotten once nothing else holds it.
                    let stopped = {
                        let mut known = lock(&view.known);
                        let stopped = known.sampling.is_empty();
                        if stopped {
                            known.reporting = false;
                        }
                        stopped
                    };
                    if stopped {
                        view.forget(&live);
                        self.1 = Ended::Stopped;
                        return;
                    }
                }
            }
        }
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        // One that stopped itself may have a successor running already.
        if self.1 == Ended::Running {
            lock(&self.0.known).reporting = false;
        }
    }
}
