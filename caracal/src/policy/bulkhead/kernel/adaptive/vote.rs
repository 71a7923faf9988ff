//! One process's judgement of its own calls, sent with each report: the [`Sampling`] a view
//! keeps. Pure, like the fleet's step, and on the process's side of the wire: what goes out is
//! a vote, never a raw latency that another process's would be compared with.

use super::{CLEAR_PM, LOW_PM, MAX_LATENCY_US, MAX_RATIO_PM, MAX_SUM, Observed, add};

/// The fewest calls a vote judges: fewer say more about chance than about the downstream.
pub(crate) const MIN_VOTE: u64 = 3;
/// The fewest successes at low occupancy that move the base.
pub(crate) const MIN_BASE: u64 = 3;
/// Calls at low occupancy at most this share (thousandths) slower than those near the limit,
/// and faster by less than the occupancy fell ([`unmoved`]), were not made faster by the lower
/// occupancy: latency that does not fall with the occupancy is not queueing (a busy host, a
/// downstream slower for good), and the base follows them. Otherwise it only falls: faster
/// calls at low occupancy are the queueing the base must not learn, and slower ones mean the
/// downstream changed since the latency near the limit was measured (a cut that still queued
/// because the capacity fell below it). Drop shares are compared within it either way.
pub(crate) const UNMOVED_PM: u64 = 100;
/// The latencies the two occupancies are compared by count up to the base and this many times
/// less one the service time (four times the base where no call is slower), not twice as the
/// vote's do: capped at twice, a queue two to four times the base reads the
/// same at the limit and at the cut (both at the cap), looks unmoved, and the base would learn
/// the queued latency (a slow process holding slots outside the downstream keeps the fleet's
/// limit there, and the cut still queues).
pub(crate) const COMPARED_TIMES: u64 = 4;

/// Calls at low occupancy whose mean latency is at most this share (thousandths) of the mean
/// near the limit fell with the occupancy: a cut at ¾ of a queued limit ([`LOW_PM`]) answers
/// in ¾ of the time (Little's law), with a tenth to spare ([`CLEAR_PM`]). Wider than the
/// fleet's test of a cut that still queued ([`DEEPER_PM`](super::DEEPER_PM)): read as unmoved,
/// a queued cut would raise the base to the queue's latency, and the limit would climb on
/// clear votes, where a cut that did not queue read as fallen only keeps a base from rising.
pub(crate) const FELL_PM: u64 = LOW_PM * CLEAR_PM / 1000;

/// Whether calls at low occupancy averaging `low_us` were not made faster by the lower
/// occupancy than calls near the limit averaging `near_us`: at most [`UNMOVED_PM`] slower, and
/// faster by less than the occupancy fell ([`FELL_PM`]).
fn unmoved(low_us: u64, near_us: u64) -> bool {
    low_us * 1000 >= near_us * FELL_PM && low_us * 1000 <= near_us * (1000 + UNMOVED_PM)
}

/// How many standard errors a report's mean latency is given before it may lower the base.
pub(crate) const CHANCE_SE: u64 = 2;
/// The most chance is given, in thousandths of the mean: a fifth. A report's mean, its
/// latencies counted up to twice the base, varies by far less (one slow request in ten at
/// random: a twentieth); wider, the spread is a warm-up's (connections opening, a base taken
/// then), whose base must come down within a report, not as the spread fades.
pub(crate) const MAX_CHANCE_PM: u64 = 200;

/// Calls of one kind of admission since the last report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Bucket {
    samples: u64,
    /// The successes' latencies (each up to [`Sampling::counted_cap_us`]), in microseconds.
    sum_us: u64,
    /// Their squares, for the mean's standard error.
    squares: u128,
    /// The same, each up to [`COMPARED_TIMES`] the base.
    compared_us: u64,
    /// The same, uncounted (each up to [`MAX_LATENCY_US`]).
    served_us: u64,
    drops: u64,
    /// The drops' durations, likewise.
    drops_us: u64,
}

impl Bucket {
    fn calls(&self) -> u64 {
        self.samples + self.drops
    }

