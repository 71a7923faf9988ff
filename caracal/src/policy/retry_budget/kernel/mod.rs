//! A sliding window of deposits and withdrawals, fleet-wide: how many first attempts (deposits)
//! and retries (withdrawals) an identity saw in its last window, kept in buckets so that no
//! step scans more than the window's bucket count. Pure; times are milliseconds.
//!
//! The window is `buckets` buckets of `width` milliseconds; a bucket starts at a multiple of
//! `width`, and the window at `now` holds every bucket that started less than `width ×
//! buckets` before the bucket `now` falls in: between `width × (buckets − 1)` and `width ×
//! buckets` of the latest history. The in-memory coordinator and a process keeping its budget
//! to itself run this on tokio's clock; `window.lua` beside this file is the same step on Redis
//! time.
//!
//! | condition | branch | effect |
//! |-----------|--------|--------|
//! | a stored bucket started a whole window before the current one, or after now (server time that stepped back) | [`Expired`](Branch::Expired) | dropped (before anything else) |
//! | nothing to add | [`Read`](Branch::Read) | nothing written: the totals are read |
//! | the current bucket is stored | [`Joined`](Branch::Joined) | the counts are added to it |
//! | it is not | [`Opened`](Branch::Opened) | a bucket starts with the counts |
//!
//! Every step answers the window's totals after it. Whether a withdrawal may be made is
//! [`allows`], from totals: the budget is `percent`% of the window's deposits plus a floor of
//! `min_per_second` for each of the window's seconds.

use crate::kernel::{Kernel, Malformed, Now, Script, Scripted, Seen, Sink, State, Wire};

/// The branches of the table above, in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Branch {
    Expired,
    Read,
    Joined,
    Opened,
}

impl Branch {
    /// Every branch, indexed as [`Seen`] records them.
    #[cfg(test)]
    pub(crate) const ALL: [Branch; 4] = [
        Branch::Expired,
        Branch::Read,
        Branch::Joined,
        Branch::Opened,
    ];
}

/// The budget's settings: how much a window of `deposits` allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Allowance {
    /// Withdrawals allowed per 100 deposits.
    pub(crate) percent: u32,
    /// Withdrawals allowed per second of the window whatever the deposits.
    pub(crate) min_per_second: u32,
    /// The window, in milliseconds.
    pub(crate) window_ms: u64,
}

impl Allowance {
    /// The withdrawals a window holding `deposits` allows in all.
    pub(crate) fn of(&self, deposits: u64) -> u64 {
        let share = deposits.saturating_mul(u64::from(self.percent)) / 100;
        let floor = u64::from(self.min_per_second).saturating_mul(self.window_ms) / 1000;
        share.saturating_add(floor)
    }
}

/// Whether a window with `totals` allows one more withdrawal.
pub(crate) fn allows(totals: Totals, allowance: &Allowance) -> bool {
    totals.withdrawals < allowance.of(totals.deposits)
}

/// A process's part of the fleet's first attempts, as it last learnt the fleet's window: the
/// part of the floor it spends while it cannot learn the fleet's totals. The parts of every
/// process sum to one (each counts its own first attempts against the same fleet totals), so
/// the fleet's processes on their local shares grant the floor once between them, not once
/// each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Share {
    own: u64,
    fleet: u64,
}

impl Share {
    /// A process that never learnt the fleet's window knows of no other: all of it.
    pub(crate) const WHOLE: Share = Share { own: 1, fleet: 1 };

    /// `own` first attempts of the fleet's `fleet` (at most all of them: this process's own
    /// count can run ahead of the fleet's), or `None` for a fleet window with none, which says
    /// nothing of the parts.
    pub(crate) fn of(own: u64, fleet: u64) -> Option<Share> {
        (fleet > 0).then(|| Share {
            own: own.min(fleet),
            fleet,
        })
    }
}

impl Allowance {
    /// The withdrawals a process on its local share may make in a window where it made `own`
    /// first attempts: `percent`% of them, and its `share` of the floor.
    pub(crate) fn local(&self, own: u64, share: Share) -> u64 {
        let floor = u128::from(self.of(0)) * u128::from(share.own) / u128::from(share.fleet);
        let percent = own.saturating_mul(u64::from(self.percent)) / 100;
        percent.saturating_add(u64::try_from(floor).unwrap_or(u64::MAX))
    }
}

/// Whether a process on its local share, having made the `own` counts in its window, may make
/// one more withdrawal.
pub(crate) fn allows_locally(own: Totals, share: Share, allowance: &Allowance) -> bool {
    own.withdrawals < allowance.local(own.deposits, share)
}

