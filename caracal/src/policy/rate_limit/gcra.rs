//! The generic cell rate algorithm, on any clock: the local limiter and the in-memory
//! coordinator run it on tokio's; `lua/rate_limit.lua` is the same decision on Redis time.

use std::time::Duration;

use tokio::time::Instant;

/// The emission interval for `rate` admissions per second: whole nanoseconds, rounded up, so
/// the limiter never admits more than asked.
pub(crate) fn interval(rate: f64) -> Duration {
    Duration::from_nanos((1e9 / rate).ceil().clamp(1.0, u64::MAX as f64) as u64)
}

/// Decides one arrival at `now` given the stored theoretical arrival time `tat`: `Ok` with the
/// new TAT when admitted, `Err` with the wait until an admission is possible otherwise.
pub(crate) fn admit(
    tat: Option<Instant>,
    now: Instant,
    interval: Duration,
    burst: u32,
) -> Result<Instant, Duration> {
    let burst_delay = interval.saturating_mul(burst.saturating_sub(1));
    let anchor = tat.map_or(now, |tat| tat.max(now));
    let ahead = anchor - now;
    if ahead > burst_delay {
        Err(ahead - burst_delay)
    } else {
        Ok(anchor + interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_round_up_never_down() {
        assert_eq!(interval(700.0), Duration::from_nanos(1_428_572));
        assert_eq!(interval(1_000_000.0), Duration::from_nanos(1_000));
        assert_eq!(interval(0.5), Duration::from_secs(2));
        assert!(1e9 / interval(3.0).as_nanos() as f64 <= 3.0);
    }

    #[test]
    fn burst_then_one_per_interval_with_exact_retry_after() {
        // 4 per second, burst 3, arrivals at 0, 0, 0, 0, 249 ms, 250 ms.
        let start = Instant::now();
        let interval = interval(4.0);
        let mut tat = None;
        let mut decisions = Vec::new();
        for ms in [0, 0, 0, 0, 249, 250] {
            let now = start + Duration::from_millis(ms);
            match admit(tat, now, interval, 3) {
                Ok(next) => {
                    tat = Some(next);
                    decisions.push(Ok(()));
                }
                Err(wait) => decisions.push(Err(wait)),
            }
        }
        assert_eq!(
            decisions,
            [
                Ok(()),
                Ok(()),
                Ok(()),
                Err(Duration::from_millis(250)),
                Err(Duration::from_millis(1)),
                Ok(())
            ]
        );
    }
}
