//! [`tower`] layers: the bulkhead, circuit breaker and rate limit as middleware for axum,
//! tonic, hyper and any other `tower::Service`, on the same runtime and identities as the
//! attributes — a layer and an attribute with the same kind, name, operation and scope share one
//! budget, breaker or rate.
//!
//! Each layer is built at run time with `::new(name)` and methods named like the attribute's
//! arguments, with the attribute's defaults (operation = name, scope `global`). The scope can
//! come from the request. The services' error is [`tower::BoxError`]; a rejection is a boxed
//! [`caracal::Error`](Error) (downcast it to tell which).
//!
//! ```
//! use std::time::Duration;
//! use caracal::tower::{BulkheadLayer, CircuitBreakerLayer, RateLimitLayer};
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//!
//! struct Request {
//!     tenant: String,
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower::BoxError> {
//! caracal::install(caracal::Coordinator::in_memory())?;
//! let mut service = ServiceBuilder::new()
//!     .layer(CircuitBreakerLayer::new("partner-api").failure_threshold(0.25).open(Duration::from_secs(10)))
//!     .layer(BulkheadLayer::new("partner-api").limit(20).scope(|req: &Request| req.tenant.clone()))
//!     .layer(RateLimitLayer::new("partner-api").rate(100.0).burst(10))
//!     .service(service_fn(|req: Request| async move {
//!         Ok::<_, std::io::Error>(format!("hello, {}", req.tenant))
//!     }));
//! let request = Request { tenant: "acme".to_owned() };
//! assert_eq!(service.ready().await?.call(request).await?, "hello, acme");
//! # Ok(())
//! # }
//! ```
//!
//! # Panics
//!
//! The setters panic on a value the attribute would reject at compile time (`limit(0)`, a
//! `failure_threshold` of 50): layers are built once, at start-up, from values in the code or
//! checked configuration. A layer used without its required value (`limit`, `rate`) panics when
//! it wraps a service.

use std::fmt::{self, Display};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::{BoxError, Layer, Service};

use crate::config::Setting;
use crate::config::keys::{self, Read as _};
use crate::ctx::CallCtx;
use crate::identity::{PolicyKind, Scope, check_part, intern};
use crate::policy::breaker::{self, BreakerConfig, BreakerSite, OnCoordinatorError, SlowCall};
use crate::policy::bulkhead::{self, BulkheadConfig, BulkheadSite};
use crate::policy::rate_limit::{self, RateLimitConfig, RateLimitSite};
use crate::{Error, Outcome};

/// The scope of a request: a function of it, or the default.
type ScopeOf<Req> = Option<Arc<dyn Fn(&Req) -> Result<Scope, Error> + Send + Sync>>;

/// The future the services return.
type Respond<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

/// Checks `setting` as the attribute checks `key` of `kind`; panics otherwise (see the
/// module's docs).
fn checked(kind: PolicyKind, key: &str, setting: Setting) -> Setting {
    let checked = keys::find(kind, key).and_then(|spec| spec.check(setting));
    checked.unwrap_or_else(|why| panic!("caracal::tower: `{key}` of `{kind}`: {why}"))
}

fn count(kind: PolicyKind, key: &str, n: u32) -> u32 {
    match checked(kind, key, Setting::Count(n)) {
        Setting::Count(n) => n,
        _ => unreachable!("a count stays a count"),
    }
}

fn number(kind: PolicyKind, key: &str, x: f64) -> f64 {
    match checked(kind, key, Setting::Number(x)) {
        Setting::Number(x) => x,
        _ => unreachable!("a number stays a number"),
    }
}

fn duration(kind: PolicyKind, key: &str, d: Duration) -> Duration {
    match checked(kind, key, Setting::Duration(d)) {
        Setting::Duration(d) => d,
        _ => unreachable!("a duration stays a duration"),
    }
}

/// A name or operation, checked and made `'static` (each distinct one is kept once for the
/// life of the process, as attribute names are).
fn part(what: &str, value: &str) -> &'static str {
    check_part(value).unwrap_or_else(|why| panic!("caracal::tower: the {what} {why}"));
    intern(value)
}

/// What every layer has: its identity's name and operation, and the request's scope.
struct Identity<Req> {
    name: &'static str,
    operation: Option<&'static str>,
    scope: ScopeOf<Req>,
}

impl<Req> Clone for Identity<Req> {
    fn clone(&self) -> Self {
        Identity {
            name: self.name,
            operation: self.operation,
            scope: self.scope.clone(),
        }
    }
}

impl<Req> Identity<Req> {
    fn new(name: &str) -> Self {
        Identity {
            name: part("name", name),
            operation: None,
            scope: None,
        }
    }

