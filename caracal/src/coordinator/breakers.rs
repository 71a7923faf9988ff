//! What this process knows of each breaker's shared state, so the closed path costs no round
//! trip, and so every process that uses a breaker hears of every change to it.
//!
//! - **Views.** Every reply about a breaker (admission, observation, settlement) and every
//!   transition message refreshes this process's view of it. A call admitted on a closed view
//!   younger than [`VIEW_MAX_AGE`] costs no round trip; an older one is refreshed by that call
//!   (one round trip). While a view says open, calls are rejected locally until the next probe
//!   is due. Half-open always asks the coordinator: probes are arbitrated there. Forced states
//!   (an operator's) are decided from a fresh view like a closed one.
//! - **Fleet-wide invalidation.** The scripts publish every transition on the namespace's
//!   channel; each process subscribes and applies it to its view at once. So a breaker opened by
//!   any process stops the others within one pub/sub delivery; if a message is lost (the
//!   subscription reconnecting) the view expires after [`VIEW_MAX_AGE`] anyway. **Staleness
//!   bound: a closed view is never trusted for longer than `VIEW_MAX_AGE`.**
//! - **Every process sees every change.** A view that learns a new phase — from a reply, or
//!   from a message — announces it: `circuit_breaker.state_changed` with `origin` `local` (this
//!   process made it), `remote` (another did) or `operator`.
//! - **Batched observations.** Outcomes of closed-path calls are not awaited: they accumulate
//!   per identity and generation for up to [`BATCH_DELAY`] (or [`MAX_BATCH`] outcomes) and go
//!   out as one script call, whose reply refreshes the view.
//! - **Own outcomes count at once.** The view keeps the window the coordinator last reported
//!   and the outcomes sent since or still waiting. When those together reach the threshold,
//!   the batch goes out at once and admissions wait for its verdict instead of deciding from
//!   the view: a failing downstream is cut off after at most `minimum_throughput` calls of
//!   this process (plus those already running), not after a batch delay's worth.
//! - **Order.** Answers reach a process in another order than the coordinator decided them (a
//!   batch is sent from a background task, replies are handled by different tasks). Each one
//!   carries the server time of its decision, and a view drops one decided before the answer
//!   it holds — unless its question was asked after that answer arrived, which orders it
//!   without trusting clocks (a failover can turn the server's time back). A pub/sub message
//!   answers no question of this process: only its time orders it.
//! - **Last-known state.** When the coordinator cannot answer, the view is also what this
//!   process last saw; it is remembered for at most [`LAST_KNOWN_AGE`] and at most
//!   [`MAX_VIEWS`] identities.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::Notified;
use tokio::time::Instant;
use uuid::Uuid;

use super::feed::{Origin, Transition};
use super::{BreakerTarget, Coordinator, Stamped, upgrade};
use crate::Error;
use crate::events::{self, ChangeOrigin};
use crate::identity::{Identity, KeyBase};
use crate::kernel::breaker::{
    Admit, AdmitCommand, AdmitReply, Counts, Force, ForceReply, Observation, Observe,
    ObserveCommand, ObserveReply, Phase, ProbeOutcome, Settings, Settle, SettleCommand,
    SettleReply, Transition as BreakerTransition,
};
use crate::sync::lock;

/// How long a closed (or forced) view is trusted without confirmation.
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
    /// Whose view this is, for the events it announces.
    identity: Identity,
    phase: Phase,
    generation: u64,
    /// When the coordinator last confirmed this view.
    confirmed: Instant,
    /// While open (or forced open for a while): when a probe may be due (unknown if `None`:
    /// ask the coordinator).
    probe_due: Option<Instant>,
    /// Closed-path observations waiting to be sent, and their generation.
    batch: Option<(u64, Vec<Observation>)>,
    /// The window the coordinator last reported under `generation`.
    window: Counts,
    /// Observations of `generation` sent and not yet answered.
    unanswered: Counts,
    /// The stamp of the answer this view holds (see [`Stamped`]), if it was stamped.
    stamp: Option<u64>,
    /// When the answer this view holds arrived: a question asked after that was decided
    /// after it.
    received: Instant,
    /// Batches of observations sent, and answered (whatever their generation): an admission
    /// waiting for a verdict waits for the batches in flight when it began.
    batches_sent: u64,
    batches_answered: u64,
}

