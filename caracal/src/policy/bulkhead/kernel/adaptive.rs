//! An adaptive limit's arithmetic: each process's judgement of its own calls in, one limit per
//! identity out. Pure and integer-only (milliseconds, microseconds, limits and ratios in
//! thousandths), so that the in-memory coordinator's step and `adaptive.lua`'s agree to the
//! last unit.
//!
//! # The algorithm: queueing judged by each process against its own base, decided by the fleet
//!
//! A latency is evidence of congestion only if it grows with the calls in flight: a downstream
//! queueing past its capacity `C` answers an unqueued call in `S` and, at a limit `L ≥ C`, in
//! `S × L / C` (Little's law). A busy host, a starved process or a slow class of requests makes
//! calls slow at every concurrency. So the limit compares like with like:
//!
//! - **Each process judges its own calls** ([`vote`]): those admitted while the fleet's
//!   occupancy was at most three quarters of the limit ([`LOW_PM`]) ran below the capacity the
//!   limit has found; their mean latency is the process's **base** (its own, so a slow process
//!   or host is measured against itself). Its other calls' mean latency over that base, read
//!   against its **service time**, is its **ratio**: `1 + (mean − base) / service`, since a
//!   queue of `D` past a capacity `C` makes every call wait `(D / C − 1)` mean service times,
//!   slow requests included (Little's law). The service time is the base plus a slow class's
//!   time past the count's cap, learnt over reports; where no call reaches the cap the two
//!   are the same and the ratio is the mean over the base (with one request in ten 40 times
//!   slower, read over the base, a queue a tenth past `C` read 1.4 and the fleet rested at
//!   `C`, its cuts at ¾ of it). Its drops (failures, timeouts) beyond the share it sees at low
//!   occupancy raise the ratio by that excess (a downstream failing fast past its capacity).
//!   Latencies count up to the base plus the larger of the base and half the service time
//!   (twice the base where nothing is slower), so a slow class of requests (bimodal latency)
//!   cannot swamp the mean, and go out to the fleet raised by the slow class's time past the
//!   cap, so that its windows fall with the occupancy as Little's law has them (counted at the
//!   cap, a cut that removed a wait of a tenth of the service time read as a fall of a fifth:
//!   a cut that still queued);
//!   a process without a base in a fleet that has one (a new process, until its first cut)
//!   sends its calls but not their latencies, so that they make the windows around that cut
//!   read neither slower than the others' (uncounted: with one slow request in ten, a limit of
//!   23 fell to 18 and the downstream to 13 of 20) nor faster (not yet raised by the slow
//!   class's time: 12 → 9 at a capacity of 10), either of which the fleet reads as a cut that
//!   still queued.
//!   Its vote: *queued* above 1.25 ([`QUEUED_PM`]), *clear* below 1.1 ([`CLEAR_PM`]), else
//!   *unsure*; weighted by the calls it judged, so a process weighs by its share of calls.
//! - **A base, and the drop share at low occupancy, rise only on a measurement**: a cut's
//!   calls, or a process's calls that all ran below the limit. Outside a cut, a call admitted
//!   at low occupancy beside calls near the limit came in a dip of the fleet's occupancy (a
//!   starved process or host releasing its slots in a burst, calls failing fast and backing
//!   off) and met the queue, or the refusals, the calls before it left: it may lower the base
//!   and the drop share, never raise them (a drop share learnt from a downstream failing fast
//!   past its capacity is the overload's own, and the limit would climb on clear votes). Learnt from such calls, a base is the queued latency, the process votes clear
//!   on a queued downstream, and the limit climbs past the capacity on its probes. And a base
//!   is never above what the mean latency of the process's calls near the limit could be by
//!   chance: queueing only adds latency, so calls there faster by more than
//!   [`vote::CHANCE_SE`] standard errors (of the process's latency, its variance learnt over
//!   reports) show the base too high (a first base taken from a process's warm-up, its
//!   connections opened while the fleet ramped up) and lower it at once; a dip's few calls
//!   lower it only by as much. Lowered by every faster mean, a base learns the fastest of many
//!   reports (one slow request in ten at random: a sixth below an empty downstream's latency)
//!   and the limit holds on unsure votes where it should probe.
//!   A measurement raises the base only if its latency did not fall with the occupancy: by
//!   less than a cut's quarter ([`vote::FELL_PM`], Little's law), from the last report near the
//!   limit and from their average alike (the average lags a capacity that just halved), the
//!   latencies counted up to four times the base ([`vote::COMPARED_TIMES`]; at the vote's
//!   cap of twice, a queue two to four times deep reads the same at both occupancies).
//! - **The fleet decides by majority of weight**, once a window (a second): queued → the target
//!   is `L × 1.1 / ratio` (the ratio the queued voters saw, on average), which is `1.1 × C`
//!   whatever `L` was; clear → the target is `1.2 × L` (a probe) when the clear voters saw no
//!   queueing (a ratio of 1 or less, on average), tapering to `L` as their ratio nears 1.1
//!   ([`growth_pm`]: a ratio just short of it queues a little already); no majority, or no
//!   vote → the limit holds. One process cannot drag the fleet: it is one vote of its weight.
//! - **Bases need calls at low occupancy.** A fleet offered more than its limit admits every
//!   call near the limit, so when no window in the last period (at first [`CUT_EVERY_MS`]) had
//!   a tenth of its calls at low occupancy ([`LOW_SHARE_PM`]), the next window is a **cut**: the
//!   limit in force is three quarters of the limit, and every process measures its base. This
//!   is Envoy's adaptive concurrency (its minimum latency measured at a reduced concurrency),
//!   taken once per fleet rather than per process, and only while the fleet has no such calls
//!   of its own and fills its limit (its occupancy reached it, or a call was refused: with
//!   `thresholds` a class is refused at its share of the limit): a fleet that never does is
//!   refused nothing by the limit, and a cut would refuse what a healthy downstream has room
//!   for (a quarter of its calls for a second in every forty, to the fallback), so it is cut
//!   only on evidence (queued votes on old bases, bases that fell) or while most of its calls
//!   go unjudged (processes without a base: most of a rolling restart; a lone process that
//!   restarted waits for its base, its calls unjudged, while the others' votes steer).
//! - **Bases that fell by a quarter are measured again.** A base is an unqueued call's
//!   latency, and calls near the limit are faster than it by chance only by far less (a
//!   sixth, with one slow request in ten). A fleet whose voters' mean base fell below ¾
//!   ([`FALLEN_PM`]) of the one the last window that measured bases (a cut, or one with a
//!   share at low occupancy) left measured it wrong: in a warm-up (connections opening, one
//!   slow process's tasks taking the first slots) its first cut measured 60–70 ms where the
//!   downstream answers in 22, the bases came down to the mean of calls near a limit that
//!   queued, and the votes read clear while the limit climbed to 1.35–1.7 × C until the
//!   period's cut. So the limit holds and the next window is a cut, [`VERIFY_MS`] or more
//!   after the last cut was called (its calls, reported late, still lower the bases), and the
//!   fallen bases are the ones the next fall is measured from.
//! - **Cuts that confirm the limit come less often.** A cut costs a quarter of the limit for a
//!   second, and more where one process holds slots outside the downstream (its bodies blocked
//!   after the reply): it takes the cut's slots as fast as the others and keeps each longer, so
//!   the downstream falls to about half its capacity. A cut in which voters weighed at least
//!   half the calls and that did not still queue (its latency did not fall as a saturated
//!   downstream's would, its votes were not queued) was judged and found at most the small
//!   correction of a limit above 1.1 × C ([`Above`](Branch::Above)), so the period before
//!   the next doubles, up to [`MAX_CUT_EVERY_MS`]; a cut nobody judged keeps it. A cut that
//!   still queued, a verification, or a window outside a cut whose calls went mostly unjudged
//!   with no share at low occupancy (processes without a base: a new process, a rolling
//!   restart) sets it back to [`CUT_EVERY_MS`]. The stored period is read within those two,
//!   whatever wrote it. Bases that drift up between cuts are not
//!   missed: queued votes on bases older than [`VERIFY_MS`] call a cut at once, unless the
//!   limit grew since the last window outside a cut whose votes were not queued, by a probe's
//!   growth at most: the same bases read no queue at that limit and a queue above it, so the
//!   latency grew with the calls in flight (Little's law's evidence, whatever the bases' age),
//!   and the limit falls to its queued target without a cut, but not below that limit (with one slow request in ten at a capacity of
//!   10, the probes from 9 reached 11 in five seconds, read queued there, and each
//!   verification's cut took the downstream to 6.4, every seven seconds). So a steady fleet
//!   cuts for one second in forty-one rather than in eleven.
//! - **A cut that still queued goes deeper.** A limit far above the capacity (a high
//!   `initial`, a capacity that collapsed) never saw an unqueued call: a cut to ¾ of it still
//!   queues, and the ratio its calls give can never exceed 4/3. When a cut's mean latency fell
//!   with the occupancy (to at most [`DEEPER_PM`] of the window before it, or
//!   [`DEEPER_WHOLE_PM`] for a fleet's first cut, read from its whole window: the downstream
//!   served as many calls a second at ¾ of the calls inside, Little's law, so it was saturated
//!   at both),
//!   the limit falls to at most 1.1 × the cut's level and the next window is a cut again, at ¾ of
//!   this one's. The fleet's mean latency of two adjacent windows is compared, the same
//!   processes in both: a slow process or a busy host adds latency that does not fall with the
//!   occupancy, so it stops the descent rather than driving it. Each cut costs no goodput while
//!   it queues; the first that did not queue ends it. A cut's latency is that of the calls it
//!   admitted (at low occupancy): its window also holds calls admitted before the processes
//!   learnt it, queued as the limit before it was, and a cut after one that still queued read
//!   faster than it by their share alone, went deeper, and left the limit below the capacity
//!   (bimodal latency, whose slow class queues the fast one deeply at 1.1 × C: 11 → 9 → 6 at a
//!   capacity of 10).
//! - **A cut that did not still queue measures the capacity.** Its own calls' latency fell
//!   with the occupancy as Little's law has it, to `C / D` of the window before: by more than
//!   a limit at 1.1 × C would see ([`ABOVE_PM`]), the limit falls to 1.1 × the occupancy
//!   before the cut × that fall. The fleet holds wherever its votes read unsure (ratios from
//!   1.1 to 1.25), so a limit that a queued target left high rested there until the next
//!   change of capacity, the downstream up to 1.25 × C and, with one slow process whose slots
//!   outside the downstream make the ratio read low, past 1.3 × C (one slow request in ten at
//!   a capacity of 10: a limit of 12; one slow process: 15 to 17, the downstream at 12 to
//!   14.7). Latency that
//!   does not fall with the occupancy (a busy host, a slow process) makes the fall, and the
//!   correction, smaller, never larger.
//! - **A process holding slots outside the downstream is held to its share** ([`share`]): the
//!   step counts the processes that asked for slots in each window, their reports carrying
//!   calls or a lease reply's occupancy, admitted or refused (or refused in the process, at its
//!   share: the last reply's) (a report carries the start of
//!   the window its process last joined, so each counts once; an older script in a mixed
//!   fleet neither counts nor clears the count, which counts a process again in each window
//!   such a script closed, and an older process, counted only by its calls, is counted again
//!   in each report it sends refused), and a process whose calls were slower than the fleet's,
//!   or that holds most of its slots while the others ask, holds at most the limit over that
//!   count while the fleet is at its limit. Counted by their calls alone, processes refused
//!   every slot went uncounted: one slow process holding every slot (its tasks took the first
//!   ones) counted alone, its latency was the fleet's, and it was never bounded.
//! - A fleet that never came near its limit (its highest occupancy under half of it) gives no
//!   evidence the limit could be higher: the target is at most the limit (Gradient2's
//!   application-limited check), so a quiet hour does not leave the limit at `max`.
//! - The target is never below half the limit. A lower one is the new limit; a higher one
//!   moves it halfway (smoothing ½, a probe being a guess); within `[min, max]`. So the fleet
//!   comes to rest near 1.1 × C from either side: halfway down, the queued votes would stop at
//!   the first window that reads unsure, at the top of that band (1.25 × C), and a probe of a
//!   tenth from a clear vote would cross it; a second's noise past 1.3 × C would follow.
//!
//! | condition | branch | effect |
//! |-----------|--------|--------|
//! | no estimate is stored | [`Started`](Branch::Started) | the limit starts at `initial`; a cut follows the first window |
//! | the window has not passed | [`Gathered`](Branch::Gathered) | the report joins the window |
//! | it has, with no call in it | [`Idle`](Branch::Idle) | a window opens now; the limit is kept |
//! | the queued votes weigh more than half | [`Queued`](Branch::Queued) | target `L × 1.1 / ratio`; in a cut, the period back to [`CUT_EVERY_MS`] |
//! | they do, on bases older than [`VERIFY_MS`], the limit above the last one (outside a cut) whose votes were not queued, by at most a probe's growth | [`Undone`](Branch::Undone) | target `L × 1.1 / ratio`, not below that limit; in a cut, the period back to [`CUT_EVERY_MS`] |
//! | they do, on bases older than [`VERIFY_MS`], otherwise | [`Verify`](Branch::Verify) | the next window is a cut; the period back to [`CUT_EVERY_MS`] |
//! | before any of those: the voters' mean base fell below ¾ ([`FALLEN_PM`]) of the one the last window that measured bases left (or the last fall), outside such a window and [`VERIFY_MS`] or more after the last cut was called | [`Fallen`](Branch::Fallen) | target the limit; the next window is a cut; the period back to [`CUT_EVERY_MS`] |
//! | a cut's latency fell with its occupancy | [`Deeper`](Branch::Deeper) | target at most 1.1 × the cut; the next window is a cut; the period back to [`CUT_EVERY_MS`] |
//! | a cut's own calls' latency fell by less, but by more than a limit at 1.1 × C allows ([`ABOVE_PM`]) | [`Above`](Branch::Above) | target at most 1.1 × the occupancy before the cut × that fall (Little's law: `C`) |
//! | the clear votes do, outside a cut | [`Probed`](Branch::Probed) | target 1.2 × the limit, tapering to 1 × as their ratio nears 1.1 |
//! | neither does | [`Unsure`](Branch::Unsure) | target the limit |
//! | nobody voted | [`Unjudged`](Branch::Unjudged) | target the limit (voters under half the calls, outside a cut and with no low share: the period back to [`CUT_EVERY_MS`]) |
//! | the highest occupancy under half the limit | [`AppLimited`](Branch::AppLimited) | target at most the limit |
//! | the new limit is above the old | [`Grew`](Branch::Grew) | |
//! | below | [`Shrank`](Branch::Shrank) | |
//! | the same | [`Held`](Branch::Held) | |
//! | the period passed, but the window never filled the limit (its highest occupancy under it, no call refused) and voters weighed at least half its calls | [`Unfilled`](Branch::Unfilled) | no cut |
//! | no window with calls at low occupancy for the period ([`CUT_EVERY_MS`], doubled by each judged cut that did not still queue, up to [`MAX_CUT_EVERY_MS`]), in a window that filled the limit or went mostly unjudged | [`Cut`](Branch::Cut) | the next window is a cut |
//!
//! Every step answers the limit in force (¾ of the limit in a cut window; whole, within
//! `[min, max]`), the limit itself, the mean latency of the last window and the voters' mean
//! base, the start of the window the report joined and the processes counted in the last
//! window. The estimate expires [`IDLE_MS`] after the last report: a fleet that comes back after
//! that starts again at `initial`. A window, or calls at low occupancy, stored as after now
//! (server time that stepped back at a failover to a replica whose clock is behind) are read
//! as now, so neither the limit nor its next cut waits for the clock to catch up; the script
//! reads any other field something else wrote (negative, fractional, not a number) as the
//! count this kernel's integers would hold.

