//! The fleet's step and the processes' votes together, against a simulated downstream of
//! capacity `C` serving an unqueued call in `S` (Little's law: at `D ≥ C` calls inside, each
//! takes `S × D / C`), in the shapes that are not congestion (a busy host, one slow process, a
//! slow class of requests) and those that are (a saturated downstream, one that fails fast past
//! its capacity, a capacity that halves and doubles back). Deterministic: the noise is a fixed
//! sequence.

use super::vote::Sampling;
use super::*;

const BOUNDS: Bounds = Bounds {
    min: 2,
    initial: 20,
    max: 400,
};
/// Reports per window, as processes send them (every 250 ms against a 1 s window).
const TICKS: u64 = 4;
const TICK_US: u64 = 250_000;

/// How one simulated process's calls differ from a clean one's.
#[derive(Clone, Copy, Default)]
struct Process {
    /// Added to every call's latency, at every concurrency (a starved or pausing process).
    extra_us: u64,
    /// Holds its slot this long after the downstream answered (not inside the downstream).
    hold_us: u64,
}

#[derive(Clone, Copy)]
enum Noise {
    None,
    /// Every call's latency gains up to this much at random (a busy host).
    Busy(u64),
    /// One call in ten takes this long whatever the concurrency (a slow class of requests).
    Bimodal(u64),
    /// One call in ten takes `slow_us` to serve and the others `fast_us` (the shape's
    /// `service_us` is their mean), each after the queue's wait: a downstream serving its
    /// calls in order, where a fast call waits behind slow ones.
    Classes {
        fast_us: u64,
        slow_us: u64,
    },
}

#[derive(Clone, Copy)]
struct Shape {
    capacity: u32,
    /// How long the downstream takes for an unqueued call.
    service_us: u64,
    processes: [Process; 3],
    noise: Noise,
    /// Calls past the capacity fail in a millisecond instead of queueing.
    fail_fast: bool,
    /// One call in this many (0: none) fails whatever the concurrency (a downstream that
    /// rejects a steady share of requests, overloaded or not), after this long (0: as long as
    /// a success).
    failing: (u64, u64),
    /// Calls the fleet offers at once (`None`: more than any limit).
    offered: Option<u32>,
    /// One call in this many (0: none) is admitted while the fleet's occupancy dips below low
    /// occupancy for a moment (a starved process releasing the slots it held in a burst, calls
    /// failing fast and backing off), and meets the downstream's queue, or its refusals, all
    /// the same.
    dips: u64,
    /// The fleet's slots go to whichever process asks first once one is freed, so each
    /// process takes slots at the same rate and holds them in proportion to how long it keeps
    /// each (a slow process holds most of them); otherwise each process holds a third.
    contended: bool,
}

const CLEAN: Shape = Shape {
    capacity: 20,
    service_us: 20_000,
    processes: [Process {
        extra_us: 0,
        hold_us: 0,
    }; 3],
    noise: Noise::None,
    fail_fast: false,
    failing: (0, 0),
    offered: None,
    dips: 0,
    contended: false,
};

/// The field harness's bimodal downstream: one request in ten takes 200 ms to serve, the
/// others 5 ms, in order (a fast call waits behind slow ones).
const IN_ORDER: Shape = Shape {
    service_us: 24_500,
    noise: Noise::Classes {
        fast_us: 5_000,
        slow_us: 200_000,
    },
    ..CLEAN
};

impl Shape {
    /// Whether a process's `call`th call of a tick was admitted in a dip of the occupancy.
    fn dipped(&self, call: u64) -> bool {
        self.dips > 0 && call % self.dips == self.dips - 1
    }
}

/// The simulation's state: the fleet's estimate, each process's sampling, the limit in force.
#[derive(Clone)]
struct Fleet {
    estimate: Estimate,
    sampling: [Sampling; 3],
    learnt: Learnt,
    seed: u64,
    ms: u64,
    seen: Seen,
}

/// One second's reading: the limit learnt and the calls inside the downstream (mean).
#[derive(Debug, Clone, Copy)]
struct Second {
    full: u32,
    inside: f64,
    goodput: f64,
    /// Whether a cut's limit was in force in any of its ticks.
    cut: bool,
}

impl Fleet {
    fn new() -> Self {
        Fleet {
            estimate: Estimate::default(),
            sampling: Default::default(),
            learnt: Learnt {
                limit: BOUNDS.initial,
                full: BOUNDS.initial,
                low_at: BOUNDS.initial * 3 / 4,
                latency_us: 0,
                base_us: 0,
                joined_ms: 0,
                processes: 0,
            },
            seed: 7,
            ms: 1_000,
            seen: Seen::default(),
        }
    }

    /// A fleet as its first report leaves it, but with its limit at `start` rather than
    /// `initial`, its first cut due.
    fn started_at(start: u32) -> Self {
        let mut fleet = Fleet::new();
        fleet.ms = 20_000;
        fleet.learnt.limit = start;
        fleet.estimate = Estimate {
            limit_pm: u64::from(start) * 1000,
            since_ms: fleet.ms,
            low_ms: fleet.ms - CUT_EVERY_MS,
            expires_ms: fleet.ms + IDLE_MS,
            ..Estimate::default()
        };
        fleet
    }

    fn noise(&mut self, up_to: u64) -> u64 {
        self.seed = self
            .seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.seed >> 33) % up_to.max(1)
    }

    /// Runs `seconds` of `shape`; what each second showed.
    fn run(&mut self, shape: Shape, seconds: u64) -> Vec<Second> {
        (0..seconds).map(|_| self.second(shape)).collect()
    }

    fn second(&mut self, shape: Shape) -> Second {
        let (mut inside_sum, mut good, mut cut) = (0.0, 0.0, false);
        for _ in 0..TICKS {
            cut |= self.learnt.limit < self.learnt.full;
            let (inside, served) = self.tick(shape);
            inside_sum += inside;
            good += served;
        }
        Second {
            full: self.learnt.full,
            inside: inside_sum / TICKS as f64,
            goodput: good / (f64::from(shape.capacity) * 1e6 / shape.service_us as f64),
            cut,
        }
    }

    /// A quarter of a second: every process's calls, then its report. The calls inside the
    /// downstream and the answers it gave.
    fn tick(&mut self, shape: Shape) -> (f64, f64) {
        let limit = self.learnt.limit;
        let occupancy = shape.offered.map_or(limit, |offered| offered.min(limit));
        let low = self.learnt.low(occupancy);
        let capacity = f64::from(shape.capacity);
        // Each process's slots, the part of their time spent inside the downstream (not
        // holding after the answer), and the queueing that causes, to a fixed point.
        let mut queue = 1.0;
        let mut inside = 0.0;
        let mut slots = [f64::from(occupancy) / 3.0; 3];
        for _ in 0..20 {
            let dwell = shape.service_us as f64 * queue;
            let cycles = shape
                .processes
                .map(|p| dwell + (p.hold_us + p.extra_us) as f64);
            if shape.contended {
                let total: f64 = cycles.iter().sum();
                slots = cycles.map(|cycle| f64::from(occupancy) * cycle / total);
            }
            inside = (0..3).map(|i| slots[i] * dwell / cycles[i]).sum::<f64>();
            queue = if shape.fail_fast {
                1.0
            } else {
                (inside / capacity).max(1.0)
            };
        }
        let failing = if shape.fail_fast {
            ((inside - capacity) / inside).max(0.0)
        } else {
            0.0
        };
        let mut served = 0.0;
        for (index, process) in shape.processes.iter().enumerate() {
            let latency = (shape.service_us as f64 * queue) as u64 + process.extra_us;
            let cycle = latency + process.hold_us;
            let calls = (slots[index] * TICK_US as f64 / cycle as f64).round() as u64;
            let fails = (calls as f64 * failing).round() as u64;
            // A call failing fast frees its slot for many more: a millisecond each.
            let fast_drops = fails * (shape.service_us / 1_000);
            let (one_in, failure_us) = shape.failing;
            for call in 0..calls - fails {
                // One in `one_in` calls, and one in `one_in` of those in dips: a downstream
                // failing at random fails calls admitted in a dip as often as the others.
                let shift = call.checked_div(shape.dips).unwrap_or(0);
                if one_in > 0 && (call + shift) % one_in == 0 {
                    let us = if failure_us == 0 { latency } else { failure_us };
                    self.sampling[index].body(low || shape.dipped(call), us, false);
                    continue;
                }
                served += 1.0;
                let us = match shape.noise {
                    Noise::None => latency,
                    Noise::Busy(up_to) => latency + self.noise(up_to),
                    Noise::Bimodal(slow_us) if call % 10 == 9 => slow_us,
                    Noise::Bimodal(_) => latency,
                    Noise::Classes { fast_us, slow_us } => {
                        let served = if call % 10 == 9 { slow_us } else { fast_us };
                        served + latency - shape.service_us
                    }
                };
                self.sampling[index].body(low || shape.dipped(call), us, true);
            }
            for drop in 0..fast_drops {
                self.sampling[index].body(low || shape.dipped(drop), 1_000, false);
            }
            // Offered more than the limit: the fleet refused calls.
            let refused = shape.offered.is_none_or(|offered| offered > limit);
            self.sampling[index].occupancy(occupancy, refused);
        }
        self.ms += TICK_US / 1000;
        for index in 0..3 {
            let report = Report {
                observed: self.sampling[index].report(self.learnt.limit < self.learnt.full),
                bounds: BOUNDS,
                window_ms: 1_000,
                joined_ms: 0,
            };
            let now = Now {
                ms: self.ms + index as u64,
                ns: 0,
                order: 0,
            };
            self.learnt = Adapt::step(&mut self.estimate, &report, now, &mut self.seen);
            self.sampling[index].fleet_base(self.learnt.base_us);
        }
        (inside, served)
    }
}

