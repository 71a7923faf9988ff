//! The bulkhead as `caracal status`, the metrics and the events name it.

use crate::Error;
use crate::coordinator::registry::{Registered, Snapshot, StatusRead};
use crate::identity::PolicyKind;
use crate::policy::descriptor::{Decisions, Descriptor, Field, StatusValue, Unit};

/// The bulkhead kind.
pub(crate) const DESCRIPTOR: Descriptor = Descriptor {
    kind: PolicyKind::Bulkhead,
    fields: &[
        // The limit processes use (the last one reported).
        Field::new("limit", Unit::Count),
        // Bodies running now, across the fleet.
        Field::new("occupancy", Unit::Count),
    ],
    table: ["{occupancy}[/{limit}] in use", ""],
    read: Some(StatusRead {
        script: "bulkhead_status",
        keys: &["leases"],
        figures: 1,
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

fn status(reported: &Registered, snapshot: &Snapshot) -> Result<Vec<StatusValue>, Error> {
    let [occupancy] = snapshot.figures()?;
    let occupancy = u32::try_from(occupancy)
        .map_err(|_| snapshot.malformed(format_args!("occupancy {occupancy}")))?;
    Ok(vec![
        StatusValue::count(reported.parsed::<u32>("limit")),
        StatusValue::Count(occupancy.into()),
    ])
}
