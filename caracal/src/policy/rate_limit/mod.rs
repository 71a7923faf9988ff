//! `#[rate_limit]`: a shared GCRA rate per identity.
//!
//! Each attempt is charged at admission (one script call, on Redis time) and never refunded.
//! A rejected call gets [`Error::RateLimited`] with the exact wait until an admission is
//! possible. Coordinator failure rejects (fail closed): a rate limit that silently stopped
//! limiting would be worse than one that refuses while it cannot count.
//!
//! With `prefetch = k` a distributed rate's call that asks the coordinator takes up to `k`
//! emissions at once, and the process hands the rest to its next callers while they are due
//! ([`prefetch`]).

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::Clock;
use crate::config::overrides::Values;
use crate::config::{self, Setting};
use crate::coordinator::registry::{Registered, Snapshot};
use crate::coordinator::{self, Coordinator};
use crate::ctx::CallCtx;
use crate::error::{Error, FailureKind};
use crate::identity::{PolicyKind, Scope};
use crate::kernel::Seen;
use crate::labels::At;
use crate::policy::descriptor::{Decisions, Descriptor, Field, StatusValue, Unit};
use crate::policy::rate_limit::kernel as gcra;
use crate::policy::registry::{self, Registry};
use crate::priority::{Priority, Thresholds};
use crate::sync::lock;

#[cfg(test)]
mod classes;
#[cfg(test)]
pub(super) mod differential;
pub(crate) mod kernel;
mod prefetch;
#[cfg(test)]
mod prefetch_tests;
#[cfg(feature = "tower")]
pub(crate) mod tower;

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
    /// Shadow mode: a call over the rate runs, uncharged, and is counted.
    pub shadow: bool,
    /// The share of the burst each priority class may use.
    pub thresholds: Thresholds,
    /// Emissions a call that asks the coordinator takes at once (1: its own only).
    pub prefetch: u32,
}

/// The values of a rate limit that configuration may change.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RateValues {
    rate: f64,
    burst: u32,
    shadow: bool,
    thresholds: Thresholds,
    prefetch: u32,
}

/// The decision for one arrival — `Ok(Ok(()))` admitted, `Ok(Err(wait))` rejected — and
/// whether the rate limit is in shadow mode. (Its telemetry reads the arrival's class from the
/// task, as the decision did.)
struct Decided {
    decision: Result<Result<(), Duration>, Error>,
    shadow: bool,
}

impl Values for RateValues {
    const KIND: PolicyKind = PolicyKind::RateLimit;

    fn get(&self, key: &str) -> Option<Setting> {
        match key {
            "rate" => Some(Setting::Number(self.rate)),
            "burst" => Some(Setting::Count(self.burst)),
            "shadow" => Some(Setting::Flag(self.shadow)),
            "prefetch" => Some(Setting::Count(self.prefetch)),
            _ => config::threshold(self.thresholds, key),
        }
    }

    fn set(&mut self, key: &str, setting: Setting) {
        match (key, setting) {
            ("rate", Setting::Number(rate)) => self.rate = rate,
            ("burst", Setting::Count(burst)) => self.burst = burst,
            ("shadow", Setting::Flag(shadow)) => self.shadow = shadow,
            ("prefetch", Setting::Count(prefetch)) => self.prefetch = prefetch,
            _ => config::set_threshold(&mut self.thresholds, key, setting),
        }
    }

    fn lifetime(&self) -> Duration {
        Duration::from_secs_f64(f64::from(self.burst) / self.rate)
    }
}

/// The rate limit kind. Its state (a theoretical arrival time) says nothing an operator
/// reads: its status is the values processes report.
pub(crate) const DESCRIPTOR: Descriptor = Descriptor {
    kind: PolicyKind::RateLimit,
    fields: &[
        // Admissions per second processes use, and the burst (the last reported).
        Field::new("rate", Unit::PerSecond),
        Field::new("burst", Unit::Count),
    ],
    table: ["{rate}/s", "[burst {burst}]"],
    read: None,
    status,
    events: &[
        "rate_limit.admitted",
        "rate_limit.would_reject",
        "rate_limit.rejected",
        "rate_limit.degraded",
        "rate_limit.prefetched",
        "rate_limit.prefetch_used",
        "rate_limit.prefetch_returned",
        "rate_limit.prefetch_expired",
    ],
    decisions: Decisions {
        admitted: &["admitted"],
        rejected: &["rate_exceeded"],
        degraded: &["fail_closed"],
    },
};

fn status(reported: &Registered, _: &Snapshot) -> Result<Vec<StatusValue>, Error> {
    Ok(vec![
        reported
            .parsed::<f64>("rate")
            .map_or(StatusValue::Unset, StatusValue::Number),
        StatusValue::count(reported.parsed::<u32>("burst")),
    ])
}

/// One identity's local cell: its theoretical arrival time on its own clock.
#[derive(Debug)]
pub(crate) struct Cell {
    clock: Clock,
    tat: Mutex<Option<u64>>,
}

impl Cell {
    fn new() -> Self {
        Cell {
            clock: Clock::start(),
            tat: Mutex::new(None),
        }
    }

