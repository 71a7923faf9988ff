//! `#[timeout]`: a deadline for the whole of what it wraps.

use std::future::Future;
use std::time::Duration;

use crate::ctx::CallCtx;
use crate::error::Error;
use crate::events;
use crate::identity::{FunctionIdentity, Scope};

/// The settings of one `#[timeout]` call site.
#[doc(hidden)]
#[derive(Debug)]
pub struct TimeoutConfig {
    /// Who the events are about.
    pub identity: FunctionIdentity,
    /// How long the wrapped call may take.
    pub after: Duration,
}

/// Runs `body`, dropping it and returning [`Error::Timeout`] once `config.after` elapses.
/// Dropping the body releases whatever it holds (leases, probe slots) through their guards.
/// `scope` is the function's, for events.
#[doc(hidden)]
pub async fn timeout<T, E, F>(
    config: &'static TimeoutConfig,
    ctx: &CallCtx,
    scope: &Result<Scope, Error>,
    body: F,
) -> Result<T, E>
where
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    match tokio::time::timeout(config.after, body).await {
        Ok(result) => result,
        Err(_) => {
            events::timeout(&config.identity.call("timeout", scope), config.after);
            Err(ctx.reject(Error::Timeout {
                after: config.after,
            }))
        }
    }
}