pub(crate) mod share;
#[cfg(test)]
mod tests;
pub(crate) mod vote;

use crate::kernel::{Kernel, Malformed, Now, Script, Scripted, Seen, Sink, State, Wire};

/// A call admitted at an occupancy up to this share of the limit (thousandths) ran unqueued;
/// a cut window's limit in force is this share of the limit.
pub(crate) const LOW_PM: u64 = 750;
/// A ratio (thousandths) below which a process sees no queueing.
pub(crate) const CLEAR_PM: u64 = 1_100;
/// A ratio above which it sees queueing.
pub(crate) const QUEUED_PM: u64 = 1_250;
/// The highest ratio a vote carries: latencies count up to twice the base where no call is
/// slower than that unqueued.
pub(crate) const MAX_RATIO_PM: u64 = 2_000;
/// The target of a clear majority that saw no queueing, in thousandths of the limit: 1.2 ×.
pub(crate) const GROWTH_PM: u64 = 1_200;
/// How recent calls at low occupancy (a cut's, or a quiet fleet's) must be for queued votes to
/// lower the limit; older, a cut comes first.
pub(crate) const VERIFY_MS: u64 = 3_000;
/// A cut window whose mean latency is at most this share (thousandths) of the window's before
/// it still queued: halfway between ¾ ([`LOW_PM`]: saturated at both occupancies, the latency
/// falls with the occupancy) and 1 / 1.25 = 0.8 (a limit at the top of the unsure band,
/// [`QUEUED_PM`], unqueued in its cut, the latency falling as `C / L`). At ¾ with a tenth to
/// spare (0.825), a fleet resting at 1.2 × C (bimodal latency at a capacity of 10, a limit of
/// 12) read half its cuts as still queued, within a second's noise of the line: 12 → 9, the
/// downstream at 6.7 of 10, and the next second a cut again.
pub(crate) const DEEPER_PM: u64 = (LOW_PM + 1_000_000 / QUEUED_PM) / 2;
/// The same test of a cut whose latency is its whole window's (a fleet's first cut, before
/// processes have bases): a quarter of the window's calls were admitted before the processes
/// learnt the cut, at the limit before it, so a cut that still queued reads ¼ + ¾ × ¾ of the
/// window before, not ¾.
pub(crate) const DEEPER_WHOLE_PM: u64 = (1000 + 3 * DEEPER_PM) / 4;
/// A cut window whose latency is under this share (thousandths) of the window's before it,
/// and that did not still queue, read the limit above 1.1 × C ([`CLEAR_PM`]): at 1.1 × C an
/// unqueued cut answers in 1 / 1.1 of the time.
pub(crate) const ABOVE_PM: u64 = 1_000_000 / CLEAR_PM;
/// A fleet's base that fell below this share (thousandths) of the one its last measurement
/// left (a cut, or a window with a share at low occupancy) was measured wrong: a base is the
/// latency of an unqueued call, and calls near the limit can be faster than it by chance only
/// by far less (one slow request in ten at random: a sixth). A base measured in a fleet's
/// warm-up (connections opening, one slow process's tasks taking the first slots: 60–70 ms
/// where the downstream answers in 22) comes down to the mean of calls near the limit, queued
/// or not, and the votes read clear on a queued downstream until the period's cut.
pub(crate) const FALLEN_PM: u64 = LOW_PM;
/// How long a fleet goes without calls at low occupancy before a cut window, at first and
/// again after a cut that still queued, a verification, or a window mostly unjudged.
pub(crate) const CUT_EVERY_MS: u64 = 10_000;
/// The longest that period grows to: each cut that voters judged and that did not still queue
/// doubles it.
pub(crate) const MAX_CUT_EVERY_MS: u64 = 4 * CUT_EVERY_MS;
/// The share of a window's calls (thousandths) at low occupancy that lets every process
/// measure its base without a cut.
pub(crate) const LOW_SHARE_PM: u64 = 100;
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
    Queued,
    Probed,
    Verify,
    Fallen,
    Undone,
    Deeper,
    Above,
    Unsure,
    Unjudged,
    AppLimited,
    Grew,
    Shrank,
    Held,
    Unfilled,
    Cut,
}

