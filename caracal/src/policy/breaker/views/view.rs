//! A process's view of one breaker, and the rule by which an answer about it is taken or
//! dropped (see the parent module's "Order").

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::{LAST_KNOWN_AGE, MAX_VIEWS, VIEW_MAX_AGE};
use crate::coordinator::FORGET_IDLE_AFTER;
use crate::identity::{Identity, KeyBase};
use crate::policy::breaker::events;
use crate::policy::breaker::kernel::{
    AdmitReply, Counts, Observation, ObserveReply, Phase, Settings, SettleReply,
    Transition as BreakerTransition,
};

#[derive(Debug)]
pub(super) struct View {
    /// Whose view this is, for the events it announces.
    pub(super) identity: Identity,
    pub(super) phase: Phase,
    pub(super) generation: u64,
    /// When the coordinator last confirmed this view.
    pub(super) confirmed: Instant,
    /// While open (or forced open for a while): when a probe may be due (unknown if `None`:
    /// ask the coordinator).
    pub(super) probe_due: Option<Instant>,
    /// Closed-path observations waiting to be sent, and their generation.
    pub(super) batch: Option<(u64, Vec<Observation>)>,
    /// The window the coordinator last reported under `generation`.
    pub(super) window: Counts,
    /// Observations of `generation` sent and not yet answered.
    pub(super) unanswered: Counts,
    /// The stamp of the answer this view holds (see [`Stamped`]), if it was stamped.
    pub(super) stamp: Option<u64>,
    /// When the answer this view holds arrived: a question asked after that was decided
    /// after it.
    pub(super) received: Instant,
    /// Batches of observations sent, and answered (whatever their generation): an admission
    /// waiting for a verdict waits for the batches in flight when it began.
    pub(super) batches_sent: u64,
    pub(super) batches_answered: u64,
}

impl View {
    pub(super) fn new(identity: &Identity, learned: &Learned) -> Self {
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
    pub(super) fn expected_window(&self) -> Counts {
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
    pub(super) fn sent(&mut self, generation: u64, outcomes: &[Observation]) {
        self.batches_sent += 1;
        if generation == self.generation {
            self.unanswered.add(Counts::of(outcomes.iter().copied()));
        }
    }

    /// Whether this process's own outcomes may already have opened the breaker: its verdict
    /// is in flight and the expected window reaches the threshold.
    pub(super) fn verdict_pending(&self, settings: &Settings) -> bool {
        self.unanswered.total > 0 && settings.threshold_reached(self.expected_window())
    }

    /// Whether observations are waiting to be sent or in flight: admissions may be waiting for
    /// their verdict.
    pub(super) fn busy(&self) -> bool {
        self.batch.is_some() || self.batches_answered < self.batches_sent
    }

    pub(super) fn fresh(&self, now: Instant) -> bool {
        now.duration_since(self.confirmed) < VIEW_MAX_AGE
    }
}

/// What a reply or a message said of a breaker.
#[derive(Debug, Clone, Copy)]
pub(super) struct Learned {
    pub(super) phase: Phase,
    pub(super) generation: u64,
    pub(super) probe_due: Option<Instant>,
    /// When the forced state it tells of lapses, if it says.
    pub(super) lapse: Lapse<Instant>,
    /// When the question was sent (for a message, which answers none: when it arrived).
    pub(super) asked: Instant,
    /// When the answer arrived.
    pub(super) received: Instant,
    /// When the coordinator decided it (see [`Stamped`]).
    pub(super) stamp: Option<u64>,
    /// Whether it answers a question asked at `asked` (a message answers none: it was decided
    /// before it arrived, so its arrival orders nothing).
    pub(super) answers_question: bool,
}

/// When a forced state lapses, as an answer says it: what the forced-until gauge reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lapse<T> {
    /// The answer does not say: a transition message, a reply that is not an admission's, or
    /// a state that is not forced.
    Unknown,
    /// Forced until a reset.
    Never,
    /// Forced until then.
    At(T),
}

impl Lapse<Duration> {
    /// A forced state's end in `ms`, or none: until a reset.
    pub(super) fn after(ms: Option<u64>) -> Self {
        ms.map_or(Lapse::Never, |ms| Lapse::At(Duration::from_millis(ms)))
    }