impl View {
    fn new(identity: &Identity, learned: &Learned) -> Self {
        View {
            identity: identity.clone(),
            phase: learned.phase,
            generation: learned.generation,
            confirmed: learned.asked,
            probe_due: learned.probe_due,
            batch: None,
            window: Counts::default(),
            unanswered: Counts::default(),
            stamp: learned.stamp,
            received: learned.received,
            batches_sent: 0,
            batches_answered: 0,
        }
    }

    /// What the window will hold once everything this process knows of has been recorded:
    /// the last reported window, the observations in flight and those waiting to be sent.
    fn expected_window(&self) -> Counts {
        let mut counts = self.window;
        counts.add(self.unanswered);
        if let Some((generation, outcomes)) = &self.batch
            && *generation == self.generation
        {
            counts.add(Counts::of(outcomes.iter().copied()));
        }
        counts
    }

    /// Counts a batch of `generation` as in flight.
    fn sent(&mut self, generation: u64, outcomes: &[Observation]) {
        self.batches_sent += 1;
        if generation == self.generation {
            self.unanswered.add(Counts::of(outcomes.iter().copied()));
        }
    }

    /// Whether this process's own outcomes may already have opened the breaker: its verdict
    /// is in flight and the expected window reaches the threshold.
    fn verdict_pending(&self, settings: &Settings) -> bool {
        self.unanswered.total > 0 && settings.threshold_reached(self.expected_window())
    }

    /// Whether observations are waiting to be sent or in flight: admissions may be waiting for
    /// their verdict.
    fn busy(&self) -> bool {
        self.batch.is_some() || self.batches_answered < self.batches_sent
    }

    fn fresh(&self, now: Instant) -> bool {
        now.duration_since(self.confirmed) < VIEW_MAX_AGE
    }
}

/// What a reply or a message said of a breaker.
#[derive(Debug, Clone, Copy)]
struct Learned {
    phase: Phase,
    generation: u64,
    probe_due: Option<Instant>,
    /// When the question was sent (for a message, which answers none: when it arrived).
    asked: Instant,
    /// When the answer arrived.
    received: Instant,
    /// When the coordinator decided it (see [`Stamped`]).
    stamp: Option<u64>,
    /// Whether it answers a question asked at `asked` (a message answers none: it was decided
    /// before it arrived, so its arrival orders nothing).
    answers_question: bool,
}

/// What an answer did to the view it was about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Learnt {
    /// It was older than what the view holds, and was dropped.
    Stale,
    /// It was applied; the change of phase or generation it made, if any.
    Applied(Option<BreakerTransition>),
}

impl Learnt {
    fn change(self) -> Option<BreakerTransition> {
        match self {
            Learnt::Stale => None,
            Learnt::Applied(change) => change,
        }
    }
}

/// Makes room in a full map of views: forgets those unconfirmed for [`LAST_KNOWN_AGE`], then,
/// if that is not enough, the oldest tenth — closed ones first (forgetting them only costs a
/// round trip; forgetting an open one would let a coordinator outage fail open). A view with
/// observations waiting to be sent is never forgotten, nor one with observations in flight
/// among the oldest (an answer that never comes, its task dropped with a runtime, holds it no
/// longer than the age bound).
fn evict(views: &mut HashMap<KeyBase, View>, now: Instant) {
    views.retain(|_, view| {
        view.batch.is_some() || now.duration_since(view.confirmed) < LAST_KNOWN_AGE
    });
    if views.len() < MAX_VIEWS {
        return;
    }
    let mut candidates: Vec<_> = views
        .iter()
        .filter(|(_, view)| !view.busy())
        .map(|(key, view)| (view.phase != Phase::Closed, view.confirmed, key.clone()))
        .collect();
    candidates.sort_unstable_by_key(|(open, confirmed, _)| (*open, *confirmed));
    for (_, _, key) in candidates.into_iter().take(MAX_VIEWS / 10) {
        views.remove(&key);
    }
}

