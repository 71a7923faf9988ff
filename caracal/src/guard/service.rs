//! The one service every layer wraps its inner service in, generic over the policy it applies.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::{BoxError, Service};

use super::future::{BoxCall, Permit, ResponseFuture};
use crate::error::Error;

/// What a policy decided for a request when the service was called.
#[derive(Debug)]
pub enum Admission<P, D> {
    /// Admitted at once: the inner service is called now, and `P` is settled with its result.
    Admitted(P),
    /// Rejected at once: the inner service is not called.
    Rejected(Error),
    /// The decision takes waiting (the coordinator, a line for a slot): the call goes through
    /// [`Admit::guard`] with what the policy needs for it.
    Deferred(D),
}

/// A policy a [`Guarded`] service applies to each request: the bulkhead, circuit breaker or
/// rate limit behind each of this module's layers.
///
/// A decision the policy can make at once (its `local` fast path) costs no allocation; one that
/// needs to wait is a boxed future, as a round trip or a wait in line dwarfs an allocation.
pub trait Admit<Req, Res>: Send + Sync + 'static {
    /// What a request admitted at once holds until its response is ready.
    type Permit: Permit<Res>;
    /// What a deferred decision needs (the request's scope).
    type Deferred;

    /// Decides for `req`, at once where the policy can.
    fn admit(&self, req: &Req) -> Admission<Self::Permit, Self::Deferred>;

    /// Runs `call` under the policy, once the decision that was deferred is made.
    fn guard<F>(&self, deferred: Self::Deferred, call: F) -> BoxCall<Res>
    where
        F: Future<Output = Result<Res, BoxError>> + Send + 'static;
}

/// A service behind one of this module's layers: `inner`, guarded by the policy `P`.
pub struct Guarded<S, P> {
    inner: S,
    policy: Arc<P>,
}

impl<S, P> Guarded<S, P> {
    /// `inner`, guarded by `policy`.
    pub(crate) fn new(inner: S, policy: P) -> Self {
        Guarded {
            inner,
            policy: Arc::new(policy),
        }
    }
}

impl<S: Clone, P> Clone for Guarded<S, P> {
    fn clone(&self) -> Self {
        Guarded {
            inner: self.inner.clone(),
            policy: Arc::clone(&self.policy),
        }
    }
}

impl<S: fmt::Debug, P: fmt::Debug> fmt::Debug for Guarded<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guarded")
            .field("inner", &self.inner)
            .field("policy", &self.policy)
            .finish()
    }
}

/// Takes the ready service out of `inner`, leaving a clone that has not been polled (tower's
/// usual way to move a service into a future).
fn take_ready<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}

impl<S, P, Req> Service<Req> for Guarded<S, P>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    S::Response: Send + 'static,
    Req: Send + 'static,
    P: Admit<Req, S::Response>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, P::Permit>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        match self.policy.admit(&req) {
            Admission::Admitted(permit) => ResponseFuture::admitted(self.inner.call(req), permit),
            Admission::Rejected(error) => ResponseFuture::rejected(error),
            Admission::Deferred(deferred) => {
                // The inner service is called only once admitted: a rejected request never
                // reaches it.
                let mut inner = take_ready(&mut self.inner);
                let call = async move { inner.call(req).await.map_err(Into::into) };
                ResponseFuture::deferred(self.policy.guard(deferred, call))
            }
        }
    }
}
