//! The circuit breaker's state machine: pure, with no clock, no I/O and no randomness (the
//! caller supplies `now` in milliseconds and the value a fresh epoch is minted from).
//!
//! The in-memory coordinator and the local breaker run this code; the scripts beside this file
//! implement the same steps on the same stored layout; a differential property test replays
//! generated command sequences against both and demands identical replies and identical final
//! state.
//!
//! # Transitions
//!
//! | state         | trigger                 | next          | action |
//! |---------------|-------------------------|---------------|--------|
//! | closed        | admission requested     | closed        | admit without a probe slot |
//! | closed        | observation recorded    | closed        | append to the window, keep the state alive for its TTL |
//! | closed        | threshold reached       | open          | new generation, `opened_at = now`, clear the window, never expire |
//! | closed        | state lost              | closed        | start a fresh epoch (minted generation if window data survived, else 0) |
//! | open          | admission requested     | open          | reject until `opened_at + open` (an `opened_at` after now, server time that stepped back, becomes now) |
//! | open          | open time elapsed       | half-open     | clear probes and successes (same generation), then admit a probe |
//! | half-open     | probe admitted          | half-open     | take a probe slot until `now + probe_lease` |
//! | half-open     | probe limit reached     | half-open     | reject |
//! | half-open     | probe success           | half-open     | count it, free its slot |
//! | half-open     | probe successes reached | closed        | new generation, clear window and probes |
//! | half-open     | probe failure           | open          | new generation, `opened_at = now`, clear probes |
//! | half-open     | probe ignored           | half-open     | free its slot, count nothing |
//! | half-open     | probe lease expired     | half-open     | free its slot; its late result will be stale |
//! | any           | stale generation        | unchanged     | drop the result |
//! | any           | operator: open          | forced open   | new generation, clear window and probes, never expire; until `forced_until` (or a reset) |
//! | any           | operator: close         | forced closed | new generation, clear window and probes, never expire; until `forced_until` (or a reset) |
//! | any           | operator: reset         | closed        | new generation, clear window and probes |
//! | forced open   | admission requested     | forced open   | reject (until `forced_until`, when there is one) |
//! | forced open   | forced time elapsed     | half-open     | as when an open time elapses: then admit a probe |
//! | forced closed | admission requested     | forced closed | admit; the call records nothing |
//! | forced closed | forced time elapsed     | closed        | a fresh closed state (same generation) |
//!
//! A result carries the generation it was admitted under. Every change of generation (open,
//! re-open, close, an operator's command) also clears the probe set, and observations count
//! only while closed, so a result admitted under an old generation can never change the state,
//! and no observation ever changes a forced state.
//!
//! **What opens it.** An observation is a success or a failure, and may be *slow* (the call
//! took longer than the breaker's `slow_call`). The window keeps the count of each; it opens
//! once it holds at least `minimum_throughput` observations and failures reach the failure
//! threshold, or slow calls reach the slow-call threshold (when there is one).
//!
//! # Stored layout (the same in Redis)
//!
//! - **state** (`:brk:state` hash): phase, generation, `opened_at`, probe successes, the
//!   window's totals (observations, failures, slow ones), `closed_until`, past which a closed
//!   state counts as absent, and `forced_until` (0: until a reset). Open, half-open and forced
//!   states never expire.
//! - **window** (`:brk:window` list): one entry per recorded batch, `"<at>:<outcomes>"` with one
//!   letter per observation (`s` success, `f` failure, `w` slow success, `x` slow failure),
//!   oldest first. Entries leave by time (`at + window <= now`, or `at > now` when they reach
//!   the head: recorded before server time stepped back) and by count (the oldest
//!   observations beyond `window_size`, trimming inside an entry if need be). The totals in the
//!   state make recording O(1) amortised: every observation is added once and removed once, the
//!   window is never scanned.
//! - **probes** (`:brk:probes` sorted set): probe token → lease deadline.
//!
//! Expiry is decided by these stored times, never by key TTLs, which only collect garbage
//! after the fact; that keeps both backends exactly equal under any clock.

mod commands;
mod replies;
mod window;

pub(crate) use self::commands::{
    Admit, AdmitCommand, Forcing, Observe, ObserveCommand, Settle, SettleCommand, Stored,
};

