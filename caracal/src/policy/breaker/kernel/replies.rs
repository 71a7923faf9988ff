//! What the breaker's commands answer, and an operator's commands.

use super::Phase::{Closed, HalfOpen, Open};
use super::{Counts, Phase};

/// The answer to an admission request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AdmitReply {
    /// Closed: run the call as an ordinary observation under `generation`. `transitioned` when
    /// this admission ended a forced-closed period.
    Closed { generation: u64, transitioned: bool },
    /// Open: reject; the next probe is possible in `retry_after_ms`.
    Open {
        generation: u64,
        retry_after_ms: u64,
    },
    /// Half-open with every probe slot taken: reject.
    ProbeLimit { generation: u64 },
    /// Admitted as a probe holding a slot under the given token; `transitioned` when this
    /// admission turned the breaker half-open.
    Probe { generation: u64, transitioned: bool },
    /// Forced open by an operator: reject; it lapses in `retry_after_ms`, when it does.
    ForcedOpen {
        generation: u64,
        retry_after_ms: Option<u64>,
    },
    /// Forced closed by an operator: run the call, and record nothing of it; it lapses in
    /// `lapses_in_ms`, when it does.
    ForcedClosed {
        generation: u64,
        lapses_in_ms: Option<u64>,
    },
}

/// The answer to recording a batch of observations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ObserveReply {
    Recorded {
        generation: u64,
        window: Counts,
    },
    /// Opened under `generation`; `window` is what opened it.
    Opened {
        generation: u64,
        window: Counts,
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

/// A change of phase: from which, to which, under which generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Transition {
    pub(crate) from: Phase,
    pub(crate) to: Phase,
    pub(crate) generation: u64,
}

impl ObserveReply {
    /// The change this observation made, and the window that made it.
    pub(crate) fn transition(&self) -> Option<(Transition, Counts)> {
        match *self {
            ObserveReply::Opened { generation, window } => Some((
                Transition {
                    from: Closed,
                    to: Open,
                    generation,
                },
                window,
            )),
            ObserveReply::Recorded { .. } | ObserveReply::Stale { .. } => None,
        }
    }
}

impl SettleReply {
    /// The change this settlement made.
    pub(crate) fn transition(&self) -> Option<Transition> {
        let (to, generation) = match *self {
            SettleReply::Closed { generation } => (Closed, generation),
            SettleReply::Reopened { generation } => (Open, generation),
            _ => return None,
        };
        Some(Transition {
            from: HalfOpen,
            to,
            generation,
        })
    }
}

/// What a probe's call turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeOutcome {
    Success,
    Failure,
    Ignored,
}

/// An operator's command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Force {
    /// Reject every call for `lasts_ms` (0: until a reset).
    Open { lasts_ms: u64 },
    /// Admit every call, recording nothing, for `lasts_ms` (0: until a reset).
    Closed { lasts_ms: u64 },
    /// Closed with an empty window; the closed state lasts `closed_ttl_ms` without
    /// observations (the operator does not know the breaker's window).
    Reset { closed_ttl_ms: u64 },
}

/// The answer to an operator's command: the phase it ended, and the new generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ForceReply {
    pub(crate) from: Phase,
    pub(crate) generation: u64,
}