impl Branch {
    /// Every branch, indexed as [`Seen`] records them.
    #[cfg(test)]
    pub(crate) const ALL: [Branch; 18] = [
        Branch::Started,
        Branch::Gathered,
        Branch::Idle,
        Branch::Queued,
        Branch::Probed,
        Branch::Verify,
        Branch::Fallen,
        Branch::Undone,
        Branch::Deeper,
        Branch::Above,
        Branch::Unsure,
        Branch::Unjudged,
        Branch::AppLimited,
        Branch::Grew,
        Branch::Shrank,
        Branch::Held,
        Branch::Unfilled,
        Branch::Cut,
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

/// Adds `n` to a sum, which stops at [`MAX_SUM`].
fn add(sum: &mut u64, n: u64) {
    *sum = sum.saturating_add(n).min(MAX_SUM);
}

/// The processes' votes over a report or a window, each weighted by the calls it judged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Votes {
    pub(crate) queued: u64,
    pub(crate) clear: u64,
    pub(crate) unsure: u64,
    /// The queued votes' ratios (thousandths), each times its weight.
    pub(crate) ratio_sum: u64,
    /// The clear votes' ratios, likewise.
    pub(crate) clear_sum: u64,
    /// Every voter's base (µs), times its weight.
    pub(crate) base_sum: u64,
}

impl Votes {
    /// One vote: `weight` calls judged at `ratio_pm` against a base of `base_us`.
    pub(crate) fn add(&mut self, weight: u64, ratio_pm: u64, base_us: u64) {
        if ratio_pm > QUEUED_PM {
            add(&mut self.queued, weight);
            add(&mut self.ratio_sum, weight.saturating_mul(ratio_pm));
        } else if ratio_pm < CLEAR_PM {
            add(&mut self.clear, weight);
            add(&mut self.clear_sum, weight.saturating_mul(ratio_pm));
        } else {
            add(&mut self.unsure, weight);
        }
        add(&mut self.base_sum, weight.saturating_mul(base_us));
    }

