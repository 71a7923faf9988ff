//! Closed-path outcomes, batched: recorded without waiting, sent together, and their replies
//! applied to the view.

use std::sync::Arc;

use tokio::time::Instant;

use super::view::{Applied, Lapse, Learned, Maker, Tells, View, learn_in};
use super::{
    Announcement, BATCH_DELAY, BreakerTarget, MAX_BATCH, VIEW_MAX_AGE, Views, learned_origin,
};
use crate::coordinator::{Stamped, WeakCoordinator, timer};
use crate::error::Error;
use crate::policy::breaker::events::{self, ChangeOrigin};
use crate::policy::breaker::kernel::{
    Counts, Observation, Observe, ObserveCommand, ObserveReply, Phase,
};
use crate::sync::lock;

impl Views<'_> {
    /// Records the outcome of a closed-path call admitted under `generation`, without waiting:
    /// it joins the identity's pending batch, which goes out after [`BATCH_DELAY`] — or at
    /// once when it is full, or when this process's own outcomes may already open the breaker.
    pub(crate) fn record(&self, target: &BreakerTarget, generation: u64, observation: Observation) {
        // Decided under the lock, sent after it: a backend may answer synchronously, and the
        // answer updates the views.
        let (send, new_batch) = {
            let mut views = lock(&self.state().views);
            let view = views.entry(target.identity.key.clone()).or_insert_with(|| {
                // Known of nothing: stale already, and taking any answer.
                let long_ago = Instant::now() - VIEW_MAX_AGE;
                let learned = Learned {
                    phase: Phase::Closed,
                    generation,
                    probe_due: None,
                    lapse: Lapse::Unknown,
                    asked: long_ago,
                    received: long_ago,
                    stamp: None,
                    answers_question: true,
                };
                View::new(&target.identity, &learned)
            });
            let mut send = Vec::new();
            let new_batch = match &mut view.batch {
                Some((batch_generation, outcomes)) if *batch_generation == generation => {
                    outcomes.push(observation);
                    false
                }
                // A new batch; one of an older generation cannot be merged, so it goes now.
                batch => {
                    send.extend(batch.replace((generation, vec![observation])));
                    true
                }
            };
            let expected = view.expected_window();
            let urgent = view
                .batch
                .as_ref()
                .is_some_and(|(batch_generation, outcomes)| {
                    outcomes.len() >= MAX_BATCH
                        || (*batch_generation == view.generation
                            && target.settings.threshold_reached(expected))
                });
            if urgent {
                send.extend(view.batch.take());
            }
            for (batch_generation, outcomes) in &send {
                view.sent(*batch_generation, outcomes);
            }
            (send, new_batch)
        };
        for (batch_generation, outcomes) in send {
            self.send_batch(target, batch_generation, outcomes);
        }
        if new_batch {
            let weak = WeakCoordinator::of(self.coordinator);
            let flush_now = Arc::clone(&self.state().flush_now);
            let target = target.clone();
            self.coordinator.in_background(async move {
                tokio::select! {
                    () = timer::sleep_until(Instant::now() + BATCH_DELAY) => {}
                    () = flush_now.notified() => {}
                }
                if let Some(coordinator) = weak.upgrade() {
                    Views::of(&coordinator).flush_batch(&target, generation);
                }
            });
        }
    }

    /// Sends `target`'s pending batch of `generation`, if it is still waiting.
    fn flush_batch(&self, target: &BreakerTarget, generation: u64) {
        let pending = {
            let mut views = lock(&self.state().views);
            views.get_mut(&target.identity.key).and_then(|view| {
                let batch = view
                    .batch
                    .take_if(|(batch_generation, _)| *batch_generation == generation)?;
                view.sent(batch.0, &batch.1);
                Some(batch)
            })
        };
        if let Some((generation, outcomes)) = pending {
            self.send_batch(target, generation, outcomes);
        }
    }

    fn send_batch(&self, target: &BreakerTarget, generation: u64, outcomes: Vec<Observation>) {
        let asked = Instant::now();
        let counts = Counts::of(outcomes.iter().copied());
        let observe = ObserveCommand {
            generation,
            observations: outcomes,
            mint: crate::token::generation(),
            settings: target.settings,
        };
        let weak = WeakCoordinator::of(self.coordinator);
        let target = target.clone();
        let coordinator = self.coordinator.clone();
        self.coordinator.in_background(async move {
            let reply = coordinator.run::<Observe>(&target.identity, observe).await;
            drop(coordinator);
            if let Some(coordinator) = weak.upgrade() {
                Views::of(&coordinator).on_observed(&target, generation, counts, asked, reply);
            }
        });
    }

    /// Applies the reply to a batch of `counts` outcomes of generation `attempted`, and wakes
    /// the admissions waiting for a verdict.
    fn on_observed(
        &self,
        target: &BreakerTarget,
        attempted: u64,
        counts: Counts,
        asked: Instant,
        reply: Result<Stamped<ObserveReply>, Error>,
    ) {
        let breakers = self.state();
        let at = target.identity.at();
        match &reply {
            Ok(stamped) => events::observed(&at, attempted, &stamped.reply),
            Err(error) => events::coordinator_error(&at, "observe", error),
        }
        let change = {
            // One critical section: an admission deciding from the view sees the batch either
            // in flight or recorded, never neither.
            let mut views = lock(&breakers.views);
            if let Some(view) = views.get_mut(&target.identity.key) {
                view.batches_answered += 1;
                if view.generation == attempted {
                    view.unanswered.remove(counts);
                }
            }
            match reply {
                Ok(Stamped { reply, stamp }) => {
                    let told = reply.told(&target.settings);
                    let learned = told.learned(asked, stamp);
                    let key = &target.identity.key;
                    let applied = learn_in(&mut views, key, Some(&target.identity), learned);
                    if let ObserveReply::Recorded { generation, window } = reply
                        && applied != Applied::Dropped
                        && let Some(view) = views.get_mut(key)
                        && view.generation == generation
                    {
                        view.window = window;
                    }
                    applied.change().map(|change| {
                        let (origin, window) = match told.maker {
                            Maker::Us { opened_by } => (ChangeOrigin::Local, opened_by),
                            Maker::Other => (learned_origin(change), None),
                        };
                        Announcement {
                            identity: target.identity.clone(),
                            change,
                            origin,
                            window,
                        }
                    })
                }
                Err(_) => None,
            }
        };
        self.announce(change);
        breakers.verdicts.notify_waiters();
    }
}
