//! A refusal returns the fleet's kept leases: a process refused a lease of an identity tells
//! the other processes (and its other coordinators) on the feed, and each returns its kept
//! leases of the identity at once and keeps none for a while ([`keep`](super::super::keep)).
//! Without it a bursting process's kept leases, handed from burst to burst, would hold slots a
//! steady process is refused, for as long as each lease's reply stays fresh.

use super::Lease;
use crate::coordinator::Coordinator;
use crate::coordinator::feed::Heard;
use crate::identity::{Identity, PolicyKind};
use crate::policy::bulkhead::keep::Pool;

/// The payload of a refusal's message on the feed.
const REFUSED: &str = "lease-refused";

/// Has this process's pool hear the refusals other processes announce, from now on. Called on
/// each acquire of a bulkhead that keeps leases (the feed is then restarted if its subscription
/// ended): a process keeps only leases it acquired.
pub(super) fn listen(coordinator: &Coordinator) {
    coordinator.listen(PolicyKind::Bulkhead, on_feed);
}

/// Notes that a call of `identity` was refused a lease: this process's kept leases of it go
/// back, and the other processes are told so theirs do too. Called on every refusal of a
/// distributed bulkhead that enforces, whether its own call site keeps leases or not: `keep`
/// is no part of the identity, and a process keeping leases of it must hear of a refusal
/// wherever it happens. A message that does not go out (Redis down, the link broken) leaves
/// the next refusal to tell the fleet ([`Pool::untold`]).
pub(super) fn refused(coordinator: &Coordinator, identity: &Identity) {
    let pool = Pool::<Lease>::of(coordinator);
    if let Some(told) = pool.refused_here(&identity.key) {
        let key = identity.key.clone();
        coordinator.publish(&identity.key, REFUSED, move |sent| {
            if !sent {
                pool.untold(&key, told);
            }
        });
    }
}

/// Reads a refusal announced on the feed (see [`refused`]). Its own process's too: the
/// message names the process, not the coordinator, and another coordinator here may keep
/// leases of the identity; on the one that was refused it only moves the end of its
/// contention by the message's latency. Nothing an operator sees changes: `false`, so it does
/// not wake [`Admin::changed`](crate::Admin::changed) (up to 20 messages a second per
/// identity under contention).
pub(in crate::policy::bulkhead) fn on_feed(coordinator: &Coordinator, heard: &Heard<'_>) -> bool {
    if heard.payload == REFUSED {
        Pool::<Lease>::of(coordinator).refused_elsewhere(&heard.key);
    }
    false
}
