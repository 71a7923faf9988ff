//! An adaptive limit's arithmetic: the fleet's latency observations in, one limit per identity
//! out. Pure and integer-only (milliseconds, microseconds, limits in thousandths), so that the
//! in-memory coordinator's step and `adaptive.lua`'s agree to the last unit.
//!
//! # The algorithm: a gradient on the fleet's recent minimum latency
//!
//! Every process reports, about every [`REPORT_EVERY`](crate::policy::bulkhead) of its calls'
//! bodies, what it saw: how many succeeded and their summed and smallest latency, how many
//! failed or timed out (drops), and the highest fleet occupancy a lease reply showed it. The
//! identity gathers them; once a window (a second) has passed since the last update, the next
//! report updates the limit from the window's figures:
//!
//! - `latency` is the window's mean latency, and `base` the fleet's recent minimum: the
//!   window's smallest latency when it is lower, else the old base moved up a sixteenth of the
//!   way towards it (so a downstream that got slower for good is followed within about 30
//!   windows, while a moment without an unqueued call does not move it far).
//! - A downstream serving `C` at once takes `S` for an unqueued call; at a limit `L ≥ C` its
//!   mean latency is `S × L / C` (Little's law with the downstream saturated). The gradient is
//!   `min(1, 1.1 × base / latency)` ([`TOLERANCE_PM`]): 1 while the mean stays within a tenth
//!   of the base (an unqueued call's latency varies: a mean a few percent above the fastest
//!   call is not queueing), else `1.1 × C / L`. A gradient of 1 probes: the target is 1.2 × the
//!   limit ([`GROWTH_PM`]). Below 1 the target is `L × gradient = 1.1 × C` whatever the limit
//!   was. So the limit heads for 1.1 × the capacity (less the unqueued latency's own spread)
//!   and stays there. This is Netflix's Gradient limit (`gradient = min_rtt × tolerance /
//!   rtt`) with the fleet's figures, a probing step in place of its `sqrt(limit)` queue
//!   allowance (which at small limits overshoots by a third), and its minimum latency decaying
//!   upwards as Gradient2's long-term average does, without Gradient2's averaging drift (it
//!   learns a congested latency as normal).
//! - Drops above a tenth of the window's calls ([`DROP_SHARE_PERMILLE`]) are congestion: the
//!   target is at most three quarters of the limit (AIMD's back-off).
//! - A fleet that never came near its limit (its highest occupancy under half of it) gives no
//!   evidence the limit could be higher: the target is at most the limit (Gradient2's
//!   application-limited check), so a quiet hour does not leave the limit at `max`.
//! - The target is never below half the limit, and the new limit is the mean of the old and
//!   the target (smoothing ½), within `[min, max]`.
//!
//! | condition | branch | effect |
//! |-----------|--------|--------|
//! | no estimate is stored | [`Started`](Branch::Started) | the limit starts at `initial` and a window opens |
//! | the window has not passed | [`Gathered`](Branch::Gathered) | the report joins the window |
//! | it has, with nothing observed | [`Idle`](Branch::Idle) | a window opens now; the limit is kept |
//! | it has; the window's smallest latency is below the base | [`BaseLowered`](Branch::BaseLowered) | the base is that latency |
//! | it is not | [`BaseRaised`](Branch::BaseRaised) | the base moves a sixteenth towards it |
//! | the mean latency within a tenth of the base | [`Probed`](Branch::Probed) | target 1.2 × the limit |
//! | drops above a tenth | [`Congested`](Branch::Congested) | target at most ¾ of the limit |
//! | the highest occupancy under half the limit | [`AppLimited`](Branch::AppLimited) | target at most the limit |
//! | the new limit is above the old | [`Grew`](Branch::Grew) | |
//! | below | [`Shrank`](Branch::Shrank) | |
//! | the same | [`Held`](Branch::Held) | |
//!
//! Every step answers the limit in force (whole, within `[min, max]`), the mean latency it was
//! computed from and the base. The estimate expires [`IDLE_MS`] after the last report: a fleet
//! that comes back after that starts again at `initial`.

use crate::kernel::{Kernel, Malformed, Now, Script, Scripted, Seen, Sink, State, Wire};

/// How much above the base the mean latency may be before it counts as queueing, in
/// thousandths: 1.1 × the base.
pub(crate) const TOLERANCE_PM: u64 = 1_100;
/// The target while latency is within the tolerance, in thousandths of the limit: 1.2 ×.
pub(crate) const GROWTH_PM: u64 = 1_200;
/// Drops above this share of a window's calls (thousandths) are congestion.
pub(crate) const DROP_SHARE_PERMILLE: u64 = 100;
/// How far the base rises towards a higher window minimum at each update: a sixteenth.
pub(crate) const BASE_RISE: u64 = 16;
/// How long an estimate nobody reports to is kept.
pub(crate) const IDLE_MS: u64 = 600_000;
/// The longest latency one observation counts (10 minutes), so that sums stay exact.
pub(crate) const MAX_LATENCY_US: u64 = 600_000_000;
/// Where sums stop: 2^53 − 1, exact in the script's numbers.
pub(crate) const MAX_SUM: u64 = (1 << 53) - 1;

