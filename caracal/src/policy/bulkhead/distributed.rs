//! The distributed bulkhead: one lease per running body in the identity's lease set.
//!
//! - **Acquire** is one awaited round trip. Any coordinator failure rejects the call (fail
//!   closed); since the acquire may still have taken a lease, its release is sent anyway.
//! - **Admission expiry**: the lease deadline is measured from when the acquire was *sent*; if
//!   it has already passed when the reply arrives, the body never starts.
//! - **Renewal** every `lease / 3` while the body runs, each pushing the deadline to
//!   `send time + lease`. A renewal that fails is retried until the deadline (a renewal only
//!   moves a deadline, so sending it twice is harmless); one that is denied, or a deadline
//!   that passes, loses the lease: the body is dropped and the call returns
//!   [`Error::LeaseLost`].
//! - **Release** is a guard: however the call ends (returned, failed, panicked, dropped), its
//!   `Drop` queues the release on the connection and lets it finish in the background. The
//!   caller never waits for it, and the task's next command cannot overtake it.
//! - **`max_wait`**: a denied acquire is retried with the same token, after a pause that
//!   starts at 2 ms and doubles up to 50 ms (capped by the time left), or at once when a lease
//!   of the same identity is released in this process. Waiting costs one acquire round trip
//!   per retry and holds nothing; waiters are not queued fairly across processes.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

use super::BulkheadSite;
use crate::Error;
use crate::coordinator::{self, Coordinator, LeaseAction, LeaseCommand};
use crate::ctx::{CallCtx, Rejection};
use crate::events::{self, BulkheadRejection, Degraded};
use crate::identity::{KeyBase, Kind, Scope};

const FIRST_WAIT_PAUSE: Duration = Duration::from_millis(2);
const MAX_WAIT_PAUSE: Duration = Duration::from_millis(50);

pub(super) async fn run<T, E, F>(
    site: &'static BulkheadSite,
    ctx: &CallCtx,
    scope: &Scope,
    body: F,
) -> Result<T, E>
where
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    let config = &site.config;
    let coordinator = match coordinator::current() {
        Ok(coordinator) => coordinator,
        Err(error) => return Err(ctx.reject(error)),
    };
    let key = KeyBase::derive(
        coordinator.namespace(),
        Kind::Bulkhead,
        config.name,
        config.operation,
        scope,
    );
    let token = Uuid::new_v4();
    let (sent, occupancy) = match admit(site, &coordinator, &key, token, scope).await {
        Ok(admitted) => admitted,
        Err(error) => return Err(ctx.reject(error)),
    };
    let lease = Lease {
        coordinator,
        key,
        token,
        site,
        scope: scope.clone(),
        since: Instant::now(),
    };
    let deadline = sent + config.lease;
    if Instant::now() >= deadline {
        events::bulkhead_rejected(
            &site.at(scope),
            BulkheadRejection::AdmissionExpired,
            Some(occupancy),
            config.limit,
        );
        // The body never started: for an outer breaker this is a refusal, not a failure.
        return Err(ctx.reject_as(lost(site, scope), Rejection::Admission));
    }
    events::bulkhead_admitted(&site.at(scope), occupancy, config.limit);

    let body = pin!(body);
    let keep = pin!(lease.keep(deadline));
    tokio::select! {
        biased;
        result = body => result,
        cause = keep => {
            events::bulkhead_lease_lost(&site.at(scope), cause);
            Err(ctx.reject(lost(site, scope)))
        }
    }
}

fn lost(site: &BulkheadSite, scope: &Scope) -> Error {
    Error::LeaseLost {
        policy: site.config.name,
        scope: scope.to_string(),
    }
}

