//! The policies: what each attribute does to a call.

pub(crate) mod breaker;
pub(crate) mod bulkhead;
pub(crate) mod descriptor;
#[cfg(test)]
mod differential;
pub(crate) mod fallback;
pub(crate) mod hedge;
pub(crate) mod rate_limit;
mod registry;
pub(crate) mod retry;
pub(crate) mod retry_budget;
pub(crate) mod timeout;

/// The future `make` makes, boxed out of line, so that a rare path's large state (a
/// distributed policy's, kilobytes) is not laid out in the frame of every call that might take
/// it. Built in place, that frame cost every local call a stack probe and the pages it spans
/// (`perf annotate`, `bench local`: the stores they made held up the slot's atomic update).
#[inline(never)]
pub(crate) fn boxed<F: std::future::Future>(make: impl FnOnce() -> F) -> std::pin::Pin<Box<F>> {
    Box::pin(make())
}

/// What the attribute macros expand to, from every kind (re-exported by `__private`).
pub(crate) mod expansion {
    pub use super::breaker::{
        BreakerConfig, BreakerSite, Classify, ClassifyByResult, OnCoordinatorError, SlowCall,
        circuit_breaker,
    };
    pub use super::bulkhead::{
        AdaptiveLimit, AtOnce, BulkheadConfig, BulkheadSite, Line, LocalSlot, bulkhead, fenced_off,
        local_bulkhead, wait_in_line,
    };
    pub use super::fallback::{FallbackConfig, fallback};
    pub use super::hedge::{Delay, HedgeConfig, HedgeSite, hedge};
    pub use super::rate_limit::{RateLimitConfig, RateLimitSite, rate_limit};
    pub use super::retry::{Retry, RetryBodyErrors, RetryConfig, RetryWhen};
    pub use super::retry_budget::{RetryBudgetConfig, RetryBudgetSite, retry_budget};
    pub use super::timeout::{TimeoutConfig, timeout};
}

/// Each kind's tower layer, its service, and the policy and permit that service applies:
/// re-exported as [`caracal::tower`](crate::tower).
#[cfg(feature = "tower")]
pub(crate) mod layers {
    pub use super::breaker::tower::{CircuitBreaker, CircuitBreakerLayer, CircuitBreakerPolicy};
    pub use super::bulkhead::tower::{Bulkhead, BulkheadLayer, BulkheadPermit, BulkheadPolicy};
    pub use super::hedge::tower::{Hedge, HedgeLayer};
    pub use super::rate_limit::tower::{RateLimit, RateLimitLayer, RateLimitPolicy};
    pub use super::retry_budget::RetryBudget;
}

use std::future::Future;

use self::descriptor::Descriptor;
use crate::ctx::CallCtx;
use crate::error::Error;
use crate::identity::PolicyKind;

/// Every kind with shared state, in [`PolicyKind`]'s order: what status, the metrics' docs and
/// the event tests go through.
pub(crate) const POLICIES: [&Descriptor; 4] = [
    &bulkhead::descriptor::DESCRIPTOR,
    &breaker::descriptor::DESCRIPTOR,
    &rate_limit::DESCRIPTOR,
    &retry_budget::DESCRIPTOR,
];

/// The descriptor of `kind`.
pub(crate) fn descriptor(kind: PolicyKind) -> &'static Descriptor {
    // POLICIES is in the kinds' declaration order (a test of `descriptor` checks it).
    POLICIES[kind as usize]
}

/// Ends a call a policy refused with `error`: rejected, or, by a policy in shadow mode, run
/// anyway as `body` (the refusal was counted as `would_reject` where it was decided, and the
/// policy's shared state already evolved as if the call had been refused).
pub(crate) async fn refuse<T, E, F>(
    ctx: &CallCtx,
    shadow: bool,
    error: Error,
    body: F,
) -> Result<T, E>
where
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    if shadow {
        body.await
    } else {
        Err(ctx.reject(error))
    }
}

/// [`summary::repeat_across`](crate::summary::repeat_across) for the coordinator in force: what
/// its loss causes is said once per policy, apart from what another coordinator's does.
pub(crate) fn repeat_across(
    event: &'static str,
    at: &crate::labels::At<'_>,
    condition: &[&str],
) -> Option<crate::summary::Across> {
    crate::summary::repeat_across(event, at, crate::coordinator::current_id(), condition)
}
