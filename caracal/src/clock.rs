//! The clock of the in-process owners of kernel state (the in-memory coordinator, the local
//! breaker and rate limiter): tokio's monotonic clock, so tests can pause and advance it, read as
//! the plain integers the kernels take.
//!
//! Each owner starts its own clock: a process-wide origin would have to be an `Instant` taken
//! before any test paused time, and a paused clock's instants are not comparable with it.

use tokio::time::Instant;

/// Time elapsed since the owner was made, plus one unit, so no reading is ever 0 (a kernel may
/// use 0 for "never").
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock(Instant);

impl Clock {
    /// A clock starting now.
    pub(crate) fn start() -> Self {
        Clock(Instant::now())
    }

    /// Milliseconds.
    pub(crate) fn ms(self) -> u64 {
        u64::try_from(self.0.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    /// Nanoseconds.
    pub(crate) fn ns(self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX - 1) + 1
    }
}
