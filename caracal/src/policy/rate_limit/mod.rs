//! `#[rate_limit]`: a shared GCRA rate per identity.
//!
//! Each attempt is charged at admission (one script call, on Redis time) and never refunded.
//! A rejected call gets [`Error::RateLimited`] with the exact wait until an admission is
//! possible. Coordinator failure rejects (fail closed): a rate limit that silently stopped
//! limiting would be worse than one that refuses while it cannot count.

mod gcra;

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::Error;
use crate::coordinator::{self, RateCommand};
use crate::ctx::CallCtx;
use crate::events::{self, At};
use crate::identity::{KeyBase, Kind, Scope};
use crate::policy::registry::{self, Registry};
use crate::sync::lock;

pub(crate) use gcra::admit as gcra_admit;

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

/// One identity's local cell: its theoretical arrival time.
#[derive(Debug, Default)]
pub(crate) struct Cell(Mutex<Option<Instant>>);

/// Every local cell of the process; a cell whose TAT has passed no longer matters.
static CELLS: Registry<Cell> =
    Registry::new(|cell| lock(&cell.0).is_none_or(|tat| tat <= Instant::now()));

/// One `#[rate_limit]` call site: its settings and its cached process-local cell.
#[doc(hidden)]
#[derive(Debug)]
pub struct RateLimitSite {
    config: RateLimitConfig,
    local: registry::SiteCache<Cell>,
}

impl RateLimitSite {
    /// A call site with these settings.
    pub const fn new(config: RateLimitConfig) -> Self {
        RateLimitSite {
            config,
            local: registry::SiteCache::new(),
        }
    }

    fn at<'a>(&self, scope: &'a Scope) -> At<'a> {
        At {
            policy: "rate_limit",
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

    /// The decision for one arrival: `Ok(Ok(()))` admitted, `Ok(Err(wait))` rejected.
    async fn decide(&'static self, scope: &Scope) -> Result<Result<(), Duration>, Error> {
        let config = &self.config;
        let interval = gcra::interval(config.rate);
        if config.local {
            let identity = (config.name, config.operation, scope);
            let cell = CELLS.get(&self.local, identity, Cell::default);
            let decision = {
                let mut tat = lock(&cell.0);
                gcra::admit(*tat, Instant::now(), interval, config.burst)
                    .map(|next| *tat = Some(next))
            };
            CELLS.release(identity, &cell);
            return Ok(decision);
        }
        let coordinator = coordinator::current()?;
        let key = KeyBase::derive(
            coordinator.namespace(),
            Kind::RateLimit,
            config.name,
            config.operation,
            scope,
        );
        coordinator
            .rate_limit(RateCommand {
                key: &key,
                interval,
                burst: config.burst,
            })
            .await
            .inspect_err(|error| {
                events::rate_limit_degraded(&self.at(scope), error);
            })
    }
}

/// Admits `body` if the site's rate allows it now.
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
    let scope = ctx.scope(scope)?;
    match site.decide(scope).await {
        Ok(Ok(())) => {
            events::rate_limit_admitted(&site.at(scope));
            body.await
        }
        Ok(Err(retry_after)) => {
            events::rate_limit_rejected(&site.at(scope), Some(retry_after));
            Err(ctx.reject(Error::RateLimited {
                policy: site.config.name,
                scope: scope.to_string(),
                retry_after,
            }))
        }
        Err(error) => {
            events::rate_limit_rejected(&site.at(scope), None);
            Err(ctx.reject(error))
        }
    }
}
