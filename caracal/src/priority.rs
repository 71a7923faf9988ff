//! Priorities: which calls a full bulkhead or rate limit refuses first.
//!
//! A call's class travels with its task (like a tracing span), so it reaches every policy the
//! call passes through — across `#[retry]` attempts — without an argument on each function.
//! What a class may use is a policy's [`Thresholds`]: the share of the limit below which the
//! fleet's use must be for a call of that class to be admitted.

use core::fmt;
use std::future::Future;

use crate::error::Error;

tokio::task_local! {
    static PRIORITY: Priority;
}

/// How much a call matters when there is not room for every call.
///
/// `Critical` calls may use the whole limit; `Normal` (the default) and `Sheddable` ones only
/// the share their policy's [`Thresholds`] give them, so under overload the fleet refuses
/// `Sheddable` calls first, then `Normal` ones, and keeps `Critical` ones whole.
///
/// ```
/// use caracal::Priority;
///
/// assert_eq!(Priority::default(), Priority::Normal);
/// assert!(Priority::Critical > Priority::Normal && Priority::Normal > Priority::Sheddable);
/// assert_eq!("sheddable".parse::<Priority>(), Ok(Priority::Sheddable));
/// assert_eq!(Priority::Critical.to_string(), "critical");
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Priority {
    /// Work that may be dropped first: prefetches, background refreshes, retries of reports.
    Sheddable,
    /// Ordinary traffic.
    #[default]
    Normal,
    /// What must go through while there is any room at all: a user's checkout, a login.
    Critical,
}

impl Priority {
    /// Every class, lowest first.
    pub const ALL: [Priority; 3] = [Priority::Sheddable, Priority::Normal, Priority::Critical];

    /// Its name as labels, events and configuration spell it: `critical`, `normal`,
    /// `sheddable`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Normal => "normal",
            Priority::Sheddable => "sheddable",
        }
    }

    /// The priority of the current task: the innermost [`with_priority`] around it, or
    /// [`Priority::Normal`] outside any.
    ///
    /// ```
    /// use caracal::{Priority, with_priority};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// assert_eq!(Priority::current(), Priority::Normal);
    /// let inside = with_priority(Priority::Critical, async { Priority::current() }).await;
    /// assert_eq!(inside, Priority::Critical);
    /// # }
    /// ```
    pub fn current() -> Priority {
        PRIORITY.try_with(|priority| *priority).unwrap_or_default()
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not a [`Priority`]'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownPriority(String);

impl fmt::Display for UnknownPriority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown priority `{}` (expected critical, normal or sheddable)",
            self.0
        )
    }
}

impl std::error::Error for UnknownPriority {}

impl core::str::FromStr for Priority {
    type Err = UnknownPriority;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Priority::ALL
            .into_iter()
            .find(|priority| priority.as_str().eq_ignore_ascii_case(name))
            .ok_or_else(|| UnknownPriority(name.to_owned()))
    }
}

/// Runs `future` with `priority` as the priority of every guarded call inside it, nested
/// futures and `#[retry]` attempts included, unless a call site names its own
/// (`priority = expr`) or an inner `with_priority` says otherwise.
///
/// ```
/// use caracal::{Priority, bulkhead, with_priority};
///
/// #[bulkhead(limit = 10)]
/// async fn checkout() -> Result<Priority, caracal::Error> {
///     Ok(Priority::current())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let coordinator = caracal::Coordinator::in_memory();
/// let seen = coordinator
///     .scoped(with_priority(Priority::Critical, checkout()))
///     .await
///     .unwrap();
/// assert_eq!(seen, Priority::Critical);
/// # }
/// ```
pub fn with_priority<F: Future>(priority: Priority, future: F) -> impl Future<Output = F::Output> {
    scoped(priority, future)
}

/// [`with_priority`], as a type a `tower` service can name as its future.
#[cfg(feature = "tower")]
pub(crate) type Scoped<F> = tokio::task::futures::TaskLocalFuture<Priority, F>;

/// [`with_priority`] with its type.
fn scoped<F: Future>(
    priority: Priority,
    future: F,
) -> tokio::task::futures::TaskLocalFuture<Priority, F> {
    PRIORITY.scope(priority, future)
}

/// Runs `future` with `priority`, as a `tower` service's future.
#[cfg(feature = "tower")]
pub(crate) fn scoped_future<F: Future>(priority: Priority, future: F) -> Scoped<F> {
    scoped(priority, future)
}

/// Runs `f` with `priority` as the task's: for what decides before any future runs (a tower
/// service's `call`, which may admit at once).
#[cfg(feature = "tower")]
pub(crate) fn in_scope<R>(priority: Priority, f: impl FnOnce() -> R) -> R {
    PRIORITY.sync_scope(priority, f)
}