    /// The slowest mean latency these successes could be a chance sample of, for successes
    /// whose latency varies by `variance` (µs²): their mean plus [`CHANCE_SE`] standard errors,
    /// at most [`MAX_CHANCE_PM`] of it.
    ///
    /// A base lowered to every mean that fell below it would learn the fastest of many reports
    /// (a slow class of requests, a busy host: a report's mean varies by a twentieth), sit below
    /// the latency of an empty downstream, and hold the limit on unsure votes where it should
    /// probe. The variance is the process's, learnt over reports: a report's own is as much
    /// a matter of chance (of a few calls in a dip, none of the slow class).
    fn slowest_mean_us(&self, variance: u128) -> Option<u64> {
        let mean = self.sum_us.checked_div(self.samples)?;
        let error = (variance / u128::from(self.samples)).isqrt();
        let error = u64::try_from(error).unwrap_or(u64::MAX);
        let chance = error
            .saturating_mul(CHANCE_SE)
            .min(mean * MAX_CHANCE_PM / 1000);
        Some(mean + chance)
    }

    /// The sum of the successes' squared deviations from their mean (µs²).
    fn deviations(&self) -> u128 {
        let sum = u128::from(self.sum_us);
        self.squares
            .saturating_sub((sum * sum).checked_div(self.samples.into()).unwrap_or(0))
    }

    /// The share of the time these calls held their slots that went to drops (thousandths).
    fn drop_share_pm(&self) -> Option<u64> {
        (self.drops_us * 1000).checked_div(self.sum_us + self.drops_us)
    }
}

/// What a process learnt of its calls: since its last report, split by the fleet's occupancy
/// at their admission; and over its life, its base.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Sampling {
    low: Bucket,
    high: Bucket,
    peak: u64,
    /// Attempts the fleet was full for since the last report (see [`Observed::refused`]).
    refused: u64,
    /// The occupancy the last lease reply showed, kept across reports (0: none yet).
    last_occupancy: u64,
    /// The mean latency of its successes at low occupancy, averaged over reports (0: none yet).
    base_us: u64,
    /// The mean latency of its successes near the limit (each up to [`COMPARED_TIMES`] the
    /// base), averaged half-way per report (0: none yet).
    near_us: u64,
    /// The last report's mean near the limit, alone: the average lags a capacity that just
    /// changed (0: none).
    last_near_us: u64,
    /// The share of slot time its drops took at low occupancy (thousandths), averaged likewise
    /// and moved by the same rule as the base.
    drop_share_pm: u64,
    /// The same share near the limit, averaged half-way per report (`None`: no call near it).
    near_drop_pm: Option<u64>,
    /// The variance of a success's latency (µs², as the vote counts it), averaged over
    /// reports, an eighth of the way per report (0: none yet).
    variance: u128,
    /// The fleet's base, as the last answer gave it (the voters' mean; 0: none).
    fleet_base_us: u64,
    /// How much longer a success took than it was counted, on average over reports: a slow
    /// class's time past the cap (0 where no call reaches it). The base plus this is the
    /// service time, what an unqueued call takes, slow requests included, and what a call's
    /// wait in a queue compares with (see [`ratio_pm`](Self::ratio_pm)).
    excess_us: u64,
    /// Whether [`excess_us`](Self::excess_us) has been learnt from a report.
    excess_learnt: bool,
    /// The last report's successes' mean latency, as counted, whether sent or not (see
    /// [`last_mean_us`](Self::last_mean_us)).
    last_mean_us: Option<u64>,
}

impl Sampling {
    /// Adds one body's outcome: how long it held its slot, and whether it succeeded; `low` if
    /// it was admitted at low occupancy.
    pub(crate) fn body(&mut self, low: bool, elapsed_us: u64, succeeded: bool) {
        // Up to the counted cap (twice the base where no call is slower): a slow class of
        // requests, or a drop that waited for a timeout, weighs as much as a call queued that
        // long, at every occupancy alike. Before a base of its own, a process counts up to
        // [`COMPARED_TIMES`] the fleet's (for its drops' share of its slots' time: its
        // latencies go out only once it has a base, see `report`), and compares its latencies
        // uncounted: its first base is their mean, its own however slow.
        let cap = match (self.base_us, self.fleet_base_us) {
            (0, 0) => MAX_LATENCY_US,
            (0, fleet) => fleet.saturating_mul(COMPARED_TIMES),
            (_, _) => self.counted_cap_us(),
        };
        let compared_cap = match self.base_us {
            0 => MAX_LATENCY_US,
            base => base.saturating_add(self.service_us().saturating_mul(COMPARED_TIMES - 1)),
        };
        let us = elapsed_us.min(cap).min(MAX_LATENCY_US);
        let compared = elapsed_us.min(compared_cap).min(MAX_LATENCY_US);
        let bucket = if low { &mut self.low } else { &mut self.high };
        if succeeded {
            bucket.samples += 1;
            add(&mut bucket.sum_us, us);
            bucket.squares = bucket.squares.saturating_add(u128::from(us).pow(2));
            add(&mut bucket.compared_us, compared);
            add(&mut bucket.served_us, elapsed_us.min(MAX_LATENCY_US));
        } else {
            bucket.drops += 1;
            add(&mut bucket.drops_us, us);
        }
    }

