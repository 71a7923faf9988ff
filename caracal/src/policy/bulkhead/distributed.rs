//! The distributed bulkhead: one lease per running body in the identity's lease set.
//!
//! A lease is trusted only while the server would still hold it:
//!
//! - **Acquire** is one awaited round trip. Any coordinator failure rejects the call (fail
//!   closed); since the acquire may still have taken a lease, its release is sent anyway.
//! - **Trust deadline.** The server sets a lease's deadline when it runs the acquire (or a
//!   renewal), which is after this process *sent* it; so the lease is certainly held until
//!   `send time + lease`. A batched acquire's send time is its batch's, not when it joined its
//!   identity's lane: under load a holder tolerates the round trips a lone caller does; and on
//!   a server that lacked the script, the `EVAL`'s, not the `EVALSHA`'s it refused unrun. The
//!   holder trusts it only until a [safety margin](safety_margin) before that, for
//!   clock-rate drift and a timer that fires late. If the deadline has already passed when
//!   the acquire's reply arrives, the body never starts.
//! - **Checked before every step.** Every poll of the body first checks the trust deadline and
//!   the server's incarnation: a process resumed after a stall (SIGSTOP, a starved runtime)
//!   or a server found to have lost its data ends the call with [`Error::LeaseLost`] without
//!   letting the body take another step.
//! - **Renewal** every `lease / 3` counted from when the previous acquire or renewal was
//!   sent, answered or not (so a slow acquire is renewed soon, and a round trip longer than
//!   a third of the lease has several in flight), and at once after any reconnection. Each
//!   success moves the trust deadline to its own send time + lease − margin, never earlier.
//!   A failed renewal is retried until the trust deadline (a renewal only moves a deadline,
//!   so sending it twice is harmless); a denied one, or a deadline that passes, loses the
//!   lease: the body is dropped.
//! - **Release** is a guard: however the call ends (returned, failed, panicked, dropped), its
//!   `Drop` queues the release on the connection and lets it finish in the background. The
//!   caller never waits for it, the task's next command cannot overtake it, and one whose
//!   outcome is unknown is sent again until the lease would have expired anyway.
//! - **A server that lost its data** (restarted without persistence, failed over, flushed) ends
//!   every lease held there: holders in this process are cancelled before the connection that
//!   noticed serves anything, the loss is announced to the other processes, and no new caller
//!   is admitted through this process for the grace after a loss ([`crate::DataLoss`]), by
//!   when every process holding a lease has noticed it and cancelled its holders.
//! - **Fencing.** Every lease comes with a fencing token, [`crate::fencing_token`] in the body.
//! - **`max_wait`**: a denied acquire is retried with the same token, after a pause that
//!   starts at 2 ms and doubles up to 50 ms (capped by the time left), or at once when a lease
//!   of the same identity is released in this process. Waiting costs one acquire round trip
//!   per retry and holds nothing; waiters are not queued fairly across processes. Within a
//!   process a freed slot is for the highest class waiting: a waiter retries only while no
//!   call of a higher class waits for the same identity here (the script keeps each class
//!   below its own cap, so a lower one cannot be admitted above its share either).
//! - **`keep`**: a body that succeeded leaves its lease to the next caller of the identity in
//!   this process, for up to `keep` ([`keep`](super::keep)); the caller starts on it with no
//!   round trip. Only a lease with no renewal due yet (trusted for at least `lease − margin −
//!   lease / 3` more), whose token its body did not read, and whose latest reply showed the
//!   fleet below its limit (another process could be refused otherwise) is kept; none
//!   is kept while a call of the identity waits here (released, it wakes that caller), and
//!   with an adaptive limit, thresholds or in shadow mode none is. A kept lease is handed on
//!   only while that reply is younger than 250 ms ([`reuse`]) and under the limit and lease
//!   length it was granted under. A refused acquire (of any enforcing call site, with
//!   `keep` or without) returns the kept leases of its identity across the fleet, and none
//!   is kept for 100 ms after ([`contention`]).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;
use uuid::Uuid;