/// Applies what the coordinator said about `key`. Answers reach this process in another
/// order than they were decided in (a batch goes out from a background task while a later
/// question goes out at once; replies are handled by different tasks), so one decided before
/// what the view holds is dropped. An answer is taken when it was decided later — by the
/// stamps when both carry one (a lower generation decided later is a lost state's new
/// epoch), else when it is plainly newer state: a later generation, or the open → half-open
/// step of the same one — or when its question was asked after the answer the view holds
/// arrived. That last rule needs no clock agreement, so a view still moves on after a
/// failover or a clock step turned the server's time back (its next question brings it onto
/// the new clock). It is for replies only: a pub/sub message was decided at some moment
/// before it arrived, so its arrival orders nothing, and it is taken only when decided
/// later. The view counts as confirmed at `asked`, so its age bound holds from when it was
/// true. A new view (made only when `identity` is given) is no change this process saw.
fn learn_in(
    views: &mut HashMap<KeyBase, View>,
    key: &KeyBase,
    identity: Option<&Identity>,
    learned: Learned,
) -> Learnt {
    if let Some(view) = views.get_mut(key) {
        let (phase, generation) = (learned.phase, learned.generation);
        let decided_later = match (learned.stamp, view.stamp) {
            (Some(stamp), Some(held)) => stamp >= held,
            _ => {
                generation > view.generation
                    || (generation == view.generation
                        && (phase == view.phase
                            || (matches!(view.phase, Phase::Open | Phase::ForcedOpen)
                                && phase == Phase::HalfOpen)))
            }
        };
        if !decided_later && (!learned.answers_question || learned.asked <= view.received) {
            return Learnt::Stale;
        }
        let change =
            (phase != view.phase || generation != view.generation).then_some(BreakerTransition {
                from: view.phase,
                to: phase,
                generation,
            });
        if generation != view.generation {
            view.window = Counts::default();
            view.unanswered = Counts::default();
        }
        view.phase = phase;
        view.generation = generation;
        view.confirmed = view.confirmed.max(learned.asked);
        view.probe_due = learned.probe_due;
        view.stamp = learned.stamp;
        view.received = view.received.max(learned.received);
        return Learnt::Applied(change.filter(|change| change.from != change.to));
    }
    let Some(identity) = identity else {
        return Learnt::Stale;
    };
    if views.len() >= MAX_VIEWS {
        evict(views, learned.asked);
    }
    events::breaker_phase(&identity.at(), learned.phase);
    views.insert(key.clone(), View::new(identity, &learned));
    Learnt::Applied(None)
}

/// How a call is admitted, from the view or from the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Run as an ordinary call; its outcome is recorded under `generation`.
    Closed { generation: u64 },
    /// Run, recording nothing: an operator forced the breaker closed.
    Unrecorded { generation: u64 },
    /// Run as a probe holding the slot `token`.
    Probe { generation: u64, token: Uuid },
    /// Rejected: open (or forced open), with the time until a probe may be admitted when
    /// known.
    Open {
        phase: Phase,
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
    flush_now: Arc<Notify>,
    /// Wakes the admissions waiting for an observation's verdict (any identity's: each
    /// checks its own view again).
    verdicts: Notify,
}

/// What the view alone can say of an admission.
enum Local<'a> {
    Decided(Admission),
    /// This process's own outcomes may have opened the breaker: wait until the batches in
    /// flight (up to `until` sent) are answered.
    AwaitVerdict {
        verdict: Pin<Box<Notified<'a>>>,
        until: u64,
    },
    /// Ask the coordinator.
    Ask,
}

/// Says a view learned of `change`, made by `origin`; `window` is what opened it, if that is
/// what happened.
fn announce(
    identity: &Identity,
    change: BreakerTransition,
    origin: ChangeOrigin,
    window: Option<Counts>,
) {
    events::breaker_state_changed(&identity.at(), change, window, origin);
}

/// Who made a change this process learned of from a reply, before (or without) the feed's
/// message naming its maker: only an operator forces a state or ends a forced one under a new
/// generation (a reset); any other change was another process's call.
fn learned_origin(change: BreakerTransition) -> ChangeOrigin {
    let forced = |phase| matches!(phase, Phase::ForcedOpen | Phase::ForcedClosed);
    if forced(change.to) || (forced(change.from) && change.to == Phase::Closed) {
        ChangeOrigin::Operator
    } else {
        ChangeOrigin::Remote
    }
}

