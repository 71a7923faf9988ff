//! `#[retry]`: run the attempt again on failure, with capped exponential backoff and full jitter.

use std::ops::ControlFlow;
use std::time::Duration;

use crate::ctx::CallCtx;
use crate::error::Error;
use crate::events;
use crate::identity::{FunctionIdentity, Scope};
use crate::metrics::{self, Retried};

/// The settings of one `#[retry]` call site.
#[doc(hidden)]
#[derive(Debug)]
pub struct RetryConfig {
    /// Who the events are about.
    pub identity: FunctionIdentity,
    /// Attempts in all, counting the first; at least 1.
    pub max_attempts: u32,
    /// The delay before the second attempt; it doubles for each later one.
    pub backoff: Duration,
    /// The cap on a single delay.
    pub max_backoff: Duration,
}

impl RetryConfig {
    /// The upper bound of the delay before attempt `next` (2 or more), before jitter.
    fn ceiling(&self, next: u32) -> Duration {
        let doublings = next.saturating_sub(2).min(31);
        self.backoff
            .saturating_mul(1u32 << doublings)
            .min(self.max_backoff)
    }
}

/// Decides whether an error is worth another attempt.
#[doc(hidden)]
pub trait RetryWhen<E> {
    /// `rejected` tells whether caracal itself produced the error (a rejection by an inner
    /// policy) rather than the body.
    fn retry(&self, error: &E, rejected: bool) -> bool;
}

/// The default: retry every error the body returned, never a caracal rejection.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct RetryBodyErrors;

impl<E> RetryWhen<E> for RetryBodyErrors {
    fn retry(&self, _: &E, rejected: bool) -> bool {
        !rejected
    }
}

impl<E, F: Fn(&E) -> bool> RetryWhen<E> for F {
    fn retry(&self, error: &E, _: bool) -> bool {
        self(error)
    }
}

/// The retry loop's state, driven by the code the macro emits:
///
/// ```text
/// let mut retry = Retry::new(&CONFIG, &ctx, &scope, when);
/// loop {
///     let outcome = attempt.await;
///     if let ControlFlow::Break(result) = retry.settle(outcome).await { break result; }
/// }
/// ```
///
/// A loop rather than a closure, so a body that borrows `&mut self` can run once per attempt.
#[doc(hidden)]
#[derive(Debug)]
pub struct Retry<'a, W> {
    config: &'static RetryConfig,
    ctx: &'a CallCtx,
    scope: &'a Result<Scope, Error>,
    when: W,
    attempt: u32,
}

impl<'a, W> Retry<'a, W> {
    /// Starts the first attempt; `scope` is the function's, for events.
    pub fn new(
        config: &'static RetryConfig,
        ctx: &'a CallCtx,
        scope: &'a Result<Scope, Error>,
        when: W,
    ) -> Self {
        ctx.clear();
        Retry {
            config,
            ctx,
            scope,
            when,
            attempt: 1,
        }
    }

    /// Takes one attempt's outcome: `Break` with the call's result, or `Continue` after waiting
    /// out the backoff before the next attempt.
    pub async fn settle<T, E>(&mut self, outcome: Result<T, E>) -> ControlFlow<Result<T, E>>
    where
        W: RetryWhen<E>,
        E: From<Error>,
    {
        let Err(error) = &outcome else {
            return ControlFlow::Break(outcome);
        };
        if !self.when.retry(error, self.ctx.rejection().is_some()) {
            return ControlFlow::Break(outcome);
        }
        if self.attempt >= self.config.max_attempts {
            events::retry_exhausted(&self.call(), self.attempt);
            metrics::retried(self.config.identity.name, Retried::Exhausted);
            return ControlFlow::Break(outcome);
        }
        // An outer layer (a budget) may refuse the attempt: the call ends with this one's
        // result, not an error of its own; the refusal is the layer's to announce.
        if !self.ctx.another_attempt() {
            metrics::retried(self.config.identity.name, Retried::Refused);
            return ControlFlow::Break(outcome);
        }
        metrics::retried(self.config.identity.name, Retried::Again);
        self.attempt += 1;
        let delay = jitter(self.config.ceiling(self.attempt));
        events::retry_scheduled(&self.call(), self.attempt, delay);
        // Cleared before the wait, not after: under a `#[hedge]` the call's other attempts
        // run meanwhile, and one ending then must not find this attempt's rejection.
        self.ctx.clear();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        ControlFlow::Continue(())
    }

    fn call(&self) -> crate::labels::Call<'a> {
        self.config.identity.call("retry", self.scope)
    }
}

/// Full jitter: a uniformly random delay in `[0, ceiling]`.
fn jitter(ceiling: Duration) -> Duration {
    if ceiling.is_zero() {
        return ceiling;
    }
    let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rand::random_range(0..=nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    static CONFIG: RetryConfig = RetryConfig {
        identity: FunctionIdentity {
            function: "f",
            name: "f",
            operation: "f",
        },
        max_attempts: 10,
        backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(1000),
    };

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let ceilings: Vec<_> = (2..=7).map(|n| CONFIG.ceiling(n).as_millis()).collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(CONFIG.ceiling(u32::MAX), Duration::from_millis(1000));
    }

    #[test]
    fn jitter_stays_within_the_ceiling() {
        for _ in 0..1000 {
            assert!(jitter(Duration::from_millis(5)) <= Duration::from_millis(5));
        }
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
    }
}
