//! The fleet's recent latencies of one identity: each process merges the samples it gathered
//! (a histogram's non-zero buckets, see [`buckets`]) into two rotating windows and hears the
//! merged recent histogram back. Pure; times are milliseconds.
//!
//! Time is cut in windows of `window_ms`; window `epoch` is `[epoch × window_ms, (epoch + 1) ×
//! window_ms)`. Two slots hold the window `now` falls in (the current one, in slot `epoch %
//! 2`) and the one before (in the other slot); a slot holding an older window is stale, what
//! its key's TTL would have removed. Each step answers the sum of the current and previous
//! windows: between one and two windows of the fleet's history, every process's samples
//! counted once (a merged histogram weighs each process by its calls).
//!
//! | condition | branch | effect |
//! |-----------|--------|--------|
//! | no samples to add | [`Read`](Branch::Read) | nothing written |
//! | the current slot holds the current window | [`Added`](Branch::Added) | the samples join it |
//! | it holds an older one | [`Rotated`](Branch::Rotated) | it is emptied for the current window first |
//! | it holds nothing | [`Opened`](Branch::Opened) | it starts with the samples |
//! | the other slot holds the previous window | [`WithPrevious`](Branch::WithPrevious) | the answer adds it |
//! | it holds nothing, or an older one | [`CurrentOnly`](Branch::CurrentOnly) | the answer is the current window's |
//!
//! A slot written expires at the end of the window after its own (past it, it is no longer
//! the previous window). `merge.lua` beside this file is the same step on Redis time.

pub(crate) mod buckets;

use std::collections::BTreeMap;

use self::buckets::BUCKETS;
use crate::kernel::{Kernel, Malformed, Now, Script, Scripted, Seen, Sink, State, Wire};

/// The branches of the table above, in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Branch {
    Read,
    Added,
    Rotated,
    Opened,
    WithPrevious,
    CurrentOnly,
}

impl Branch {
    /// Every branch, indexed as [`Seen`] records them.
    #[cfg(test)]
    pub(crate) const ALL: [Branch; 6] = [
        Branch::Read,
        Branch::Added,
        Branch::Rotated,
        Branch::Opened,
        Branch::WithPrevious,
        Branch::CurrentOnly,
    ];
}

/// One window's samples.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Slot {
    /// Which window it holds.
    pub(crate) epoch: u64,
    /// Its non-zero buckets' counts, by bucket.
    pub(crate) counts: BTreeMap<usize, u64>,
    /// The key's expiry (ms): the end of the window after this one.
    pub(crate) expires_ms: u64,
}

/// An identity's two slots, by `epoch % 2`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Windows {
    pub(crate) slots: [Option<Slot>; 2],
}

impl State for Windows {
    fn forgettable(&self, now: Now) -> bool {
        self.slots
            .iter()
            .flatten()
            .all(|slot| now.ms >= slot.expires_ms)
    }
}

/// Samples to merge, and the windows' width.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// A window's width, in milliseconds (at least 1).
    pub(crate) window_ms: u64,
    /// Non-zero counts by bucket (each below [`BUCKETS`], each once).
    pub(crate) samples: Vec<(usize, u64)>,
}

/// The merged histogram: the count of every bucket, [`BUCKETS`] of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Counts(pub(crate) Vec<u64>);

/// Merging a process's samples as a coordinator command: answers the merged recent histogram.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Merge;

impl Kernel for Merge {
    type State = Windows;
    type Command = Record;
    type Reply = Counts;

