//! `adaptive.lua` against the [`Adapt`] kernel: generated reports (bodies at low and high
//! occupancy with latencies from a microsecond to minutes, drops, occupancies, each judged by
//! a process's [`Sampling`] as a process would) under generated bounds and windows, with clock
//! moves to just before, at and after the open window's end, past the period before the next
//! cut (10 to 40 s), and past the estimate's idle expiry (where the key is deleted, as its TTL
//! would on real time); and any stored field an older script left absent or something foreign
//! wrote (negative, fractional, huge, not a number, a time after now), which the kernel reads
//! as a count (a period within [10 s, 40 s], a time at most now).

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
    /// `None`: a drop) and this occupancy, which a reply refusing a call showed or not.
    Report {
        process: usize,
        bodies: Vec<(bool, Option<u64>)>,
        occupancy: u32,
        refused: bool,
    },
    /// Moves the clock on by this many microseconds.
    Advance { us: u64 },
    /// To the open window's end, offset by -1, 0 or 1 ms.
    ToWindowEnd { offset: i8 },
    /// Past the estimate's idle expiry.
    Idle,
    /// Past the period before the next cut.
    Cut,
    /// One stored field replaced (`None`: deleted, as an older script's hash lacks its later
    /// fields), then a report of nothing.
    Field(&'static str, Option<&'static str>),
}

/// Stored values and how the kernel reads them: absent, negative, fractional, a count, one
/// within the period's bounds, fractional, a time in 1970, huge, not a number, infinite.
const STORED: [(Option<&str>, u64); 11] = [
    (None, 0),
    (Some("-5"), 0),
    (Some("0.5"), 0),
    (Some("1"), 1),
    (Some("7.5"), 7),
    (Some("25000"), 25_000),
    (Some("25000.5"), 25_000),
    (Some("1000000000"), 1_000_000_000),
    (Some("1e300"), MAX_SUM),
    (Some("nan"), 0),
    (Some("inf"), MAX_SUM),
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
        // A third of the reports have every call near the limit, as a saturated fleet's do,
        // and a sixth every call at low occupancy, as a quiet fleet's or a cut's do.
        6 => (
            0usize..3,
            prop::collection::vec((any::<bool>(), latency()), 0..24),
            0u32..6,
            0u32..600,
            prop::bool::weighted(0.05),
        )
            .prop_map(|(process, mut bodies, kind, occupancy, refused)| {
                match kind {
                    0 | 1 => bodies.iter_mut().for_each(|(low, _)| *low = false),
                    2 => bodies.iter_mut().for_each(|(low, _)| *low = true),
                    _ => {}
                }
                Command::Report {
                    process,
                    bodies,
                    occupancy,
                    refused,
                }
            }),
        2 => prop_oneof![0u64..2_000, 0u64..3_000_000].prop_map(|us| Command::Advance { us }),
        3 => (-1i8..=1).prop_map(|offset| Command::ToWindowEnd { offset }),
        1 => Just(Command::Idle),
        1 => Just(Command::Cut),
        2 => (
            prop::sample::select(&FIELDS[..]),
            prop::sample::select(&STORED[..]),
        )
            .prop_map(|(field, (stored, _))| Command::Field(field, stored)),
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
    let commands = prop::collection::vec(command(), 1..40);
    // A case in four is a fleet under its limit (the limits drawn start under 46): its
    // occupancies are the lowest, so its windows may never fill the limit.
    (bounds, window, commands, prop::bool::weighted(0.15)).prop_map(
        |(bounds, window, mut commands, roomy)| {
            for command in commands.iter_mut().filter(|_| roomy) {
                if let Command::Report { occupancy, .. } = command {
                    *occupancy %= 8;
                }
            }
            (bounds, window, commands)
        },
    )
}