    fn weight(&self) -> u64 {
        self.queued + self.clear + self.unsure
    }

    fn join(&mut self, other: &Votes) {
        add(&mut self.queued, other.queued);
        add(&mut self.clear, other.clear);
        add(&mut self.unsure, other.unsure);
        add(&mut self.ratio_sum, other.ratio_sum);
        add(&mut self.clear_sum, other.clear_sum);
        add(&mut self.base_sum, other.base_sum);
    }
}

/// What one process's report, or a window, carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Observed {
    /// Bodies that succeeded.
    pub(crate) samples: u64,
    /// Their latencies' sum (each counted up to twice its process's base), in microseconds.
    pub(crate) sum_us: u64,
    /// Bodies that ended, succeeded or not.
    pub(crate) calls: u64,
    /// Of those, the ones admitted at low occupancy.
    pub(crate) low: u64,
    /// Of the successes, the ones admitted at low occupancy.
    pub(crate) low_samples: u64,
    /// Their latencies' sum, counted as [`sum_us`](Self::sum_us) counts them.
    pub(crate) low_sum_us: u64,
    /// The highest fleet occupancy a lease reply showed (a call refused in the process, at its
    /// share, notes the last reply's).
    pub(crate) peak: u64,
    /// Attempts the fleet was full for: a lease reply refused them (with `thresholds`, a class
    /// is refused at its share of the limit, under it), or the process did, at its share; a
    /// call waiting within `max_wait` counts each refused attempt.
    pub(crate) refused: u64,
    pub(crate) votes: Votes,
}