/// The share of a policy's limit each class may use: a call is admitted only while the fleet's
/// use is below its class's share of the limit (of the burst, for a rate limit). `Critical`
/// always has the whole limit. The default, [`Thresholds::NONE`], admits every class as if it
/// were `Critical`: a policy without thresholds behaves as before priorities existed.
///
/// Shares are kept in thousandths, so the arithmetic is exact and the same in every place it
/// runs (this process, the in-memory coordinator, the Redis scripts): a class of share `s` may
/// hold at most `ceil(limit × s)` of `limit` — with `limit = 30, normal = 0.8,
/// sheddable = 0.5`, a `Normal` call is admitted while fewer than 24 are in use, a `Sheddable`
/// one while fewer than 15 are.
///
/// ```
/// use caracal::{Priority, Thresholds};
///
/// let thresholds = Thresholds::new(0.8, 0.5).unwrap();
/// assert_eq!(thresholds.cap(Priority::Critical, 30), 30);
/// assert_eq!(thresholds.cap(Priority::Normal, 30), 24);
/// assert_eq!(thresholds.cap(Priority::Sheddable, 30), 15);
/// assert_eq!(thresholds.cap(Priority::Sheddable, 25), 13, "below 12.5 in use");
/// assert!(Thresholds::new(0.5, 0.8).is_err(), "sheddable above normal");
/// ```
///
/// `Sheddable` never gets more than `Normal`: where its share is set above `Normal`'s — left at
/// the whole limit beside `thresholds(normal = 0.8)`, or an override lowering `normal` alone —
/// it has `Normal`'s. (A configuration that writes both out of order is refused.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
// Aligned as one 4-byte value, so that [`is_none`](Self::is_none), asked on every bulkhead call,
// is one comparison.
#[repr(C, align(4))]
pub struct Thresholds {
    normal: u16,
    sheddable: u16,
}

/// Thousandths in a whole limit.
pub(crate) const WHOLE: u16 = 1000;

impl Thresholds {
    /// Every class up to the whole limit: what a policy without `thresholds` does.
    pub const NONE: Thresholds = Thresholds {
        normal: WHOLE,
        sheddable: WHOLE,
    };

    /// The shares of the limit `Normal` and `Sheddable` calls may use, each in `(0, 1]`
    /// (rounded to thousandths), `sheddable` at most `normal`; anything else is
    /// [`Error::InvalidConfig`] saying which.
    pub fn new(normal: f64, sheddable: f64) -> Result<Thresholds, Error> {
        let normal = share("normal", normal)?;
        let sheddable = share("sheddable", sheddable)?;
        if sheddable > normal {
            return Err(Error::config(
                caracal_spec::THRESHOLDS_ORDERED
                    .message(
                        f64::from(sheddable) / f64::from(WHOLE),
                        f64::from(normal) / f64::from(WHOLE),
                    )
                    .to_string(),
            ));
        }
        Ok(Thresholds { normal, sheddable })
    }

    /// The shares in thousandths, as `#[bulkhead(thresholds(…))]` writes them into a `static`
    /// after checking them; a share out of range fails to compile.
    #[doc(hidden)]
    pub const fn from_thousandths(normal: u16, sheddable: u16) -> Thresholds {
        assert!(
            0 < sheddable && sheddable <= WHOLE && 0 < normal && normal <= WHOLE,
            "thresholds: each share in (0, 1]"
        );
        Thresholds { normal, sheddable }
    }

    /// These thresholds with `priority`'s share set to `thousandths` (`Critical`'s cannot
    /// change): a configuration sets one share at a time.
    pub(crate) fn with(self, priority: Priority, thousandths: u16) -> Thresholds {
        match priority {
            Priority::Normal => Thresholds {
                normal: thousandths,
                ..self
            },
            Priority::Sheddable => Thresholds {
                sheddable: thousandths,
                ..self
            },
            Priority::Critical => self,
        }
    }

    /// Whether every class may use the whole limit (no thresholds).
    pub fn is_none(self) -> bool {
        self == Thresholds::NONE
    }

    /// The share of the calling task's class, in thousandths. Without thresholds every
    /// class's is whole, and the class (a task-local read) is not asked: a plain local
    /// bulkhead's every call passes here.
    #[inline]
    pub(crate) fn current_share(self) -> u16 {
        if self.is_none() {
            WHOLE
        } else {
            self.thousandths(Priority::current())
        }
    }

    /// `priority`'s share of the limit, in thousandths.
    pub fn thousandths(self, priority: Priority) -> u16 {
        match priority {
            Priority::Critical => WHOLE,
            Priority::Normal => self.normal,
            Priority::Sheddable => self.sheddable.min(self.normal),
        }
    }

