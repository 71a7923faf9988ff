//! The local bulkhead: a counter of taken slots per identity in this process, and a queue of
//! the callers waiting for one, highest class first.
//!
//! A caller's class may use its share of the limit ([`crate::priority::Thresholds`]): it takes a
//! slot only while fewer than its cap are taken (the whole limit without thresholds).
//!
//! While nobody waits, taking and freeing a slot are one atomic update each (no lock: this is
//! the path every call takes). A freed slot passes straight to the first waiter, whose class
//! is the highest waiting (callers of one class in arrival order), if its cap allows; a waiter
//! whose cap does not allow it holds back every waiter behind it, whose caps are no higher. So
//! a lower class never takes a slot a higher one waits for, and a newcomer can never barge past
//! the waiters: while anyone waits, the counter refuses newcomers and every change goes through
//! the queue's lock, where a newcomer takes its place by class.

use std::borrow::Borrow;
use std::collections::VecDeque;
use std::ops::Deref;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::events::{self, Refusal};
use super::{BulkheadSite, BulkheadValues};
use crate::coordinator;
use crate::identity::Scope;
use crate::metrics::{InFlight, Stopwatch};
use crate::policy::registry::{self, Held, Registry};
use crate::priority::{self, Priority};
use crate::sync::lock;

/// The bit of [`Budget::state`] set while callers wait. While it is set, the state changes only
/// under the queue's lock.
const WAITING: u64 = 1 << 63;

/// Slots taken, in a state word.
fn taken(state: u64) -> u32 {
    // The count never exceeds a `u32` limit plus the slots of a shrunk one, all below 2^32.
    u32::try_from(state & !WAITING).unwrap_or(u32::MAX)
}

/// One identity's budget. Its limit follows configuration: a larger one admits waiters at
/// once; a smaller one admits nobody until enough running bodies have ended, so running calls
/// are never disturbed.
#[derive(Debug)]
pub(super) struct Budget {
    /// Slots taken, and [`WAITING`].
    state: AtomicU64,
    limit: AtomicU32,
    /// The callers waiting for a slot: the highest class first, oldest first within a class.
    /// A slot is passed to one by a send; one that has stopped waiting can no longer receive,
    /// and is skipped.
    queue: Mutex<VecDeque<Waiter>>,
}

/// A caller waiting in line: its class, its class's share of the limit (thousandths), and
/// where its slot is sent.
#[derive(Debug)]
struct Waiter {
    priority: Priority,
    share: u16,
    slot: oneshot::Sender<()>,
}

impl Budget {
    fn new(limit: u32) -> Self {
        Budget {
            state: AtomicU64::new(0),
            limit: AtomicU32::new(limit),
            queue: Mutex::default(),
        }
    }

    #[inline]
    fn occupancy(&self) -> u32 {
        taken(self.state.load(Ordering::Acquire))
    }

    /// The most slots a caller of `share` may find taken, itself included.
    #[inline]
    fn cap(&self, share: u16) -> u32 {
        priority::cap(self.limit.load(Ordering::Acquire), share)
    }

    /// Takes a slot for a caller of `share` if fewer than its cap are taken and nobody of its
    /// class (read by `priority`, only if someone waits) or above waits for one.
    #[inline]
    fn try_take(&self, share: u16, priority: impl FnOnce() -> Priority) -> bool {
        let cap = self.cap(share);
        match self.take_unless_waited(cap) {
            Ok(_) => true,
            // Someone waits, and there is room under this caller's cap: the waiters may all
            // be of lower classes, held at caps of their own (or have given up).
            Err(state) if taken(state) < cap => self.take_past_waiters(priority(), cap),
            Err(_) => false,
        }
    }