/// The branches of the table above, in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Branch {
    Started,
    Gathered,
    Idle,
    BaseLowered,
    BaseRaised,
    Probed,
    Congested,
    AppLimited,
    Grew,
    Shrank,
    Held,
}

impl Branch {
    /// Every branch, indexed as [`Seen`] records them.
    #[cfg(test)]
    pub(crate) const ALL: [Branch; 11] = [
        Branch::Started,
        Branch::Gathered,
        Branch::Idle,
        Branch::BaseLowered,
        Branch::BaseRaised,
        Branch::Probed,
        Branch::Congested,
        Branch::AppLimited,
        Branch::Grew,
        Branch::Shrank,
        Branch::Held,
    ];

    fn reach(self, seen: &mut Seen) {
        seen.record(self as usize);
    }
}

/// An adaptive limit's bounds, as `adaptive(min, initial, max)` gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    pub(crate) min: u32,
    pub(crate) initial: u32,
    pub(crate) max: u32,
}

impl Bounds {
    /// `limit_pm` (thousandths) as a whole limit within the bounds.
    pub(crate) fn whole(&self, limit_pm: u64) -> u32 {
        let whole = u32::try_from(limit_pm / 1000).unwrap_or(u32::MAX);
        whole.clamp(self.min, self.max)
    }

    fn clamp_pm(&self, limit_pm: u64) -> u64 {
        limit_pm.clamp(u64::from(self.min) * 1000, u64::from(self.max) * 1000)
    }
}

/// What calls' bodies showed, over a report or a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Observed {
    /// Bodies that succeeded.
    pub(crate) samples: u64,
    /// Their latencies' sum, in microseconds.
    pub(crate) sum_us: u64,
    /// The smallest of them (0 when there are none).
    pub(crate) low_us: u64,
    /// Bodies that failed or timed out.
    pub(crate) drops: u64,
    /// The highest fleet occupancy a lease reply showed.
    pub(crate) peak: u64,
}

impl Observed {
    /// Adds one body's outcome: its latency if it succeeded, else a drop.
    pub(crate) fn body(&mut self, latency_us: Option<u64>) {
        match latency_us {
            Some(us) => {
                let us = us.min(MAX_LATENCY_US);
                self.low_us = if self.samples == 0 {
                    us
                } else {
                    self.low_us.min(us)
                };
                self.samples += 1;
                self.sum_us = self.sum_us.saturating_add(us).min(MAX_SUM);
            }
            None => self.drops += 1,
        }
    }

    /// Notes a fleet occupancy a lease reply showed.
    pub(crate) fn occupancy(&mut self, occupancy: u32) {
        self.peak = self.peak.max(occupancy.into());
    }

    /// Whether nothing was observed.
    pub(crate) fn is_empty(&self) -> bool {
        self.samples == 0 && self.drops == 0 && self.peak == 0
    }

    /// These figures with `other`'s added.
    fn join(&mut self, other: &Observed) {
        if other.samples > 0 {
            self.low_us = if self.samples == 0 {
                other.low_us
            } else {
                self.low_us.min(other.low_us)
            };
        }
        self.samples = self.samples.saturating_add(other.samples).min(MAX_SUM);
        self.sum_us = self.sum_us.saturating_add(other.sum_us).min(MAX_SUM);
        self.drops = self.drops.saturating_add(other.drops).min(MAX_SUM);
        self.peak = self.peak.max(other.peak);
    }
}

/// One process's report: what it observed, its bounds, and the window it updates in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Report {
    pub(crate) observed: Observed,
    pub(crate) bounds: Bounds,
    /// The least time between updates, in milliseconds (at least 1).
    pub(crate) window_ms: u64,
}

/// The answer to a report: the limit in force, and the latencies it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Learnt {
    pub(crate) limit: u32,
    /// The mean latency of the window the limit was last updated from (0: not updated yet).
    pub(crate) latency_us: u64,
    /// The fleet's recent minimum latency (0: none yet).
    pub(crate) base_us: u64,
}

/// One identity's estimate, as the `adaptive` hash stores it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Estimate {
    /// The limit, in thousandths (0: no estimate).
    pub(crate) limit_pm: u64,
    pub(crate) latency_us: u64,
    pub(crate) base_us: u64,
    /// When the open window started (ms).
    pub(crate) since_ms: u64,
    /// What the open window gathered.
    pub(crate) window: Observed,
    /// The key's expiry (ms).
    pub(crate) expires_ms: u64,
}

