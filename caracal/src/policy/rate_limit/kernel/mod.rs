//! The generic cell rate algorithm: one admission per `interval` on average, up to `burst` at
//! once after idle time. Pure; times are nanoseconds.
//!
//! The only state is the cell's theoretical arrival time (TAT). The local limiter and the
//! in-memory coordinator run this on tokio's clock; `admit.lua` beside this file is the same decision
//! on Redis time (sent after `prelude.lua`, as `give_back.lua` is, the [`give_back`] kernel's).
//!
//! An arrival carries its priority class's share of the burst, in thousandths
//! ([`crate::priority::Thresholds`]). The burst in use at an arrival is
//! `ceil((TAT − now) / interval)` (0 when the TAT is not after now); a class whose `cap` is
//! `ceil(burst × share / 1000)` ([`crate::priority::cap`]) is admitted only while that use is
//! below its cap, that is while the TAT is ahead of now by at most `interval × (cap − 1)`. A
//! whole share (a `Critical` call, or any call without thresholds) has `cap = burst`: the rule
//! as it was before priorities.
//!
//! | condition | branch | reply |
//! |-----------|--------|-------|
//! | TAT absent or not after now | [`Idle`](Branch::Idle) | admitted; TAT = now + interval |
//! | TAT ahead of now by at most `interval × (cap − 1)` | [`Burst`](Branch::Burst) | admitted; TAT moves one interval on |
//! | TAT further ahead, by at most `interval × (burst − 1)` | [`AboveShare`](Branch::AboveShare) | rejected with the wait until its class would not be: the rest of the burst is kept for higher classes |
//! | TAT further ahead | [`Rejected`](Branch::Rejected) | rejected with the wait until it would not be |
//!
//! Arrivals decided together (a batch) go the highest share first, arrivals of one share in
//! their order ([`crate::priority::highest_share_first`]).
//!
//! An admitted arrival may take more than its own emission (prefetch, [`decide`]): up to
//! `take − 1` more, each admitted now by the rule above exactly as that many arrivals at the same
//! instant would be, and only while the burst allows (the first refusal stops it, charging
//! nothing). In a batch every arrival's own emission is decided first, and only then the extras,
//! so taking more never refuses an arrival that a take of one would admit. An arrival's extras
//! are consecutive slots: extra `j` (from 1) has the slot that starts `extra + 1 − j` intervals
//! before the TAT it left; its process may hand it out only until that slot starts (see
//! `policy::rate_limit::prefetch`), so the admissions stay those of a GCRA.

pub(crate) mod give_back;

use crate::kernel::{Kernel, Malformed, Now, Script, Scripted, Seen, Sink, State, Wire};
use crate::priority;

/// The emission interval in nanoseconds for `rate` admissions per second: rounded up, so the
/// limiter never admits more than asked (700/s is 1 428 572 ns, not 1 ms).
pub(crate) fn interval_ns(rate: f64) -> u64 {
    (1e9 / rate).ceil().clamp(1.0, u64::MAX as f64) as u64
}

/// The branches of the table above, in its order, then those of a take of more than one
/// ([`decide`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Branch {
    Idle,
    Burst,
    AboveShare,
    Rejected,
    /// A take got every emission it asked for.
    TookAll,
    /// A take got fewer than it asked for: the burst ran out.
    TookFewer,
}

impl Branch {
    /// Every branch, indexed as [`Seen`] records them.
    #[cfg(test)]
    pub(crate) const ALL: [Branch; 6] = [
        Branch::Idle,
        Branch::Burst,
        Branch::AboveShare,
        Branch::Rejected,
        Branch::TookAll,
        Branch::TookFewer,
    ];
}