pub(crate) fn run(conn: Connection, cases: u32) {
    differential(
        conn,
        cases,
        case(),
        &Branch::ALL,
        |env, (bounds, window_ms, commands)| {
            let mut estimate = Estimate::default();
            // Each process's sampling, the window it last joined, and whether its last answer
            // was a cut's.
            let mut processes: [(Sampling, u64, bool); 3] = Default::default();
            let mut seen = Seen::default();
            let mut now_us = env.start_us;
            for command in commands {
                match command {
                    Command::Report {
                        process,
                        bodies,
                        occupancy,
                        refused,
                    } => {
                        let (sampling, joined_ms, cut) = &mut processes[process];
                        for (low, body) in bodies {
                            sampling.body(low, body.unwrap_or(1_000), body.is_some());
                        }
                        sampling.occupancy(occupancy, refused);
                        let report = Report {
                            observed: sampling.report(*cut),
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
                        if report.observed.asked() {
                            *joined_ms = learnt.joined_ms;
                        }
                        sampling.fleet_base(learnt.base_us);
                        *cut = learnt.limit < learnt.full;
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
                    Command::Field(field, stored) => {
                        // Only over a live estimate: a field alone would be a key with no TTL.
                        if estimate.limit_pm == 0 || estimate.forgettable(clock(now_us)) {
                            continue;
                        }
                        let key = env.key("adaptive");
                        env.set_field(&key, field, stored)?;
                        let read = STORED.iter().find(|(s, _)| *s == stored);
                        let read = read.map_or(0, |(_, read)| *read);
                        match field {
                            "cut" => estimate.cut = read == 1,
                            field => {
                                let slot = counts(&mut estimate).find(|(name, _)| *name == field);
                                *slot.expect("a stored field").1 = read;
                            }
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

/// The `adaptive` hash's fields.
const FIELDS: [&str; 26] = [
    "limit", "latency", "base", "since", "lowat", "cut", "level", "every", "n", "sum", "calls",
    "low", "peak", "queued", "clear", "unsure", "ratios", "bases", "clears", "lown", "lowsum",
    "settled", "measured", "askers", "procs", "refused",
];

/// Each field of the hash but `cut` (a flag), and the model's count it stores.
fn counts(estimate: &mut Estimate) -> impl Iterator<Item = (&'static str, &mut u64)> {
    let window = &mut estimate.window;
    let votes = &mut window.votes;
    [
        ("limit", &mut estimate.limit_pm),
        ("latency", &mut estimate.latency_us),
        ("base", &mut estimate.base_us),
        ("since", &mut estimate.since_ms),
        ("lowat", &mut estimate.low_ms),
        ("level", &mut estimate.level),
        ("every", &mut estimate.every_ms),
        ("n", &mut window.samples),
        ("sum", &mut window.sum_us),
        ("calls", &mut window.calls),
        ("low", &mut window.low),
        ("peak", &mut window.peak),
        ("refused", &mut window.refused),
        ("queued", &mut votes.queued),
        ("clear", &mut votes.clear),
        ("unsure", &mut votes.unsure),
        ("ratios", &mut votes.ratio_sum),
        ("bases", &mut votes.base_sum),
        ("clears", &mut votes.clear_sum),
        ("lown", &mut window.low_samples),
        ("lowsum", &mut window.low_sum_us),
        ("settled", &mut estimate.settled_pm),
        ("measured", &mut estimate.measured_us),
        ("askers", &mut estimate.askers),
        ("procs", &mut estimate.processes),
    ]
    .into_iter()
}

/// The stored estimate and the key's expiry against the model's.
fn compare_final_state(env: &mut Env<'_>, estimate: &Estimate) -> Result<(), TestCaseError> {
    let key = env.key("adaptive");
    let stored: HashMap<String, u64> = env.hash(&key)?;
    let want: HashMap<String, u64> = if estimate.limit_pm == 0 {
        HashMap::new()
    } else {
        let mut estimate = estimate.clone();
        let cut = ("cut", estimate.cut.into());
        counts(&mut estimate)
            .map(|(field, n)| (field, *n))
            .chain([cut])
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