use std::collections::VecDeque;

pub(crate) use self::replies::{
    AdmitReply, Force, ForceReply, ObserveReply, ProbeOutcome, SettleReply, Transition,
};
pub(crate) use self::window::{Counts, Entry, Observation, Outcomes};

use crate::kernel::Seen;
use Action as A;
use Phase::{Closed, ForcedClosed, ForcedOpen, HalfOpen, Open};
use Trigger as T;

/// Token of a probe (a UUID).
pub(crate) type Token = u128;

/// The breaker's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Phase {
    Closed,
    Open,
    HalfOpen,
    ForcedOpen,
    ForcedClosed,
}

impl Phase {
    /// The phase as stored and published (and as the state gauge reports it).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn code(self) -> u8 {
        match self {
            Closed => 0,
            Open => 1,
            HalfOpen => 2,
            ForcedOpen => 3,
            ForcedClosed => 4,
        }
    }

    pub(crate) fn from_code(code: i64) -> Option<Self> {
        match code {
            0 => Some(Closed),
            1 => Some(Open),
            2 => Some(HalfOpen),
            3 => Some(ForcedOpen),
            4 => Some(ForcedClosed),
            _ => None,
        }
    }

    /// Whether an operator forced it.
    pub(crate) fn forced(self) -> bool {
        matches!(self, ForcedOpen | ForcedClosed)
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Closed => "closed",
            Open => "open",
            HalfOpen => "half_open",
            ForcedOpen => "forced_open",
            ForcedClosed => "forced_closed",
        }
    }
}

/// What happened, as the transition table names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Trigger {
    AdmissionRequested,
    ObservationRecorded,
    ThresholdReached,
    StateLost,
    OpenTimeElapsed,
    ProbeAdmitted,
    ProbeLimitReached,
    ProbeSuccess,
    ProbeSuccessesReached,
    ProbeFailure,
    ProbeIgnored,
    ProbeLeaseExpired,
    StaleGeneration,
    OperatorOpen,
    OperatorClose,
    OperatorReset,
    ForcedTimeElapsed,
}

/// What the breaker does about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    AdmitClosed,
    Record,
    Open,
    StartEpoch,
    RejectOpen,
    StartProbing,
    TakeProbeSlot,
    RejectProbe,
    CountSuccess,
    Close,
    Reopen,
    FreeProbeSlot,
    ExpireProbe,
    DropStale,
    ForceOpen,
    ForceClose,
    Reset,
    RejectForced,
    AdmitUnrecorded,
    EndForcedClose,
}

/// The transition table; `None` in the state column means "any state".
#[rustfmt::skip]
pub(crate) const TRANSITIONS: [(Option<Phase>, Trigger, Option<Phase>, Action); 21] = [
    (Some(Closed), T::AdmissionRequested, Some(Closed), A::AdmitClosed),
    (Some(Closed), T::ObservationRecorded, Some(Closed), A::Record),
    (Some(Closed), T::ThresholdReached, Some(Open), A::Open),
    (Some(Closed), T::StateLost, Some(Closed), A::StartEpoch),
    (Some(Open), T::AdmissionRequested, Some(Open), A::RejectOpen),
    (Some(Open), T::OpenTimeElapsed, Some(HalfOpen), A::StartProbing),
    (Some(HalfOpen), T::ProbeAdmitted, Some(HalfOpen), A::TakeProbeSlot),
    (Some(HalfOpen), T::ProbeLimitReached, Some(HalfOpen), A::RejectProbe),
    (Some(HalfOpen), T::ProbeSuccess, Some(HalfOpen), A::CountSuccess),
    (Some(HalfOpen), T::ProbeSuccessesReached, Some(Closed), A::Close),
    (Some(HalfOpen), T::ProbeFailure, Some(Open), A::Reopen),
    (Some(HalfOpen), T::ProbeIgnored, Some(HalfOpen), A::FreeProbeSlot),
    (Some(HalfOpen), T::ProbeLeaseExpired, Some(HalfOpen), A::ExpireProbe),
    (None, T::StaleGeneration, None, A::DropStale),
    (None, T::OperatorOpen, Some(ForcedOpen), A::ForceOpen),
    (None, T::OperatorClose, Some(ForcedClosed), A::ForceClose),
    (None, T::OperatorReset, Some(Closed), A::Reset),
    (Some(ForcedOpen), T::AdmissionRequested, Some(ForcedOpen), A::RejectForced),
    (Some(ForcedOpen), T::ForcedTimeElapsed, Some(HalfOpen), A::StartProbing),
    (Some(ForcedClosed), T::AdmissionRequested, Some(ForcedClosed), A::AdmitUnrecorded),
    (Some(ForcedClosed), T::ForcedTimeElapsed, Some(Closed), A::EndForcedClose),
];

