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

mod admission;
mod batch;
#[cfg(test)]
mod tests;
mod view;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::Notified;
use tokio::time::Instant;
use uuid::Uuid;

use self::view::{Lapse, Learned, Maker, View, learn_in};
use super::events::{self, ChangeOrigin};
use crate::coordinator::feed::{Heard, Origin};
use crate::coordinator::{Coordinator, ForgetsIdle, Stamped};
use crate::identity::{Identity, KeyBase, PolicyKind};
use crate::policy::breaker::kernel::{
    Counts, Force, ForceReply, Phase, Settings, Transition as BreakerTransition,
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

/// A breaker identity and the settings its commands carry.
#[derive(Debug, Clone)]
pub(crate) struct BreakerTarget {
    pub(crate) identity: Identity,
    pub(crate) settings: Settings,
}

/// The breaker views of one coordinator, with what their operations need: the coordinator's
/// backend (its commands) and its background work.
#[derive(Debug, Clone)]
pub(crate) struct Views<'a> {
    coordinator: &'a Coordinator,
    state: Arc<Breakers>,
}

impl<'a> Views<'a> {
    /// `coordinator`'s breaker views: how calls pass its breakers, and what it knows of them.
    pub(crate) fn of(coordinator: &'a Coordinator) -> Self {
        Views {
            coordinator,
            state: coordinator.kept_forgetting::<Breakers>(),
        }
    }

    /// The views themselves.
    fn state(&self) -> &Breakers {
        &self.state
    }

    /// How many breakers this process keeps a view of.
    #[cfg(test)]
    pub(crate) fn count(&self) -> usize {
        lock(&self.state().views).len()
    }
}

/// Has `coordinator` hand this process's views the transitions other processes publish (and
/// tell its watchers of them), from now on.
pub(crate) fn listen(coordinator: &Coordinator) {
    coordinator.listen(PolicyKind::CircuitBreaker, on_feed);
}

/// Reads a feed message about a breaker, and applies it to the view (see [`listen`]).
fn on_feed(coordinator: &Coordinator, heard: &Heard<'_>) -> bool {
    let Some(transition) = Transition::read(heard) else {
        return false;
    };
    let views = Views::of(coordinator);
    views.announce(views.state().on_message(transition));
    true
}

/// A transition message, as a process reads it: the feed's envelope, and the breaker's
/// payload `<phase>:<generation>:<stamp>` (the stamp: the server time of the change, in
/// microseconds; the messages of versions that did not write one are still read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Transition {
    /// Whether this process published it (it knows of the change already).
    pub(crate) own: bool,
    pub(crate) origin: Origin,
    pub(crate) key: KeyBase,
    pub(crate) phase: Phase,
    pub(crate) generation: u64,
    /// The server time (microseconds) the change was made at; absent from the messages of
    /// versions that did not stamp them.
    pub(crate) stamp: Option<u64>,
}

impl Transition {
    /// The transition `heard` tells of; `None` unless its payload is a breaker's, well-formed.
    fn read(heard: &Heard<'_>) -> Option<Self> {
        let mut parts = heard.payload.split(':');
        let (phase, generation, stamp) = (
            parts.next()?,
            parts.next()?,
            parts.next().map(str::parse).transpose().ok()?,
        );
        if parts.next().is_some() {
            return None;
        }
        Some(Transition {
            own: heard.own,
            origin: heard.origin,
            key: heard.key.clone(),
            phase: Phase::from_code(phase.parse().ok()?)?,
            generation: generation.parse().ok()?,
            stamp,
        })
    }
}

/// What this process knows of each breaker, kept by its coordinator.
#[derive(Debug, Default)]
pub(crate) struct Breakers {
    views: Mutex<HashMap<KeyBase, View>>,
    /// Wakes every batch waiting for its delay, so shutdown need not wait it out.
    flush_now: Arc<Notify>,
    /// Wakes the admissions waiting for an observation's verdict (any identity's: each
    /// checks its own view again).
    verdicts: Notify,
}

impl ForgetsIdle for Breakers {
    /// Forgets the views of idle breakers (see [`view::forget_idle`]).
    fn forget_idle(&self) {
        view::forget_idle(&mut lock(&self.views), Instant::now());
    }

    /// Sends every pending batch now.
    fn flush_now(&self) {
        self.flush_now.notify_waiters();
    }
}

/// What the view alone can say of an admission.
enum ViewDecision<'a> {
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

/// A change a view learned of, to announce.
#[derive(Debug)]
#[must_use = "a change learned is announced"]
struct Announcement {
    identity: Identity,
    change: BreakerTransition,
    origin: ChangeOrigin,
    /// What opened it, if that is what happened.
    window: Option<Counts>,
}

impl Views<'_> {
    /// Says a view learned of a change: the state gauge at once, and the event, which for an
    /// operator's change names who gave the command and why. Those live in the namespace's
    /// operator records, not in the feed's messages (which versions before them would not
    /// read), so the event waits for one read of the record; it goes out without them when
    /// the record cannot be read, or was replaced by a later command's.
    fn announce(&self, announcement: Option<Announcement>) {
        let Some(Announcement {
            identity,
            change,
            origin,
            window,
        }) = announcement
        else {
            return;
        };
        events::phase(&identity.at(), change.to);
        if origin != ChangeOrigin::Operator || !crate::events::warn_enabled() {
            events::state_changed(&identity.at(), change, window, origin, None);
            return;
        }
        let coordinator = self.coordinator.clone();
        self.coordinator.in_background(async move {
            let kind = PolicyKind::CircuitBreaker;
            let read = coordinator.steered_by(kind, &identity.key, change.to.as_str());
            let operator = read.await.ok().flatten();
            let at = identity.at();
            events::state_changed(&at, change, window, origin, operator.as_ref());
        });
    }
}

