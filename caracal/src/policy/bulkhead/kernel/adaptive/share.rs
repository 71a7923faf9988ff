//! A process's share of a saturated fleet: how many of the limit's slots a process may hold
//! when it holds each longer than the fleet's calls take.
//!
//! No limit on the fleet's slots helps a downstream whose slots are held outside it: a replica
//! whose bodies keep their thread after the reply (a starved or pausing replica) takes free
//! slots as fast as the others and keeps each longer, so it comes to hold most of a saturated
//! fleet's, and the more it holds the longer each waits for its threads. In the field harness
//! a static limit of 20 left the downstream at 6 of its 20, and the adaptive limit's downstream
//! swung between half and all of it from one second to the next. So a process slower than the
//! fleet by more than [`SLOWER_PM`] holds at most the limit over the processes that asked for
//! slots in the last window, while the fleet is at its limit: its calls past that are refused
//! in the process (or wait for a body of its own to end, within `max_wait`), and the slots it
//! lets go go to the others. A call refused there asks for a slot of the fleet the last lease
//! reply showed, and its report says so (else a bounded process refused everything for a
//! report went uncounted, read the fleet as below its limit, and took its slots back). Alone,
//! or in a fleet with slots to spare, it holds what the fleet admits; a process slow for its
//! own reasons (heavier requests) still has its equal share.
//!
//! The processes are those that asked for slots in the last window, admitted or refused. A
//! process that holds its share and more than half of the others' while they ask is read as
//! slower than the fleet, whatever its latency: the others were refused and ended few calls or
//! none, so the fleet's latency was its own (a slow process whose tasks took the first slots of
//! a start held every one of them, and the downstream ran at a tenth of its capacity).
//!
//! Not work-conserving in three cases: every process that asked counts alike, so
//! processes with a trickle of calls shrink the share of a slower busy one (two busy processes
//! and eight trickling: a tenth of the limit); a slower process that is itself what fills
//! the fleet, bounded, leaves slots free until a body of its own ends, its next call's reply
//! shows them free, and its next report (250 ms) lifts the bound; and so does a process with most of the fleet's traffic that holds most of its slots while a
//! trickling one is refused, read as slower for about two seconds of reports.

use super::Learnt;

/// How much slower (thousandths) than the fleet's a process's mean latency must be, averaged
/// over its reports, before its slots are bounded by its share.
pub(crate) const SLOWER_PM: u64 = 1_200;

/// The most one report counts: half again the fleet's latency (a new process's first calls,
/// opening connections before it has a base to count them up to, would bound it at once).
const MAX_SLOWER_PM: u64 = 1_500;

/// How far each report moves the average (a fraction: over about two seconds of reports). The
/// fleet's latency rises when the slots a bounded process lets go queue at the downstream, and
/// falls when it holds them again, so that one report's comparison flips every second or two;
/// the average does not, and neither does the bound.
const AVERAGED_OVER: u64 = 8;

/// What a process learnt of how its calls compare with the fleet's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Share {
    /// Its mean latency over the fleet's, in thousandths, averaged over reports (0: no report
    /// yet, read as the fleet's).
    slower_pm: u64,
}

