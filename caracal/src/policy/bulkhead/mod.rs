//! `#[bulkhead]`: at most `limit` bodies at once per identity.
//!
//! Distributed, a slot is a lease in the identity's Redis lease set (or the in-memory
//! coordinator's equivalent), renewed while the body runs and released when the call ends —
//! returned, failed, panicked or dropped. Local, a slot is a count in a budget shared by every
//! call site with the same identity in this process, with a FIFO line for callers that wait.

mod adaptive;
pub(crate) mod descriptor;
#[cfg(test)]
pub(super) mod differential;
pub(crate) mod distributed;
mod events;
mod keep;
pub(crate) mod kernel;
mod local;
#[cfg(feature = "tower")]
pub(crate) mod tower;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_util::future::Either;

use crate::config::overrides::{Resolved, Values};
use crate::config::{self, Setting};
use crate::coordinator::Coordinator;
use crate::ctx::CallCtx;
use crate::error::Error;
use crate::fencing;
use crate::identity::{PolicyKind, Scope};
use crate::labels::At;
use crate::metrics::LimitGauge;
use crate::policy;
use crate::policy::bulkhead::kernel::adaptive::Bounds;
use crate::priority::Thresholds;

/// The settings of one `#[bulkhead]` call site.
#[doc(hidden)]
#[derive(Debug)]
pub struct BulkheadConfig {
    /// The policy name.
    pub name: &'static str,
    /// The operation name.
    pub operation: &'static str,
    /// Bodies allowed at once (with `adaptive`, where the fleet's limit starts).
    pub limit: u32,
    /// `limit = adaptive(min, initial, max)`: the fleet's limit follows the downstream.
    pub adaptive: Option<AdaptiveLimit>,
    /// The lease TTL (distributed only).
    pub lease: Duration,
    /// How long to wait for a slot before rejecting; `None` rejects at once.
    pub max_wait: Option<Duration>,
    /// How long a finished body's lease is kept for the next caller; `None` releases it at once.
    pub keep: Option<Duration>,
    /// Per-process only.
    pub local: bool,
    /// Shadow mode: a call it would refuse runs, without a slot, and is counted.
    pub shadow: bool,
    /// The share of the limit each priority class may use.
    pub thresholds: Thresholds,
}

/// The bounds of `limit = adaptive(min, initial, max)`, checked (`1 ≤ min ≤ initial ≤ max`)
/// by the attribute or the layer that writes them.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdaptiveLimit {
    // Private: made only by `new`, which checks their order (a limit clamped between bounds
    // out of order would panic).
    min: u32,
    initial: u32,
    max: u32,
}

impl AdaptiveLimit {
    /// The bounds, which must be in order: where a site's settings are compiled, a constant
    /// out of order is a compile error.
    pub const fn new(min: u32, initial: u32, max: u32) -> Self {
        assert!(
            min <= initial && initial <= max,
            "`limit = adaptive(min, initial, max)` needs min ≤ initial ≤ max"
        );
        AdaptiveLimit { min, initial, max }
    }

    fn bounds(self) -> Bounds {
        Bounds {
            min: self.min,
            initial: self.initial,
            max: self.max,
        }
    }
}

/// The values of a bulkhead that configuration may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BulkheadValues {
    pub(crate) limit: u32,
    /// An adaptive limit's bounds, unless configuration pinned a number.
    pub(crate) adaptive: Option<Bounds>,
    pub(crate) lease: Duration,
    pub(crate) max_wait: Option<Duration>,
    pub(crate) keep: Option<Duration>,
    pub(crate) shadow: bool,
    pub(crate) thresholds: Thresholds,
}

impl Values for BulkheadValues {
    const KIND: PolicyKind = PolicyKind::Bulkhead;

    fn get(&self, key: &str) -> Option<Setting> {
        match key {
            "limit" => Some(match self.adaptive {
                Some(Bounds { min, initial, max }) => Setting::Adaptive { min, initial, max },
                None => Setting::Count(self.limit),
            }),
            "lease" => Some(Setting::Duration(self.lease)),
            "max_wait" => self.max_wait.map(Setting::Duration),
            "keep" => self.keep.map(Setting::Duration),
            "shadow" => Some(Setting::Flag(self.shadow)),
            _ => config::threshold(self.thresholds, key),
        }
    }