/// Decides one arrival at `now` given the stored TAT, for a class that may use `share`
/// thousandths of the burst: `Ok` with the new TAT when admitted, `Err` with the wait (> 0)
/// until an admission of its class is possible otherwise.
pub(crate) fn admit(
    tat: Option<u64>,
    now: u64,
    interval: u64,
    (burst, share): (u32, u16),
    seen: &mut Seen,
) -> Result<u64, u64> {
    let delay = |most: u32| interval.saturating_mul(u64::from(most.saturating_sub(1)));
    let class_delay = delay(priority::cap(burst, share));
    let anchor = tat.map_or(now, |tat| tat.max(now));
    let ahead = anchor - now;
    let branch = if ahead > delay(burst) {
        Branch::Rejected
    } else if ahead > class_delay {
        Branch::AboveShare
    } else if ahead == 0 {
        Branch::Idle
    } else {
        Branch::Burst
    };
    seen.record(branch as usize);
    if ahead > class_delay {
        Err(ahead - class_delay)
    } else {
        Ok(anchor.saturating_add(interval))
    }
}

/// What an admitted arrival took: its own emission and `extra` more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    /// The emissions taken beyond the arrival's own, for its process to hand out.
    pub(crate) extra: u32,
    /// How far (ns) the TAT it left is ahead of the step's now: the slot of extra `j` (from 1)
    /// starts `ahead − (extra + 1 − j) × interval` after now; the arrival's own slot starts no
    /// later than `ahead − (extra + 1) × interval`.
    pub(crate) ahead: u64,
    /// The TAT it left (after its last extra): what a [`give_back`] of its unused emissions
    /// expects to find.
    pub(crate) tat: u64,
}

impl Taken {
    /// Whether a reply to an arrival that took up to `take` emissions `interval` apart can be
    /// the script's: fewer than `take` extra, each slot starting after the step's now. One
    /// that cannot came from elsewhere (a corrupt reply) and is not held: its `extra + 1`
    /// would overflow, or its slots would have started already.
    pub(crate) fn fits(&self, take: u32, interval: u64) -> bool {
        self.extra < take
            && u64::from(self.extra + 1)
                .checked_mul(interval)
                .is_some_and(|slots| self.ahead >= slots)
    }
}

/// Decides a batch of arrivals at one cell at `now` (one script call), each taking up to its
/// `take` emissions (see the module's doc); arrivals that share a batch share their settings
/// ([`Gcra::batches_with`]). Every arrival's own emission is decided first, the highest share
/// first, exactly as with a take of one; then each admitted arrival, in the same order, takes
/// its extras from what the burst still allows. So taking more never refuses an arrival of the
/// same batch that a take of one would admit. Per arrival, in the batch's order: `Err` with the
/// wait as [`admit`] when its own is refused, else what it took.
// The script's twin: Redis runs the script and the in-memory coordinator never batches (its
// `step` is a batch of one), so only the differential and the tests call it.
#[cfg_attr(not(test), expect(dead_code))]
pub(crate) fn decide(
    cell: &mut Cell,
    batch: &[&Arrival],
    now: u64,
    seen: &mut Seen,
) -> Vec<Result<Taken, u64>> {
    debug_assert!(
        batch
            .iter()
            .all(|arrival| Gcra::batches_with(batch[0], arrival)),
        "a batch shares its settings"
    );
    let order = priority::highest_share_first(batch.iter().map(|arrival| arrival.share));
    let mut replies = vec![Err(0); batch.len()];
    for &i in &order {
        replies[i] = own(cell, batch[i], now, seen);
    }
    for &i in &order {
        if let Ok(taken) = &mut replies[i] {
            extras(cell, taken, batch[i], now, seen);
        }
    }
    replies
}

/// An arrival's own emission ([`decide`]'s first pass): what it took, before any extra.
fn own(cell: &mut Cell, arrival: &Arrival, now: u64, seen: &mut Seen) -> Result<Taken, u64> {
    let terms = (arrival.burst, arrival.share);
    admit(cell.0, now, arrival.interval, terms, seen).map(|tat| {
        cell.0 = Some(tat);
        Taken {
            extra: 0,
            ahead: tat - now,
            tat,
        }
    })
}