impl Observed {
    /// Whether the process asked for slots: it ended calls, or a lease reply, admitted or
    /// refused, showed it the fleet's occupancy, or it refused a call at its share (a report
    /// of none of those: its limit was ageing).
    pub(crate) fn asked(&self) -> bool {
        self.calls > 0 || self.peak > 0
    }

    /// These figures with `other`'s added.
    fn join(&mut self, other: &Observed) {
        add(&mut self.samples, other.samples);
        add(&mut self.sum_us, other.sum_us);
        add(&mut self.calls, other.calls);
        add(&mut self.low, other.low);
        add(&mut self.low_samples, other.low_samples);
        add(&mut self.low_sum_us, other.low_sum_us);
        self.peak = self.peak.max(other.peak);
        add(&mut self.refused, other.refused);
        self.votes.join(&other.votes);
    }
}

/// One process's report: what it observed, its bounds, and the window it updates in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Report {
    pub(crate) observed: Observed,
    pub(crate) bounds: Bounds,
    /// The least time between updates, in milliseconds (at least 1).
    pub(crate) window_ms: u64,
    /// When the window the process's last report that [`asked`](Observed::asked) joined
    /// started (server ms; 0: none): a process is counted once in each window it asks in.
    pub(crate) joined_ms: u64,
}

/// The answer to a report: the limit in force, and what it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Learnt {
    /// The limit admissions use now: [`full`](Self::full), or [`low_at`](Self::low_at) in a
    /// cut window.
    pub(crate) limit: u32,
    /// The limit the fleet learnt.
    pub(crate) full: u32,
    /// The occupancy at or below which a call counts as admitted at low occupancy: ¾ of the
    /// limit, or of the highest occupancy of the last window if that was lower.
    pub(crate) low_at: u32,
    /// The mean latency of the window the limit was last updated from (a cut's: of its calls
    /// at low occupancy; 0: not updated yet).
    pub(crate) latency_us: u64,
    /// The voters' mean base latency in that window (0: nobody voted).
    pub(crate) base_us: u64,
    /// When the window this report joined started (server ms): the report's next
    /// [`joined_ms`](Report::joined_ms), if it [`asked`](Observed::asked).
    pub(crate) joined_ms: u64,
    /// How many processes asked for slots in the last window that closed.
    pub(crate) processes: u32,
}

