//! How often the registry is reported to, and how much it keeps: the bounds its reporters
//! and its stores share.

use std::time::Duration;

/// How often a process reports the identities it uses.
pub(crate) const REPORT_EVERY: Duration = Duration::from_secs(5);
/// How long a reporter's values count as in use, for drift.
pub(crate) const DRIFT_WINDOW: Duration = Duration::from_secs(15);
/// The most identities a namespace's registry keeps.
pub(crate) const MAX_IDENTITIES: u32 = 10_000;
/// The most processes whose values and rates the registry keeps per identity (past it, the
/// longest silent is forgotten): what bounds a report's cost in a large fleet.
pub(crate) const MOST_PROCESSES_PER_IDENTITY: usize = 100;
