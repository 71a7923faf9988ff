//! `#[circuit_breaker]`: one shared failure window per identity.
//!
//! The state machine is [`crate::policy::breaker::kernel`]; the distributed breaker runs it in the
//! coordinator (Lua in Redis, or the in-memory backend) and admits closed-path calls from this
//! process's view of the state (see `coordinator::breakers`); the local breaker runs it under a
//! mutex.

pub(crate) mod descriptor;
#[cfg(test)]
pub(super) mod differential;
mod distributed;
mod events;
pub(crate) mod kernel;
mod local;
#[cfg(feature = "tower")]
pub(crate) mod tower;
pub(crate) mod views;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use caracal_spec::breaker as spec;
use futures_util::FutureExt;

use crate::config::Setting;
use crate::config::overrides::{Resolved, Values};
use crate::coordinator::Coordinator;
use crate::ctx::{CallCtx, Rejection};
use crate::error::Error;
use crate::identity::{PolicyKind, Scope};
use crate::labels::At;
use crate::outcome::Outcome;
use crate::policy::breaker::kernel::{Observation, ProbeOutcome, Settings};

/// What the breaker does when the coordinator cannot answer.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnCoordinatorError {
    /// Run the body (unless the scope was last seen open or half-open).
    FailOpen,
    /// Reject with `Error::CoordinatorUnavailable`.
    FailClosed,
}

impl OnCoordinatorError {
    /// The behaviour as `on_coordinator_error` names it.
    fn name(self) -> &'static str {
        match self {
            OnCoordinatorError::FailOpen => "fail_open",
            OnCoordinatorError::FailClosed => "fail_closed",
        }
    }

    /// The behaviour `name` (one of the key's choices, already checked) names.
    fn named(name: &str) -> Self {
        if name == OnCoordinatorError::FailClosed.name() {
            OnCoordinatorError::FailClosed
        } else {
            OnCoordinatorError::FailOpen
        }
    }
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
    /// When calls count as slow, and how many slow ones open it.
    pub slow_call: Option<SlowCall>,
    /// Behaviour when the coordinator cannot answer.
    pub on_coordinator_error: OnCoordinatorError,
    /// Per-process only.
    pub local: bool,
    /// Shadow mode: a call it would refuse runs, unrecorded, and is counted.
    pub shadow: bool,
}

/// `slow_call` and `slow_call_threshold`.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlowCall {
    /// A call that takes longer counts as slow.
    pub after: Duration,
    /// Opens when slow calls / observations reach this, in [0.001, 0.999].
    pub threshold: f64,
}

/// The values of a breaker that configuration may change.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BreakerValues {
    minimum_throughput: u32,
    failure_threshold: f64,
    window_size: u32,
    window: Duration,
    open: Duration,
    half_open_probes: u32,
    half_open_successes: u32,
    probe_lease: Duration,
    slow_call: Option<SlowCall>,
    on_coordinator_error: OnCoordinatorError,
    shadow: bool,
}

impl BreakerValues {
    /// How long a call may take before it counts as slow, if any.
    fn slow_after(&self) -> Option<Duration> {
        self.slow_call.map(|slow_call| slow_call.after)
    }

    /// The settings every command carries; `local` breakers' closed state never expires.
    fn settings(&self, local: bool) -> Settings {
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
        // Thousandths, as @gkoos/caracal resolves it, so both fleets agree on the boundary.
        let permille = |fraction: f64| ((fraction * 1000.0).round() as u32).clamp(1, 999);
        Settings {
            minimum_throughput: self.minimum_throughput,
            threshold_permille: permille(self.failure_threshold),
            slow_threshold_permille: self
                .slow_call
                .map_or(0, |slow_call| permille(slow_call.threshold)),
            window_size: self.window_size,
            window_ms: millis(self.window),
            open_ms: millis(self.open),
            half_open_probes: self.half_open_probes,
            half_open_successes: self.half_open_successes,
            probe_lease_ms: millis(self.probe_lease),
            closed_expires: !local,
        }
    }
}

impl Values for BreakerValues {
    const KIND: PolicyKind = PolicyKind::CircuitBreaker;

    fn get(&self, key: &str) -> Option<Setting> {
        Some(match key {
            "minimum_throughput" => Setting::Count(self.minimum_throughput),
            "failure_threshold" => Setting::Number(self.failure_threshold),
            "window_size" => Setting::Count(self.window_size),
            "window" => Setting::Duration(self.window),
            "open" => Setting::Duration(self.open),
            "half_open_probes" => Setting::Count(self.half_open_probes),
            "half_open_successes" => Setting::Count(self.half_open_successes),
            "probe_lease" => Setting::Duration(self.probe_lease),
            "slow_call" => Setting::Duration(self.slow_call?.after),
            "slow_call_threshold" => Setting::Number(self.slow_call?.threshold),
            "on_coordinator_error" => Setting::Choice(self.on_coordinator_error.name()),
            "shadow" => Setting::Flag(self.shadow),
            _ => return None,
        })
    }

