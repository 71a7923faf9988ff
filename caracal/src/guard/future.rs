//! The response future of a [`Guarded`](super::Guarded) service, and what it holds: the permit
//! of a request admitted at once, or the boxed call of one deferred (as tower's
//! `limit/concurrency/future.rs` holds its permit; the service imports this, never the reverse).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures_util::TryFuture;
use pin_project_lite::pin_project;
use tower::BoxError;

use crate::error::Error;

/// A call that goes through the policy's asynchronous path, boxed.
pub type BoxCall<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

/// What a request admitted at once holds until its response is ready; dropping it unsettled
/// (the response future dropped, or panicking) frees what it holds.
pub trait Permit<Res>: Send {
    /// Settles the permit with the inner service's result.
    fn complete(self, result: &Result<Res, BoxError>);
}

/// Nothing to hold: the decision was all there was (a rate's charge).
impl<Res> Permit<Res> for () {
    fn complete(self, _: &Result<Res, BoxError>) {}
}

/// No permit: every decision of the policy is deferred.
impl<Res> Permit<Res> for std::convert::Infallible {
    fn complete(self, _: &Result<Res, BoxError>) {
        match self {}
    }
}

pin_project! {
    /// The response of a [`Guarded`](super::Guarded) service. A request the policy decided
    /// for at once is the inner service's own future with what admitted it (no allocation);
    /// only a decision that waits (on the coordinator, in a line) is boxed.
    pub struct ResponseFuture<F: TryFuture, P> {
        #[pin]
        state: State<F, P>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F: TryFuture, P> {
        Admitted {
            #[pin]
            call: F,
            permit: Option<P>,
        },
        Rejected {
            error: Option<Error>,
        },
        Deferred {
            call: BoxCall<F::Ok>,
        },
    }
}

impl<F: TryFuture, P> ResponseFuture<F, P> {
    /// The inner service's `call`, admitted by `permit`.
    pub(crate) fn admitted(call: F, permit: P) -> Self {
        let permit = Some(permit);
        ResponseFuture {
            state: State::Admitted { call, permit },
        }
    }

    /// A request rejected with `error`.
    pub(crate) fn rejected(error: Error) -> Self {
        let error = Some(error);
        ResponseFuture {
            state: State::Rejected { error },
        }
    }

    /// A request whose admission is part of `call`.
    pub(crate) fn deferred(call: BoxCall<F::Ok>) -> Self {
        ResponseFuture {
            state: State::Deferred { call },
        }
    }
}

impl<F, P> Future for ResponseFuture<F, P>
where
    F: TryFuture,
    F::Error: Into<BoxError>,
    P: Permit<F::Ok>,
{
    type Output = Result<F::Ok, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Admitted { call, permit } => {
                let result = ready!(call.try_poll(cx)).map_err(Into::into);
                if let Some(permit) = permit.take() {
                    permit.complete(&result);
                }
                Poll::Ready(result)
            }
            StateProj::Rejected { error } => {
                let error = error
                    .take()
                    .expect("ResponseFuture polled after completion");
                Poll::Ready(Err(error.into()))
            }
            StateProj::Deferred { call } => call.as_mut().poll(cx),
        }
    }
}

impl<F: TryFuture, P> fmt::Debug for ResponseFuture<F, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Admitted { .. } => "admitted",
            State::Rejected { .. } => "rejected",
            State::Deferred { .. } => "deferred",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