    fn operation(&self) -> &'static str {
        self.operation.unwrap_or(self.name)
    }

    fn scope_of<D: Display>(f: impl Fn(&Req) -> D + Send + Sync + 'static) -> ScopeOf<Req> {
        Some(Arc::new(move |req: &Req| Scope::new(f(req).to_string())))
    }

    fn scope(&self, req: &Req) -> Result<Scope, Error> {
        match &self.scope {
            Some(scope) => scope(req),
            None => Ok(Scope::GLOBAL),
        }
    }
}

impl<Req> fmt::Debug for Identity<Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("name", &self.name)
            .field("operation", &self.operation())
            .field("scoped", &self.scope.is_some())
            .finish()
    }
}

/// Takes the ready service out of `inner`, leaving a clone that has not been polled (tower's
/// usual way to move a service into a future).
fn take_ready<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}

macro_rules! identity_setters {
    () => {
        /// The operation (by default, the name).
        pub fn operation(mut self, operation: &str) -> Self {
            self.identity.operation = Some(part("operation", operation));
            self
        }

        /// The scope of a request (by default, `global`): every distinct value has its own
        /// state. A value that is blank or longer than 1024 bytes fails the call with
        /// [`Error::InvalidScope`].
        pub fn scope<D: Display>(
            mut self,
            scope: impl Fn(&Req) -> D + Send + Sync + 'static,
        ) -> Self {
            self.identity.scope = Identity::scope_of(scope);
            self
        }

        /// Per-process only: the state is this process's, the coordinator is never asked.
        pub fn local(mut self) -> Self {
            self.local = true;
            self
        }
    };
}

/// A shared concurrency limit, like `#[bulkhead]`.
pub struct BulkheadLayer<Req> {
    identity: Identity<Req>,
    limit: Option<u32>,
    lease: Duration,
    max_wait: Option<Duration>,
    local: bool,
}

impl<Req> BulkheadLayer<Req> {
    /// The bulkhead `name`; set its [`limit`](Self::limit).
    pub fn new(name: &str) -> Self {
        BulkheadLayer {
            identity: Identity::new(name),
            limit: None,
            lease: caracal_spec::bulkhead::LEASE.default.duration(),
            max_wait: None,
            local: false,
        }
    }

    /// At most this many requests at once per identity, across every process.
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = Some(count(PolicyKind::Bulkhead, "limit", limit));
        self
    }

    /// The lease's time to live (30 s by default).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = duration(PolicyKind::Bulkhead, "lease", lease);
        self
    }

    /// Wait up to this long for a slot before rejecting (by default, reject at once).
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(duration(PolicyKind::Bulkhead, "max_wait", max_wait));
        self
    }

    identity_setters!();
}

impl<Req> Clone for BulkheadLayer<Req> {
    fn clone(&self) -> Self {
        BulkheadLayer {
            identity: self.identity.clone(),
            ..*self
        }
    }
}

impl<Req> fmt::Debug for BulkheadLayer<Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkheadLayer")
            .field("identity", &self.identity)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// A service behind a [`BulkheadLayer`].
pub struct Bulkhead<S, Req> {
    inner: S,
    site: Arc<BulkheadSite>,
    identity: Identity<Req>,
}

impl<S, Req> Layer<S> for BulkheadLayer<Req> {
    type Service = Bulkhead<S, Req>;

    fn layer(&self, inner: S) -> Self::Service {
        let limit = self.limit.unwrap_or_else(|| {
            panic!(
                "caracal::tower: BulkheadLayer `{}` needs a limit: call `.limit(n)`",
                self.identity.name
            )
        });
        let site = BulkheadSite::new(BulkheadConfig {
            name: self.identity.name,
            operation: self.identity.operation(),
            limit,
            lease: self.lease,
            max_wait: self.max_wait,
            local: self.local,
        });
        Bulkhead {
            inner,
            site: Arc::new(site),
            identity: self.identity.clone(),
        }
    }
}

impl<S: Clone, Req> Clone for Bulkhead<S, Req> {
    fn clone(&self) -> Self {
        Bulkhead {
            inner: self.inner.clone(),
            site: Arc::clone(&self.site),
            identity: self.identity.clone(),
        }
    }
}

impl<S, Req> Service<Req> for Bulkhead<S, Req>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    S::Response: Send + 'static,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Respond<S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let mut inner = take_ready(&mut self.inner);
        let site = Arc::clone(&self.site);
        let scope = self.identity.scope(&req);
        Box::pin(async move {
            let body = async move { inner.call(req).await.map_err(Into::into) };
            bulkhead::bulkhead(&site, &CallCtx::new(), &scope, body).await
        })
    }
}

