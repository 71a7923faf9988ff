//! The rate limit as a tower layer: [`RateLimitLayer`], its service [`RateLimit`], and the
//! policy that service applies.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use tower::{BoxError, Layer};

use super::{RateLimitConfig, RateLimitSite};
use crate::ctx::CallCtx;
use crate::error::Error;
use crate::guard::layer::{Identity, count, identity_setters, number};
use crate::guard::{Admission, Admit, BoxCall, Guarded};
use crate::identity::{PolicyKind, Scope};
use crate::metrics::Stopwatch;
use crate::priority::Thresholds;

/// A shared rate, like `#[rate_limit]`.
pub struct RateLimitLayer<Req> {
    identity: Identity<Req>,
    rate: Option<f64>,
    burst: u32,
    prefetch: u32,
    local: bool,
    shadow: bool,
    thresholds: Thresholds,
}

impl<Req> RateLimitLayer<Req> {
    /// The rate limit `name`; set its [`rate`](Self::rate).
    pub fn new(name: &str) -> Self {
        RateLimitLayer {
            identity: Identity::new(name),
            rate: None,
            burst: caracal_spec::rate_limit::BURST.default.integer(),
            prefetch: caracal_spec::rate_limit::PREFETCH.default.integer(),
            local: false,
            shadow: caracal_spec::SHADOW.default.flag(),
            thresholds: Thresholds::NONE,
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

    /// Emissions a request that asks the coordinator takes at once, as
    /// `#[rate_limit(prefetch = …)]`: the next requests in this process are admitted on them
    /// with no round trip while they are due (1, the default: its own only).
    ///
    /// # Panics
    ///
    /// [`layer`](Layer::layer) panics when this is more than 1 on a [`local`](Self::local)
    /// rate, as `#[rate_limit(local, prefetch = …)]` does not compile: a local rate decides
    /// in the process already, with nothing to take ahead.
    ///
    /// ```
    /// use caracal::tower::RateLimitLayer;
    ///
    /// let layer = RateLimitLayer::<()>::new("search").rate(200.0).burst(20).prefetch(4);
    /// # let _ = layer;
    /// ```
    pub fn prefetch(mut self, prefetch: u32) -> Self {
        self.prefetch = count(PolicyKind::RateLimit, "prefetch", prefetch);
        self
    }

    /// The share of the burst each class below `Critical` may use, as
    /// `#[rate_limit(thresholds(…))]`: a request is admitted only while the burst used is below
    /// [`cap`](Thresholds::cap) of its [`Priority`](crate::Priority). By default every class
    /// has the whole burst. A request's class comes from
    /// [`PriorityLayer`](crate::tower::PriorityLayer) above this layer.
    ///
    /// ```
    /// use caracal::Thresholds;
    /// use caracal::tower::RateLimitLayer;
    ///
    /// let shares = Thresholds::new(0.8, 0.5)?;
    /// let layer = RateLimitLayer::<()>::new("search").rate(200.0).burst(20).thresholds(shares);
    /// # let _ = layer;
    /// # Ok::<(), caracal::Error>(())
    /// ```
    pub fn thresholds(mut self, thresholds: Thresholds) -> Self {
        self.thresholds = thresholds;
        self
    }

    /// Shadow mode, as `#[rate_limit(shadow = true)]`: a request over the rate runs anyway,
    /// uncharged, and is counted as `would_reject`.
    ///
    /// ```
    /// use caracal::tower::RateLimitLayer;
    ///
    /// let layer = RateLimitLayer::<()>::new("search").rate(200.0).shadow(true);
    /// # let _ = layer;
    /// ```
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
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
pub type RateLimit<S, Req> = Guarded<S, RateLimitPolicy<Req>>;

impl<S, Req> Layer<S> for RateLimitLayer<Req> {
    type Service = RateLimit<S, Req>;

    fn layer(&self, inner: S) -> Self::Service {
        let rate = self.rate.unwrap_or_else(|| {
            panic!(
                "caracal::tower: RateLimitLayer `{}` needs a rate: call `.rate(per_second)`",
                self.identity.name
            )
        });
        assert!(
            !(self.local && self.prefetch > 1),
            "caracal::tower: RateLimitLayer `{}` is local: it takes no `prefetch`",
            self.identity.name
        );
        let site = RateLimitSite::new(RateLimitConfig {
            name: self.identity.name,
            operation: self.identity.operation(),
            rate,
            burst: self.burst,
            prefetch: self.prefetch,
            local: self.local,
            shadow: self.shadow,
            thresholds: self.thresholds,
        });
        let policy = RateLimitPolicy {
            site: Arc::new(site),
            identity: self.identity.clone(),
        };
        Guarded::new(inner, policy)
    }
}

/// What a [`RateLimit`] service applies: its site, and the request's scope.
pub struct RateLimitPolicy<Req> {
    site: Arc<RateLimitSite>,
    identity: Identity<Req>,
}

impl<Req> fmt::Debug for RateLimitPolicy<Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitPolicy")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// A local rate decides at once, and an admission holds nothing (the charge is never
/// refunded); a distributed one asks the coordinator.
impl<Req: 'static, Res: Send + 'static> Admit<Req, Res> for RateLimitPolicy<Req> {
    type Permit = ();
    type Deferred = Result<Scope, Error>;

    fn admit(&self, req: &Req) -> Admission<(), Self::Deferred> {
        let arrival = Stopwatch::start();
        let scope = match self.identity.scope(req) {
            Ok(scope) => scope,
            Err(error) => return Admission::Rejected(error),
        };
        match self.site.decide_locally(&scope) {
            Some(decision) => match self.site.settle(&scope, decision, arrival) {
                Ok(()) => Admission::Admitted(()),
                Err(error) => Admission::Rejected(error),
            },
            None => Admission::Deferred(Ok(scope)),
        }
    }

    fn guard<F>(&self, scope: Self::Deferred, call: F) -> BoxCall<Res>
    where
        F: Future<Output = Result<Res, BoxError>> + Send + 'static,
    {
        let site = Arc::clone(&self.site);
        Box::pin(async move { super::rate_limit(&site, CallCtx::unread(), &scope, call).await })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use tower::{Service, ServiceBuilder, ServiceExt};

    use super::*;
    use crate::coordinator::Coordinator;
    use crate::guard::tests::{Request, caracal_error, downstream, request};
    use crate::tower::CircuitBreakerLayer;

    #[tokio::test(start_paused = true)]
    async fn an_inner_layers_rejections_do_not_open_an_outer_breaker() {
        let coordinator = Coordinator::in_memory();
        coordinator
            .scoped(async {
                let calls = Arc::new(AtomicU32::new(0));
                let mut service = ServiceBuilder::new()
                    .layer(CircuitBreakerLayer::new("tower-outer").minimum_throughput(2))
                    .layer(RateLimitLayer::new("tower-inner").rate(0.001))
                    .service(downstream(None, Arc::clone(&calls)));
                assert_eq!(
                    service
                        .ready()
                        .await
                        .unwrap()
                        .call(request("a", 200))
                        .await
                        .unwrap(),
                    200
                );
                for _ in 0..10 {
                    let error = service
                        .ready()
                        .await
                        .unwrap()
                        .call(request("a", 200))
                        .await
                        .expect_err("rate limited");
                    assert!(
                        matches!(caracal_error(&error), Some(Error::RateLimited { .. })),
                        "{error:?}: the breaker stayed closed"
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_scope_the_request_makes_invalid_fails_that_request() {
        let coordinator = Coordinator::in_memory();
        coordinator
            .scoped(async {
                let service = ServiceBuilder::new()
                    .layer(
                        RateLimitLayer::new("tower-scope")
                            .rate(10.0)
                            .scope(|req: &Request| req.tenant),
                    )
                    .service(downstream(None, Arc::new(AtomicU32::new(0))));
                let error = service.oneshot(request(" ", 200)).await.unwrap_err();
                assert!(
                    matches!(caracal_error(&error), Some(Error::InvalidScope { .. })),
                    "{error:?}"
                );
            })
            .await;
    }

    #[test]
    #[should_panic(expected = "is local: it takes no `prefetch`")]
    fn a_local_rate_with_prefetch_is_refused_as_the_attribute_is() {
        let layer = RateLimitLayer::<Request>::new("tower-local-prefetch")
            .rate(10.0)
            .local()
            .prefetch(4);
        let _ = layer.layer(downstream(None, Arc::new(AtomicU32::new(0))));
    }

    #[tokio::test]
    async fn a_local_rate_decides_in_the_call_and_answers_with_the_inner_future() {
        let calls = Arc::new(AtomicU32::new(0));
        let mut service = ServiceBuilder::new()
            .layer(RateLimitLayer::new("tower-local-rate").rate(0.001).local())
            .service(downstream(None, Arc::clone(&calls)));
        let admitted = service.ready().await.unwrap().call(request("a", 200));
        assert!(
            format!("{admitted:?}").contains("admitted"),
            "{admitted:?}: not boxed"
        );
        assert_eq!(admitted.await.unwrap(), 200);
        let error = service
            .ready()
            .await
            .unwrap()
            .call(request("a", 200))
            .await
            .expect_err("rate limited");
        assert!(
            matches!(caracal_error(&error), Some(Error::RateLimited { .. })),
            "{error:?}"
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "the rejected request never ran"
        );
    }
}