    /// The service time: the base and a slow class's time past the cap.
    fn service_us(&self) -> u64 {
        self.base_us.saturating_add(self.excess_us)
    }

    /// What a success's latency counts up to once the process has a base: the base plus the
    /// larger of the base and half the service time (where no call takes twice the base,
    /// twice the base; a slow class of requests counts up to half a service time over it, so
    /// that its share cannot swamp the mean, and a queue reads up to 1.5 × before its calls
    /// reach the cap).
    fn counted_cap_us(&self) -> u64 {
        self.base_us
            .saturating_add(self.base_us.max(self.service_us() / 2))
    }

    /// The mean latency of the last report's successes, as counted (`None`: it had none),
    /// including those of a process that sends its calls without their latencies until it has
    /// a base: its share of the fleet's slots compares it with the fleet all the same (judged
    /// by what it sent, a slow replica without a base would read as fast as the fleet, and
    /// hold as many slots outside the downstream as its tasks could until its first cut).
    pub(crate) fn last_mean_us(&self) -> Option<u64> {
        self.last_mean_us
    }

    /// Notes the fleet's base an answer to a report showed (the voters' mean; 0: none).
    pub(crate) fn fleet_base(&mut self, base_us: u64) {
        self.fleet_base_us = base_us;
    }

    /// Notes a fleet occupancy a lease reply showed, and whether it refused the call.
    pub(crate) fn occupancy(&mut self, occupancy: u32, refused: bool) {
        self.last_occupancy = occupancy.into();
        self.peak = self.peak.max(self.last_occupancy);
        self.refused += u64::from(refused);
    }

    /// Notes a call refused in the process, at its share of a saturated fleet, without asking:
    /// it asked for a slot of the fleet the last lease reply showed. So its report counts it
    /// among the processes that ask, and keeps the bound while the fleet read full, where one
    /// without an occupancy read as a fleet below its limit (the bound lifted every other
    /// report, and the process took back in a burst the slots it had let go); the first reply
    /// showing slots free, once a body of its own ends and its next call asks, lifts it.
    pub(crate) fn refused_here(&mut self) {
        self.peak = self.peak.max(self.last_occupancy);
        self.refused += 1;
    }

    /// The highest fleet occupancy noted since the last report.
    #[cfg(test)]
    pub(crate) fn peak(&self) -> u64 {
        self.peak
    }

    /// The calls the fleet was full for, noted since the last report.
    #[cfg(test)]
    pub(crate) fn refused(&self) -> u64 {
        self.refused
    }

    /// Whether nothing was observed since the last report.
    pub(crate) fn is_empty(&self) -> bool {
        self.low.calls() + self.high.calls() == 0 && self.peak == 0 && self.refused == 0
    }