use self::command::{LeaseAnswer, LeaseCommand, lease};
use super::events::{self, Degraded, LeaseLoss, Refusal};
use super::keep::Pool;
use super::{BulkheadSite, BulkheadValues, adaptive};
use crate::coordinator::{self, Coordinator};
use crate::ctx::{CallCtx, Rejection};
use crate::error::Error;
use crate::error::FailureKind;
use crate::fencing;
use crate::identity::{Identity, PolicyKind, Scope};
use crate::metrics::Stopwatch;
use crate::policy::bulkhead::kernel::{LeaseAction, Release};
use crate::policy::refuse;
use crate::priority::{self, Priority};

mod command;
pub(super) mod contention;
mod reuse;

const FIRST_WAIT_PAUSE: Duration = Duration::from_millis(2);
const MAX_WAIT_PAUSE: Duration = Duration::from_millis(50);
/// The least time between a failed renewal and the next attempt.
const MIN_RENEWAL_RETRY: Duration = Duration::from_millis(10);

/// How long before the earliest moment the server could expire a lease its holder stops
/// trusting it: a tenth of the lease (10 ms at the 100 ms minimum, 3 s at the 30 s default).
/// It covers the drift between this host's clock rate and the server's (well under 0.1 %),
/// timer granularity, and a runtime late by up to a tenth of the lease to fire the deadline;
/// with renewals every third of the lease, a holder still has more than half the lease to
/// retry a failed renewal before it gives up.
pub(crate) fn safety_margin(lease: Duration) -> Duration {
    lease / 10
}

