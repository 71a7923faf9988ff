//! What names a policy instance in its events and its metrics' labels: the one type both
//! `events` and `metrics` read, so that neither has to import the other's.

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
}
