//! How long an attempt goes unanswered before the next: a duration, or a percentile of the
//! latency the fleet observes for the hedge's identity.
//!
//! **The rule for `delay = pNN`.** The delay of a call is the fleet's latest merged view of the
//! identity's attempt latencies at that percentile, clamped to `min_delay..=max_delay`; while
//! the view has too few samples to say, it is `max_delay` (a fleet that does not know its tail
//! yet hedges late rather than doubling its load). Reading it costs no round trip, and every
//! finished attempt (its own latency, not the call's) feeds it.
//!
//! The fleet's view is the latency module's ([`FleetLatency`]), under the identity of the
//! hedge's name and operation (keys of their own beside a bulkhead's of that name). A hedge
//! marked `local` learns nothing yet: its percentile delay is `max_delay`.

use std::sync::Arc;
use std::time::Duration;

use super::HedgeSite;
use super::latency::{FleetLatency, fleet_latency};
use crate::coordinator::Coordinator;
use crate::error::Error;
use crate::identity::{Identity, PolicyKind, Scope};

/// How long an attempt goes unanswered before the next starts.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Delay {
    /// This long.
    Fixed(Duration),
    /// The fleet's latency at `per_mille` thousandths, within `floor..=ceiling`.
    Percentile {
        /// `p95` is 950.
        per_mille: u16,
        /// The shortest delay.
        floor: Duration,
        /// The longest, and the delay until the percentile is known.
        ceiling: Duration,
    },
}

impl Delay {
    /// The delay for a call now, from `latency` (the fleet's view, for a percentile).
    pub(super) fn now(&self, latency: Option<&dyn Latency>) -> Duration {
        match *self {
            Delay::Fixed(delay) => delay,
            Delay::Percentile {
                per_mille,
                floor,
                ceiling,
            } => latency
                .and_then(|latency| latency.quantile(per_mille))
                .map_or(ceiling, |seen| seen.clamp(floor, ceiling)),
        }
    }
}

/// What a hedge knows of its identity's latency: the seam the fleet's view plugs into.
pub(crate) trait Latency: Send + Sync + std::fmt::Debug {
    /// A finished attempt took `latency`.
    fn observe(&self, latency: Duration);

    /// The latency at `per_mille` thousandths as last learnt, `None` until enough samples.
    fn quantile(&self, per_mille: u16) -> Option<Duration>;
}

/// The latency view of `site` at `scope`, for a percentile delay: `NotInstalled` without a
/// coordinator (a fleet percentile never silently becomes a guess).
pub(super) fn latency(
    site: &'static HedgeSite,
    scope: &Scope,
) -> Result<Option<Arc<dyn Latency>>, Error> {
    let Delay::Percentile { .. } = site.config.delay else {
        return Ok(None);
    };
    if site.config.local {
        return Ok(Some(Arc::new(Unknown)));
    }
    crate::coordinator::with_current(|coordinator| {
        Some(fleet_latency(coordinator, &identity(coordinator, site, scope)) as Arc<dyn Latency>)
    })
}

/// The identity whose latency `site` learns at `scope`.
pub(super) fn identity(coordinator: &Coordinator, site: &HedgeSite, scope: &Scope) -> Identity {
    let identity = &site.config.identity;
    // The hedge is no kind with state of its own: its latency lives beside the bulkhead's
    // identity of the same name (its keys' suffixes are its own).
    coordinator.identity(
        PolicyKind::Bulkhead,
        identity.name,
        identity.operation,
        scope,
    )
}

impl Latency for FleetLatency {
    fn observe(&self, latency: Duration) {
        FleetLatency::observe(self, latency);
    }

    fn quantile(&self, per_mille: u16) -> Option<Duration> {
        FleetLatency::quantile(self, per_mille)
    }
}

/// A local hedge's view: knows no percentile.
#[derive(Debug)]
struct Unknown;

impl Latency for Unknown {
    fn observe(&self, _: Duration) {}

    fn quantile(&self, _: u16) -> Option<Duration> {
        None
    }
}