pub(super) async fn run<T, E, F>(
    site: &BulkheadSite,
    ctx: &CallCtx,
    scope: &Scope,
    body: F,
) -> Result<T, E>
where
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    let arrival = Stopwatch::start();
    // Read once: the class the acquire is decided by is the one the call reports.
    let priority = Priority::current();
    let config = &site.config;
    let coordinator = match coordinator::current() {
        Ok(coordinator) => coordinator,
        Err(error) => return Err(ctx.reject(error)),
    };
    let identity = coordinator.identity(PolicyKind::Bulkhead, config.name, config.operation, scope);
    let resolved = site.resolve(Some(&coordinator));
    coordinator.uses().note_use(&identity, site, &resolved);
    let mut values = resolved.values;
    let adaptive = match values.adaptive {
        Some(bounds) => {
            let view = adaptive::Views::of(&coordinator, &identity);
            match view.limit(&coordinator, bounds).await {
                Ok(learnt) => {
                    values.limit = learnt.limit;
                    site.report_limit(learnt.full);
                    Some((view, learnt))
                }
                Err(error) => {
                    unavailable(&identity, &values, &error);
                    return refuse(ctx, values.shadow, error, super::unfenced(body)).await;
                }
            }
        }
        None => None,
    };
    let keep = keeping(&values);
    let pool = keep.map(|_| Pool::<Lease>::of(&coordinator));
    let reused = pool
        .as_ref()
        .and_then(|pool| pool.take(&identity.key, |lease| lease.reusable_under(&values)));
    // Adaptive limits keep no leases: a reused lease is never counted against a share.
    let (mut lease, occupancy, counted) = match reused {
        Some(mut lease) => {
            lease.parked = false;
            events::lease_reused(&lease.identity.at());
            let occupancy = lease.occupancy.load(Ordering::Relaxed);
            (lease, occupancy, None)
        }
        None => {
            if pool.is_some() {
                contention::listen(&coordinator);
            }
            let token = crate::token::fresh();
            // Read before the acquire is sent: a loss of data noticed at any point after
            // that may have taken this lease with it.
            let epoch = coordinator.incarnation().epoch();
            let reconnections = coordinator.incarnation().reconnections();
            let mut grant = match admit(
                site,
                &values,
                &coordinator,
                &identity,
                (token, priority),
                adaptive.as_ref().map(|(view, _)| view),
            )
            .await
            {
                Ok(grant) => grant,
                Err(error) => {
                    return refuse(ctx, values.shadow, error, super::unfenced(body)).await;
                }
            };
            let (occupancy, counted) = (grant.occupancy, grant.held.take());
            let highest_read = pool.as_ref().map(|pool| pool.highest_read(&identity.key));
            let lease = Lease::new(
                (coordinator, identity, token),
                &values,
                grant,
                (epoch, reconnections),
                highest_read,
            );
            (lease, occupancy, counted)
        }
    };
    let at = lease.identity.at().shadowed(values.shadow);
    if lease.check(Instant::now()).is_err() {
        events::rejected(
            &at,
            Refusal::AdmissionExpired,
            Some(occupancy),
            values.limit,
        );
        if values.shadow {
            // Released now, as the refused call's would have been.
            drop(lease);
            return super::unfenced(body).await;
        }
        // The body never started: for an outer breaker this is a refusal, not a failure.
        return Err(ctx.reject_as(lost(site, scope), Rejection::Admission));
    }
    let _running = events::admitted(&at, occupancy, values.limit, arrival);
    // In a block of its own: what borrows the lease ends before the lease may be kept.
    let result = {
        let mut renewals = pin!(lease.keep(values.limit));
        let mut body = pin!(fencing::scope(Some(lease.fence()), body));
        // Before each step of the body: the lease must still be trusted, and its renewals must
        // not have found it gone.
        let held = std::future::poll_fn(|cx| {
            if let Err(cause) = lease.check(Instant::now()) {
                return Poll::Ready(Err(cause));
            }
            if let Poll::Ready(cause) = renewals.as_mut().poll(cx) {
                return Poll::Ready(Err(cause));
            }
            body.as_mut().poll(cx).map(Ok)
        });
        // A body cut short from outside (an outer timeout, a caller gone) is congestion too.
        let mut timing = adaptive.as_ref().map(|(view, learnt)| Timing {
            view,
            coordinator: &lease.coordinator,
            low: learnt.low(occupancy),
            started: Instant::now(),
            succeeded: Some(false),
            _held: counted,
        });
        // Awaited apart from the match: a shadow bulkhead goes on polling the body after a
        // loss.
        let held = held.await;
        match held {
            Ok(result) => {
                if let Some(timing) = &mut timing {
                    // A failure or a timeout is congestion, not a latency; an inner policy's
                    // refusal says nothing about the downstream.
                    timing.succeeded = match (&result, ctx.rejection()) {
                        (Ok(_), _) => Some(true),
                        (Err(_), None | Some(Rejection::Cut)) => Some(false),
                        (Err(_), Some(_)) => None,
                    };
                }
                result
            }
            Err(cause) => {
                events::lease_lost(&at, cause);
                if values.shadow {
                    // The enforcing bulkhead would cut the body short here; a shadow one lets
                    // it finish (the event above says the lease is gone).
                    return body.await;
                }
                return Err(ctx.reject(lost(site, scope)));
            }
        }
    };
    // Never kept while a call of the identity waits here: released, the lease wakes it, where
    // a kept one would go to the next newcomer and pass the waiter over.
    if let (Ok(_), Some(keep), Some(pool)) = (&result, keep, pool)
        && lease.keepable(Instant::now(), values.limit)
        && !lease.coordinator.anyone_waits(&lease.identity.key)
    {
        lease.parked = true;
        events::lease_kept(&at, lease.occupancy.load(Ordering::Relaxed));
        let coordinator = lease.coordinator.clone();
        let key = lease.identity.key.clone();
        // Kept no longer than it could be handed on: past that it would hold a slot for nothing.
        let keep = keep.min(lease.reusable_for(Instant::now()));
        pool.park(&coordinator, &key, lease, keep);
    }
    result
}

