//! The bulkhead as `caracal status`, the metrics and the events name it.

use std::any::{Any, TypeId};

use crate::Error;
use crate::coordinator::registry::{MemoryRead, Registered, Snapshot, StatusRead};
use crate::identity::PolicyKind;
use crate::policy::bulkhead::kernel::LeaseSet;
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
    ],
    table: ["{occupancy}[/{limit}] in use", "[limits in use: {limits}]"],
    read: Some(StatusRead {
        script: &STATUS,
        keys: &["leases"],
        figures: 1,
        memory: MemoryRead {
            state: TypeId::of::<LeaseSet>,
            figures: live_leases,
        },
    }),
    status,
    events: &[
        "bulkhead.admitted",
        "bulkhead.rejected",
        "bulkhead.released",
        "bulkhead.lease_lost",
        "bulkhead.degraded",
    ],
    decisions: Decisions {
        admitted: &["admitted"],
        rejected: &["capacity", "wait_timeout", "admission_expired"],
        degraded: &["fail_closed"],
    },
};

static STATUS: Script = Script::new("bulkhead_status", &[include_str!("kernel/status.lua")]);

/// What the status script counts, from a lease set in memory: the leases live at `now_ms`.
fn live_leases(set: Option<&dyn Any>, now_ms: u64) -> Vec<i64> {
    let live = set
        .and_then(|set| set.downcast_ref::<LeaseSet>())
        .map_or(0, |set| {
            let live = set
                .leases
                .iter()
                .filter(|&&(_, deadline)| deadline > now_ms);
            i64::try_from(live.count()).unwrap_or(i64::MAX)
        });
    vec![live]
}

fn status(reported: &Registered, snapshot: &Snapshot) -> Result<Vec<StatusValue>, Error> {
    let [occupancy] = snapshot.figures()?;
    let occupancy = u32::try_from(occupancy)
        .map_err(|_| snapshot.malformed(format_args!("occupancy {occupancy}")))?;
    let limits = reported.in_use("limit");
    let smallest = limits
        .first()
        .and_then(|(limit, _)| limit.parse::<u32>().ok());
    let limit = smallest.or_else(|| reported.parsed::<u32>("limit"));
    let drift = if limits.len() > 1 {
        StatusValue::Counts(limits)
    } else {
        StatusValue::Unset
    };
    Ok(vec![
        StatusValue::count(limit),
        StatusValue::Count(occupancy.into()),
        drift,
    ])
}
