//! Every decision caracal takes is a `tracing` event with target `caracal` and a stable `event`
//! field. Policy events also carry `policy` (the kind), `name`, `operation`, `scope` and
//! `coordination` (`"local"` or `"distributed"`), plus the figures that explain them. They never
//! carry the function's arguments, results or error payloads.
//!
//! Levels: routine admissions and releases are `DEBUG`, rejections `INFO`, anything degraded
//! or lost `WARN`. With no subscriber interested, `tracing` skips building the event entirely.

use std::time::Duration;

use crate::Error;
use crate::policy::breaker::kernel::{ObserveReply, Phase, SettleReply};

/// Which policy instance an event is about.
#[derive(Debug, Clone, Copy)]
pub(crate) struct At<'a> {
    pub(crate) policy: &'static str,
    pub(crate) name: &'static str,
    pub(crate) operation: &'static str,
    pub(crate) scope: &'a str,
    pub(crate) coordination: &'static str,
}

macro_rules! policy_event {
    ($level:ident, $event:literal, $at:expr $(, $($field:tt)+)?) => {{
        let at: &At<'_> = $at;
        tracing::event!(
            target: "caracal",
            tracing::Level::$level,
            event = $event,
            policy = at.policy,
            name = at.name,
            operation = at.operation,
            scope = at.scope,
            coordination = at.coordination,
            $($($field)+)?
        )
    }};
}

/// Whether anyone listens to caracal's debug events: figures only those events carry (how
/// long a slot was held) are not measured otherwise.
pub(crate) fn debug_enabled() -> bool {
    tracing::enabled!(target: "caracal", tracing::Level::DEBUG)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn bulkhead_admitted(at: &At<'_>, occupancy: u32, limit: u32) {
    policy_event!(DEBUG, "bulkhead.admitted", at, occupancy, limit);
}

/// Why a bulkhead turned a call away.
#[derive(Debug, Clone, Copy)]
pub(crate) enum BulkheadRejection {
    Capacity,
    WaitTimeout,
    CoordinatorUnavailable,
    AdmissionExpired,
}

pub(crate) fn bulkhead_rejected(
    at: &At<'_>,
    reason: BulkheadRejection,
    occupancy: Option<u32>,
    limit: u32,
) {
    let reason = match reason {
        BulkheadRejection::Capacity => "capacity",
        BulkheadRejection::WaitTimeout => "wait_timeout",
        BulkheadRejection::CoordinatorUnavailable => "coordinator_unavailable",
        BulkheadRejection::AdmissionExpired => "admission_expired",
    };
    policy_event!(INFO, "bulkhead.rejected", at, reason, occupancy, limit);
}

pub(crate) fn bulkhead_released(at: &At<'_>, occupancy: Option<u32>, held: Duration) {
    policy_event!(
        DEBUG,
        "bulkhead.released",
        at,
        occupancy,
        held_ms = millis(held)
    );
}

/// A distributed release found no live lease: it had expired (or was released) already.
pub(crate) fn bulkhead_release_found_nothing(at: &At<'_>) {
    policy_event!(
        WARN,
        "bulkhead.released",
        at,
        reason = "already_expired_or_released"
    );
}

pub(crate) fn bulkhead_lease_lost(at: &At<'_>, cause: &'static str) {
    policy_event!(WARN, "bulkhead.lease_lost", at, cause);
}

/// Why a bulkhead decision was taken without full knowledge.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Degraded {
    /// An acquire failed: whether it took a lease is unknown.
    AdmissionUnknown,
    /// A renewal failed: the lease may already belong to nobody.
    LeaseUncertain,
    /// A release failed: the lease stays until it expires.
    ReleaseUnknown,
}

pub(crate) fn bulkhead_degraded(at: &At<'_>, reason: Degraded, error: &Error) {
    let reason = match reason {
        Degraded::AdmissionUnknown => "admission_unknown",
        Degraded::LeaseUncertain => "lease_uncertain",
        Degraded::ReleaseUnknown => "release_unknown",
    };
    let failure = error.failure_kind().map(|k| k.as_str());
    policy_event!(
        WARN,
        "bulkhead.degraded",
        at,
        reason,
        error = error.code(),
        failure
    );
}

pub(crate) fn breaker_state_changed(
    at: &At<'_>,
    from: Phase,
    to: Phase,
    generation: u64,
    window: Option<(u32, u32)>,
) {
    let (window_total, window_failures) = window.unzip();
    policy_event!(
        WARN,
        "circuit_breaker.state_changed",
        at,
        from = from.as_str(),
        to = to.as_str(),
        generation,
        window_total,
        window_failures
    );
}

/// A recorded batch of outcomes (one call, locally) and the window it left.
pub(crate) fn breaker_observation(
    at: &At<'_>,
    generation: u64,
    window_total: u32,
    window_failures: u32,
) {
    policy_event!(
        DEBUG,
        "circuit_breaker.observation",
        at,
        generation,
        window_total,
        window_failures
    );
}

