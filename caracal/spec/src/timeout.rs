//! `#[timeout("2s")]`: a deadline on the layers inside it. Its one key is positional.

use core::time::Duration;

use crate::{Default, Key, Kind, Type};

/// The kind.
pub const KIND: Kind = Kind {
    name: "timeout",
    keys: &[AFTER],
    functions: &[],
    identity: false,
    run_time: false,
    positional: true,
    at_most: &[],
    prioritized: false,
};

/// The deadline.
pub const AFTER: Key = Key {
    name: "after",
    ty: Type::duration(Duration::from_nanos(1)),
    default: Default::Required { example: "\"2s\"" },
    doc: "the deadline, from the start of the call",
};
