//! What this process knows of each breaker's shared state, so the closed path costs no round
//! trip.
//!
//! - **Views.** Every reply about a breaker (admission, observation, settlement) and every
//!   transition message refreshes this process's view of it. A call admitted on a closed view
//!   younger than [`VIEW_MAX_AGE`] costs no round trip; an older one is refreshed by that call
//!   (one round trip). While a view says open, calls are rejected locally until the next probe
//!   is due. Half-open always asks the coordinator: probes are arbitrated there.
//! - **Fleet-wide invalidation.** The scripts publish every transition on the namespace's
//!   channel; each process subscribes and applies it to its view at once. So a breaker opened by
//!   any process stops the others within one pub/sub delivery; if a message is lost (the
//!   subscription reconnecting) the view expires after [`VIEW_MAX_AGE`] anyway. **Staleness
//!   bound: a closed view is never trusted for longer than `VIEW_MAX_AGE`.**
//! - **Batched observations.** Outcomes of closed-path calls are not awaited: they accumulate
//!   per identity and generation for up to [`BATCH_DELAY`] (or [`MAX_BATCH`] outcomes) and go
//!   out as one script call, whose reply refreshes the view.
//! - **Last-known state.** When the coordinator cannot answer, the view is also what this
//!   process last saw; it is remembered for at most [`LAST_KNOWN_AGE`] and at most
//!   [`MAX_VIEWS`] identities.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

use super::{BreakerTarget, Coordinator, Inner};
use crate::Error;
use crate::events;
use crate::identity::KeyBase;
use crate::policy::breaker::kernel::{AdmitReply, ObserveReply, Phase, ProbeOutcome, SettleReply};
use crate::sync::lock;

/// How long a closed view is trusted without confirmation.
pub(crate) const VIEW_MAX_AGE: Duration = Duration::from_millis(250);
/// How long closed-path outcomes wait to be sent together.
pub(crate) const BATCH_DELAY: Duration = Duration::from_millis(2);
/// The most outcomes sent in one observation.
pub(crate) const MAX_BATCH: usize = 512;
/// How long a view is remembered without confirmation (the last-known state's age bound).
pub(crate) const LAST_KNOWN_AGE: Duration = Duration::from_secs(600);
/// The most identities remembered.
pub(crate) const MAX_VIEWS: usize = 10_000;

#[derive(Debug)]
struct View {
    phase: Phase,
    generation: u64,
    /// When the coordinator last confirmed this view.
    confirmed: Instant,
    /// While open: when a probe may be due (unknown if `None`: ask the coordinator).
    probe_due: Option<Instant>,
    /// Closed-path outcomes waiting to be sent: their generation and `true` for failures.
    batch: Option<(u64, Vec<bool>)>,
}

/// Makes room in a full map of views: forgets those unconfirmed for [`LAST_KNOWN_AGE`], then,
/// if that is not enough, the oldest tenth — closed ones first (forgetting them only costs a
/// round trip; forgetting an open one would let a coordinator outage fail open). A view with
/// observations waiting to be sent is never forgotten.
fn evict(views: &mut HashMap<KeyBase, View>, now: Instant) {
    views.retain(|_, view| {
        view.batch.is_some() || now.duration_since(view.confirmed) < LAST_KNOWN_AGE
    });
    if views.len() < MAX_VIEWS {
        return;
    }
    let mut candidates: Vec<_> = views
        .iter()
        .filter(|(_, view)| view.batch.is_none())
        .map(|(key, view)| (view.phase != Phase::Closed, view.confirmed, key.clone()))
        .collect();
    candidates.sort_unstable_by_key(|(open, confirmed, _)| (*open, *confirmed));
    for (_, _, key) in candidates.into_iter().take(MAX_VIEWS / 10) {
        views.remove(&key);
    }
}