impl Learnt {
    /// Whether a call admitted at `occupancy` ran at low occupancy.
    pub(crate) fn low(&self, occupancy: u32) -> bool {
        occupancy <= self.low_at
    }
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
    /// When a window last had calls at low occupancy, or a cut was last decided (ms).
    pub(crate) low_ms: u64,
    /// The limit (thousandths) of the last window outside a cut whose votes were not queued
    /// (0: none yet).
    pub(crate) settled_pm: u64,
    /// The voters' mean base (µs) the last window that measured bases left (a cut, or one with
    /// a share of its calls at low occupancy), or that had fallen by a quarter since (0: none
    /// yet).
    pub(crate) measured_us: u64,
    /// Whether the open window is a cut.
    pub(crate) cut: bool,
    /// The period (ms) after [`low_ms`](Self::low_ms) at which a closing window calls a cut;
    /// read within [`CUT_EVERY_MS`, `MAX_CUT_EVERY_MS`] (0: an estimate an older script
    /// stored, read as [`CUT_EVERY_MS`]).
    pub(crate) every_ms: u64,
    /// The highest occupancy of the last window that closed with calls (0: none yet).
    pub(crate) level: u64,
    /// What the open window gathered.
    pub(crate) window: Observed,
    /// The processes counted in the open window.
    pub(crate) askers: u64,
    /// The processes counted in the last window that closed.
    pub(crate) processes: u64,
    /// The key's expiry (ms).
    pub(crate) expires_ms: u64,
}

impl Estimate {
    /// The occupancy (thousandths) the fleet ran at: the limit or, lower, the highest
    /// occupancy of the last window (a fleet offered less than its limit queues at what it
    /// offers).
    fn occupancy_pm(&self) -> u64 {
        match self.level {
            0 => self.limit_pm,
            level => self.limit_pm.min(level * 1000),
        }
    }

    /// The occupancy (thousandths) up to which a call runs at low occupancy, and a cut
    /// window's limit in force: ¾ of the occupancy the fleet ran at.
    fn low_pm(&self) -> u64 {
        self.occupancy_pm() * LOW_PM / 1000
    }
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
            // A cut after the first window, unless it had calls at low occupancy: every
            // process measures its base at once, at the occupancy the fleet has.
            *estimate = Estimate {
                limit_pm: u64::from(bounds.initial) * 1000,
                since_ms: now.ms,
                low_ms: now.ms.saturating_sub(CUT_EVERY_MS),
                every_ms: CUT_EVERY_MS,
                ..Estimate::default()
            };
        }
        estimate.limit_pm = bounds.clamp_pm(estimate.limit_pm);
        // Absent (an older script's estimate), or foreign: never a period that cuts every
        // window, nor one that never cuts.
        estimate.every_ms = estimate.every_ms.clamp(CUT_EVERY_MS, MAX_CUT_EVERY_MS);
        // Server time that stepped back (a failover to a replica whose clock is behind), or a
        // foreign time: a window that started, or calls at low occupancy seen, after now would
        // hold the limit, or its next cut, until the clock caught up.
        estimate.since_ms = estimate.since_ms.min(now.ms);
        estimate.low_ms = estimate.low_ms.min(now.ms);
        estimate.window.join(&report.observed);
        let joined_ms = estimate.since_ms;
        if report.observed.asked() && report.joined_ms != joined_ms {
            add(&mut estimate.askers, 1);
        }
        if now.ms < estimate.since_ms.saturating_add(report.window_ms) {
            Branch::Gathered.reach(seen);
        } else {
            if estimate.window.calls == 0 {
                Branch::Idle.reach(seen);
            } else {
                update(estimate, bounds, now, seen);
            }
            estimate.since_ms = now.ms;
            estimate.window = Observed::default();
            estimate.processes = std::mem::take(&mut estimate.askers);
        }
        estimate.expires_ms = now.ms.saturating_add(IDLE_MS);
        let low_pm = estimate.low_pm();
        let in_force = if estimate.cut {
            low_pm
        } else {
            estimate.limit_pm
        };
        Learnt {
            limit: bounds.whole(in_force),
            full: bounds.whole(estimate.limit_pm),
            low_at: u32::try_from(low_pm / 1000).unwrap_or(u32::MAX),
            latency_us: estimate.latency_us,
            base_us: estimate.base_us,
            joined_ms,
            processes: u32::try_from(estimate.processes).unwrap_or(u32::MAX),
        }
    }
}