/// The seconds after the first `skip`, as (limit, calls inside) for the failure message.
fn shown(seconds: &[Second]) -> String {
    let pairs: Vec<String> = seconds
        .iter()
        .map(|s| format!("{}/{:.0}", s.full, s.inside))
        .collect();
    pairs.join(" ")
}

/// `shape` at a capacity of 10: the limit within [8, 13] after `within` seconds, for 5 s.
fn follows_a_halving(fleet: &mut Fleet, shape: Shape, within: usize, what: &str) {
    let halved = Shape {
        capacity: 10,
        ..shape
    };
    let following = fleet.run(halved, within as u64 + 5);
    assert!(
        following[within..]
            .iter()
            .all(|s| (8..=13).contains(&s.full)),
        "{what}: {}",
        shown(&following)
    );
}

/// In steady state, the calls inside the downstream within [0.8 C, 1.3 C] in nine seconds of
/// ten at least (a cut window runs at ¾ of the limit), and the goodput at least 90 % of C / S.
fn assert_steady(seconds: &[Second], capacity: u32, what: &str) {
    let capacity = f64::from(capacity);
    let within = seconds
        .iter()
        .filter(|s| (0.8 * capacity..=1.3 * capacity).contains(&s.inside))
        .count();
    let goodput = seconds.iter().map(|s| s.goodput).sum::<f64>() / seconds.len() as f64;
    assert!(
        within * 10 >= seconds.len() * 9 && goodput >= 0.9,
        "{what}: {within} of {} seconds within the band, goodput {goodput:.2} of C/S: {}",
        seconds.len(),
        shown(seconds)
    );
}

#[test]
fn a_saturated_downstream_is_found_and_followed_down_and_back() {
    let mut fleet = Fleet::new();
    fleet.run(CLEAN, 30);
    assert_steady(&fleet.run(CLEAN, 30), 20, "capacity 20");
    let halved = Shape {
        capacity: 10,
        ..CLEAN
    };
    let following = fleet.run(halved, 10);
    assert!(
        following[9].full >= 8 && following[9].full <= 13,
        "halved: {}",
        shown(&following)
    );
    assert_steady(&fleet.run(halved, 30), 10, "capacity 10");
    let back = fleet.run(CLEAN, 30);
    assert!(back[29].full >= 16, "doubled back: {}", shown(&back));
    assert_steady(&fleet.run(CLEAN, 30), 20, "capacity 20 again");
}

/// A limit that starts far above the capacity never saw an unqueued call: its first base is
/// queued, and a cut to ¾ of it still queues. Cuts follow one another while each is faster than
/// the limit in proportion to its occupancy, so the limit comes down by a quarter a second, not
/// a tenth every eleven.
#[test]
fn a_limit_far_above_the_capacity_comes_down_within_seconds() {
    for (capacity, offered, start) in [(4, 24, 30), (4, 400, 100), (20, 400, 100)] {
        let shape = Shape {
            capacity,
            offered: Some(offered),
            ..CLEAN
        };
        let mut fleet = Fleet::started_at(start);
        let coming = fleet.run(shape, 20);
        let high = capacity + capacity * 3 / 10 + 1;
        assert!(
            coming[15..].iter().all(|s| s.full <= high),
            "capacity {capacity}, offered {offered}, from {start}: {}",
            shown(&coming)
        );
        assert_steady(&fleet.run(shape, 30), capacity, "after coming down");
    }
}

/// A cut's window also holds calls admitted before the processes learnt the cut (a report's
/// interval), queued as the limit before it was. After a cut that still queued, the next cut
/// compared with that window read faster by their share alone, went deeper, and left the limit
/// below the capacity (in the field, bimodal latency at a capacity of 10: 11 → 9 → 6). Each cut
/// is judged by the calls it admitted.
#[test]
fn a_cut_after_one_that_still_queued_is_judged_by_its_own_calls() {
    let window = |queued: u64, unqueued: u64, peak: u64| {
        let mut votes = Votes::default();
        votes.add(queued + unqueued, 1_000, 7_000);
        Observed {
            samples: queued + unqueued,
            sum_us: queued * 14_000 + unqueued * 7_000,
            calls: queued + unqueued,
            low: unqueued,
            low_samples: unqueued,
            low_sum_us: unqueued * 7_000,
            peak,
            votes,
            ..Observed::default()
        }
    };
    // A limit of 11 queued at twice the base; the first cut to ¾ of it is under way.
    let mut estimate = cut_under_way(11, 14_000, 7_000);
    let mut seen = Seen::default();
    // A third of its calls admitted before the processes learnt it, at 14 ms; the rest at 7.
    report(&mut estimate, window(10, 20, 11), 1_500, &mut seen);
    let first = report(&mut estimate, Observed::default(), 2_000, &mut seen);
    assert!(
        first.limit < first.full && first.full <= 9,
        "the first cut still queued: {first:?}"
    );
    // The second cut, at ¾ of the first, as fast as the first's own calls: the downstream
    // does not queue there.
    report(&mut estimate, window(0, 30, 6), 2_500, &mut seen);
    let second = report(&mut estimate, Observed::default(), 3_000, &mut seen);
    assert!(
        second.full >= first.full && second.limit == second.full,
        "the second cut found no queue: {first:?} then {second:?}"
    );
}

/// An estimate whose cut of a limit of `limit`, the fleet at it, opened at 1 s, after a window
/// whose latency was `latency_us` against bases of `base_us` (0: nobody had one).
fn cut_under_way(limit: u32, latency_us: u64, base_us: u64) -> Estimate {
    Estimate {
        limit_pm: u64::from(limit) * 1000,
        latency_us,
        base_us,
        since_ms: 1_000,
        low_ms: 1_000,
        cut: true,
        every_ms: CUT_EVERY_MS,
        level: limit.into(),
        expires_ms: IDLE_MS,
        ..Estimate::default()
    }
}

