//! `#[bulkhead]`: at most `limit` bodies at once per identity.
//!
//! Distributed, a slot is a lease in the identity's Redis lease set (or the in-memory
//! coordinator's equivalent), renewed while the body runs and released when the call ends —
//! returned, failed, panicked or dropped. Local, a slot is a permit of a FIFO semaphore shared
//! by every call site with the same identity in this process.

mod distributed;
mod local;

use std::future::Future;
use std::time::Duration;

use crate::Error;
use crate::ctx::CallCtx;
use crate::events::At;
use crate::identity::Scope;

/// The settings of one `#[bulkhead]` call site.
#[doc(hidden)]
#[derive(Debug)]
pub struct BulkheadConfig {
    /// The policy name.
    pub name: &'static str,
    /// The operation name.
    pub operation: &'static str,
    /// Bodies allowed at once.
    pub limit: u32,
    /// The lease TTL (distributed only).
    pub lease: Duration,
    /// How long to wait for a slot before rejecting; `None` rejects at once.
    pub max_wait: Option<Duration>,
    /// Per-process only.
    pub local: bool,
}

/// One `#[bulkhead]` call site: its settings and its cached process-local state.
#[doc(hidden)]
#[derive(Debug)]
pub struct BulkheadSite {
    config: BulkheadConfig,
    local: local::SiteCache,
}

impl BulkheadSite {
    /// A call site with these settings.
    pub const fn new(config: BulkheadConfig) -> Self {
        BulkheadSite {
            config,
            local: local::SiteCache::new(),
        }
    }

    fn at<'a>(&self, scope: &'a Scope) -> At<'a> {
        At {
            policy: "bulkhead",
            name: self.config.name,
            operation: self.config.operation,
            scope: scope.as_str(),
            coordination: if self.config.local {
                "local"
            } else {
                "distributed"
            },
        }
    }

    fn full(&self, scope: &Scope) -> Error {
        Error::BulkheadFull {
            policy: self.config.name,
            scope: scope.to_string(),
            limit: self.config.limit,
        }
    }
}

/// Runs `body` once a slot is free, holding the slot until the call ends.
#[doc(hidden)]
pub async fn bulkhead<T, E, F>(
    site: &'static BulkheadSite,
    ctx: &CallCtx,
    scope: &Result<Scope, Error>,
    body: F,
) -> Result<T, E>
where
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    let scope = ctx.scope(scope)?;
    if site.config.local {
        local::run(site, ctx, scope, body).await
    } else {
        // Boxed: the distributed path's state is large, and keeping it inline would make every
        // local call's future that large too. One allocation is nothing next to a round trip.
        Box::pin(distributed::run(site, ctx, scope, body)).await
    }
}

#[cfg(test)]
mod tests;