/// The window closes: the new limit from its figures, and whether a cut follows (see the
/// module docs).
fn update(estimate: &mut Estimate, bounds: Bounds, now: Now, seen: &mut Seen) {
    let window = estimate.window;
    let votes = window.votes;
    let limit = estimate.limit_pm;
    let (before_us, cut_pm) = (estimate.latency_us, estimate.low_pm());
    let occupancy_pm = estimate.occupancy_pm();
    let (mut deeper, mut above) = (false, None);
    // A cut's latency is its own calls': those admitted at low occupancy. The others were
    // admitted before the processes learnt the cut (a report's interval, a quarter of its
    // window), queued as the limit before it did, and a cut that follows one that still
    // queued would read faster than it by their share and go deeper again, below the capacity.
    // Unless nobody had a base before (a fleet's first cut): latencies count up to twice a
    // process's base, uncounted before it has one, and the calls admitted before the cut,
    // counted as the window before counted its own, keep the two comparable. Nor on fewer
    // calls than a base moves on, nor on more than the window's own (what windows an older
    // script closed, in a mixed fleet, left in the stored sums).
    let own = estimate.cut
        && estimate.base_us > 0
        && (vote::MIN_BASE..=window.samples).contains(&window.low_samples)
        && window.low_sum_us <= window.sum_us;
    let (sum_us, samples, deeper_pm) = match own {
        true => (window.low_sum_us, window.low_samples, DEEPER_PM),
        false => (window.sum_us, window.samples, DEEPER_WHOLE_PM),
    };
    if let Some(latency) = sum_us.checked_div(samples) {
        deeper = estimate.cut && before_us > 0 && latency * 1000 <= before_us * deeper_pm;
        // A cut of its own calls that did not still queue: its latency fell with the occupancy
        // as far as an unqueued downstream's falls from one queued at the occupancy before
        // (Little's law: `C / D`), and by more than one at 1.1 × C would.
        if own && !deeper && latency <= MAX_LATENCY_US && latency * 1000 < before_us * ABOVE_PM {
            above = Some(latency * 1000 / before_us);
        }
        estimate.latency_us = latency;
    }
    let weight = votes.weight();
    if let Some(base) = votes.base_sum.checked_div(weight) {
        estimate.base_us = base;
    }
    let low_share = window.low > 0 && window.low * 1000 >= window.calls * LOW_SHARE_PM;
    if low_share {
        estimate.low_ms = now.ms;
    }
    let measuring = estimate.cut || low_share;
    // Bases that fell by a quarter since they were measured were measured wrong (a warm-up's):
    // the votes on them read clear on a queued downstream, so they are measured again first.
    // Not within VERIFY_MS of the last cut's start, whose calls still lower them. Compared up
    // to MAX_LATENCY_US, so that the products stay exact in the script's numbers whatever a
    // field holds.
    let fallen = !measuring
        && estimate.base_us.min(MAX_LATENCY_US) * 1000
            < estimate.measured_us.min(MAX_LATENCY_US) * FALLEN_PM
        && now.ms >= estimate.low_ms.saturating_add(VERIFY_MS);
    // From there, or from the bases that fell: a cut an older script closes in a mixed fleet
    // (which leaves this untouched) is not called again until they fall by another quarter.
    if (measuring || fallen) && weight > 0 {
        estimate.measured_us = estimate.base_us;
    }
    // Every product stays below 2^53 (a limit below 2^32 × 1000, a ratio at most 2000, a
    // growth of 1200): exact in the script's numbers too.
    let mut target = limit;
    let (mut verify, mut lowered) = (false, false);
    if weight == 0 {
        Branch::Unjudged.reach(seen);
    } else if fallen {
        Branch::Fallen.reach(seen);
        verify = true;
    } else if votes.queued * 2 > weight {
        let ratio = (votes.ratio_sum / votes.queued).max(QUEUED_PM);
        let queued = limit * CLEAR_PM / ratio;
        if now.ms < estimate.low_ms.saturating_add(VERIFY_MS) {
            Branch::Queued.reach(seen);
            lowered = true;
            target = queued;
        } else if limit > estimate.settled_pm
            && limit * 2000 <= estimate.settled_pm.saturating_mul(1000 + GROWTH_PM)
        {
            // The same bases read no queue at the limit before the growth and a queue now:
            // the latency grew with the calls in flight, whatever the bases' age. The growth
            // is undone without a cut; below it, the bases are measured again first. Only a
            // probe's growth (half-way to 1.2 ×): a limit further above the last settled one
            // grew some other way (an older script in a mixed fleet, a raised `min`).
            Branch::Undone.reach(seen);
            lowered = true;
            target = queued.max(estimate.settled_pm);
        } else {
            // Bases learnt long ago may be from another downstream (or host): measured
            // again before the limit falls on them.
            Branch::Verify.reach(seen);
            verify = true;
        }
    } else if votes.clear * 2 > weight && !estimate.cut {
        // A cut's calls ran below the limit: they tell whether it queues even there, not
        // whether it could be higher.
        Branch::Probed.reach(seen);
        estimate.settled_pm = limit;
        target = limit * growth_pm(votes.clear_sum / votes.clear) / 1000;
    } else {
        Branch::Unsure.reach(seen);
        if !estimate.cut {
            estimate.settled_pm = limit;
        }
    }
    if deeper {
        Branch::Deeper.reach(seen);
        target = target.min(cut_pm * CLEAR_PM / 1000);
    } else if let Some(fell_pm) = above {
        // The capacity is the occupancy before the cut times that fall: the limit at 1.1 × it.
        // A fleet resting high in the band where votes hold (at 1.2 × C with one slow request
        // in ten, or one slow process hoarding slots) comes down to it; a cut from 1.1 × C
        // or under reads no such fall, and latency that does not fall with the occupancy (a
        // busy host, a slow process) only makes the fall, and so the correction, smaller.
        Branch::Above.reach(seen);
        target = target.min(occupancy_pm * fell_pm / 1000 * CLEAR_PM / 1000);
    }
    if window.peak * 2 * 1000 < limit {
        Branch::AppLimited.reach(seen);
        target = target.min(limit);
    }
    let target = target.max(limit / 2);
    // Lowered at once: a queued target is where Little's law puts the ratio at CLEAR_PM, and
    // halfway there the votes would read unsure at the top of their band and hold. Raised
    // halfway, as a probe is a guess.
    let next = bounds.clamp_pm(if target < limit {
        target
    } else {
        (limit + target) / 2
    });
    match next.cmp(&limit) {
        std::cmp::Ordering::Greater => Branch::Grew.reach(seen),
        std::cmp::Ordering::Less => Branch::Shrank.reach(seen),
        std::cmp::Ordering::Equal => Branch::Held.reach(seen),
    }
    estimate.limit_pm = next;
    // A deeper cut is ¾ of this one, whatever the occupancy the window's first calls, admitted
    // before the cut, showed.
    estimate.level = if deeper {
        window.peak.min(cut_pm / 1000)
    } else {
        window.peak
    };
    // The period before the next cut. A cut in which voters weighed at least half the calls
    // and that did not still queue (its latency did not fall as a saturated downstream's
    // would, its votes were not queued) found nothing it could tell was wrong, or only a
    // limit a little above 1.1 × C (weak evidence: its votes judge the bases it has just
    // moved; a correction of a tenth calls for no more cuts): the next can wait twice as
    // long. A cut that still queued, or a verification, found them wrong; a window outside a
    // cut whose calls mostly went unjudged, with no share at low occupancy to measure bases
    // on, has processes without a base (a new process, a rolling restart): back to the first
    // period. A cut nobody judged keeps it.
    let judged = weight * 2 >= window.calls;
    estimate.every_ms =
        if verify || deeper || estimate.cut && lowered || !estimate.cut && !judged && !low_share {
            CUT_EVERY_MS
        } else if estimate.cut && judged {
            (estimate.every_ms * 2).min(MAX_CUT_EVERY_MS)
        } else {
            estimate.every_ms
        };
    // A window that never filled the limit (its highest occupancy under it, and no call
    // refused) gave the limit nothing to do: a cut would refuse calls the downstream has room
    // for (a quarter of a healthy downstream's, for a second in every forty), to measure bases
    // its votes check already (queued votes on old bases call a cut: Verify; faster calls
    // lower them). Unless most of its calls went unjudged: in a fleet whose occupancy holds
    // steady, a cut is how processes without a base (most of a rolling restart) get one; a
    // lone one waits, its calls unjudged, while the others' votes steer.
    let due = now.ms >= estimate.low_ms.saturating_add(estimate.every_ms);
    let filled = window.peak >= limit / 1000 || window.refused > 0;
    estimate.cut = verify || deeper || due && (filled || !judged);
    if due && !estimate.cut {
        Branch::Unfilled.reach(seen);
    }
    if estimate.cut {
        Branch::Cut.reach(seen);
        estimate.low_ms = now.ms;
    }
}

