//! `#[circuit_breaker]`: one shared failure window per identity.
//!
//! The state machine is [`kernel`]; the distributed breaker runs it in the coordinator (Lua in
//! Redis, or the in-memory backend) and admits closed-path calls from this process's view of
//! the state (see `coordinator::breakers`); the local breaker runs it under a mutex.

mod distributed;
pub(crate) mod kernel;
mod local;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;

use self::kernel::{ProbeOutcome, Settings};
use crate::ctx::{CallCtx, Rejection};
use crate::events::At;
use crate::identity::Scope;
use crate::{Error, Outcome};

/// What the breaker does when the coordinator cannot answer.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnCoordinatorError {
    /// Run the body (unless the scope was last seen open or half-open).
    FailOpen,
    /// Reject with `Error::CoordinatorUnavailable`.
    FailClosed,
}

/// The settings of one `#[circuit_breaker]` call site.
#[doc(hidden)]
#[derive(Debug)]
pub struct BreakerConfig {
    /// The policy name.
    pub name: &'static str,
    /// The operation name.
    pub operation: &'static str,
    /// Observations needed before the breaker may open.
    pub minimum_throughput: u32,
    /// Opens when failures / observations reach this, in [0.001, 0.999].
    pub failure_threshold: f64,
    /// The window holds at most this many latest observations.
    pub window_size: u32,
    /// Observations older than this leave the window.
    pub window: Duration,
    /// How long it stays open before probing.
    pub open: Duration,
    /// Concurrent probes allowed fleet-wide while half-open.
    pub half_open_probes: u32,
    /// Probe successes needed to close.
    pub half_open_successes: u32,
    /// A probe that never settles frees its slot after this.
    pub probe_lease: Duration,
    /// Behaviour when the coordinator cannot answer.
    pub on_coordinator_error: OnCoordinatorError,
    /// Per-process only.
    pub local: bool,
}

/// One `#[circuit_breaker]` call site: its settings and its cached process-local state.
#[doc(hidden)]
#[derive(Debug)]
pub struct BreakerSite {
    config: BreakerConfig,
    local: local::SiteCache,
}

impl BreakerSite {
    /// A call site with these settings.
    pub const fn new(config: BreakerConfig) -> Self {
        BreakerSite {
            config,
            local: local::SiteCache::new(),
        }
    }

    /// The settings every command of this site carries.
    fn settings(&self) -> Settings {
        let config = &self.config;
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
        Settings {
            minimum_throughput: config.minimum_throughput,
            // Thousandths, as @gkoos/caracal resolves it, so both fleets agree on the boundary.
            threshold_permille: ((config.failure_threshold * 1000.0).round() as u32).clamp(1, 999),
            window_size: config.window_size,
            window_ms: millis(config.window),
            open_ms: millis(config.open),
            half_open_probes: config.half_open_probes,
            half_open_successes: config.half_open_successes,
            probe_lease_ms: millis(config.probe_lease),
            closed_expires: !config.local,
        }
    }

    fn at<'a>(&self, scope: &'a Scope) -> At<'a> {
        At {
            policy: "circuit_breaker",
            name: self.config.name,
            operation: self.config.operation,
            scope: scope.as_str(),
            coordination: if self.config.local {
                "local"
            } else {
                "distributed"
            },
        }
    }

    fn open_error(&self, scope: &Scope, retry_after: Option<Duration>) -> Error {
        Error::CircuitOpen {
            policy: self.config.name,
            scope: scope.to_string(),
            retry_after,
        }
    }
}

/// Classifies a call's result for the breaker.
#[doc(hidden)]
pub trait Classify<T, E> {
    /// `rejection` tells whether (and how) caracal itself produced the error.
    fn classify(&self, result: &Result<T, E>, rejection: Option<Rejection>) -> Outcome;
}

/// The default: `Ok` is a success and the body's own `Err` a failure. Of caracal's own errors
/// from inner layers, only those that cut a started call short (timeout, lost lease) are
/// failures; a call an inner policy never let start, or a coordinator outage, says nothing
/// about the downstream and is ignored.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct ClassifyByResult;

impl<T, E> Classify<T, E> for ClassifyByResult {
    fn classify(&self, result: &Result<T, E>, rejection: Option<Rejection>) -> Outcome {
        match (result, rejection) {
            (Ok(_), _) => Outcome::Success,
            (Err(_), None | Some(Rejection::Cut)) => Outcome::Failure,
            (Err(_), Some(Rejection::Admission | Rejection::Coordinator | Rejection::Refused)) => {
                Outcome::Ignored
            }
        }
    }
}

/// A `classify = path` function owns the verdict entirely.
impl<T, E, F: Fn(&Result<T, E>) -> Outcome> Classify<T, E> for F {
    fn classify(&self, result: &Result<T, E>, _: Option<Rejection>) -> Outcome {
        self(result)
    }
}

/// Admits `body` through the breaker and records its outcome.
#[doc(hidden)]
pub async fn circuit_breaker<T, E, C, F>(
    site: &'static BreakerSite,
    ctx: &CallCtx,
    scope: &Result<Scope, Error>,
    classify: C,
    body: F,
) -> Result<T, E>
where
    E: From<Error>,
    C: Classify<T, E>,
    F: Future<Output = Result<T, E>>,
{
    let scope = ctx.scope(scope)?;
    if site.config.local {
        local::run(site, ctx, scope, classify, body).await
    } else {
        // Boxed: the distributed path's state is large, and keeping it inline would make every
        // local call's future that large too. One allocation is nothing next to its round trips.
        Box::pin(distributed::run(site, ctx, scope, classify, body)).await
    }
}

/// Runs an admitted call and hands its outcome to `record`. A panic in the body is recorded
/// as a failure, then resumed: it reaches the caller as if the breaker were not there.
async fn run_admitted<T, E, C, F>(
    ctx: &CallCtx,
    classify: &C,
    body: F,
    record: impl FnOnce(Outcome),
) -> Result<T, E>
where
    C: Classify<T, E>,
    F: Future<Output = Result<T, E>>,
{
    match AssertUnwindSafe(body).catch_unwind().await {
        Ok(result) => {
            record(classify.classify(&result, ctx.rejection()));
            result
        }
        Err(panic) => {
            record(Outcome::Failure);
            std::panic::resume_unwind(panic)
        }
    }
}

/// A probe slot that must be settled exactly once: by the call's outcome, or — when the call
/// is dropped first — as ignored, so the slot is free at once rather than at the end of its
/// lease.
struct ProbeSlot<S: FnOnce(ProbeOutcome)>(Option<S>);

impl<S: FnOnce(ProbeOutcome)> ProbeSlot<S> {
    fn settle(mut self, outcome: Outcome) {
        if let Some(settle) = self.0.take() {
            settle(match outcome {
                Outcome::Success => ProbeOutcome::Success,
                Outcome::Failure => ProbeOutcome::Failure,
                Outcome::Ignored => ProbeOutcome::Ignored,
            });
        }
    }
}

impl<S: FnOnce(ProbeOutcome)> Drop for ProbeSlot<S> {
    fn drop(&mut self) {
        if let Some(settle) = self.0.take() {
            settle(ProbeOutcome::Ignored);
        }
    }
}

#[cfg(test)]
mod tests;