/// How a call is admitted, from the view or from the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Run as an ordinary call; its outcome is recorded under `generation`.
    Closed { generation: u64 },
    /// Run as a probe holding the slot `token`.
    Probe { generation: u64, token: Uuid },
    /// Rejected: open, with the time until a probe may be admitted when known.
    Open {
        generation: u64,
        retry_after: Option<Duration>,
    },
    /// Rejected: half-open with every probe slot taken.
    ProbeLimit { generation: u64 },
}

#[derive(Debug, Default)]
pub(super) struct Breakers {
    views: Mutex<HashMap<KeyBase, View>>,
    /// Wakes every batch waiting for its delay, so shutdown need not wait it out.
    flush_now: Arc<tokio::sync::Notify>,
}

impl Breakers {
    /// Applies what the coordinator said about `key` in answer to a question sent at `asked`
    /// (for a message: when it arrived). Answers can cross on the wire, so one that is older
    /// than the view is ignored unless it is plainly newer state: a later generation, or the
    /// open → half-open step of the same one. A lower generation is accepted only from a
    /// question asked after the view was confirmed (a lost state restarted the epoch). The
    /// view counts as confirmed at `asked`, so its age bound holds from when it was true.
    fn learn(
        &self,
        key: &KeyBase,
        phase: Phase,
        generation: u64,
        probe_due: Option<Instant>,
        asked: Instant,
    ) {
        let mut views = lock(&self.views);
        if let Some(view) = views.get_mut(key) {
            let later_state = generation > view.generation
                || (generation == view.generation
                    && (phase == view.phase
                        || (view.phase == Phase::Open && phase == Phase::HalfOpen)));
            if !later_state && asked < view.confirmed {
                return;
            }
            view.phase = phase;
            view.generation = generation;
            view.confirmed = view.confirmed.max(asked);
            view.probe_due = probe_due;
            return;
        }
        if views.len() >= MAX_VIEWS {
            evict(&mut views, asked);
        }
        views.insert(
            key.clone(),
            View {
                phase,
                generation,
                confirmed: asked,
                probe_due,
                batch: None,
            },
        );
    }

    /// A transition message from another process: `"<tag>:<phase>:<generation>"`.
    pub(super) fn on_message(&self, message: &str) {
        let mut parts = message.split(':');
        let (Some(tag), Some(phase), Some(generation), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        let (Some(key), Some(phase), Ok(generation)) = (
            KeyBase::from_tag(tag),
            phase.parse().ok().and_then(Phase::from_code),
            generation.parse::<u64>(),
        ) else {
            return;
        };
        // Only views this process holds matter; others would be created on demand anyway.
        if lock(&self.views).contains_key(&key) {
            self.learn(&key, phase, generation, None, Instant::now());
        }
    }

    /// The admission the view alone can decide, if any.
    fn decide_locally(&self, key: &KeyBase, now: Instant) -> Option<Admission> {
        let views = lock(&self.views);
        let view = views.get(key)?;
        match view.phase {
            Phase::Closed if now.duration_since(view.confirmed) < VIEW_MAX_AGE => {
                Some(Admission::Closed {
                    generation: view.generation,
                })
            }
            Phase::Open => view
                .probe_due
                .filter(|&due| now < due)
                .map(|due| Admission::Open {
                    generation: view.generation,
                    retry_after: Some(due - now),
                }),
            _ => None,
        }
    }

    /// The phase this process last saw for `key`, if it saw it recently enough to act on.
    pub(super) fn last_known(&self, key: &KeyBase) -> Option<Phase> {
        let views = lock(&self.views);
        let view = views.get(key)?;
        (view.confirmed.elapsed() < LAST_KNOWN_AGE).then_some(view.phase)
    }
}

impl Coordinator {
    /// Decides how a call passes `target`'s breaker: from this process's view when it can, else
    /// with one round trip.
    pub(crate) async fn breaker_admission(
        &self,
        target: &BreakerTarget,
    ) -> Result<Admission, Error> {
        let breakers = &self.inner.breakers;
        self.ensure_transition_feed();
        if let Some(admission) = breakers.decide_locally(&target.key, Instant::now()) {
            return Ok(admission);
        }
        let token = Uuid::new_v4();
        // If this call is dropped (or the reply lost) after the script took a probe slot, the
        // slot is handed back rather than held until its lease ends.
        let mut unclaimed = UnclaimedProbe {
            coordinator: self,
            target,
            token,
            armed: true,
        };
        let asked = Instant::now();
        let reply = self.breaker_admit(target, token).await?;
        let admission = match reply {
            AdmitReply::Closed { generation } => {
                breakers.learn(&target.key, Phase::Closed, generation, None, asked);
                Admission::Closed { generation }
            }
            AdmitReply::Open {
                generation,
                retry_after_ms,
            } => {
                let retry_after = Duration::from_millis(retry_after_ms);
                breakers.learn(
                    &target.key,
                    Phase::Open,
                    generation,
                    Some(asked + retry_after),
                    asked,
                );
                Admission::Open {
                    generation,
                    retry_after: Some(retry_after),
                }
            }
            AdmitReply::ProbeLimit { generation } => {
                breakers.learn(&target.key, Phase::HalfOpen, generation, None, asked);
                Admission::ProbeLimit { generation }
            }
            AdmitReply::Probe {
                generation,
                transitioned,
            } => {
                breakers.learn(&target.key, Phase::HalfOpen, generation, None, asked);
                if transitioned {
                    events::breaker_state_changed(
                        &target.at(),
                        Phase::Open,
                        Phase::HalfOpen,
                        generation,
                        None,
                    );
                }
                Admission::Probe { generation, token }
            }
        };
        unclaimed.armed = false;
        Ok(admission)
    }

