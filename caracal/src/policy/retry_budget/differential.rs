//! `window.lua` against the [`Slide`] kernel: generated deposits, withdrawals and reads at one
//! identity's window, widths from a millisecond to seconds, and clock moves to just before, at
//! and after a bucket's end and the moment the oldest bucket leaves the window, and back (no
//! earlier than the case's start), as a failover to a replica whose clock is behind moves it.

use std::collections::HashMap;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::coordinator::differential::{Connection, Env, differential};
use crate::kernel::{Seen, Wire};
use crate::policy::retry_budget::kernel::{Branch, Record, Slide, Totals, Window};

#[derive(Debug, Clone)]
enum Command {
    /// Adds these counts (both 0: a read).
    Add { deposits: u64, withdrawals: u64 },
    /// Moves the clock on by this many microseconds.
    Advance { us: u64 },
    /// To the end of the oldest bucket's window (when it leaves), offset by -1, 0 or 1 ms.
    ToExpiry { offset: i8 },
    /// Moves the clock back (no earlier than the case's start), as a failover to a replica
    /// whose clock is behind does.
    Back { ms: u64 },
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        5 => (0u64..4, 0u64..3).prop_map(|(deposits, withdrawals)| Command::Add { deposits, withdrawals }),
        1 => (0u64..500, 0u64..1_000_000).prop_map(|(deposits, withdrawals)| Command::Add { deposits, withdrawals }),
        3 => prop_oneof![0u64..2_000, 0u64..3_000_000].prop_map(|us| Command::Advance { us }),
        2 => (-1i8..=1).prop_map(|offset| Command::ToExpiry { offset }),
        1 => (0u64..5_000).prop_map(|ms| Command::Back { ms }),
    ]
}

/// One case: the width (ms) and bucket count of every command, and the commands.
fn case() -> impl Strategy<Value = (u64, u32, Vec<Command>)> {
    let width = prop_oneof![1u64..5, 5u64..200, 200u64..1_500];
    (width, 1u32..12, prop::collection::vec(command(), 1..40))
}

pub(crate) fn run(conn: Connection, cases: u32) {
    differential(
        conn,
        cases,
        case(),
        &Branch::ALL,
        |env, (width_ms, buckets, commands)| {
            let mut window = Window::default();
            let mut seen = Seen::default();
            let mut now_us = env.start_us;
            for command in commands {
                match command {
                    Command::Add {
                        deposits,
                        withdrawals,
                    } => {
                        let record = Record {
                            counts: Totals {
                                deposits,
                                withdrawals,
                            },
                            width_ms,
                            buckets,
                        };
                        env.step::<Slide>(
                            &mut window,
                            &record,
                            Wire::default(),
                            now_us,
                            &mut seen,
                        )?;
                    }
                    Command::Advance { us } => now_us += us,
                    Command::ToExpiry { offset } => {
                        if let Some(oldest) = window.buckets.first() {
                            let leaves = oldest.start + width_ms * u64::from(buckets);
                            let ms = leaves.saturating_add_signed(offset.into());
                            now_us = now_us.max(ms * 1000);
                        }
                    }
                    Command::Back { ms } => {
                        now_us = now_us.saturating_sub(ms * 1000).max(env.start_us);
                    }
                }
            }
            compare_final_state(env, &window)?;
            Ok(seen)
        },
    );
}

/// The stored buckets and the key's expiry against the model's.
fn compare_final_state(env: &mut Env<'_>, window: &Window) -> Result<(), TestCaseError> {
    let key = env.key("window");
    let stored: HashMap<String, String> = env.hash(&key)?;
    let want: HashMap<String, String> = window
        .buckets
        .iter()
        .map(|bucket| {
            (
                bucket.start.to_string(),
                format!("{}:{}", bucket.counts.deposits, bucket.counts.withdrawals),
            )
        })
        .collect();
    prop_assert_eq!(want, stored, "the buckets");
    let expiry = env.expiry(&key)?;
    prop_assert_eq!(
        (!window.buckets.is_empty()).then_some(window.expires_ms),
        expiry,
        "the window's expiry"
    );
    Ok(())
}

#[test]
fn the_window_agrees_with_the_kernel() {
    let server = caracal_tests::RedisServer::start();
    run(Box::new(server.connection()), 300);
}
