//! `#[hedge]`: after `delay` without an answer, another attempt beside the first; the first
//! `Ok` is the call's and the other attempts are dropped.
//!
//! **Attempts.** The layers inside the hedge run once per attempt, each admitted on its own (a
//! bulkhead below counts every attempt in flight). Extra attempt *k* starts `delay` after
//! attempt *k − 1* while none has answered `Ok`, up to `max_extra`. An attempt that fails waits
//! for the others; the call returns the last `Err` when every attempt started has failed,
//! preferring one that reached the downstream (an answer, or a timeout cutting it) over
//! caracal's refusal of an attempt (admission, a breaker, a coordinator): a breaker or a retry
//! above sees the downstream's failure rather than a hedge's refused extra. An
//! attempt dropped because another won is cancelled like any dropped future: what it holds
//! (leases, probe slots) is released by its guards.
//!
//! **The delay.** A duration, or `pNN`: the fleet's latency at that percentile for the hedge's
//! identity (see `delay.rs`), clamped to `min_delay..=max_delay`, and `max_delay` until the
//! fleet has seen enough attempts to know it. It is read once per call, with no round trip.
//!
//! **The budget.** `budget = "name"` makes each extra attempt withdraw from the
//! `#[retry_budget]` of that name (see `budget.rs`): hedges and retries share one fleet-wide
//! budget, and an extra attempt the budget refuses is not sent, nor any after it
//! (`hedge.refused`, summarised). The budget counts one deposit per call that reached the
//! downstream, whichever of the hedge and a `#[retry_budget]` of the same name on the function
//! makes it.

use std::future::Future;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;

use crate::ctx::{CallCtx, Taken};
use crate::error::Error;
use crate::identity::{FunctionIdentity, Scope};

mod budget;
mod delay;
mod events;
pub(crate) mod latency;
#[cfg(test)]
mod tests;
#[cfg(feature = "tower")]
pub(crate) mod tower;

pub use self::delay::Delay;

/// The settings of one `#[hedge]` call site.
#[doc(hidden)]
#[derive(Debug)]
pub struct HedgeConfig {
    /// The hedge's identity, for events, metrics and its latency.
    pub identity: FunctionIdentity,
    /// How long an attempt goes unanswered before the next starts.
    pub delay: Delay,
    /// Extra attempts at most, 1 to 3.
    pub max_extra: u32,
    /// The `#[retry_budget]` extra attempts withdraw from.
    pub budget: Option<&'static str>,
    /// Whether a percentile delay is learnt from this process's attempts alone.
    pub local: bool,
}

/// One `#[hedge]` call site (or tower layer): its settings, and the budget its name resolved
/// to on first use.
#[doc(hidden)]
#[derive(Debug)]
pub struct HedgeSite {
    config: HedgeConfig,
    budget: budget::Resolved,
}

impl HedgeSite {
    /// A call site with these settings.
    pub const fn new(config: HedgeConfig) -> Self {
        HedgeSite {
            config,
            budget: budget::Resolved::new(),
        }
    }

    fn name(&self) -> &'static str {
        self.config.identity.name
    }
}