    /// The same end, for a question asked at `asked`.
    pub(super) fn counted_from(self, asked: Instant) -> Lapse<Instant> {
        match self {
            Lapse::Unknown => Lapse::Unknown,
            Lapse::Never => Lapse::Never,
            Lapse::At(wait) => Lapse::At(asked + wait),
        }
    }
}

/// What an answer did to the view it was about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Applied {
    /// It was older than what the view holds, and was dropped.
    Dropped,
    /// It was taken; the change of phase or generation it made, if any.
    Taken(Option<BreakerTransition>),
}

impl Applied {
    pub(super) fn change(self) -> Option<BreakerTransition> {
        match self {
            Applied::Dropped => None,
            Applied::Taken(change) => change,
        }
    }
}

/// Forgets the views of idle breakers: a closed one unconfirmed for [`FORGET_IDLE_AFTER`]
/// (forgetting it costs its next call a round trip), any other unconfirmed for
/// [`LAST_KNOWN_AGE`] (forgetting an open one would let a coordinator outage fail its scope
/// open). A view with observations waiting to be sent is never forgotten (an answer that
/// never comes, its task dropped with a runtime, holds one in flight no longer than the age
/// bound).
pub(super) fn forget_idle(views: &mut HashMap<KeyBase, View>, now: Instant) {
    views.retain(|_, view| {
        let kept_for = match view.phase {
            Phase::Closed | Phase::ForcedClosed => FORGET_IDLE_AFTER,
            _ => LAST_KNOWN_AGE,
        };
        view.batch.is_some() || now.duration_since(view.confirmed) < kept_for
    });
    crate::sync::shrink(views);
}

/// Makes room in a full map of views: forgets the idle ones, then, if that is not enough,
/// the oldest tenth — closed ones first, for the reason [`forget_idle`] keeps open ones — but
/// never one with observations in flight among the oldest.
pub(super) fn evict(views: &mut HashMap<KeyBase, View>, now: Instant) {
    forget_idle(views, now);
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
pub(super) fn learn_in(
    views: &mut HashMap<KeyBase, View>,
    key: &KeyBase,
    identity: Option<&Identity>,
    learned: Learned,
) -> Applied {
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
            return Applied::Dropped;
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
        report_lapse(&view.identity, view.phase.forced(), phase, learned.lapse);
        view.phase = phase;
        view.generation = generation;
        view.confirmed = view.confirmed.max(learned.asked);
        view.probe_due = learned.probe_due;
        view.stamp = learned.stamp;
        view.received = view.received.max(learned.received);
        // Touched on every answer taken, not only on a change: an exporter that drops gauges
        // left untouched for a while (see `FORGET_IDLE_AFTER`) keeps a breaker in use.
        events::phase(&view.identity.at(), phase);
        return Applied::Taken(change.filter(|change| change.from != change.to));
    }
    let Some(identity) = identity else {
        return Applied::Dropped;
    };
    if views.len() >= MAX_VIEWS {
        evict(views, learned.asked);
    }
    events::phase(&identity.at(), learned.phase);
    report_lapse(identity, false, learned.phase, learned.lapse);
    views.insert(key.clone(), View::new(identity, &learned));
    Applied::Taken(None)
}

/// Sets the forced-until gauge of `identity`'s breaker, now in `phase` (forced before, if
/// `was_forced`), from when an answer says its forced state lapses. A breaker never forced
/// keeps no series (the gauge is for the few an operator steered), and an answer that does not
/// say leaves the end last learnt in place: the next admission's reply tells it.
fn report_lapse(identity: &Identity, was_forced: bool, phase: Phase, lapse: Lapse<Instant>) {
    let end = match lapse {
        Lapse::At(end) if phase.forced() => Some(end),
        _ => None,
    };
    if (phase.forced() && lapse != Lapse::Unknown) || (was_forced && !phase.forced()) {
        events::forced_until(&identity.at(), end);
    }
}

