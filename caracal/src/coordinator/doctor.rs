//! `caracal doctor`: what caracal relies on, checked on the server the fleet connects to.

use std::fmt;

/// One line of [`Admin::doctor`](crate::admin::Admin::doctor)'s checklist: what was checked,
/// whether caracal can rely on it, and what was found.
///
/// ```
/// # async fn f() -> Result<(), caracal::Error> {
/// let coordinator = caracal::Coordinator::in_memory();
/// for check in coordinator.admin().doctor().await {
///     println!("{check}"); // `ok   server  in-memory: nothing to check`
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Check {
    /// Its name: `connect`, `server`, `role`, `cluster_slots`, `scripts_atomic`,
    /// `script_time`, `pexpiretime`, `pubsub`, `eviction`, `persistence`, `admin_commands`,
    /// `round_trip`.
    pub check: &'static str,
    /// Whether caracal can run as documented on what was found.
    pub ok: bool,
    /// What was found, and what it means for caracal when it is not ok.
    pub detail: String,
}

impl Check {
    pub(crate) fn new(check: &'static str, ok: bool, detail: impl Into<String>) -> Self {
        Check {
            check,
            ok,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.ok { "ok" } else { "FAIL" };
        write!(f, "{verdict:<4} {:<14} {}", self.check, self.detail)
    }
}