/// How many deposits and withdrawals a window holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    pub(crate) deposits: u64,
    pub(crate) withdrawals: u64,
}

impl Totals {
    /// The larger of each count of these totals and `other`'s.
    pub(crate) fn at_least(self, other: Totals) -> Totals {
        Totals {
            deposits: self.deposits.max(other.deposits),
            withdrawals: self.withdrawals.max(other.withdrawals),
        }
    }

    /// These totals with `other`'s added.
    pub(crate) fn plus(self, other: Totals) -> Totals {
        Totals {
            deposits: self.deposits.saturating_add(other.deposits),
            withdrawals: self.withdrawals.saturating_add(other.withdrawals),
        }
    }
}

/// One bucket: when it started, and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bucket {
    /// Its start, in milliseconds (a multiple of the width it was opened with).
    pub(crate) start: u64,
    pub(crate) counts: Totals,
}

/// An identity's window: its buckets by start, and when its key expires.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) buckets: Vec<Bucket>,
    /// The key's expiry (ms): the end of the window of its newest bucket.
    pub(crate) expires_ms: u64,
}

impl State for Window {
    fn forgettable(&self, now: Now) -> bool {
        self.buckets.is_empty() || now.ms >= self.expires_ms
    }
}

impl Window {
    /// The totals of every bucket held.
    pub(crate) fn totals(&self) -> Totals {
        self.buckets
            .iter()
            .fold(Totals::default(), |sum, bucket| sum.plus(bucket.counts))
    }
}

/// Deposits and withdrawals to add at once, and the window's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) counts: Totals,
    /// A bucket's width, in milliseconds (at least 1).
    pub(crate) width_ms: u64,
    /// Buckets in a window (at least 1).
    pub(crate) buckets: u32,
}

impl Record {
    /// A window of `window_ms`, in [`BUCKETS`] buckets.
    pub(crate) fn new(counts: Totals, window_ms: u64) -> Self {
        Record {
            counts,
            width_ms: window_ms.div_ceil(u64::from(BUCKETS)).max(1),
            buckets: BUCKETS,
        }
    }
}

/// The buckets of a window: the window slides in steps of a tenth of it.
pub(crate) const BUCKETS: u32 = 10;

/// The window as a coordinator command: records counts and answers the totals.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slide;

impl Kernel for Slide {
    type State = Window;
    type Command = Record;
    type Reply = Totals;

    fn step(window: &mut Window, record: &Record, now: Now, seen: &mut Seen) -> Totals {
        let current = now.ms - now.ms % record.width_ms;
        let span = record.width_ms.saturating_mul(u64::from(record.buckets));
        let held = window.buckets.len();
        // A bucket that starts after now was opened before server time stepped back (a
        // failover to a replica whose clock is behind): kept, it would count until the clock
        // caught up. Only such a bucket starts after now, whatever width opened it.
        window
            .buckets
            .retain(|bucket| bucket.start <= now.ms && bucket.start.saturating_add(span) > current);
        if window.buckets.len() < held {
            seen.record(Branch::Expired as usize);
        }
        let counts = record.counts;
        if counts == Totals::default() {
            seen.record(Branch::Read as usize);
        } else {
            match window.buckets.iter_mut().find(|b| b.start == current) {
                Some(bucket) => {
                    seen.record(Branch::Joined as usize);
                    bucket.counts = bucket.counts.plus(counts);
                }
                None => {
                    seen.record(Branch::Opened as usize);
                    let at = window.buckets.partition_point(|b| b.start < current);
                    window.buckets.insert(
                        at,
                        Bucket {
                            start: current,
                            counts,
                        },
                    );
                }
            }
            window.expires_ms = current.saturating_add(span);
        }
        if window.buckets.is_empty() {
            *window = Window::default();
        }
        window.totals()
    }
}

static SCRIPT: Script = Script::new("deposit window", &[include_str!("window.lua")]);

/// The status read: a window's stored totals.
pub(crate) static STATUS: Script = Script::new("window_status", &[include_str!("status.lua")]);

/// What [`STATUS`] answers after the time, from a window in memory (or none).
pub(crate) fn stored_totals(window: Option<&Window>) -> [u64; 2] {
    let totals = window.map(Window::totals).unwrap_or_default();
    [totals.deposits, totals.withdrawals]
}

