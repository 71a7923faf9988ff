//! `#[rate_limit]`: a shared GCRA rate.

use crate::{Default, Key, Kind, Type};
pub use crate::{SHADOW, THRESHOLDS_NORMAL, THRESHOLDS_ORDERED, THRESHOLDS_SHEDDABLE};

/// The kind.
pub const KIND: Kind = Kind {
    name: "rate_limit",
    keys: &[
        RATE,
        BURST,
        PREFETCH,
        SHADOW,
        THRESHOLDS_NORMAL,
        THRESHOLDS_SHEDDABLE,
    ],
    functions: &[],
    identity: true,
    run_time: true,
    positional: false,
    at_most: &[THRESHOLDS_ORDERED],
    prioritized: true,
};

/// Admissions per second.
pub const RATE: Key = Key {
    name: "rate",
    // Below a millionth per second (one admission every ~11.6 days) a rate is a typo.
    ty: Type::Float {
        min: 0.000_001,
        max: 1_000_000.0,
        hint: " (admissions per second)",
    },
    default: Default::Required {
        example: "rate = 10",
    },
    doc: "admissions per second (`0.5` = one per 2 s)",
};

/// Admissions at once after idle time.
pub const BURST: Key = Key {
    name: "burst",
    ty: Type::Integer {
        min: 1,
        max: 1_000_000,
    },
    default: Default::Integer(1),
    doc: "how many may be admitted at once after idle time, fleet-wide",
};

/// Emissions a call that asks the coordinator takes at once, handed to the next callers here.
pub const PREFETCH: Key = Key {
    name: "prefetch",
    ty: Type::Integer { min: 1, max: 1000 },
    default: Default::Integer(1),
    doc: "emissions a call that asks the coordinator takes at once, handed to the next callers \
          here while due; 1, its own only",
};
