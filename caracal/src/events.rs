//! Every decision caracal takes is a `tracing` event with target `caracal` and a stable `event`
//! field. Policy events also carry `policy` (the kind), `name`, `operation`, `scope` and
//! `coordination` (`"local"` or `"distributed"`), plus the figures that explain them. They never
//! carry the function's arguments, results or error payloads. The events of `#[retry]`,
//! `#[timeout]` and `#[fallback]` carry the same identity (see [`Call`]) and the `function`.
//!
//! Levels: what happens on every call — admissions, releases, observations, timeouts, retries
//! scheduled, fallbacks — is `DEBUG`; state changes, probes and exhausted retries `INFO`;
//! anything degraded or lost `WARN`. Events that repeat on every call while a condition lasts
//! (rejections, degraded admissions, coordinator errors, exhausted retries) go through
//! [`summary::repeat`]: said once when the condition starts, then once per identity every 10 s
//! with `suppressed = N` (what the coordinator's loss causes: once per policy, across its
//! scopes, see [`summary::repeat_across`]) (an outage rejects every call: said each time, each replica would
//! print hundreds of lines a second). With no subscriber interested, `tracing` skips building
//! the event entirely.
//!
//! The functions here are also where the metrics are counted (see [`crate::metrics`]): one
//! place per decision.

use std::time::Duration;

use crate::error::Error;
use crate::labels::At;
use crate::labels::{Call, Decision};
use crate::metrics;
use crate::operator::Operator;
use crate::summary;

/// An event of a [`Call`]; such policies only ever run within this process.
macro_rules! call_event {
    ($level:ident, $event:literal, $call:expr $(, $($field:tt)+)?) => {{
        let call: &Call<'_> = $call;
        tracing::event!(
            target: "caracal",
            tracing::Level::$level,
            event = $event,
            policy = call.policy,
            name = call.name,
            operation = call.operation,
            scope = call.scope,
            coordination = "local",
            function = call.function,
            $($($field)+)?
        )
    }};
}

