//! `#[retry_budget]`: a fleet-wide retry budget.

use core::time::Duration;

pub use crate::SHADOW;
use crate::{Default, Key, Kind, Type};

/// The kind.
pub const KIND: Kind = Kind {
    name: "retry_budget",
    keys: &[PERCENT, MIN_PER_SECOND, WINDOW, SHADOW],
    functions: &[],
    identity: true,
    run_time: true,
    positional: false,
    at_most: &[],
    prioritized: false,
};

/// Retries per 100 first attempts.
pub const PERCENT: Key = Key {
    name: "percent",
    // Past 1000 (ten retries per call) a budget budgets nothing a `max_attempts` does not.
    ty: Type::Integer { min: 0, max: 1000 },
    default: Default::Integer(20),
    doc: "retries allowed per 100 first attempts in the window, fleet-wide",
};

/// Retries per second whatever the traffic.
pub const MIN_PER_SECOND: Key = Key {
    name: "min_per_second",
    ty: Type::Integer {
        min: 0,
        max: 1_000_000,
    },
    default: Default::Integer(10),
    doc: "retries allowed per second of the window on top of the percentage, fleet-wide",
};

/// How far back deposits and withdrawals count.
pub const WINDOW: Key = Key {
    name: "window",
    // It slides by tenths: below a second a tenth is shorter than a batch of counts.
    ty: Type::Duration {
        min: Duration::from_secs(1),
        max: Duration::from_secs(3600),
    },
    default: Default::Duration(Duration::from_secs(10)),
    doc: "how far back first attempts and retries count (it slides by tenths)",
};
