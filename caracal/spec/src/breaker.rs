//! `#[circuit_breaker]`: one failure window per identity, fleet-wide.

use core::time::Duration;

pub use crate::SHADOW;
use crate::{AtMost, Default, Derived, Function, Key, Kind, MILLISECOND, Type};

/// The kind.
pub const KIND: Kind = Kind {
    name: "circuit_breaker",
    keys: &[
        MINIMUM_THROUGHPUT,
        FAILURE_THRESHOLD,
        WINDOW_SIZE,
        WINDOW,
        OPEN,
        HALF_OPEN_PROBES,
        HALF_OPEN_SUCCESSES,
        PROBE_LEASE,
        SLOW_CALL,
        SLOW_CALL_THRESHOLD,
        ON_COORDINATOR_ERROR,
        SHADOW,
    ],
    functions: &[CLASSIFY],
    identity: true,
    run_time: true,
    positional: false,
    at_most: &[THROUGHPUT_FITS],
    prioritized: false,
};

/// A threshold: a fraction of the window's observations.
const FRACTION: Type = Type::Float {
    min: 0.001,
    max: 0.999,
    hint: " (a fraction: 0.5 is half the observations)",
};

/// Observations needed before it may open.
pub const MINIMUM_THROUGHPUT: Key = Key {
    name: "minimum_throughput",
    // At most `window_size` too: `THROUGHPUT_FITS`.
    ty: Type::Integer {
        min: 1,
        max: u32::MAX,
    },
    default: Default::Integer(20),
    doc: "observations needed before it may open (at most `window_size`)",
};

/// `minimum_throughput` at most `window_size`: a window that can never hold enough
/// observations never opens.
pub const THROUGHPUT_FITS: AtMost = AtMost {
    key: &MINIMUM_THROUGHPUT,
    limit: &WINDOW_SIZE,
    why: "the breaker could never open",
};

/// The failure rate that opens it.
pub const FAILURE_THRESHOLD: Key = Key {
    name: "failure_threshold",
    ty: FRACTION,
    default: Default::Float(0.5),
    doc: "opens when failures / observations reach this",
};

/// The most observations the window holds.
pub const WINDOW_SIZE: Key = Key {
    name: "window_size",
    ty: Type::Integer {
        min: 1,
        max: 1_000_000,
    },
    default: Default::Integer(100),
    doc: "the window holds at most this many latest observations",
};

/// How long an observation stays in the window.
pub const WINDOW: Key = Key {
    name: "window",
    ty: Type::duration(MILLISECOND),
    // The shortest default window is a minute, so a short `open` still leaves room for enough
    // observations.
    default: Default::Derived(Derived {
        of: "open",
        times: 3,
        at_least: Duration::from_secs(60),
    }),
    doc: "observations older than this leave the window",
};

/// How long it stays open.
pub const OPEN: Key = Key {
    name: "open",
    ty: Type::duration(MILLISECOND),
    default: Default::Duration(Duration::from_secs(30)),
    doc: "how long it stays open before probing",
};

/// Probes at once while half-open.
pub const HALF_OPEN_PROBES: Key = Key {
    name: "half_open_probes",
    ty: Type::Integer {
        min: 1,
        max: 10_000,
    },
    default: Default::Integer(3),
    doc: "concurrent probes allowed fleet-wide while half-open",
};

/// Probe successes that close it.
pub const HALF_OPEN_SUCCESSES: Key = Key {
    name: "half_open_successes",
    ty: Type::Integer {
        min: 1,
        max: 10_000,
    },
    default: Default::Integer(2),
    doc: "probe successes needed to close",
};

/// How long a probe holds its slot.
pub const PROBE_LEASE: Key = Key {
    name: "probe_lease",
    ty: Type::duration(MILLISECOND),
    default: Default::Derived(Derived {
        of: "open",
        times: 2,
        at_least: Duration::ZERO,
    }),
    doc: "a probe that never settles frees its slot after this",
};

/// When a call counts as slow.
pub const SLOW_CALL: Key = Key {
    name: "slow_call",
    ty: Type::duration(MILLISECOND),
    default: Default::Unset,
    doc: "a call that takes longer counts as slow; unset, none does",
};

/// The slow-call rate that opens it.
pub const SLOW_CALL_THRESHOLD: Key = Key {
    name: "slow_call_threshold",
    ty: FRACTION,
    default: Default::Float(0.5),
    doc: "with `slow_call`: opens when slow calls / observations reach this",
};

/// What happens when the coordinator cannot answer.
pub const ON_COORDINATOR_ERROR: Key = Key {
    name: "on_coordinator_error",
    ty: Type::Choice(&["fail_open", "fail_closed"]),
    default: Default::Choice("fail_open"),
    doc: "when the coordinator cannot answer: run the call, or reject it",
};

/// How a result counts.
pub const CLASSIFY: Function = Function {
    name: "classify",
    shape: "fn(&Result<T, E>) -> caracal::Outcome",
    default: "`Ok` success, `Err` failure",
    doc: "how a result counts",
};