    fn step(windows: &mut Windows, record: &Record, now: Now, seen: &mut Seen) -> Counts {
        let epoch = now.ms / record.window_ms;
        let current = (epoch % 2) as usize;
        if record.samples.is_empty() {
            seen.record(Branch::Read as usize);
        } else {
            let slot = match &mut windows.slots[current] {
                Some(slot) if slot.epoch == epoch => {
                    seen.record(Branch::Added as usize);
                    slot
                }
                stored => {
                    let branch = match stored {
                        Some(_) => Branch::Rotated,
                        None => Branch::Opened,
                    };
                    seen.record(branch as usize);
                    stored.insert(Slot {
                        epoch,
                        ..Slot::default()
                    })
                }
            };
            for &(bucket, count) in &record.samples {
                *slot.counts.entry(bucket).or_default() += count;
            }
            slot.expires_ms = (epoch + 2).saturating_mul(record.window_ms);
        }
        let mut counts = vec![0; BUCKETS];
        let mut add = |slot: &Slot| {
            for (&bucket, &count) in &slot.counts {
                counts[bucket] += count;
            }
        };
        if let Some(slot) = windows.slots[current].as_ref().filter(|s| s.epoch == epoch) {
            add(slot);
        }
        match windows.slots[1 - current].as_ref() {
            Some(slot) if slot.epoch + 1 == epoch => {
                seen.record(Branch::WithPrevious as usize);
                add(slot);
            }
            _ => seen.record(Branch::CurrentOnly as usize),
        }
        Counts(counts)
    }
}

static SCRIPT: Script = Script::new("latency merge", &[include_str!("merge.lua")]);

impl Scripted for Merge {
    const SCRIPT: &'static Script = &SCRIPT;
    const KEYS: &'static [&'static str] = &["latency:0", "latency:1"];
    const WIDTH: usize = BUCKETS;

    fn encode(batch: &[&Record], _: &Wire<'_>, sink: &mut dyn Sink) {
        let record = batch[0];
        sink.int(record.window_ms);
        sink.int(BUCKETS as u64);
        for &(bucket, count) in &record.samples {
            sink.int(bucket as u64);
            sink.int(count);
        }
    }

    fn decode(reply: &[i64]) -> Result<Counts, Malformed> {
        reply
            .iter()
            .map(|&count| Malformed::natural("latency count", count))
            .collect::<Result<_, _>>()
            .map(Counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Now {
        Now {
            ms,
            ns: ms * 1_000_000,
            order: ms,
        }
    }

    fn record(samples: &[(usize, u64)]) -> Record {
        Record {
            window_ms: 1_000,
            samples: samples.to_vec(),
        }
    }

    fn nonzero(counts: &Counts) -> Vec<(usize, u64)> {
        counts
            .0
            .iter()
            .enumerate()
            .filter(|&(_, &count)| count > 0)
            .map(|(bucket, &count)| (bucket, count))
            .collect()
    }

    #[test]
    fn the_answer_holds_the_current_and_previous_windows() {
        let mut windows = Windows::default();
        let mut seen = Seen::default();
        let step = |windows: &mut Windows, samples: &[(usize, u64)], ms, seen: &mut Seen| {
            nonzero(&Merge::step(windows, &record(samples), at(ms), seen))
        };
        assert_eq!(
            step(&mut windows, &[(3, 2), (40, 1)], 10_100, &mut seen),
            [(3, 2), (40, 1)]
        );
        assert_eq!(
            step(&mut windows, &[(40, 4)], 10_999, &mut seen),
            [(3, 2), (40, 5)]
        );
        // The next window adds to the previous one's.
        assert_eq!(
            step(&mut windows, &[(7, 1)], 11_000, &mut seen),
            [(3, 2), (7, 1), (40, 5)]
        );
        assert_eq!(
            step(&mut windows, &[], 11_999, &mut seen),
            [(3, 2), (7, 1), (40, 5)]
        );
        // Window 10 leaves; its slot is emptied for window 12.
        assert_eq!(step(&mut windows, &[], 12_000, &mut seen), [(7, 1)]);
        assert_eq!(
            step(&mut windows, &[(9, 1)], 12_001, &mut seen),
            [(7, 1), (9, 1)]
        );
        assert_eq!(
            windows.slots[0].as_ref().map(|s| s.expires_ms),
            Some(14_000)
        );
        // Two windows later, nothing is left.
        assert_eq!(step(&mut windows, &[], 14_000, &mut seen), []);
        assert!(windows.forgettable(at(14_000)));
        assert!(!windows.forgettable(at(13_999)));
        assert!(
            seen.missing(&Branch::ALL).is_empty(),
            "{:?}",
            seen.missing(&Branch::ALL)
        );
    }
}
