//! `#[bulkhead]`: at most `limit` bodies at once per identity.

use core::time::Duration;

use crate::{Default, Key, Kind, MILLISECOND, Type};
pub use crate::{SHADOW, THRESHOLDS_NORMAL, THRESHOLDS_ORDERED, THRESHOLDS_SHEDDABLE};

/// The kind.
pub const KIND: Kind = Kind {
    name: "bulkhead",
    keys: &[
        LIMIT,
        LEASE,
        MAX_WAIT,
        KEEP,
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

/// Bodies allowed at once.
pub const LIMIT: Key = Key {
    name: "limit",
    ty: Type::Integer {
        min: 1,
        max: 1_000_000,
    },
    default: Default::Required {
        example: "limit = 20",
    },
    doc: "bodies allowed at once per identity, across every process",
};

/// The lease's time to live.
pub const LEASE: Key = Key {
    name: "lease",
    // Renewal runs every `lease / 3`: below this a lease is mostly renewal traffic.
    ty: Type::duration(Duration::from_millis(100)),
    default: Default::Duration(Duration::from_secs(30)),
    doc: "the lease's time to live, renewed every third of it while the body runs",
};

/// How long to wait for a slot.
pub const MAX_WAIT: Key = Key {
    name: "max_wait",
    ty: Type::duration(MILLISECOND),
    default: Default::Unset,
    doc: "how long to wait for a slot before rejecting; unset, reject at once",
};

/// How long a process keeps a finished body's lease for its next caller.
pub const KEEP: Key = Key {
    name: "keep",
    ty: Type::duration(MILLISECOND),
    default: Default::Unset,
    doc: "how long a finished body's lease is kept for the next caller here; unset, released at once",
};