/// Looks `trigger` up for `phase`: the next phase and the action. Every call the kernel makes
/// is a row of the table; `seen` records which rows were reached (the differential test's
/// coverage).
fn step(phase: Phase, trigger: Trigger, seen: &mut Seen) -> (Phase, Action) {
    let row = TRANSITIONS
        .iter()
        .position(|&(from, t, _, _)| t == trigger && from.is_none_or(|from| from == phase));
    match row {
        Some(index) => {
            seen.record(index);
            let (_, _, next, action) = TRANSITIONS[index];
            (next.unwrap_or(phase), action)
        }
        // The kernel only raises triggers that the table lists for the phase; reaching this
        // would be a kernel bug, and dropping the input is the one harmless answer.
        None => (phase, A::DropStale),
    }
}

/// The breaker settings a command carries (every caller passes its own, as with the limit of
/// a bulkhead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Settings {
    pub(crate) minimum_throughput: u32,
    /// The failure threshold in thousandths, 1..=999.
    pub(crate) threshold_permille: u32,
    /// The slow-call threshold in thousandths, 1..=999; 0 when slow calls do not open it.
    pub(crate) slow_threshold_permille: u32,
    pub(crate) window_size: u32,
    pub(crate) window_ms: u64,
    pub(crate) open_ms: u64,
    pub(crate) half_open_probes: u32,
    pub(crate) half_open_successes: u32,
    pub(crate) probe_lease_ms: u64,
    /// Whether a closed state expires (`closed_until`). Shared state must, or abandoned
    /// identities would fill Redis; a process-local breaker has nothing to collect, so its
    /// closed state stays, and admitting on it needs no clock.
    pub(crate) closed_expires: bool,
}

impl Settings {
    /// How long a closed state outlives its last change: never shorter than the window it
    /// governs (forever when it does not expire).
    pub(crate) fn closed_ttl_ms(&self) -> u64 {
        if self.closed_expires {
            self.window_ms.max(self.open_ms.saturating_mul(2))
        } else {
            u64::MAX
        }
    }

    /// Whether a window holding `counts` opens the breaker.
    pub(crate) fn threshold_reached(&self, counts: Counts) -> bool {
        let reached = |count: u32, permille: u32| {
            permille > 0 && u64::from(count) * 1000 >= u64::from(permille) * u64::from(counts.total)
        };
        counts.total >= self.minimum_throughput
            && (reached(counts.failures, self.threshold_permille)
                || reached(counts.slow, self.slow_threshold_permille))
    }
}

/// The stored state record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct State {
    pub(crate) phase: Phase,
    pub(crate) generation: u64,
    pub(crate) opened_at: u64,
    pub(crate) probe_successes: u32,
    /// The window's totals.
    pub(crate) counts: Counts,
    /// Closed only: when the state stops counting as present. 0 in every other phase.
    pub(crate) closed_until: u64,
    /// Forced phases only: when the operator's command lapses; 0 for "until a reset".
    pub(crate) forced_until: u64,
}

impl State {
    /// A state of `phase` under `generation`, with an empty window.
    fn fresh(phase: Phase, generation: u64) -> Self {
        State {
            phase,
            generation,
            opened_at: 0,
            probe_successes: 0,
            counts: Counts::default(),
            closed_until: 0,
            forced_until: 0,
        }
    }
}

/// Everything stored for one breaker identity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Store {
    pub(crate) state: Option<State>,
    pub(crate) window: VecDeque<Entry>,
    /// Probe token and lease deadline, in insertion order.
    pub(crate) probes: Vec<(Token, u64)>,
}