impl Breakers {
    /// Applies what a reply to this process's own command said; announces a change it made
    /// (`ours`, with the window that opened it, if any) as local, and one it merely learned
    /// of (another process made it) as remote.
    fn learn(&self, target: &BreakerTarget, learned: Learned, ours: Option<Option<Counts>>) {
        let change = learn_in(
            &mut lock(&self.views),
            &target.identity.key,
            Some(&target.identity),
            learned,
        );
        if let Some(change) = change.change() {
            let (origin, window) = match ours {
                Some(window) => (ChangeOrigin::Local, window),
                None => (learned_origin(change), None),
            };
            announce(&target.identity, change, origin, window);
        }
    }

    /// A transition message. This process's own were announced when their replies came.
    pub(super) fn on_message(&self, transition: Transition) {
        if transition.own {
            return;
        }
        let now = Instant::now();
        let learned = Learned {
            phase: transition.phase,
            generation: transition.generation,
            probe_due: None,
            asked: now,
            received: now,
            stamp: transition.stamp,
            answers_question: false,
        };
        let origin = match transition.origin {
            Origin::Call => ChangeOrigin::Remote,
            Origin::Operator => ChangeOrigin::Operator,
        };
        self.apply_change(&transition.key, learned, origin);
    }

    /// An operator's command this process carried out, asked at `asked`: its own message
    /// about it is skipped, so the answer is what tells its view.
    pub(super) fn on_forced(
        &self,
        key: &KeyBase,
        force: Force,
        forced: Stamped<ForceReply>,
        asked: Instant,
    ) {
        let (phase, probe_due) = match force {
            Force::Open { lasts_ms } => (
                Phase::ForcedOpen,
                (lasts_ms > 0).then(|| asked + Duration::from_millis(lasts_ms)),
            ),
            Force::Closed { .. } => (Phase::ForcedClosed, None),
            Force::Reset { .. } => (Phase::Closed, None),
        };
        let learned = Learned {
            phase,
            generation: forced.reply.generation,
            probe_due,
            asked,
            received: Instant::now(),
            stamp: Some(forced.stamp),
            answers_question: true,
        };
        self.apply_change(key, learned, ChangeOrigin::Operator);
    }

    /// Applies a change this process learned of without a call of its own to its view of
    /// `key`, if it holds one (others would be made on demand anyway), and announces it as
    /// made by `origin`.
    fn apply_change(&self, key: &KeyBase, learned: Learned, origin: ChangeOrigin) {
        let mut views = lock(&self.views);
        if let Some(change) = learn_in(&mut views, key, None, learned).change()
            && let Some(view) = views.get(key)
        {
            announce(&view.identity, change, origin, None);
        }
    }

