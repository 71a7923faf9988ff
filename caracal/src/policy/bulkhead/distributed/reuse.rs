//! When a kept lease may be kept after its body, and handed to a new one
//! ([`keep`](super::super::keep)).

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::Lease;
use crate::policy::bulkhead::BulkheadValues;

/// How old the latest reply about a kept lease (the fleet's occupancy it showed) may be for the
/// lease to serve a new body. Without a bound a lease handed body to body would hold its slot on
/// the acquire's view of the fleet until it needed renewing (a third of the lease: 10 s at the
/// default); with it, a lease goes back to the fleet and is acquired afresh at least this often
/// while it is reused. Another process's refusal returns kept leases at once
/// ([`contention`](super::contention)), so this bound is for a refusal whose message was lost: it
/// bounds how long another process can be refused on a stale view to this plus a body plus
/// `keep`. It also sets what a busy fleet costs the server: one acquire and one release per lease
/// per 250 ms (at 100 ms, four workers × 64 leases on a loaded 2-core machine spent 1.0–1.3
/// Redis CPU-s per million calls in `fleet_bench`, 2.5 × what they do at 250 ms).
pub(super) const FRESH_OCCUPANCY: Duration = Duration::from_millis(250);

impl Lease {
    /// Whether a new body may start on the lease at `now`: trusted, and with no renewal due
    /// yet (trusted as long as a lease just granted), so that the body is as safe from a
    /// late renewal as one on a fresh lease.
    pub(super) fn reusable(&self, now: Instant) -> bool {
        self.check(now).is_ok() && now + self.fresh() <= self.trusted_until()
    }

    /// How much longer, from `now`, a kept lease could be handed on: while it is
    /// [`reusable`](Self::reusable) and its latest reply younger than [`FRESH_OCCUPANCY`].
    pub(super) fn reusable_for(&self, now: Instant) -> Duration {
        let trusted = (self.trusted_until().checked_sub(self.fresh())).unwrap_or(now);
        let read = self.last_answered() + FRESH_OCCUPANCY;
        trusted.min(read).saturating_duration_since(now)
    }

    /// Whether a kept lease may serve a new body under the `values` in force now: granted under
    /// the same limit and lease length, the fleet below that limit at the latest reply, that
    /// reply younger than [`FRESH_OCCUPANCY`], its token no lower than any a body of the
    /// identity read here, confirmed since the latest reconnection, and
    /// reusable.
    pub(super) fn reusable_under(&self, values: &BulkheadValues) -> bool {
        self.limit == values.limit
            && self.ttl == values.lease
            && self.occupancy.load(Ordering::Relaxed) < values.limit
            && Instant::now() < self.last_answered() + FRESH_OCCUPANCY
            && self
                .highest_read
                .as_ref()
                .is_none_or(|highest| self.fence >= highest.load(Ordering::Acquire))
            && self.confirmed_in.load(Ordering::Acquire)
                == self.coordinator.incarnation().reconnections()
            && self.reusable(Instant::now())
    }

    /// Whether the lease may be kept after its body, at `now` under `limit`: reusable, every
    /// renewal sent answered, its token unread, and the fleet below its limit at the latest reply (else another process
    /// may need the slot now).
    pub(super) fn keepable(&self, now: Instant, limit: u32) -> bool {
        let read = self
            .read
            .as_ref()
            .is_none_or(|read| read.load(Ordering::Relaxed));
        // A renewal still unanswered (the one sent at once after a reconnection, say) may yet
        // say the lease is gone; its answer dies with the body's renewal loop.
        let answered =
            self.last_confirmed.load(Ordering::Acquire) >= self.last_sent.load(Ordering::Acquire);
        !read && answered && self.occupancy.load(Ordering::Relaxed) < limit && self.reusable(now)
    }

    /// When the latest reply confirming the lease (and reading the fleet's occupancy) came.
    pub(super) fn last_answered(&self) -> Instant {
        let expired_by = Duration::from_nanos(self.expired_by.load(Ordering::Acquire));
        (self.since + expired_by)
            .checked_sub(self.ttl)
            .unwrap_or(self.since)
    }
}
