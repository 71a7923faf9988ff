//! The local breaker: the kernel under a mutex, one per identity in this process, on tokio's
//! clock. Same semantics as the distributed breaker, without a coordinator.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::kernel::{AdmitReply, MsClock, Phase, ProbeOutcome, Seen, Settings, Store};
use super::{BreakerSite, Classify, ProbeSlot, run_admitted};
use crate::ctx::CallCtx;
use crate::identity::Scope;
use crate::policy::registry::{self, Registry};
use crate::sync::lock;
use crate::{Error, Outcome, events};

/// One identity's breaker.
#[derive(Debug)]
pub(super) struct Breaker {
    store: Mutex<Store>,
    settings: Settings,
    clock: MsClock,
}

impl Breaker {
    fn idle(&self) -> bool {
        let now = self.clock.now();
        lock(&self.store).matters_until(&self.settings) <= now
    }
}

static BREAKERS: Registry<Breaker> = Registry::new(Breaker::idle);

/// A call site's handle on its default-scope breaker.
pub(super) type SiteCache = registry::SiteCache<Breaker>;

/// Probe tokens only need to be unique within the process.
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

pub(super) async fn run<T, E, C, F>(
    site: &'static BreakerSite,
    ctx: &CallCtx,
    scope: &Scope,
    classify: C,
    body: F,
) -> Result<T, E>
where
    E: From<Error>,
    C: Classify<T, E>,
    F: Future<Output = Result<T, E>>,
{
    let config = &site.config;
    let identity = (config.name, config.operation, scope);
    let breaker = BREAKERS.get(&site.local, identity, || Breaker {
        store: Mutex::new(Store::default()),
        settings: site.settings(),
        clock: MsClock::start(),
    });
    let result = admit_and_run(site, ctx, scope, &classify, body, &breaker).await;
    BREAKERS.release(identity, &breaker);
    result
}

async fn admit_and_run<T, E, C, F>(
    site: &'static BreakerSite,
    ctx: &CallCtx,
    scope: &Scope,
    classify: &C,
    body: F,
    breaker: &Breaker,
) -> Result<T, E>
where
    E: From<Error>,
    C: Classify<T, E>,
    F: Future<Output = Result<T, E>>,
{
    let at = site.at(scope);
    let settings = &breaker.settings;
    let token = u128::from(NEXT_TOKEN.fetch_add(1, Ordering::Relaxed));
    let reply = {
        let mut store = lock(&breaker.store);
        match store.closed_for_good() {
            Some(generation) => AdmitReply::Closed { generation },
            None => store.admit(breaker.clock.now(), token, settings, &mut Seen::default()),
        }
    };
    match reply {
        AdmitReply::Closed { generation } => {
            run_admitted(ctx, classify, body, |outcome| {
                let failed = match outcome {
                    Outcome::Success => false,
                    Outcome::Failure => true,
                    Outcome::Ignored => return,
                };
                let reply = lock(&breaker.store).observe(
                    breaker.clock.now(),
                    generation,
                    &[failed],
                    1,
                    settings,
                    &mut Seen::default(),
                );
                events::breaker_observed(&at, generation, &reply);
            })
            .await
        }
        AdmitReply::Probe {
            generation,
            transitioned,
        } => {
            if transitioned {
                events::breaker_state_changed(&at, Phase::Open, Phase::HalfOpen, generation, None);
            }
            events::breaker_probe_started(&at, generation);
            let slot = ProbeSlot(Some(|outcome: ProbeOutcome| {
                let reply = lock(&breaker.store).settle(
                    breaker.clock.now(),
                    token,
                    outcome,
                    generation,
                    settings,
                    &mut Seen::default(),
                );
                events::breaker_settled(&at, generation, &reply);
            }));
            run_admitted(ctx, classify, body, |outcome| slot.settle(outcome)).await
        }
        AdmitReply::Open {
            generation,
            retry_after_ms,
        } => {
            let retry_after = std::time::Duration::from_millis(retry_after_ms);
            events::breaker_rejected(&at, Phase::Open, Some(generation), Some(retry_after));
            Err(ctx.reject(site.open_error(scope, Some(retry_after))))
        }
        AdmitReply::ProbeLimit { generation } => {
            events::breaker_rejected(&at, Phase::HalfOpen, Some(generation), None);
            Err(ctx.reject(site.open_error(scope, None)))
        }
    }
}
