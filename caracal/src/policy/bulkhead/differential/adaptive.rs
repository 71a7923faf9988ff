//! `adaptive.lua` against the [`Adapt`] kernel: generated reports (bodies at low and high
//! occupancy with latencies from a microsecond to minutes, drops, occupancies, each judged by
//! a process's [`Sampling`] as a process would) under generated bounds and windows, with clock
//! moves to just before, at and after the open window's end, past the period before the next
//! cut (10 to 40 s), and past the estimate's idle expiry (where the key is deleted, as its TTL
//! would on real time); and a stored period an older script left absent or something foreign
//! wrote (negative, fractional, huge), which both read within [10 s, 40 s], and stored counts
//! of processes and settled limits likewise.

use std::collections::HashMap;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::coordinator::differential::{Connection, Env, clock, differential};
use crate::kernel::{Seen, State, Wire};
use crate::policy::bulkhead::kernel::adaptive::vote::Sampling;
use crate::policy::bulkhead::kernel::adaptive::{
    Adapt, Bounds, Branch, CUT_EVERY_MS, Estimate, IDLE_MS, MAX_CUT_EVERY_MS, MAX_SUM, Observed,
    Report,
};

#[derive(Debug, Clone)]
enum Command {
    /// One of three processes reports these bodies' outcomes (at low occupancy or not;
    /// `None`: a drop) and this occupancy.
    Report {
        process: usize,
        bodies: Vec<(bool, Option<u64>)>,
        occupancy: u32,
    },
    /// Moves the clock on by this many microseconds.
    Advance { us: u64 },
    /// To the open window's end, offset by -1, 0 or 1 ms.
    ToWindowEnd { offset: i8 },
    /// Past the estimate's idle expiry.
    Idle,
    /// Past the period before the next cut.
    Cut,
    /// The stored period replaced (`None`: deleted, as an older script's hash has none), then
    /// a report of nothing.
    Period(Option<&'static str>),
    /// The stored counts of processes (`askers`, `procs`) and the settled limit replaced
    /// likewise.
    Counts(Option<&'static str>),
}

/// Stored periods and how the kernel reads them: absent, negative, fractional, within the
/// bounds, fractional within them, huge, not a number.
const PERIODS: [(Option<&str>, u64); 7] = [
    (None, 0),
    (Some("-5"), 0),
    (Some("0.5"), 0),
    (Some("25000"), 25_000),
    (Some("25000.5"), 25_000),
    (Some("1000000000"), u64::MAX),
    (Some("nan"), 0),
];

/// Stored counts of processes, or settled limits, and how the kernel reads them: absent,
/// negative, fractional, a count, fractional, huge, not a number.
const COUNTS: [(Option<&str>, u64); 7] = [
    (None, 0),
    (Some("-5"), 0),
    (Some("0.5"), 0),
    (Some("7"), 7),
    (Some("7.5"), 7),
    (Some("1e300"), MAX_SUM),
    (Some("nan"), 0),
];

fn latency() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![
        6 => (1_000u64..100_000).prop_map(Some),
        2 => (0u64..2_000_000_000).prop_map(Some),
        2 => Just(None),
    ]
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        // A third of the reports have every call near the limit, as a saturated fleet's do.
        6 => (
            0usize..3,
            prop::collection::vec((any::<bool>(), latency()), 0..24),
            0u32..3,
            0u32..600,
        )
            .prop_map(|(process, mut bodies, saturated, occupancy)| {
                if saturated == 0 {
                    bodies.iter_mut().for_each(|(low, _)| *low = false);
                }
                Command::Report {
                    process,
                    bodies,
                    occupancy,
                }
            }),
        2 => prop_oneof![0u64..2_000, 0u64..3_000_000].prop_map(|us| Command::Advance { us }),
        3 => (-1i8..=1).prop_map(|offset| Command::ToWindowEnd { offset }),
        1 => Just(Command::Idle),
        1 => Just(Command::Cut),
        1 => prop::sample::select(&PERIODS[..]).prop_map(|(stored, _)| Command::Period(stored)),
        1 => prop::sample::select(&COUNTS[..]).prop_map(|(stored, _)| Command::Counts(stored)),
    ]
}

/// One case: the bounds, the window (ms) and the commands.
fn case() -> impl Strategy<Value = (Bounds, u64, Vec<Command>)> {
    let bounds = (1u32..6, 0u32..40, 0u32..500).prop_map(|(min, up, more)| Bounds {
        min,
        initial: min + up,
        max: min + up + more,
    });
    let window = prop_oneof![1u64..5, 5u64..1_500];
    (bounds, window, prop::collection::vec(command(), 1..40))
}