    fn set(&mut self, key: &str, setting: Setting) {
        match (key, setting) {
            // A number pins an adaptive limit: `unset` returns to the attribute's.
            ("limit", Setting::Count(n)) => {
                self.limit = n;
                self.adaptive = None;
            }
            ("lease", Setting::Duration(d)) => self.lease = d,
            ("max_wait", Setting::Duration(d)) => self.max_wait = Some(d),
            ("keep", Setting::Duration(d)) => self.keep = Some(d),
            ("shadow", Setting::Flag(shadow)) => self.shadow = shadow,
            _ => config::set_threshold(&mut self.thresholds, key, setting),
        }
    }

    fn lifetime(&self) -> Duration {
        self.lease
    }
}

/// One `#[bulkhead]` call site: its settings and its cached process-local state.
#[doc(hidden)]
#[derive(Debug)]
pub struct BulkheadSite {
    config: BulkheadConfig,
    local: local::SiteCache,
    limit: LimitGauge,
}

impl BulkheadSite {
    /// A call site with these settings.
    pub const fn new(config: BulkheadConfig) -> Self {
        BulkheadSite {
            config,
            local: local::SiteCache::new(),
            limit: LimitGauge::new(),
        }
    }

    fn at<'a>(&self, scope: &'a Scope) -> At<'a> {
        At {
            policy: descriptor::DESCRIPTOR.kind.as_str(),
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

    /// The values in force: the attribute's, with `coordinator`'s overrides applied.
    fn resolve(&self, coordinator: Option<&Coordinator>) -> Resolved<BulkheadValues> {
        let config = &self.config;
        let attribute = BulkheadValues {
            limit: config.limit,
            adaptive: config.adaptive.map(AdaptiveLimit::bounds),
            lease: config.lease,
            max_wait: config.max_wait,
            keep: config.keep,
            shadow: config.shadow,
            thresholds: config.thresholds,
        };
        let resolved = Coordinator::resolve(coordinator, config.name, &attribute);
        if resolved.values.adaptive.is_none() {
            self.report_limit(resolved.values.limit);
        }
        resolved
    }

    /// `limit` is in force here.
    fn report_limit(&self, limit: u32) {
        self.limit
            .report(self.config.name, self.config.operation, limit);
    }

    fn full(&self, scope: &Scope, limit: u32) -> Error {
        Error::BulkheadFull {
            policy: self.config.name,
            scope: scope.to_string(),
            limit,
        }
    }
}

/// Runs `body` once a slot is free, holding the slot until the call ends.
#[doc(hidden)]
pub async fn bulkhead<T, E, F>(
    site: &BulkheadSite,
    ctx: &CallCtx,
    scope: &Result<Scope, Error>,
    body: F,
) -> Result<T, E>
where
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    if !site.config.local {
        let scope = ctx.scope(scope)?;
        // Boxed: the distributed path's state is large, and keeping it inline would make every
        // local call's future that large too. One allocation is nothing next to a round trip.
        return policy::boxed(|| distributed::run(site, ctx, scope, body)).await;
    }
    // The local path runs in this one future, not in one of its own: a layer of futures (its
    // state, the result's moves, its drop) cost the local bulkhead as much as its admission
    // (callgrind, `bench local`). A local bulkhead that guards a whole function takes the same
    // steps in the function's own future (the attribute's expansion).
    let mut slot = LocalSlot::new();
    match local_bulkhead(site, ctx, scope, &mut slot) {
        AtOnce::Admitted => {}
        AtOnce::Refused(error) => return Err(error),
        AtOnce::Wait(line) => return wait_in_line(line, ctx, &mut slot, body).await,
    }
    // The body itself is awaited here, not a future around it (an `Either` from `unfenced`
    // cost the local bulkhead 10 of its 370 instructions a call: callgrind, `bench local`).
    match fenced_off(body) {
        Ok(fenced_off) => fenced_off.await,
        Err(body) => body.await,
    }
}