/// An event about one identity of a policy kind, `$at` its labels.
macro_rules! policy_event {
    ($level:ident, $event:literal, $at:expr $(, $($field:tt)+)?) => {{
        let at: &$crate::labels::At<'_> = $at;
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
pub(crate) use policy_event;

/// Whether anyone listens to caracal's debug events: figures only those events carry (how
/// long a slot was held) are not measured otherwise.
#[inline]
pub(crate) fn debug_enabled() -> bool {
    tracing::enabled!(target: "caracal", tracing::Level::DEBUG)
}

/// Whether anyone listens to caracal's warnings (a breaker's change among them): what only
/// their events need (an operator's record) is not read otherwise.
pub(crate) fn warn_enabled() -> bool {
    tracing::enabled!(target: "caracal", tracing::Level::WARN)
}

pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Counts a bulkhead's or rate limit's refusal: a coordinator that could not answer is the
/// degraded decision of a policy that fails closed; anything else, its rule's rejection.
pub(crate) fn rejected_or_degraded(at: &At<'_>, reason: &'static str) {
    match reason {
        "coordinator_unavailable" => refused(at, Decision::Degraded, "fail_closed"),
        _ => refused(at, Decision::Rejected, reason),
    }
}

/// Counts a refusal as `decision`, or, by a policy in shadow mode, as `would_reject` with the
/// same reason: the call it would have refused runs.
pub(crate) fn refused(at: &At<'_>, decision: Decision, reason: &'static str) {
    let decision = if at.shadow {
        Decision::WouldReject
    } else {
        decision
    };
    metrics::decided(at, decision, reason);
}

/// A policy in shadow mode let run a call it would have refused for `$reason` (counted by the
/// caller): `$event`, its kind's `<kind>.would_reject`, at DEBUG like the rejection it stands
/// for, and summarised like one, so a shadow policy that would refuse everything keeps the log
/// readable. A macro, so each kind names its own event with a literal (an event's name is part
/// of its kind's descriptor) and this file names no kind.
macro_rules! would_reject {
    ($event:literal, $at:expr, $reason:expr) => {{
        let at: &$crate::labels::At<'_> = $at;
        let reason: &'static str = $reason;
        if let Some(suppressed) = $crate::summary::repeat("would_reject", at, &[reason]) {
            $crate::events::policy_event!(
                DEBUG,
                $event,
                at,
                reason,
                priority = at.priority().map($crate::priority::Priority::as_str),
                suppressed
            );
        }
    }};
}
pub(crate) use would_reject;

pub(crate) fn timeout(call: &Call<'_>, after: Duration) {
    call_event!(DEBUG, "timeout.elapsed", call, after_ms = millis(after));
    metrics::timed_out(call.name);
}

pub(crate) fn retry_scheduled(call: &Call<'_>, next_attempt: u32, delay: Duration) {
    call_event!(
        DEBUG,
        "retry.scheduled",
        call,
        next_attempt,
        delay_ms = millis(delay)
    );
}

pub(crate) fn retry_exhausted(call: &Call<'_>, attempts: u32) {
    let at = At {
        policy: call.policy,
        name: call.name,
        operation: call.operation,
        scope: call.scope.unwrap_or_default(),
        coordination: "local",
        shadow: false,
    };
    let Some(suppressed) = summary::repeat("retry.exhausted", &at, &[]) else {
        return;
    };
    call_event!(INFO, "retry.exhausted", call, attempts, suppressed);
}

pub(crate) fn fallback_invoked(call: &Call<'_>, rejection: &'static str) {
    call_event!(DEBUG, "fallback.invoked", call, rejection);
    metrics::fell_back(call.name, rejection);
}

/// A coordinator is ready for calls: connected (Redis) or made (in memory).
pub(crate) fn coordinator_ready(namespace: &str) {
    tracing::event!(
        target: "caracal",
        tracing::Level::DEBUG,
        event = "coordinator.ready",
        namespace,
    );
    metrics::coordinator_ready();
}

/// What the coordinator's own repeating events are summarised under: they are about no
/// identity.
const COORDINATOR: At<'static> = At {
    policy: "coordinator",
    name: "",
    operation: "",
    scope: "",
    coordination: "distributed",
    shadow: false,
};

/// A connection of the coordinator whose pool `pool` names was lost. Every connection of the
/// pool notices an outage (and a flapping server makes them notice it again and again): said
/// once per pool, then summarised.
pub(crate) fn connection_lost(reason: &'static str, pool: &str) {
    metrics::connection_lost();
    let condition = [reason, pool];
    let Some(suppressed) = summary::repeat("coordinator.connection_lost", &COORDINATOR, &condition)
    else {
        return;
    };
    tracing::event!(
        target: "caracal",
        tracing::Level::WARN,
        event = "coordinator.connection_lost",
        reason,
        suppressed,
    );
}

/// A lost connection of the pool `pool` names was restored after `attempts`; summarised
/// like its loss.
pub(crate) fn connection_restored(attempts: u32, pool: &str) {
    metrics::connection_restored();
    let Some(suppressed) =
        summary::repeat("coordinator.connection_restored", &COORDINATOR, &[pool])
    else {
        return;
    };
    tracing::event!(
        target: "caracal",
        tracing::Level::INFO,
        event = "coordinator.connection_restored",
        attempts,
        suppressed,
    );
}

/// The server lost its data (restarted without persistence, a replica took its place, its
/// keys were flushed), as `cause` says how it was noticed: every lease held there is gone;
/// holders are cancelled.
pub(crate) fn coordinator_data_lost(epoch: u64, cause: &'static str) {
    tracing::event!(
        target: "caracal",
        tracing::Level::WARN,
        event = "coordinator.data_lost",
        epoch,
        cause,
    );
}

/// The server may evict caracal's keys under memory pressure (any `maxmemory-policy` but
/// `noeviction`): leases and open breakers could vanish without a trace.
pub(crate) fn eviction_risk(policy: &str) {
    tracing::event!(
        target: "caracal",
        tracing::Level::WARN,
        event = "coordinator.eviction_risk",
        maxmemory_policy = policy,
    );
}

/// Processes use one identity with different values (`drifted`), or no longer do.
pub(crate) fn config_drift(at: &At<'_>, values: &str, drifted: bool) {
    if drifted {
        policy_event!(WARN, "config.drift", at, drifted, values);
    } else {
        policy_event!(INFO, "config.drift", at, drifted, values);
    }
}

/// A stored fleet override this version cannot read, left out.
pub(crate) fn config_override_ignored(setting: &str, error: &Error) {
    tracing::warn!(
        target: "caracal",
        event = "config.override_ignored",
        setting,
        error = %error,
    );
}

/// This process does not apply the override `key = value` of the policy `name` of `kind`: its
/// site's other values cannot take it (`reason`). Said once per change of the overrides; the
/// identity's other overrides stay in force.
pub(crate) fn config_ignored(
    kind: crate::identity::PolicyKind,
    name: &str,
    key: &str,
    value: &str,
    reason: &str,
) {
    tracing::warn!(
        target: "caracal",
        event = "config.ignored",
        policy = kind.as_str(),
        name,
        key,
        value,
        reason,
    );
}

/// The fleet's overrides could not be read when the coordinator connected; it runs on the
/// other values until they are.
pub(crate) fn config_unread(error: &Error) {
    tracing::warn!(
        target: "caracal",
        event = "config.unread",
        error = %error,
    );
}

/// This process applied the fleet's overrides of `version` (`count` of them).
pub(crate) fn config_applied(version: u64, count: usize, operator: Option<&Operator>) {
    tracing::info!(
        target: "caracal",
        event = "config.applied",
        version,
        overrides = count,
        who = operator.map(|operator| operator.who.as_str()),
        reason = operator.and_then(|operator| operator.reason.as_deref()),
    );
}
