//! The generic cell rate algorithm: one admission per `interval` on average, up to `burst` at
//! once after idle time. Pure; times are nanoseconds.
//!
//! The only state is the cell's theoretical arrival time (TAT). The local limiter and the
//! in-memory coordinator run this on tokio's clock; `admit.lua` beside this file is the same decision
//! on Redis time.
//!
//! | condition | branch | reply |
//! |-----------|--------|-------|
//! | TAT absent or not after now | [`Idle`](Branch::Idle) | admitted; TAT = now + interval |
//! | TAT ahead of now by at most `interval × (burst − 1)` | [`Burst`](Branch::Burst) | admitted; TAT moves one interval on |
//! | TAT further ahead | [`Rejected`](Branch::Rejected) | rejected with the wait until it would not be |

use crate::kernel::{Kernel, Malformed, Now, Script, Scripted, Seen, Sink, State, Wire};

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
    Rejected,
}

impl Branch {
    /// Every branch, indexed as [`Seen`] records them.
    #[cfg(test)]
    pub(crate) const ALL: [Branch; 3] = [Branch::Idle, Branch::Burst, Branch::Rejected];
}

/// Decides one arrival at `now` given the stored TAT: `Ok` with the new TAT when admitted,
/// `Err` with the wait (> 0) until an admission is possible otherwise.
pub(crate) fn admit(
    tat: Option<u64>,
    now: u64,
    interval: u64,
    burst: u32,
    seen: &mut Seen,
) -> Result<u64, u64> {
    let burst_delay = interval.saturating_mul(u64::from(burst.saturating_sub(1)));
    let anchor = tat.map_or(now, |tat| tat.max(now));
    let ahead = anchor - now;
    let branch = if ahead > burst_delay {
        Branch::Rejected
    } else if ahead == 0 {
        Branch::Idle
    } else {
        Branch::Burst
    };
    seen.record(branch as usize);
    if branch == Branch::Rejected {
        Err(ahead - burst_delay)
    } else {
        Ok(anchor.saturating_add(interval))
    }
}

/// The GCRA as a coordinator command: one arrival at an identity's cell.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gcra;

/// One arrival: the settings of its call site.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Arrival {
    /// The emission interval, in nanoseconds.
    pub(crate) interval: u64,
    pub(crate) burst: u32,
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
        admit(cell.0, now.ns, arrival.interval, arrival.burst, seen).map(|next| cell.0 = Some(next))
    }
}

static SCRIPT: Script = Script::new("rate limit admission", &[include_str!("admit.lua")]);

impl Scripted for Gcra {
    const SCRIPT: &'static Script = &SCRIPT;
    const KEYS: &'static [&'static str] = &["rate:ns"];
    const WIDTH: usize = 2;
    const BATCHES: bool = true;

    /// The batch's shared settings and its size: the script decides that many arrivals one
    /// after the other.
    fn encode(batch: &[&Arrival], _: &Wire<'_>, sink: &mut dyn Sink) {
        let first = batch[0];
        sink.int(first.interval);
        sink.int(first.burst.into());
        sink.int(batch.len() as u64);
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
        first == other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            match admit(tat, 1 + ms * MS, interval, 3, &mut Seen::default()) {
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
}
