//! `#[hedge]`: another attempt beside a slow one, the first `Ok` taken.

use core::time::Duration;

use crate::{DAY, Default, Key, Kind, MILLISECOND, Type};

/// The kind.
pub const KIND: Kind = Kind {
    name: "hedge",
    keys: &[DELAY, MAX_EXTRA, MIN_DELAY, MAX_DELAY, BUDGET],
    functions: &[],
    identity: true,
    run_time: false,
    positional: false,
    at_most: &[DELAYS_ORDERED],
    prioritized: false,
};

/// How long an attempt goes unanswered before the next starts beside it.
pub const DELAY: Key = Key {
    name: "delay",
    // Or a fleet percentile, `p50`…`p99`, which the macro reads before the duration.
    ty: Type::duration(MILLISECOND),
    default: Default::Required {
        example: "delay = \"50ms\"",
    },
    doc: "wait this long for an answer before the next attempt (a duration, or `p50`…`p99` of the fleet's latency)",
};

/// The smallest fleet percentile `delay` may name, `p50`.
pub const MIN_PERCENTILE: u16 = 50;

/// The largest fleet percentile `delay` may name, `p99`.
pub const MAX_PERCENTILE: u16 = 99;

/// Extra attempts at most.
pub const MAX_EXTRA: Key = Key {
    name: "max_extra",
    // Past three a call's load is quadrupled: a hedge is for the tail, not for throughput.
    ty: Type::Integer { min: 1, max: 3 },
    default: Default::Integer(1),
    doc: "extra attempts at most, each `delay` after the one before",
};

/// The floor of a percentile delay.
pub const MIN_DELAY: Key = Key {
    name: "min_delay",
    ty: Type::Duration {
        min: MILLISECOND,
        max: DAY,
    },
    default: Default::Duration(Duration::from_millis(1)),
    doc: "the shortest a percentile `delay` is",
};

/// The ceiling of a percentile delay, and its value until the fleet knows the percentile.
pub const MAX_DELAY: Key = Key {
    name: "max_delay",
    ty: Type::Duration {
        min: MILLISECOND,
        max: DAY,
    },
    default: Default::Duration(Duration::from_secs(1)),
    doc: "the longest a percentile `delay` is, and the delay until the fleet has seen enough calls to know it",
};

/// The retry budget extra attempts withdraw from.
pub const BUDGET: Key = Key {
    name: "budget",
    ty: Type::Name,
    default: Default::Unset,
    doc: "the `#[retry_budget]` name each extra attempt withdraws from; without it only `max_extra` bounds hedges",
};

/// `min_delay` at most `max_delay`.
pub const DELAYS_ORDERED: crate::AtMost = crate::AtMost {
    key: &MIN_DELAY,
    limit: &MAX_DELAY,
    why: "a percentile delay could be no duration at all",
};
