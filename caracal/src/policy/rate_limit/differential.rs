//! `admit.lua` against the kernel's [`decide`]: generated arrivals at one cell, with intervals
//! from a nanosecond to seconds (so sums carry across whole seconds in the script's
//! seconds:nanoseconds arithmetic) and clock moves to just before, at and after the moment
//! the next arrival becomes admissible; each arrival with its class's share of the burst (the
//! whole burst, the usual thresholds' or any), batches of mixed shares among them; batches that
//! take several emissions each (prefetch), some with more arrivals than the burst (every own
//! emission decided before any extra), and give-backs of emissions before the last take's TAT,
//! some after another take moved the TAT.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::coordinator::differential::{Connection, Env, clock, differential};
use crate::kernel::{Seen, Wire};
use crate::policy::rate_limit::kernel::give_back::{self, GiveBack, Unused};
use crate::policy::rate_limit::kernel::{Arrival, Branch, Cell, Gcra, Taken, decide};

#[derive(Debug, Clone)]
enum Command {
    /// Arrivals of these shares in one script call, decided one after the other at one
    /// instant, each taking up to `take` emissions.
    Arrive { shares: Vec<u16>, take: u32 },
    /// Gives back up to this many emissions before the last take's TAT: its extras, then
    /// what was taken before them (which exercises the compare-and-set as a real give-back of
    /// a take's extras does, on both sides).
    GiveBack { count: u32 },
    /// Moves the clock on by this many microseconds (the resolution of `TIME`).
    Advance { us: u64 },
    /// To the moment an arrival becomes admissible, offset by -1, 0 or 1 µs.
    ToAdmissible { offset: i8 },
}

fn command() -> impl Strategy<Value = Command> {
    let share = crate::priority::any_share;
    let take = prop_oneof![Just(1u32), 2u32..6];
    prop_oneof![
        5 => (share(), take.clone()).prop_map(|(share, take)| Command::Arrive { shares: vec![share], take }),
        3 => (prop::collection::vec(share(), 2..9), take)
            .prop_map(|(shares, take)| Command::Arrive { shares, take }),
        2 => (1u32..6).prop_map(|count| Command::GiveBack { count }),
        2 => prop_oneof![0u64..2_000, 0u64..3_000_000].prop_map(|us| Command::Advance { us }),
        2 => (-1i8..=1).prop_map(|offset| Command::ToAdmissible { offset }),
    ]
}

/// One case: the interval (ns) and burst of every arrival, and the commands.
fn case() -> impl Strategy<Value = (u64, u32, Vec<Command>)> {
    let interval = prop_oneof![
        1u64..2_000,
        1_000u64..5_000_000,
        100_000_000u64..2_500_000_000
    ];
    (interval, 1u32..6, prop::collection::vec(command(), 1..40))
}

/// What a case must reach: the admission's branches, then the give-back's.
const BRANCHES: [&str; 9] = [
    "Idle",
    "Burst",
    "AboveShare",
    "Rejected",
    "TookAll",
    "TookFewer",
    "Returned",
    "ReturnedIdle",
    "Moved",
];

/// The give-back branches `given` reached, as indices into [`BRANCHES`].
fn given_back(given: Seen) -> impl Iterator<Item = usize> {
    let missing = given.missing(&give_back::Branch::ALL);
    (0..give_back::Branch::ALL.len())
        .filter(move |&i| !missing.contains(&&give_back::Branch::ALL[i]))
        .map(|i| Branch::ALL.len() + i)
}

pub(crate) fn run(conn: Connection, cases: u32) {
    differential(
        conn,
        cases,
        case(),
        &BRANCHES,
        |env, (interval, burst, commands)| {
            let mut cell = Cell::default();
            let mut seen = Seen::default();
            let mut given = Seen::default();
            let mut last: Option<Taken> = None;
            let mut now_us = env.start_us;
            let key = env.key("rate:ns");
            for command in commands {
                match command {
                    Command::Arrive { shares, take } => {
                        let arrivals: Vec<Arrival> = shares
                            .iter()
                            .map(|&share| Arrival {
                                interval,
                                burst,
                                share,
                                take,
                            })
                            .collect();
                        let batch: Vec<&Arrival> = arrivals.iter().collect();
                        let want = decide(&mut cell, &batch, clock(now_us).ns, &mut seen);
                        let got = env
                            .script::<Gcra>(&batch, Wire::default(), now_us)?
                            .map_err(|e| TestCaseError::fail(format!("rate_limit failed: {e}")))?;
                        prop_assert_eq!(&want, &got, "arrivals {:?} at {} µs", shares, now_us);
                        // The batch's TAT is the one its last admitted arrival left.
                        let admitted = want.iter().filter_map(|reply| reply.ok());
                        last = admitted.max_by_key(|taken| taken.tat).or(last);
                    }
                    Command::GiveBack { count } => {
                        if let Some(taken) = last {
                            let unused = Unused {
                                interval,
                                count: count.min(taken.extra + 1),
                                tat: taken.tat,
                            };
                            env.step::<GiveBack>(
                                &mut cell,
                                &unused,
                                Wire::default(),
                                now_us,
                                &mut given,
                            )?;
                        }
                    }
                    Command::Advance { us } => now_us += us,
                    Command::ToAdmissible { offset } => {
                        let burst_delay = interval * u64::from(burst - 1);
                        if let Some(tat) = cell.0 {
                            let admissible = tat.saturating_sub(burst_delay).div_ceil(1000);
                            now_us = now_us.max(admissible.saturating_add_signed(offset.into()));
                        }
                    }
                }
            }
            compare_final_state(env, &key, cell.0)?;
            for branch in given_back(given) {
                seen.record(branch);
            }
            Ok(seen)
        },
    );
}

/// The stored TAT (`"<seconds>:<nanoseconds>"`) and the key's expiry (the TAT, rounded up to
/// a millisecond) against the model's.
fn compare_final_state(
    env: &mut Env<'_>,
    key: &str,
    tat: Option<u64>,
) -> Result<(), TestCaseError> {
    let stored: Option<String> = env.get(key)?;
    let stored = stored.map(|text| {
        let (seconds, nanos) = text.split_once(':').unwrap_or(("x", "x"));
        match (seconds.parse::<u64>(), nanos.parse::<u64>()) {
            (Ok(seconds), Ok(nanos)) if nanos < 1_000_000_000 => {
                Ok(seconds * 1_000_000_000 + nanos)
            }
            _ => Err(text),
        }
    });
    prop_assert_eq!(tat.map(Ok), stored, "final TAT");
    let expiry = env.expiry(key)?;
    prop_assert_eq!(
        tat.map(|tat| tat.div_ceil(1_000_000)),
        expiry,
        "the cell's expiry"
    );
    Ok(())
}

#[test]
fn rate_limit_agrees_with_the_kernel() {
    let server = caracal_tests::RedisServer::start();
    run(Box::new(server.connection()), 300);
}