impl Scripted for Slide {
    const SCRIPT: &'static Script = &SCRIPT;
    const KEYS: &'static [&'static str] = &["window"];
    const WIDTH: usize = 2;

    fn encode(batch: &[&Record], _: &Wire<'_>, sink: &mut dyn Sink) {
        let record = batch[0];
        sink.int(record.counts.deposits);
        sink.int(record.counts.withdrawals);
        sink.int(record.width_ms);
        sink.int(record.buckets.into());
    }

    fn decode(reply: &[i64]) -> Result<Totals, Malformed> {
        Ok(Totals {
            deposits: Malformed::natural("deposits", reply[0])?,
            withdrawals: Malformed::natural("withdrawals", reply[1])?,
        })
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

    fn record(deposits: u64, withdrawals: u64) -> Record {
        Record::new(
            Totals {
                deposits,
                withdrawals,
            },
            1000,
        )
    }

    #[test]
    fn the_window_slides_one_bucket_at_a_time() {
        let mut window = Window::default();
        let mut seen = Seen::default();
        let step =
            |window: &mut Window, r, ms, seen: &mut Seen| Slide::step(window, &r, at(ms), seen);
        assert_eq!(
            step(&mut window, record(5, 1), 1_050, &mut seen).deposits,
            5
        );
        assert_eq!(
            step(&mut window, record(2, 0), 1_099, &mut seen).deposits,
            7
        );
        assert_eq!(
            step(&mut window, record(1, 1), 1_500, &mut seen),
            Totals {
                deposits: 8,
                withdrawals: 2
            }
        );
        // The first two (1 000..1 100) leave once the current bucket starts 1 000 ms later.
        assert_eq!(
            step(&mut window, record(0, 0), 1_999, &mut seen).deposits,
            8
        );
        assert_eq!(
            step(&mut window, record(0, 0), 2_000, &mut seen).deposits,
            1
        );
        assert_eq!(window.expires_ms, 2_500);
        assert_eq!(
            step(&mut window, record(0, 0), 2_500, &mut seen),
            Totals::default()
        );
        assert_eq!(window, Window::default());
        assert!(seen.missing(&Branch::ALL).is_empty());
    }

    /// Buckets opened an hour after now (a failover to a replica whose clock is behind): the
    /// retries they counted leave the window at once, not when the clock catches up.
    #[test]
    fn buckets_that_start_after_now_leave_the_window() {
        const HOUR_MS: u64 = 3_600_000;
        let mut window = Window::default();
        let mut seen = Seen::default();
        Slide::step(&mut window, &record(5, 5), at(HOUR_MS + 1_050), &mut seen);
        assert_eq!(
            Slide::step(&mut window, &record(1, 0), at(1_050), &mut seen),
            Totals {
                deposits: 1,
                withdrawals: 0
            },
            "the buckets after now are gone"
        );
        assert_eq!(window.expires_ms, 2_000);
    }

    #[test]
    fn a_local_share_grants_the_floor_once_across_the_fleet() {
        let allowance = Allowance {
            percent: 20,
            min_per_second: 10,
            window_ms: 10_000,
        };
        // Three processes with 100, 100 and 200 of the fleet's 400 first attempts: the floor
        // of 100 is split 25 + 25 + 50, never granted thrice.
        let parts = [100, 100, 200].map(|own| Share::of(own, 400).expect("a fleet window"));
        let floors: u64 = parts.iter().map(|&part| allowance.local(0, part)).sum();
        assert_eq!(floors, 100);
        // Its own first attempts add their percentage.
        assert_eq!(allowance.local(1_000, parts[2]), 200 + 50);
        assert!(allows_locally(
            Totals {
                deposits: 1_000,
                withdrawals: 249
            },
            parts[2],
            &allowance
        ));
        assert!(!allows_locally(
            Totals {
                deposits: 1_000,
                withdrawals: 250
            },
            parts[2],
            &allowance
        ));
        // A process counting more than the fleet answered holds the whole floor, no more; a
        // fleet window without first attempts tells nothing.
        assert_eq!(allowance.local(0, Share::of(9, 3).expect("some")), 100);
        assert_eq!(allowance.local(0, Share::WHOLE), 100);
        assert_eq!(Share::of(5, 0), None);
    }

    #[test]
    fn the_allowance_is_a_share_of_deposits_plus_a_floor() {
        let allowance = Allowance {
            percent: 20,
            min_per_second: 10,
            window_ms: 10_000,
        };
        assert_eq!(allowance.of(0), 100);
        assert_eq!(allowance.of(1_000), 300);
        assert!(allows(
            Totals {
                deposits: 1_000,
                withdrawals: 299
            },
            &allowance
        ));
        assert!(!allows(
            Totals {
                deposits: 1_000,
                withdrawals: 300
            },
            &allowance
        ));
    }
}
