//! The circuit breaker as `caracal status`, the metrics and the events name it.

use std::any::{Any, TypeId};

use crate::coordinator::registry::{MemoryRead, Registered, Snapshot, StatusRead, found};
use crate::error::Error;
use crate::identity::PolicyKind;
use crate::policy::breaker::kernel::Phase;
use crate::policy::breaker::kernel::Stored;
use crate::policy::descriptor::{Decisions, Descriptor, Field, StatusValue, Unit};
use crate::script::Script;

/// The circuit breaker kind.
pub(crate) const DESCRIPTOR: Descriptor = Descriptor {
    kind: PolicyKind::CircuitBreaker,
    fields: &[
        // `closed`, `open`, `half_open`, `forced_open` or `forced_closed`.
        Field::new("state", Unit::State),
        // Every change of state starts a new generation.
        Field::new("generation", Unit::Count),
        // Observations in its window, and the failures among them.
        Field::new("window_total", Unit::Count),
        Field::new("window_failures", Unit::Count),
        // While open: how long until a probe may be admitted (unset when forced open
        // without an end).
        Field::new("retry_after_ms", Unit::Millis),
        // Slow calls in the window.
        Field::new("window_slow", Unit::Count),
        // Forced open or closed for a time: when that ends (the coordinator's clock, ms since
        // the epoch); unset otherwise.
        Field::new("forced_until_ms", Unit::Count),
    ],
    table: [
        "{state}",
        "generation {generation}, {window_failures} of {window_total} failed, {window_slow} slow[, probe in {retry_after_ms}]",
    ],
    read: Some(StatusRead {
        script: &STATUS,
        keys: &["brk:state"],
        figures: 8,
        memory: MemoryRead {
            states: &[TypeId::of::<Stored>],
            figures: live_state,
        },
    }),
    status,
    events: &[
        "circuit_breaker.state_changed",
        "circuit_breaker.admitted",
        "circuit_breaker.would_reject",
        "circuit_breaker.observation",
        "circuit_breaker.observation_stale",
        "circuit_breaker.rejected",
        "circuit_breaker.probe_started",
        "circuit_breaker.degraded",
        "circuit_breaker.coordinator_error",
    ],
    decisions: Decisions {
        admitted: &["closed", "half_open", "forced_closed"],
        rejected: &["open", "half_open", "forced_open"],
        degraded: &["fail_open", "fail_closed"],
    },
};

static STATUS: Script = Script::new("breaker_status", &[include_str!("kernel/status.lua")]);

/// What the status script reads, from a breaker's store in memory: its live state at
/// `now_ms`, or `-1` for every figure when it has none.
fn live_state(stored: &[Option<&dyn Any>], now_ms: u64) -> Vec<i64> {
    let state = found::<Stored>(stored, 0).and_then(|stored| stored.store.live_state(now_ms));
    let Some(state) = state else {
        return vec![-1; 8];
    };
    let figure = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    vec![
        i64::from(state.phase.code()),
        figure(state.generation),
        figure(state.opened_at),
        i64::from(state.counts.total),
        i64::from(state.counts.failures),
        i64::from(state.counts.slow),
        figure(state.closed_until),
        figure(state.forced_until),
    ]
}

/// Reads `kernel/status.lua`'s figures: an absent state (or a closed one past its time,
/// as the scripts treat it) is closed with an empty window.
fn status(reported: &Registered, snapshot: &Snapshot) -> Result<Vec<StatusValue>, Error> {
    let [
        phase,
        generation,
        opened_at,
        total,
        failures,
        slow,
        closed_until,
        forced_until,
    ] = snapshot.figures()?;
    let now_ms = snapshot.now_ms;
    let count = |n: i64| u32::try_from(n.max(0)).map_err(|_| snapshot.malformed(n));
    let time = |n: i64| u64::try_from(n.max(0)).unwrap_or(0);
    let absent = || {
        let zero = StatusValue::Count(0);
        vec![
            StatusValue::Text(Phase::Closed.as_str()),
            zero.clone(),
            zero.clone(),
            zero.clone(),
            StatusValue::Unset,
            zero,
            StatusValue::Unset,
        ]
    };
    if phase < 0 {
        return Ok(absent());
    }
    let phase =
        Phase::from_code(phase).ok_or_else(|| snapshot.malformed(format_args!("phase {phase}")))?;
    let generation = u64::try_from(generation)
        .map_err(|_| snapshot.malformed(format_args!("{generation} where a count belongs")))?;
    let (total, failures, slow) = (count(total)?, count(failures)?, count(slow)?);
    if phase == Phase::Closed && time(closed_until) <= now_ms {
        return Ok(absent());
    }
    let retry_after_ms = match phase {
        Phase::Open => reported
            .value("open")
            .and_then(|open| humantime::parse_duration(open).ok())
            .map(|open| {
                let open = u64::try_from(open.as_millis()).unwrap_or(u64::MAX);
                time(opened_at).saturating_add(open).saturating_sub(now_ms)
            }),
        Phase::ForcedOpen if forced_until > 0 => Some(time(forced_until).saturating_sub(now_ms)),
        _ => None,
    };
    let forced_until_ms = match phase {
        Phase::ForcedOpen | Phase::ForcedClosed if forced_until > 0 => Some(time(forced_until)),
        _ => None,
    };
    Ok(vec![
        StatusValue::Text(phase.as_str()),
        StatusValue::Count(generation),
        StatusValue::Count(total.into()),
        StatusValue::Count(failures.into()),
        StatusValue::count(retry_after_ms),
        StatusValue::Count(slow.into()),
        StatusValue::count(forced_until_ms),
    ])
}