/// How long a finished body's lease may be kept for the next caller: `keep`, except where a
/// kept lease could change what a caller sees. An adaptive limit learns from every body's
/// occupancy and latency, which a lease taken without a reply would skew; with thresholds, a
/// lower class's kept lease would hold a slot a higher class's cap counts; a shadow
/// bulkhead's refusals are counted, not enforced.
fn keeping(values: &BulkheadValues) -> Option<Duration> {
    values
        .keep
        .filter(|_| values.adaptive.is_none() && values.thresholds.is_none() && !values.shadow)
}

/// What an adaptive limit's view learns of one body, however it ends: how long it took, and
/// whether it succeeded (`Some(true)`), was a drop (`Some(false)`, also what a body dropped
/// unfinished leaves) or has nothing to teach (`None`); `low`, whether it was admitted at low
/// occupancy. It holds the body's count against its process's share until the body ends.
struct Timing<'a> {
    view: &'a Arc<adaptive::View>,
    coordinator: &'a Coordinator,
    low: bool,
    started: Instant,
    succeeded: Option<bool>,
    /// The body's count against its process's share, given back after the body ends.
    _held: Option<adaptive::Held<'a>>,
}

impl Drop for Timing<'_> {
    fn drop(&mut self) {
        if let Some(succeeded) = self.succeeded {
            let elapsed = micros(self.started.elapsed());
            self.view.observe(self.coordinator, |sampling| {
                sampling.body(self.low, elapsed, succeeded);
            });
        }
    }
}

fn lost(site: &BulkheadSite, scope: &Scope) -> Error {
    Error::LeaseLost {
        policy: site.config.name,
        scope: scope.to_string(),
    }
}

/// A granted lease, as the acquire answered it.
struct Grant<'a> {
    /// When the successful acquire was sent.
    sent: Instant,
    occupancy: u32,
    fence: u64,
    /// Its count against an adaptive limit's share of this process.
    held: Option<adaptive::Held<'a>>,
}