    /// What this process last saw of `target`'s breaker, within the last-known age bound.
    pub(crate) fn breaker_last_known(&self, target: &BreakerTarget) -> Option<Phase> {
        self.inner.breakers.last_known(&target.key)
    }

    /// Records the outcome of a closed-path call admitted under `generation`, without waiting:
    /// it joins the identity's pending batch.
    pub(crate) fn breaker_record(&self, target: &BreakerTarget, generation: u64, failed: bool) {
        // Decided under the lock, sent after it: a backend may answer synchronously, and the
        // answer updates the views.
        let (send_now, new_batch) = {
            let mut views = lock(&self.inner.breakers.views);
            let view = views.entry(target.key.clone()).or_insert_with(|| View {
                phase: Phase::Closed,
                generation,
                confirmed: Instant::now() - VIEW_MAX_AGE,
                probe_due: None,
                batch: None,
            });
            match &mut view.batch {
                Some((batch_generation, outcomes)) if *batch_generation == generation => {
                    outcomes.push(failed);
                    let full = outcomes.len() >= MAX_BATCH;
                    (if full { view.batch.take() } else { None }, false)
                }
                // A new batch; one of an older generation cannot be merged, so it goes now.
                batch => (batch.replace((generation, vec![failed])), true),
            }
        };
        if let Some((batch_generation, outcomes)) = send_now {
            self.send_batch(target, batch_generation, outcomes);
        }
        if new_batch {
            let weak = Arc::downgrade(&self.inner);
            let flush_now = Arc::clone(&self.inner.breakers.flush_now);
            let target = target.clone();
            self.in_background(async move {
                tokio::select! {
                    () = tokio::time::sleep(BATCH_DELAY) => {}
                    () = flush_now.notified() => {}
                }
                if let Some(coordinator) = upgrade(&weak) {
                    coordinator.flush_batch(&target, generation);
                }
            });
        }
    }

    /// Sends every pending batch now (shutdown).
    pub(super) fn flush_batches_now(&self) {
        self.inner.breakers.flush_now.notify_waiters();
    }

