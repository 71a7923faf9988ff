#![doc = include_str!("metrics.md")]

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
/// The name of the gauge of the end of a breaker's forced state, in seconds since the Unix
/// epoch.
pub const CIRCUIT_BREAKER_FORCED_UNTIL: &str = "caracal_circuit_breaker_forced_until_seconds";
/// The name of the gauge of the bulkhead limit in force.
pub const BULKHEAD_LIMIT: &str = "caracal_bulkhead_limit";
/// The name of the gauge of a breaker's failure rate, as its window was last learnt.
pub const CIRCUIT_BREAKER_FAILURE_RATE: &str = "caracal_circuit_breaker_failure_rate";
/// The name of the gauge of a breaker's slow call rate, as its window was last learnt.
pub const CIRCUIT_BREAKER_SLOW_CALL_RATE: &str = "caracal_circuit_breaker_slow_call_rate";
/// The name of the gauge saying a retry budget decides on this process's local share.
pub const RETRY_BUDGET_LOCAL_SHARE: &str = "caracal_retry_budget_local_share";
/// The name of the retries counter.
pub const RETRIES_TOTAL: &str = "caracal_retries_total";
/// The name of the hedges counter.
pub const HEDGES_TOTAL: &str = "caracal_hedges_total";
/// The name of the counter of emissions distributed rate limits with `prefetch` took ahead,
/// and what became of them: used, returned, expired.
pub const RATE_LIMIT_PREFETCHED_TOTAL: &str = "caracal_rate_limit_prefetched_total";
/// The name of the timeouts counter.
pub const TIMEOUTS_TOTAL: &str = "caracal_timeouts_total";
/// The name of the fallbacks counter.
pub const FALLBACKS_TOTAL: &str = "caracal_fallbacks_total";
/// The name of the coordinator round-trip histogram.
pub const COORDINATOR_SECONDS: &str = "caracal_coordinator_seconds";
/// The name of the counter of what distributed bulkheads with `keep` did with their leases:
/// kept, reused, returned.
pub const BULKHEAD_KEPT_LEASES_TOTAL: &str = "caracal_bulkhead_kept_leases_total";

#[cfg(feature = "metrics")]
use std::sync::atomic::{AtomicU32, Ordering};

use crate::labels::{At, Decision};

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
        CIRCUIT_BREAKER_FORCED_UNTIL,
        Unit::Seconds,
        "When the forced state of a caracal circuit breaker lapses, in seconds since the Unix \
         epoch; 0 when it has no end (forced until a reset) or is no longer forced"
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
    describe_counter!(
        RETRIES_TOTAL,
        Unit::Count,
        "What caracal's retry loops did after a failed attempt: retried, exhausted (no attempt \
         left) or budget_exhausted (a budget refused the retry)"
    );
    describe_gauge!(
        COORDINATOR_UP,
        "1 while every connection to caracal's coordinator is up, else 0"
    );
    describe_gauge!(
        BULKHEAD_LIMIT,
        Unit::Count,
        "The limit in force in this process's caracal bulkheads, overrides included"
    );
    describe_gauge!(
        CIRCUIT_BREAKER_FAILURE_RATE,
        "Share of failed calls (0..1) in a caracal circuit breaker's window, as last learnt"
    );
    describe_gauge!(
        CIRCUIT_BREAKER_SLOW_CALL_RATE,
        "Share of slow calls (0..1) in a caracal circuit breaker's window, as last learnt"
    );
    describe_counter!(
        RETRIES_TOTAL,
        Unit::Count,
        "Failed attempts of caracal #[retry] calls: retried, or not (exhausted, budget_exhausted)"
    );
    describe_counter!(
        RATE_LIMIT_PREFETCHED_TOTAL,
        Unit::Count,
        "Emissions caracal rate limits with `prefetch` took ahead, and what became of them: \
         used by a call with no round trip, returned to the fleet, or expired unused"
    );
    describe_gauge!(
        RETRY_BUDGET_LOCAL_SHARE,
        "1 while a caracal retry budget cannot learn the fleet's totals and spends only this \
         process's local share, else 0"
    );
    describe_counter!(
        TIMEOUTS_TOTAL,
        Unit::Count,
        "Calls caracal's #[timeout] cut short"
    );
    describe_counter!(
        FALLBACKS_TOTAL,
        Unit::Count,
        "Calls whose result caracal's #[fallback] replaced, by the error it replaced"
    );
    describe_histogram!(
        COORDINATOR_SECONDS,
        Unit::Seconds,
        "One round trip to caracal's Redis coordinator, by script"
    );
    describe_counter!(
        BULKHEAD_KEPT_LEASES_TOTAL,
        Unit::Count,
        "Leases of caracal bulkheads with `keep`: kept after a body, reused by the next call \
         with no round trip, or returned to the fleet unused"
    );
}

