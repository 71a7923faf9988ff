//! The local bulkhead: a FIFO semaphore per identity in this process.
//!
//! `tokio::sync::Semaphore` hands a freed permit straight to the longest waiter, so waiting
//! callers are served in arrival order and a newcomer can never barge past them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, LazyLock, Mutex, OnceLock};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::BulkheadSite;
use crate::ctx::CallCtx;
use crate::events::{self, BulkheadRejection};
use crate::identity::Scope;
use crate::sync::lock;
use crate::Error;

/// One identity's budget.
#[derive(Debug)]
struct Budget {
    semaphore: Arc<Semaphore>,
    limit: u32,
}

impl Budget {
    fn occupancy(&self) -> u32 {
        let free = u32::try_from(self.semaphore.available_permits()).unwrap_or(u32::MAX);
        self.limit.saturating_sub(free)
    }
}

type Key = (&'static str, &'static str, Scope);

/// Every local budget of the process, by (name, operation, scope). An entry for a per-call
/// scope is removed when its last holder leaves, so arbitrary scopes cannot grow it forever.
static BUDGETS: LazyLock<Mutex<HashMap<Key, Arc<Budget>>>> = LazyLock::new(Mutex::default);

/// A call site's handle on its default-scope budget, so the common case skips the registry.
#[derive(Debug)]
pub(super) struct SiteCache(OnceLock<Arc<Budget>>);

impl SiteCache {
    pub(super) const fn new() -> Self {
        SiteCache(OnceLock::new())
    }
}

fn budget(site: &BulkheadSite, scope: &Scope) -> Arc<Budget> {
    let lookup = || {
        let key = (site.config.name, site.config.operation, scope.clone());
        let mut budgets = lock(&BUDGETS);
        Arc::clone(budgets.entry(key).or_insert_with(|| {
            Arc::new(Budget {
                semaphore: Arc::new(Semaphore::new(site.config.limit as usize)),
                limit: site.config.limit,
            })
        }))
    };
    if *scope == Scope::GLOBAL {
        Arc::clone(site.local.0.get_or_init(lookup))
    } else {
        lookup()
    }
}

/// A held local slot; dropping it frees the slot and, when nobody else uses the budget, the
/// registry entry.
struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    budget: Arc<Budget>,
    site: &'static BulkheadSite,
    scope: Scope,
    since: Instant,
}

impl Drop for Slot {
    fn drop(&mut self) {
        drop(self.permit.take());
        events::bulkhead_released(
            &self.site.at(&self.scope),
            Some(self.budget.occupancy()),
            self.since.elapsed(),
        );
        // Holders and waiters clone the entry under the registry lock, so under that lock a
        // count of 2 (the registry and this slot) means nobody else can reach it.
        if self.scope != Scope::GLOBAL && Arc::strong_count(&self.budget) == 2 {
            let mut budgets = lock(&BUDGETS);
            if Arc::strong_count(&self.budget) == 2 {
                budgets.remove(&(self.site.config.name, self.site.config.operation, self.scope.clone()));
            }
        }
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
    let budget = budget(site, scope);
    let permit = match Arc::clone(&budget.semaphore).try_acquire_owned() {
        Ok(permit) => permit,
        Err(_) => {
            let waited = match config.max_wait {
                Some(wait) => {
                    tokio::time::timeout(wait, Arc::clone(&budget.semaphore).acquire_owned())
                        .await
                        .ok()
                        .and_then(Result::ok)
                }
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
    events::bulkhead_admitted(&site.at(scope), budget.occupancy(), config.limit);
    let _slot = Slot {
        permit: Some(permit),
        budget,
        site,
        scope: scope.clone(),
        since: Instant::now(),
    };
    body.await
}
