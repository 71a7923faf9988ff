//! Every decision caracal takes is a `tracing` event with target `caracal` and a stable `event`
//! field. Policy events also carry `policy` (the kind), `name`, `operation`, `scope` and
//! `coordination` (`"local"` or `"distributed"`), plus the figures that explain them. They never
//! carry the function's arguments, results or error payloads.
//!
//! Levels: routine admissions and releases are `DEBUG`, rejections `INFO`, anything degraded
//! or lost `WARN`. With no subscriber interested, `tracing` skips building the event entirely.

use std::time::Duration;

use crate::Error;

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
    policy_event!(DEBUG, "bulkhead.released", at, occupancy, held_ms = millis(held));
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
    policy_event!(WARN, "bulkhead.degraded", at, reason, error = error.code(), failure);
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