/// A shared failure window, like `#[circuit_breaker]`.
pub struct CircuitBreakerLayer<Req, Res> {
    identity: Identity<Req>,
    config: breaker::Defaults,
    classify: Classifier<Res>,
    local: bool,
}

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
            config: breaker::Defaults::default(),
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
            .map_or(breaker::DEFAULT_SLOW_CALL_THRESHOLD, |slow| slow.threshold);
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
pub struct CircuitBreaker<S, Req, Res> {
    inner: S,
    site: Arc<BreakerSite>,
    identity: Identity<Req>,
    classify: Classifier<Res>,
}

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
        CircuitBreaker {
            inner,
            site: Arc::new(BreakerSite::new(config)),
            identity: self.identity.clone(),
            classify: Arc::clone(&self.classify),
        }
    }
}

impl<S: Clone, Req, Res> Clone for CircuitBreaker<S, Req, Res> {
    fn clone(&self) -> Self {
        CircuitBreaker {
            inner: self.inner.clone(),
            site: Arc::clone(&self.site),
            identity: self.identity.clone(),
            classify: Arc::clone(&self.classify),
        }
    }
}

impl<S, Req, Res> Service<Req> for CircuitBreaker<S, Req, Res>
where
    S: Service<Req, Response = Res> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    Res: Send + 'static,
    Req: Send + 'static,
{
    type Response = Res;
    type Error = BoxError;
    type Future = Respond<Res>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let mut inner = take_ready(&mut self.inner);
        let site = Arc::clone(&self.site);
        let classify = Arc::clone(&self.classify);
        let scope = self.identity.scope(&req);
        Box::pin(async move {
            let body = async move { inner.call(req).await.map_err(Into::into) };
            let classify = move |result: &Result<Res, BoxError>| classify(result);
            breaker::circuit_breaker(&site, &CallCtx::new(), &scope, classify, body).await
        })
    }
}

/// A shared rate, like `#[rate_limit]`.
pub struct RateLimitLayer<Req> {
    identity: Identity<Req>,
    rate: Option<f64>,
    burst: u32,
    local: bool,
}

impl<Req> RateLimitLayer<Req> {
    /// The rate limit `name`; set its [`rate`](Self::rate).
    pub fn new(name: &str) -> Self {
        RateLimitLayer {
            identity: Identity::new(name),
            rate: None,
            burst: caracal_spec::rate_limit::BURST.default.integer(),
            local: false,
        }
    }

    /// Admissions per second, fleet-wide (`0.5`: one every 2 s).
    pub fn rate(mut self, rate: f64) -> Self {
        self.rate = Some(number(PolicyKind::RateLimit, "rate", rate));
        self
    }

    /// How many may be admitted at once after idle time (1).
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = count(PolicyKind::RateLimit, "burst", burst);
        self
    }

    identity_setters!();
}

impl<Req> Clone for RateLimitLayer<Req> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            identity: self.identity.clone(),
            ..*self
        }
    }
}

impl<Req> fmt::Debug for RateLimitLayer<Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("identity", &self.identity)
            .field("rate", &self.rate)
            .field("burst", &self.burst)
            .finish_non_exhaustive()
    }
}

/// A service behind a [`RateLimitLayer`].
pub struct RateLimit<S, Req> {
    inner: S,
    site: Arc<RateLimitSite>,
    identity: Identity<Req>,
}

impl<S, Req> Layer<S> for RateLimitLayer<Req> {
    type Service = RateLimit<S, Req>;

    fn layer(&self, inner: S) -> Self::Service {
        let rate = self.rate.unwrap_or_else(|| {
            panic!(
                "caracal::tower: RateLimitLayer `{}` needs a rate: call `.rate(per_second)`",
                self.identity.name
            )
        });
        let site = RateLimitSite::new(RateLimitConfig {
            name: self.identity.name,
            operation: self.identity.operation(),
            rate,
            burst: self.burst,
            local: self.local,
        });
        RateLimit {
            inner,
            site: Arc::new(site),
            identity: self.identity.clone(),
        }
    }
}

impl<S: Clone, Req> Clone for RateLimit<S, Req> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            site: Arc::clone(&self.site),
            identity: self.identity.clone(),
        }
    }
}

impl<S, Req> Service<Req> for RateLimit<S, Req>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    S::Response: Send + 'static,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Respond<S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let mut inner = take_ready(&mut self.inner);
        let site = Arc::clone(&self.site);
        let scope = self.identity.scope(&req);
        Box::pin(async move {
            let body = async move { inner.call(req).await.map_err(Into::into) };
            rate_limit::rate_limit(&site, &CallCtx::new(), &scope, body).await
        })
    }
}

impl<S: fmt::Debug, Req> fmt::Debug for Bulkhead<S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bulkhead")
            .field("inner", &self.inner)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl<S: fmt::Debug, Req, Res> fmt::Debug for CircuitBreaker<S, Req, Res> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("inner", &self.inner)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl<S: fmt::Debug, Req> fmt::Debug for RateLimit<S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