    /// A cell whose TAT has passed no longer matters.
    fn idle(&self) -> bool {
        lock(&self.tat).is_none_or(|tat| tat <= self.clock.ns())
    }
}

/// Every local cell of the process.
static CELLS: Registry<Cell> = Registry::new(Cell::idle);

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
            policy: DESCRIPTOR.kind.as_str(),
            name: self.config.name,
            operation: self.config.operation,
            scope: scope.as_str(),
            coordination: if self.config.local {
                "local"
            } else {
                "distributed"
            },
            shadow: false,
        }
    }

    /// The decision for one arrival.
    async fn decide(&self, scope: &Scope) -> Decided {
        if let Some(decided) = self.decide_locally(scope) {
            return decided;
        }
        let priority = Priority::current();
        let config = &self.config;
        let coordinator = coordinator::current();
        let resolved = Coordinator::resolve(coordinator.as_ref().ok(), config.name, &self.values());
        let values = resolved.values;
        let RateValues {
            rate,
            burst,
            shadow,
            thresholds,
            ..
        } = values;
        let coordinator = match coordinator {
            Ok(coordinator) => coordinator,
            Err(error) => {
                return Decided {
                    decision: Err(error),
                    shadow,
                };
            }
        };
        let identity =
            coordinator.identity(PolicyKind::RateLimit, config.name, config.operation, scope);
        coordinator.uses().note_use(&identity, self, &resolved);
        let interval = gcra::interval_ns(rate);
        let take = prefetching(&values);
        let pool = (take > 1).then(|| prefetch::Pool::of(&coordinator));
        if let Some(pool) = &pool
            && pool.hand_out(&identity, interval, burst)
        {
            return Decided {
                decision: Ok(Ok(())),
                shadow,
            };
        }
        let arrival = gcra::Arrival {
            interval,
            burst,
            share: thresholds.thousandths(priority),
            take,
        };
        let ran = coordinator.run_sent::<gcra::Gcra>(&identity, arrival).await;
        let ran = ran.and_then(|(reply, sent)| match reply {
            Ok(taken) if !taken.fits(take, interval) => Err(Error::unavailable(
                FailureKind::MalformedReply,
                format!("rate limit admission replied {taken:?} to a take of {take}"),
            )),
            reply => Ok((reply, sent)),
        });
        let decision = match ran {
            Ok((Ok(taken), sent)) => {
                if let Some(pool) = pool.filter(|_| taken.extra > 0) {
                    pool.hold(&coordinator, &identity, (interval, burst), sent, taken);
                }
                Ok(Ok(()))
            }
            // Another caller here may have taken emissions while this one's arrival was
            // queued or in flight (a take sent before this one's batch, which spent the burst):
            // one due now is this caller's, never a refusal.
            Ok((Err(_), _))
                if pool
                    .as_ref()
                    .is_some_and(|pool| pool.hand_out(&identity, interval, burst)) =>
            {
                Ok(Ok(()))
            }
            Ok((Err(wait), _)) => Ok(Err(Duration::from_nanos(wait))),
            Err(error) => {
                events::degraded(&self.at(scope), &error);
                Err(error)
            }
        };
        Decided { decision, shadow }
    }

    /// The attribute's values.
    fn values(&self) -> RateValues {
        RateValues {
            rate: self.config.rate,
            burst: self.config.burst,
            shadow: self.config.shadow,
            thresholds: self.config.thresholds,
            prefetch: self.config.prefetch,
        }
    }

    /// A local rate's decision, made at once (`None` for a distributed rate, which asks the
    /// coordinator).
    fn decide_locally(&self, scope: &Scope) -> Option<Decided> {
        let config = &self.config;
        if !config.local {
            return None;
        }
        let priority = Priority::current();
        // A local rate needs a coordinator only for its overrides.
        let coordinator = coordinator::overriding().ok_or(Error::NotInstalled);
        let resolved = Coordinator::resolve(coordinator.as_ref().ok(), config.name, &self.values());
        let RateValues {
            rate,
            burst,
            shadow,
            thresholds,
            ..
        } = resolved.values;
        let terms = (burst, thresholds.thousandths(priority));
        let interval = gcra::interval_ns(rate);
        let identity = (config.name, config.operation, scope);
        let cell = CELLS.get(&self.local, identity, Cell::new);
        let decision = {
            let mut tat = lock(&cell.tat);
            let now = cell.clock.ns();
            gcra::admit(*tat, now, interval, terms, &mut Seen::default())
                .map(|next| *tat = Some(next))
                .map_err(Duration::from_nanos)
        };
        CELLS.release(identity, &cell);
        Some(Decided {
            decision: Ok(decision),
            shadow,
        })
    }

    /// Reports the decision for an arrival at `arrival`: `Ok` lets the call run — admitted,
    /// or refused by a shadow rate limit (a refused arrival is never charged, so the cell is
    /// as the enforcing one's would be). A call made before any coordinator was installed is
    /// a mistake to fix, never shadowed.
    fn settle(
        &self,
        scope: &Scope,
        Decided {
            decision, shadow, ..
        }: Decided,
        arrival: crate::metrics::Stopwatch,
    ) -> Result<(), Error> {
        let at = self.at(scope).shadowed(shadow);
        let refused = match decision {
            Ok(Ok(())) => {
                events::admitted(&at, arrival);
                return Ok(());
            }
            Err(Error::NotInstalled) => {
                events::rejected(&at.shadowed(false), None);
                return Err(Error::NotInstalled);
            }
            Ok(Err(retry_after)) => {
                events::rejected(&at, Some(retry_after));
                Error::RateLimited {
                    policy: self.config.name,
                    scope: scope.to_string(),
                    retry_after,
                }
            }
            Err(error) => {
                events::rejected(&at, None);
                error
            }
        };
        if shadow { Ok(()) } else { Err(refused) }
    }
}

