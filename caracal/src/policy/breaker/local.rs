//! The local breaker: the kernel under a mutex, one per identity in this process, on tokio's
//! clock. Same semantics as the distributed breaker, without a coordinator.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::events::{self, ChangeOrigin};
use super::{BreakerSite, BreakerValues, Classify, ProbeSlot, Started, run_admitted};
use crate::clock::Clock;
use crate::coordinator;
use crate::ctx::CallCtx;
use crate::error::Error;
use crate::identity::Scope;
use crate::kernel::Seen;
use crate::labels::At;
use crate::metrics::Stopwatch;
use crate::policy::breaker::kernel::{
    AdmitReply, Counts, Observation, ObserveReply, Phase, ProbeOutcome, Settings, Store, Transition,
};
use crate::policy::refuse;
use crate::policy::registry::{self, Registry};
use crate::sync::lock;
use futures_util::FutureExt;

/// One identity's breaker: its store, and the settings of its latest command (what decides
/// when the store no longer matters).
#[derive(Debug)]
pub(super) struct Breaker {
    store: Mutex<(Store, Settings)>,
    /// The generation plus one while the store is closed for good, else 0: so an admission
    /// to a closed breaker (nearly every call) takes neither the lock nor the clock. Written
    /// under the store's lock after every step.
    closed: AtomicU64,
    /// The successes counted without the lock (see [`Tally`]).
    tally: AtomicU64,
    clock: Clock,
}

/// Successes of a closed breaker, all of one millisecond, counted without its lock: the next
/// step under the lock first folds them into the store as batches of that millisecond, as the
/// distributed breaker batches the observations it sends. So the success of a closed call
/// (nearly every call) costs one clock read and one atomic update.
///
/// Armed under the lock by each step, for the millisecond it ran in, and only while the store
/// is closed for good and its window holds neither failures nor slow calls. No number of
/// successes can open such a window, and its rates (what the metrics show) stay 0 whatever
/// successes are added: a success not yet folded in changes no decision and leaves nothing
/// shown untrue. Otherwise disarmed (0), and a success takes the lock as any other
/// observation.
///
/// Bits, high to low: the millisecond (36), the generation's low 16 bits (a success admitted
/// under an earlier generation is not counted in a later one), the count (12).
#[derive(Debug, Clone, Copy)]
struct Tally(u64);

impl Tally {
    const DISARMED: Tally = Tally(0);
    const MAX_COUNT: u64 = (1 << 12) - 1;

    /// Armed for successes of `generation` in millisecond `ms` (never 0: a clock reads 1 at
    /// least); `None` past 36 bits of milliseconds, two years of a breaker's life, when only
    /// the shortcut is lost.
    fn armed(ms: u64, generation: u64) -> Option<Tally> {
        (ms < 1 << 36).then_some(Tally(ms << 28 | (generation & 0xffff) << 12))
    }

    fn ms(self) -> u64 {
        self.0 >> 28
    }

    fn count(self) -> u64 {
        self.0 & Self::MAX_COUNT
    }

    /// Whether one more success of `generation` at `now` may be counted here.
    fn takes(self, now: u64, generation: u64) -> bool {
        self.0 != 0
            && self.ms() == now
            && (self.0 >> 12) & 0xffff == generation & 0xffff
            && self.count() < Self::MAX_COUNT
    }
}

/// What a folded batch of successes holds; a window entry takes up to 64 without allocating.
const SUCCESSES: [Observation; 64] = [Observation {
    failed: false,
    slow: false,
}; 64];

impl Breaker {
    fn idle(&self) -> bool {
        let now = self.clock.ms();
        let (store, settings) = &*lock(&self.store);
        // Successes not folded in yet matter as long as they would stay in the window.
        let tally = Tally(self.tally.load(Ordering::Acquire));
        let tallied = if tally.count() > 0 {
            tally.ms().saturating_add(settings.window_ms)
        } else {
            0
        };
        store.matters_until(settings).max(tallied) <= now
    }

