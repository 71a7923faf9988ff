//! A process-local adaptive limiter for the comparison: Netflix concurrency-limits'
//! `Gradient2Limit` behind its `WindowedLimit`, as `WindowedLimit.newBuilder().build(
//! Gradient2Limit.newBuilder()…build())` composes them, written again from their source
//! (github.com/Netflix/concurrency-limits, `limit/Gradient2Limit.java`, `WindowedLimit.java`,
//! `ExpAvgMeasurement.java`).
//!
//! Each call's round trip is a sample. A window gathers samples for 1 s (`WindowedLimit`'s
//! default minimum and maximum window time) and, if it holds at least 10 of them, hands the
//! limit their mean RTT (the short-term RTT) and the most calls in flight it saw. The limit then
//! takes one step:
//!
//! ```text
//! long     = exponential average of the short RTTs over 600 windows (the first 10: their mean)
//! if long / short > 2: long *= 0.95          (recover faster once a long overload is over)
//! if in flight < limit / 2: keep the limit   (application-limited: the samples say nothing)
//! gradient = clamp(1.5 × long / short, 0.5, 1)
//! limit    = 0.8 × limit + 0.2 × (gradient × limit + queue(limit))
//! limit    = clamp(limit, 2, 400)
//! ```
//!
//! Netflix's defaults, but for the bounds (min 2, initial 20, max 400: the fleet's) and the
//! queue allowance, √limit instead of a constant 4: a process here holds about a third of the
//! downstream's capacity, and 4 would keep its limit at 8 or more whatever the latency
//! (`0.9 × L + 0.2 × 4 = L` at the gradient's floor).
//!
//! What it does against the benchmark's downstream, saturated from the first call: its
//! long-term RTT is an average, not a minimum, so its first windows teach it the queued
//! latency as the normal one, and its tolerance lets 1.5 times that pass. Started at 20 with
//! 16 tasks a process, its limit never binds (it grows until the application-limited check
//! holds it at twice the calls in flight); started lower, it lets a queue build and its
//! baseline follows the queue up.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

const MIN: f64 = 2.0;
const INITIAL: f64 = 20.0;
const MAX: f64 = 400.0;
const TOLERANCE: f64 = 1.5;
const SMOOTHING: f64 = 0.2;
const WINDOW: Duration = Duration::from_secs(1);
const WINDOW_SAMPLES: u32 = 10;
const LONG_WINDOW: f64 = 600.0;
const LONG_WARMUP: u32 = 10;

/// The limiter of one process: admissions, and the limit they are held to.
pub(crate) struct Gradient2 {
    state: Mutex<State>,
}

struct State {
    limit: f64,
    in_flight: u32,
    window: Window,
    long: ExpAvg,
}

/// The samples of the window being gathered.
struct Window {
    started: Instant,
    samples: u32,
    rtt_sum: Duration,
    max_in_flight: u32,
}

/// `ExpAvgMeasurement`: the mean of the first `LONG_WARMUP` values, then an exponential
/// average with factor `2 / (LONG_WINDOW + 1)`.
struct ExpAvg {
    value: f64,
    count: u32,
}

/// One admitted call. Dropped without [`Permit::sample`], it frees its place and teaches the
/// limit nothing (`Limiter.Listener.onIgnore`: a call that failed before the downstream
/// answered).
pub(crate) struct Permit {
    limiter: Arc<Gradient2>,
    started: Instant,
    in_flight: u32,
}

impl Gradient2 {
    /// A limiter at its initial limit.
    pub(crate) fn new() -> Arc<Gradient2> {
        Arc::new(Gradient2 {
            state: Mutex::new(State {
                limit: INITIAL,
                in_flight: 0,
                window: Window::new(Instant::now()),
                long: ExpAvg {
                    value: 0.0,
                    count: 0,
                },
            }),
        })
    }

    /// The limit in force: whole calls, as `AbstractLimit.getLimit` rounds it down.
    pub(crate) fn limit(&self) -> u32 {
        self.lock().limit as u32
    }

    /// A place for one call, or `None` when the limit's places are all taken.
    pub(crate) fn try_acquire(self: &Arc<Self>) -> Option<Permit> {
        let mut state = self.lock();
        if state.in_flight >= state.limit as u32 {
            return None;
        }
        state.in_flight += 1;
        Some(Permit {
            limiter: Arc::clone(self),
            started: Instant::now(),
            in_flight: state.in_flight,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding it: a poisoned lock still holds a sound state.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Permit {
    /// The call succeeded: its round trip is a sample.
    pub(crate) fn sample(self) {
        let now = Instant::now();
        self.limiter
            .lock()
            .sample(now, now.duration_since(self.started), self.in_flight);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.limiter.lock().in_flight -= 1;
    }
}

impl State {
    /// `WindowedLimit.onSample`: gathers `rtt`; when the window is over, hands it to the
    /// limit if it holds enough samples, and starts the next.
    fn sample(&mut self, now: Instant, rtt: Duration, in_flight: u32) {
        self.window.samples += 1;
        self.window.rtt_sum += rtt;
        self.window.max_in_flight = self.window.max_in_flight.max(in_flight);
        if now.duration_since(self.window.started) < WINDOW {
            return;
        }
        let window = std::mem::replace(&mut self.window, Window::new(now));
        if window.samples >= WINDOW_SAMPLES {
            let short = window.rtt_sum.as_secs_f64() / f64::from(window.samples);
            self.update(short, window.max_in_flight);
        }
    }

    /// `Gradient2Limit._update`.
    fn update(&mut self, short: f64, in_flight: u32) {
        let queue = self.limit.floor().sqrt().floor();
        let long = self.long.add(short);
        if long / short > 2.0 {
            self.long.value *= 0.95;
        }
        if f64::from(in_flight) < self.limit / 2.0 {
            return;
        }
        let gradient = (TOLERANCE * long / short).clamp(0.5, 1.0);
        let target = self.limit * gradient + queue;
        self.limit = (self.limit * (1.0 - SMOOTHING) + target * SMOOTHING).clamp(MIN, MAX);
    }
}

impl Window {
    fn new(started: Instant) -> Window {
        Window {
            started,
            samples: 0,
            rtt_sum: Duration::ZERO,
            max_in_flight: 0,
        }
    }
}

impl ExpAvg {
    fn add(&mut self, sample: f64) -> f64 {
        if self.count < LONG_WARMUP {
            self.count += 1;
            self.value += (sample - self.value) / f64::from(self.count);
        } else {
            let factor = 2.0 / (LONG_WINDOW + 1.0);
            self.value = self.value * (1.0 - factor) + sample * factor;
        }
        self.value
    }
}
