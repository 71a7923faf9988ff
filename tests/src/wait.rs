//! Bounded waiting for conditions.

use std::time::{Duration, Instant};

/// Polls `condition` every 10 ms until it holds.
///
/// # Panics
/// When it still does not hold after `timeout`, naming `what` was awaited.
pub fn wait_until(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