/// Where a local bulkhead keeps a call's slot until the call ends: in the future of the
/// function it guards (made by the expansion), or of [`bulkhead`].
#[doc(hidden)]
pub struct LocalSlot<'s>(local::SlotPlace<'s>);

impl LocalSlot<'_> {
    /// No slot yet.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        LocalSlot(None)
    }
}

/// A local bulkhead's decision on a call, made at once.
#[doc(hidden)]
pub enum AtOnce<'s, E> {
    /// A slot is held (or a shadow bulkhead lets the call run without one): run the body.
    Admitted,
    /// Refused, with the rejection recorded in the call's context (unless it records nothing).
    Refused(E),
    /// No slot is free and `max_wait` allows waiting for one: [`wait_in_line`] decides.
    Wait(Line<'s>),
}

/// The place of a caller that waits for a local slot. Boxed: rare, and large.
#[doc(hidden)]
pub struct Line<'s>(Box<local::Line<'s>>);

/// Decides at once on a call of a local bulkhead, its slot going to `slot`. The expansion of a
/// local bulkhead that guards its whole function calls it, and awaits the body in the
/// function's own future rather than in a future of the bulkhead's around it (whose state,
/// result and drop cost a call a tenth of its instructions: callgrind, `bench local`).
#[doc(hidden)]
#[inline(always)]
pub fn local_bulkhead<'s, E: From<Error>>(
    site: &'s BulkheadSite,
    ctx: &CallCtx,
    scope: &'s Result<Scope, Error>,
    slot: &mut LocalSlot<'s>,
) -> AtOnce<'s, E> {
    let scope = match ctx.scope(scope) {
        Ok(scope) => scope,
        Err(error) => return AtOnce::Refused(error),
    };
    match local::admit(site, scope, &mut slot.0) {
        local::Admission::Decided(None) => AtOnce::Admitted,
        local::Admission::Decided(Some(limit)) => {
            AtOnce::Refused(ctx.reject(site.full(scope, limit)))
        }
        local::Admission::Wait(line) => AtOnce::Wait(Line(line)),
    }
}

/// Waits in `line`, up to the bulkhead's `max_wait`, for a slot, which goes to `slot`, then
/// runs `body`; else the rejection, recorded in the call's context. Boxed, so that waiting
/// (rare) takes no room in every call's future.
#[doc(hidden)]
pub fn wait_in_line<'a, 's: 'a, T, E, F>(
    line: Line<'s>,
    ctx: &'a CallCtx,
    slot: &'a mut LocalSlot<'s>,
    body: F,
) -> Pin<Box<impl Future<Output = Result<T, E>> + 'a>>
where
    E: From<Error> + 'a,
    F: Future<Output = Result<T, E>> + 'a,
{
    Box::pin(async move {
        let (site, scope) = line.0.at();
        if let Some(limit) = line.0.wait(&mut slot.0).await {
            return Err(ctx.reject(site.full(scope, limit)));
        }
        unfenced(body).await
    })
}

/// Runs `body` without a slot (a local slot, or a call a shadow bulkhead would have refused):
/// it carries no fencing token, even inside a distributed bulkhead's body. Not an `async fn`,
/// so the common case is the body itself, without a future around it.
#[inline]
fn unfenced<F: Future>(body: F) -> impl Future<Output = F::Output> {
    match fenced_off(body) {
        Ok(fenced_off) => Either::Left(fenced_off),
        Err(body) => Either::Right(body),
    }
}

/// Inside a fenced body, `body` in a scope where it carries no fencing token; elsewhere, where
/// it carries none anyway, `body` as it is (`Err`).
#[doc(hidden)]
#[inline]
pub fn fenced_off<F: Future>(body: F) -> Result<Pin<Box<impl Future<Output = F::Output>>>, F> {
    if fencing::inside_fenced_body() {
        // Boxed: rare, and the token's scope would make every call's future larger.
        Ok(Box::pin(fencing::scope(None, body)))
    } else {
        Err(body)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod classes;
