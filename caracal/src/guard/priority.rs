//! [`PriorityLayer`]: each request's [`Priority`], chosen from the request, for every layer and
//! service below it.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::{Layer, Service};

use crate::priority::{self, Priority, Scoped};

/// Gives each request the [`Priority`] a function of it chooses (a header, a route, the
/// caller), as [`caracal::with_priority`](crate::with_priority) gives a call its own: the
/// bulkhead and rate limit layers below it decide by that class, and the inner service runs
/// with it (`Priority::current()`), so the attributes it calls inherit it.
///
/// Put it above the layers it classes requests for: they decide when they are called, or in
/// the future they return, and both run with the request's priority.
///
/// ```
/// use caracal::tower::{BulkheadLayer, PriorityLayer};
/// use caracal::{Priority, Thresholds};
/// use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
///
/// struct Request {
///     checkout: bool,
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower::BoxError> {
/// caracal::install(caracal::Coordinator::in_memory())?;
/// let mut service = ServiceBuilder::new()
///     .layer(PriorityLayer::new(|req: &Request| {
///         if req.checkout { Priority::Critical } else { Priority::Sheddable }
///     }))
///     .layer(BulkheadLayer::new("partner-api").limit(30).thresholds(Thresholds::new(0.8, 0.5)?))
///     .service(service_fn(|_: Request| async { Ok::<_, std::io::Error>(Priority::current()) }));
/// let seen = service.ready().await?.call(Request { checkout: true }).await?;
/// assert_eq!(seen, Priority::Critical);
/// # Ok(())
/// # }
/// ```
pub struct PriorityLayer<F> {
    of: Arc<F>,
}

impl<F> PriorityLayer<F> {
    /// Each request's priority is `of(&request)`.
    pub fn new(of: F) -> Self {
        PriorityLayer { of: Arc::new(of) }
    }
}

impl<F> Clone for PriorityLayer<F> {
    fn clone(&self) -> Self {
        PriorityLayer {
            of: Arc::clone(&self.of),
        }
    }
}

impl<F> fmt::Debug for PriorityLayer<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PriorityLayer").finish_non_exhaustive()
    }
}

impl<S, F> Layer<S> for PriorityLayer<F> {
    type Service = Prioritized<S, F>;

    fn layer(&self, inner: S) -> Self::Service {
        Prioritized {
            inner,
            of: Arc::clone(&self.of),
        }
    }
}

/// A service behind a [`PriorityLayer`].
pub struct Prioritized<S, F> {
    inner: S,
    of: Arc<F>,
}

impl<S: Clone, F> Clone for Prioritized<S, F> {
    fn clone(&self) -> Self {
        Prioritized {
            inner: self.inner.clone(),
            of: Arc::clone(&self.of),
        }
    }
}

impl<S: fmt::Debug, F> fmt::Debug for Prioritized<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prioritized")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, F, Req> Service<Req> for Prioritized<S, F>
where
    S: Service<Req>,
    F: Fn(&Req) -> Priority,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Scoped<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let class = (self.of)(&req);
        // A layer below may admit in its `call` (a local bulkhead), or in the future it returns
        // (one that asks the coordinator): each sees the class.
        let future = priority::in_scope(class, || self.inner.call(req));
        priority::scoped_future(class, future)
    }
}