impl Share {
    /// Learns from a report answered with `learnt`, whose successes took `mean_us` on average
    /// (as the process counts them, whether or not it sent them: see
    /// [`Sampling::last_mean_us`](super::vote::Sampling::last_mean_us)) and which saw the
    /// fleet's occupancy reach `peak` (a call refused at the share: the last lease reply's),
    /// `held` of its calls holding a slot (or asking for one)
    /// as the answer came:
    /// the most slots of the limit in force the process may hold until the next answer,
    /// `None` when it may hold as many as the fleet admits.
    pub(crate) fn learn(
        &mut self,
        mean_us: Option<u64>,
        peak: u64,
        held: u32,
        learnt: &Learnt,
    ) -> Option<u32> {
        // A report without a success (only failures; a bounded process's quiet quarter of a
        // second) keeps the average: it says nothing of latency, and lifting the bound on it
        // would let the process take its slots back in a burst. A process starts as fast as
        // the fleet.
        let slower = mean_us.and_then(|mean| (mean * 1000).checked_div(learnt.latency_us));
        if let Some(slower) = slower {
            let was = match self.slower_pm {
                0 => 1000,
                was => was,
            };
            self.slower_pm =
                (was * (AVERAGED_OVER - 1) + slower.min(MAX_SLOWER_PM)) / AVERAGED_OVER;
        }
        let share = learnt.limit.div_ceil(learnt.processes.max(1)).max(1);
        let shared = learnt.processes >= 2 && peak >= u64::from(learnt.limit);
        // Holding its share and more than half the others' while they ask for slots: they
        // were refused, ended few calls or none, and the fleet's latency is this process's
        // own, so no latency can show it slower (one slow process whose tasks took the first
        // slots held all 16 of a limit of 16, the downstream at 2 of 20, for seconds).
        if shared && held > share + learnt.limit.saturating_sub(share) / 2 {
            self.slower_pm = MAX_SLOWER_PM;
        }
        (shared && self.slower_pm > SLOWER_PM).then_some(share)
    }
}

#[cfg(test)]
mod tests {
    use super::super::vote::Sampling;
    use super::*;

    /// A limit of 25 in force, the fleet's calls at 20 ms, `processes` of them.
    fn learnt(processes: u32) -> Learnt {
        Learnt {
            limit: 25,
            full: 25,
            low_at: 18,
            latency_us: 20_000,
            base_us: 18_000,
            joined_ms: 1_000,
            processes,
        }
    }

    /// What a process's two seconds of reports of calls at `mean_us` and `peak`, each
    /// answered with `learnt`, leave.
    fn steady(mean_us: u64, peak: u64, learnt: &Learnt) -> Option<u32> {
        let mut share = Share::default();
        (0..8)
            .map(|_| share.learn(Some(mean_us), peak, 0, learnt))
            .last()
            .flatten()
    }

    #[test]
    fn a_process_holding_slots_longer_than_the_fleet_is_held_to_its_share_of_a_full_one() {
        // 30 ms against the fleet's 20: a third of 25, rounded up.
        assert_eq!(steady(30_000, 25, &learnt(3)), Some(9));
        assert_eq!(steady(30_000, 40, &learnt(2)), Some(13));
    }

    #[test]
    fn any_other_process_may_hold_what_the_fleet_admits() {
        // As fast as the fleet, or slower by no more than a fifth.
        assert_eq!(steady(20_000, 25, &learnt(3)), None);
        assert_eq!(steady(24_000, 25, &learnt(3)), None);
        // A fleet below its limit: nobody waits for the slots it holds.
        assert_eq!(steady(30_000, 24, &learnt(3)), None);
        // Alone, or before any window closed.
        assert_eq!(steady(30_000, 25, &learnt(1)), None);
        assert_eq!(steady(30_000, 25, &learnt(0)), None);
        // No call succeeded, or no latency of the fleet's yet: nothing to compare.
        assert_eq!(Share::default().learn(None, 25, 0, &learnt(3)), None);
        let fleet_unknown = Learnt {
            latency_us: 0,
            ..learnt(3)
        };
        assert_eq!(steady(30_000, 25, &fleet_unknown), None);
    }

    /// One process holding every slot of a saturated fleet while two others ask (their calls
    /// refused: its latency is the fleet's) is held to its share at once, and stays so while
    /// its calls are slower than those the others end once they have slots; holding its
    /// share, or alone, or in a fleet with slots to spare, it is not.
    #[test]
    fn a_process_holding_most_slots_while_others_ask_is_held_to_its_share() {
        let hoard = Learnt {
            limit: 16,
            latency_us: 77_000,
            ..learnt(3)
        };
        let mut hoarding = Share::default();
        assert_eq!(hoarding.learn(Some(77_000), 16, 16, &hoard), Some(6));
        for _ in 0..8 {
            assert_eq!(hoarding.learn(Some(40_000), 25, 9, &learnt(3)), Some(9));
        }
        // More than its share and half the others' (6 + 5) only.
        assert_eq!(Share::default().learn(Some(77_000), 16, 11, &hoard), None);
        assert_eq!(
            Share::default().learn(Some(77_000), 16, 12, &hoard),
            Some(6)
        );
        let alone = Learnt {
            processes: 1,
            ..hoard
        };
        assert_eq!(Share::default().learn(Some(77_000), 16, 16, &alone), None);
        assert_eq!(Share::default().learn(Some(77_000), 15, 15, &hoard), None);
    }