/// An admitted arrival's extras ([`decide`]'s second pass), added to what it `taken`: up to
/// `take − 1`, while the burst allows.
fn extras(cell: &mut Cell, taken: &mut Taken, arrival: &Arrival, now: u64, seen: &mut Seen) {
    let terms = (arrival.burst, arrival.share);
    while taken.extra + 1 < arrival.take {
        let Ok(tat) = admit(cell.0, now, arrival.interval, terms, &mut Seen::default()) else {
            break;
        };
        cell.0 = Some(tat);
        *taken = Taken {
            extra: taken.extra + 1,
            ahead: tat - now,
            tat,
        };
    }
    if arrival.take > 1 {
        seen.record(if taken.extra + 1 == arrival.take {
            Branch::TookAll
        } else {
            Branch::TookFewer
        } as usize);
    }
}

/// The GCRA as a coordinator command: one arrival at an identity's cell.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gcra;

/// One arrival: the settings of its call site, and its class's share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Arrival {
    /// The emission interval, in nanoseconds.
    pub(crate) interval: u64,
    pub(crate) burst: u32,
    /// The caller's class's share of the burst, in thousandths (1000: the whole burst). An
    /// arrival's own: arrivals of different classes share a batch.
    pub(crate) share: u16,
    /// How many emissions it takes if admitted (1: its own; more: prefetch, see [`decide`]).
    pub(crate) take: u32,
}

/// A cell's theoretical arrival time (ns), if it has one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Cell(pub(crate) Option<u64>);

impl State for Cell {
    /// Its key expires at the TAT: past it, the cell cannot change any decision.
    fn forgettable(&self, now: Now) -> bool {
        self.0.is_none_or(|tat| tat <= now.ns)
    }
}

impl Kernel for Gcra {
    type State = Cell;
    type Command = Arrival;
    /// Admitted (and charged) with what it took, or the wait (ns) until an admission is
    /// possible.
    type Reply = Result<Taken, u64>;

    /// A batch of one ([`decide`], without its allocation): the in-memory coordinator decides
    /// each arrival on its own.
    fn step(cell: &mut Cell, arrival: &Arrival, now: Now, seen: &mut Seen) -> Self::Reply {
        let mut reply = own(cell, arrival, now.ns, seen);
        if let Ok(taken) = &mut reply {
            extras(cell, taken, arrival, now.ns, seen);
        }
        reply
    }
}

/// What every rate limit script is sent after: the clock, the stored TAT, the helpers.
const PRELUDE: &str = include_str!("prelude.lua");

static SCRIPT: Script = Script::new(
    "rate limit admission",
    &[PRELUDE, include_str!("admit.lua")],
);