impl Store {
    /// The live state at `now`: a closed state past `closed_until` counts as absent.
    pub(crate) fn live_state(&self, now: u64) -> Option<&State> {
        self.state
            .as_ref()
            .filter(|s| s.phase != Closed || s.closed_until > now)
    }

    /// Drops probe leases whose deadline has come.
    fn expire_probes(&mut self, now: u64, phase: Phase, seen: &mut Seen) {
        let before = self.probes.len();
        self.probes.retain(|&(_, deadline)| deadline > now);
        for _ in self.probes.len()..before {
            step(phase, T::ProbeLeaseExpired, seen);
        }
    }

    /// Drops window entries that have aged out, and with `ahead` those stamped after now;
    /// returns what they counted.
    fn expire_window(&mut self, now: u64, window_ms: u64, ahead: bool) -> Counts {
        let mut removed = Counts::default();
        while let Some(entry) = self.window.front() {
            if entry.at.saturating_add(window_ms) > now && !(ahead && entry.at > now) {
                break;
            }
            let entry = self.window.pop_front().unwrap_or_else(|| unreachable!());
            removed.add(entry.outcomes.counts());
        }
        removed
    }

    fn state_mut(&mut self) -> &mut State {
        self.state
            .as_mut()
            .unwrap_or_else(|| unreachable!("state checked present"))
    }

    /// When nothing in this store can matter any more (what Redis key TTLs achieve): a closed
    /// state past `closed_until` (or one that does not expire: forgetting it loses nothing
    /// once its window is empty), aged-out window entries and expired probes. Open, half-open
    /// and forced states matter forever.
    pub(crate) fn matters_until(&self, settings: &Settings) -> u64 {
        let state = match &self.state {
            Some(state) if state.phase != Closed => return u64::MAX,
            Some(state) if settings.closed_expires => state.closed_until,
            _ => 0,
        };
        let window = self
            .window
            .back()
            .map_or(0, |entry| entry.at.saturating_add(settings.window_ms));
        let probes = self
            .probes
            .iter()
            .map(|&(_, deadline)| deadline)
            .max()
            .unwrap_or(0);
        state.max(window).max(probes)
    }

    /// The generation of a closed state that cannot expire: the admission needs no clock.
    pub(crate) fn closed_for_good(&self) -> Option<u64> {
        self.state
            .as_ref()
            .filter(|state| state.phase == Closed && state.closed_until == u64::MAX)
            .map(|state| state.generation)
    }

    /// Handles an admission request: see the module's table.
    pub(crate) fn admit(
        &mut self,
        now: u64,
        token: Token,
        settings: &Settings,
        seen: &mut Seen,
    ) -> AdmitReply {
        let Some(state) = self.live_state(now) else {
            step(Closed, T::AdmissionRequested, seen);
            return AdmitReply::Closed {
                generation: 0,
                transitioned: false,
            };
        };
        let (phase, generation) = (state.phase, state.generation);
        let (mut opened_at, forced_until) = (state.opened_at, state.forced_until);
        let lapsed = forced_until != 0 && forced_until <= now;
        // Opened after now: server time stepped back (a failover to a replica whose clock is
        // behind). The open time runs from now, not from when the clock catches up.
        if (phase == Open || phase == ForcedOpen && lapsed)
            && opened_at > now
            && let Some(state) = self.state.as_mut()
        {
            state.opened_at = now;
            opened_at = now;
        }
        let due = opened_at.saturating_add(settings.open_ms);
        match phase {
            Closed => {
                step(Closed, T::AdmissionRequested, seen);
                return AdmitReply::Closed {
                    generation,
                    transitioned: false,
                };
            }
            ForcedClosed if !lapsed => {
                step(ForcedClosed, T::AdmissionRequested, seen);
                return AdmitReply::ForcedClosed {
                    generation,
                    lapses_in_ms: (forced_until != 0).then(|| forced_until - now),
                };
            }
            ForcedClosed => {
                step(ForcedClosed, T::ForcedTimeElapsed, seen);
                let mut closed = State::fresh(Closed, generation);
                closed.closed_until = now.saturating_add(settings.closed_ttl_ms());
                self.state = Some(closed);
                return AdmitReply::Closed {
                    generation,
                    transitioned: true,
                };
            }
            ForcedOpen if !lapsed => {
                step(ForcedOpen, T::AdmissionRequested, seen);
                return AdmitReply::ForcedOpen {
                    generation,
                    retry_after_ms: (forced_until != 0).then(|| forced_until - now),
                };
            }
            Open if now < due => {
                step(Open, T::AdmissionRequested, seen);
                return AdmitReply::Open {
                    generation,
                    retry_after_ms: due - now,
                };
            }
            Open | ForcedOpen => {
                let trigger = if phase == Open {
                    T::OpenTimeElapsed
                } else {
                    T::ForcedTimeElapsed
                };
                step(phase, trigger, seen);
                let mut half_open = State::fresh(HalfOpen, generation);
                half_open.opened_at = opened_at;
                self.state = Some(half_open);
                self.probes.clear();
                return self.take_probe(now, token, settings, true, seen);
            }
            HalfOpen => self.expire_probes(now, HalfOpen, seen),
        }
        self.take_probe(now, token, settings, false, seen)
    }

