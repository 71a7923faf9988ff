//! The generic cell rate algorithm: one admission per `interval` on average, up to `burst` at
//! once after idle time. Pure; times are nanoseconds.
//!
//! The only state is the cell's theoretical arrival time (TAT). The local limiter and the
//! in-memory coordinator run this on tokio's clock; `admit.lua` beside this file is the same decision
//! on Redis time.
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

use crate::kernel::{Kernel, Malformed, Now, Script, Scripted, Seen, Sink, State, Wire};
use crate::priority;

/// The emission interval in nanoseconds for `rate` admissions per second: rounded up, so the
/// limiter never admits more than asked (700/s is 1 428 572 ns, not 1 ms).
pub(crate) fn interval_ns(rate: f64) -> u64 {
    (1e9 / rate).ceil().clamp(1.0, u64::MAX as f64) as u64
}

/// The branches of the table above, in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Branch {
    Idle,
    Burst,
    AboveShare,
    Rejected,
}

impl Branch {
    /// Every branch, indexed as [`Seen`] records them.
    #[cfg(test)]
    pub(crate) const ALL: [Branch; 4] = [
        Branch::Idle,
        Branch::Burst,
        Branch::AboveShare,
        Branch::Rejected,
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
    /// Admitted (and charged), or the wait (ns) until an admission is possible.
    type Reply = Result<(), u64>;

    fn step(cell: &mut Cell, arrival: &Arrival, now: Now, seen: &mut Seen) -> Self::Reply {
        let terms = (arrival.burst, arrival.share);
        admit(cell.0, now.ns, arrival.interval, terms, seen).map(|next| cell.0 = Some(next))
    }
}

static SCRIPT: Script = Script::new("rate limit admission", &[include_str!("admit.lua")]);

impl Scripted for Gcra {
    const SCRIPT: &'static Script = &SCRIPT;
    const KEYS: &'static [&'static str] = &["rate:ns"];
    const WIDTH: usize = 2;
    const BATCHES: bool = true;

    /// The batch's shared settings, its size, and every arrival's share: the script decides
    /// that many arrivals one after the other, the highest share first.
    fn encode(batch: &[&Arrival], _: &Wire<'_>, sink: &mut dyn Sink) {
        let first = batch[0];
        sink.int(first.interval);
        sink.int(first.burst.into());
        sink.int(batch.len() as u64);
        for arrival in batch {
            sink.int(arrival.share.into());
        }
    }

    fn decode(reply: &[i64]) -> Result<Self::Reply, Malformed> {
        match (reply[0], u64::try_from(reply[1])) {
            (1, Ok(0)) => Ok(Ok(())),
            (0, Ok(wait)) if wait > 0 => Ok(Err(wait)),
            (allowed, _) => Err(Malformed::new(format_args!(
                "{{{allowed}, {wait}}}",
                wait = reply[1]
            ))),
        }
    }

    fn batches_with(first: &Arrival, other: &Arrival) -> bool {
        (first.interval, first.burst) == (other.interval, other.burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::priority::{Priority, Thresholds, WHOLE};

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