/// Who made the change a reply to this process's own command reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Maker {
    /// This command made it; `opened_by` is the window that opened the breaker, if that is
    /// what happened.
    Us { opened_by: Option<Counts> },
    /// Another process (or an operator) made it; this command only learned of it.
    Other,
}

/// What a reply says of the breaker: its phase and generation, when the next probe is due
/// (counted from when the question was asked), and who made the change it reports.
#[derive(Debug, Clone, Copy)]
pub(super) struct Told {
    pub(super) phase: Phase,
    pub(super) generation: u64,
    pub(super) probe_due_in: Option<Duration>,
    /// When a forced state lapses, counted from when the question was asked.
    pub(super) lapse: Lapse<Duration>,
    pub(super) maker: Maker,
}

/// A breaker reply, as a view learns from it: one translation per reply type, used by every
/// place that applies one.
pub(super) trait Tells {
    fn told(&self, settings: &Settings) -> Told;
}

impl Told {
    fn of(phase: Phase, generation: u64) -> Self {
        Told {
            phase,
            generation,
            probe_due_in: None,
            lapse: Lapse::Unknown,
            maker: Maker::Other,
        }
    }

    fn made_here(self, made: bool) -> Self {
        match made {
            true => Told {
                maker: Maker::Us { opened_by: None },
                ..self
            },
            false => self,
        }
    }

    /// What the view learns from this reply to a question asked at `asked`, stamped `stamp`.
    pub(super) fn learned(&self, asked: Instant, stamp: u64) -> Learned {
        Learned {
            phase: self.phase,
            generation: self.generation,
            probe_due: self.probe_due_in.map(|wait| asked + wait),
            lapse: self.lapse.counted_from(asked),
            asked,
            received: Instant::now(),
            stamp: Some(stamp),
            answers_question: true,
        }
    }
}

impl Tells for AdmitReply {
    fn told(&self, _: &Settings) -> Told {
        match *self {
            AdmitReply::Closed {
                generation,
                transitioned,
            } => Told::of(Phase::Closed, generation).made_here(transitioned),
            AdmitReply::ForcedClosed {
                generation,
                lapses_in_ms,
            } => Told {
                lapse: Lapse::after(lapses_in_ms),
                ..Told::of(Phase::ForcedClosed, generation)
            },
            AdmitReply::Open {
                generation,
                retry_after_ms,
            } => Told {
                probe_due_in: Some(Duration::from_millis(retry_after_ms)),
                ..Told::of(Phase::Open, generation)
            },
            AdmitReply::ForcedOpen {
                generation,
                retry_after_ms,
            } => Told {
                probe_due_in: retry_after_ms.map(Duration::from_millis),
                lapse: Lapse::after(retry_after_ms),
                ..Told::of(Phase::ForcedOpen, generation)
            },
            AdmitReply::ProbeLimit { generation } => Told::of(Phase::HalfOpen, generation),
            AdmitReply::Probe {
                generation,
                transitioned,
            } => Told::of(Phase::HalfOpen, generation).made_here(transitioned),
        }
    }
}

impl Tells for ObserveReply {
    fn told(&self, settings: &Settings) -> Told {
        match *self {
            ObserveReply::Recorded { generation, .. } => Told::of(Phase::Closed, generation),
            ObserveReply::Opened { generation, window } => Told {
                probe_due_in: Some(Duration::from_millis(settings.open_ms)),
                maker: Maker::Us {
                    opened_by: Some(window),
                },
                ..Told::of(Phase::Open, generation)
            },
            ObserveReply::Stale { phase, generation } => Told::of(phase, generation),
        }
    }
}

impl Tells for SettleReply {
    fn told(&self, settings: &Settings) -> Told {
        match *self {
            SettleReply::Closed { generation } => {
                Told::of(Phase::Closed, generation).made_here(true)
            }
            SettleReply::Reopened { generation } => Told {
                probe_due_in: Some(Duration::from_millis(settings.open_ms)),
                ..Told::of(Phase::Open, generation).made_here(true)
            },
            SettleReply::Counted { generation, .. } | SettleReply::Released { generation } => {
                Told::of(Phase::HalfOpen, generation)
            }
            SettleReply::Stale { phase, generation } => Told::of(phase, generation),
        }
    }
}
