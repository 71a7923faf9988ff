//! The local bulkhead: a FIFO semaphore per identity in this process.
//!
//! `tokio::sync::Semaphore` hands a freed permit straight to the longest waiter, so waiting
//! callers are served in arrival order and a newcomer can never barge past them.

use std::future::Future;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::BulkheadSite;
use crate::Error;
use crate::ctx::CallCtx;
use crate::events::{self, BulkheadRejection};
use crate::identity::Scope;
use crate::policy::registry::{self, Held, Registry};

/// One identity's budget.
#[derive(Debug)]
pub(super) struct Budget {
    semaphore: Semaphore,
    limit: u32,
}

impl Budget {
    fn occupancy(&self) -> u32 {
        let free = u32::try_from(self.semaphore.available_permits()).unwrap_or(u32::MAX);
        self.limit.saturating_sub(free)
    }
}

/// Every local budget of the process. A budget is idle when no slot is taken.
static BUDGETS: Registry<Budget> = Registry::new(|budget| budget.occupancy() == 0);

/// A call site's handle on its default-scope budget.
pub(super) type SiteCache = registry::SiteCache<Budget>;

/// A held local slot; dropping it frees the slot. (Its permit was forgotten at admission and
/// is given back here, so the slot needs no second reference to the semaphore.)
struct Slot {
    budget: Held<Budget>,
    site: &'static BulkheadSite,
    scope: Scope,
    since: Option<Instant>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.budget.semaphore.add_permits(1);
        if let Some(since) = self.since {
            events::bulkhead_released(
                &self.site.at(&self.scope),
                Some(self.budget.occupancy()),
                since.elapsed(),
            );
        }
        let config = &self.site.config;
        BUDGETS.release((config.name, config.operation, &self.scope), &self.budget);
    }
}

pub(super) async fn run<T, E, F>(
    site: &'static BulkheadSite,
    ctx: &CallCtx,
    scope: &Scope,
    body: F,
) -> Result<T, E>
where
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    let config = &site.config;
    let budget = BUDGETS.get(&site.local, (config.name, config.operation, scope), || {
        Budget {
            semaphore: Semaphore::new(config.limit as usize),
            limit: config.limit,
        }
    });
    let permit = match budget.semaphore.try_acquire() {
        Ok(permit) => permit,
        Err(_) => {
            let waited = match config.max_wait {
                Some(wait) => tokio::time::timeout(wait, budget.semaphore.acquire())
                    .await
                    .ok()
                    .and_then(Result::ok),
                None => None,
            };
            match waited {
                Some(permit) => permit,
                None => {
                    let reason = if config.max_wait.is_some() {
                        BulkheadRejection::WaitTimeout
                    } else {
                        BulkheadRejection::Capacity
                    };
                    events::bulkhead_rejected(
                        &site.at(scope),
                        reason,
                        Some(budget.occupancy()),
                        config.limit,
                    );
                    return Err(ctx.reject(site.full(scope)));
                }
            }
        }
    };
    permit.forget();
    events::bulkhead_admitted(&site.at(scope), budget.occupancy(), config.limit);
    let _slot = Slot {
        budget,
        site,
        scope: scope.clone(),
        since: events::debug_enabled().then(Instant::now),
    };
    body.await
}