    /// The report of what was observed since the last, with this process's vote. First the base
    /// moves towards what the calls at low occupancy showed; then the vote judges, against it,
    /// the calls admitted near the limit or, with too few of those (a cut, a quiet fleet), the
    /// others.
    ///
    /// `cut`: whether the limit in force was a cut's (the calls near the limit it had before
    /// are what the cut's are compared with).
    pub(crate) fn report(&mut self, cut: bool) -> Observed {
        let (low, high) = (self.low, self.high);
        let capped = self.base_us > 0;
        let mut observed = Observed {
            samples: low.samples + high.samples,
            calls: low.calls() + high.calls(),
            low: low.calls(),
            peak: self.peak,
            refused: self.refused,
            ..Observed::default()
        };
        let samples = low.samples + high.samples;
        let counted = low.sum_us.saturating_add(high.sum_us).checked_div(samples);
        if let (true, Some(counted)) = (capped, counted)
            && samples >= MIN_VOTE
            && counted.saturating_mul(4) < self.counted_cap_us().saturating_mul(3)
        {
            // The slow class's time past the cap, from every success: served in order, every
            // call waits alike, so the uncounted mean is the counted one and that time (the
            // slow class's share of the wait too, a tenth of it with one slow request in ten).
            // Not from a report whose counted mean nears the cap: there calls queued past it
            // would read as a slow class. Averaged over reports (one slow request in ten moves
            // a report's uncounted mean by a quarter); the first report with a base sets it,
            // before this report's latencies go out raised by it (later, one report's tail
            // past the cap as a queue builds moves it by an eighth, not to itself).
            let served = low.served_us.saturating_add(high.served_us) / samples;
            // At most four times the base: a few calls held for minutes (timeouts) would
            // otherwise make the service time so long that no queue read as one.
            let excess = served
                .saturating_sub(counted)
                .min(self.base_us.saturating_mul(COMPARED_TIMES));
            self.excess_us = match self.excess_learnt {
                false => excess,
                true => self.excess_us - self.excess_us / 8 + excess / 8,
            };
            self.excess_learnt = true;
        }
        // Each latency as far over the service time as it is over the base: the fleet compares
        // windows' latencies by how far they fell with the occupancy (Little's law), and a
        // slow class counted at its cap keeps the base, and every window's latency, far under
        // the service time, so that a wait of a tenth of it read as a fall of more than a
        // fifth (a cut at rest read as one that still queued, and went deeper).
        let shift = self.excess_us;
        let shifted = |bucket: &Bucket| {
            bucket
                .sum_us
                .saturating_add(shift.saturating_mul(bucket.samples))
                .min(MAX_SUM)
        };
        add(&mut observed.sum_us, shifted(&low));
        add(&mut observed.sum_us, shifted(&high));
        observed.low_samples = low.samples;
        observed.low_sum_us = shifted(&low);
        self.last_mean_us = observed.sum_us.checked_div(observed.samples);
        if self.base_us == 0 && self.fleet_base_us > 0 {
            // Joined a fleet that has bases: its latencies cannot yet be raised by its slow
            // class's time past the cap as the others' are, and counted lower they would make
            // the window it joins read faster than the one before (with one slow request in
            // ten, a fourth process's calls took a fleet at rest at 12 of C = 10 through a cut
            // that read as still queued, to 9 and the downstream to 6.7). Its calls count; its
            // latencies wait for its base.
            (observed.samples, observed.sum_us) = (0, 0);
            (observed.low_samples, observed.low_sum_us) = (0, 0);
        }
        // Outside a cut, calls at low occupancy beside calls near the limit were admitted in a
        // dip of the fleet's occupancy (slots released in a burst, by a starved process or
        // host, or by calls failing fast and backing off) and met the queue, or the refusals,
        // the calls before them left: they may lower the base and the drop share, never raise
        // them.
        let dipped = !cut && high.calls() >= MIN_VOTE;
        if low.samples >= MIN_BASE {
            let mean = (low.sum_us / low.samples).max(1);
            // With no call near the limit to compare with, the fleet runs below it: its calls
            // at low occupancy are its calls.
            let compared = low.compared_us / low.samples;
            let unmoved = self.near_us == 0
                || unmoved(compared + shift, self.near_us + shift)
                    && unmoved(compared + shift, self.last_near_us + shift);
            // In a dip, a few calls a report: only beyond chance (a cut's are many, and rare).
            let faster = |base| match dipped {
                true => low
                    .slowest_mean_us(self.variance)
                    .is_some_and(|slowest| slowest < base),
                false => mean < base,
            };
            self.base_us = match self.base_us {
                0 => compared.max(1),
                _ if unmoved && !dipped => mean,
                base if faster(base) => (base + mean) / 2,
                base => base,
            };
        }
        if high.samples >= MIN_VOTE
            && self.base_us > 0
            && let Some(slowest) = high.slowest_mean_us(self.variance)
        {
            // Queueing only adds latency: calls near the limit faster than the base, beyond
            // chance, show it too high (a first base taken from a process's warm-up), and
            // lower it at once.
            self.base_us = self.base_us.min(slowest.max(1));
        }
        let judged = if high.calls() >= MIN_VOTE { high } else { low };
        if self.base_us > 0 && judged.calls() >= MIN_VOTE {
            observed
                .votes
                .add(judged.calls(), self.ratio_pm(&judged), self.base_us);
        }
        if high.samples >= MIN_VOTE {
            let mean = high.compared_us / high.samples;
            self.near_us = match self.near_us {
                0 => mean,
                near => (near + mean) / 2,
            };
            self.last_near_us = mean;
        } else if !cut {
            self.near_us = 0;
            self.last_near_us = 0;
        }
        // Learnt from latencies capped as the vote counts them, so not before a base: a
        // first report's slow class, uncounted, would keep a warm-up's base for many reports.
        let samples = u128::from(low.samples + high.samples);
        if let (true, Some(variance)) = (
            capped,
            (low.deviations() + high.deviations()).checked_div(samples),
        ) {
            self.variance = match self.variance {
                0 => variance,
                before => before - before / 8 + variance / 8,
            };
        }
        if let Some(share) = low.drop_share_pm()
            && low.calls() >= MIN_BASE
        {
            // Drops that did not become rarer at low occupancy are not the downstream's
            // overload (it fails that share whatever the load); rarer ones are. In a dip they
            // are as frequent as near the limit because the downstream is as full.
            let unmoved = self
                .near_drop_pm
                .is_none_or(|near| share.abs_diff(near) <= UNMOVED_PM);
            if share < self.drop_share_pm || unmoved && !dipped {
                self.drop_share_pm = (self.drop_share_pm + share) / 2;
            }
        }
        if high.calls() >= MIN_VOTE {
            let share = high.drop_share_pm().unwrap_or(0);
            self.near_drop_pm = Some(self.near_drop_pm.map_or(share, |near| (near + share) / 2));
        } else if !cut {
            self.near_drop_pm = None;
        }
        self.low = Bucket::default();
        self.high = Bucket::default();
        self.peak = 0;
        self.refused = 0;
        observed
    }