pub(crate) fn run(conn: Connection, cases: u32) {
    differential(
        conn,
        cases,
        case(),
        &Branch::ALL,
        |env, (bounds, window_ms, commands)| {
            let mut estimate = Estimate::default();
            let mut processes: [(Sampling, u64); 3] = Default::default();
            let mut seen = Seen::default();
            let mut now_us = env.start_us;
            for command in commands {
                match command {
                    Command::Report {
                        process,
                        bodies,
                        occupancy,
                    } => {
                        let (sampling, joined_ms) = &mut processes[process];
                        for (low, body) in bodies {
                            sampling.body(low, body.unwrap_or(1_000), body.is_some());
                        }
                        sampling.occupancy(occupancy);
                        let report = Report {
                            observed: sampling.report(false),
                            bounds,
                            window_ms,
                            joined_ms: *joined_ms,
                        };
                        if estimate.limit_pm > 0 && estimate.forgettable(clock(now_us)) {
                            let key = env.key("adaptive");
                            env.delete(&key)?;
                        }
                        let learnt = env.step::<Adapt>(
                            &mut estimate,
                            &report,
                            Wire::default(),
                            now_us,
                            &mut seen,
                        )?;
                        if report.observed.calls > 0 {
                            *joined_ms = learnt.joined_ms;
                        }
                        sampling.fleet_base(learnt.base_us);
                    }
                    Command::Advance { us } => now_us += us,
                    Command::ToWindowEnd { offset } => {
                        let ends =
                            (estimate.since_ms + window_ms).saturating_add_signed(offset.into());
                        now_us = now_us.max(ends * 1000);
                    }
                    Command::Idle => now_us += (IDLE_MS + 1) * 1000,
                    Command::Cut => {
                        now_us += estimate.every_ms.clamp(CUT_EVERY_MS, MAX_CUT_EVERY_MS) * 1000;
                    }
                    Command::Period(stored) | Command::Counts(stored) => {
                        // Only over a live estimate: a field alone would be a key with no TTL.
                        if estimate.limit_pm == 0 || estimate.forgettable(clock(now_us)) {
                            continue;
                        }
                        let key = env.key("adaptive");
                        if let Command::Period(_) = command {
                            env.set_field(&key, "every", stored)?;
                            let read = PERIODS.iter().find(|(s, _)| *s == stored);
                            estimate.every_ms = read.map_or(0, |(_, read)| *read);
                        } else {
                            for field in ["askers", "procs", "settled"] {
                                env.set_field(&key, field, stored)?;
                            }
                            let read = COUNTS.iter().find(|(s, _)| *s == stored);
                            let read = read.map_or(0, |(_, read)| *read);
                            (estimate.askers, estimate.processes) = (read, read);
                            estimate.settled_pm = read;
                        }
                        // A report of nothing, so that the final state holds the value read.
                        let report = Report {
                            observed: Observed::default(),
                            bounds,
                            window_ms,
                            joined_ms: 0,
                        };
                        env.step::<Adapt>(
                            &mut estimate,
                            &report,
                            Wire::default(),
                            now_us,
                            &mut seen,
                        )?;
                    }
                }
            }
            compare_final_state(env, &estimate)?;
            Ok(seen)
        },
    );
}

/// The stored estimate and the key's expiry against the model's.
fn compare_final_state(env: &mut Env<'_>, estimate: &Estimate) -> Result<(), TestCaseError> {
    let key = env.key("adaptive");
    let stored: HashMap<String, u64> = env.hash(&key)?;
    let want: HashMap<String, u64> = if estimate.limit_pm == 0 {
        HashMap::new()
    } else {
        let window = estimate.window;
        let votes = window.votes;
        [
            ("limit", estimate.limit_pm),
            ("latency", estimate.latency_us),
            ("base", estimate.base_us),
            ("since", estimate.since_ms),
            ("lowat", estimate.low_ms),
            ("cut", estimate.cut.into()),
            ("level", estimate.level),
            ("every", estimate.every_ms),
            ("n", window.samples),
            ("sum", window.sum_us),
            ("calls", window.calls),
            ("low", window.low),
            ("peak", window.peak),
            ("queued", votes.queued),
            ("clear", votes.clear),
            ("unsure", votes.unsure),
            ("ratios", votes.ratio_sum),
            ("bases", votes.base_sum),
            ("clears", votes.clear_sum),
            ("lown", window.low_samples),
            ("lowsum", window.low_sum_us),
            ("settled", estimate.settled_pm),
            ("askers", estimate.askers),
            ("procs", estimate.processes),
        ]
        .into_iter()
        .map(|(field, n)| (field.to_owned(), n))
        .collect()
    };
    prop_assert_eq!(want, stored, "the estimate");
    let expiry = env.expiry(&key)?;
    prop_assert_eq!(
        (estimate.limit_pm > 0).then_some(estimate.expires_ms),
        expiry,
        "the estimate's expiry"
    );
    Ok(())
}

#[test]
fn the_adaptive_limit_agrees_with_the_kernel() {
    let server = caracal_tests::RedisServer::start();
    run(Box::new(server.connection()), 300);
}
