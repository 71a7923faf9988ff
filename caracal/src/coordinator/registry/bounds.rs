//! How often the registry is reported to, and how much it keeps.

use std::time::Duration;

/// How often a process reports the identities it uses.
pub(crate) const REPORT_EVERY: Duration = Duration::from_secs(5);
/// How long a new identity or a change of values waits to be reported with others.
pub(super) const REPORT_SOON: Duration = Duration::from_millis(20);
/// How long a reporter's values count as in use, for drift.
pub(crate) const DRIFT_WINDOW: Duration = Duration::from_secs(15);
/// The most identities a namespace's registry keeps.
pub(crate) const MAX_IDENTITIES: u32 = 10_000;
/// The most processes whose values and rates the registry keeps per identity (past it, the
/// longest silent is forgotten): what bounds a report's cost in a large fleet.
pub(crate) const MOST_PROCESSES_PER_IDENTITY: usize = 100;
/// The most call sites a process remembers.
pub(super) const MAX_USES: usize = 10_000;
/// Reports a use sits out before it is forgotten: [`crate::coordinator::FORGET_IDLE_AFTER`].
pub(super) const FORGET_AFTER_REPORTS: u32 = crate::coordinator::FORGET_IDLE_AFTER
    .as_secs()
    .div_ceil(REPORT_EVERY.as_secs()) as u32;