impl State for Estimate {
    fn forgettable(&self, now: Now) -> bool {
        // Redis expires a key strictly after its time.
        self.limit_pm == 0 || now.ms > self.expires_ms
    }
}

/// The adaptive limit as a coordinator command.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Adapt;

impl Kernel for Adapt {
    type State = Estimate;
    type Command = Report;
    type Reply = Learnt;

    fn step(estimate: &mut Estimate, report: &Report, now: Now, seen: &mut Seen) -> Learnt {
        let bounds = report.bounds;
        if estimate.forgettable(now) {
            Branch::Started.reach(seen);
            *estimate = Estimate {
                limit_pm: u64::from(bounds.initial) * 1000,
                since_ms: now.ms,
                ..Estimate::default()
            };
        }
        estimate.limit_pm = bounds.clamp_pm(estimate.limit_pm);
        estimate.window.join(&report.observed);
        if now.ms < estimate.since_ms.saturating_add(report.window_ms) {
            Branch::Gathered.reach(seen);
        } else if estimate.window.samples == 0 && estimate.window.drops == 0 {
            Branch::Idle.reach(seen);
            estimate.since_ms = now.ms;
            estimate.window = Observed::default();
        } else {
            update(estimate, bounds, seen);
            estimate.since_ms = now.ms;
            estimate.window = Observed::default();
        }
        estimate.expires_ms = now.ms.saturating_add(IDLE_MS);
        Learnt {
            limit: bounds.whole(estimate.limit_pm),
            latency_us: estimate.latency_us,
            base_us: estimate.base_us,
        }
    }
}

/// The window closes: the new limit from its figures (see the module docs).
fn update(estimate: &mut Estimate, bounds: Bounds, seen: &mut Seen) {
    let window = estimate.window;
    let limit = estimate.limit_pm;
    let mut target = limit;
    if let Some(latency) = window.sum_us.checked_div(window.samples) {
        let latency = latency.max(1);
        let low = window.low_us.max(1);
        estimate.base_us = if estimate.base_us == 0 || low < estimate.base_us {
            Branch::BaseLowered.reach(seen);
            low
        } else {
            Branch::BaseRaised.reach(seen);
            estimate.base_us + (low - estimate.base_us) / BASE_RISE
        };
        estimate.latency_us = latency;
        // The base is at most 6 × 10^8 µs and the gradient at most 1000, so every product
        // stays below 2^53: exact in the script's numbers too.
        let gradient_pm = (estimate.base_us * TOLERANCE_PM / latency).min(1000);
        target = if gradient_pm == 1000 {
            Branch::Probed.reach(seen);
            limit * GROWTH_PM / 1000
        } else {
            limit * gradient_pm / 1000
        };
    }
    let calls = window.samples + window.drops;
    if window.drops * 1000 > calls * DROP_SHARE_PERMILLE {
        Branch::Congested.reach(seen);
        target = target.min(limit * 3 / 4);
    }
    if window.peak * 2 * 1000 < limit {
        Branch::AppLimited.reach(seen);
        target = target.min(limit);
    }
    let target = target.max(limit / 2);
    let next = bounds.clamp_pm((limit + target) / 2);
    match next.cmp(&limit) {
        std::cmp::Ordering::Greater => Branch::Grew.reach(seen),
        std::cmp::Ordering::Less => Branch::Shrank.reach(seen),
        std::cmp::Ordering::Equal => Branch::Held.reach(seen),
    }
    estimate.limit_pm = next;
}

static SCRIPT: Script = Script::new("adaptive limit", &[include_str!("adaptive.lua")]);