    /// Admits a half-open call as a probe if a slot is free.
    fn take_probe(
        &mut self,
        now: u64,
        token: Token,
        settings: &Settings,
        transitioned: bool,
        seen: &mut Seen,
    ) -> AdmitReply {
        let generation = self.state_mut().generation;
        if self.probes.len() >= settings.half_open_probes as usize {
            step(HalfOpen, T::ProbeLimitReached, seen);
            return AdmitReply::ProbeLimit { generation };
        }
        step(HalfOpen, T::ProbeAdmitted, seen);
        self.probes
            .push((token, now.saturating_add(settings.probe_lease_ms)));
        AdmitReply::Probe {
            generation,
            transitioned,
        }
    }

    /// Records a batch of closed-state observations admitted under `expected`.
    pub(crate) fn observe(
        &mut self,
        now: u64,
        expected: u64,
        observations: &[Observation],
        mint: u64,
        settings: &Settings,
        seen: &mut Seen,
    ) -> ObserveReply {
        if self.live_state(now).is_none() {
            // The state is gone: surviving window data belongs to a lost epoch, so it is
            // discarded and the new epoch gets a generation no earlier result can carry (data
            // stamped after now survives: its results may still come).
            step(Closed, T::StateLost, seen);
            self.expire_window(now, settings.window_ms, false);
            let generation = if self.window.is_empty() { 0 } else { mint };
            self.window.clear();
            self.probes.clear();
            let mut fresh = State::fresh(Closed, generation);
            fresh.closed_until = now.saturating_add(settings.closed_ttl_ms());
            self.state = Some(fresh);
        }
        let state = self.state_mut();
        if state.phase != Closed || state.generation != expected {
            step(state.phase, T::StaleGeneration, seen);
            return ObserveReply::Stale {
                phase: state.phase,
                generation: state.generation,
            };
        }
        // Entries stamped after now were recorded before server time stepped back (a failover
        // to a replica whose clock is behind): at the head, they would hold every later entry
        // in the window until the clock caught up.
        let aged = self.expire_window(now, settings.window_ms, true);
        let batch = Outcomes::from_slice(observations);
        let state = self.state_mut();
        state.counts.remove(aged);
        state.counts.add(batch.counts());
        // Observations of one millisecond can share an entry: what the window holds, and when,
        // is the same either way (the Lua list keeps one entry per batch).
        let merged = match self.window.back_mut() {
            Some(last) if last.at == now => last.outcomes.append(&batch),
            _ => false,
        };
        if !merged {
            self.window.push_back(Entry {
                at: now,
                outcomes: batch,
            });
        }
        self.trim_window(settings.window_size);
        let state = self.state_mut();
        let window = state.counts;
        if settings.threshold_reached(window) {
            step(Closed, T::ThresholdReached, seen);
            let mut open = State::fresh(Open, state.generation + 1);
            open.opened_at = now;
            let generation = open.generation;
            self.state = Some(open);
            self.window.clear();
            return ObserveReply::Opened { generation, window };
        }
        step(Closed, T::ObservationRecorded, seen);
        state.closed_until = now.saturating_add(settings.closed_ttl_ms());
        ObserveReply::Recorded {
            generation: state.generation,
            window,
        }
    }

