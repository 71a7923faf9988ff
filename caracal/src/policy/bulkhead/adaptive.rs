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
//! first call, not from `initial`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::kernel::adaptive::{Adapt, Bounds, Learnt, Observed, Report};
use crate::Error;
use crate::coordinator::{Coordinator, WeakCoordinator};
use crate::events;
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
}

#[derive(Debug, Default)]
struct Known {
    /// Observed and not yet sent.
    observed: Observed,
    /// The bounds of the calls that observed (the latest site's: sites of one identity agree
    /// but under drift).
    bounds: Option<Bounds>,
    learnt: Option<(Learnt, Instant)>,
    /// The last limit an event announced.
    announced: Option<u32>,
    /// Whether the background reporter runs.
    reporting: bool,
}

impl View {
    fn new(identity: Identity) -> Self {
        View {
            identity,
            known: Mutex::default(),
            asking: tokio::sync::Mutex::new(()),
        }
    }

    /// The limit in force for a call under `bounds`: the one learnt, if fresh; else the
    /// answer to a report sent now.
    pub(crate) async fn limit(
        self: &Arc<Self>,
        coordinator: &Coordinator,
        bounds: Bounds,
    ) -> Result<Learnt, Error> {
        if let Some(learnt) = self.fresh(bounds) {
            return Ok(learnt);
        }
        let _asking = self.asking.lock().await;
        if let Some(learnt) = self.fresh(bounds) {
            return Ok(learnt);
        }
        self.report(coordinator, bounds).await
    }

    fn fresh(&self, bounds: Bounds) -> Option<Learnt> {
        let mut known = lock(&self.known);
        known.bounds = Some(bounds);
        match known.learnt {
            Some((learnt, at)) if at.elapsed() < FRESH_FOR => Some(Learnt {
                limit: learnt.limit.clamp(bounds.min, bounds.max),
                ..learnt
            }),
            _ => None,
        }
    }

    /// Notes what one call showed (`record` adds it), and keeps the reporter running.
    pub(crate) fn observe(
        self: &Arc<Self>,
        coordinator: &Coordinator,
        record: impl FnOnce(&mut Observed),
    ) {
        let start = {
            let mut known = lock(&self.known);
            record(&mut known.observed);
            !std::mem::replace(&mut known.reporting, true)
        };
        if start {
            // Not the coordinator's tracked background work: a shutdown's flush would wait
            // for a loop that runs while calls are made.
            tokio::spawn(Arc::clone(self).reporting(WeakCoordinator::of(coordinator)));
        }
    }

    /// Sends what was observed every [`REPORT_EVERY`], until nothing was for a while or the
    /// coordinator is gone.
    async fn reporting(self: Arc<Self>, coordinator: WeakCoordinator) {
        let mut empty = 0;
        loop {
            tokio::time::sleep(REPORT_EVERY).await;
            let live = coordinator.live();
            let bounds = {
                let mut known = lock(&self.known);
                let quiet = known.observed.is_empty();
                empty = if quiet { empty + 1 } else { 0 };
                // Stopped under the lock, so an observation made after the check starts
                // another reporter.
                if live.is_none() || (quiet && empty >= IDLE_ROUNDS) {
                    known.reporting = false;
                    return;
                }
                known.bounds.filter(|_| !quiet)
            };
            if let (Some(coordinator), Some(bounds)) = (live, bounds) {
                // A failed report drops what it carried, as a lost one would: the limit is an
                // estimate, and a report sent twice would count twice.
                let _ = self.report(&coordinator, bounds).await;
            }
        }
    }

    /// Sends what was observed and learns the answer.
    async fn report(&self, coordinator: &Coordinator, bounds: Bounds) -> Result<Learnt, Error> {
        let report = Report {
            observed: std::mem::take(&mut lock(&self.known).observed),
            bounds,
            window_ms: UPDATE_EVERY_MS,
        };
        let learnt = coordinator.run::<Adapt>(&self.identity, report).await?;
        let announce = {
            let mut known = lock(&self.known);
            known.learnt = Some((learnt, Instant::now()));
            // The first limit learnt is where this process starts, not a change.
            let was = *known.announced.get_or_insert(learnt.limit);
            let changed = learnt.limit.abs_diff(was) * 10 > was;
            changed
                .then(|| known.announced.replace(learnt.limit))
                .flatten()
        };
        if let Some(from) = announce {
            events::bulkhead_limit_changed(&self.identity.at(), from, &learnt);
        }
        Ok(learnt)
    }
}