impl Scripted for Gcra {
    const SCRIPT: &'static Script = &SCRIPT;
    const KEYS: &'static [&'static str] = &["rate:ns"];
    const WIDTH: usize = 5;
    const BATCHES: bool = true;

    /// The batch's shared settings, its size, and every arrival's share: the script decides
    /// every arrival's own emission one after the other, the highest share first, then the
    /// admitted ones' extras in the same order ([`decide`]).
    fn encode(batch: &[&Arrival], _: &Wire<'_>, sink: &mut dyn Sink) {
        let first = batch[0];
        sink.int(first.interval);
        sink.int(first.burst.into());
        sink.int(first.take.into());
        sink.int(batch.len() as u64);
        for arrival in batch {
            sink.int(arrival.share.into());
        }
    }

    fn decode(reply: &[i64]) -> Result<Self::Reply, Malformed> {
        let natural = |n: i64| u64::try_from(n).ok();
        match reply.iter().map(|&n| natural(n)).collect::<Vec<_>>()[..] {
            [
                Some(1),
                Some(extra),
                Some(ahead),
                Some(seconds),
                Some(nanos),
            ] if ahead > 0 && nanos < 1_000_000_000 => Ok(Ok(Taken {
                extra: u32::try_from(extra).map_err(|_| Malformed::new("extra"))?,
                ahead,
                tat: seconds
                    .checked_mul(1_000_000_000)
                    .and_then(|ns| ns.checked_add(nanos))
                    .ok_or_else(|| Malformed::new("TAT"))?,
            })),
            [Some(0), Some(wait), Some(0), Some(0), Some(0)] if wait > 0 => Ok(Err(wait)),
            _ => Err(Malformed::new(format_args!("{reply:?}"))),
        }
    }

    fn batches_with(first: &Arrival, other: &Arrival) -> bool {
        (first.interval, first.burst, first.take) == (other.interval, other.burst, other.take)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::priority::{Priority, Thresholds, WHOLE};

    #[test]
    fn a_reply_with_more_extra_than_taken_or_slots_already_started_does_not_fit() {
        let taken = |extra, ahead| Taken {
            extra,
            ahead,
            tat: 1,
        };
        assert!(taken(3, 40).fits(4, 10));
        assert!(taken(0, 10).fits(1, 10));
        assert!(!taken(4, 50).fits(4, 10), "extra ≥ take");
        assert!(!taken(u32::MAX, 1).fits(4, 10), "extra + 1 overflows");
        assert!(!taken(3, 39).fits(4, 10), "ahead too small");
        let decoded = Gcra::decode(&[1, i64::from(u32::MAX), 1, 1, 0]).expect("a u32 extra");
        assert!(!decoded.expect("admitted").fits(4, 10));
    }

    #[test]
    fn intervals_round_up_never_down() {
        assert_eq!(interval_ns(700.0), 1_428_572);
        assert_eq!(interval_ns(1_000_000.0), 1_000);
        assert_eq!(interval_ns(0.5), 2_000_000_000);
        assert!(1e9 / interval_ns(3.0) as f64 <= 3.0);
    }

    #[test]
    fn burst_then_one_per_interval_with_exact_retry_after() {
        const MS: u64 = 1_000_000;
        // 4 per second, burst 3, arrivals at 0, 0, 0, 0, 249 ms, 250 ms.
        let interval = interval_ns(4.0);
        let mut tat = None;
        let mut decisions = Vec::new();
        for ms in [0, 0, 0, 0, 249, 250] {
            match admit(tat, 1 + ms * MS, interval, (3, WHOLE), &mut Seen::default()) {
                Ok(next) => {
                    tat = Some(next);
                    decisions.push(Ok(()));
                }
                Err(wait) => decisions.push(Err(wait)),
            }
        }
        assert_eq!(
            decisions,
            [Ok(()), Ok(()), Ok(()), Err(250 * MS), Err(MS), Ok(())]
        );
    }

    /// A take of 5 at burst 3 gets what 5 arrivals at that instant would: 3 when idle, its own
    /// only with one in use, nothing (the wait until one) with the burst spent.
    #[test]
    fn a_take_gets_only_what_the_burst_allows_now() {
        let (interval, now) = (1_000, 1);
        let take = |tat| {
            let arrival = Arrival {
                interval,
                burst: 3,
                share: WHOLE,
                take: 5,
            };
            decide(&mut Cell(tat), &[&arrival], now, &mut Seen::default()).remove(0)
        };
        let taken = |extra, tat| {
            Ok(Taken {
                extra,
                ahead: tat - now,
                tat,
            })
        };
        assert_eq!(take(None), taken(2, 3_001));
        assert_eq!(take(Some(2_001)), taken(0, 3_001));
        assert_eq!(take(Some(3_001)), Err(1_000));
    }

    /// A batch of `n` arrivals taking `k` each admits exactly the arrivals a take of one
    /// admits, whatever the burst, the burst in use and the shares; the extras come only from
    /// what the burst allows after them, so nothing taken passes the burst. At take 1 a batch
    /// is its arrivals stepped one by one in share order (what the in-memory coordinator does,
    /// never batching). With whole shares the extras go in the batch's order, each admitted
    /// arrival as many as the burst still allows (up to `k − 1`), until it is spent.
    #[test]
    fn a_batch_taking_more_admits_exactly_what_a_take_of_one_admits() {
        let (interval, now) = (1_000, 1_000_000);
        let in_use =
            |tat: Option<u64>| tat.map_or(0, |tat| tat.saturating_sub(now).div_ceil(interval));
        let arrivals = |n: usize, burst, take, shares: &[u16]| -> Vec<Arrival> {
            (0..n)
                .map(|i| Arrival {
                    interval,
                    burst,
                    share: shares[i % shares.len()],
                    take,
                })
                .collect()
        };
        let decided = |tat, arrivals: &[Arrival]| {
            let batch: Vec<&Arrival> = arrivals.iter().collect();
            let mut cell = Cell(tat);
            let replies = decide(&mut cell, &batch, now, &mut Seen::default());
            let taken: u32 = replies.iter().flatten().map(|taken| taken.extra + 1).sum();
            assert!(
                in_use(cell.0) <= u64::from(arrivals[0].burst),
                "past the burst"
            );
            assert_eq!(
                in_use(cell.0),
                in_use(tat) + u64::from(taken),
                "all charged"
            );
            (replies, cell)
        };
        let stepped = |tat, arrivals: &[Arrival]| {
            let mut cell = Cell(tat);
            let mut replies = vec![Err(0); arrivals.len()];
            let now = Now {
                ms: now / 1_000_000,
                ns: now,
                order: 1,
            };
            for i in priority::highest_share_first(arrivals.iter().map(|a| a.share)) {
                replies[i] = Gcra::step(&mut cell, &arrivals[i], now, &mut Seen::default());
            }
            (replies, cell)
        };
        for burst in 1..=6 {
            for used in 0..=burst {
                let tat = (used > 0).then(|| now + u64::from(used) * interval);
                for n in 1..=9 {
                    for shares in [&[WHOLE][..], &[WHOLE, 500], &[300, WHOLE, 800]] {
                        let case = format!(
                            "burst {burst}, {used} in use, {n} arrivals, shares {shares:?}"
                        );
                        let ones = arrivals(n, burst, 1, shares);
                        let alone = decided(tat, &ones);
                        assert_eq!(alone, stepped(tat, &ones), "{case}: take 1, stepped");
                        let admitted: Vec<bool> = alone.0.iter().map(Result::is_ok).collect();
                        for take in 2..=5 {
                            let (replies, cell) = decided(tat, &arrivals(n, burst, take, shares));
                            let case = format!("{case}, taking {take}");
                            let got: Vec<bool> = replies.iter().map(Result::is_ok).collect();
                            assert_eq!(got, admitted, "{case}: admitted");
                            if shares != [WHOLE] {
                                continue;
                            }
                            let own = admitted.iter().filter(|&&ok| ok).count() as u32;
                            let mut left = burst - used - own;
                            let extras: Vec<u32> =
                                replies.iter().flatten().map(|t| t.extra).collect();
                            let want: Vec<u32> = (0..own)
                                .map(|_| {
                                    let extra = left.min(take - 1);
                                    left -= extra;
                                    extra
                                })
                                .collect();
                            assert_eq!(extras, want, "{case}: extras in the batch's order");
                            let charged = (used + own * take).min(burst);
                            assert_eq!(in_use(cell.0), u64::from(charged), "{case}: in use");
                        }
                    }
                }
            }
        }
    }

    /// Thresholds `normal = 0.8, sheddable = 0.5` on a burst of 30 arriving at once: the 15th
    /// `Sheddable` and the 24th `Normal` arrival are admitted, the next of each refused (with
    /// the wait until its class would be), while `Critical` ones get in up to the whole burst.
    #[test]
    fn a_class_is_admitted_only_below_its_share_of_the_burst() {
        let thresholds = Thresholds::new(0.8, 0.5).expect("valid");
        let interval = 1_000;
        let mut tat = None;
        let mut arrive = |priority| {
            let terms = (30, thresholds.thousandths(priority));
            admit(tat, 0, interval, terms, &mut Seen::default()).map(|next| tat = Some(next))
        };
        for _ in 1..=15 {
            assert_eq!(arrive(Priority::Sheddable), Ok(()));
        }
        assert_eq!(
            arrive(Priority::Sheddable),
            Err(interval),
            "16th: 15 in use"
        );
        for _ in 16..=24 {
            assert_eq!(arrive(Priority::Normal), Ok(()));
        }
        assert_eq!(arrive(Priority::Normal), Err(interval), "25th: 24 in use");
        assert_eq!(arrive(Priority::Sheddable), Err(10 * interval));
        for _ in 25..=30 {
            assert_eq!(arrive(Priority::Critical), Ok(()));
        }
        assert_eq!(
            arrive(Priority::Critical),
            Err(interval),
            "the burst is spent"
        );
    }
}
