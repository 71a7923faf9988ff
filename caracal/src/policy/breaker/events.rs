//! The circuit breaker's events and the metrics they count (see [`crate::events`] for what
//! every kind's share: the fields, summaries, shadow mode's `would_reject`; the metrics' names
//! are [`crate::metrics`]'s).

use std::time::Duration;

use super::kernel::{Counts, ObserveReply, Phase, SettleReply, Transition};
use crate::error::Error;
use crate::events::{self, policy_event};
use crate::labels::{At, Decision};
use crate::metrics::{self, Stopwatch};
use crate::operator::Operator;
use crate::summary;

/// Who made a breaker's change that a process learned of: `local` (this process), `remote`
/// (another) or `operator`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangeOrigin {
    Local,
    Remote,
    Operator,
}

impl ChangeOrigin {
    fn as_str(self) -> &'static str {
        match self {
            ChangeOrigin::Local => "local",
            ChangeOrigin::Remote => "remote",
            ChangeOrigin::Operator => "operator",
        }
    }
}

/// A breaker's change, made by `origin` (and `operator`, who gave the command, when known).
/// The state gauge is not set here but with [`phase`], as soon as the change is
/// learned: the event of an operator's change waits for the operator's record.
pub(crate) fn state_changed(
    at: &At<'_>,
    change: Transition,
    window: Option<Counts>,
    origin: ChangeOrigin,
    operator: Option<&Operator>,
) {
    let (window_total, window_failures, window_slow) = match window {
        Some(window) => (Some(window.total), Some(window.failures), Some(window.slow)),
        None => (None, None, None),
    };
    policy_event!(
        WARN,
        "circuit_breaker.state_changed",
        at,
        from = change.from.as_str(),
        to = change.to.as_str(),
        generation = change.generation,
        origin = origin.as_str(),
        window_total,
        window_failures,
        window_slow,
        who = operator.map(|operator| operator.who.as_str()),
        reason = operator.and_then(|operator| operator.reason.as_deref())
    );
}

/// This process learned a breaker's phase for the first time (its view of a distributed
/// breaker was made, or a local breaker was): not a change, so no event, but the state gauge
/// starts here.
/// Also what a change sets, before its event.
pub(crate) fn phase(at: &At<'_>, phase: Phase) {
    #[cfg(feature = "metrics")]
    ::metrics::gauge!(
        metrics::CIRCUIT_BREAKER_STATE,
        "name" => at.name.to_owned(),
        "operation" => at.operation.to_owned(),
        "scope" => at.scope.to_owned(),
    )
    .set(f64::from(phase.code()));
    #[cfg(not(feature = "metrics"))]
    let _ = (at, phase);
}

/// A breaker admitted an ordinary call, closed or forced closed (probes are
/// [`probe_started`]), that reached it at `arrival`.
pub(crate) fn admitted(at: &At<'_>, state: Phase, generation: u64, arrival: Stopwatch) {
    policy_event!(
        DEBUG,
        "circuit_breaker.admitted",
        at,
        state = state.as_str(),
        generation
    );
    metrics::admitted(at, state.as_str(), arrival);
}

/// A recorded batch of outcomes (one call, locally) and the window it left.
fn observation(at: &At<'_>, generation: u64, window: Counts) {
    policy_event!(
        DEBUG,
        "circuit_breaker.observation",
        at,
        generation,
        window_total = window.total,
        window_failures = window.failures,
        window_slow = window.slow
    );
    window_gauges(at, window);
}

/// A result admitted under an older generation was dropped.
fn observation_stale(at: &At<'_>, attempt_generation: u64, current_generation: u64) {
    policy_event!(
        DEBUG,
        "circuit_breaker.observation_stale",
        at,
        attempt_generation,
        current_generation
    );
}

pub(crate) fn rejected(
    at: &At<'_>,
    state: Phase,
    generation: Option<u64>,
    retry_after: Option<Duration>,
) {
    events::refused(at, Decision::Rejected, state.as_str());
    if at.shadow {
        return crate::events::would_reject!("circuit_breaker.would_reject", at, state.as_str());
    }
    let Some(suppressed) = summary::repeat("circuit_breaker.rejected", at, &[state.as_str()])
    else {
        return;
    };
    policy_event!(
        DEBUG,
        "circuit_breaker.rejected",
        at,
        state = state.as_str(),
        generation,
        retry_after_ms = retry_after.map(events::millis),
        suppressed
    );
}