    /// Sends `target`'s pending batch of `generation`, if it is still waiting.
    fn flush_batch(&self, target: &BreakerTarget, generation: u64) {
        let pending = {
            let mut views = lock(&self.inner.breakers.views);
            views
                .get_mut(&target.key)
                .and_then(|view| match &view.batch {
                    Some((batch_generation, _)) if *batch_generation == generation => {
                        view.batch.take()
                    }
                    _ => None,
                })
        };
        if let Some((generation, outcomes)) = pending {
            self.send_batch(target, generation, outcomes);
        }
    }

    fn send_batch(&self, target: &BreakerTarget, generation: u64, outcomes: Vec<bool>) {
        let asked = Instant::now();
        let observe = self.breaker_observe(target.clone(), generation, outcomes);
        let weak = Arc::downgrade(&self.inner);
        let target = target.clone();
        self.in_background(async move {
            let reply = observe.await;
            if let Some(coordinator) = upgrade(&weak) {
                coordinator.on_observed(&target, generation, asked, reply);
            }
        });
    }

    fn on_observed(
        &self,
        target: &BreakerTarget,
        attempted: u64,
        asked: Instant,
        reply: Result<ObserveReply, Error>,
    ) {
        let breakers = &self.inner.breakers;
        match reply {
            Ok(reply) => {
                events::breaker_observed(&target.at(), attempted, &reply);
                let (phase, generation, probe_due) = match reply {
                    ObserveReply::Recorded { generation, .. } => (Phase::Closed, generation, None),
                    ObserveReply::Opened { generation, .. } => {
                        let due = asked + Duration::from_millis(target.settings.open_ms);
                        (Phase::Open, generation, Some(due))
                    }
                    ObserveReply::Stale { phase, generation } => (phase, generation, None),
                };
                breakers.learn(&target.key, phase, generation, probe_due, asked);
            }
            Err(error) => events::breaker_coordinator_error(&target.at(), "observe", &error),
        }
    }

    /// Settles a probe without waiting; the reply refreshes the view.
    pub(crate) fn breaker_settle_later(
        &self,
        target: &BreakerTarget,
        token: Uuid,
        outcome: ProbeOutcome,
        generation: u64,
    ) {
        let asked = Instant::now();
        let settle = self.breaker_settle(target.clone(), token, outcome, generation);
        let weak = Arc::downgrade(&self.inner);
        let target = target.clone();
        self.in_background(async move {
            let reply = settle.await;
            let Some(coordinator) = upgrade(&weak) else {
                return;
            };
            let breakers = &coordinator.inner.breakers;
            match reply {
                Ok(reply) => {
                    events::breaker_settled(&target.at(), generation, &reply);
                    let (phase, generation, probe_due) = match reply {
                        SettleReply::Closed { generation } => (Phase::Closed, generation, None),
                        SettleReply::Reopened { generation } => {
                            let due = asked + Duration::from_millis(target.settings.open_ms);
                            (Phase::Open, generation, Some(due))
                        }
                        SettleReply::Counted { generation, .. }
                        | SettleReply::Released { generation } => {
                            (Phase::HalfOpen, generation, None)
                        }
                        SettleReply::Stale { phase, generation } => (phase, generation, None),
                    };
                    breakers.learn(&target.key, phase, generation, probe_due, asked);
                }
                Err(error) => events::breaker_coordinator_error(&target.at(), "settle", &error),
            }
        });
    }
}

fn upgrade(weak: &Weak<Inner>) -> Option<Coordinator> {
    weak.upgrade().map(|inner| Coordinator { inner })
}

/// A probe slot the admission script may have taken for a call that never learned of it.
struct UnclaimedProbe<'a> {
    coordinator: &'a Coordinator,
    target: &'a BreakerTarget,
    token: Uuid,
    armed: bool,
}

impl Drop for UnclaimedProbe<'_> {
    fn drop(&mut self) {
        if self.armed {
            let settle = self.coordinator.breaker_settle(
                self.target.clone(),
                self.token,
                ProbeOutcome::Ignored,
                0,
            );
            self.coordinator.in_background(async move {
                let _ = settle.await;
            });
        }
    }
}