    /// The most a call of `priority` may find in use, itself included, out of `limit`:
    /// `ceil(limit × share)`, at least 1 (a share never shuts a class out of a limit above 0).
    pub fn cap(self, priority: Priority, limit: u32) -> u32 {
        cap(limit, self.thousandths(priority))
    }
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds::NONE
    }
}

/// `ceil(limit × thousandths / 1000)`, at least 1 when `limit` is: the one formula the kernels
/// and scripts mirror (in integers, so no rounding differs between them).
#[inline]
pub(crate) fn cap(limit: u32, thousandths: u16) -> u32 {
    // The whole limit (no thresholds: every call of a plain bulkhead) needs no arithmetic.
    if thousandths == WHOLE {
        return limit;
    }
    let scaled = u64::from(limit) * u64::from(thousandths);
    let cap = scaled.div_ceil(u64::from(WHOLE));
    u32::try_from(cap)
        .unwrap_or(limit)
        .clamp(limit.min(1), limit)
}

/// The indices of `shares` (thousandths) in the order a batch of calls decided together
/// takes them: the highest share first, equal shares in their order (a stable sort). A batch
/// gathers calls that queued together, so their order is an accident; a `Critical` call should
/// not lose the last slot to a `Normal` one that happened to queue first. The scripts sort the
/// same way; with every share whole (no thresholds) the order is the batch's.
pub(crate) fn highest_share_first(shares: impl Iterator<Item = u16>) -> Vec<usize> {
    let mut order: Vec<(usize, u16)> = shares.enumerate().collect();
    order.sort_by_key(|&(_, share)| core::cmp::Reverse(share));
    order.into_iter().map(|(index, _)| index).collect()
}

/// A share in `(0, 1]` as thousandths.
fn share(class: &str, value: f64) -> Result<u16, Error> {
    if !(value > 0.0 && value <= 1.0) {
        return Err(Error::config(format!(
            "thresholds: `{class}` must be a share of the limit in (0, 1], got {value}"
        )));
    }
    Ok(thousandths(value))
}

/// A share in `(0, 1]` as thousandths, rounded; a share below a thousandth still admits one
/// call. The macros round a written share the same way.
pub(crate) fn thousandths(share: f64) -> u16 {
    (share * f64::from(WHOLE))
        .round()
        .clamp(1.0, f64::from(WHOLE)) as u16
}

/// A class's share as the differential tests draw it: mostly the whole limit (no thresholds)
/// and the usual shares, sometimes any.
#[cfg(test)]
pub(crate) fn any_share() -> impl proptest::strategy::Strategy<Value = u16> {
    use proptest::prelude::*;
    prop_oneof![
        4 => Just(WHOLE),
        2 => Just(800u16),
        2 => Just(500u16),
        1 => 1u16..=WHOLE,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_is_the_ceiling_of_the_share_and_never_above_the_limit() {
        for limit in 0..200u32 {
            for thousandths in 1..=WHOLE {
                let cap = cap(limit, thousandths);
                let exact = f64::from(limit) * f64::from(thousandths) / 1000.0;
                assert!(cap <= limit);
                if limit > 0 {
                    assert!(cap >= 1);
                    assert!(f64::from(cap) >= exact - 1e-9, "{limit} {thousandths}");
                    assert!(f64::from(cap) < exact + 1.0, "{limit} {thousandths}");
                }
            }
        }
        assert_eq!(cap(30, 800), 24);
        assert_eq!(cap(u32::MAX, WHOLE), u32::MAX);
    }

    #[test]
    fn sheddable_never_gets_more_than_normal() {
        // As `thresholds(normal = 0.8)` writes it: `sheddable` left at the whole limit.
        let normal_alone = Thresholds::from_thousandths(800, WHOLE);
        assert_eq!(normal_alone.cap(Priority::Sheddable, 30), 24);
        assert_eq!(normal_alone.cap(Priority::Normal, 30), 24);
        // An override lowering `normal` below the attribute's `sheddable`.
        let lowered = Thresholds::new(0.8, 0.5)
            .unwrap()
            .with(Priority::Normal, 300);
        assert_eq!(lowered.cap(Priority::Sheddable, 30), 9);
    }

    #[tokio::test]
    async fn the_innermost_priority_wins_and_none_is_normal() {
        assert_eq!(Priority::current(), Priority::Normal);
        let seen = with_priority(Priority::Sheddable, async {
            let outer = Priority::current();
            let inner = with_priority(Priority::Critical, async { Priority::current() }).await;
            (outer, inner, Priority::current())
        })
        .await;
        assert_eq!(
            seen,
            (Priority::Sheddable, Priority::Critical, Priority::Sheddable)
        );
    }
}