/// Runs `attempt()` as the first attempt, and again beside it each `delay` it stays
/// unanswered (see the module docs); `scope` is the hedge's.
#[doc(hidden)]
pub async fn hedge<T, E, F, Fut>(
    site: &'static HedgeSite,
    ctx: &CallCtx,
    scope: &Result<Scope, Error>,
    attempt: F,
) -> Result<T, E>
where
    E: From<Error>,
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let scope = ctx.scope(scope)?;
    let latency = delay::latency(site, scope).map_err(|error| ctx.reject(error))?;
    let delay = site.config.delay.now(latency.as_deref());
    let mut budget = budget::Budget::of(site, scope);
    let timed = |index: u32| {
        let started = Instant::now();
        let attempt = attempt();
        async move { (index, started, attempt.await) }
    };
    let mut running = FuturesUnordered::new();
    let mut unfinished = Unfinished::default();
    unfinished.began(0);
    running.push(timed(0));
    let mut started = 0;
    let mut next = Some(Box::pin(tokio::time::sleep(delay)));
    // The last failure, and the rejection that caused it if caracal's: restored in the
    // context when it becomes the call's result, so the layers outside see it as theirs.
    let mut failed: Option<(E, Option<Taken>)> = None;
    let result = loop {
        tokio::select! {
            biased;
            Some((index, began, result)) = running.next() => {
                // Taken at once, in the poll that ended the attempt, before another attempt
                // runs and could record a rejection of its own.
                let rejection = ctx.take_rejection();
                unfinished.ended(index);
                if rejection.is_none() && let Some(latency) = &latency {
                    latency.observe(began.elapsed());
                }
                match result {
                    Ok(value) => {
                        if index > 0 {
                            events::won(site);
                        }
                        if let Some(latency) = &latency {
                            unfinished.observe_outrun(began, latency.as_ref());
                        }
                        break Ended::Answered(value);
                    }
                    Err(error) => {
                        // A failure of the downstream outranks caracal's refusal of another
                        // attempt: the layers above (a breaker, a retry) must see the real one.
                        let outranks = failed.as_ref().is_none_or(|(_, earlier)| {
                            Taken::reached(rejection.as_ref()) || !Taken::reached(earlier.as_ref())
                        });
                        if outranks {
                            failed = Some((error, rejection));
                        }
                        // Nothing left to wait for: a hedge waits beside a slow attempt, it
                        // does not retry a failed one.
                        if running.is_empty() {
                            break Ended::Failed;
                        }
                    }
                }
            }
            () = async { next.as_mut().expect("checked by the guard").await }, if next.is_some() => {
                started += 1;
                let allowed = match budget.allows_another(ctx).await {
                    Ok(allowed) => allowed,
                    Err(error) => break Ended::Unbudgeted(error),
                };
                if allowed {
                    events::sent(site, scope, started, delay);
                    unfinished.began(started);
                    running.push(timed(started));
                    next = (started < site.config.max_extra)
                        .then(|| Box::pin(tokio::time::sleep(delay)));
                } else {
                    events::refused(site, scope, started);
                    next = None;
                }
            }
        }
    };
    drop(running);
    let (result, last) = match result {
        Ended::Answered(value) => (Ok(value), None),
        // The budget named nowhere: the call's error, whatever its attempts did.
        Ended::Unbudgeted(error) => return Err(ctx.reject(error)),
        Ended::Failed => {
            let (error, rejection) = failed.expect("an attempt failed");
            (Err(error), rejection)
        }
    };
    budget.settle(ctx, last.as_ref()).await;
    ctx.put_back(last);
    result
}

/// When each attempt still running began (the first and up to three extra).
///
/// An attempt dropped because another won never reports its latency, and those are the slow
/// ones: left out, the fleet's percentile would drift down while hedges win, and hedge ever
/// sooner. One that began before the winner has run longer than the winner's whole latency;
/// the time it has run is recorded, a lower bound of its own, so the tail is never read
/// shorter than the attempts showed. (One that began after the winner says nothing.)
#[derive(Debug, Default)]
struct Unfinished([Option<Instant>; 4]);

impl Unfinished {
    fn began(&mut self, index: u32) {
        if let Some(slot) = self.0.get_mut(index as usize) {
            *slot = Some(Instant::now());
        }
    }

    fn ended(&mut self, index: u32) {
        if let Some(slot) = self.0.get_mut(index as usize) {
            *slot = None;
        }
    }

    /// Records the attempts the winner, which began at `winner`, outran.
    fn observe_outrun(&self, winner: Instant, latency: &dyn delay::Latency) {
        for began in self.0.iter().flatten().filter(|began| **began < winner) {
            latency.observe(began.elapsed());
        }
    }
}

/// How the attempts of a call ended.
enum Ended<T> {
    /// One answered `Ok`.
    Answered(T),
    /// Every attempt started failed.
    Failed,
    /// The named budget could not be had.
    Unbudgeted(Error),
}

/// The delay in events.
fn millis(delay: Duration) -> u64 {
    u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)
}