    /// Runs `step` on the store under `settings`, after folding in the tallied successes.
    fn with<R>(
        &self,
        at: &At<'_>,
        settings: &Settings,
        step: impl FnOnce(&mut Store, u64) -> R,
    ) -> R {
        let (result, folded) = {
            let mut guard = lock(&self.store);
            guard.1 = *settings;
            let store = &mut guard.0;
            let now = self.clock.ms();
            let folded = self.fold(store, settings);
            let result = step(store, now);
            let closed = store.closed_for_good();
            self.closed.store(
                closed.map_or(0, |generation| generation + 1),
                Ordering::Release,
            );
            let tally = closed
                .filter(|_| {
                    let counts = store.state.as_ref().map(|state| state.counts);
                    counts.is_some_and(|counts| counts.failures == 0 && counts.slow == 0)
                })
                .and_then(|generation| Tally::armed(now, generation))
                .unwrap_or(Tally::DISARMED);
            self.tally.store(tally.0, Ordering::Release);
            (result, folded)
        };
        // Announced once the lock is free.
        if let Some((generation, reply)) = folded {
            observed(at, generation, &reply);
        }
        result
    }

    /// Folds the tallied successes into `store` (under its lock); returns the generation and
    /// the reply of the last batch (the window as they left it), to announce as an
    /// observation. Their clean window is still clean after them: nothing opens.
    fn fold(&self, store: &mut Store, settings: &Settings) -> Option<(u64, ObserveReply)> {
        let tally = Tally(self.tally.swap(Tally::DISARMED.0, Ordering::AcqRel));
        // Armed by the last step for the generation the store still has: every step re-arms.
        let generation = store.closed_for_good().filter(|_| tally.count() > 0)?;
        let mut left = tally.count();
        let mut last = None;
        while left > 0 {
            let batch = left.min(SUCCESSES.len() as u64);
            left -= batch;
            last = Some(store.observe(
                tally.ms(),
                generation,
                &SUCCESSES[..batch as usize],
                1,
                settings,
                &mut Seen::default(),
            ));
        }
        last.map(|reply| (generation, reply))
    }

    /// Counts a success admitted under `generation` without the lock, if the tally takes it.
    fn tally_success(&self, generation: u64) -> bool {
        let now = self.clock.ms();
        let mut seen = self.tally.load(Ordering::Acquire);
        while Tally(seen).takes(now, generation) {
            match self.tally.compare_exchange_weak(
                seen,
                seen + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(current) => seen = current,
            }
        }
        false
    }

    /// The generation of the store when it is closed for good.
    fn closed_generation(&self) -> Option<u64> {
        self.closed.load(Ordering::Acquire).checked_sub(1)
    }
}

/// The window of `site`'s breaker in the default scope, its tallied successes folded in: what
/// a test reads to check that no success was lost on the way.
#[cfg(test)]
pub(super) fn window(site: &BreakerSite) -> Option<Counts> {
    let identity = (site.config.name, site.config.operation, &Scope::GLOBAL);
    let breaker = BREAKERS.get(&site.local, identity, || {
        unreachable!("a window is read after a call made the breaker")
    });
    let mut guard = lock(&breaker.store);
    let (store, settings) = &mut *guard;
    let settings = *settings;
    breaker.fold(store, &settings);
    store.state.as_ref().map(|state| state.counts)
}

/// The events an observation's reply calls for.
fn observed(at: &At<'_>, generation: u64, reply: &ObserveReply) {
    events::observed(at, generation, reply);
    if let Some((change, window)) = reply.transition() {
        announce(at, change, Some(window));
    }
}

/// A change of phase made here.
fn announce(at: &At<'_>, change: Transition, window: Option<Counts>) {
    events::phase(at, change.to);
    events::state_changed(at, change, window, ChangeOrigin::Local, None);
}

static BREAKERS: Registry<Breaker> = Registry::new(Breaker::idle);

/// A call site's handle on its default-scope breaker, and on the settings its attribute gives.
pub(super) type SiteCache = registry::SiteCache<Breaker, (Settings, Option<Duration>, bool)>;

