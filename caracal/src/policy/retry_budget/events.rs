//! The kind's events (see [`crate::events`]).

use crate::error::Error;
use crate::events::policy_event;
use crate::labels::At;
use crate::labels::Decision;
use crate::metrics;
use crate::policy::retry_budget::kernel::Totals;
use crate::summary;

/// Counts a withdrawal's decision.
pub(super) fn decided(at: &At<'_>, allowed: bool, stale: bool) {
    let (decision, reason) = match (allowed, stale) {
        (true, false) => (Decision::Admitted, "within_budget"),
        (false, false) => (Decision::Rejected, "budget_exhausted"),
        (_, true) => (Decision::Degraded, "stale_view"),
    };
    match (at.shadow, allowed) {
        (true, false) => metrics::decided(at, Decision::WouldReject, "budget_exhausted"),
        _ => metrics::decided(at, decision, reason),
    }
}

/// A retry the budget refused: said once, then summarised.
pub(super) fn exhausted(at: &At<'_>, seen: Totals, allowance: u64) {
    if at.shadow {
        return crate::events::would_reject!("retry_budget.would_reject", at, "budget_exhausted");
    }
    let Some(suppressed) = summary::repeat("retry.budget_exhausted", at, &[]) else {
        return;
    };
    policy_event!(
        INFO,
        "retry.budget_exhausted",
        at,
        deposits = seen.deposits,
        withdrawals = seen.withdrawals,
        allowance,
        suppressed
    );
}

/// A batch of counts the coordinator did not answer: said once per failure, then
/// summarised.
pub(super) fn degraded(at: &At<'_>, error: &Error) {
    let failure = error.failure_kind().map(|k| k.as_str());
    let condition = [failure.unwrap_or(error.code())];
    let Some(said) = crate::policy::repeat_across("retry_budget.degraded", at, &condition) else {
        return;
    };
    policy_event!(
        WARN,
        "retry_budget.degraded",
        at,
        reason = "view_not_refreshed",
        error = error.code(),
        failure,
        suppressed = said.suppressed,
        identities = said.identities
    );
}