/// What a retry loop did after a failed attempt it would retry: the `outcome` label of
/// [`RETRIES_TOTAL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retried {
    /// Another attempt follows.
    Again,
    /// The last attempt failed.
    Exhausted,
    /// A layer outside the loop (a budget) refused another attempt.
    Refused,
}

impl Retried {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn as_str(self) -> &'static str {
        match self {
            Retried::Again => "retried",
            Retried::Exhausted => "exhausted",
            Retried::Refused => "budget_exhausted",
        }
    }
}

/// Counts what the retry loop of `name` did after a failed attempt.
#[inline]
pub(crate) fn retried(name: &'static str, outcome: Retried) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(RETRIES_TOTAL, "name" => name, "outcome" => outcome.as_str()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, outcome);
}

/// What became of emissions a rate limit with `prefetch` took ahead: the `outcome` label of
/// [`RATE_LIMIT_PREFETCHED_TOTAL`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Prefetched {
    /// Taken beyond the call's own, for the process to hand out.
    Taken,
    /// Handed to a call, which was admitted with no round trip.
    Used,
    /// Given back to the fleet unused.
    Returned,
    /// Their slots started unused (or the take was dropped: settings changed, shutdown).
    Expired,
}

impl Prefetched {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn as_str(self) -> &'static str {
        match self {
            Prefetched::Taken => "taken",
            Prefetched::Used => "used",
            Prefetched::Returned => "returned",
            Prefetched::Expired => "expired",
        }
    }
}

/// Counts `count` emissions of the rate limit at `at` that came to `outcome`.
#[inline]
pub(crate) fn prefetched(at: &At<'_>, outcome: Prefetched, count: u32) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(
        RATE_LIMIT_PREFETCHED_TOTAL,
        "name" => at.name.to_owned(),
        "operation" => at.operation.to_owned(),
        "outcome" => outcome.as_str(),
    )
    .increment(u64::from(count));
    #[cfg(not(feature = "metrics"))]
    let _ = (at, outcome, count);
}

/// What a hedge did with an extra attempt.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Hedged {
    /// Sent beside the attempts in flight.
    Sent,
    /// It answered `Ok` first: the call's result.
    Won,
    /// Not sent: the budget refused it.
    Refused,
}

impl Hedged {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn as_str(self) -> &'static str {
        match self {
            Hedged::Sent => "sent",
            Hedged::Won => "won",
            Hedged::Refused => "refused_by_budget",
        }
    }
}

/// Counts what the hedge of `name` did with an extra attempt.
#[inline]
pub(crate) fn hedged(name: &'static str, outcome: Hedged) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(HEDGES_TOTAL, "name" => name, "outcome" => outcome.as_str()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, outcome);
}

/// What a bulkhead with `keep` did with a lease: the `outcome` label of
/// [`BULKHEAD_KEPT_LEASES_TOTAL`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeptLease {
    /// A finished body's lease was kept for the next call.
    Kept,
    /// A call started on a kept lease, with no round trip.
    Reused,
    /// A kept lease went back to the fleet unused (its time ran out, it was no longer good to
    /// hand on, or the coordinator shut down).
    Returned,
}

impl KeptLease {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn as_str(self) -> &'static str {
        match self {
            KeptLease::Kept => "kept",
            KeptLease::Reused => "reused",
            KeptLease::Returned => "returned",
        }
    }
}

