//! The fleet's observed latency of an identity, for `#[hedge(delay = pNN)]`: learnt without a
//! round trip on the call, as an adaptive limit learns its latencies.
//!
//! Each process records its finished attempts in a log-scale histogram (176 buckets, each
//! 6.7 %–12.5 % wide: see [`buckets`](kernel::buckets)): one atomic add on the call path, no
//! lock, no await. In the background, at most one batch per identity in flight, [`REFRESH`]
//! after the first sample it holds, the process merges its samples into the fleet's histogram
//! (two rotating windows of [`WINDOW`], see [`kernel`]) and hears the merged one back: its
//! **view**. A quantile is read from the view plus the samples not yet answered, so a process
//! sees its own samples at once and the others' within [`REFRESH`] plus a round trip.
//!
//! **The rule for `delay = pNN`.** [`FleetLatency::quantile`] is the upper bound of the bucket
//! holding the sample of rank ⌈n × NN / 100⌉ among the `n` samples of the fleet's last one to
//! two windows (10–20 s): never below the true quantile, at most 12.5 % above it. It is `None`
//! while fewer than [`MIN_SAMPLES`](kernel::buckets::MIN_SAMPLES) (100) samples are known, or
//! fewer than [`MIN_TAIL`](kernel::buckets::MIN_TAIL) (5) rank above it (so p99 needs 500): a
//! hedge then falls back on its ceiling. The fleet's histogram is forgotten a [`WINDOW`] after
//! it was last heard (a process whose batches fail decides from its own unanswered samples
//! only), and a batch that fails is dropped, not sent again: latencies only advise.
//!
//! **One slow process.** The histogram is merged, not averaged: every sample counts once, so a
//! process weighs by its share of the fleet's calls. A slow process holding a share `s` of the
//! calls (all of them slower than the fleet's pNN) moves the fleet's pNN only if `s` exceeds
//! `1 − NN/100`: one process of ten, every call of it slow, drags p95 to its own latencies (its
//! 10 % of the samples are the whole tail), p80 not at all. Below that share it moves the
//! quantile to the rank `NN / (1 − s)` of the others'. A hedge's delay is meant to sit in the
//! tail, so a process that is itself the tail raises the fleet's delay rather than lowering
//! it: the fleet hedges later, never more.

#[cfg(test)]
pub(crate) mod differential;
#[cfg(test)]
mod fleet;
pub(crate) mod kernel;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use self::kernel::buckets::{self, BUCKETS};
use self::kernel::{Counts, Merge, Record};
use crate::coordinator::{Coordinator, FORGET_IDLE_AFTER, ForgetsIdle, WeakCoordinator, timer};
use crate::identity::{Identity, KeyBase};
use crate::sync::lock;

/// How long samples wait to be sent together.
pub(crate) const REFRESH: Duration = Duration::from_millis(500);

/// The fleet's windows: a quantile reads the last one to two of them.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);

/// `identity`'s fleet latency in `coordinator`, made on first use.
pub(crate) fn fleet_latency(coordinator: &Coordinator, identity: &Identity) -> Arc<FleetLatency> {
    let views = coordinator.kept_forgetting::<Views>();
    let mut views = lock(&views.0);
    let view = views
        .entry(identity.key.clone())
        .or_insert_with(|| FleetLatency::new(coordinator, identity.clone()));
    Arc::clone(view)
}

/// A coordinator's fleet latencies, one per identity.
#[derive(Debug, Default)]
struct Views(Mutex<HashMap<KeyBase, Arc<FleetLatency>>>);

impl ForgetsIdle for Views {
    /// Forgets the views held by nothing but the map, with nothing to send, that heard nothing
    /// for [`FORGET_IDLE_AFTER`] (what they heard is a window old by then, and forgotten).
    fn forget_idle(&self) {
        let mut views = lock(&self.0);
        let now = Instant::now();
        views.retain(|_, view| Arc::strong_count(view) > 1 || !view.idle(now));
        crate::sync::shrink(&mut views);
    }
}

/// What this process knows of one identity's latencies: the fleet's as last heard, and its own
/// samples not yet answered.
#[derive(Debug)]
pub(crate) struct FleetLatency {
    /// Itself, for the batches `observe` starts.
    this: Weak<FleetLatency>,
    identity: Identity,
    coordinator: WeakCoordinator,
    /// Samples recorded and not yet sent, by bucket.
    unsent: Box<[AtomicU32]>,
    /// Whether a batch is due: its timer runs, or it is in flight.
    due: AtomicBool,
    born: Instant,
    heard: Mutex<Heard>,
}

#[derive(Debug, Default)]
struct Heard {
    /// The fleet's histogram as last answered (empty: none), and when.
    fleet: Vec<u32>,
    at: Option<Instant>,
    /// Sent, not yet answered: non-zero buckets.
    in_flight: Vec<(usize, u64)>,
}

impl FleetLatency {
    fn new(coordinator: &Coordinator, identity: Identity) -> Arc<Self> {
        Arc::new_cyclic(|this| FleetLatency {
            this: this.clone(),
            identity,
            coordinator: WeakCoordinator::of(coordinator),
            unsent: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
            due: AtomicBool::new(false),
            born: Instant::now(),
            heard: Mutex::default(),
        })
    }

