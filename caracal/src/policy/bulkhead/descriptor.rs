//! The bulkhead as `caracal status`, the metrics and the events name it.

use std::any::{Any, TypeId};

use crate::coordinator::registry::{MemoryRead, Registered, Snapshot, StatusRead, found};
use crate::error::Error;
use crate::identity::PolicyKind;
use crate::policy::bulkhead::kernel::LeaseSet;
use crate::policy::bulkhead::kernel::adaptive::Estimate;
use crate::policy::descriptor::{Decisions, Descriptor, Field, StatusValue, Unit};
use crate::script::Script;

/// The bulkhead kind.
pub(crate) const DESCRIPTOR: Descriptor = Descriptor {
    kind: PolicyKind::Bulkhead,
    fields: &[
        // The limit processes use: under drift the smallest of those in use, never whichever
        // process reported last (`20/10 in use` reads as an over-admission).
        Field::new("limit", Unit::Count),
        // Bodies running now, across the fleet.
        Field::new("occupancy", Unit::Count),
        // Under drift, each limit in use and how many processes use it; unset otherwise.
        Field::new("limits", Unit::Count),
        // An adaptive limit's: the fleet's mean latency it was last computed from, and the
        // recent minimum it was compared with (µs); unset for a number.
        Field::new("latency_us", Unit::Count),
        Field::new("base_latency_us", Unit::Count),
    ],
    table: [
        "{occupancy}[/{limit}] in use",
        "[limits in use: {limits}][adaptive: latency {latency_us}µs against {base_latency_us}µs]",
    ],
    read: Some(StatusRead {
        script: &STATUS,
        keys: &["leases", "adaptive"],
        figures: 4,
        memory: MemoryRead {
            states: &[TypeId::of::<LeaseSet>, TypeId::of::<Estimate>],
            figures: live_leases,
        },
    }),
    status,
    events: &[
        "bulkhead.admitted",
        "bulkhead.would_reject",
        "bulkhead.rejected",
        "bulkhead.released",
        "bulkhead.lease_lost",
        "bulkhead.lease_kept",
        "bulkhead.lease_reused",
        "bulkhead.lease_returned",
        "bulkhead.degraded",
        "bulkhead.limit_changed",
    ],
    decisions: Decisions {
        admitted: &["admitted"],
        rejected: &["capacity", "wait_timeout", "admission_expired"],
        degraded: &["fail_closed"],
    },
};

static STATUS: Script = Script::new("bulkhead_status", &[include_str!("kernel/status.lua")]);

/// What the status script counts, from a lease set and an estimate in memory: the leases live
/// at `now_ms`, and the estimate unless it expired.
fn live_leases(states: &[Option<&dyn Any>], now_ms: u64) -> Vec<i64> {
    let figure = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let live = found::<LeaseSet>(states, 0).map_or(0, |set| {
        let live = set
            .leases
            .iter()
            .filter(|&&(_, deadline)| deadline > now_ms);
        live.count() as u64
    });
    let estimate = found::<Estimate>(states, 1)
        .filter(|estimate| now_ms <= estimate.expires_ms)
        .map_or([0; 3], |e| [e.limit_pm, e.latency_us, e.base_us]);
    std::iter::once(live).chain(estimate).map(figure).collect()
}

fn status(reported: &Registered, snapshot: &Snapshot) -> Result<Vec<StatusValue>, Error> {
    let [occupancy, limit_pm, latency_us, base_us] = snapshot.figures()?;
    let natural = |what: &str, n: i64| {
        u64::try_from(n).map_err(|_| snapshot.malformed(format_args!("{what} {n}")))
    };
    let occupancy = natural("occupancy", occupancy)?;
    let (limit_pm, latency_us, base_us) = (
        natural("adaptive limit", limit_pm)?,
        natural("latency", latency_us)?,
        natural("base latency", base_us)?,
    );
    let limits = reported.in_use("limit");
    let is_adaptive = |limit: &str| limit.starts_with("adaptive");
    let adaptive = limits.iter().any(|(limit, _)| is_adaptive(limit))
        || reported.value("limit").is_some_and(is_adaptive);
    // The smallest limit in use: a number some process uses, or the fleet's adaptive limit.
    let numbers = limits
        .iter()
        .filter_map(|(limit, _)| limit.parse::<u64>().ok());
    let learnt = (adaptive && limit_pm > 0).then_some(limit_pm / 1000);
    let limit = numbers
        .chain(learnt)
        .min()
        .or_else(|| reported.parsed::<u64>("limit"));
    let drift = if limits.len() > 1 {
        StatusValue::Counts(limits)
    } else {
        StatusValue::Unset
    };
    let shown = |n: u64| StatusValue::count((adaptive && n > 0).then_some(n));
    Ok(vec![
        StatusValue::count(limit),
        StatusValue::Count(occupancy),
        drift,
        shown(latency_us),
        shown(base_us),
    ])
}