    /// What the view alone can say of an admission to `target` at `now`; `waited_for`: the
    /// batches this admission has been waiting for, if it has.
    fn decide_locally(
        &self,
        target: &BreakerTarget,
        now: Instant,
        waited_for: Option<u64>,
    ) -> Local<'_> {
        let views = lock(&self.views);
        let Some(view) = views.get(&target.identity.key) else {
            return Local::Ask;
        };
        let generation = view.generation;
        let rejected = |due: Option<Instant>| Admission::Open {
            phase: view.phase,
            generation,
            retry_after: due.map(|due| due - now),
        };
        match view.phase {
            Phase::Closed if view.verdict_pending(&target.settings) => {
                let until = waited_for.unwrap_or(view.batches_sent);
                if view.batches_answered >= until {
                    // Answered, and still no verdict: the coordinator decides.
                    return Local::Ask;
                }
                // Registered under the lock that the reply's update takes: it cannot be missed.
                let mut verdict = Box::pin(self.verdicts.notified());
                verdict.as_mut().enable();
                Local::AwaitVerdict { verdict, until }
            }
            Phase::Closed if view.fresh(now) => Local::Decided(Admission::Closed { generation }),
            Phase::ForcedClosed if view.fresh(now) => {
                Local::Decided(Admission::Unrecorded { generation })
            }
            Phase::Open => match view.probe_due.filter(|&due| now < due) {
                Some(due) => Local::Decided(rejected(Some(due))),
                None => Local::Ask,
            },
            // Until it lapses, or a reset is heard of; a lost message costs one round trip
            // per staleness bound.
            Phase::ForcedOpen if view.fresh(now) && view.probe_due.is_none_or(|due| now < due) => {
                Local::Decided(rejected(view.probe_due))
            }
            _ => Local::Ask,
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
        // The batches waited for, and until when.
        let mut waiting: Option<(u64, Instant)> = None;
        loop {
            let waited_for = waiting.map(|(until, _)| until);
            match breakers.decide_locally(target, Instant::now(), waited_for) {
                Local::Decided(admission) => return Ok(admission),
                Local::Ask => break,
                // Every reply wakes every waiter, so each waits on until the batches in flight
                // when it began are answered: asking the coordinator sooner could overtake the
                // batch that carries its verdict. Bounded by the command timeout: a verdict
                // that never comes (its task dropped with a runtime) must not hold admissions
                // forever; the coordinator decides after that.
                Local::AwaitVerdict { verdict, until } => {
                    let (_, deadline) = *waiting
                        .get_or_insert_with(|| (until, Instant::now() + self.command_timeout()));
                    if tokio::time::timeout_at(deadline, verdict).await.is_err() {
                        break;
                    }
                }
            }
        }
        let token = super::fresh_token();
        // If this call is dropped (or the reply lost) after the script took a probe slot, the
        // slot is handed back rather than held until its lease ends.
        let mut unclaimed = UnclaimedProbe {
            coordinator: self,
            target,
            token,
            armed: true,
        };
        let asked = Instant::now();
        let admit = AdmitCommand {
            token: token.as_u128(),
            settings: target.settings,
        };
        let Stamped { reply, stamp } = self.run::<Admit>(&target.identity, admit).await?;
        let received = Instant::now();
        let learned = |phase, generation, probe_due| Learned {
            phase,
            generation,
            probe_due,
            asked,
            received,
            stamp: Some(stamp),
            answers_question: true,
        };
        // A transition this admission made is this process's; any other it learned of.
        let ours = |transitioned: bool| transitioned.then_some(None);
        let (learned, ours, admission) = match reply {
            AdmitReply::Closed {
                generation,
                transitioned,
            } => (
                learned(Phase::Closed, generation, None),
                ours(transitioned),
                Admission::Closed { generation },
            ),
            AdmitReply::ForcedClosed { generation } => (
                learned(Phase::ForcedClosed, generation, None),
                None,
                Admission::Unrecorded { generation },
            ),
            AdmitReply::Open {
                generation,
                retry_after_ms,
            } => {
                let retry_after = Duration::from_millis(retry_after_ms);
                (
                    learned(Phase::Open, generation, Some(asked + retry_after)),
                    None,
                    Admission::Open {
                        phase: Phase::Open,
                        generation,
                        retry_after: Some(retry_after),
                    },
                )
            }
            AdmitReply::ForcedOpen {
                generation,
                retry_after_ms,
            } => {
                let retry_after = retry_after_ms.map(Duration::from_millis);
                (
                    learned(
                        Phase::ForcedOpen,
                        generation,
                        retry_after.map(|wait| asked + wait),
                    ),
                    None,
                    Admission::Open {
                        phase: Phase::ForcedOpen,
                        generation,
                        retry_after,
                    },
                )
            }
            AdmitReply::ProbeLimit { generation } => (
                learned(Phase::HalfOpen, generation, None),
                None,
                Admission::ProbeLimit { generation },
            ),
            AdmitReply::Probe {
                generation,
                transitioned,
            } => (
                learned(Phase::HalfOpen, generation, None),
                ours(transitioned),
                Admission::Probe { generation, token },
            ),
        };
        breakers.learn(target, learned, ours);
        unclaimed.armed = false;
        Ok(admission)
    }

    /// What this process last saw of `target`'s breaker, within the last-known age bound.
    pub(crate) fn breaker_last_known(&self, target: &BreakerTarget) -> Option<Phase> {
        self.inner.breakers.last_known(&target.identity.key)
    }

