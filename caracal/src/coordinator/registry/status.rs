//! How each kind's live state is read for `caracal status`, and what the read finds.

use std::any::{Any, TypeId};
use std::fmt;

use crate::error::Error;
use crate::error::FailureKind;
use crate::script::Script;

/// How a kind's live state is read for `caracal status`: its status script (in `lua/`, by
/// name) and the suffixes of the keys it reads. The kind declares it; the backends answer it
/// without knowing which kind asks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StatusRead {
    /// The script.
    pub(crate) script: &'static Script,
    /// The suffixes of its `KEYS`, in order.
    pub(crate) keys: &'static [&'static str],
    /// How many integers it answers after the server's time.
    pub(crate) figures: usize,
    /// The in-memory backend's form of the read.
    pub(crate) memory: MemoryRead,
}

/// A status read in the in-memory backend: the types of state the kind keeps there (one per
/// key the script reads), and the script's figures from an identity's states of those types
/// (each maybe none), at a time in ms.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MemoryRead {
    pub(crate) states: &'static [fn() -> TypeId],
    pub(crate) figures: fn(&[Found<'_>], u64) -> Vec<i64>,
}

/// One state a [`MemoryRead`] looked for: what the identity holds of that type, if anything.
pub(crate) type Found<'a> = Option<&'a dyn Any>;

/// The `index`th state a [`MemoryRead`] found, as a `T`.
pub(crate) fn found<'a, T: 'static>(states: &[Found<'a>], index: usize) -> Option<&'a T> {
    states.get(index).copied().flatten()?.downcast_ref()
}

/// What an identity's shared state holds now, as its kind's status read answers: the
/// backend's time and the kind's figures, which the kind reads.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Snapshot {
    /// The script that answered, to name in a complaint about its reply.
    pub(crate) script: &'static str,
    pub(crate) now_ms: u64,
    pub(crate) figures: Vec<i64>,
}

impl Snapshot {
    /// What a kind without a status read is given.
    pub(crate) const NOTHING: Snapshot = Snapshot {
        script: "",
        now_ms: 0,
        figures: Vec::new(),
    };

    /// Exactly `N` figures.
    pub(crate) fn figures<const N: usize>(&self) -> Result<[i64; N], Error> {
        <[i64; N]>::try_from(self.figures.as_slice()).map_err(|_| {
            self.malformed(format_args!(
                "{} figures instead of {N}",
                self.figures.len()
            ))
        })
    }

    /// The error of a reply the kind cannot read.
    pub(crate) fn malformed(&self, detail: impl fmt::Display) -> Error {
        Error::unavailable(
            FailureKind::MalformedReply,
            format!("{} replied {detail}", self.script),
        )
    }
}