/// What a local breaker runs on: the kernel's settings, and the slow-call duration.
fn local_settings(values: &BreakerValues) -> (Settings, Option<Duration>, bool) {
    (values.settings(true), values.slow_after(), values.shadow)
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
    // Borrowed, not copied: a copy of the settings is read back before its stores have
    // landed and stalls on them, which cost the local breaker a fifth of its time (`perf
    // annotate`, `bench local`).
    let overridden;
    let &(ref settings, slow_after, shadow) = match coordinator::overriding() {
        None => site
            .local
            .attribute(|| local_settings(&site.resolve(None).values)),
        overriding => {
            overridden = local_settings(&site.resolve(overriding.as_ref()).values);
            &overridden
        }
    };
    let held = BREAKERS.get(&site.local, identity, || {
        events::phase(&site.at(scope), Phase::Closed);
        Breaker {
            store: Mutex::new((Store::default(), *settings)),
            closed: AtomicU64::new(0),
            tally: AtomicU64::new(Tally::DISARMED.0),
            clock: Clock::start(),
        }
    });
    // The call's every step runs in this one future: a future of its own around the admission
    // or around the body is built, then moved into the call's, and a copy of what was just
    // written stalls on its stores (`perf annotate`, `bench local`).
    let breaker = &*held;
    // The labels, made only where they are read: a closed call reads them only for a debug
    // event or the metrics, and otherwise never writes them out.
    let at = || site.at(scope).shadowed(shadow);
    // Only an admission that may start a probe needs a token.
    let mut token = 0;
    let reply = match breaker.closed_generation() {
        Some(generation) => AdmitReply::Closed {
            generation,
            transitioned: false,
        },
        None => {
            token = u128::from(NEXT_TOKEN.fetch_add(1, Ordering::Relaxed));
            breaker.with(&at(), settings, |store, now| {
                store.admit(now, token, settings, &mut Seen::default())
            })
        }
    };
    let result = match reply {
        AdmitReply::Closed { generation, .. } => {
            // An admission's event and metrics are its only readers of the labels (a local
            // policy is in no tally).
            if cfg!(feature = "metrics") || crate::events::debug_enabled() {
                events::admitted(&at(), Phase::Closed, generation, arrival);
            }
            let started = Started::now(slow_after);
            let result = AssertUnwindSafe(body).catch_unwind().await;
            started.settle(ctx, &classify, result, |verdict| {
                let Some(observation) = verdict.observation() else {
                    return;
                };
                if observation == SUCCESSES[0] && breaker.tally_success(generation) {
                    return;
                }
                let reply = breaker.with(&at(), settings, |store, now| {
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
                observed(&at(), generation, &reply);
            })
        }
        AdmitReply::ForcedClosed { generation, .. } => {
            events::admitted(&at(), Phase::ForcedClosed, generation, arrival);
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
                announce(&at(), change, None);
            }
            events::probe_started(&at(), generation, arrival);
            let slot = ProbeSlot(Some(|outcome: ProbeOutcome| {
                let reply = breaker.with(&at(), settings, |store, now| {
                    store.settle(
                        now,
                        token,
                        outcome,
                        generation,
                        settings,
                        &mut Seen::default(),
                    )
                });
                events::settled(&at(), generation, &reply);
                if let Some(change) = reply.transition() {
                    announce(&at(), change, None);
                }
            }));
            run_admitted(slow_after, ctx, &classify, body, |verdict| {
                slot.settle(verdict);
            })
            .await
        }
        AdmitReply::Open {
            generation,
            retry_after_ms,
        } => {
            let retry_after = std::time::Duration::from_millis(retry_after_ms);
            events::rejected(&at(), Phase::Open, Some(generation), Some(retry_after));
            // Shadowed, unrecorded: the breaker evolves as if the call had been refused.
            refuse(ctx, shadow, site.open_error(scope, Some(retry_after)), body).await
        }
        AdmitReply::ForcedOpen {
            generation,
            retry_after_ms,
        } => {
            let retry_after = retry_after_ms.map(std::time::Duration::from_millis);
            events::rejected(&at(), Phase::ForcedOpen, Some(generation), retry_after);
            refuse(ctx, shadow, site.open_error(scope, retry_after), body).await
        }
        AdmitReply::ProbeLimit { generation } => {
            events::rejected(&at(), Phase::HalfOpen, Some(generation), None);
            refuse(ctx, shadow, site.open_error(scope, None), body).await
        }
    };
    BREAKERS.release(identity, &held);
    result
}