/// A probe's target (thousandths of the limit) on clear votes at `ratio_pm`, on average.
/// Unqueued (at most 1), the downstream may have any room left: [`GROWTH_PM`]. Between 1 and
/// [`CLEAR_PM`] it queues a little already (Little's law: `D = ratio × C`), and the growth
/// tapers to none at [`CLEAR_PM`]: halfway there, as a probe moves, it puts the downstream
/// near `CLEAR_PM × C` whatever the ratio, so the fleet comes to rest below the queued votes'
/// threshold rather than probing past it. An older process's clear votes carry no ratio, and
/// read as unqueued.
fn growth_pm(ratio_pm: u64) -> u64 {
    let over = ratio_pm.saturating_sub(1000).min(CLEAR_PM - 1000);
    GROWTH_PM - (GROWTH_PM - 1000) * over / (CLEAR_PM - 1000)
}

static SCRIPT: Script = Script::new("adaptive limit", &[include_str!("adaptive.lua")]);

impl Scripted for Adapt {
    const SCRIPT: &'static Script = &SCRIPT;
    const KEYS: &'static [&'static str] = &["adaptive"];
    const WIDTH: usize = 7;

    fn encode(batch: &[&Report], _: &Wire<'_>, sink: &mut dyn Sink) {
        let report = batch[0];
        let observed = report.observed;
        let votes = observed.votes;
        for n in [
            observed.samples,
            observed.sum_us,
            observed.calls,
            observed.low,
            observed.peak,
            votes.queued,
            votes.clear,
            votes.unsure,
            votes.ratio_sum,
            votes.base_sum,
            report.bounds.min.into(),
            report.bounds.initial.into(),
            report.bounds.max.into(),
            report.window_ms,
            report.joined_ms,
            votes.clear_sum,
            observed.low_samples,
            observed.low_sum_us,
            observed.refused,
        ] {
            sink.int(n);
        }
    }

    fn decode(reply: &[i64]) -> Result<Learnt, Malformed> {
        Ok(Learnt {
            limit: Malformed::count(reply[0])?,
            full: Malformed::count(reply[1])?,
            low_at: Malformed::count(reply[2])?,
            latency_us: Malformed::natural("latency", reply[3])?,
            base_us: Malformed::natural("base latency", reply[4])?,
            joined_ms: Malformed::natural("window start", reply[5])?,
            processes: Malformed::count(reply[6])?,
        })
    }
}