    /// The fleet's latency swings with what a bounded process lets go (queued at the
    /// downstream, its calls read barely slower than the fleet's; bounded no more, not queued,
    /// far slower): the bound holds through the swing, and a process as fast as the others
    /// but for one slow report in four is never bounded.
    #[test]
    fn the_bound_follows_the_average_comparison_not_each_report() {
        let mut slow = Share::default();
        let mut bounds = Vec::new();
        for report in 0..40 {
            let mean = if report % 4 < 2 { 21_000 } else { 32_000 };
            bounds.push(slow.learn(Some(mean), 25, 0, &learnt(3)));
        }
        assert!(bounds[16..].iter().all(|&b| b == Some(9)), "{bounds:?}");
        let mut clean = Share::default();
        for report in 0..40 {
            let mean = if report % 4 == 3 { 30_000 } else { 19_000 };
            assert_eq!(clean.learn(Some(mean), 25, 0, &learnt(3)), None, "{report}");
        }
    }

    /// A process without a base of its own (its first calls came once the fleet was at its
    /// limit: none at low occupancy until a cut) sends its calls without their latencies; its
    /// share compares what it counted all the same: judged by what it sent, a slow replica
    /// would read as fast as the fleet until its first cut (up to 40 s), and hold as many slots
    /// outside the downstream as its tasks could.
    #[test]
    fn a_process_without_a_base_is_held_to_its_share() {
        let mut sampling = Sampling::default();
        sampling.fleet_base(18_000);
        let mut share = Share::default();
        let mut bound = None;
        for _ in 0..8 {
            for _ in 0..40 {
                sampling.body(false, 30_000, true);
            }
            let sent = sampling.report(false);
            assert_eq!(sent.samples, 0, "its latencies are withheld");
            bound = share.learn(sampling.last_mean_us(), 25, 0, &learnt(3));
        }
        assert_eq!(bound, Some(9));
    }

    /// A report without a success keeps the bound (lifted, the process would take its slots
    /// back in a burst); a new process's first reports, slow while it opens its connections,
    /// do not bound it within its first second.
    #[test]
    fn a_report_without_successes_keeps_the_bound_and_a_warm_up_does_not_set_one() {
        let mut slow = Share::default();
        for _ in 0..16 {
            slow.learn(Some(30_000), 25, 0, &learnt(3));
        }
        assert_eq!(slow.learn(None, 25, 0, &learnt(3)), Some(9));
        let mut joining = Share::default();
        for report in 0..3 {
            let warming = joining.learn(Some(200_000), 25, 0, &learnt(3));
            assert_eq!(warming, None, "report {report}");
        }
    }

    /// A report whose calls were all refused at the share, asking nothing of the fleet, keeps
    /// the bound while the last lease reply read the fleet full (read as a fleet below its
    /// limit, it lifted the bound every other report); once a body of its own ends and its next
    /// call's reply shows slots free, that lifts it.
    #[test]
    fn a_report_refused_at_the_share_keeps_the_bound_until_a_reply_shows_slots_free() {
        let mut sampling = Sampling::default();
        let mut hoarding = Share::default();
        sampling.occupancy(25, true);
        let full = sampling.report(false);
        assert_eq!(
            hoarding.learn(Some(77_000), full.peak, 25, &learnt(3)),
            Some(9)
        );
        sampling.refused_here();
        let refused = sampling.report(false);
        assert!(refused.asked(), "counted among the processes that ask");
        assert_eq!(hoarding.learn(None, refused.peak, 25, &learnt(3)), Some(9));
        sampling.occupancy(21, false);
        sampling.refused_here();
        let free = sampling.report(false);
        assert_eq!(hoarding.learn(None, free.peak, 24, &learnt(3)), None);
    }
}
