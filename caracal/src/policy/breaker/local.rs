//! The local breaker: the kernel under a mutex, one per identity in this process, on tokio's
//! clock. Same semantics as the distributed breaker, without a coordinator.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{BreakerSite, BreakerValues, Classify, ProbeSlot, run_admitted};
use crate::clock::Clock;
use crate::coordinator;
use crate::ctx::CallCtx;
use crate::events::ChangeOrigin;
use crate::identity::Scope;
use crate::kernel::Seen;
use crate::metrics::Stopwatch;
use crate::policy::breaker::kernel::{
    AdmitReply, Counts, Phase, ProbeOutcome, Settings, Store, Transition,
};
use crate::policy::registry::{self, Registry};
use crate::sync::lock;
use crate::{Error, events};

/// One identity's breaker: its store, and the settings of its latest command (what decides
/// when the store no longer matters).
#[derive(Debug)]
pub(super) struct Breaker {
    store: Mutex<(Store, Settings)>,
    /// The generation plus one while the store is closed for good, else 0: so an admission
    /// to a closed breaker (nearly every call) takes neither the lock nor the clock. Written
    /// under the store's lock after every step.
    closed: AtomicU64,
    clock: Clock,
}

impl Breaker {
    fn idle(&self) -> bool {
        let now = self.clock.ms();
        let (store, settings) = &*lock(&self.store);
        store.matters_until(settings) <= now
    }

    /// Runs `step` on the store under `settings`.
    fn with<R>(&self, settings: &Settings, step: impl FnOnce(&mut Store, u64) -> R) -> R {
        let mut guard = lock(&self.store);
        guard.1 = *settings;
        let result = step(&mut guard.0, self.clock.ms());
        let closed = guard
            .0
            .closed_for_good()
            .map_or(0, |generation| generation + 1);
        self.closed.store(closed, Ordering::Release);
        result
    }

    /// The generation of the store when it is closed for good.
    fn closed_generation(&self) -> Option<u64> {
        self.closed.load(Ordering::Acquire).checked_sub(1)
    }
}

static BREAKERS: Registry<Breaker> = Registry::new(Breaker::idle);

/// A call site's handle on its default-scope breaker, and on the settings its attribute gives.
pub(super) type SiteCache = registry::SiteCache<Breaker, (Settings, Option<Duration>)>;

/// What a local breaker runs on: the kernel's settings, and the slow-call duration.
fn local_settings(values: &BreakerValues) -> (Settings, Option<Duration>) {
    (values.settings(true), values.slow_after())
}

/// Probe tokens only need to be unique within the process.
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

pub(super) async fn run<T, E, C, F>(
    site: &BreakerSite,
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
    let arrival = Stopwatch::start();
    let config = &site.config;
    let identity = (config.name, config.operation, scope);
    let (settings, slow_after) = match coordinator::overriding() {
        None => *site
            .local
            .attribute(|| local_settings(&site.resolve(None).values)),
        overriding => local_settings(&site.resolve(overriding.as_ref()).values),
    };
    let breaker = BREAKERS.get(&site.local, identity, || {
        events::breaker_phase(&site.at(scope), Phase::Closed);
        Breaker {
            store: Mutex::new((Store::default(), settings)),
            closed: AtomicU64::new(0),
            clock: Clock::start(),
        }
    });
    let admitted = Admitted {
        breaker: &breaker,
        settings,
        slow_after,
        arrival,
    };
    let result = admit_and_run(site, ctx, scope, &classify, body, admitted).await;
    BREAKERS.release(identity, &breaker);
    result
}

/// What an admission works with: the breaker, the values resolved for this call, and when the
/// call reached the breaker.
struct Admitted<'a> {
    breaker: &'a Breaker,
    settings: Settings,
    slow_after: Option<std::time::Duration>,
    arrival: Stopwatch,
}

async fn admit_and_run<T, E, C, F>(
    site: &BreakerSite,
    ctx: &CallCtx,
    scope: &Scope,
    classify: &C,
    body: F,
    admitted: Admitted<'_>,
) -> Result<T, E>
where
    E: From<Error>,
    C: Classify<T, E>,
    F: Future<Output = Result<T, E>>,
{
    let at = site.at(scope);
    let Admitted {
        breaker,
        ref settings,
        slow_after,
        arrival,
    } = admitted;
    // Only an admission that may start a probe needs a token.
    let mut token = 0;
    let reply = match breaker.closed_generation() {
        Some(generation) => AdmitReply::Closed {
            generation,
            transitioned: false,
        },
        None => {
            token = u128::from(NEXT_TOKEN.fetch_add(1, Ordering::Relaxed));
            breaker.with(settings, |store, now| {
                store.admit(now, token, settings, &mut Seen::default())
            })
        }
    };
    let announce = |change: Transition, window: Option<Counts>| {
        events::breaker_phase(&at, change.to);
        events::breaker_state_changed(&at, change, window, ChangeOrigin::Local, None);
    };
    match reply {
        AdmitReply::Closed { generation, .. } => {
            events::breaker_admitted(&at, Phase::Closed, generation, arrival);
            run_admitted(slow_after, ctx, classify, body, |verdict| {
                let Some(observation) = verdict.observation() else {
                    return;
                };
                let reply = breaker.with(settings, |store, now| {
                    let observations = [observation];
                    store.observe(
                        now,
                        generation,
                        &observations,
                        1,
                        settings,
                        &mut Seen::default(),
                    )
                });
                events::breaker_observed(&at, generation, &reply);
                if let Some((change, window)) = reply.transition() {
                    announce(change, Some(window));
                }
            })
            .await
        }
        AdmitReply::ForcedClosed { generation } => {
            events::breaker_admitted(&at, Phase::ForcedClosed, generation, arrival);
            body.await
        }
        AdmitReply::Probe {
            generation,
            transitioned,
        } => {
            if transitioned {
                let change = Transition {
                    from: Phase::Open,
                    to: Phase::HalfOpen,
                    generation,
                };
                announce(change, None);
            }
            events::breaker_probe_started(&at, generation, arrival);
            let slot = ProbeSlot(Some(|outcome: ProbeOutcome| {
                let reply = breaker.with(settings, |store, now| {
                    store.settle(
                        now,
                        token,
                        outcome,
                        generation,
                        settings,
                        &mut Seen::default(),
                    )
                });
                events::breaker_settled(&at, generation, &reply);
                if let Some(change) = reply.transition() {
                    announce(change, None);
                }
            }));
            run_admitted(slow_after, ctx, classify, body, |verdict| {
                slot.settle(verdict);
            })
            .await
        }
        AdmitReply::Open {
            generation,
            retry_after_ms,
        } => {
            let retry_after = std::time::Duration::from_millis(retry_after_ms);
            events::breaker_rejected(&at, Phase::Open, Some(generation), Some(retry_after));
            Err(ctx.reject(site.open_error(scope, Some(retry_after))))
        }
        AdmitReply::ForcedOpen {
            generation,
            retry_after_ms,
        } => {
            let retry_after = retry_after_ms.map(std::time::Duration::from_millis);
            events::breaker_rejected(&at, Phase::ForcedOpen, Some(generation), retry_after);
            Err(ctx.reject(site.open_error(scope, retry_after)))
        }
        AdmitReply::ProbeLimit { generation } => {
            events::breaker_rejected(&at, Phase::HalfOpen, Some(generation), None);
            Err(ctx.reject(site.open_error(scope, None)))
        }
    }
}