    /// Records one finished attempt that took `latency`, and starts a batch unless one is due.
    /// Never waits.
    pub(crate) fn observe(&self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        // SeqCst with `due`: a batch that clears `due` then finds no sample leaves this one to
        // the batch this call starts.
        self.unsent[buckets::bucket(us)].fetch_add(1, Ordering::SeqCst);
        self.schedule();
    }

    /// Starts a batch unless one is due.
    fn schedule(&self) {
        if !self.due.load(Ordering::SeqCst) && !self.due.swap(true, Ordering::SeqCst) {
            self.start();
        }
    }

    /// The `per_mille` quantile of the fleet's recent latencies with this process's own
    /// samples not yet answered (see the module docs for the rule); `None` while too few
    /// samples are known. A view that has not heard the fleet for a [`WINDOW`] starts a read
    /// in the background (never awaited): a new process learns the fleet's latency before its
    /// own first attempt ends.
    pub(crate) fn quantile(&self, per_mille: u16) -> Option<Duration> {
        let fresh = lock(&self.heard).fresh();
        if !fresh {
            // A process that has not heard the fleet lately (new, or whose calls all stopped
            // short of an answer) asks for it: a batch without samples is a read. Not under
            // `heard`: a batch dropped during its first poll answers, which takes `heard`.
            self.schedule();
        }
        let heard = lock(&self.heard);
        let mut counts = [0u64; BUCKETS];
        for (bucket, count) in counts.iter_mut().enumerate() {
            let fleet = if fresh { heard.fleet.get(bucket) } else { None };
            *count = u64::from(fleet.copied().unwrap_or(0))
                + u64::from(self.unsent[bucket].load(Ordering::Relaxed));
        }
        for &(bucket, sent) in &heard.in_flight {
            counts[bucket] += sent;
        }
        buckets::quantile_us(|bucket| counts[bucket], per_mille).map(Duration::from_micros)
    }

    fn idle(&self, now: Instant) -> bool {
        let heard = lock(&self.heard);
        let last = heard.at.unwrap_or(self.born);
        !self.due.load(Ordering::SeqCst) && now.duration_since(last) >= FORGET_IDLE_AFTER
    }

    /// Starts the batches: they run while samples keep coming.
    fn start(&self) {
        let (Some(coordinator), Some(this)) = (self.coordinator.live(), self.this.upgrade()) else {
            self.due.store(false, Ordering::SeqCst);
            return;
        };
        let batches = Batches(Some(this));
        coordinator.in_background(batches.run());
    }

    /// Takes the unsent samples as a batch in flight.
    fn take(&self) -> Vec<(usize, u64)> {
        let samples: Vec<(usize, u64)> = (self.unsent.iter().enumerate())
            .filter_map(|(bucket, count)| {
                let count = count.swap(0, Ordering::SeqCst);
                (count > 0).then_some((bucket, u64::from(count)))
            })
            .collect();
        lock(&self.heard).in_flight.clone_from(&samples);
        samples
    }

    /// A batch's answer: the fleet's histogram, or `None` (it failed, and is dropped).
    fn answered(&self, counts: Option<Counts>) {
        let mut heard = lock(&self.heard);
        heard.in_flight.clear();
        if let Some(Counts(counts)) = counts {
            heard.fleet = counts
                .into_iter()
                .map(|count| u32::try_from(count).unwrap_or(u32::MAX))
                .collect();
            heard.at = Some(Instant::now());
        }
    }

    fn has_unsent(&self) -> bool {
        self.unsent
            .iter()
            .any(|count| count.load(Ordering::SeqCst) > 0)
    }
}

impl Heard {
    /// Whether the fleet's histogram was heard less than a [`WINDOW`] ago.
    fn fresh(&self) -> bool {
        self.at.is_some_and(|at| at.elapsed() < WINDOW)
    }
}

/// A view's batches, one at a time: dropped unfinished (its runtime shut down), it leaves no
/// batch due that nothing will send, which would keep every later sample unsent.
struct Batches(Option<Arc<FleetLatency>>);

impl Batches {
    async fn run(mut self) {
        let Some(view) = self.0.clone() else {
            return;
        };
        loop {
            timer::sleep_until(Instant::now() + REFRESH).await;
            let Some(coordinator) = view.coordinator.live() else {
                return;
            };
            let samples = view.take();
            if !samples.is_empty() || !lock(&view.heard).fresh() {
                let record = Record {
                    window_ms: u64::try_from(WINDOW.as_millis()).unwrap_or(u64::MAX),
                    samples,
                };
                let reply = coordinator.run::<Merge>(&view.identity, record).await;
                view.answered(reply.ok());
            }
            // Cleared before the samples are looked at, so a sample recorded in between either
            // is seen here or starts the next batch itself.
            view.due.store(false, Ordering::SeqCst);
            if !view.has_unsent() || view.due.swap(true, Ordering::SeqCst) {
                break;
            }
        }
        self.0 = None;
    }
}

impl Drop for Batches {
    fn drop(&mut self) {
        if let Some(view) = self.0.take() {
            view.answered(None);
            view.due.store(false, Ordering::SeqCst);
        }
    }
}