/// A probe was admitted (a call that reached the half-open breaker at `arrival`).
pub(crate) fn probe_started(at: &At<'_>, generation: u64, arrival: Stopwatch) {
    policy_event!(INFO, "circuit_breaker.probe_started", at, generation);
    metrics::admitted(at, Phase::HalfOpen.as_str(), arrival);
}

/// The coordinator could not answer: `behaviour` is `"fail_open"` or `"fail_closed"`.
pub(crate) fn degraded(at: &At<'_>, behaviour: &'static str, last_known: Option<Phase>) {
    match behaviour {
        "fail_closed" => events::refused(at, Decision::Degraded, behaviour),
        _ => metrics::decided(at, Decision::Degraded, behaviour),
    }
    let condition = [behaviour, last_known.map_or("unknown", Phase::as_str)];
    let Some(said) = crate::policy::repeat_across("circuit_breaker.degraded", at, &condition)
    else {
        return;
    };
    policy_event!(
        WARN,
        "circuit_breaker.degraded",
        at,
        reason = "coordinator_unavailable",
        behaviour,
        last_known = last_known.map(Phase::as_str),
        suppressed = said.suppressed,
        identities = said.identities
    );
}

/// A breaker command failed: `command` is `"admit"`, `"observe"` or `"settle"` (not
/// `operation`, which every policy event carries as the identity's operation).
pub(crate) fn coordinator_error(at: &At<'_>, command: &'static str, error: &Error) {
    let failure = error.failure_kind().map(|k| k.as_str());
    let condition = [command, failure.unwrap_or(error.code())];
    let Some(said) =
        crate::policy::repeat_across("circuit_breaker.coordinator_error", at, &condition)
    else {
        return;
    };
    policy_event!(
        WARN,
        "circuit_breaker.coordinator_error",
        at,
        command,
        error = error.code(),
        failure,
        suppressed = said.suppressed,
        identities = said.identities
    );
}

/// The per-call events an observation's reply calls for (its state change, if any, is the
/// caller's to announce).
pub(crate) fn observed(at: &At<'_>, attempted: u64, reply: &ObserveReply) {
    match *reply {
        ObserveReply::Recorded { generation, window }
        | ObserveReply::Opened { generation, window } => {
            observation(at, generation, window);
        }
        ObserveReply::Stale { generation, .. } => observation_stale(at, attempted, generation),
    }
}

/// The per-call events a probe settlement's reply calls for.
pub(crate) fn settled(at: &At<'_>, attempted: u64, reply: &SettleReply) {
    if let SettleReply::Stale { generation, .. } = *reply {
        observation_stale(at, attempted, generation);
    }
}

/// Sets the forced-until gauge of `at`'s breaker: when its forced state lapses, or 0 for none
/// (forced until a reset, or no longer forced), as this process's clock reads it.
pub(crate) fn forced_until(at: &At<'_>, end: Option<tokio::time::Instant>) {
    #[cfg(feature = "metrics")]
    {
        use std::time::{SystemTime, UNIX_EPOCH};
        let seconds = end.map_or(0.0, |end| {
            let left = end.saturating_duration_since(tokio::time::Instant::now());
            (SystemTime::now() + left)
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |since| since.as_secs_f64())
        });
        ::metrics::gauge!(
            metrics::CIRCUIT_BREAKER_FORCED_UNTIL,
            "name" => at.name.to_owned(),
            "operation" => at.operation.to_owned(),
            "scope" => at.scope.to_owned(),
        )
        .set(seconds);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (at, end);
}

/// Sets the failure and slow call rates of `at`'s breaker from the window it reported.
#[inline]
fn window_gauges(at: &At<'_>, window: Counts) {
    #[cfg(feature = "metrics")]
    {
        // An empty window (just closed, just reset) has no failures: 0, not NaN.
        let total = f64::from(window.total.max(1));
        let labels = [
            ("name", at.name.to_owned()),
            ("operation", at.operation.to_owned()),
            ("scope", at.scope.to_owned()),
        ];
        ::metrics::gauge!(metrics::CIRCUIT_BREAKER_FAILURE_RATE, &labels)
            .set(f64::from(window.failures) / total);
        ::metrics::gauge!(metrics::CIRCUIT_BREAKER_SLOW_CALL_RATE, &labels)
            .set(f64::from(window.slow) / total);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (at, window);
}