    /// Takes a slot if fewer than `cap` are taken and nobody waits; else the state found.
    #[inline]
    fn take_unless_waited(&self, cap: u32) -> Result<u64, u64> {
        self.state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                (state & WAITING == 0 && taken(state) < cap).then_some(state + 1)
            })
    }

    /// Takes a slot for a caller of `priority`, whose `cap` the slots taken may allow, past
    /// the waiters in line if every one is of a lower class.
    #[cold]
    fn take_past_waiters(&self, priority: Priority, cap: u32) -> bool {
        let mut queue = lock(&self.queue);
        let state = self.state.load(Ordering::Acquire);
        if state & WAITING == 0 {
            // The line emptied meanwhile.
            drop(queue);
            return self.take_unless_waited(cap).is_ok();
        }
        // The bit is set and the lock held: nothing else changes the state now. Callers that
        // gave up leave their place behind; cleared, those behind them may be served.
        queue.retain(|waiter| !waiter.slot.is_closed());
        let taken = taken(state);
        let admitted = taken < cap && queue.front().is_none_or(|first| first.priority < priority);
        self.serve(&mut queue, taken + u32::from(admitted));
        admitted
    }

    /// Waits in line, up to `wait`, for a slot its `share` allows, behind the waiters of its
    /// `priority` and above.
    async fn take_within(&self, (priority, share): (Priority, u16), wait: Duration) -> bool {
        let mut place = {
            let mut queue = lock(&self.queue);
            // Callers that gave up leave their place behind until it is passed over; clearing
            // them here keeps the line as long as the callers still in it.
            queue.retain(|waiter| !waiter.slot.is_closed());
            if queue.is_empty() && self.try_take(share, || priority) {
                return true;
            }
            // Once the bit is set, a slot freed elsewhere comes through this lock to the queue;
            // one freed since the attempt above shows in the state. (The bit is set only now,
            // so that newcomers are not turned away while a slot is free.) Behind the waiters
            // of its class and above, the newcomer is served now if the slots taken allow
            // every caller before it and itself.
            let before = self.state.fetch_or(WAITING, Ordering::AcqRel);
            let (slot, granted) = oneshot::channel();
            let at = queue.partition_point(|ahead| ahead.priority >= priority);
            queue.insert(
                at,
                Waiter {
                    priority,
                    share,
                    slot,
                },
            );
            self.serve(&mut queue, taken(before));
            Place {
                budget: self,
                granted,
            }
        };
        matches!(
            tokio::time::timeout(wait, &mut place.granted).await,
            Ok(Ok(()))
        )
    }

    /// Brings the budget to `limit`.
    #[inline]
    fn resize(&self, limit: u32) {
        // Every call brings its budget to its limit; nearly always it is there already.
        if self.limit.load(Ordering::Acquire) == limit {
            return;
        }
        let previous = self.limit.swap(limit, Ordering::AcqRel);
        if limit > previous {
            // Storing the limit before looking at the queue: a caller queued meanwhile either
            // saw the new limit or is found here.
            self.pass_on(0);
        }
    }

    /// Frees a slot: it passes to the longest waiter, if the limit allows one to run.
    #[inline]
    fn free(&self) {
        let freed = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                (state & WAITING == 0).then(|| state - 1)
            });
        if freed.is_err() {
            self.pass_on(1);
        }
    }

    /// With `freed` slots just given back: hands slots to waiters, highest class first, while
    /// their caps allow. Nothing to do when nobody waits (then `freed` is given back as usual).
    fn pass_on(&self, freed: u32) {
        let mut queue = lock(&self.queue);
        let waiting = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                (state & WAITING == 0).then(|| state - u64::from(freed))
            })
            .is_err();
        if !waiting {
            return;
        }
        // The bit is set and the lock held: nothing else changes the state now.
        self.serve(
            &mut queue,
            taken(self.state.load(Ordering::Acquire)) - freed,
        );
    }

    /// With `taken` slots taken, the bit set and the queue's lock held: hands slots to the
    /// waiters in their order while the first one's cap allows it (a lower class, whose cap
    /// is no higher, never takes a slot before a higher one), and stores what is taken then.
    fn serve(&self, queue: &mut VecDeque<Waiter>, mut taken: u32) {
        while queue
            .front()
            .is_some_and(|first| taken < self.cap(first.share))
        {
            if queue
                .pop_front()
                .is_some_and(|first| first.slot.send(()).is_ok())
            {
                taken += 1;
            }
        }
        let still = if queue.is_empty() { 0 } else { WAITING };
        self.state
            .store(u64::from(taken) | still, Ordering::Release);
    }
}

