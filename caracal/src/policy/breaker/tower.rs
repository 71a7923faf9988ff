//! The circuit breaker as a tower layer: [`CircuitBreakerLayer`], its service
//! [`CircuitBreaker`], and the policy that service applies.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tower::{BoxError, Layer};

use super::{
    BreakerConfig, BreakerSite, DEFAULT_SLOW_CALL_THRESHOLD, Defaults, OnCoordinatorError, SlowCall,
};
use crate::config::Setting;
use crate::config::keys::{self, Read as _};
use crate::ctx::CallCtx;
use crate::error::Error;
use crate::guard::layer::{Identity, count, duration, identity_setters, number};
use crate::guard::{Admission, Admit, BoxCall, Guarded};
use crate::identity::{PolicyKind, Scope};
use crate::outcome::Outcome;

/// A shared failure window, like `#[circuit_breaker]`.
pub struct CircuitBreakerLayer<Req, Res> {
    identity: Identity<Req>,
    config: Defaults,
    classify: Classifier<Res>,
    local: bool,
}

/// How a [`CircuitBreakerLayer`] counts a result.
type Classifier<Res> = Arc<dyn Fn(&Result<Res, BoxError>) -> Outcome + Send + Sync>;

/// The default verdict: a response is a success, an error a failure — except caracal's own
/// rejections by an inner layer (a full bulkhead, a rate limit, an open breaker, a coordinator
/// outage), which say nothing about the downstream and are ignored; a timeout or a lost lease
/// did cut a started request short and is a failure.
fn classify_by_result<Res>(result: &Result<Res, BoxError>) -> Outcome {
    match result {
        Ok(_) => Outcome::Success,
        Err(error) => match error.downcast_ref::<Error>() {
            Some(Error::Timeout { .. } | Error::LeaseLost { .. }) | None => Outcome::Failure,
            Some(_) => Outcome::Ignored,
        },
    }
}

impl<Req, Res: 'static> CircuitBreakerLayer<Req, Res> {
    /// The breaker `name`, with the attribute's defaults.
    pub fn new(name: &str) -> Self {
        CircuitBreakerLayer {
            identity: Identity::new(name),
            config: Defaults::default(),
            classify: Arc::new(classify_by_result::<Res>),
            local: false,
        }
    }

    /// Observations needed before it may open (20).
    pub fn minimum_throughput(mut self, n: u32) -> Self {
        self.config.minimum_throughput = count(PolicyKind::CircuitBreaker, "minimum_throughput", n);
        self
    }

    /// Opens when failures / observations reach this (0.5), from 0.001 to 0.999.
    pub fn failure_threshold(mut self, threshold: f64) -> Self {
        self.config.failure_threshold =
            number(PolicyKind::CircuitBreaker, "failure_threshold", threshold);
        self
    }

    /// The window holds at most this many latest observations (100).
    pub fn window_size(mut self, n: u32) -> Self {
        self.config.window_size = count(PolicyKind::CircuitBreaker, "window_size", n);
        self
    }

    /// Observations older than this leave the window (`max(3 × open, 60s)`).
    pub fn window(mut self, window: Duration) -> Self {
        self.config.window = Some(duration(PolicyKind::CircuitBreaker, "window", window));
        self
    }

    /// How long it stays open before probing (30 s).
    pub fn open(mut self, open: Duration) -> Self {
        self.config.open = duration(PolicyKind::CircuitBreaker, "open", open);
        self
    }

    /// Concurrent probes allowed fleet-wide while half-open (3).
    pub fn half_open_probes(mut self, n: u32) -> Self {
        self.config.half_open_probes = count(PolicyKind::CircuitBreaker, "half_open_probes", n);
        self
    }

    /// Probe successes needed to close (2).
    pub fn half_open_successes(mut self, n: u32) -> Self {
        self.config.half_open_successes =
            count(PolicyKind::CircuitBreaker, "half_open_successes", n);
        self
    }

    /// A probe that never settles frees its slot after this (`2 × open`).
    pub fn probe_lease(mut self, lease: Duration) -> Self {
        self.config.probe_lease = Some(duration(PolicyKind::CircuitBreaker, "probe_lease", lease));
        self
    }

    /// A request that takes longer counts as slow (by default none does).
    pub fn slow_call(mut self, after: Duration) -> Self {
        let after = duration(PolicyKind::CircuitBreaker, "slow_call", after);
        let threshold = self
            .config
            .slow_call
            .map_or(DEFAULT_SLOW_CALL_THRESHOLD, |slow| slow.threshold);
        self.config.slow_call = Some(SlowCall { after, threshold });
        self
    }

    /// With [`slow_call`](Self::slow_call): opens when slow requests / observations reach
    /// this (0.5).
    ///
    /// # Panics
    /// Without a `slow_call` set before it, as the attribute refuses it.
    pub fn slow_call_threshold(mut self, threshold: f64) -> Self {
        let threshold = number(PolicyKind::CircuitBreaker, "slow_call_threshold", threshold);
        match &mut self.config.slow_call {
            Some(slow) => slow.threshold = threshold,
            None => panic!("caracal::tower: `slow_call_threshold` needs `slow_call` first"),
        }
        self
    }

    /// `"fail_open"` (the default: the request runs, unrecorded) or `"fail_closed"` (rejected
    /// with [`Error::CoordinatorUnavailable`]): what happens when the coordinator cannot
    /// answer.
    pub fn on_coordinator_error(mut self, behaviour: &str) -> Self {
        let chosen = keys::find(PolicyKind::CircuitBreaker, "on_coordinator_error")
            .and_then(|key| key.read_text(behaviour));
        self.config.on_coordinator_error = match chosen {
            Ok(Setting::Choice("fail_closed")) => OnCoordinatorError::FailClosed,
            Ok(_) => OnCoordinatorError::FailOpen,
            Err(why) => panic!("caracal::tower: `on_coordinator_error`: {why}"),
        };
        self
    }

    /// Shadow mode, as `#[circuit_breaker(shadow = true)]`: a request the breaker would refuse
    /// runs anyway, unrecorded (the breaker evolves as if it had been refused), and is counted
    /// as `would_reject`.
    ///
    /// ```
    /// use caracal::tower::CircuitBreakerLayer;
    ///
    /// let layer = CircuitBreakerLayer::<(), ()>::new("partner-api").shadow(true);
    /// # let _ = layer;
    /// ```
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.config.shadow = shadow;
        self
    }

    /// How a result counts: for example, an HTTP 5xx response as a failure.
    pub fn classify(
        mut self,
        classify: impl Fn(&Result<Res, BoxError>) -> Outcome + Send + Sync + 'static,
    ) -> Self {
        self.classify = Arc::new(classify);
        self
    }

    identity_setters!();
}

