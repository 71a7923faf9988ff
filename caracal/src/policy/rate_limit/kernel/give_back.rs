//! Giving back emissions a process took ahead ([`decide`](super::decide)) and will not hand out: a
//! compare-and-set on the TAT. Only while the TAT is still the one the take left (no emission was
//! taken since, by anyone) does it move back by those emissions' intervals, which leaves the cell
//! exactly as if they had never been taken; otherwise nothing changes and they expire unused.
//! `give_back.lua` beside this file is the same step on Redis time.

use super::{Cell, PRELUDE};
use crate::kernel::{Kernel, Malformed, Now, Script, Scripted, Seen, Sink, Wire};

/// The give-back as a coordinator command.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GiveBack;

/// The last `count` emissions of a take that left the TAT at `tat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unused {
    /// The emission interval of the take, in nanoseconds.
    pub(crate) interval: u64,
    pub(crate) count: u32,
    pub(crate) tat: u64,
}

/// The branches of a give-back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Branch {
    /// The TAT moved back, still ahead of now.
    Returned,
    /// The TAT moved back to now or before: the cell is idle (its key goes).
    ReturnedIdle,
    /// The TAT is not the one the take left: nothing changes.
    Moved,
}

impl Branch {
    /// Every branch, indexed as [`Seen`] records them.
    #[cfg(test)]
    pub(crate) const ALL: [Branch; 3] = [Branch::Returned, Branch::ReturnedIdle, Branch::Moved];
}

impl Kernel for GiveBack {
    type State = Cell;
    type Command = Unused;
    /// Whether the emissions went back.
    type Reply = bool;

    fn step(cell: &mut Cell, unused: &Unused, now: Now, seen: &mut Seen) -> bool {
        if cell.0 != Some(unused.tat) {
            seen.record(Branch::Moved as usize);
            return false;
        }
        let back = unused
            .tat
            .saturating_sub(unused.interval.saturating_mul(unused.count.into()));
        let idle = back <= now.ns;
        seen.record(if idle {
            Branch::ReturnedIdle
        } else {
            Branch::Returned
        } as usize);
        cell.0 = (!idle).then_some(back);
        true
    }
}

static SCRIPT: Script = Script::new(
    "rate limit give-back",
    &[PRELUDE, include_str!("give_back.lua")],
);

impl Scripted for GiveBack {
    const SCRIPT: &'static Script = &SCRIPT;
    const KEYS: &'static [&'static str] = &["rate:ns"];
    const WIDTH: usize = 1;

    fn encode(batch: &[&Unused], _: &Wire<'_>, sink: &mut dyn Sink) {
        let unused = batch[0];
        sink.int(unused.interval);
        sink.int(unused.count.into());
        sink.int(unused.tat / 1_000_000_000);
        sink.int(unused.tat % 1_000_000_000);
    }

    fn decode(reply: &[i64]) -> Result<bool, Malformed> {
        Malformed::flag(reply[0])
    }
}
