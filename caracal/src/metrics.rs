//! Metrics, with the cargo feature `metrics`, through the [`metrics`](https://docs.rs/metrics)
//! facade (0.24): install any recorder (`metrics-exporter-prometheus`, …) and caracal's
//! decisions show up in it. Without the feature none of this is compiled: no dependency, no
//! clock reading, nothing per call.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `caracal_decisions_total` | counter | `policy`, `name`, `operation`, `decision`, `reason` | one per admission decision of a bulkhead, circuit breaker or rate limit (one per attempt under a `#[retry]`) |
//! | `caracal_circuit_breaker_state` | gauge | `name`, `operation`, `scope` | the breaker's state as this process knows it: 0 closed, 1 open, 2 half_open, 3 forced_open, 4 forced_closed |
//! | `caracal_bulkhead_in_flight` | gauge | `name`, `operation` | bodies this process runs inside bulkheads right now (every scope, local and distributed) |
//! | `caracal_admission_seconds` | histogram | `policy`, `name`, `operation` | from the call reaching the policy to its admission, waits and round trips included; admitted calls only |
//! | `caracal_coordinator_up` | gauge | | 1 while every connection to the coordinator is up (always, for the in-memory one), 0 from the loss of one until it is restored |
//!
//! `policy` is `bulkhead`, `circuit_breaker` or `rate_limit`; `name` and `operation` are the
//! attribute's. Scopes are left out of every label but the breaker state's: a scope per tenant
//! or per user would make one series each.
//!
//! # Decisions and reasons
//!
//! Each admission is exactly one decision: `admitted` (the policy let the call run),
//! `rejected` (its rule turned the call away) or `degraded` (the coordinator could not answer,
//! so the policy's fallback behaviour decided). `reason` is never empty; the strings are the
//! ones the matching events carry, and are stable (each kind declares its own, and a test holds
//! this table to them):
//!
//! | policy | `admitted` | `rejected` | `degraded` |
//! |---|---|---|---|
//! | `bulkhead` | `admitted` | `capacity`, `wait_timeout`, `admission_expired` | `fail_closed` |
//! | `rate_limit` | `admitted` | `rate_exceeded` | `fail_closed` |
//! | `circuit_breaker` | `closed`, `half_open` (a probe), `forced_closed` | `open`, `half_open` (every probe slot taken), `forced_open` | `fail_open` (ran unrecorded), `fail_closed` |
//!
//! A bulkhead and a rate limit always fail closed, so their `degraded` decisions are calls
//! turned away (`Error::CoordinatorUnavailable`); a breaker's may have run (`fail_open`) or not
//! (`fail_closed`, which also covers a scope last seen open). Rejected + degraded/fail_closed
//! is everything a policy turned away. A call refused before any policy decided — no
//! coordinator installed, an invalid scope — is not a decision.
//!
//! # The breaker state
//!
//! The gauge follows what this process learns of the breaker, wherever the change was made:
//! a change by another process or by an operator reaches it through the coordinator's feed,
//! as the `circuit_breaker.state_changed` event does. A process reports the identities it has
//! used since it started; the gauge is set when it first learns a breaker's state and on every
//! change after that.
//!
//! # Cost
//!
//! With the feature on, each decision registers its handles with the recorder by key (what the
//! `metrics` macros do: the labels are copied), and an admission reads tokio's clock twice;
//! that is a few hundred nanoseconds with a Prometheus recorder, nothing next to a Redis round
//! trip, noticeable next to a local bulkhead's few nanoseconds.

/// The name of the decisions counter.
pub const DECISIONS_TOTAL: &str = "caracal_decisions_total";
/// The name of the circuit breaker state gauge.
pub const CIRCUIT_BREAKER_STATE: &str = "caracal_circuit_breaker_state";
/// The name of the bulkhead occupancy gauge.
pub const BULKHEAD_IN_FLIGHT: &str = "caracal_bulkhead_in_flight";
/// The name of the admission latency histogram.
pub const ADMISSION_SECONDS: &str = "caracal_admission_seconds";
/// The name of the coordinator connectivity gauge.
pub const COORDINATOR_UP: &str = "caracal_coordinator_up";

use crate::kernel::breaker::Phase;
use crate::labels::At;

/// Gives every caracal metric its description and unit in the installed recorder (exporters
/// show them, as Prometheus' `# HELP`). Done whenever a coordinator is made; call it yourself
/// if you install the recorder after that.
#[cfg(feature = "metrics")]
pub fn describe() {
    use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        DECISIONS_TOTAL,
        Unit::Count,
        "Admission decisions of caracal's bulkheads, circuit breakers and rate limits"
    );
    describe_gauge!(
        CIRCUIT_BREAKER_STATE,
        "Circuit breaker state as this process knows it: 0 closed, 1 open, 2 half_open, \
         3 forced_open, 4 forced_closed"
    );
    describe_gauge!(
        BULKHEAD_IN_FLIGHT,
        Unit::Count,
        "Bodies this process runs inside caracal bulkheads"
    );
    describe_histogram!(
        ADMISSION_SECONDS,
        Unit::Seconds,
        "Time from a call reaching a caracal policy to its admission, waits included"
    );
    describe_gauge!(
        COORDINATOR_UP,
        "1 while every connection to caracal's coordinator is up, else 0"
    );
}