impl<Req, Res> Clone for CircuitBreakerLayer<Req, Res> {
    fn clone(&self) -> Self {
        CircuitBreakerLayer {
            identity: self.identity.clone(),
            config: self.config,
            classify: Arc::clone(&self.classify),
            local: self.local,
        }
    }
}

impl<Req, Res> fmt::Debug for CircuitBreakerLayer<Req, Res> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreakerLayer")
            .field("identity", &self.identity)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A service behind a [`CircuitBreakerLayer`].
pub type CircuitBreaker<S, Req, Res> = Guarded<S, CircuitBreakerPolicy<Req, Res>>;

impl<S, Req, Res> Layer<S> for CircuitBreakerLayer<Req, Res> {
    type Service = CircuitBreaker<S, Req, Res>;

    fn layer(&self, inner: S) -> Self::Service {
        if self.config.minimum_throughput > self.config.window_size {
            panic!(
                "caracal::tower: CircuitBreakerLayer `{}`: minimum_throughput ({}) is larger than window_size ({}): the breaker could never open",
                self.identity.name, self.config.minimum_throughput, self.config.window_size
            );
        }
        let config: BreakerConfig =
            self.config
                .config(self.identity.name, self.identity.operation(), self.local);
        let policy = CircuitBreakerPolicy {
            site: Arc::new(BreakerSite::new(config)),
            identity: self.identity.clone(),
            classify: Arc::clone(&self.classify),
        };
        Guarded::new(inner, policy)
    }
}

/// What a [`CircuitBreaker`] service applies: its site, the request's scope, and how a
/// result counts.
pub struct CircuitBreakerPolicy<Req, Res> {
    site: Arc<BreakerSite>,
    identity: Identity<Req>,
    classify: Classifier<Res>,
}

impl<Req, Res> fmt::Debug for CircuitBreakerPolicy<Req, Res> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreakerPolicy")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// Every decision goes through the attribute's path, which records the outcome (a panic as a
/// failure) around the call.
impl<Req: 'static, Res: Send + 'static> Admit<Req, Res> for CircuitBreakerPolicy<Req, Res> {
    type Permit = std::convert::Infallible;
    type Deferred = Result<Scope, Error>;

    fn admit(&self, req: &Req) -> Admission<Self::Permit, Self::Deferred> {
        Admission::Deferred(self.identity.scope(req))
    }

    fn guard<F>(&self, scope: Self::Deferred, call: F) -> BoxCall<Res>
    where
        F: Future<Output = Result<Res, BoxError>> + Send + 'static,
    {
        let site = Arc::clone(&self.site);
        let classify = Arc::clone(&self.classify);
        Box::pin(async move {
            let classify = move |result: &Result<Res, BoxError>| classify(result);
            super::circuit_breaker(&site, CallCtx::unread(), &scope, classify, call).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_take_the_attributes_defaults() {
        use caracal_spec::breaker as spec;
        let layer = CircuitBreakerLayer::<(), u16>::new("defaults").open(Duration::from_secs(1));
        let config = layer.config.config("defaults", "defaults", false);
        assert_eq!(config.window, Duration::from_secs(60), "max(3 × open, 60s)");
        assert_eq!(config.probe_lease, Duration::from_secs(2), "2 × open");
        assert_eq!(
            (
                config.minimum_throughput,
                config.window_size,
                config.half_open_probes
            ),
            (
                spec::MINIMUM_THROUGHPUT.default.integer(),
                spec::WINDOW_SIZE.default.integer(),
                spec::HALF_OPEN_PROBES.default.integer()
            )
        );
    }
}