    /// Records the outcome of a closed-path call admitted under `generation`, without waiting:
    /// it joins the identity's pending batch, which goes out after [`BATCH_DELAY`] — or at
    /// once when it is full, or when this process's own outcomes may already open the breaker.
    pub(crate) fn breaker_record(
        &self,
        target: &BreakerTarget,
        generation: u64,
        observation: Observation,
    ) {
        // Decided under the lock, sent after it: a backend may answer synchronously, and the
        // answer updates the views.
        let (send, new_batch) = {
            let mut views = lock(&self.inner.breakers.views);
            let view = views.entry(target.identity.key.clone()).or_insert_with(|| {
                // Known of nothing: stale already, and taking any answer.
                let long_ago = Instant::now() - VIEW_MAX_AGE;
                let learned = Learned {
                    phase: Phase::Closed,
                    generation,
                    probe_due: None,
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
            mint: super::mint_generation(),
            settings: target.settings,
        };
        let weak = Arc::downgrade(&self.inner);
        let target = target.clone();
        let coordinator = self.clone();
        self.in_background(async move {
            let reply = coordinator.run::<Observe>(&target.identity, observe).await;
            drop(coordinator);
            if let Some(coordinator) = upgrade(&weak) {
                coordinator.on_observed(&target, generation, counts, asked, reply);
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
        let received = Instant::now();
        let breakers = &self.inner.breakers;
        let at = target.identity.at();
        match &reply {
            Ok(stamped) => events::breaker_observed(&at, attempted, &stamped.reply),
            Err(error) => events::breaker_coordinator_error(&at, "observe", error),
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
                    let (phase, generation, probe_due, opened) = match reply {
                        ObserveReply::Recorded { generation, .. } => {
                            (Phase::Closed, generation, None, None)
                        }
                        ObserveReply::Opened { generation, window } => {
                            let due = asked + Duration::from_millis(target.settings.open_ms);
                            (Phase::Open, generation, Some(due), Some(window))
                        }
                        ObserveReply::Stale { phase, generation } => {
                            (phase, generation, None, None)
                        }
                    };
                    let learned = Learned {
                        phase,
                        generation,
                        probe_due,
                        asked,
                        received,
                        stamp: Some(stamp),
                        answers_question: true,
                    };
                    let key = &target.identity.key;
                    let learnt = learn_in(&mut views, key, Some(&target.identity), learned);
                    if let ObserveReply::Recorded { generation, window } = reply
                        && learnt != Learnt::Stale
                        && let Some(view) = views.get_mut(key)
                        && view.generation == generation
                    {
                        view.window = window;
                    }
                    learnt.change().map(|change| {
                        let origin = match opened {
                            Some(_) => ChangeOrigin::Local,
                            None => learned_origin(change),
                        };
                        (change, origin, opened)
                    })
                }
                Err(_) => None,
            }
        };
        if let Some((change, origin, window)) = change {
            announce(&target.identity, change, origin, window);
        }
        breakers.verdicts.notify_waiters();
    }

    /// Settles the probe `token` admitted under `generation`. The request is sent at the first
    /// poll; the future owns everything it needs.
    fn settle(
        &self,
        target: BreakerTarget,
        token: Uuid,
        outcome: ProbeOutcome,
        generation: u64,
    ) -> impl Future<Output = Result<Stamped<SettleReply>, Error>> + Send + 'static {
        let coordinator = self.clone();
        let settle = SettleCommand {
            token: token.as_u128(),
            outcome,
            generation,
            settings: target.settings,
        };
        async move { coordinator.run::<Settle>(&target.identity, settle).await }
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
        let settle = self.settle(target.clone(), token, outcome, generation);
        let weak = Arc::downgrade(&self.inner);
        let target = target.clone();
        self.in_background(async move {
            let reply = settle.await;
            let Some(coordinator) = upgrade(&weak) else {
                return;
            };
            match reply {
                Ok(Stamped { reply, stamp }) => {
                    events::breaker_settled(&target.identity.at(), generation, &reply);
                    let (phase, generation, probe_due, ours) = match reply {
                        SettleReply::Closed { generation } => {
                            (Phase::Closed, generation, None, Some(None))
                        }
                        SettleReply::Reopened { generation } => {
                            let due = asked + Duration::from_millis(target.settings.open_ms);
                            (Phase::Open, generation, Some(due), Some(None))
                        }
                        SettleReply::Counted { generation, .. }
                        | SettleReply::Released { generation } => {
                            (Phase::HalfOpen, generation, None, None)
                        }
                        SettleReply::Stale { phase, generation } => (phase, generation, None, None),
                    };
                    let learned = Learned {
                        phase,
                        generation,
                        probe_due,
                        asked,
                        received: Instant::now(),
                        stamp: Some(stamp),
                        answers_question: true,
                    };
                    coordinator.inner.breakers.learn(&target, learned, ours);
                }
                Err(error) => {
                    events::breaker_coordinator_error(&target.identity.at(), "settle", &error)
                }
            }
        });
    }
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
            let settle =
                self.coordinator
                    .settle(self.target.clone(), self.token, ProbeOutcome::Ignored, 0);
            self.coordinator.in_background(async move {
                let _ = settle.await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{Kind, Scope};

    fn identity() -> Identity {
        Identity::new("ns", Kind::CircuitBreaker, "p", "op", &Scope::GLOBAL)
    }

    /// A test's clock: instants `ms` after its start.
    struct Clock(Instant);

    impl Clock {
        fn at(&self, ms: u64) -> Instant {
            self.0 + Duration::from_millis(ms)
        }

        /// An answer asked at `asked` and received at `received` (ms).
        fn answer(
            &self,
            (phase, generation): (Phase, u64),
            (asked, received): (u64, u64),
            stamp: Option<u64>,
        ) -> Learned {
            Learned {
                phase,
                generation,
                probe_due: None,
                asked: self.at(asked),
                received: self.at(received),
                stamp,
                answers_question: true,
            }
        }
    }

    fn state(views: &HashMap<KeyBase, View>, key: &KeyBase) -> (Phase, u64) {
        (views[key].phase, views[key].generation)
    }

    /// The race behind a failure storm running past its threshold: this process's batch that
    /// opened the breaker was asked first but reached the server last (it is sent from a
    /// background task), and an admission asked after it was decided by the server before
    /// it. Its late answer must not close the view again; a later decision still may, even
    /// under a lower generation (a lost state's new epoch).
    #[test]
    fn an_answer_the_server_gave_earlier_does_not_roll_the_view_back() {
        let (identity, clock) = (identity(), Clock(Instant::now()));
        let key = &identity.key;
        let mut views = HashMap::new();
        let closed = (Phase::Closed, 0);
        learn_in(
            &mut views,
            key,
            Some(&identity),
            clock.answer(closed, (0, 1), Some(10)),
        );
        let opened = clock.answer((Phase::Open, 1), (1, 5), Some(30));
        let change = learn_in(&mut views, key, Some(&identity), opened).change();
        assert_eq!(change.map(|change| change.to), Some(Phase::Open));
        let late = clock.answer(closed, (2, 6), Some(20));
        assert_eq!(
            learn_in(&mut views, key, Some(&identity), late),
            Learnt::Stale
        );
        assert_eq!(state(&views, key), (Phase::Open, 1));

        let new_epoch = clock.answer(closed, (3, 7), Some(40));
        let change = learn_in(&mut views, key, Some(&identity), new_epoch).change();
        assert_eq!(change.map(|change| change.to), Some(Phase::Closed));
        assert_eq!(views[key].stamp, Some(40));
    }

    /// A message without a stamp (from a version that wrote none) leaves nothing to compare
    /// a late stamped answer with: the answer is judged by its generation and by when it was
    /// asked.
    #[test]
    fn after_an_unstamped_message_a_late_answer_is_still_dropped() {
        let (identity, clock) = (identity(), Clock(Instant::now()));
        let key = &identity.key;
        let mut views = HashMap::new();
        let closed = (Phase::Closed, 4);
        learn_in(
            &mut views,
            key,
            Some(&identity),
            clock.answer(closed, (0, 1), Some(100)),
        );
        let opened = clock.answer((Phase::Open, 5), (3, 3), None);
        assert!(learn_in(&mut views, key, None, opened).change().is_some());
        let late = clock.answer(closed, (2, 4), Some(150));
        assert_eq!(
            learn_in(&mut views, key, Some(&identity), late),
            Learnt::Stale
        );
        assert_eq!(state(&views, key), (Phase::Open, 5));
    }

    /// Making room among a full map of views keeps the one whose batch is still in flight,
    /// though it is the oldest closed view: forgetting it would let the admissions waiting for
    /// that batch's verdict ask the coordinator before the batch reaches it.
    #[test]
    fn a_view_with_a_batch_in_flight_is_not_forgotten() {
        let clock = Clock(Instant::now());
        let mut views = HashMap::new();
        let identities: Vec<_> = (0..MAX_VIEWS)
            .map(|i| {
                let scope = Scope::new(format!("s{i}")).expect("scope");
                Identity::new("ns", Kind::CircuitBreaker, "p", "op", &scope)
            })
            .collect();
        for (i, identity) in (0u64..).zip(&identities) {
            let answer = clock.answer((Phase::Closed, 0), (i, i), Some(i));
            learn_in(&mut views, &identity.key, Some(identity), answer);
        }
        let oldest = &identities[0].key;
        let in_flight = views.get_mut(oldest).expect("the oldest view");
        in_flight.sent(0, &[Observation::default()]);
        let newcomer = identity();
        let answer = clock.answer((Phase::Closed, 0), (0, 0), Some(0));
        learn_in(&mut views, &newcomer.key, Some(&newcomer), answer);
        assert!(views.len() <= MAX_VIEWS);
        assert!(
            views.contains_key(oldest),
            "the view with a batch in flight was forgotten"
        );
        assert!(!views.contains_key(&identities[1].key));
    }

    /// A failover to a server whose clock is behind (or a clock step) makes every new stamp
    /// lower than the one the view holds; answers to questions asked after the view's last
    /// answer arrived are later all the same, and the view moves on.
    #[test]
    fn a_server_clock_turned_back_does_not_freeze_the_view() {
        let (identity, clock) = (identity(), Clock(Instant::now()));
        let key = &identity.key;
        let mut views = HashMap::new();
        let opened = clock.answer((Phase::Open, 2), (0, 1), Some(5_000_000));
        learn_in(&mut views, key, Some(&identity), opened);
        let probe = clock.answer((Phase::HalfOpen, 2), (2, 3), Some(1_000_000));
        let change = learn_in(&mut views, key, Some(&identity), probe).change();
        assert_eq!(change.map(|change| change.to), Some(Phase::HalfOpen));
        let closed = clock.answer((Phase::Closed, 3), (4, 5), Some(1_000_100));
        learn_in(&mut views, key, Some(&identity), closed);
        assert_eq!(state(&views, key), (Phase::Closed, 3));
        assert_eq!(views[key].confirmed, clock.at(4));
    }

    /// Another process's probe closed generation 7; then this process's batch opened
    /// generation 8, and its reply arrived before the pub/sub message about the close (the
    /// subscription has no order with the command connections). The late message must not
    /// roll the view back to closed: a message answers no question of this process, so only
    /// its stamp says when it was decided. One decided later is still taken, also after a
    /// server clock turned back once a reply has brought the view onto the new clock.
    #[test]
    fn a_late_message_does_not_roll_an_open_view_back() {
        let identity = identity();
        let key = &identity.key;
        let breakers = Breakers::default();
        // This answer arrived before the messages, which are taken at `Instant::now()`.
        let clock = Clock(Instant::now() - Duration::from_secs(1));
        let message = |phase, generation, stamp| Transition {
            own: false,
            origin: Origin::Call,
            key: key.clone(),
            phase,
            generation,
            stamp: Some(stamp),
        };
        let opened = clock.answer((Phase::Open, 8), (0, 1), Some(2_000));
        learn_in(&mut lock(&breakers.views), key, Some(&identity), opened);
        breakers.on_message(message(Phase::Closed, 7, 1_000));
        assert_eq!(state(&lock(&breakers.views), key), (Phase::Open, 8));

        breakers.on_message(message(Phase::HalfOpen, 8, 3_000));
        assert_eq!(state(&lock(&breakers.views), key), (Phase::HalfOpen, 8));

        // Asked after the messages arrived: decided later, whatever its stamp says.
        let after_them = Clock(Instant::now() + Duration::from_millis(1));
        let turned_back = after_them.answer((Phase::HalfOpen, 8), (0, 0), Some(500));
        learn_in(
            &mut lock(&breakers.views),
            key,
            Some(&identity),
            turned_back,
        );
        breakers.on_message(message(Phase::Closed, 9, 400));
        assert_eq!(state(&lock(&breakers.views), key), (Phase::HalfOpen, 8));
        breakers.on_message(message(Phase::Closed, 9, 600));
        assert_eq!(state(&lock(&breakers.views), key), (Phase::Closed, 9));
    }
}
