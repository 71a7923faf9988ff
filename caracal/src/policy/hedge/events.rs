//! The hedge's events and metrics (see [`crate::events`]).

use std::time::Duration;

use super::{HedgeSite, millis};
use crate::identity::Scope;
use crate::labels::At;
use crate::metrics::{self, Hedged};
use crate::summary;

/// An extra attempt was sent, the `extra`th of its call.
pub(super) fn sent(site: &HedgeSite, scope: &Scope, extra: u32, delay: Duration) {
    metrics::hedged(site.name(), Hedged::Sent);
    crate::events::policy_event!(
        DEBUG,
        "hedge.sent",
        &at(site, scope),
        function = site.config.identity.function,
        extra,
        delay_ms = millis(delay)
    );
}

/// An extra attempt answered `Ok` first.
pub(super) fn won(site: &HedgeSite) {
    metrics::hedged(site.name(), Hedged::Won);
}

/// The budget refused the `extra`th attempt: said once, then summarised.
pub(super) fn refused(site: &HedgeSite, scope: &Scope, extra: u32) {
    metrics::hedged(site.name(), Hedged::Refused);
    let at = at(site, scope);
    let Some(suppressed) = summary::repeat("hedge.refused", &at, &[]) else {
        return;
    };
    crate::events::policy_event!(
        INFO,
        "hedge.refused",
        &at,
        function = site.config.identity.function,
        budget = site.config.budget,
        extra,
        reason = "budget_exhausted",
        suppressed
    );
}

fn at<'a>(site: &HedgeSite, scope: &'a Scope) -> At<'a> {
    let identity = &site.config.identity;
    At {
        policy: "hedge",
        name: identity.name,
        operation: identity.operation,
        scope: scope.as_str(),
        coordination: if site.config.local {
            "local"
        } else {
            "distributed"
        },
        shadow: false,
    }
}
