//! `#[circuit_breaker]`: one shared failure window per identity.

pub(crate) mod kernel;

use std::future::Future;
use std::time::Duration;

use crate::ctx::CallCtx;
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

/// One `#[circuit_breaker]` call site: its settings and its process-local state.
#[doc(hidden)]
#[derive(Debug)]
pub struct BreakerSite {
    config: BreakerConfig,
}

impl BreakerSite {
    /// A call site with these settings.
    pub const fn new(config: BreakerConfig) -> Self {
        BreakerSite { config }
    }
}

/// Classifies a call's result for the breaker.
#[doc(hidden)]
pub trait Classify<T, E> {
    /// `rejected` tells whether caracal itself produced the error.
    fn classify(&self, result: &Result<T, E>, rejected: bool) -> Outcome;
}

/// The default: `Ok` is a success, the body's `Err` a failure.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct ClassifyByResult;

impl<T, E> Classify<T, E> for ClassifyByResult {
    fn classify(&self, result: &Result<T, E>, _: bool) -> Outcome {
        match result {
            Ok(_) => Outcome::Success,
            Err(_) => Outcome::Failure,
        }
    }
}

impl<T, E, F: Fn(&Result<T, E>) -> Outcome> Classify<T, E> for F {
    fn classify(&self, result: &Result<T, E>, _: bool) -> Outcome {
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
    let _ = (&site.config, &classify);
    if let Err(error) = scope {
        return Err(ctx.reject(error.clone()));
    }
    body.await
}