/// Takes a lease, waiting up to `max_wait` for one. Returns when the successful acquire was
/// sent, and the occupancy it reported.
async fn admit(
    site: &'static BulkheadSite,
    coordinator: &Coordinator,
    key: &KeyBase,
    token: Uuid,
    scope: &Scope,
) -> Result<(Instant, u32), Error> {
    let config = &site.config;
    let give_up = config.max_wait.map(|wait| Instant::now() + wait);
    let mut pause = FIRST_WAIT_PAUSE;
    loop {
        // Registered before the attempt, so a release that lands during it is not missed.
        let released = give_up.map(|_| coordinator.released(key));
        let sent = Instant::now();
        let command = LeaseCommand {
            key,
            action: LeaseAction::Acquire,
            token,
            ttl: config.lease,
            limit: config.limit,
        };
        // Until the reply is read, the acquire may have taken a lease nobody knows of: if this
        // call is dropped meanwhile, or the outcome stays unknown, it is released right away
        // rather than held until it expires.
        let mut unclaimed = UnclaimedLease {
            coordinator,
            key,
            token,
            armed: true,
        };
        let reply = coordinator.lease(command).await;
        unclaimed.armed = reply.is_err();
        match reply {
            Ok(reply) if reply.allowed => return Ok((sent, reply.occupancy)),
            Ok(reply) => {
                let now = Instant::now();
                match give_up.zip(released) {
                    Some((give_up, released)) if now < give_up => {
                        let _ = tokio::time::timeout(pause.min(give_up - now), released).await;
                        pause = (pause * 2).min(MAX_WAIT_PAUSE);
                    }
                    _ => {
                        let reason = if give_up.is_some() {
                            BulkheadRejection::WaitTimeout
                        } else {
                            BulkheadRejection::Capacity
                        };
                        events::bulkhead_rejected(
                            &site.at(scope),
                            reason,
                            Some(reply.occupancy),
                            config.limit,
                        );
                        return Err(site.full(scope));
                    }
                }
            }
            Err(error) => {
                let at = site.at(scope);
                events::bulkhead_degraded(&at, Degraded::AdmissionUnknown, &error);
                events::bulkhead_rejected(
                    &at,
                    BulkheadRejection::CoordinatorUnavailable,
                    None,
                    config.limit,
                );
                return Err(error);
            }
        }
    }
}

/// An acquire whose outcome the caller has not seen; see [`admit`].
struct UnclaimedLease<'a> {
    coordinator: &'a Coordinator,
    key: &'a KeyBase,
    token: Uuid,
    armed: bool,
}

impl Drop for UnclaimedLease<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.coordinator.release(self.key, self.token, |_| ());
        }
    }
}

/// A held lease. Dropping it releases the lease in the background.
struct Lease {
    coordinator: Coordinator,
    key: KeyBase,
    token: Uuid,
    site: &'static BulkheadSite,
    scope: Scope,
    since: Instant,
}

impl Lease {
    /// Keeps the lease alive while the body runs; completes only when it is lost, with the
    /// cause.
    async fn keep(&self, mut deadline: Instant) -> &'static str {
        let config = &self.site.config;
        let period = config.lease / 3;
        let mut next = Instant::now() + period;
        loop {
            tokio::time::sleep_until(next.min(deadline)).await;
            let sent = Instant::now();
            if sent >= deadline {
                return "no renewal succeeded before the lease deadline";
            }
            let command = LeaseCommand {
                key: &self.key,
                action: LeaseAction::Renew,
                token: self.token,
                ttl: config.lease,
                limit: config.limit,
            };
            match tokio::time::timeout_at(deadline, self.coordinator.lease(command)).await {
                Ok(Ok(reply)) if reply.allowed => {
                    deadline = sent + config.lease;
                    next = Instant::now() + period;
                }
                Ok(Ok(_)) => return "the coordinator no longer holds the lease",
                Ok(Err(error)) => {
                    events::bulkhead_degraded(
                        &self.site.at(&self.scope),
                        Degraded::LeaseUncertain,
                        &error,
                    );
                    // Try again soon, while the lease still has time left.
                    next = Instant::now() + (period / 4).max(Duration::from_millis(10));
                }
                Err(_) => return "no renewal succeeded before the lease deadline",
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        events::bulkhead_released(&self.site.at(&self.scope), None, self.since.elapsed());
        let site = self.site;
        let scope = self.scope.clone();
        let coordinator = self.coordinator.clone();
        let key = self.key.clone();
        self.coordinator
            .release(&self.key, self.token, move |result| {
                match result {
                    Ok(true) => {}
                    Ok(false) => events::bulkhead_release_found_nothing(&site.at(&scope)),
                    Err(error) => {
                        events::bulkhead_degraded(
                            &site.at(&scope),
                            Degraded::ReleaseUnknown,
                            &error,
                        );
                    }
                }
                coordinator.wake(&key);
            });
    }
}