/// A cut that still queued reads ¾ of the window before it (saturated at both occupancies:
/// Little's law), and a cut from a limit at the top of the unsure band (1.25 × C, where the
/// fleet may hold) 0.8 of it, unqueued: the line is halfway. At ¾ with a tenth to spare
/// (0.825), a fleet resting at 1.2 × C read half its cuts as still queued within a second's
/// noise (in the field, bimodal latency at a capacity of 10: 12 → 9, the downstream at 6.7 for
/// a second and the next a cut again). A fleet's first cut, read from its whole window (a
/// quarter of its calls admitted at the limit before it), is judged on ¼ + ¾ of each.
#[test]
fn a_cut_still_queued_is_told_from_one_at_the_top_of_the_unsure_band() {
    // Whether a cut whose calls took `per_mille` of the window before's latency goes deeper,
    // judged by its own calls (the fleet had bases) or by its whole window (it had none).
    let deeper = |bases: bool, per_mille: u64| {
        let latency_us = 30_000 * per_mille / 1000;
        let mut votes = Votes::default();
        votes.add(30, 1_000, 20_000);
        let window = Observed {
            samples: 30,
            sum_us: 30 * latency_us,
            calls: 30,
            low: 30,
            low_samples: 30,
            low_sum_us: 30 * latency_us,
            peak: 9,
            votes,
            ..Observed::default()
        };
        let mut estimate = cut_under_way(12, 30_000, if bases { 20_000 } else { 0 });
        let mut seen = Seen::default();
        report(&mut estimate, window, 1_500, &mut seen);
        let learnt = report(&mut estimate, Observed::default(), 2_000, &mut seen);
        // Only a deeper cut is followed by another one this soon.
        estimate.cut && learnt.full < 12
    };
    let judged = [750, 770, 780, 800, 833].map(|per_mille| deeper(true, per_mille));
    assert_eq!(
        judged,
        [true, true, false, false, false],
        "by its own calls"
    );
    let whole = [812, 825, 850].map(|per_mille| deeper(false, per_mille));
    assert_eq!(whole, [true, true, false], "by its whole window");
}

/// A fleet holds wherever its votes read unsure (ratios from 1.1 to 1.25): a limit that came
/// down to a queued target read too low a ratio, or one that a probe took past 1.1 × C, rests
/// up to 1.25 × C (at 1.2 × C with one slow request in ten at a capacity of 10; with one slow
/// process, 1.3 × C for seconds). A cut that did not still queue reads how far the latency
/// fell with the occupancy: Little's law's `C / D`, so the limit comes to 1.1 × C (from 1.2 ×
/// here, and the probes that follow taper to none by 1.15 ×).
#[test]
fn a_cut_brings_a_limit_resting_high_in_the_band_to_the_capacity() {
    let mut fleet = Fleet::new();
    fleet.run(CLEAN, 60);
    fleet.estimate.limit_pm = 24_000;
    let seconds = fleet.run(CLEAN, 45);
    let starts = cut_starts(&seconds);
    let after = starts
        .first()
        .map_or(&[][..], |&start| &seconds[start + 2..]);
    assert!(
        !after.is_empty() && after.iter().all(|s| (20..=23).contains(&s.full)),
        "cuts at {starts:?}: {}",
        shown(&seconds)
    );
}

/// Queued votes on bases measured more than [`VERIFY_MS`] ago call a cut before the limit
/// falls (the bases may be another downstream's, or host's), unless the limit grew since the
/// last window whose votes were not queued: the same bases read no queue there and a queue now,
/// so the growth is undone without a cut, to that limit and no further. With one slow request
/// in ten at a capacity of 10, the probes from 9 reached 11 in five seconds, read queued there,
/// and each verification's cut took the downstream to 6.4, every seven seconds.
#[test]
fn queued_votes_after_a_probe_undo_it_without_a_cut() {
    // Probed to 11; queued there 4 s after the cut: back to 10, where the votes read clear;
    // queued there too: a verification, whose cut runs at ¾ of the last second's occupancy.
    assert_eq!(
        probed_then_queued(&mut Seen::default()),
        [(9, 9), (10, 10), (11, 11), (10, 10), (8, 10)],
        "probes, an undone one, a verification"
    );
}

/// A limit of 9 whose bases a cut measured at 1 s, probed on clear votes, then queued twice:
/// the limit in force and the limit after each second.
fn probed_then_queued(seen: &mut Seen) -> Vec<(u32, u32)> {
    // Thirty calls near the limit, every one judged at `ratio_pm` against a base of 7 ms.
    let window = |ratio_pm: u64| {
        let mut votes = Votes::default();
        votes.add(30, ratio_pm, 7_000);
        Observed {
            samples: 30,
            sum_us: 30 * 7 * ratio_pm,
            calls: 30,
            peak: 11,
            votes,
            ..Observed::default()
        }
    };
    // A limit of 9, its bases measured by a cut that ended at 1 s.
    let mut estimate = Estimate {
        limit_pm: 9_000,
        latency_us: 7_000,
        base_us: 7_000,
        since_ms: 1_000,
        low_ms: 1_000,
        every_ms: CUT_EVERY_MS,
        level: 9,
        expires_ms: IDLE_MS,
        ..Estimate::default()
    };
    let mut limits = vec![];
    for (ms, ratio_pm) in [
        (2_000, 1_000),
        (3_000, 1_000),
        (4_000, 1_050),
        (5_000, 1_500),
        (6_000, 1_500),
    ] {
        estimate.window = window(ratio_pm);
        let learnt = report(&mut estimate, Observed::default(), ms, seen);
        limits.push((learnt.limit, learnt.full));
    }
    limits
}

#[test]
fn a_downstream_failing_fast_past_its_capacity_is_followed_when_it_halves() {
    let fail_fast = Shape {
        fail_fast: true,
        ..CLEAN
    };
    let mut fleet = Fleet::new();
    fleet.run(fail_fast, 40);
    follows_a_halving(&mut fleet, fail_fast, 10, "halved");
}

/// Calls failing fast free their slots at once and their tasks back off, so the fleet's
/// occupancy dips all the time: a quarter of the calls are admitted below low occupancy, beside
/// calls near the limit, and fail as often as those (the downstream is just as full). Those
/// windows have calls at low occupancy, so no cut comes; the drop share learnt from the dips
/// would be the overload's own, the processes would vote clear on it, and the limit would climb
/// past a halved capacity instead of following it.
#[test]
fn drops_admitted_in_a_dip_of_the_occupancy_do_not_teach_the_drop_share() {
    let fail_fast = Shape {
        fail_fast: true,
        dips: 4,
        ..CLEAN
    };
    let mut fleet = Fleet::new();
    fleet.run(fail_fast, 40);
    follows_a_halving(&mut fleet, fail_fast, 10, "halved");
}

#[test]
fn latency_that_does_not_grow_with_concurrency_does_not_lower_the_limit() {
    let slow = Process {
        extra_us: 8_000,
        hold_us: 8_000,
    };
    let shapes = [
        (
            "a busy host",
            Shape {
                noise: Noise::Busy(15_000),
                ..CLEAN
            },
        ),
        (
            "one slow process",
            Shape {
                processes: [slow, Process::default(), Process::default()],
                ..CLEAN
            },
        ),
        (
            "a slow class of requests",
            Shape {
                noise: Noise::Bimodal(200_000),
                ..CLEAN
            },
        ),
        (
            "a downstream failing fast past its capacity",
            Shape {
                fail_fast: true,
                ..CLEAN
            },
        ),
    ];
    for (what, shape) in shapes {
        let mut fleet = Fleet::new();
        fleet.run(shape, 30);
        assert_steady(&fleet.run(shape, 60), 20, what);
    }
}

