//! The bulkhead's events and the metrics they count (see [`crate::events`] for what every
//! kind's share: the fields, summaries, shadow mode's `would_reject`).

use std::time::Duration;

use super::kernel::adaptive::Learnt;
use crate::error::Error;
use crate::events::{self, millis, policy_event};
use crate::labels::At;
use crate::metrics::{self, InFlight, KeptLease, Stopwatch};
use crate::priority::Priority;
use crate::summary;

/// A bulkhead admitted a call that reached it at `arrival`: the body counts as running while
/// the returned guard is held.
#[inline]
pub(super) fn admitted(at: &At<'_>, occupancy: u32, limit: u32, arrival: Stopwatch) -> InFlight {
    policy_event!(
        DEBUG,
        "bulkhead.admitted",
        at,
        occupancy,
        limit,
        priority = at.priority().map(Priority::as_str)
    );
    metrics::admitted(at, "admitted", arrival);
    metrics::in_flight(at)
}

/// Why a bulkhead turned a call away.
#[derive(Debug, Clone, Copy)]
pub(super) enum Refusal {
    Capacity,
    WaitTimeout,
    CoordinatorUnavailable,
    AdmissionExpired,
}

pub(super) fn rejected(at: &At<'_>, reason: Refusal, occupancy: Option<u32>, limit: u32) {
    let reason = match reason {
        Refusal::Capacity => "capacity",
        Refusal::WaitTimeout => "wait_timeout",
        Refusal::CoordinatorUnavailable => "coordinator_unavailable",
        Refusal::AdmissionExpired => "admission_expired",
    };
    events::rejected_or_degraded(at, reason);
    if at.shadow {
        return crate::events::would_reject!("bulkhead.would_reject", at, reason);
    }
    let Some(suppressed) = summary::repeat("bulkhead.rejected", at, &[reason]) else {
        return;
    };
    policy_event!(
        DEBUG,
        "bulkhead.rejected",
        at,
        reason,
        occupancy,
        limit,
        priority = at.priority().map(Priority::as_str),
        suppressed
    );
}

pub(super) fn released(at: &At<'_>, occupancy: Option<u32>, held: Duration) {
    policy_event!(
        DEBUG,
        "bulkhead.released",
        at,
        occupancy,
        held_ms = millis(held)
    );
}

/// A distributed release found no live lease: it had expired (or was released) already.
/// After an outage every holder's release may find that: said once, then summarised.
pub(super) fn release_found_nothing(at: &At<'_>) {
    let reason = "already_expired_or_released";
    let Some(said) = crate::policy::repeat_across("bulkhead.released", at, &[reason]) else {
        return;
    };
    policy_event!(
        WARN,
        "bulkhead.released",
        at,
        reason,
        suppressed = said.suppressed,
        identities = said.identities
    );
}

/// A finished body's lease was kept for the next caller (`keep`).
pub(super) fn lease_kept(at: &At<'_>, occupancy: u32) {
    policy_event!(DEBUG, "bulkhead.lease_kept", at, occupancy);
    metrics::kept_lease(at, KeptLease::Kept);
}

/// A call started on a kept lease, with no round trip.
pub(super) fn lease_reused(at: &At<'_>) {
    policy_event!(DEBUG, "bulkhead.lease_reused", at);
    metrics::kept_lease(at, KeptLease::Reused);
}

/// A kept lease found no caller in time (or no longer good to hand on): released.
pub(super) fn lease_returned(at: &At<'_>) {
    policy_event!(DEBUG, "bulkhead.lease_returned", at);
    metrics::kept_lease(at, KeptLease::Returned);
}

pub(super) fn lease_lost(at: &At<'_>, cause: LeaseLoss) {
    policy_event!(WARN, "bulkhead.lease_lost", at, cause = cause.as_str());
}

/// An adaptive limit moved by more than a tenth since the last such event (`from`), as this
/// process learnt it; a limit that keeps moving is summarised.
pub(super) fn limit_changed(at: &At<'_>, from: u32, learnt: &Learnt) {
    let Some(suppressed) = summary::repeat("bulkhead.limit_changed", at, &[]) else {
        return;
    };
    policy_event!(
        INFO,
        "bulkhead.limit_changed",
        at,
        from,
        to = learnt.full,
        latency_us = learnt.latency_us,
        base_latency_us = learnt.base_us,
        suppressed
    );
}

/// Why a bulkhead decision was taken without full knowledge.
#[derive(Debug, Clone, Copy)]
pub(super) enum Degraded {
    /// An acquire failed: whether it took a lease is unknown.
    AdmissionUnknown,
    /// A renewal failed: the lease may already belong to nobody.
    LeaseUncertain,
    /// A release failed: the lease stays until it expires.
    ReleaseUnknown,
}

pub(super) fn degraded(at: &At<'_>, reason: Degraded, error: &Error) {
    let reason = match reason {
        Degraded::AdmissionUnknown => "admission_unknown",
        Degraded::LeaseUncertain => "lease_uncertain",
        Degraded::ReleaseUnknown => "release_unknown",
    };
    let failure = error.failure_kind().map(|k| k.as_str());
    let condition = [reason, failure.unwrap_or(error.code())];
    let Some(said) = crate::policy::repeat_across("bulkhead.degraded", at, &condition) else {
        return;
    };
    policy_event!(
        WARN,
        "bulkhead.degraded",
        at,
        reason,
        error = error.code(),
        failure,
        suppressed = said.suppressed,
        identities = said.identities
    );
}

/// Why a lease was lost while its body ran (the `cause` of a `bulkhead.lease_lost` event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseLoss {
    /// The server lost its data since the lease was taken: it may hold the lease no more.
    DataLost,
    /// Its trust deadline passed before a renewal was confirmed.
    TrustExpired,
    /// A renewal was answered: the coordinator no longer holds it.
    NotHeld,
    /// Renewals failed until the trust deadline.
    RenewalTimedOut,
}

impl LeaseLoss {
    /// The cause, as events tell it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LeaseLoss::DataLost => {
                "the server lost its data (restarted without persistence, failed over, or flushed)"
            }
            LeaseLoss::TrustExpired => "the lease's trust deadline passed before it was renewed",
            LeaseLoss::NotHeld => "the coordinator no longer holds the lease",
            LeaseLoss::RenewalTimedOut => "no renewal succeeded before the lease's trust deadline",
        }
    }
}