/// A caller's place in a budget's queue. Dropped before its grant was taken (the wait timed
/// out, or the caller gave up), it frees a slot that was passed to it meanwhile.
struct Place<'a> {
    budget: &'a Budget,
    granted: oneshot::Receiver<()>,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.granted.close();
        if self.granted.try_recv().is_ok() {
            self.budget.free();
        }
    }
}

/// Every local budget of the process. A budget is idle when no slot is taken.
static BUDGETS: Registry<Budget> = Registry::new(|budget| budget.occupancy() == 0);

/// A call site's handle on its default-scope budget, and on its attribute's values.
pub(super) type SiteCache = registry::SiteCache<Budget, BulkheadValues>;

/// A held local slot; dropping it frees the slot. An attribute's call borrows its site and
/// scope; a tower layer's response owns them (`Arc<BulkheadSite>`, `Scope`).
pub(super) struct Slot<'a, Site: Deref<Target = BulkheadSite>, Sc: Borrow<Scope>> {
    budget: Held<'a, Budget>,
    site: Site,
    scope: Sc,
    since: Option<Instant>,
    /// Dropped after the slot is freed, as the body stops counting as running; none when
    /// nothing counts it (see [`enter`]).
    _running: Option<InFlight>,
}

impl<Site: Deref<Target = BulkheadSite>, Sc: Borrow<Scope>> Drop for Slot<'_, Site, Sc> {
    #[inline]
    fn drop(&mut self) {
        self.budget.free();
        // The rest is rare (a debug listener, a per-call scope) and out of line, so that the
        // drop every call makes stays small enough to be inlined.
        if self.since.is_some() || matches!(self.budget, Held::Shared(_)) {
            self.finish();
        }
    }
}

impl<Site: Deref<Target = BulkheadSite>, Sc: Borrow<Scope>> Slot<'_, Site, Sc> {
    /// After the slot is freed: the release's event, and forgetting a per-call scope's budget
    /// once idle.
    #[inline(never)]
    fn finish(&self) {
        let scope = self.scope.borrow();
        if let Some(since) = self.since {
            events::released(
                &self.site.at(scope),
                Some(self.budget.occupancy()),
                since.elapsed(),
            );
        }
        let config = &self.site.config;
        BUDGETS.release((config.name, config.operation, scope), &self.budget);
    }
}

/// A slot a tower layer's response holds until it is ready.
#[cfg(feature = "tower")]
pub(super) type OwnedSlot = Slot<'static, std::sync::Arc<BulkheadSite>, Scope>;

/// The budget of `scope`, brought to the limit in force, and the values in force: the site's
/// cached ones, borrowed (they are copied nowhere on a call's path), or, when a coordinator
/// overrides anything, resolved into `resolved`.
// Always inlined, as `admit`: both are on every call's path, and a call to either costs the
// local bulkhead a third of its time (measured with callgrind, `bench local`).
#[inline(always)]
fn budget<'s: 'v, 'v>(
    site: &'s BulkheadSite,
    scope: &Scope,
    resolved: &'v mut Option<BulkheadValues>,
) -> (Held<'s, Budget>, &'v BulkheadValues) {
    let config = &site.config;
    let values = match coordinator::overriding() {
        None => site.local.attribute(|| site.resolve(None).values),
        overriding => resolved.insert(site.resolve(overriding.as_ref()).values),
    };
    let budget = BUDGETS.get(&site.local, (config.name, config.operation, scope), || {
        Budget::new(values.limit)
    });
    budget.resize(values.limit);
    (budget, values)
}