/// A starved process (its bodies keep their thread after the reply) holds slots outside the
/// downstream and releases them in bursts: the others' calls admitted in those dips met the
/// downstream's queue, and must not teach their bases the queued latency (the limit would
/// then climb past the capacity on clear votes, and not follow it down).
#[test]
fn calls_admitted_in_a_dip_of_the_occupancy_do_not_teach_a_queued_base() {
    let starved = Process {
        extra_us: 8_000,
        hold_us: 8_000,
    };
    let shape = Shape {
        processes: [starved, Process::default(), Process::default()],
        dips: 20,
        ..CLEAN
    };
    let mut fleet = Fleet::new();
    fleet.run(shape, 30);
    assert_steady(&fleet.run(shape, 60), 20, "capacity 20");
    let halved = Shape {
        capacity: 10,
        ..shape
    };
    let following = fleet.run(halved, 10);
    assert_steady(&following[5..], 10, "halved");
    assert_steady(&fleet.run(halved, 30), 10, "capacity 10");
}

/// One process's bodies keep their thread after the reply (8 ms of blocking, then a wait for
/// its threads: its slots are held 2.5 times as long as a clean call's, outside the
/// downstream). Slots go to whoever asks first, so it holds most of the fleet's: the limit
/// must sit well above the capacity to fill the downstream, and when the capacity halves the
/// cut still queues, two to three times the clean processes' base. Compared at latencies capped
/// at twice the base, the limit's and the cut's read alike, the clean processes' bases learnt
/// the queued latency, and the downstream stayed at 2.5 × C/2.
#[test]
fn one_slow_process_holding_most_slots_does_not_keep_a_halved_capacity_queued() {
    let slow = Process {
        extra_us: 30_000,
        hold_us: 0,
    };
    let shape = Shape {
        processes: [slow, Process::default(), Process::default()],
        contended: true,
        ..CLEAN
    };
    let halved = Shape {
        capacity: 10,
        ..shape
    };
    // Halved at every second of the cycle of cuts: once the period has grown to 40 s (cuts
    // at about 1, 12, 33 and 74 s), 41 s long.
    for warm in 40..82 {
        let mut fleet = Fleet::new();
        fleet.run(shape, warm);
        assert_steady(&fleet.run(shape, 20), 20, "capacity 20");
        let following = fleet.run(halved, 10);
        assert_steady(&following[6..], 10, &format!("halved after {warm} s"));
        assert_steady(&fleet.run(halved, 30), 10, "capacity 10");
        let back = fleet.run(shape, 30);
        assert_steady(&back[10..], 20, "doubled back");
    }
}

/// One slow process (8 ms added to its calls, its slots held 8 ms after each reply, as the
/// field harness's blocked threads do) takes slots as fast as the others, so it holds the
/// larger share of a cut's: the downstream falls furthest in a cut of all the shapes, and a cut
/// every eleven seconds cost the fleet a tenth of C/S in the field.
const SLOW_PROCESS: Shape = Shape {
    processes: [
        Process {
            extra_us: 8_000,
            hold_us: 8_000,
        },
        Process {
            extra_us: 0,
            hold_us: 0,
        },
        Process {
            extra_us: 0,
            hold_us: 0,
        },
    ],
    contended: true,
    ..CLEAN
};

/// Where the fleet comes to rest, outside its cuts: the mean of the calls inside the
/// downstream over the capacity. Approached from above (a capacity that halved) halfway a
/// window, the queued votes stop at the first window that reads unsure, at the top of that
/// band (1.25 C); approached from below by probes of a tenth, one probe from clear crosses it.
/// Either way a second's noise puts the downstream past 1.3 C. Lowered at once, and probed no
/// further than the clear votes' ratio allows, the fleet rests near 1.1 C.
#[test]
fn the_fleet_comes_to_rest_near_the_capacity_not_at_the_edge_of_the_band() {
    for (what, shape) in [("clean", CLEAN), ("one slow process", SLOW_PROCESS)] {
        let halved = Shape {
            capacity: 10,
            ..shape
        };
        let mut fleet = Fleet::new();
        fleet.run(shape, 40);
        let rest = |seconds: &[Second], capacity: f64| {
            let uncut: Vec<f64> = seconds
                .iter()
                .filter(|s| !s.cut)
                .map(|s| s.inside / capacity)
                .collect();
            uncut.iter().sum::<f64>() / uncut.len() as f64
        };
        let full = fleet.run(shape, 40);
        fleet.run(halved, 10);
        let half = fleet.run(halved, 30);
        let (at_full, at_half) = (rest(&full, 20.0), rest(&half, 10.0));
        assert!(
            at_full <= 1.15 && at_half <= 1.15,
            "{what}: at rest {at_full:.2} C, halved {at_half:.2} C: {} | {}",
            shown(&full),
            shown(&half)
        );
    }
}

/// The seconds in which a cut started (a cut's window straddles two of the simulation's).
fn cut_starts(seconds: &[Second]) -> Vec<usize> {
    (1..seconds.len())
        .filter(|&i| seconds[i].cut && !seconds[i - 1].cut)
        .collect()
}

/// Cuts that find the limit right (judged, none still queued) double the period before the
/// next, up to 40 s: in steady state, one cut every 41 s rather than every 11, and never none.
#[test]
fn cuts_that_confirm_the_limit_come_less_often() {
    let mut fleet = Fleet::new();
    fleet.run(SLOW_PROCESS, 40);
    let steady = fleet.run(SLOW_PROCESS, 170);
    let starts = cut_starts(&steady);
    let gaps: Vec<usize> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        (3..=5).contains(&starts.len()) && gaps.iter().all(|gap| (39..=43).contains(gap)),
        "cuts at {starts:?}: {}",
        shown(&steady)
    );
    assert_steady(&steady, 20, "one slow process");
}

/// A halved capacity is found by a cut that still queues, a limit far above the capacity by
/// cuts that go deeper, a host turned busy by a verification (queued votes on old bases): the
/// bases were wrong, so the period goes back to 10 s. After the halving the cut that follows
/// comes about 11 s later, not 41; after the descent or the verification (their last cut not
/// queued, which doubles the period to 20 s) about 21 s later, not 41 or more.
#[test]
fn a_cut_that_found_the_limit_wrong_sets_the_period_back() {
    let mut fleet = Fleet::new();
    fleet.run(SLOW_PROCESS, 120);
    let halved = Shape {
        capacity: 10,
        ..SLOW_PROCESS
    };
    let mut far = Fleet::started_at(100);
    let far_shape = Shape {
        capacity: 4,
        offered: Some(400),
        ..CLEAN
    };
    let mut busy = Fleet::new();
    busy.run(CLEAN, 120);
    let busy_shape = Shape {
        noise: Noise::Busy(15_000),
        ..CLEAN
    };
    for (what, following, gaps) in [
        ("halved", fleet.run(halved, 30), 9..=12),
        ("far above", far.run(far_shape, 40), 20..=35),
        ("busy", busy.run(busy_shape, 40), 20..=24),
    ] {
        let starts = cut_starts(&following);
        assert!(
            starts.windows(2).any(|w| gaps.contains(&(w[1] - w[0]))),
            "{what}: cuts at {starts:?}: {}",
            shown(&following)
        );
    }
}

/// Every process replaced at once (a rolling restart; the estimate survives) as the capacity
/// halves: nobody has a base, so nobody votes. The period, grown to 40 s, goes back to 10 s on
/// the first window mostly unjudged, and the cut that comes gives the new processes their
/// bases: the limit follows the capacity within seconds, not after up to 40.
#[test]
fn processes_without_a_base_bring_the_next_cut_closer() {
    let mut fleet = Fleet::new();
    fleet.run(CLEAN, 120);
    fleet.sampling = Default::default();
    follows_a_halving(&mut fleet, CLEAN, 15, "halved");
}