/// Who made a change this process learned of from a reply, before (or without) the feed's
/// message naming its maker: only an operator forces a state or ends a forced one under a new
/// generation (a reset); any other change was another process's call.
fn learned_origin(change: BreakerTransition) -> ChangeOrigin {
    if change.to.forced() || (change.from.forced() && change.to == Phase::Closed) {
        ChangeOrigin::Operator
    } else {
        ChangeOrigin::Remote
    }
}

impl Breakers {
    /// Applies what a reply to this process's own command said; a change it made is to be
    /// announced (with the window that opened it, if any) as local, and one it merely learned
    /// of (another process made it) as remote.
    fn learn(
        &self,
        target: &BreakerTarget,
        learned: Learned,
        maker: Maker,
    ) -> Option<Announcement> {
        let change = learn_in(
            &mut lock(&self.views),
            &target.identity.key,
            Some(&target.identity),
            learned,
        );
        let change = change.change()?;
        let (origin, window) = match maker {
            Maker::Us { opened_by } => (ChangeOrigin::Local, opened_by),
            Maker::Other => (learned_origin(change), None),
        };
        Some(Announcement {
            identity: target.identity.clone(),
            change,
            origin,
            window,
        })
    }

    /// A transition message: the change it tells of, to announce. This process's own were
    /// announced when their replies came.
    fn on_message(&self, transition: Transition) -> Option<Announcement> {
        if transition.own {
            return None;
        }
        let now = Instant::now();
        let learned = Learned {
            phase: transition.phase,
            generation: transition.generation,
            probe_due: None,
            lapse: Lapse::Unknown,
            asked: now,
            received: now,
            stamp: transition.stamp,
            answers_question: false,
        };
        let origin = match transition.origin {
            Origin::Call => ChangeOrigin::Remote,
            Origin::Operator => ChangeOrigin::Operator,
        };
        self.apply_change(&transition.key, learned, origin)
    }

    /// An operator's command this process carried out, asked at `asked`: its own message
    /// about it is skipped, so the answer is what tells its view.
    fn on_forced(
        &self,
        key: &KeyBase,
        force: Force,
        forced: Stamped<ForceReply>,
        asked: Instant,
    ) -> Option<Announcement> {
        let lapse = |lasts_ms: u64| Lapse::after((lasts_ms > 0).then_some(lasts_ms));
        let (phase, lapse) = match force {
            Force::Open { lasts_ms } => (Phase::ForcedOpen, lapse(lasts_ms)),
            Force::Closed { lasts_ms } => (Phase::ForcedClosed, lapse(lasts_ms)),
            Force::Reset { .. } => (Phase::Closed, Lapse::Unknown),
        };
        let lapse = lapse.counted_from(asked);
        let learned = Learned {
            phase,
            generation: forced.reply.generation,
            probe_due: match (phase, lapse) {
                (Phase::ForcedOpen, Lapse::At(end)) => Some(end),
                _ => None,
            },
            lapse,
            asked,
            received: Instant::now(),
            stamp: Some(forced.stamp),
            answers_question: true,
        };
        self.apply_change(key, learned, ChangeOrigin::Operator)
    }

    /// Applies a change this process learned of without a call of its own to its view of
    /// `key`, if it holds one (others would be made on demand anyway): the change, made by
    /// `origin`, to announce.
    fn apply_change(
        &self,
        key: &KeyBase,
        learned: Learned,
        origin: ChangeOrigin,
    ) -> Option<Announcement> {
        let mut views = lock(&self.views);
        let change = learn_in(&mut views, key, None, learned).change()?;
        let view = views.get(key)?;
        Some(Announcement {
            identity: view.identity.clone(),
            change,
            origin,
            window: None,
        })
    }

    /// What the view alone can say of an admission to `target` at `now`; `waited_for`: the
    /// batches this admission has been waiting for, if it has.
    fn decide_locally(
        &self,
        target: &BreakerTarget,
        now: Instant,
        waited_for: Option<u64>,
    ) -> ViewDecision<'_> {
        let views = lock(&self.views);
        let Some(view) = views.get(&target.identity.key) else {
            return ViewDecision::Ask;
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
                    return ViewDecision::Ask;
                }
                // Registered under the lock that the reply's update takes: it cannot be missed.
                let mut verdict = Box::pin(self.verdicts.notified());
                verdict.as_mut().enable();
                ViewDecision::AwaitVerdict { verdict, until }
            }
            Phase::Closed if view.fresh(now) => {
                ViewDecision::Decided(Admission::Closed { generation })
            }
            Phase::ForcedClosed if view.fresh(now) => {
                ViewDecision::Decided(Admission::Unrecorded { generation })
            }
            Phase::Open => match view.probe_due.filter(|&due| now < due) {
                Some(due) => ViewDecision::Decided(rejected(Some(due))),
                None => ViewDecision::Ask,
            },
            // Until it lapses, or a reset is heard of; a lost message costs one round trip
            // per staleness bound.
            Phase::ForcedOpen if view.fresh(now) && view.probe_due.is_none_or(|due| now < due) => {
                ViewDecision::Decided(rejected(view.probe_due))
            }
            _ => ViewDecision::Ask,
        }
    }

    /// The phase this process last saw for `key`, if it saw it recently enough to act on.
    fn last_known(&self, key: &KeyBase) -> Option<Phase> {
        let views = lock(&self.views);
        let view = views.get(key)?;
        (view.confirmed.elapsed() < LAST_KNOWN_AGE).then_some(view.phase)
    }
}