/// Counts what the bulkhead at `at` did with a kept lease.
#[inline]
pub(crate) fn kept_lease(at: &At<'_>, outcome: KeptLease) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(
        BULKHEAD_KEPT_LEASES_TOTAL,
        "name" => at.name.to_owned(),
        "operation" => at.operation.to_owned(),
        "outcome" => outcome.as_str(),
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (at, outcome);
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
    crate::tally::count(at, decision, reason);
    #[cfg(feature = "metrics")]
    {
        use ::metrics::Label;
        let priority = at.priority();
        let mut labels = vec![
            Label::new("policy", at.policy),
            Label::new("name", at.name.to_owned()),
            Label::new("operation", at.operation.to_owned()),
            Label::new("decision", decision.as_str()),
            Label::new("reason", reason),
        ];
        // Only the kinds that decide by class have the label: a breaker's decisions do not
        // depend on it, and a label that always says `normal` would only multiply series.
        labels.extend(priority.map(|priority| Label::new("priority", priority.as_str())));
        ::metrics::counter!(DECISIONS_TOTAL, labels).increment(1);
    }
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

/// The `scope` label of a bulkhead's occupancy: the bodies of a call site's first
/// [`LABELLED_SCOPES`] scopes count under their own scope; once the site uses more in this
/// process, every body of it counts under this one (`scope="other"`).
pub const OTHER_SCOPES: &str = "other";

/// How many scopes of one bulkhead call site get an occupancy series each, per process.
pub const LABELLED_SCOPES: usize = 16;

/// Per call site (name, operation), the scopes labelled so far; `None` once past
/// [`LABELLED_SCOPES`]. Keyed by names, never addresses: a site's names outlive it.
#[cfg(feature = "metrics")]
type LabelledScopes =
    std::collections::BTreeMap<(String, String), Option<std::collections::BTreeSet<String>>>;

#[cfg(feature = "metrics")]
static SCOPES: std::sync::Mutex<LabelledScopes> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// The `scope` label `at`'s body counts under: its scope while its site's scopes are few (a
/// region, a partner), [`OTHER_SCOPES`] once they are many (a user, a tenant) — for every
/// scope of the site from then on, so that no process reports part of a scope apart.
#[cfg(feature = "metrics")]
fn scope_label(at: &At<'_>) -> String {
    let mut sites = crate::sync::lock(&SCOPES);
    let site = sites
        .entry((at.name.to_owned(), at.operation.to_owned()))
        .or_insert_with(|| Some(std::collections::BTreeSet::new()));
    if let Some(scopes) = site {
        if scopes.contains(at.scope) {
            return at.scope.to_owned();
        }
        if scopes.len() < LABELLED_SCOPES {
            scopes.insert(at.scope.to_owned());
            return at.scope.to_owned();
        }
    }
    *site = None;
    OTHER_SCOPES.to_owned()
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
            "scope" => scope_label(at),
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

/// The limit a bulkhead call site last set its `caracal_bulkhead_limit` to: the gauge is set
/// only when the limit in force changes, so a call pays one atomic load for it.
#[derive(Debug)]
pub(crate) struct LimitGauge {
    /// 0 until first set: a bulkhead's limit is at least 1.
    #[cfg(feature = "metrics")]
    reported: AtomicU32,
}

impl LimitGauge {
    /// Nothing reported yet.
    pub(crate) const fn new() -> Self {
        LimitGauge {
            #[cfg(feature = "metrics")]
            reported: AtomicU32::new(0),
        }
    }

    /// `limit` is in force for the bulkhead `name`'s `operation`.
    #[inline]
    pub(crate) fn report(&self, name: &'static str, operation: &'static str, limit: u32) {
        #[cfg(feature = "metrics")]
        if self.reported.load(Ordering::Relaxed) != limit
            && self.reported.swap(limit, Ordering::Relaxed) != limit
        {
            ::metrics::gauge!(BULKHEAD_LIMIT, "name" => name, "operation" => operation)
                .set(f64::from(limit));
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (name, operation, limit);
    }
}

/// Sets whether `at`'s retry budget decides on this process's local share (its last batch
/// failed), on each batch's answer.
#[inline]
pub(crate) fn retry_budget_local_share(at: &At<'_>, local: bool) {
    #[cfg(feature = "metrics")]
    ::metrics::gauge!(
        RETRY_BUDGET_LOCAL_SHARE,
        "name" => at.name.to_owned(),
        "operation" => at.operation.to_owned(),
        "scope" => at.scope.to_owned()
    )
    .set(if local { 1.0 } else { 0.0 });
    #[cfg(not(feature = "metrics"))]
    let _ = (at, local);
}

/// A `#[timeout]` cut a call of `name` short.
#[inline]
pub(crate) fn timed_out(name: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(TIMEOUTS_TOTAL, "name" => name).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = name;
}

/// A `#[fallback]` replaced the result of a call of `name` that failed with `reason` (the
/// error's code).
#[inline]
pub(crate) fn fell_back(name: &'static str, reason: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(FALLBACKS_TOTAL, "name" => name, "reason" => reason).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, reason);
}

/// One round trip to the coordinator running `command` (a script's name): timed into
/// `caracal_coordinator_seconds` until dropped, answered or not (a round trip given up counts
/// with the time it took to give up).
#[must_use = "the round trip is timed until this drops"]
#[derive(Debug)]
pub(crate) struct RoundTrip {
    #[cfg(feature = "metrics")]
    command: &'static str,
    #[cfg(feature = "metrics")]
    started: tokio::time::Instant,
}

/// Starts timing a round trip running `command`.
#[inline]
pub(crate) fn round_trip(command: &'static str) -> RoundTrip {
    #[cfg(not(feature = "metrics"))]
    let _ = command;
    RoundTrip {
        #[cfg(feature = "metrics")]
        command,
        #[cfg(feature = "metrics")]
        started: tokio::time::Instant::now(),
    }
}

#[cfg(feature = "metrics")]
impl Drop for RoundTrip {
    fn drop(&mut self) {
        ::metrics::histogram!(COORDINATOR_SECONDS, "command" => self.command)
            .record(self.started.elapsed().as_secs_f64());
    }
}
