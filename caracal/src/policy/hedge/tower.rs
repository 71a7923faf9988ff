//! `#[hedge]` as a tower layer: each request that stays unanswered for `delay` is sent again
//! beside the first (a clone of it, to a clone of the service), the first `Ok` answered.
//!
//! Not a [`Guarded`](crate::guard::Guarded) service: that one admits a request once and
//! releases a permit when it completes, while a hedge calls its inner service several times
//! per request, so it is a service of its own over the same runtime as the attribute.

use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use caracal_spec::hedge as spec;
use tower::{BoxError, Layer, Service, ServiceExt};

use super::{Delay, HedgeConfig, HedgeSite, hedge};
use crate::ctx::CallCtx;
use crate::guard::BoxCall;
use crate::identity::{FunctionIdentity, Scope, intern};
use crate::sync::lock;

/// Hedges the requests of the service it wraps, like `#[hedge]` (same defaults; the identity
/// `name`, operation = name, scope global): the request must be `Clone`, and the inner
/// service too, each attempt going to a clone of it.
///
/// Each service the layer makes (each [`Layer::layer`] call) keeps a call site of its own
/// for the program's life, as an attribute's is compiled in, and resolves its `budget` once:
/// build the stack at start-up and clone the service, rather than layering one per request
/// or connection, which would leak a site and repeat the budget's look-up each time.
///
/// ```
/// use std::time::Duration;
/// use caracal::tower::HedgeLayer;
/// use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower::BoxError> {
/// let mut service = ServiceBuilder::new()
///     .layer(HedgeLayer::new("partner-api").delay(Duration::from_millis(50)).max_extra(1))
///     .service(service_fn(|id: u64| async move { Ok::<_, std::io::Error>(id) }));
/// assert_eq!(service.ready().await?.call(7).await?, 7);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct HedgeLayer {
    name: &'static str,
    delay: Duration,
    max_extra: u32,
    budget: Option<&'static str>,
}

impl HedgeLayer {
    /// The hedge `name`, with the attribute's defaults but for `delay`, which
    /// [`delay`](Self::delay) sets (50 ms until then).
    ///
    /// # Panics
    /// On a `name` that is no valid identity part.
    pub fn new(name: &str) -> Self {
        HedgeLayer {
            name: intern(name),
            delay: Duration::from_millis(50),
            max_extra: spec::MAX_EXTRA.default.integer(),
            budget: None,
        }
    }

    /// How long a request goes unanswered before the next attempt.
    ///
    /// # Panics
    /// Outside the attribute's bounds, as every setter.
    pub fn delay(mut self, delay: Duration) -> Self {
        let caracal_spec::Type::Duration { min, max } = spec::DELAY.ty else {
            unreachable!("a duration key")
        };
        assert!(
            (min..=max).contains(&delay),
            "`delay` must be from {} to {}",
            caracal_spec::Human(min),
            caracal_spec::Human(max)
        );
        self.delay = delay;
        self
    }

    /// Extra attempts at most, 1 to 3.
    pub fn max_extra(mut self, max_extra: u32) -> Self {
        let caracal_spec::Type::Integer { min, max } = spec::MAX_EXTRA.ty else {
            unreachable!("an integer key")
        };
        assert!(
            (min..=max).contains(&max_extra),
            "`max_extra` must be an integer from {min} to {max}"
        );
        self.max_extra = max_extra;
        self
    }

    /// The retry budget each extra attempt withdraws from (see `#[hedge]`'s `budget`).
    ///
    /// # Panics
    /// On a `budget` that is no valid identity part, as [`new`](Self::new) on its name.
    pub fn budget(mut self, budget: &str) -> Self {
        self.budget = Some(intern(budget));
        self
    }
}

impl<S> Layer<S> for HedgeLayer {
    type Service = Hedge<S>;

    fn layer(&self, inner: S) -> Hedge<S> {
        Hedge {
            inner,
            layer: self.clone(),
            site: Arc::new(OnceLock::new()),
        }
    }
}

/// The service [`HedgeLayer`] makes.
#[derive(Debug, Clone)]
pub struct Hedge<S> {
    inner: S,
    layer: HedgeLayer,
    /// The site, made on the first request (the settings are final then), shared by clones.
    site: Arc<OnceLock<&'static HedgeSite>>,
}

impl<S> Hedge<S> {
    fn site(&self) -> &'static HedgeSite {
        let layer = &self.layer;
        // One site per layer, for the program's life: layers are made at start-up, as an
        // attribute's site is compiled in.
        self.site.get_or_init(|| {
            Box::leak(Box::new(HedgeSite::new(HedgeConfig {
                identity: FunctionIdentity {
                    function: layer.name,
                    name: layer.name,
                    operation: layer.name,
                },
                delay: Delay::Fixed(layer.delay),
                max_extra: layer.max_extra,
                budget: layer.budget,
                local: false,
            })))
        })
    }
}

impl<S, Req> Service<Req> for Hedge<S>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send,
    S::Error: Into<BoxError>,
    Req: Clone + Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxCall<S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let site = self.site();
        // The first attempt takes the service made ready (tower's way: a clone stays here);
        // the extras go to clones of it, each readied by `oneshot`.
        let spare = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, spare.clone());
        Box::pin(async move {
            let ctx = CallCtx::new();
            // Behind a lock, so the future is `Send` for any `Send` service and request.
            let parts = Mutex::new((Some(ready), spare, request));
            hedge(site, &ctx, &Ok(Scope::GLOBAL), || {
                let (service, request) = {
                    let mut parts = lock(&parts);
                    let (ready, spare, request) = &mut *parts;
                    (
                        ready.take().unwrap_or_else(|| spare.clone()),
                        request.clone(),
                    )
                };
                async move { service.oneshot(request).await.map_err(Into::into) }
            })
            .await
        })
    }
}
