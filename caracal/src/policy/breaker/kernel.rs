//! The circuit breaker's state machine: pure, with no clock, no I/O and no randomness (the
//! caller supplies `now` and the value a fresh epoch is minted from).
//!
//! The in-memory coordinator runs this code; `lua/breaker_*.lua` implement the same steps on
//! the same stored layout; a differential property test replays generated command sequences
//! against both and demands identical replies and identical final state.
//!
//! # Transitions
//!
//! | state     | trigger                      | next      | action |
//! |-----------|------------------------------|-----------|--------|
//! | closed    | admission requested          | closed    | admit without a probe slot |
//! | closed    | observation recorded         | closed    | append to the window, keep the state alive for its TTL |
//! | closed    | threshold reached            | open      | new generation, `opened_at = now`, clear the window, never expire |
//! | closed    | state lost                   | closed    | start a fresh epoch (minted generation if window data survived, else 0) |
//! | open      | admission requested          | open      | reject until `opened_at + open` |
//! | open      | open time elapsed            | half-open | clear probes and successes (same generation), then admit a probe |
//! | half-open | probe admitted               | half-open | take a probe slot until `now + probe_lease` |
//! | half-open | probe limit reached          | half-open | reject |
//! | half-open | probe success                | half-open | count it, free its slot |
//! | half-open | probe successes reached      | closed    | new generation, clear window and probes |
//! | half-open | probe failure                | open      | new generation, `opened_at = now`, clear probes |
//! | half-open | probe ignored                | half-open | free its slot, count nothing |
//! | half-open | probe lease expired          | half-open | free its slot; its late result will be stale |
//! | any       | stale generation             | unchanged | drop the result |
//!
//! A result carries the generation it was admitted under. Every change of generation (open,
//! re-open, close) also clears the probe set, and observations count only while closed, so a
//! result admitted under an old generation can never change the state.
//!
//! # Stored layout (the same in Redis)
//!
//! - **state** (`:brk:state` hash): phase, generation, `opened_at`, probe successes, the
//!   window totals, and `closed_until`, past which a closed state counts as absent. Open and
//!   half-open states never expire.
//! - **window** (`:brk:window` list): one entry per recorded batch, `"<at>:<outcomes>"` with
//!   one `s`/`f` character per observation, oldest first. Entries leave by time (`at + window
//!   <= now`) and by count (the oldest observations beyond `window_size`, trimming inside an
//!   entry if need be). The totals in the state make recording O(1) amortised: every
//!   observation is added once and removed once, the window is never scanned.
//! - **probes** (`:brk:probes` sorted set): probe token → lease deadline.
//!
//! Expiry is decided by these stored times, never by key TTLs, which only collect garbage
//! after the fact; that keeps both backends exactly equal under any clock.

/// The kernel's clock off Redis: milliseconds on tokio's clock (so tests can pause it) since
/// the clock was made, plus one, so no time is ever 0.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MsClock(tokio::time::Instant);

impl MsClock {
    pub(crate) fn start() -> Self {
        MsClock(tokio::time::Instant::now())
    }

    pub(crate) fn now(self) -> u64 {
        u64::try_from(self.0.elapsed().as_millis()).unwrap_or(u64::MAX) + 1
    }
}

/// Token of a probe (a UUID).
pub(crate) type Token = u128;

/// The breaker's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Phase {
    Closed,
    Open,
    HalfOpen,
}

