//! The bulkhead as a tower layer: [`BulkheadLayer`], its service [`Bulkhead`], and the policy
//! that service applies.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tower::{BoxError, Layer};

use super::{AdaptiveLimit, BulkheadConfig, BulkheadSite, local};
use crate::ctx::CallCtx;
use crate::error::Error;
use crate::guard::layer::{Identity, count, duration, identity_setters};
use crate::guard::{Admission, Admit, BoxCall, Guarded, Permit};
use crate::identity::{PolicyKind, Scope};
use crate::policy::bulkhead;
use crate::priority::Thresholds;

/// A shared concurrency limit, like `#[bulkhead]`.
pub struct BulkheadLayer<Req> {
    identity: Identity<Req>,
    limit: Option<u32>,
    adaptive: Option<AdaptiveLimit>,
    lease: Duration,
    max_wait: Option<Duration>,
    keep: Option<Duration>,
    local: bool,
    shadow: bool,
    thresholds: Thresholds,
}

impl<Req> BulkheadLayer<Req> {
    /// The bulkhead `name`; set its [`limit`](Self::limit).
    pub fn new(name: &str) -> Self {
        BulkheadLayer {
            identity: Identity::new(name),
            limit: None,
            adaptive: None,
            lease: caracal_spec::bulkhead::LEASE.default.duration(),
            max_wait: None,
            keep: None,
            local: false,
            shadow: caracal_spec::SHADOW.default.flag(),
            thresholds: Thresholds::NONE,
        }
    }

    /// At most this many requests at once per identity, across every process.
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = Some(count(PolicyKind::Bulkhead, "limit", limit));
        self.adaptive = None;
        self
    }

    /// One limit for the whole fleet that follows the downstream's latency, from `initial`
    /// within `[min, max]`, as `#[bulkhead(limit = adaptive(min = …, initial = …, max = …))]`
    /// does. Not with [`local`](Self::local): the limit is computed from every process's calls.
    ///
    /// # Panics
    ///
    /// Unless `1 ≤ min ≤ initial ≤ max ≤ 1 000 000`.
    ///
    /// ```
    /// use caracal::tower::BulkheadLayer;
    ///
    /// let layer = BulkheadLayer::<()>::new("partner-api").adaptive(2, 20, 400);
    /// # let _ = layer;
    /// ```
    pub fn adaptive(mut self, min: u32, initial: u32, max: u32) -> Self {
        let [min, initial, max] =
            [min, initial, max].map(|n| count(PolicyKind::Bulkhead, "limit", n));
        assert!(
            min <= initial && initial <= max,
            "caracal::tower: BulkheadLayer `{}`: adaptive limits need min ≤ initial ≤ max, not \
             {min}, {initial}, {max}",
            self.identity.name
        );
        self.limit = Some(initial);
        self.adaptive = Some(AdaptiveLimit::new(min, initial, max));
        self
    }

    /// The lease's time to live (30 s by default).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = duration(PolicyKind::Bulkhead, "lease", lease);
        self
    }

    /// Wait up to this long for a slot before rejecting (by default, reject at once).
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(duration(PolicyKind::Bulkhead, "max_wait", max_wait));
        self
    }

    /// Keep a finished request's lease up to this long for the next request of the identity
    /// in this process, which then starts on it without a round trip, as
    /// `#[bulkhead(keep = "5ms")]` does (by default a lease is released at once). The kept
    /// lease stays in the fleet's lease set, so the limit holds across the fleet; the rules
    /// for when a lease is kept, handed on or returned are the attribute's (see the
    /// attributes guide, "Kept leases"). Not with [`local`](Self::local): a local slot costs no
    /// round trip.
    ///
    /// # Panics
    ///
    /// When the layer is applied, if `keep` is more than a third of the
    /// [`lease`](Self::lease): a kept lease is handed on only until its first renewal is due,
    /// so the rest would hold a slot for nothing (the attribute refuses it at compile time).
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// use caracal::tower::BulkheadLayer;
    ///
    /// let layer = BulkheadLayer::<()>::new("partner-api")
    ///     .limit(20)
    ///     .keep(Duration::from_millis(5));
    /// # let _ = layer;
    /// ```
    pub fn keep(mut self, keep: Duration) -> Self {
        self.keep = Some(duration(PolicyKind::Bulkhead, "keep", keep));
        self
    }

    /// Shadow mode, as `#[bulkhead(shadow = true)]`: a request the bulkhead would refuse runs
    /// anyway, without a slot, and is counted as `would_reject`.
    ///
    /// ```
    /// use caracal::tower::BulkheadLayer;
    ///
    /// let layer = BulkheadLayer::<()>::new("partner-api").limit(20).shadow(true);
    /// # let _ = layer;
    /// ```
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// The share of the limit each class below `Critical` may use, as
    /// `#[bulkhead(thresholds(…))]`: a request is admitted only while fewer than
    /// [`cap`](Thresholds::cap) of its [`Priority`](crate::Priority) are in use. By default
    /// every class has the whole limit. A request's class comes from
    /// [`PriorityLayer`](crate::tower::PriorityLayer) above this layer.
    ///
    /// ```
    /// use caracal::Thresholds;
    /// use caracal::tower::BulkheadLayer;
    ///
    /// let shares = Thresholds::new(0.8, 0.5)?;
    /// let layer = BulkheadLayer::<()>::new("partner-api").limit(30).thresholds(shares);
    /// # let _ = layer;
    /// # Ok::<(), caracal::Error>(())
    /// ```
    pub fn thresholds(mut self, thresholds: Thresholds) -> Self {
        self.thresholds = thresholds;
        self
    }

    identity_setters!();
}