/// A process without a base (one that joins a fleet at its limit, or restarts, sees no call at
/// low occupancy until the next cut, up to 40 s away) counts its latencies up to four times the
/// fleet's base: uncounted, its slow class (bimodal latency) made the window before that cut
/// slower than the cut by far more than the occupancy fell, the cut read as one that still
/// queued, and the limit fell from 23 to 18 and the downstream to 13 of 20. Where the others'
/// latencies go out raised by their slow class's time past the cap (a slow class served in
/// order), its own, not yet raised, would make that window read faster than the one before:
/// until it has a base it sends its calls without their latencies.
#[test]
fn a_process_without_a_base_counts_its_latencies_as_the_fleet_does() {
    for noise in [
        Noise::Bimodal(200_000),
        Noise::Classes {
            fast_us: 5_000,
            slow_us: 200_000,
        },
    ] {
        let service_us = match noise {
            Noise::Classes { .. } => 24_500,
            _ => CLEAN.service_us,
        };
        let shape = Shape {
            noise,
            service_us,
            ..CLEAN
        };
        // Joined just after a cut, and just before one.
        for before_cut_ms in [None, Some(2_000)] {
            let mut fleet = Fleet::new();
            fleet.run(shape, 100);
            while !fleet.second(shape).cut {}
            fleet.run(shape, 2);
            if let Some(before_cut_ms) = before_cut_ms {
                let due = |fleet: &Fleet| fleet.estimate.low_ms + fleet.estimate.every_ms;
                while fleet.ms + before_cut_ms < due(&fleet) {
                    fleet.second(shape);
                }
            }
            fleet.sampling[0] = Sampling::default();
            let following = fleet.run(shape, 50);
            let starts = cut_starts(&following);
            assert!(
                !starts.is_empty() && following.iter().all(|s| s.full >= 20),
                "joined {before_cut_ms:?} ms before a cut; cuts at {starts:?}: {}",
                shown(&following)
            );
        }
    }
}

/// A process that joins as a cut starts, its first report answered (it knows the fleet's base,
/// and has none of its own), learns its base from the cut's calls and sends their latencies
/// from its next report on. Sent at once, counted up to four times the fleet's base and not
/// raised by a slow class's time past the cap as the others' are (a slow class served in
/// order), they made the cut read faster than the window before it by more than the others'
/// calls did (in the simulation 0.78 against 0.86; in the field, a fourth process joined a
/// second before a cut that read as still queued: 12 → 9 at a capacity of 10).
#[test]
fn a_process_joining_as_a_cut_starts_does_not_change_what_the_cut_reads() {
    let shape = IN_ORDER;
    let mut fleet = Fleet::new();
    fleet.run(shape, 100);
    while !fleet.second(shape).cut {}
    fleet.run(shape, 2);
    while !fleet.estimate.cut {
        fleet.tick(shape);
    }
    // The cut's latency over the window's before it (thousandths).
    let reading = |mut fleet: Fleet, joined: bool| {
        let before = fleet.estimate.latency_us;
        if joined {
            fleet.sampling[0] = Sampling::default();
            fleet.sampling[0].fleet_base(fleet.learnt.base_us);
        }
        fleet.second(shape);
        fleet.estimate.latency_us * 1000 / before
    };
    let (alone, joined) = (reading(fleet.clone(), false), reading(fleet, true));
    // Within a fortieth: from its second report on, its latencies count as the others' do,
    // against a base and a slow class's time of its own.
    assert!(
        joined.abs_diff(alone) <= 25,
        "the cut read {joined} of the window before with a process joining, {alone} without"
    );
}

/// One window closing on `estimate` (its window opened at 0, a second long) with these
/// figures: the period it leaves.
fn period_after(mut estimate: Estimate, window: Observed) -> u64 {
    estimate.window = window;
    report(
        &mut estimate,
        Observed::default(),
        1_000,
        &mut Seen::default(),
    );
    estimate.every_ms
}

/// One process's report of `observed` to `estimate` at `ms`, in windows of a second.
fn report(estimate: &mut Estimate, observed: Observed, ms: u64, seen: &mut Seen) -> Learnt {
    let report = Report {
        observed,
        bounds: BOUNDS,
        window_ms: 1_000,
        joined_ms: 0,
    };
    let now = Now {
        ms,
        ns: 0,
        order: 0,
    };
    Adapt::step(estimate, &report, now, seen)
}

/// Ten calls at 20 ms, `low` of them at low occupancy, `judged` of them judged clear.
fn calls(low: u64, judged: u64) -> Observed {
    let mut votes = Votes::default();
    if judged > 0 {
        votes.add(judged, 1_000, 20_000);
    }
    Observed {
        samples: 10,
        sum_us: 200_000,
        calls: 10,
        low,
        low_samples: low,
        low_sum_us: low * 20_000,
        peak: 20,
        votes,
        ..Observed::default()
    }
}

/// A window whose period has passed is a cut when the fleet filled its limit: its occupancy
/// reached it, or a call was refused under it (with `thresholds`, the default class is refused
/// at its share of the limit, so a saturated fleet's occupancy never reaches it); or when most
/// of its calls went unjudged (processes without a base). A fleet that did neither is not
/// cut.
#[test]
fn a_period_passed_cuts_a_fleet_that_filled_its_limit_or_lacks_bases() {
    let due = Estimate {
        limit_pm: 20_000,
        latency_us: 20_000,
        base_us: 20_000,
        since_ms: 11_000,
        every_ms: CUT_EVERY_MS,
        level: 16,
        expires_ms: IDLE_MS,
        ..Estimate::default()
    };
    // What: the window's peak, its calls refused, of its ten calls those judged; a cut.
    let cases = [
        ("full", 20, 0, 10, true),
        ("refused at a class's share", 16, 3, 10, true),
        ("most without bases", 16, 0, 4, true),
        ("room to spare", 16, 0, 10, false),
        ("a fifth without bases", 16, 0, 8, false),
    ];
    for (what, peak, refused, judged, cut) in cases {
        let window = Observed {
            peak,
            refused,
            ..calls(0, judged)
        };
        let mut estimate = due.clone();
        let mut seen = Seen::default();
        report(&mut estimate, window, 11_000, &mut seen);
        report(&mut estimate, Observed::default(), 12_000, &mut seen);
        assert_eq!(estimate.cut, cut, "{what}");
        let unfilled = !seen.missing(&Branch::ALL).contains(&&Branch::Unfilled);
        assert_eq!(unfilled, !cut, "{what}");
    }
}

/// Only a cut someone judged (voters weighing half its calls) can confirm the bases: one that
/// nobody, or hardly anybody, voted in keeps the period.
#[test]
fn a_cut_nobody_judged_keeps_the_period() {
    let cut = Estimate {
        limit_pm: 20_000,
        latency_us: 20_000,
        cut: true,
        every_ms: CUT_EVERY_MS,
        level: 20,
        expires_ms: IDLE_MS,
        ..Estimate::default()
    };
    for (judged, every) in [(0, CUT_EVERY_MS), (4, CUT_EVERY_MS), (5, 2 * CUT_EVERY_MS)] {
        assert_eq!(
            period_after(cut.clone(), calls(10, judged)),
            every,
            "{judged} of 10 calls judged"
        );
    }
}

/// Outside a cut, a window whose calls went mostly unjudged and had no share at low
/// occupancy has processes without a base: the period goes back to 10 s. With a low share
/// (a quiet fleet measuring its bases anyway) or judged, it is kept.
#[test]
fn a_window_mostly_unjudged_sets_the_period_back() {
    let steady = Estimate {
        limit_pm: 20_000,
        latency_us: 20_000,
        low_ms: 900,
        every_ms: MAX_CUT_EVERY_MS,
        level: 20,
        expires_ms: IDLE_MS,
        ..Estimate::default()
    };
    for (low, judged, every) in [
        (0, 0, CUT_EVERY_MS),
        (0, 4, CUT_EVERY_MS),
        (0, 5, MAX_CUT_EVERY_MS),
        (1, 0, MAX_CUT_EVERY_MS),
    ] {
        assert_eq!(
            period_after(steady.clone(), calls(low, judged)),
            every,
            "{low} low, {judged} judged"
        );
    }
}