/// Takes a lease for a call of `priority`, waiting up to `max_wait` for one. An adaptive
/// limit's `view` learns the fleet occupancy each reply shows.
async fn admit<'a>(
    site: &BulkheadSite,
    values: &BulkheadValues,
    coordinator: &Coordinator,
    identity: &Identity,
    (token, priority): (Uuid, Priority),
    view: Option<&'a Arc<adaptive::View>>,
) -> Result<Grant<'a>, Error> {
    if coordinator.incarnation().waiting_after_loss(values.lease) {
        let error = Error::unavailable(
            FailureKind::DataLost,
            "the server lost its data; admissions resume once every holder of a lease granted \
             before has been cancelled",
        );
        let at = identity.at().shadowed(values.shadow);
        events::rejected(&at, Refusal::CoordinatorUnavailable, None, values.limit);
        return Err(error);
    }
    let give_up = values.max_wait.map(|wait| Instant::now() + wait);
    let mut pause = FIRST_WAIT_PAUSE;
    // Counted as waiting, as its class, from its first refusal until it is admitted or gives up.
    let mut waiting = None;
    loop {
        // Registered before the attempt, so a release that lands during it is not missed.
        let released = give_up.map(|_| coordinator.released(&identity.key));
        // A process holding its share of a saturated fleet is refused here, before asking: the
        // slots it lets go go to the other processes' calls rather than back to its own.
        let held = view.map(|view| view.hold());
        let refused_at = if let (Some(view), Some(None)) = (view, &held) {
            view.observe(coordinator, |sampling| sampling.refused_here());
            None
        } else {
            let command = LeaseCommand {
                identity,
                action: LeaseAction::Acquire,
                token,
                ttl: values.lease,
                limit: values.limit,
                share: values.thresholds.thousandths(priority),
            };
            // Until the reply is read, the acquire may have taken a lease nobody knows of: if
            // this call is dropped meanwhile, or the outcome stays unknown, it is released
            // right away rather than held until it expires.
            let mut unclaimed = UnclaimedLease {
                coordinator,
                identity,
                token,
                lease: values.lease,
                armed: true,
            };
            let reply = lease(coordinator, command).await;
            unclaimed.armed = reply.is_err();
            if let (Some(view), Ok(answer)) = (view, &reply) {
                let (occupancy, refused) = (answer.reply.occupancy, !answer.reply.allowed);
                view.observe(coordinator, |sampling| {
                    sampling.occupancy(occupancy, refused)
                });
            }
            match reply {
                // Trusted from when its batch was sent, not from when it joined its lane: a
                // fleet under load tolerates the round trips a lone caller does.
                Ok(LeaseAnswer { reply, sent }) if reply.allowed => {
                    return Ok(Grant {
                        sent,
                        occupancy: reply.occupancy,
                        fence: reply.fence,
                        held: held.flatten(),
                    });
                }
                Ok(LeaseAnswer { reply, .. }) => {
                    // Whatever `keep` says here: another process may keep leases of the
                    // identity.
                    if !values.shadow {
                        contention::refused(coordinator, identity);
                    }
                    Some(reply.occupancy)
                }
                Err(error) => {
                    unavailable(identity, values, &error);
                    return Err(error);
                }
            }
        };
        // A refused call holds no slot while it waits: counted, a process with calls waiting
        // would read as holding the fleet's slots (see `Share::learn`).
        drop(held);
        let now = Instant::now();
        let retry = match give_up.zip(released) {
            Some((give_up, released)) if now < give_up => {
                let waiting =
                    waiting.get_or_insert_with(|| coordinator.waiting(&identity.key, priority));
                let _ = tokio::time::timeout(pause.min(give_up - now), released).await;
                pause = (pause * 2).min(MAX_WAIT_PAUSE);
                // A slot freed here is for the highest class waiting here: a lower one tries
                // again only once none waits.
                waiting.outranked_until(give_up).await
            }
            _ => false,
        };
        if !retry {
            let reason = if give_up.is_some() {
                Refusal::WaitTimeout
            } else {
                Refusal::Capacity
            };
            events::rejected(
                &identity.at().shadowed(values.shadow),
                reason,
                refused_at,
                values.limit,
            );
            return Err(site.full(&identity.scope, values.limit));
        }
    }
}

/// Says that a call was refused because the coordinator did not answer.
fn unavailable(identity: &Identity, values: &BulkheadValues, error: &Error) {
    let at = identity.at().shadowed(values.shadow);
    events::degraded(&at, Degraded::AdmissionUnknown, error);
    events::rejected(&at, Refusal::CoordinatorUnavailable, None, values.limit);
}

/// An acquire whose outcome the caller has not seen; see [`admit`].
struct UnclaimedLease<'a> {
    coordinator: &'a Coordinator,
    identity: &'a Identity,
    token: Uuid,
    lease: Duration,
    armed: bool,
}

impl Drop for UnclaimedLease<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Counted from now, not from when `admit` asked: the acquire may have waited in its
            // identity's lane before it was sent. Sent by now, it ran within a command timeout
            // (one still waiting is withdrawn, or released when its reply comes).
            let until = Instant::now() + self.lease + self.coordinator.command_timeout();
            self.coordinator.send_until::<Release>(
                self.identity,
                &self.token.as_u128(),
                until,
                |_| (),
            );
        }
    }
}