impl Phase {
    pub(crate) fn from_code(code: i64) -> Option<Self> {
        match code {
            0 => Some(Phase::Closed),
            1 => Some(Phase::Open),
            2 => Some(Phase::HalfOpen),
            _ => None,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Phase::Closed => "closed",
            Phase::Open => "open",
            Phase::HalfOpen => "half_open",
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
}

use Action as A;
use Phase::{Closed, HalfOpen, Open};
use Trigger as T;

/// The transition table; `None` in the state column means "any state".
pub(crate) const TRANSITIONS: [(Option<Phase>, Trigger, Option<Phase>, Action); 14] = [
    (
        Some(Closed),
        T::AdmissionRequested,
        Some(Closed),
        A::AdmitClosed,
    ),
    (
        Some(Closed),
        T::ObservationRecorded,
        Some(Closed),
        A::Record,
    ),
    (Some(Closed), T::ThresholdReached, Some(Open), A::Open),
    (Some(Closed), T::StateLost, Some(Closed), A::StartEpoch),
    (Some(Open), T::AdmissionRequested, Some(Open), A::RejectOpen),
    (
        Some(Open),
        T::OpenTimeElapsed,
        Some(HalfOpen),
        A::StartProbing,
    ),
    (
        Some(HalfOpen),
        T::ProbeAdmitted,
        Some(HalfOpen),
        A::TakeProbeSlot,
    ),
    (
        Some(HalfOpen),
        T::ProbeLimitReached,
        Some(HalfOpen),
        A::RejectProbe,
    ),
    (
        Some(HalfOpen),
        T::ProbeSuccess,
        Some(HalfOpen),
        A::CountSuccess,
    ),
    (
        Some(HalfOpen),
        T::ProbeSuccessesReached,
        Some(Closed),
        A::Close,
    ),
    (Some(HalfOpen), T::ProbeFailure, Some(Open), A::Reopen),
    (
        Some(HalfOpen),
        T::ProbeIgnored,
        Some(HalfOpen),
        A::FreeProbeSlot,
    ),
    (
        Some(HalfOpen),
        T::ProbeLeaseExpired,
        Some(HalfOpen),
        A::ExpireProbe,
    ),
    (None, T::StaleGeneration, None, A::DropStale),
];

/// Looks `trigger` up for `phase`: the next phase and the action. Every call the kernel makes
/// is a row of the table; `seen` (tests only) records which rows were reached.
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

/// Which table rows a run reached (for the coverage assertion of the differential test).
#[derive(Debug, Default, Clone)]
pub(crate) struct Seen(u32);

impl Seen {
    fn record(&mut self, row: usize) {
        self.0 |= 1 << row;
    }

    /// The rows never reached.
    #[cfg(test)]
    pub(crate) fn missing(&self) -> Vec<(Option<Phase>, Trigger)> {
        TRANSITIONS
            .iter()
            .enumerate()
            .filter(|(i, _)| self.0 & (1 << i) == 0)
            .map(|(_, &(from, trigger, _, _))| (from, trigger))
            .collect()
    }

    #[cfg(test)]
    pub(crate) fn merge(&mut self, other: &Seen) {
        self.0 |= other.0;
    }
}

/// The breaker settings a command carries (every caller passes its own, as with the limit of
/// a bulkhead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Settings {
    pub(crate) minimum_throughput: u32,
    /// The failure threshold in thousandths, 1..=999.
    pub(crate) threshold_permille: u32,
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

    fn threshold_reached(&self, total: u32, failures: u32) -> bool {
        total >= self.minimum_throughput
            && u64::from(failures) * 1000 >= u64::from(self.threshold_permille) * u64::from(total)
    }
}

/// The stored state record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct State {
    pub(crate) phase: Phase,
    pub(crate) generation: u64,
    pub(crate) opened_at: u64,
    pub(crate) probe_successes: u32,
    pub(crate) total: u32,
    pub(crate) failures: u32,
    /// Closed only: when the state stops counting as present. 0 while open or half-open.
    pub(crate) closed_until: u64,
}

/// One recorded batch of the window: when, and each outcome, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) at: u64,
    pub(crate) outcomes: Outcomes,
}

/// A batch's outcomes in order (`true` = failure). Batches of up to 64 — nearly all of them —
/// are a bitmask, so recording an observation allocates nothing.
#[derive(Debug, Clone)]
pub(crate) enum Outcomes {
    /// Bit `i` is the `i`-th oldest outcome.
    Bits {
        bits: u64,
        len: u8,
    },
    Spilled(std::collections::VecDeque<bool>),
}