/// A stored period out of [10 s, 40 s] (an older script's absent field, a later version's
/// longer cap, a foreign write) is read within it, so it neither cuts every window nor never.
#[test]
fn a_stored_period_is_read_within_its_bounds() {
    for (stored, read) in [
        (0, CUT_EVERY_MS),
        (1, CUT_EVERY_MS),
        (25_000, 25_000),
        (1_000_000_000, MAX_CUT_EVERY_MS),
        (u64::MAX, MAX_CUT_EVERY_MS),
    ] {
        let mut estimate = Estimate {
            limit_pm: 20_000,
            every_ms: stored,
            expires_ms: IDLE_MS,
            ..Estimate::default()
        };
        let report = Report {
            observed: Observed::default(),
            bounds: BOUNDS,
            window_ms: 1_000,
            joined_ms: 0,
        };
        let now = Now {
            ms: 500,
            ns: 0,
            order: 0,
        };
        Adapt::step(&mut estimate, &report, now, &mut Seen::default());
        assert_eq!(estimate.every_ms, read, "stored {stored}");
    }
}

/// Server time that stepped back (a failover to a replica whose clock is an hour behind): the
/// open window started, and the last calls at low occupancy were seen, after now. The window
/// closes a window's length from the first report, and the next cut comes a period after it,
/// not an hour later.
#[test]
fn server_time_that_stepped_back_does_not_hold_the_limit() {
    const HOUR_MS: u64 = 3_600_000;
    let mut estimate = Estimate {
        limit_pm: 20_000,
        latency_us: 20_000,
        since_ms: HOUR_MS,
        low_ms: HOUR_MS,
        every_ms: CUT_EVERY_MS,
        level: 20,
        expires_ms: 2 * HOUR_MS,
        ..Estimate::default()
    };
    let mut seen = Seen::default();
    // A fleet at its limit, whichever it is.
    let full = Observed {
        peak: BOUNDS.max.into(),
        ..calls(0, 10)
    };
    let limits: Vec<u32> = (0..3)
        .map(|second| report(&mut estimate, full, 1_000 * second, &mut seen).full)
        .collect();
    assert_eq!(limits, [20, 22, 24], "probes, a window a second");
    let cut = (3..=12).find(|second| {
        report(&mut estimate, full, 1_000 * second, &mut seen);
        estimate.cut
    });
    assert_eq!(
        cut,
        Some(10),
        "the next cut, a period after the first report"
    );
}

/// A downstream that fails one call in four at any concurrency, as slowly as a success: the
/// processes see that share at low occupancy as near the limit, so it is not the overload's,
/// and the limit follows the capacity as on a clean downstream, neither collapsing to `min` on
/// drops nor climbing to `max` on clear votes. The share is learnt only where calls ran at low
/// occupancy, in cuts: with one call in forty admitted in a dip (under the tenth that would
/// stand in for a cut), those may only lower it, and cuts still come. (One in ten failing in a
/// millisecond is too little of the slots' time to move a ratio: such a case guards nothing.)
#[test]
fn a_steady_share_of_failures_neither_collapses_nor_inflates_the_limit() {
    for dips in [0, 40] {
        steady_failures_follow_the_capacity(dips);
    }
}

/// One in four calls failing slowly, with `dips`: the limit within [16, 30] for 60 s, then
/// halved, within [8, 13] after 10 s.
fn steady_failures_follow_the_capacity(dips: u64) {
    let shape = Shape {
        failing: (4, 0),
        dips,
        ..CLEAN
    };
    let mut fleet = Fleet::new();
    fleet.run(shape, 30);
    let steady = fleet.run(shape, 60);
    assert!(
        steady.iter().all(|s| (16..=30).contains(&s.full)),
        "dips {dips}: {}",
        shown(&steady)
    );
    follows_a_halving(&mut fleet, shape, 10, &format!("halved, dips {dips}"));
}

/// One in four failing slowly and a quarter of the calls admitted in dips: the dips stand in
/// for cuts that never come, the dipped calls may only lower the share, so it is never learnt
/// and the limit falls to `min`. Not counting dipped calls as the window's calls at low
/// occupancy brings the cuts and holds the steady phase, but after the halving a process then
/// learns a cut's queued latency as its base and the limit rests at 17 for a capacity of 10.
#[test]
#[ignore = "issue 28: dips stand in for cuts; the share of failures is never learnt"]
fn steady_failures_with_a_quarter_of_the_calls_in_dips_follow_the_capacity() {
    steady_failures_follow_the_capacity(4);
}

/// A queue three times the base near the limit, and a cut that still queues at twice: the
/// latencies are compared uncapped enough to see the cut was faster, so the base (20 ms) does
/// not learn the cut's queued 42 ms, and the process votes queued.
#[test]
fn a_cut_still_queued_past_twice_the_base_does_not_teach_it() {
    let mut sampling = Sampling::default();
    let calls = |sampling: &mut Sampling, low: bool, us: u64| {
        for _ in 0..10 {
            sampling.body(low, us, true);
        }
    };
    calls(&mut sampling, true, 20_000);
    sampling.report(false);
    calls(&mut sampling, false, 60_000);
    sampling.report(false);
    calls(&mut sampling, true, 42_000);
    let votes = sampling.report(true).votes;
    assert_eq!(
        (votes.queued, votes.base_sum),
        (10, 10 * 20_000),
        "{votes:?}"
    );
}

/// A process's first calls carry its warm-up (connections opened) and run while the fleet
/// ramps up, at low occupancy: its first base is three times the downstream's latency. Calls
/// near the limit faster than the base show it is too high at once, not after cuts.
#[test]
fn a_base_above_the_latency_near_the_limit_is_lowered_at_once() {
    let mut fleet = Fleet::new();
    for sampling in &mut fleet.sampling {
        for _ in 0..20 {
            sampling.body(true, 60_000, true);
        }
    }
    let starting = fleet.run(CLEAN, 30);
    assert_steady(&starting[5..], 20, "after a slow start");
}

/// The seconds of a fleet that starts warming up: every call `first_us` slower than the
/// downstream's own latency in its first second, the excess fading to none over `fading`
/// seconds (connections opening, one slow process's tasks taking the first slots: the field's
/// calls took 45–90 ms for two to four seconds where the downstream answers in 22), then
/// `after` seconds clean.
fn warming_up(fleet: &mut Fleet, first_us: u64, fading: u64, after: u64) -> Vec<Second> {
    let mut seconds = Vec::new();
    for second in 0..fading {
        let extra_us = first_us * (fading - second) / fading;
        let warm = Shape {
            processes: [Process {
                extra_us,
                hold_us: 0,
            }; 3],
            ..CLEAN
        };
        seconds.extend(fleet.run(warm, 1));
    }
    seconds.extend(fleet.run(CLEAN, after));
    seconds
}

/// A fleet's first cut comes after its first window, in its warm-up: its bases are the
/// warm-up's. Calls near the limit lower them only to their own mean, queued or not, as the
/// warm-up fades, so the votes read clear on a queued downstream and the limit climbed to
/// 29 for C = 20 (the downstream at 28–29 until the period's cut, 23 seconds in). Bases
/// that fell by a quarter since they were measured are measured again.
#[test]
fn bases_measured_in_a_warm_up_are_measured_again_once_they_have_fallen() {
    let mut fleet = Fleet::new();
    // Server time as the field's: a fleet's first cut follows its first window.
    fleet.ms = 100_000;
    let seconds = warming_up(&mut fleet, 45_000, 6, 24);
    let over: Vec<usize> = (0..seconds.len())
        .filter(|&t| seconds[t].inside > 1.3 * 20.0)
        .collect();
    assert!(
        over.is_empty(),
        "the downstream past 1.3 x C in seconds {over:?}: {}",
        shown(&seconds)
    );
    assert_steady(&seconds[10..], 20, "after a warm-up");
}

