//! The `metrics` example (`examples/metrics.rs`) is a target of this package, which exists so
//! that only it is built with caracal's `metrics` feature.
//!
//! It also holds the seeded load the shadow benchmark (`examples/shadow.rs`) and the shadow
//! suite (`tests/testsuite/shadow.rs`) both drive, so that the two compare the same calls.

use std::time::Duration;

/// One call of a seeded schedule: when it arrives, how long its body runs, whether it fails.
#[derive(Debug, Clone, Copy)]
pub struct Planned {
    /// Its arrival, from the schedule's start.
    pub at: Duration,
    /// How long its body runs.
    pub runs: Duration,
    /// Whether its body fails.
    pub fails: bool,
}

impl Planned {
    /// Its body: sleeps for [`runs`](Self::runs), then fails with `failure` if it
    /// [`fails`](Self::fails).
    pub async fn run<E>(self, failure: impl FnOnce() -> E) -> Result<(), E> {
        tokio::time::sleep(self.runs).await;
        if self.fails { Err(failure()) } else { Ok(()) }
    }
}

/// `calls` calls from `seed` (splitmix64): arrivals on whole milliseconds, 0 to 4 apart; bodies
/// of 4 to 16 ms and a half, so that no body ends on an arrival's instant (where which comes
/// first would be the scheduler's choice, and could differ between two runs); failing 80 % of
/// the time in every other stretch of 100 calls, 5 % in the others.
pub fn seeded(seed: u64, calls: u64) -> Vec<Planned> {
    let mut state = seed;
    let mut next = move |bound: u64| {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % bound
    };
    let mut at = 0;
    (0..calls)
        .map(|i| {
            at += next(5);
            let share = if (i / 100) % 2 == 1 { 80 } else { 5 };
            Planned {
                at: Duration::from_millis(at),
                runs: Duration::from_micros((4 + next(13)) * 1_000 + 500),
                fails: next(100) < share,
            }
        })
        .collect()
}
