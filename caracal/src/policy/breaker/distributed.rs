//! The distributed breaker: one shared window and state per identity, in the coordinator.
//!
//! Admission comes from this process's view when it is fresh (no round trip), else from one
//! admission script call. Closed-path outcomes are recorded in batches without the caller
//! waiting; a probe's outcome settles its slot in the background.
//!
//! When the coordinator cannot answer: a scope this process last saw open or half-open is
//! rejected (`CircuitOpen`); otherwise `on_coordinator_error` decides — run the body unrecorded
//! (`fail_open`) or return `CoordinatorUnavailable` (`fail_closed`).

use std::future::Future;

use super::events;
use super::views::{Admission, BreakerTarget, Views};
use super::{BreakerSite, Classify, OnCoordinatorError, ProbeSlot, run_admitted};
use crate::coordinator;
use crate::ctx::CallCtx;
use crate::error::Error;
use crate::identity::{PolicyKind, Scope};
use crate::metrics::Stopwatch;
use crate::policy::breaker::kernel::Phase;
use crate::policy::refuse;

pub(super) async fn run<T, E, C, F>(
    site: &BreakerSite,
    ctx: &CallCtx,
    scope: &Scope,
    classify: C,
    body: F,
) -> Result<T, E>
where
    E: From<Error>,
    C: Classify<T, E>,
    F: Future<Output = Result<T, E>>,
{
    let arrival = Stopwatch::start();
    let config = &site.config;
    let coordinator = match coordinator::current() {
        Ok(coordinator) => coordinator,
        Err(error) => return Err(ctx.reject(error)),
    };
    let identity = coordinator.identity(
        PolicyKind::CircuitBreaker,
        config.name,
        config.operation,
        scope,
    );
    let resolved = site.resolve(Some(&coordinator));
    coordinator.uses().note_use(&identity, site, &resolved);
    let values = resolved.values;
    let target = BreakerTarget {
        identity,
        settings: values.settings(false),
    };
    let at = target.identity.at().shadowed(values.shadow);
    let views = Views::of(&coordinator);
    let admission = match views.admission(&target).await {
        Ok(admission) => admission,
        Err(error) => {
            events::coordinator_error(&at, "admit", &error);
            let last_known = views.last_known(&target);
            let last_seen_open = matches!(
                last_known,
                Some(Phase::Open | Phase::HalfOpen | Phase::ForcedOpen)
            );
            if last_seen_open || values.on_coordinator_error == OnCoordinatorError::FailClosed {
                events::degraded(&at, "fail_closed", last_known);
                let error = if last_seen_open {
                    site.open_error(scope, None)
                } else {
                    error
                };
                return refuse(ctx, values.shadow, error, body).await;
            }
            events::degraded(&at, "fail_open", last_known);
            // Run unrecorded: the coordinator that would count the outcome is unreachable.
            return body.await;
        }
    };
    match admission {
        Admission::Closed { generation } => {
            events::admitted(&at, Phase::Closed, generation, arrival);
            run_admitted(values.slow_after(), ctx, &classify, body, |verdict| {
                if let Some(observation) = verdict.observation() {
                    views.record(&target, generation, observation);
                }
            })
            .await
        }
        // An operator forced it closed: the call runs and counts for nothing.
        Admission::Unrecorded { generation } => {
            events::admitted(&at, Phase::ForcedClosed, generation, arrival);
            body.await
        }
        Admission::Probe { generation, token } => {
            events::probe_started(&at, generation, arrival);
            let slot = ProbeSlot(Some(|outcome| {
                views.settle_later(&target, token, outcome, generation);
            }));
            run_admitted(values.slow_after(), ctx, &classify, body, |verdict| {
                slot.settle(verdict);
            })
            .await
        }
        Admission::Open {
            phase,
            generation,
            retry_after,
        } => {
            events::rejected(&at, phase, Some(generation), retry_after);
            // Shadowed, unrecorded: the breaker evolves as if the call had been refused.
            refuse(
                ctx,
                values.shadow,
                site.open_error(scope, retry_after),
                body,
            )
            .await
        }
        Admission::ProbeLimit { generation } => {
            events::rejected(&at, Phase::HalfOpen, Some(generation), None);
            refuse(ctx, values.shadow, site.open_error(scope, None), body).await
        }
    }
}