    fn set(&mut self, key: &str, setting: Setting) {
        match (key, setting) {
            ("minimum_throughput", Setting::Count(n)) => self.minimum_throughput = n,
            ("failure_threshold", Setting::Number(x)) => self.failure_threshold = x,
            ("window_size", Setting::Count(n)) => self.window_size = n,
            ("window", Setting::Duration(d)) => self.window = d,
            ("open", Setting::Duration(d)) => self.open = d,
            ("half_open_probes", Setting::Count(n)) => self.half_open_probes = n,
            ("half_open_successes", Setting::Count(n)) => self.half_open_successes = n,
            ("probe_lease", Setting::Duration(d)) => self.probe_lease = d,
            // A slow-call threshold alone changes nothing until there is a slow call.
            ("slow_call", Setting::Duration(after)) => {
                let threshold = self
                    .slow_call
                    .map_or(DEFAULT_SLOW_CALL_THRESHOLD, |s| s.threshold);
                self.slow_call = Some(SlowCall { after, threshold });
            }
            ("slow_call_threshold", Setting::Number(threshold)) => {
                if let Some(slow_call) = &mut self.slow_call {
                    slow_call.threshold = threshold;
                }
            }
            ("on_coordinator_error", Setting::Choice(choice)) => {
                self.on_coordinator_error = OnCoordinatorError::named(choice);
            }
            ("shadow", Setting::Flag(shadow)) => self.shadow = shadow,
            _ => {}
        }
    }

    fn lifetime(&self) -> Duration {
        self.window.max(self.open * 2)
    }
}

/// The slow-call threshold when `slow_call` is given alone.
pub(crate) const DEFAULT_SLOW_CALL_THRESHOLD: f64 = spec::SLOW_CALL_THRESHOLD.default.float();

/// A breaker's values before it has a site, for breakers built at run time: the spec's
/// defaults (which `caracal-macros` applies at compile time) until a setter changes them.
#[cfg(feature = "tower")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Defaults {
    pub(crate) minimum_throughput: u32,
    pub(crate) failure_threshold: f64,
    pub(crate) window_size: u32,
    /// Derived from `open` when not given.
    pub(crate) window: Option<Duration>,
    pub(crate) open: Duration,
    pub(crate) half_open_probes: u32,
    pub(crate) half_open_successes: u32,
    /// Derived from `open` when not given.
    pub(crate) probe_lease: Option<Duration>,
    pub(crate) slow_call: Option<SlowCall>,
    pub(crate) on_coordinator_error: OnCoordinatorError,
    pub(crate) shadow: bool,
}

#[cfg(feature = "tower")]
impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            minimum_throughput: spec::MINIMUM_THROUGHPUT.default.integer(),
            failure_threshold: spec::FAILURE_THRESHOLD.default.float(),
            window_size: spec::WINDOW_SIZE.default.integer(),
            window: None,
            open: spec::OPEN.default.duration(),
            half_open_probes: spec::HALF_OPEN_PROBES.default.integer(),
            half_open_successes: spec::HALF_OPEN_SUCCESSES.default.integer(),
            probe_lease: None,
            slow_call: None,
            on_coordinator_error: OnCoordinatorError::named(
                spec::ON_COORDINATOR_ERROR.default.choice(),
            ),
            shadow: spec::SHADOW.default.flag(),
        }
    }
}

#[cfg(feature = "tower")]
impl Defaults {
    /// The site's configuration.
    pub(crate) fn config(
        &self,
        name: &'static str,
        operation: &'static str,
        local: bool,
    ) -> BreakerConfig {
        BreakerConfig {
            name,
            operation,
            minimum_throughput: self.minimum_throughput,
            failure_threshold: self.failure_threshold,
            window_size: self.window_size,
            window: self
                .window
                .unwrap_or_else(|| spec::WINDOW.default.derived().apply(self.open)),
            open: self.open,
            half_open_probes: self.half_open_probes,
            half_open_successes: self.half_open_successes,
            probe_lease: self
                .probe_lease
                .unwrap_or_else(|| spec::PROBE_LEASE.default.derived().apply(self.open)),
            slow_call: self.slow_call,
            on_coordinator_error: self.on_coordinator_error,
            local,
            shadow: self.shadow,
        }
    }
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