/// What an admission policy decided about one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    Admitted,
    Rejected,
    Degraded,
}

impl Decision {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn as_str(self) -> &'static str {
        match self {
            Decision::Admitted => "admitted",
            Decision::Rejected => "rejected",
            Decision::Degraded => "degraded",
        }
    }
}

/// When a call reached a policy, for the admission histogram; nothing without the feature.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stopwatch {
    #[cfg(feature = "metrics")]
    started: tokio::time::Instant,
}

impl Stopwatch {
    #[inline]
    pub(crate) fn start() -> Self {
        Stopwatch {
            #[cfg(feature = "metrics")]
            started: tokio::time::Instant::now(),
        }
    }
}

/// Counts one decision.
#[inline]
pub(crate) fn decided(at: &At<'_>, decision: Decision, reason: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(
        DECISIONS_TOTAL,
        "policy" => at.policy,
        "name" => at.name.to_owned(),
        "operation" => at.operation.to_owned(),
        "decision" => decision.as_str(),
        "reason" => reason,
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (at, decision, reason);
}

/// Counts one admission of a call that reached the policy at `arrival`, and how long it took.
#[inline]
pub(crate) fn admitted(at: &At<'_>, reason: &'static str, arrival: Stopwatch) {
    decided(at, Decision::Admitted, reason);
    #[cfg(feature = "metrics")]
    ::metrics::histogram!(
        ADMISSION_SECONDS,
        "policy" => at.policy,
        "name" => at.name.to_owned(),
        "operation" => at.operation.to_owned(),
    )
    .record(arrival.started.elapsed().as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = arrival;
}

/// A body running inside a bulkhead: counted in `caracal_bulkhead_in_flight` from
/// [`in_flight`] until dropped — however the call ends (returned, cancelled, panicked).
#[must_use = "the body counts as running only while this is held"]
#[derive(Debug)]
pub(crate) struct InFlight {
    #[cfg(feature = "metrics")]
    gauge: ::metrics::Gauge,
}

/// Counts a body of `at`'s bulkhead as running until the guard drops.
#[inline]
pub(crate) fn in_flight(at: &At<'_>) -> InFlight {
    #[cfg(feature = "metrics")]
    {
        // The handle is kept, so the decrement reaches the series (and recorder) the increment
        // did, even if the recorder changed in between.
        let gauge = ::metrics::gauge!(
            BULKHEAD_IN_FLIGHT,
            "name" => at.name.to_owned(),
            "operation" => at.operation.to_owned(),
        );
        gauge.increment(1.0);
        InFlight { gauge }
    }
    #[cfg(not(feature = "metrics"))]
    {
        let _ = at;
        InFlight {}
    }
}

#[cfg(feature = "metrics")]
impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.decrement(1.0);
    }
}

/// Sets the state gauge of `at`'s breaker.
#[inline]
pub(crate) fn breaker_phase(at: &At<'_>, phase: Phase) {
    #[cfg(feature = "metrics")]
    ::metrics::gauge!(
        CIRCUIT_BREAKER_STATE,
        "name" => at.name.to_owned(),
        "operation" => at.operation.to_owned(),
        "scope" => at.scope.to_owned(),
    )
    .set(f64::from(phase.code()));
    #[cfg(not(feature = "metrics"))]
    let _ = (at, phase);
}

/// The connections known to be down, across the process's coordinators. A lost connection is
/// always followed by its restoration, unless its coordinator is shut down first: a new
/// coordinator's successful connect starts the count afresh.
///
/// The count and the gauge change together under this lock, so that a loss and a restoration
/// reported at once from two threads cannot leave the gauge saying the opposite of the count.
#[cfg(feature = "metrics")]
static DOWN: std::sync::Mutex<u32> = std::sync::Mutex::new(0);

#[cfg(feature = "metrics")]
fn connections_down(change: impl FnOnce(&mut u32)) {
    let mut down = crate::sync::lock(&DOWN);
    change(&mut down);
    ::metrics::gauge!(COORDINATOR_UP).set(if *down == 0 { 1.0 } else { 0.0 });
}

/// A coordinator is ready: connected (Redis) or made (in memory).
pub(crate) fn coordinator_ready() {
    #[cfg(feature = "metrics")]
    {
        describe();
        connections_down(|down| *down = 0);
    }
}

/// A connection to the coordinator was lost.
pub(crate) fn connection_lost() {
    #[cfg(feature = "metrics")]
    connections_down(|down| *down += 1);
}

/// A lost connection was restored.
pub(crate) fn connection_restored() {
    #[cfg(feature = "metrics")]
    connections_down(|down| *down = down.saturating_sub(1));
}