/// The slot of a caller admitted after reaching the bulkhead at `arrival`.
#[inline(always)]
fn enter<'a, Site: Deref<Target = BulkheadSite>, Sc: Borrow<Scope>>(
    site: Site,
    scope: Sc,
    budget: Held<'a, Budget>,
    values: &BulkheadValues,
    arrival: Stopwatch,
) -> Slot<'a, Site, Sc> {
    let since = crate::events::debug_enabled().then(Instant::now);
    // An admission's event and metrics are its only readers of the labels (a local policy is
    // in no tally): without the `metrics` feature and with nobody listening to debug events,
    // they are not even made.
    let running = (cfg!(feature = "metrics") || since.is_some()).then(|| {
        let at = site.at(scope.borrow()).shadowed(values.shadow);
        events::admitted(&at, budget.occupancy(), values.limit, arrival)
    });
    Slot {
        budget,
        site,
        scope,
        since,
        _running: running,
    }
}

/// Turns away a caller not admitted: the limit in force, for its rejection; or none in
/// shadow mode, where the call runs without a slot, taking no share of the budget, as if it
/// had been refused.
#[cold]
fn refuse(
    site: &BulkheadSite,
    scope: &Scope,
    budget: &Budget,
    values: &BulkheadValues,
) -> Option<u32> {
    let at = site.at(scope).shadowed(values.shadow);
    let reason = if values.max_wait.is_some() {
        Refusal::WaitTimeout
    } else {
        Refusal::Capacity
    };
    events::rejected(&at, reason, Some(budget.occupancy()), values.limit);
    (!values.shadow).then_some(values.limit)
}

/// A call's slot held by an attribute's future.
pub(super) type CallSlot<'s> = Slot<'s, &'s BulkheadSite, &'s Scope>;

/// Where an attribute's call keeps its slot: made by the call, filled by the admission. The
/// slot is written there in place, never returned and moved: a copy of a slot just written
/// reads it back before its stores have landed and stalls on them, which cost the local
/// bulkhead a sixth of its time (`perf annotate`, `bench local`).
pub(super) type SlotPlace<'s> = Option<CallSlot<'s>>;

/// Decides on a caller that reached the bulkhead at `arrival`, `admitted` or not: its slot
/// goes to `place`; refused, the limit its rejection names (none in shadow mode, where the
/// call runs without a slot).
#[inline(always)]
fn decide<'s>(
    site: &'s BulkheadSite,
    scope: &'s Scope,
    budget: Held<'s, Budget>,
    values: &BulkheadValues,
    admitted: bool,
    arrival: Stopwatch,
    place: &mut SlotPlace<'s>,
) -> Option<u32> {
    if !admitted {
        return refuse(site, scope, &budget, values);
    }
    // The place is empty: each call's admission fills its own once. Assigned as usual, the old
    // value's drop would be an out-of-line call on every admission (a tenth of the local
    // bulkhead's instructions: callgrind, `bench local`), so it is known to be empty instead.
    let empty = place.replace(enter(site, scope, budget, values, arrival));
    debug_assert!(empty.is_none(), "a call's slot is placed once");
    std::mem::forget(empty);
    None
}

/// A local admission decided at once (refused under the limit it names, or not), or the line
/// the caller waits in.
pub(super) enum Admission<'s> {
    Decided(Option<u32>),
    /// No slot was free, and `max_wait` allows waiting for one. Boxed: rare, and large.
    Wait(Box<Line<'s>>),
}

/// A caller about to wait in line: what [`Line::wait`] decides with.
pub(super) struct Line<'s> {
    site: &'s BulkheadSite,
    scope: &'s Scope,
    budget: Held<'s, Budget>,
    values: BulkheadValues,
    share: u16,
    wait: Duration,
    arrival: Stopwatch,
}