    /// How much longer than this process's base its calls took (thousandths), or how much
    /// more of their slots' time went to drops than at low occupancy — a slot held by a drop
    /// is a slot the downstream did not serve in: past its capacity, `D` slots of which `C`
    /// succeed read `D / C`, as a queue of `D` would.
    ///
    /// The latency over the base is read against the service time, not the base: a queue of
    /// `D` past a capacity `C` makes each call wait `(D / C − 1)` times the mean service time,
    /// slow requests included (Little's law), and the wait is what a call's latency gains
    /// over the base. Where no call takes twice the base, the two are the same and the ratio
    /// is the mean over the base. With a slow class counted at its cap, the base is its fast
    /// calls' latency: one slow request in ten at 40 × the others, at a tenth past the
    /// capacity, read a ratio of 1.4 over the base, and the fleet came to rest at the
    /// capacity, its cuts at three quarters of it.
    fn ratio_pm(&self, calls: &Bucket) -> u64 {
        let base = self.base_us;
        let service = self.service_us();
        let latency_pm = calls
            .sum_us
            .checked_div(calls.samples)
            .map_or(1000, |mean| match mean.checked_sub(base) {
                Some(over) => 1000 + mul_div(over, 1000, service),
                None => 1000u64.saturating_sub(mul_div(base - mean, 1000, service)),
            });
        let dropping_pm = calls
            .drop_share_pm()
            .map_or(0, |share| share.saturating_sub(self.drop_share_pm));
        let drops_pm = 1_000_000u64
            .checked_div(1000 - dropping_pm)
            .unwrap_or(MAX_RATIO_PM);
        latency_pm.max(drops_pm).min(MAX_RATIO_PM)
    }
}

/// `n × by / over`, without overflow (0 over 0).
fn mul_div(n: u64, by: u64, over: u64) -> u64 {
    let product = u128::from(n) * u128::from(by);
    u64::try_from(product.checked_div(over.into()).unwrap_or(0)).unwrap_or(u64::MAX)
}
