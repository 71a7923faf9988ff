//! `merge.lua` against the [`Merge`] kernel: generated samples (a few buckets or many, counts
//! from one to millions) and reads at one identity's windows, widths from a millisecond to
//! seconds, and clock moves to just before, at and after a window's end.

use std::collections::HashMap;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::coordinator::differential::{Connection, Env, differential};
use crate::kernel::{Scripted, Seen, Wire};
use crate::policy::hedge::latency::kernel::buckets::BUCKETS;
use crate::policy::hedge::latency::kernel::{Branch, Merge, Record, Windows};

#[derive(Debug, Clone)]
enum Command {
    /// Merges these counts by bucket (none: a read).
    Add { samples: Vec<(usize, u64)> },
    /// Moves the clock on by this many microseconds.
    Advance { us: u64 },
    /// To the end of the current window, offset by -1, 0 or 1 ms.
    ToWindowEnd { offset: i8 },
}

fn command() -> impl Strategy<Value = Command> {
    let samples = |buckets, counts| {
        prop::collection::btree_map(0..BUCKETS, counts, buckets).prop_map(|samples| Command::Add {
            samples: samples.into_iter().collect(),
        })
    };
    prop_oneof![
        5 => samples(0..6, 1u64..20),
        1 => samples(0..BUCKETS, 1u64..5_000_000),
        3 => prop_oneof![0u64..2_000, 0u64..30_000_000].prop_map(|us| Command::Advance { us }),
        2 => (-1i8..=1).prop_map(|offset| Command::ToWindowEnd { offset }),
    ]
}

/// One case: the window's width (ms), and the commands.
fn case() -> impl Strategy<Value = (u64, Vec<Command>)> {
    let width = prop_oneof![1u64..5, 5u64..200, 200u64..20_000];
    (width, prop::collection::vec(command(), 1..30))
}

pub(crate) fn run(conn: Connection, cases: u32) {
    differential(
        conn,
        cases,
        case(),
        &Branch::ALL,
        |env, (window_ms, commands)| {
            let mut windows = Windows::default();
            let mut seen = Seen::default();
            let mut now_us = env.start_us;
            for command in commands {
                match command {
                    Command::Add { samples } => {
                        let record = Record { window_ms, samples };
                        env.step::<Merge>(
                            &mut windows,
                            &record,
                            Wire::default(),
                            now_us,
                            &mut seen,
                        )?;
                    }
                    Command::Advance { us } => now_us += us,
                    Command::ToWindowEnd { offset } => {
                        let end = (now_us / 1000 / window_ms + 1) * window_ms;
                        let ms = end.saturating_add_signed(offset.into());
                        now_us = now_us.max(ms * 1000);
                    }
                }
            }
            compare_final_state(env, &windows)?;
            Ok(seen)
        },
    );
}

/// Both slots' fields and expiries against the model's.
fn compare_final_state(env: &mut Env<'_>, windows: &Windows) -> Result<(), TestCaseError> {
    for (suffix, slot) in Merge::KEYS.iter().zip(&windows.slots) {
        let key = env.key(suffix);
        let stored: HashMap<String, u64> = env.hash(&key)?;
        let want: HashMap<String, u64> = slot
            .iter()
            .flat_map(|slot| {
                let counts = slot.counts.iter().map(|(b, &c)| (b.to_string(), c));
                counts.chain([("epoch".to_owned(), slot.epoch)])
            })
            .collect();
        prop_assert_eq!(want, stored, "the slot {}", suffix);
        let expiry = env.expiry(&key)?;
        prop_assert_eq!(
            slot.as_ref().map(|slot| slot.expires_ms),
            expiry,
            "the expiry of {}",
            suffix
        );
    }
    Ok(())
}

#[test]
fn the_windows_agree_with_the_kernel() {
    let server = caracal_tests::RedisServer::start();
    run(Box::new(server.connection()), 300);
}