/// Bases that fell by a quarter call a cut, and are what the next fall is measured from: in a
/// mixed fleet an older script may close that cut without storing its bases, and the same
/// fall would call a cut again every three seconds.
#[test]
fn fallen_bases_call_a_cut_once() {
    let mut estimate = Estimate {
        limit_pm: 24_000,
        latency_us: 40_000,
        measured_us: 60_000,
        low_ms: 10_000,
        every_ms: CUT_EVERY_MS,
        level: 24,
        expires_ms: 100_000,
        ..Estimate::default()
    };
    let fell_in = |seen: &Seen| !seen.missing(&Branch::ALL).contains(&&Branch::Fallen);
    let mut seen = Seen::default();
    let mut fell = calls(0, 10);
    fell.votes = Votes::default();
    fell.votes.add(10, 1_000, 40_000);
    report(&mut estimate, fell, 14_000, &mut seen);
    assert!(fell_in(&seen), "{estimate:?}");
    assert!(estimate.cut, "{estimate:?}");
    assert_eq!((estimate.limit_pm, estimate.measured_us), (24_000, 40_000));
    // The cut's window closed by an older script: bases as before, nothing stored.
    estimate.cut = false;
    let mut again = Seen::default();
    report(&mut estimate, fell, 18_000, &mut again);
    assert!(!fell_in(&again), "{estimate:?}");
}

#[test]
fn a_change_that_is_not_congestion_is_measured_again_not_followed_down() {
    let slower = Process {
        extra_us: 8_000,
        hold_us: 8_000,
    };
    let changes = [
        (
            "the host turns busy",
            Shape {
                noise: Noise::Busy(15_000),
                ..CLEAN
            },
        ),
        (
            "one process turns slow",
            Shape {
                processes: [slower, Process::default(), Process::default()],
                ..CLEAN
            },
        ),
        (
            "a slow class of requests starts",
            Shape {
                noise: Noise::Bimodal(200_000),
                ..CLEAN
            },
        ),
        // Twice as slow at every concurrency: the same capacity in calls at once.
        (
            "the downstream turns slower for good",
            Shape {
                service_us: 40_000,
                ..CLEAN
            },
        ),
    ];
    for (what, shape) in changes {
        let mut fleet = Fleet::new();
        fleet.run(CLEAN, 40);
        let changing = fleet.run(shape, 10);
        assert!(
            changing.iter().all(|s| s.full >= 14),
            "{what}: the limit fell on it: {}",
            shown(&changing)
        );
        assert_steady(&fleet.run(shape, 60), 20, what);
    }
}

/// A downstream never saturated keeps the limit above what the fleet offers, and once every
/// process has a base no cut refuses what it has room for (a cut in every forty seconds sent a
/// quarter of that second's calls to a healthy downstream to the fallback); when it comes to
/// queue at what the fleet offers, the votes call the cut that finds its capacity.
#[test]
fn a_downstream_never_saturated_keeps_the_limit_above_what_is_offered() {
    for noise in [Noise::None, Noise::Busy(15_000), Noise::Bimodal(200_000)] {
        let shape = Shape {
            offered: Some(16),
            noise,
            ..CLEAN
        };
        let mut fleet = Fleet::new();
        let seconds = fleet.run(shape, 90);
        assert!(
            seconds.iter().all(|s| s.full >= 16),
            "offered 16: {}",
            shown(&seconds)
        );
        // After the first cut (the processes' first bases: 10 s in, as the simulation starts).
        let cuts: Vec<usize> = (15..seconds.len()).filter(|&t| seconds[t].cut).collect();
        assert!(
            cuts.is_empty(),
            "offered 16, cut at {cuts:?}: {}",
            shown(&seconds)
        );
        // A slow class whose latency does not grow with the queue hides it: at 1.6 × C the
        // votes read unsure, with or without cuts.
        if let Noise::Bimodal(_) = noise {
            continue;
        }
        follows_a_halving(&mut fleet, shape, 10, "offered 16 at a capacity of 10");
    }
}

/// Processes that restart in a fleet whose occupancy holds steady under its limit (no call
/// at low occupancy) have no base and no vote. One of three waits for its base, its third of
/// the calls unjudged, while the others' votes steer: no cut refuses what the downstream has
/// room for. Two of three (most of a rolling restart) call a cut within a period, which gives
/// them theirs, and then none is called.
#[test]
fn processes_restarting_in_a_fleet_with_room_to_spare_are_cut_a_base_once_most_have_none() {
    let shape = Shape {
        offered: Some(16),
        ..CLEAN
    };
    let cuts = |seconds: &[Second]| -> Vec<usize> {
        (0..seconds.len()).filter(|&t| seconds[t].cut).collect()
    };
    let mut fleet = Fleet::new();
    fleet.run(shape, 60);
    fleet.sampling[0] = Sampling::default();
    let one = fleet.run(shape, 90);
    assert_eq!(
        cuts(&one),
        Vec::<usize>::new(),
        "one restarted: {}",
        shown(&one)
    );
    fleet.sampling[1] = Sampling::default();
    let two = fleet.run(shape, 90);
    let cut = cuts(&two);
    // A cut's ticks may span two seconds.
    let once = cut.first().is_some_and(|&first| {
        first <= MAX_CUT_EVERY_MS as usize / 1000 + 1 && cut.iter().all(|&t| t <= first + 2)
    });
    assert!(once, "two restarted, cut at {cut:?}: {}", shown(&two));
}

#[test]
fn every_branch_is_reached() {
    let mut fleet = Fleet::new();
    fleet.run(CLEAN, 40);
    fleet.run(
        Shape {
            capacity: 10,
            ..CLEAN
        },
        10,
    );
    fleet.run(
        Shape {
            offered: Some(2),
            ..CLEAN
        },
        5,
    );
    // Queued votes on bases ten seconds old: a cut verifies them first.
    fleet.run(CLEAN, 12);
    fleet.run(
        Shape {
            noise: Noise::Busy(30_000),
            ..CLEAN
        },
        20,
    );
    let mut far = Fleet::started_at(100);
    far.run(
        Shape {
            capacity: 4,
            ..CLEAN
        },
        10,
    );
    let mut warm = Fleet::new();
    warm.ms = 100_000;
    warming_up(&mut warm, 45_000, 6, 4);
    // A period with bases and without a cut: the fleet never filled its limit.
    let mut roomy = Fleet::new();
    roomy.run(
        Shape {
            offered: Some(16),
            ..CLEAN
        },
        40,
    );
    let mut seen = fleet.seen;
    seen.merge(far.seen);
    seen.merge(warm.seen);
    seen.merge(roomy.seen);
    probed_then_queued(&mut seen);
    let mut estimate = fleet.estimate.clone();
    let idle = Report {
        observed: Observed::default(),
        bounds: BOUNDS,
        window_ms: 1_000,
        joined_ms: 0,
    };
    let at = |ms| Now {
        ms,
        ns: 0,
        order: 0,
    };
    // A window of one call (no vote), then one of none.
    let lone = Report {
        observed: Observed {
            samples: 1,
            sum_us: 20_000,
            calls: 1,
            ..Observed::default()
        },
        ..idle
    };
    Adapt::step(&mut estimate, &idle, at(fleet.ms + 5_000), &mut seen);
    Adapt::step(&mut estimate, &lone, at(fleet.ms + 5_100), &mut seen);
    Adapt::step(&mut estimate, &idle, at(fleet.ms + 6_500), &mut seen);
    Adapt::step(&mut estimate, &idle, at(fleet.ms + 8_000), &mut seen);
    let learnt = Adapt::step(
        &mut estimate,
        &idle,
        at(fleet.ms + 9_000 + IDLE_MS),
        &mut seen,
    );
    assert_eq!((learnt.limit, learnt.full), (20, 20), "started again");
    assert_eq!(seen.missing(&Branch::ALL), Vec::<&Branch>::new());
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
    let mut sampling = Sampling::default();
    for second in 0..60u64 {
        let failing = second >= 30;
        for call in 0..20 {
            // Low and fast, then queued or failing at high occupancy.
            let low = call % 4 == 0;
            sampling.body(low, 1_000, low || !failing);
        }
        sampling.occupancy(100, false);
        let report = Report {
            observed: sampling.report(false),
            bounds,
            window_ms: 1000,
            joined_ms: 0,
        };
        let now = Now {
            ms: second * 1000,
            ns: 0,
            order: 0,
        };
        let learnt = Adapt::step(&mut estimate, &report, now, &mut seen);
        assert!((5..=10).contains(&learnt.limit));
        if second == 29 {
            assert_eq!(learnt.full, 10);
        }
    }
    assert_eq!(bounds.whole(estimate.limit_pm), 5);
}