impl<Req> Clone for BulkheadLayer<Req> {
    fn clone(&self) -> Self {
        BulkheadLayer {
            identity: self.identity.clone(),
            ..*self
        }
    }
}

impl<Req> fmt::Debug for BulkheadLayer<Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkheadLayer")
            .field("identity", &self.identity)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// A service behind a [`BulkheadLayer`].
pub type Bulkhead<S, Req> = Guarded<S, BulkheadPolicy<Req>>;

impl<S, Req> Layer<S> for BulkheadLayer<Req> {
    type Service = Bulkhead<S, Req>;

    fn layer(&self, inner: S) -> Self::Service {
        let limit = self.limit.unwrap_or_else(|| {
            panic!(
                "caracal::tower: BulkheadLayer `{}` needs a limit: call `.limit(n)` or `.adaptive(…)`",
                self.identity.name
            )
        });
        assert!(
            !(self.local && self.adaptive.is_some()),
            "caracal::tower: BulkheadLayer `{}`: an adaptive limit is the fleet's, computed from \
             every process's calls; a local bulkhead takes `.limit(n)`",
            self.identity.name
        );
        assert!(
            !(self.local && self.keep.is_some()),
            "caracal::tower: BulkheadLayer `{}`: `keep` has no effect on a local bulkhead: a \
             local slot costs no round trip",
            self.identity.name
        );
        assert!(
            self.keep.is_none_or(|keep| keep <= self.lease / 3),
            "caracal::tower: BulkheadLayer `{}`: `keep` is more than a third of the lease: a kept \
             lease is handed on only until its first renewal is due",
            self.identity.name
        );
        let site = BulkheadSite::new(BulkheadConfig {
            name: self.identity.name,
            operation: self.identity.operation(),
            limit,
            adaptive: self.adaptive,
            lease: self.lease,
            max_wait: self.max_wait,
            keep: self.keep,
            local: self.local,
            shadow: self.shadow,
            thresholds: self.thresholds,
        });
        let policy = BulkheadPolicy {
            site: Arc::new(site),
            identity: self.identity.clone(),
        };
        Guarded::new(inner, policy)
    }
}

/// What a [`Bulkhead`] service applies: its site, and the request's scope.
pub struct BulkheadPolicy<Req> {
    site: Arc<BulkheadSite>,
    identity: Identity<Req>,
}

impl<Req> fmt::Debug for BulkheadPolicy<Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkheadPolicy")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl<Req: 'static, Res: Send + 'static> Admit<Req, Res> for BulkheadPolicy<Req> {
    type Permit = BulkheadPermit;
    type Deferred = Result<Scope, Error>;

    fn admit(&self, req: &Req) -> Admission<BulkheadPermit, Self::Deferred> {
        let scope = match self.identity.scope(req) {
            Ok(scope) => scope,
            Err(error) => return Admission::Rejected(error),
        };
        // A distributed slot is a lease, granted by a round trip and renewed while the call
        // runs: that is the attribute's path.
        if !self.site.config.local {
            return Admission::Deferred(Ok(scope));
        }
        match local::try_enter(&self.site, scope) {
            Admission::Admitted(slot) => Admission::Admitted(BulkheadPermit { _slot: slot }),
            Admission::Rejected(error) => Admission::Rejected(error),
            Admission::Deferred(scope) => Admission::Deferred(Ok(scope)),
        }
    }

    fn guard<F>(&self, scope: Self::Deferred, call: F) -> BoxCall<Res>
    where
        F: Future<Output = Result<Res, BoxError>> + Send + 'static,
    {
        let site = Arc::clone(&self.site);
        Box::pin(async move { bulkhead::bulkhead(&site, CallCtx::unread(), &scope, call).await })
    }
}

/// A local bulkhead's slot, held by a response until it is ready.
pub struct BulkheadPermit {
    // None: a shadow bulkhead let the request run without a slot.
    _slot: Option<local::OwnedSlot>,
}

impl fmt::Debug for BulkheadPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BulkheadPermit")
    }
}

/// The slot is freed when the permit drops, however the request ended.
impl<Res> Permit<Res> for BulkheadPermit {
    fn complete(self, _: &Result<Res, BoxError>) {}
}