    /// Removes the oldest observations beyond `window_size`.
    fn trim_window(&mut self, window_size: u32) {
        let state = self.state.as_mut().unwrap_or_else(|| unreachable!());
        while state.counts.total > window_size {
            let excess = state.counts.total - window_size;
            let Some(front) = self.window.front_mut() else {
                break;
            };
            let removed = front.outcomes.remove_oldest(excess);
            state.counts.remove(removed);
            if front.outcomes.len() == 0 {
                self.window.pop_front();
            }
        }
    }

    /// Settles the probe `token` admitted under `expected`.
    pub(crate) fn settle(
        &mut self,
        now: u64,
        token: Token,
        outcome: ProbeOutcome,
        expected: u64,
        settings: &Settings,
        seen: &mut Seen,
    ) -> SettleReply {
        let Some(state) = self.live_state(now) else {
            step(Closed, T::StaleGeneration, seen);
            return SettleReply::Stale {
                phase: Closed,
                generation: 0,
            };
        };
        let (phase, generation) = (state.phase, state.generation);
        let held = self.probes.iter().position(|&(t, _)| t == token);
        let live = held.is_some_and(|i| self.probes[i].1 > now);
        if let Some(index) = held {
            self.probes.remove(index);
            if !live {
                step(phase, T::ProbeLeaseExpired, seen);
            }
        }
        if !live || phase != HalfOpen || generation != expected {
            step(phase, T::StaleGeneration, seen);
            return SettleReply::Stale { phase, generation };
        }
        match outcome {
            ProbeOutcome::Ignored => {
                step(HalfOpen, T::ProbeIgnored, seen);
                SettleReply::Released { generation }
            }
            ProbeOutcome::Failure => {
                step(HalfOpen, T::ProbeFailure, seen);
                let mut open = State::fresh(Open, generation + 1);
                open.opened_at = now;
                self.state = Some(open);
                self.probes.clear();
                SettleReply::Reopened {
                    generation: generation + 1,
                }
            }
            ProbeOutcome::Success => {
                let state = self.state_mut();
                let successes = state.probe_successes + 1;
                if successes < settings.half_open_successes {
                    step(HalfOpen, T::ProbeSuccess, seen);
                    state.probe_successes = successes;
                    return SettleReply::Counted {
                        generation,
                        successes,
                    };
                }
                step(HalfOpen, T::ProbeSuccessesReached, seen);
                let mut closed = State::fresh(Closed, generation + 1);
                closed.closed_until = now.saturating_add(settings.closed_ttl_ms());
                self.state = Some(closed);
                self.probes.clear();
                self.window.clear();
                SettleReply::Closed {
                    generation: generation + 1,
                }
            }
        }
    }

    /// Carries out an operator's command at `now`: see the module's table.
    pub(crate) fn force(&mut self, now: u64, force: Force, seen: &mut Seen) -> ForceReply {
        let (from, generation) = self
            .live_state(now)
            .map_or((Closed, 0), |state| (state.phase, state.generation));
        let until = |lasts_ms: u64| {
            if lasts_ms == 0 {
                0
            } else {
                now.saturating_add(lasts_ms)
            }
        };
        let (trigger, state) = match force {
            Force::Open { lasts_ms } => (
                T::OperatorOpen,
                State {
                    opened_at: now,
                    forced_until: until(lasts_ms),
                    ..State::fresh(ForcedOpen, generation + 1)
                },
            ),
            Force::Closed { lasts_ms } => (
                T::OperatorClose,
                State {
                    forced_until: until(lasts_ms),
                    ..State::fresh(ForcedClosed, generation + 1)
                },
            ),
            Force::Reset { closed_ttl_ms } => (
                T::OperatorReset,
                State {
                    closed_until: now.saturating_add(closed_ttl_ms),
                    ..State::fresh(Closed, generation + 1)
                },
            ),
        };
        step(from, trigger, seen);
        self.state = Some(state);
        self.window.clear();
        self.probes.clear();
        ForceReply {
            from,
            generation: generation + 1,
        }
    }
}

fn len(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