/// A held lease. Dropping it releases the lease in the background.
struct Lease {
    coordinator: Coordinator,
    identity: Identity,
    token: Uuid,
    /// The fencing token its acquire was granted.
    fence: u64,
    /// Set when a body reads the token, where the lease may be kept: a lease whose token a
    /// body read is never handed to another body.
    read: Option<Arc<AtomicBool>>,
    /// The occupancy the latest reply about the lease reported.
    occupancy: AtomicU32,
    /// The highest token a body of the identity read in this process, where the lease may be
    /// kept: one whose token is lower is not handed on.
    highest_read: Option<Arc<AtomicU64>>,
    /// Whether it waits in the pool of kept leases (its release then returns it).
    parked: bool,
    /// How many reconnections there had been when the latest request the server confirmed
    /// was sent. A holder confirms its lease after each reconnection, but a kept lease has no
    /// holder: it is handed on only if confirmed since the latest one.
    confirmed_in: AtomicU64,
    /// Its time to live.
    ttl: Duration,
    /// The limit in force when it was granted: a kept lease serves a new body only while the
    /// same limit (and lease length) is in force, since a lowered limit must refuse new bodies.
    limit: u32,
    /// The origin of the two times below, which are kept as nanoseconds since it so that the
    /// renewal loop can move them while the guard reads them.
    since: Instant,
    /// Until when the lease is trusted: latest successful send + lease − margin.
    trusted_until: AtomicU64,
    /// When the server has certainly expired the lease: latest successful reply + lease.
    expired_by: AtomicU64,
    /// When the latest acquire or renewal of the lease was sent, answered or not.
    last_sent: AtomicU64,
    /// When the latest acquire or renewal the server confirmed was sent.
    last_confirmed: AtomicU64,
    /// The server's incarnation when the acquire was sent.
    epoch: u64,
}

impl Lease {
    /// The lease `grant` gave `token`; with the identity's `highest_read` when it may be kept
    /// after its body (its token's reads are then noted).
    fn new(
        (coordinator, identity, token): (Coordinator, Identity, Uuid),
        values: &BulkheadValues,
        grant: Grant<'_>,
        (epoch, reconnections): (u64, u64),
        highest_read: Option<Arc<AtomicU64>>,
    ) -> Self {
        let lease = Lease {
            coordinator,
            identity,
            token,
            fence: grant.fence,
            read: highest_read.as_ref().map(|_| Arc::default()),
            highest_read,
            occupancy: AtomicU32::new(grant.occupancy),
            parked: false,
            confirmed_in: AtomicU64::new(reconnections),
            ttl: values.lease,
            limit: values.limit,
            since: grant.sent,
            trusted_until: AtomicU64::new(0),
            expired_by: AtomicU64::new(0),
            last_sent: AtomicU64::new(0),
            last_confirmed: AtomicU64::new(0),
            epoch,
        };
        lease.sent(grant.sent);
        lease.confirmed(grant.sent, Instant::now());
        lease
    }

    /// The body's fencing token.
    fn fence(&self) -> fencing::Fence {
        fencing::Fence {
            token: self.fence,
            read: self.read.clone(),
            highest: self.highest_read.clone(),
        }
    }

    /// Records that an acquire or a renewal of the lease was sent at `sent`.
    fn sent(&self, sent: Instant) {
        let since = sent.saturating_duration_since(self.since);
        self.last_sent.fetch_max(nanos(since), Ordering::AcqRel);
    }

    /// How long a lease just granted is trusted once its first renewal is due.
    fn fresh(&self) -> Duration {
        self.ttl - safety_margin(self.ttl) - self.period()
    }

    /// How often the lease is renewed.
    fn period(&self) -> Duration {
        self.ttl / 3
    }

    /// Records that the server set the lease's deadline in answer to a request sent at `sent`
    /// and answered at `answered`.
    fn confirmed(&self, sent: Instant, answered: Instant) {
        let lease = self.ttl;
        let trusted = (sent + lease - safety_margin(lease)).saturating_duration_since(self.since);
        let expired = (answered + lease).saturating_duration_since(self.since);
        // Answers to renewals in flight together may come in any order: the latest send wins.
        self.trusted_until
            .fetch_max(nanos(trusted), Ordering::AcqRel);
        self.expired_by.fetch_max(nanos(expired), Ordering::AcqRel);
        self.last_confirmed.fetch_max(
            nanos(sent.saturating_duration_since(self.since)),
            Ordering::AcqRel,
        );
    }

    fn trusted_until(&self) -> Instant {
        self.since + Duration::from_nanos(self.trusted_until.load(Ordering::Acquire))
    }