impl Outcomes {
    pub(crate) fn from_slice(failures: &[bool]) -> Self {
        if failures.len() <= 64 {
            let bits = failures
                .iter()
                .enumerate()
                .fold(0u64, |bits, (i, &failed)| bits | (u64::from(failed) << i));
            Outcomes::Bits {
                bits,
                len: failures.len() as u8,
            }
        } else {
            Outcomes::Spilled(failures.iter().copied().collect())
        }
    }

    pub(crate) fn len(&self) -> u32 {
        match self {
            Outcomes::Bits { len, .. } => u32::from(*len),
            Outcomes::Spilled(outcomes) => len(outcomes.len()),
        }
    }

    pub(crate) fn failures(&self) -> u32 {
        match self {
            Outcomes::Bits { bits, .. } => bits.count_ones(),
            Outcomes::Spilled(outcomes) => len(outcomes.iter().filter(|&&failed| failed).count()),
        }
    }

    /// Removes the `n` oldest outcomes (at most all); returns how many of them were failures.
    fn remove_oldest(&mut self, n: u32) -> u32 {
        match self {
            Outcomes::Bits { bits, len } => {
                let n = n.min(u32::from(*len));
                let removed = if n == 64 {
                    *bits
                } else {
                    *bits & ((1u64 << n) - 1)
                };
                *bits = bits.checked_shr(n).unwrap_or(0);
                *len -= n as u8;
                removed.count_ones()
            }
            Outcomes::Spilled(outcomes) => {
                let n = (n as usize).min(outcomes.len());
                len(outcomes.drain(..n).filter(|&failed| failed).count())
            }
        }
    }

    /// Appends `newer` if both fit in one bitmask; `false` (and nothing changed) otherwise.
    fn append(&mut self, newer: &Outcomes) -> bool {
        match (self, newer) {
            (
                Outcomes::Bits { bits, len },
                Outcomes::Bits {
                    bits: more,
                    len: extra,
                },
            ) if u32::from(*len) + u32::from(*extra) <= 64 => {
                *bits |= more << *len;
                *len += extra;
                true
            }
            _ => false,
        }
    }

    /// The outcomes, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = bool> + '_ {
        (0..self.len()).map(move |i| match self {
            Outcomes::Bits { bits, .. } => bits >> i & 1 == 1,
            Outcomes::Spilled(outcomes) => outcomes[i as usize],
        })
    }
}

impl PartialEq for Outcomes {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Outcomes {}

/// Everything stored for one breaker identity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Store {
    pub(crate) state: Option<State>,
    pub(crate) window: std::collections::VecDeque<Entry>,
    /// Probe token and lease deadline, in insertion order.
    pub(crate) probes: Vec<(Token, u64)>,
}

/// The answer to an admission request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AdmitReply {
    /// Closed: run the call as an ordinary observation under `generation`.
    Closed { generation: u64 },
    /// Open: reject; the next probe is possible in `retry_after_ms`.
    Open {
        generation: u64,
        retry_after_ms: u64,
    },
    /// Half-open with every probe slot taken: reject.
    ProbeLimit { generation: u64 },
    /// Admitted as a probe holding a slot under the given token.
    Probe { generation: u64, transitioned: bool },
}

/// The answer to recording a batch of observations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ObserveReply {
    Recorded {
        generation: u64,
        total: u32,
        failures: u32,
    },
    Opened {
        generation: u64,
        total: u32,
        failures: u32,
    },
    Stale {
        phase: Phase,
        generation: u64,
    },
}

/// The answer to settling a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SettleReply {
    /// The probe no longer counts (expired, superseded, or the state moved on).
    Stale { phase: Phase, generation: u64 },
    /// An ignored outcome: the slot is free, nothing counted.
    Released { generation: u64 },
    /// A success, not yet enough to close.
    Counted { generation: u64, successes: u32 },
    /// The breaker closed under a new generation.
    Closed { generation: u64 },
    /// The breaker re-opened under a new generation.
    Reopened { generation: u64 },
}

/// What a probe's call turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeOutcome {
    Success,
    Failure,
    Ignored,
}