    /// The values in force: the attribute's, with `coordinator`'s overrides applied.
    fn resolve(&self, coordinator: Option<&Coordinator>) -> Resolved<BreakerValues> {
        let config = &self.config;
        let attribute = BreakerValues {
            minimum_throughput: config.minimum_throughput,
            failure_threshold: config.failure_threshold,
            window_size: config.window_size,
            window: config.window,
            open: config.open,
            half_open_probes: config.half_open_probes,
            half_open_successes: config.half_open_successes,
            probe_lease: config.probe_lease,
            slow_call: config.slow_call,
            on_coordinator_error: config.on_coordinator_error,
            shadow: config.shadow,
        };
        Coordinator::resolve(coordinator, config.name, &attribute)
    }

    fn at<'a>(&self, scope: &'a Scope) -> At<'a> {
        At {
            policy: descriptor::DESCRIPTOR.kind.as_str(),
            name: self.config.name,
            operation: self.config.operation,
            scope: scope.as_str(),
            coordination: if self.config.local {
                "local"
            } else {
                "distributed"
            },
            shadow: false,
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
    site: &BreakerSite,
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
        crate::policy::boxed(|| distributed::run(site, ctx, scope, classify, body)).await
    }
}

/// How an admitted call turned out, as the breaker counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Verdict {
    outcome: Outcome,
    /// It took longer than the site's `slow_call`.
    slow: bool,
}

impl Verdict {
    /// The window's observation of a closed-path call; `None` when it is ignored.
    fn observation(self) -> Option<Observation> {
        let failed = match self.outcome {
            Outcome::Success => false,
            Outcome::Failure => true,
            Outcome::Ignored => return None,
        };
        Some(Observation {
            failed,
            slow: self.slow,
        })
    }

    /// A probe's result: a slow success says the downstream has not recovered, so it counts
    /// as a failure.
    fn probe_outcome(self) -> ProbeOutcome {
        match self.outcome {
            Outcome::Success if self.slow => ProbeOutcome::Failure,
            Outcome::Success => ProbeOutcome::Success,
            Outcome::Failure => ProbeOutcome::Failure,
            Outcome::Ignored => ProbeOutcome::Ignored,
        }
    }
}

/// Runs an admitted call and hands its verdict to `record`. A panic in the body is recorded
/// as a failure, then resumed: it reaches the caller as if the breaker were not there. The
/// clock is read only when the site has a `slow_call`.
async fn run_admitted<T, E, C, F>(
    slow_after: Option<Duration>,
    ctx: &CallCtx,
    classify: &C,
    body: F,
    record: impl FnOnce(Verdict),
) -> Result<T, E>
where
    C: Classify<T, E>,
    F: Future<Output = Result<T, E>>,
{
    let started = Started::now(slow_after);
    let result = AssertUnwindSafe(body).catch_unwind().await;
    started.settle(ctx, classify, result, record)
}

/// When an admitted body started, if the site has a `slow_call`: [`run_admitted`] in two
/// halves, around the body's `.await`, for a caller that awaits the body itself rather than
/// a future of its own around it.
#[derive(Clone, Copy)]
struct Started(Option<(tokio::time::Instant, Duration)>);

impl Started {
    /// The body starts now.
    #[inline]
    fn now(slow_after: Option<Duration>) -> Self {
        Started(slow_after.map(|after| (tokio::time::Instant::now(), after)))
    }

    /// Hands the verdict on the body's `result` (or panic) to `record`, then returns the
    /// result or resumes the panic.
    #[inline]
    fn settle<T, E, C: Classify<T, E>>(
        self,
        ctx: &CallCtx,
        classify: &C,
        result: std::thread::Result<Result<T, E>>,
        record: impl FnOnce(Verdict),
    ) -> Result<T, E> {
        let slow = self
            .0
            .is_some_and(|(started, after)| started.elapsed() > after);
        match result {
            Ok(result) => {
                let outcome = classify.classify(&result, ctx.rejection());
                record(Verdict { outcome, slow });
                result
            }
            Err(panic) => {
                record(Verdict {
                    outcome: Outcome::Failure,
                    slow,
                });
                std::panic::resume_unwind(panic)
            }
        }
    }
}

/// A probe slot that must be settled exactly once: by the call's outcome, or — when the call
/// is dropped first — as ignored, so the slot is free at once rather than at the end of its
/// lease.
struct ProbeSlot<S: FnOnce(ProbeOutcome)>(Option<S>);

impl<S: FnOnce(ProbeOutcome)> ProbeSlot<S> {
    fn settle(mut self, verdict: Verdict) {
        if let Some(settle) = self.0.take() {
            settle(verdict.probe_outcome());
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