    /// Whether the lease may still be relied on at `now`: before its trust deadline, and held
    /// by a server that has not lost its data since; else why not.
    fn check(&self, now: Instant) -> Result<(), LeaseLoss> {
        if self.coordinator.incarnation().epoch() != self.epoch {
            Err(LeaseLoss::DataLost)
        } else if now >= self.trusted_until() {
            Err(LeaseLoss::TrustExpired)
        } else {
            Ok(())
        }
    }

    /// Keeps the lease alive while the body runs; completes only when it is lost, with the
    /// cause. The first renewal is due a third of the lease after the latest acquire or
    /// renewal was sent (for a kept lease, maybe by an earlier body).
    ///
    /// A renewal is due a third of the lease after the previous one was sent, answered or
    /// not: on a link whose round trip is longer than that, waiting for each answer before
    /// the next renewal renewed only once a round trip, each answer arriving two round trips
    /// after the send of the one before, which a round trip near half the lease outran. A
    /// renewal only moves a deadline, so several in flight are harmless, and the trust
    /// deadline only ever moves later, whichever answer comes first.
    async fn keep(&self, limit: u32) -> LeaseLoss {
        let period = self.period();
        let mut due =
            self.since + Duration::from_nanos(self.last_sent.load(Ordering::Acquire)) + period;
        let mut in_flight = FuturesUnordered::new();
        loop {
            let reconnected = self.coordinator.incarnation().changed();
            tokio::select! {
                () = tokio::time::sleep_until(due.min(self.trusted_until())) => {}
                () = reconnected => {}
                Some((reconnections, answer)) = in_flight.next() => {
                    match answer {
                        Ok(LeaseAnswer { reply, sent }) if reply.allowed => {
                            self.confirmed(sent, Instant::now());
                            self.confirmed_in.fetch_max(reconnections, Ordering::AcqRel);
                            self.occupancy.store(reply.occupancy, Ordering::Relaxed);
                        }
                        Ok(_) => return LeaseLoss::NotHeld,
                        Err(error) => {
                            events::degraded(
                                &self.identity.at(),
                                Degraded::LeaseUncertain,
                                &error,
                            );
                            // Try again soon, while the lease is still trusted.
                            let retry = Instant::now() + (period / 4).max(MIN_RENEWAL_RETRY);
                            due = due.min(retry);
                        }
                    }
                    continue;
                }
            }
            if let Err(cause) = self.check(Instant::now()) {
                return match cause {
                    LeaseLoss::TrustExpired if !in_flight.is_empty() => LeaseLoss::RenewalTimedOut,
                    cause => cause,
                };
            }
            // Counted from before the send: the next renewal is never later than a period
            // after this one went out.
            let now = Instant::now();
            due = now + period;
            self.sent(now);
            let reconnections = self.coordinator.incarnation().reconnections();
            let renewal = lease(
                &self.coordinator,
                LeaseCommand {
                    identity: &self.identity,
                    action: LeaseAction::Renew,
                    token: self.token,
                    ttl: self.ttl,
                    limit,
                    // A renewal keeps a lease whatever the class: the share is not read.
                    share: priority::WHOLE,
                },
            );
            in_flight.push(async move { (reconnections, renewal.await) });
        }
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.parked {
            events::lease_returned(&self.identity.at());
        }
        events::released(&self.identity.at(), None, self.since.elapsed());
        let coordinator = self.coordinator.clone();
        let identity = self.identity.clone();
        let until = self.since + Duration::from_nanos(self.expired_by.load(Ordering::Acquire));
        let token = self.token.as_u128();
        self.coordinator
            .send_until::<Release>(&self.identity, &token, until, move |result| {
                let at = identity.at();
                match result {
                    Ok(true) => {}
                    Ok(false) => events::release_found_nothing(&at),
                    Err(error) => {
                        events::degraded(&at, Degraded::ReleaseUnknown, &error);
                    }
                }
                coordinator.wake(&identity.key);
            });
    }
}