impl Scripted for Adapt {
    const SCRIPT: &'static Script = &SCRIPT;
    const KEYS: &'static [&'static str] = &["adaptive"];
    const WIDTH: usize = 3;

    fn encode(batch: &[&Report], _: &Wire<'_>, sink: &mut dyn Sink) {
        let report = batch[0];
        let observed = report.observed;
        for n in [
            observed.samples,
            observed.sum_us,
            observed.low_us,
            observed.drops,
            observed.peak,
            report.bounds.min.into(),
            report.bounds.initial.into(),
            report.bounds.max.into(),
            report.window_ms,
        ] {
            sink.int(n);
        }
    }

    fn decode(reply: &[i64]) -> Result<Learnt, Malformed> {
        Ok(Learnt {
            limit: Malformed::count(reply[0])?,
            latency_us: Malformed::natural("latency", reply[1])?,
            base_us: Malformed::natural("base latency", reply[2])?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds {
        min: 2,
        initial: 20,
        max: 400,
    };

    fn at(ms: u64) -> Now {
        Now {
            ms,
            ns: ms * 1_000_000,
            order: ms,
        }
    }

    /// A downstream serving `capacity` at once in `service_us` each, offered more than the
    /// limit: one window's figures at `limit` (Little's law), as every process's reports add up.
    fn saturated(limit: u32, capacity: u32, service_us: u64) -> Observed {
        let mut observed = Observed::default();
        let latency = service_us * u64::from(limit.max(capacity)) / u64::from(capacity);
        for _ in 0..50 {
            observed.body(Some(latency));
        }
        observed.body(Some(service_us));
        observed.occupancy(limit);
        observed
    }

    fn report(observed: Observed) -> Report {
        Report {
            observed,
            bounds: BOUNDS,
            window_ms: 1000,
        }
    }

    /// Runs `seconds` windows against a downstream of `capacity`; the limit after each.
    fn run(estimate: &mut Estimate, from_s: u64, seconds: u64, capacity: u32) -> Vec<u32> {
        let mut seen = Seen::default();
        let mut limits = Vec::new();
        let mut limit = BOUNDS.whole(estimate.limit_pm.max(20_000));
        for second in from_s..from_s + seconds {
            let observed = saturated(limit, capacity, 20_000);
            limit = Adapt::step(estimate, &report(observed), at(second * 1000), &mut seen).limit;
            limits.push(limit);
        }
        limits
    }

    #[test]
    fn the_limit_heads_for_a_tenth_over_the_capacity_and_follows_it() {
        let mut estimate = Estimate::default();
        let limits = run(&mut estimate, 1, 10, 40);
        assert!(limits.windows(2).all(|w| w[0] <= w[1]), "{limits:?}");
        // Around 1.1 × 40, one probing step (1.1 × on the limit) above it at most.
        let limits = run(&mut estimate, 11, 20, 40);
        assert!(
            limits[5..].iter().all(|&l| (40..=49).contains(&l)),
            "{limits:?}"
        );
        // The capacity halves: within [0.8, 1.3] × 20 in a few windows.
        let limits = run(&mut estimate, 31, 10, 20);
        assert!(
            limits[4..].iter().all(|&l| (16..=26).contains(&l)),
            "{limits:?}"
        );
        assert_eq!(estimate.base_us, 20_000);
    }

    #[test]
    fn drops_back_the_limit_off_and_a_quiet_fleet_does_not_raise_it() {
        let mut seen = Seen::default();
        let mut estimate = Estimate::default();
        Adapt::step(
            &mut estimate,
            &report(Observed::default()),
            at(0),
            &mut seen,
        );
        let mut failing = Observed::default();
        for _ in 0..10 {
            failing.body(None);
        }
        let learnt = Adapt::step(&mut estimate, &report(failing), at(1000), &mut seen);
        // Half-way from 20 to ¾ of 20.
        assert_eq!(learnt.limit, 17);
        let mut quiet = Observed::default();
        quiet.body(Some(1_000));
        quiet.occupancy(3);
        let learnt = Adapt::step(&mut estimate, &report(quiet), at(2000), &mut seen);
        assert_eq!(learnt.limit, 17);
        // Nothing observed for a window: kept, and the window starts again.
        let learnt = Adapt::step(
            &mut estimate,
            &report(Observed::default()),
            at(3500),
            &mut seen,
        );
        assert_eq!((learnt.limit, estimate.since_ms), (17, 3500));
        // Forgotten after the idle time: back to `initial`.
        let learnt = Adapt::step(
            &mut estimate,
            &report(Observed::default()),
            at(3501 + IDLE_MS),
            &mut seen,
        );
        assert_eq!(learnt.limit, 20);
    }

    #[test]
    fn the_limit_stays_within_its_bounds() {
        let bounds = Bounds {
            min: 5,
            initial: 8,
            max: 10,
        };
        let mut seen = Seen::default();
        let mut estimate = Estimate::default();
        for second in 0..30 {
            let mut observed = Observed::default();
            observed.body(Some(100));
            observed.occupancy(100);
            let report = Report {
                observed,
                bounds,
                window_ms: 1000,
            };
            let learnt = Adapt::step(&mut estimate, &report, at(second * 1000), &mut seen);
            assert!((5..=10).contains(&learnt.limit));
        }
        assert_eq!(bounds.whole(estimate.limit_pm), 10);
        for second in 30..60 {
            let mut observed = Observed::default();
            observed.body(None);
            let report = Report {
                observed,
                bounds,
                window_ms: 1000,
            };
            Adapt::step(&mut estimate, &report, at(second * 1000), &mut seen);
        }
        assert_eq!(bounds.whole(estimate.limit_pm), 5);
    }
}