/// How many emissions a call that asks the coordinator takes: `prefetch`, except where an
/// emission handed out later could change what a caller sees. With thresholds, an emission a
/// lower class took ahead would be handed to it after the burst it may use ran out; a shadow
/// rate's refusals are counted, not enforced, so it has nothing to save.
fn prefetching(values: &RateValues) -> u32 {
    if values.thresholds.is_none() && !values.shadow {
        values.prefetch.max(1)
    } else {
        1
    }
}

/// Admits `body` if the site's rate allows it now.
#[doc(hidden)]
pub async fn rate_limit<T, E, F>(
    site: &RateLimitSite,
    ctx: &CallCtx,
    scope: &Result<Scope, Error>,
    body: F,
) -> Result<T, E>
where
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    let arrival = crate::metrics::Stopwatch::start();
    let scope = ctx.scope(scope)?;
    let decision = site.decide(scope).await;
    site.settle(scope, decision, arrival)
        .map_err(|error| ctx.reject(error))?;
    body.await
}

/// The kind's events (see [`crate::events`]).
mod events {
    use std::time::Duration;

    use crate::error::Error;
    use crate::events::{millis, policy_event, rejected_or_degraded};
    use crate::labels::At;
    use crate::metrics::{self, Prefetched, Stopwatch};
    use crate::priority::Priority;
    use crate::summary;

    /// A rate limit admitted a call that reached it at `arrival`.
    pub(super) fn admitted(at: &At<'_>, arrival: Stopwatch) {
        policy_event!(
            DEBUG,
            "rate_limit.admitted",
            at,
            priority = at.priority().map(Priority::as_str)
        );
        metrics::admitted(at, "admitted", arrival);
    }

    /// `retry_after` is `None` when the rejection is a coordinator failure (fail closed).
    pub(super) fn rejected(at: &At<'_>, retry_after: Option<Duration>) {
        let reason = if retry_after.is_some() {
            "rate_exceeded"
        } else {
            "coordinator_unavailable"
        };
        rejected_or_degraded(at, reason);
        if at.shadow {
            return crate::events::would_reject!("rate_limit.would_reject", at, reason);
        }
        let Some(suppressed) = summary::repeat("rate_limit.rejected", at, &[reason]) else {
            return;
        };
        policy_event!(
            DEBUG,
            "rate_limit.rejected",
            at,
            reason,
            retry_after_ms = retry_after.map(millis),
            retry_after_us = retry_after.map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
            priority = at.priority().map(Priority::as_str),
            suppressed
        );
    }

    /// A call took `extra` emissions beyond its own, for the process to hand out.
    pub(super) fn prefetched(at: &At<'_>, extra: u32) {
        policy_event!(DEBUG, "rate_limit.prefetched", at, extra);
        metrics::prefetched(at, Prefetched::Taken, extra);
    }

    /// A call was admitted on an emission taken ahead, with no round trip.
    pub(super) fn prefetch_used(at: &At<'_>) {
        policy_event!(DEBUG, "rate_limit.prefetch_used", at);
        metrics::prefetched(at, Prefetched::Used, 1);
    }

    /// `count` emissions taken ahead went back to the fleet unused.
    pub(super) fn prefetch_returned(at: &At<'_>, count: u32) {
        policy_event!(DEBUG, "rate_limit.prefetch_returned", at, count);
        metrics::prefetched(at, Prefetched::Returned, count);
    }

    /// `count` emissions taken ahead expired unused (their slots started).
    pub(super) fn prefetch_expired(at: &At<'_>, count: u32) {
        policy_event!(DEBUG, "rate_limit.prefetch_expired", at, count);
        metrics::prefetched(at, Prefetched::Expired, count);
    }

    pub(super) fn degraded(at: &At<'_>, error: &Error) {
        let failure = error.failure_kind().map(|k| k.as_str());
        let condition = [failure.unwrap_or(error.code())];
        let Some(said) = crate::policy::repeat_across("rate_limit.degraded", at, &condition) else {
            return;
        };
        policy_event!(
            WARN,
            "rate_limit.degraded",
            at,
            reason = "admission_unknown",
            error = error.code(),
            failure,
            suppressed = said.suppressed,
            identities = said.identities
        );
    }
}