impl Store {
    /// The live state at `now`: a closed state past `closed_until` counts as absent.
    fn live_state(&self, now: u64) -> Option<&State> {
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

    /// Drops window entries that have aged out.
    fn expire_window(&mut self, now: u64, window_ms: u64) -> (u32, u32) {
        let mut removed = (0, 0);
        while let Some(entry) = self.window.front() {
            if entry.at.saturating_add(window_ms) > now {
                break;
            }
            let entry = self.window.pop_front().unwrap_or_else(|| unreachable!());
            removed.0 += entry.outcomes.len();
            removed.1 += entry.outcomes.failures();
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
    /// once its window is empty), aged-out window entries and expired probes. Open and
    /// half-open states matter forever.
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
            return AdmitReply::Closed { generation: 0 };
        };
        let (phase, generation, opened_at) = (state.phase, state.generation, state.opened_at);
        let mut transitioned = false;
        match phase {
            Closed => {
                step(Closed, T::AdmissionRequested, seen);
                return AdmitReply::Closed { generation };
            }
            Open => {
                let due = opened_at.saturating_add(settings.open_ms);
                if now < due {
                    step(Open, T::AdmissionRequested, seen);
                    return AdmitReply::Open {
                        generation,
                        retry_after_ms: due - now,
                    };
                }
                let (next, _) = step(Open, T::OpenTimeElapsed, seen);
                let state = self.state_mut();
                state.phase = next;
                state.probe_successes = 0;
                self.probes.clear();
                transitioned = true;
            }
            HalfOpen => self.expire_probes(now, HalfOpen, seen),
        }
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
        failures: &[bool],
        mint: u64,
        settings: &Settings,
        seen: &mut Seen,
    ) -> ObserveReply {
        if self.live_state(now).is_none() {
            // The state is gone: surviving window data belongs to a lost epoch, so it is
            // discarded and the new epoch gets a generation no earlier result can carry.
            step(Closed, T::StateLost, seen);
            self.expire_window(now, settings.window_ms);
            let generation = if self.window.is_empty() { 0 } else { mint };
            self.window.clear();
            self.probes.clear();
            self.state = Some(State {
                phase: Closed,
                generation,
                opened_at: 0,
                probe_successes: 0,
                total: 0,
                failures: 0,
                closed_until: now.saturating_add(settings.closed_ttl_ms()),
            });
        }
        let state = self.state_mut();
        if state.phase != Closed || state.generation != expected {
            step(state.phase, T::StaleGeneration, seen);
            return ObserveReply::Stale {
                phase: state.phase,
                generation: state.generation,
            };
        }
        let (aged, aged_failures) = self.expire_window(now, settings.window_ms);
        let state = self.state_mut();
        state.total -= aged;
        state.failures -= aged_failures;
        let batch = Outcomes::from_slice(failures);
        state.total += batch.len();
        state.failures += batch.failures();
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
        let (total, failed) = (state.total, state.failures);
        if settings.threshold_reached(total, failed) {
            step(Closed, T::ThresholdReached, seen);
            state.phase = Open;
            state.generation += 1;
            state.opened_at = now;
            state.probe_successes = 0;
            state.total = 0;
            state.failures = 0;
            state.closed_until = 0;
            let generation = state.generation;
            self.window.clear();
            return ObserveReply::Opened {
                generation,
                total,
                failures: failed,
            };
        }
        step(Closed, T::ObservationRecorded, seen);
        state.closed_until = now.saturating_add(settings.closed_ttl_ms());
        ObserveReply::Recorded {
            generation: state.generation,
            total,
            failures: failed,
        }
    }

    /// Removes the oldest observations beyond `window_size`.
    fn trim_window(&mut self, window_size: u32) {
        let state = self.state.as_mut().unwrap_or_else(|| unreachable!());
        while state.total > window_size {
            let excess = state.total - window_size;
            let Some(front) = self.window.front_mut() else {
                break;
            };
            let take = excess.min(front.outcomes.len());
            state.failures -= front.outcomes.remove_oldest(take);
            state.total -= take;
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
                let state = self.state_mut();
                state.phase = Open;
                state.generation += 1;
                state.opened_at = now;
                state.probe_successes = 0;
                let generation = state.generation;
                self.probes.clear();
                SettleReply::Reopened { generation }
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
                state.phase = Closed;
                state.generation += 1;
                state.opened_at = 0;
                state.probe_successes = 0;
                state.total = 0;
                state.failures = 0;
                state.closed_until = now.saturating_add(settings.closed_ttl_ms());
                let generation = state.generation;
                self.probes.clear();
                self.window.clear();
                SettleReply::Closed { generation }
            }
        }
    }
}