/// A result admitted under an older generation was dropped.
pub(crate) fn breaker_observation_stale(
    at: &At<'_>,
    attempt_generation: u64,
    current_generation: u64,
) {
    policy_event!(
        DEBUG,
        "circuit_breaker.observation_stale",
        at,
        attempt_generation,
        current_generation
    );
}

pub(crate) fn breaker_rejected(
    at: &At<'_>,
    state: Phase,
    generation: Option<u64>,
    retry_after: Option<Duration>,
) {
    policy_event!(
        INFO,
        "circuit_breaker.rejected",
        at,
        state = state.as_str(),
        generation,
        retry_after_ms = retry_after.map(millis)
    );
}

pub(crate) fn breaker_probe_started(at: &At<'_>, generation: u64) {
    policy_event!(INFO, "circuit_breaker.probe_started", at, generation);
}

/// The coordinator could not answer: `behaviour` is `"fail_open"` or `"fail_closed"`.
pub(crate) fn breaker_degraded(at: &At<'_>, behaviour: &'static str, last_known: Option<Phase>) {
    policy_event!(
        WARN,
        "circuit_breaker.degraded",
        at,
        reason = "coordinator_unavailable",
        behaviour,
        last_known = last_known.map(Phase::as_str)
    );
}

/// A breaker command failed: `operation` is `"admit"`, `"observe"` or `"settle"`.
pub(crate) fn breaker_coordinator_error(at: &At<'_>, operation: &'static str, error: &Error) {
    let failure = error.failure_kind().map(|k| k.as_str());
    policy_event!(
        WARN,
        "circuit_breaker.coordinator_error",
        at,
        operation,
        error = error.code(),
        failure
    );
}

/// The events an observation's reply calls for (shared by the local and distributed breakers).
pub(crate) fn breaker_observed(at: &At<'_>, attempted: u64, reply: &ObserveReply) {
    match *reply {
        ObserveReply::Recorded {
            generation,
            total,
            failures,
        } => {
            breaker_observation(at, generation, total, failures);
        }
        ObserveReply::Opened {
            generation,
            total,
            failures,
        } => {
            breaker_observation(at, generation, total, failures);
            breaker_state_changed(
                at,
                Phase::Closed,
                Phase::Open,
                generation,
                Some((total, failures)),
            );
        }
        ObserveReply::Stale { generation, .. } => {
            breaker_observation_stale(at, attempted, generation)
        }
    }
}

/// The events a probe settlement's reply calls for.
pub(crate) fn breaker_settled(at: &At<'_>, attempted: u64, reply: &SettleReply) {
    match *reply {
        SettleReply::Closed { generation } => {
            breaker_state_changed(at, Phase::HalfOpen, Phase::Closed, generation, None);
        }
        SettleReply::Reopened { generation } => {
            breaker_state_changed(at, Phase::HalfOpen, Phase::Open, generation, None);
        }
        SettleReply::Stale { generation, .. } => {
            breaker_observation_stale(at, attempted, generation)
        }
        SettleReply::Counted { .. } | SettleReply::Released { .. } => {}
    }
}

pub(crate) fn rate_limit_admitted(at: &At<'_>) {
    policy_event!(DEBUG, "rate_limit.admitted", at);
}

/// `retry_after` is `None` when the rejection is a coordinator failure (fail closed).
pub(crate) fn rate_limit_rejected(at: &At<'_>, retry_after: Option<Duration>) {
    let reason = if retry_after.is_some() {
        "rate_exceeded"
    } else {
        "coordinator_unavailable"
    };
    policy_event!(
        INFO,
        "rate_limit.rejected",
        at,
        reason,
        retry_after_ms = retry_after.map(millis),
        retry_after_us = retry_after.map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    );
}

pub(crate) fn rate_limit_degraded(at: &At<'_>, error: &Error) {
    let failure = error.failure_kind().map(|k| k.as_str());
    policy_event!(
        WARN,
        "rate_limit.degraded",
        at,
        reason = "admission_unknown",
        error = error.code(),
        failure
    );
}

pub(crate) fn timeout(function: &'static str, after: Duration) {
    tracing::event!(
        target: "caracal",
        tracing::Level::INFO,
        event = "timeout.elapsed",
        policy = "timeout",
        function,
        after_ms = millis(after),
    );
}

pub(crate) fn retry_scheduled(function: &'static str, next_attempt: u32, delay: Duration) {
    tracing::event!(
        target: "caracal",
        tracing::Level::DEBUG,
        event = "retry.scheduled",
        policy = "retry",
        function,
        next_attempt,
        delay_ms = millis(delay),
    );
}

pub(crate) fn retry_exhausted(function: &'static str, attempts: u32) {
    tracing::event!(
        target: "caracal",
        tracing::Level::INFO,
        event = "retry.exhausted",
        policy = "retry",
        function,
        attempts,
    );
}

pub(crate) fn connection_lost(reason: &'static str) {
    tracing::event!(
        target: "caracal",
        tracing::Level::WARN,
        event = "coordinator.connection_lost",
        reason,
    );
}

pub(crate) fn connection_restored(attempts: u32) {
    tracing::event!(
        target: "caracal",
        tracing::Level::INFO,
        event = "coordinator.connection_restored",
        attempts,
    );
}
