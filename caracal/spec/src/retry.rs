//! `#[retry]`: the layers inside it again when an attempt fails.

use core::time::Duration;

use crate::{Default, Function, Key, Kind, Type};

/// The kind.
pub const KIND: Kind = Kind {
    name: "retry",
    keys: &[MAX_ATTEMPTS, BACKOFF, MAX_BACKOFF],
    functions: &[WHEN],
    identity: false,
    run_time: false,
    positional: false,
    at_most: &[],
    prioritized: false,
};

/// Attempts in all.
pub const MAX_ATTEMPTS: Key = Key {
    name: "max_attempts",
    ty: Type::Integer { min: 1, max: 1000 },
    default: Default::Required {
        example: "max_attempts = 3",
    },
    doc: "attempts in all, counting the first",
};

/// The first delay.
pub const BACKOFF: Key = Key {
    name: "backoff",
    ty: Type::duration(Duration::ZERO),
    default: Default::Duration(Duration::ZERO),
    doc: "delay before the second attempt; doubles each attempt, with full jitter",
};

/// The longest delay.
pub const MAX_BACKOFF: Key = Key {
    name: "max_backoff",
    // At least `backoff` too, which the macro checks as a relation between the two.
    ty: Type::duration(Duration::ZERO),
    default: Default::Duration(Duration::from_secs(10)),
    doc: "cap on one delay",
};

/// Which errors are retried.
pub const WHEN: Function = Function {
    name: "when",
    shape: "fn(&E) -> bool",
    default: "every `Err` except caracal's own rejections",
    doc: "retry this error?",
};