fn len(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTINGS: Settings = Settings {
        minimum_throughput: 4,
        threshold_permille: 500,
        window_size: 10,
        window_ms: 1_000,
        open_ms: 100,
        half_open_probes: 2,
        half_open_successes: 2,
        probe_lease_ms: 50,
        closed_expires: true,
    };

    fn observe(store: &mut Store, now: u64, generation: u64, outcomes: &str) -> ObserveReply {
        let failures: Vec<bool> = outcomes.chars().map(|c| c == 'f').collect();
        store.observe(
            now,
            generation,
            &failures,
            77,
            &SETTINGS,
            &mut Seen::default(),
        )
    }

    fn admit(store: &mut Store, now: u64, token: Token) -> AdmitReply {
        store.admit(now, token, &SETTINGS, &mut Seen::default())
    }

    fn settle(
        store: &mut Store,
        now: u64,
        token: Token,
        outcome: ProbeOutcome,
        generation: u64,
    ) -> SettleReply {
        store.settle(
            now,
            token,
            outcome,
            generation,
            &SETTINGS,
            &mut Seen::default(),
        )
    }

    #[test]
    fn opens_exactly_at_the_threshold_once_throughput_is_reached() {
        let mut store = Store::default();
        assert_eq!(
            admit(&mut store, 0, 1),
            AdmitReply::Closed { generation: 0 }
        );
        assert_eq!(
            observe(&mut store, 1, 0, "fff"),
            ObserveReply::Recorded {
                generation: 0,
                total: 3,
                failures: 3
            }
        );
        assert_eq!(
            observe(&mut store, 2, 0, "s"),
            ObserveReply::Opened {
                generation: 1,
                total: 4,
                failures: 3
            }
        );
        assert_eq!(
            admit(&mut store, 50, 1),
            AdmitReply::Open {
                generation: 1,
                retry_after_ms: 52
            }
        );
    }

    #[test]
    fn a_window_bounded_by_count_and_time_is_kept_in_totals() {
        let mut store = Store::default();
        observe(&mut store, 0, 0, "sss");
        observe(&mut store, 10, 0, "sssss");
        observe(&mut store, 10, 0, "ss");
        // 3 more push out the 3 oldest, trimming inside the second entry.
        assert_eq!(
            observe(&mut store, 20, 0, "ssf"),
            ObserveReply::Recorded {
                generation: 0,
                total: 10,
                failures: 1
            }
        );
        assert_eq!(
            store.window.len(),
            2,
            "the two batches of ms 10 share an entry"
        );
        // Past the window, only the newest batch remains.
        assert_eq!(
            observe(&mut store, 1_015, 0, "s"),
            ObserveReply::Recorded {
                generation: 0,
                total: 4,
                failures: 1
            }
        );
    }

    #[test]
    fn probes_are_bounded_then_close_the_breaker() {
        let mut store = Store::default();
        observe(&mut store, 0, 0, "ffff");
        assert_eq!(
            admit(&mut store, 100, 1),
            AdmitReply::Probe {
                generation: 1,
                transitioned: true
            }
        );
        assert_eq!(
            admit(&mut store, 101, 2),
            AdmitReply::Probe {
                generation: 1,
                transitioned: false
            }
        );
        assert_eq!(
            admit(&mut store, 102, 3),
            AdmitReply::ProbeLimit { generation: 1 }
        );
        assert_eq!(
            settle(&mut store, 103, 1, ProbeOutcome::Success, 1),
            SettleReply::Counted {
                generation: 1,
                successes: 1
            }
        );
        assert_eq!(
            settle(&mut store, 104, 2, ProbeOutcome::Success, 1),
            SettleReply::Closed { generation: 2 }
        );
        assert_eq!(
            admit(&mut store, 105, 4),
            AdmitReply::Closed { generation: 2 }
        );
    }

    #[test]
    fn a_probe_failure_reopens_and_supersedes_other_probes() {
        let mut store = Store::default();
        observe(&mut store, 0, 0, "ffff");
        admit(&mut store, 100, 1);
        admit(&mut store, 100, 2);
        assert_eq!(
            settle(&mut store, 110, 1, ProbeOutcome::Failure, 1),
            SettleReply::Reopened { generation: 2 }
        );
        assert_eq!(
            settle(&mut store, 111, 2, ProbeOutcome::Success, 1),
            SettleReply::Stale {
                phase: Phase::Open,
                generation: 2
            }
        );
    }

    #[test]
    fn an_expired_probe_frees_its_slot_and_its_result_is_stale() {
        let mut store = Store::default();
        observe(&mut store, 0, 0, "ffff");
        admit(&mut store, 100, 1);
        admit(&mut store, 100, 2);
        assert_eq!(
            admit(&mut store, 150, 3),
            AdmitReply::Probe {
                generation: 1,
                transitioned: false
            }
        );
        assert_eq!(
            settle(&mut store, 151, 1, ProbeOutcome::Success, 1),
            SettleReply::Stale {
                phase: Phase::HalfOpen,
                generation: 1
            }
        );
    }

    #[test]
    fn ignored_probes_free_the_slot_without_advancing_recovery() {
        let mut store = Store::default();
        observe(&mut store, 0, 0, "ffff");
        admit(&mut store, 100, 1);
        assert_eq!(
            settle(&mut store, 101, 1, ProbeOutcome::Ignored, 1),
            SettleReply::Released { generation: 1 }
        );
        assert_eq!(store.state.as_ref().map(|s| s.probe_successes), Some(0));
        assert!(store.probes.is_empty());
    }

    #[test]
    fn results_of_an_old_generation_change_nothing() {
        let mut store = Store::default();
        observe(&mut store, 0, 0, "ffff");
        let before = store.clone();
        assert_eq!(
            observe(&mut store, 1, 0, "ffff"),
            ObserveReply::Stale {
                phase: Phase::Open,
                generation: 1
            }
        );
        assert_eq!(store, before);
    }

    #[test]
    fn a_lost_state_starts_a_fresh_epoch_that_fences_earlier_results() {
        let mut store = Store::default();
        observe(&mut store, 0, 0, "sss");
        store.state = None;
        // Window data survived the state: the new epoch gets the minted generation, and the
        // result admitted before the loss (generation 0) is stale.
        assert_eq!(
            observe(&mut store, 1, 0, "f"),
            ObserveReply::Stale {
                phase: Phase::Closed,
                generation: 77
            }
        );
        assert!(store.window.is_empty());
        assert_eq!(
            observe(&mut store, 2, 77, "f"),
            ObserveReply::Recorded {
                generation: 77,
                total: 1,
                failures: 1
            }
        );
    }

    #[test]
    fn a_closed_state_expires_no_earlier_than_its_window() {
        let mut store = Store::default();
        observe(&mut store, 0, 0, "s");
        let until = store.state.as_ref().map(|s| s.closed_until);
        assert_eq!(until, Some(SETTINGS.closed_ttl_ms()));
        assert!(SETTINGS.closed_ttl_ms() >= SETTINGS.window_ms);
        assert_eq!(
            admit(&mut store, SETTINGS.closed_ttl_ms() - 1, 1),
            AdmitReply::Closed { generation: 0 }
        );
        assert!(store.live_state(SETTINGS.closed_ttl_ms()).is_none());
    }

    #[test]
    fn open_and_half_open_never_expire() {
        let mut store = Store::default();
        observe(&mut store, 0, 0, "ffff");
        assert!(store.live_state(u64::MAX / 2).is_some());
    }
}