impl<'s> Line<'s> {
    /// The bulkhead and scope the caller waits for.
    pub(super) fn at(&self) -> (&'s BulkheadSite, &'s Scope) {
        (self.site, self.scope)
    }

    /// Waits in line, up to `max_wait`, for a slot, which goes to `place`; refused, the limit
    /// its rejection names, as [`admit`] decides.
    pub(super) async fn wait(self, place: &mut SlotPlace<'s>) -> Option<u32> {
        let admitted = self
            .budget
            .take_within((Priority::current(), self.share), self.wait)
            .await;
        decide(
            self.site,
            self.scope,
            self.budget,
            &self.values,
            admitted,
            self.arrival,
            place,
        )
    }
}

/// Takes a slot for a call at once if one is free, into `place`; else refuses it, or hands
/// back the line to wait in when `max_wait` allows.
#[inline(always)]
pub(super) fn admit<'s>(
    site: &'s BulkheadSite,
    scope: &'s Scope,
    place: &mut SlotPlace<'s>,
) -> Admission<'s> {
    let arrival = Stopwatch::start();
    let mut resolved = None;
    let (budget, values) = budget(site, scope, &mut resolved);
    let share = values.thresholds.current_share();
    let admitted = budget.try_take(share, Priority::current);
    if !admitted && let Some(wait) = values.max_wait {
        return Admission::Wait(Box::new(Line {
            site,
            scope,
            budget,
            values: *values,
            share,
            wait,
            arrival,
        }));
    }
    Admission::Decided(decide(
        site, scope, budget, values, admitted, arrival, place,
    ))
}

/// A tower layer's admission at once: a slot, or a rejection; deferred (the scope handed back
/// for [`run`]) when the caller would wait in line, or inside a fenced body, whose token the
/// request must not see.
#[cfg(feature = "tower")]
pub(super) fn try_enter(
    site: &std::sync::Arc<BulkheadSite>,
    scope: Scope,
) -> crate::guard::Admission<Option<OwnedSlot>, Scope> {
    use crate::guard::Admission;
    if crate::fencing::inside_fenced_body() {
        return Admission::Deferred(scope);
    }
    let arrival = Stopwatch::start();
    let mut resolved = None;
    let (budget, values) = budget(site, &scope, &mut resolved);
    let admitted = budget.try_take(values.thresholds.current_share(), Priority::current);
    if !admitted && values.max_wait.is_some() {
        return Admission::Deferred(scope);
    }
    if !admitted {
        return match refuse(site, &scope, &budget, values) {
            None => Admission::Admitted(None),
            Some(limit) => Admission::Rejected(site.full(&scope, limit)),
        };
    }
    let budget = budget.into_owned();
    Admission::Admitted(Some(enter(
        std::sync::Arc::clone(site),
        scope,
        budget,
        values,
        arrival,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::priority::WHOLE;

    /// Callers that time out in line leave no trace that grows: with a body that never ends,
    /// the line stays as long as the callers still in it.
    #[tokio::test(start_paused = true)]
    async fn callers_that_gave_up_do_not_lengthen_the_line() {
        let budget = Budget::new(1);
        assert!(
            budget.try_take(WHOLE, || Priority::Normal),
            "the body that never ends"
        );
        for _ in 0..1000 {
            let waiting = budget.take_within((Priority::Normal, WHOLE), Duration::from_millis(1));
            assert!(!waiting.await);
        }
        assert!(
            lock(&budget.queue).len() <= 1,
            "{} in line",
            lock(&budget.queue).len()
        );
        budget.free();
        assert_eq!(budget.occupancy(), 0);
        assert!(
            budget.try_take(WHOLE, || Priority::Normal),
            "the freed slot is not held for anyone who left"
        );
    }
}