/// A slow class of requests at random (one call in ten takes 200 ms, the others 6 ms) on a
/// downstream that never queues, 40 calls a report, one in eight admitted in a dip of the
/// occupancy: a report's mean varies by a twentieth either way. A base lowered to every mean
/// that fell below it learns the fastest of many reports, sits a sixth below the latency of
/// the empty downstream, and its process votes unsure where it should vote clear (the field
/// harness's bimodal shape: the limit held at 13 of C = 20 for 13 s after the doubling).
#[test]
fn a_base_does_not_learn_the_fastest_of_many_reports() {
    let mut seed = 7_u64;
    let mut latency = move || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        if (seed >> 33).is_multiple_of(10) {
            200_000
        } else {
            6_000
        }
    };
    let mut sampling = Sampling::default();
    for _ in 0..60 {
        sampling.body(true, latency(), true);
    }
    sampling.report(true);
    let mut clear = 0;
    for report in 0..200 {
        for call in 0..40 {
            sampling.body(call % 8 == 7, latency(), true);
        }
        let votes = sampling.report(false).votes;
        if report >= 100 && votes.clear > 0 {
            clear += 1;
        }
    }
    assert!(
        clear >= 90,
        "{clear} of 100 reports voted clear: {sampling:?}"
    );
}

/// A process's first report, before it has a base, counts its slow class uncapped (one call in
/// ten at 200 ms, the others 24 ms: its latencies vary by 53 ms, not the 11 ms they vary by
/// counted as the vote counts them). Learnt from it, that variance would let no mean near the
/// limit lower a base of 42 ms for many reports (a warm-up's, or this report's own), and the
/// process would vote clear on a downstream queued half as deep again.
#[test]
fn a_first_reports_uncounted_slow_class_does_not_keep_its_base_up() {
    let calls = |sampling: &mut Sampling, low: bool| {
        for call in 0..40 {
            let us = if call % 10 == 9 { 200_000 } else { 24_000 };
            sampling.body(low, us, true);
        }
    };
    let mut sampling = Sampling::default();
    calls(&mut sampling, true);
    sampling.report(false);
    let mut votes = Votes::default();
    for _ in 0..3 {
        calls(&mut sampling, false);
        votes = sampling.report(false).votes;
    }
    let base = votes.base_sum / votes.weight();
    assert!(base <= 31_000, "base {base} µs: {sampling:?}");
}

/// A process's first base is its warm-up's (66 ms: connections opening while the fleet ramps
/// up), and so are its next calls' latencies (half of them at 110 ms, half at 22 ms): learnt
/// from them, the chance a report's mean is given would keep the base at 47 ms when its calls
/// near the limit (one in ten at 130 ms, the others 22 ms) average 33, until the variance
/// fades, and the limit climbs on clear votes meanwhile (the field's slow process: to 47 over
/// C = 20). Capped at a fifth of the mean, the base comes down in one report.
#[test]
fn a_warm_up_base_comes_down_within_a_report_however_widely_calls_spread() {
    let calls = |sampling: &mut Sampling, low: bool, slow_in: u64, slow_us: u64| {
        for call in 0..40 {
            let us = if call % slow_in == 0 { slow_us } else { 22_000 };
            sampling.body(low, us, true);
        }
        sampling.report(false).votes
    };
    let mut sampling = Sampling::default();
    calls(&mut sampling, true, 1, 66_000);
    calls(&mut sampling, false, 2, 110_000);
    let votes = calls(&mut sampling, false, 10, 130_000);
    let base = votes.base_sum / votes.weight();
    assert!(base <= 40_000, "base {base} µs: {sampling:?}");
}

/// A window counts each process that asked for slots in it once, however often it reported
/// (every 250 ms here, against a 1 s window): those that ended calls, and one refused every
/// slot (its reports carry a lease reply's occupancy and no call), but not a process whose
/// reports carry neither (one whose limit was ageing while it had no call): the processes a
/// saturated fleet's slots are shared among ([`share`](super::share)). Counted by their calls
/// alone, processes refused every slot went uncounted, and one holding them all counted alone.
#[test]
fn a_window_counts_each_process_that_asked_for_slots_once() {
    let mut estimate = Estimate::default();
    let mut seen = Seen::default();
    let busy = Observed {
        samples: 5,
        sum_us: 100_000,
        calls: 5,
        ..Observed::default()
    };
    let refused = Observed {
        peak: 20,
        ..Observed::default()
    };
    let mut joined = [0u64; 5];
    let mut counted = Vec::new();
    for tick in 0..16u64 {
        for (index, joined) in joined.iter_mut().enumerate() {
            let observed = match index {
                0..3 => busy,
                3 => refused,
                _ => Observed::default(),
            };
            let report = Report {
                observed,
                bounds: BOUNDS,
                window_ms: 1_000,
                joined_ms: *joined,
            };
            let now = Now {
                ms: 1_000 + tick * 250 + index as u64,
                ns: 0,
                order: 0,
            };
            let learnt = Adapt::step(&mut estimate, &report, now, &mut seen);
            if observed.asked() {
                *joined = learnt.joined_ms;
            }
            counted.push(learnt.processes);
        }
    }
    // Nothing closed before the first window did; every window after counted four.
    assert!(counted[..20].iter().all(|&n| n == 0), "{counted:?}");
    assert!(counted[20..].iter().all(|&n| n == 4), "{counted:?}");
}

/// A slow class served in order with the others (one request in ten takes 200 ms, the others
/// 5 ms, and a fast one waits behind slow ones: the field harness's bimodal downstream). Read
/// against the base (the fast calls' latency, the slow class counted at its cap), a queue of a
/// tenth past the capacity read as 1.4, and the fleet rested at the capacity, its cuts at three
/// quarters of it: at half the capacity a cut took the downstream to 6 of 10. Read against the
/// service time, the fleet rests near 1.1 C and every second, cuts included, stays within
/// [0.8 C, 1.3 C], at the capacity and from 10 s after it halves.
#[test]
fn a_slow_class_served_in_order_keeps_every_second_within_the_band() {
    let shape = IN_ORDER;
    let halved = Shape {
        capacity: 10,
        ..shape
    };
    let mut fleet = Fleet::new();
    fleet.run(shape, 30);
    let full = fleet.run(shape, 60);
    let half = fleet.run(halved, 40);
    let within = |seconds: &[Second], capacity: f64| {
        seconds
            .iter()
            .all(|s| (0.8 * capacity..=1.3 * capacity).contains(&s.inside))
    };
    assert!(
        within(&full, 20.0) && within(&half[10..], 10.0),
        "{} | {}",
        shown(&full),
        shown(&half)
    );
}
