//! What names a policy instance, or a call, in its events and its metrics' labels, and what a
//! policy decided: the types `events`, `metrics` and `tally` all read, so that none has to
//! import another's.

use crate::priority::Priority;

/// Which policy instance an event or a metric is about.
#[derive(Debug, Clone, Copy)]
pub(crate) struct At<'a> {
    /// The kind, as [`PolicyKind::as_str`](crate::PolicyKind::as_str) spells it (or the
    /// attribute's name, for a policy without shared state).
    pub(crate) policy: &'static str,
    /// The policy name.
    pub(crate) name: &'a str,
    /// The operation.
    pub(crate) operation: &'a str,
    /// The scope.
    pub(crate) scope: &'a str,
    /// `"local"` or `"distributed"`.
    pub(crate) coordination: &'static str,
    /// Whether the policy is in shadow mode: what it refuses is counted as `would_reject`, and
    /// said as `<kind>.would_reject`, rather than as a rejection.
    pub(crate) shadow: bool,
}

impl At<'_> {
    /// The same instance, in shadow mode if `shadow`.
    pub(crate) fn shadowed(self, shadow: bool) -> Self {
        At { shadow, ..self }
    }

    /// The class of the call being decided, for a kind that shares its limit out by class
    /// (as its spec says): the task's [`Priority`], which the decision runs under. `None` for
    /// the other kinds, whose decisions do not depend on it.
    pub(crate) fn priority(&self) -> Option<Priority> {
        caracal_spec::kind(self.policy)
            .is_some_and(|kind| kind.prioritized)
            .then(Priority::current)
    }
}

/// What the events of the attributes that guard the whole call rather than an identity's
/// budget (`#[retry]`, `#[timeout]`, `#[fallback]`) carry: the function, and the identity its
/// coordinated attributes share (by default the function's name, operation = name, scope
/// `"global"`). `scope` is `None` when the call's scope expression was not a valid scope.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call<'a> {
    pub(crate) policy: &'static str,
    pub(crate) function: &'static str,
    pub(crate) name: &'static str,
    pub(crate) operation: &'static str,
    pub(crate) scope: Option<&'a str>,
}

/// What an admission policy decided about one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    Admitted,
    Rejected,
    Degraded,
    /// A shadow policy would have refused the call (rejected, or degraded closed) and let it run.
    WouldReject,
}

impl Decision {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Decision::Admitted => "admitted",
            Decision::Rejected => "rejected",
            Decision::Degraded => "degraded",
            Decision::WouldReject => "would_reject",
        }
    }
}
