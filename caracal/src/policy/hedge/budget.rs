//! The retry budget a hedge's extra attempts withdraw from, and the deposit of its calls.
//!
//! **Which budget.** `budget = "name"` names a `#[retry_budget]` identity of that name (its
//! operation the name, the hedge's scope). It is found, at the call site's first use, in
//! this order: a `#[retry_budget]` (or tower `RetryBudget`) of that name this process has
//! used, whose values it takes; a `[retry_budget.name]` table of the configuration or the
//! fleet's overrides, over the attribute's defaults; a use of that name the fleet's registry
//! lists, with the values reported there (one round trip). A name found nowhere is
//! `Error::InvalidConfig` for a call that needs an extra attempt: a typo would otherwise be a
//! budget of its own, and the hedges it allows would be none of the retries' business. A
//! registry that cannot be read makes the extra attempt a refusal (`hedge.refused`). A failed
//! look-up is kept and not repeated for a back-off ([`RETRY_FIRST`], doubling to
//! [`RETRY_MOST`]), in which this process's own budgets are still looked at: no call pays a
//! registry read while the name stays unknown. A call that answered is never failed by its
//! budget: its deposit is skipped when the budget cannot be had.
//!
//! **One deposit per call.** A `#[retry_budget]` of the same name on the function, above the
//! hedge or below it, gates the call already: the hedge withdraws through that gate, and the
//! budget's layer makes the call's one deposit. Otherwise the hedge deposits itself, once per
//! call that reached the downstream (the first extra attempt's withdrawal counts the first
//! attempt, still in flight, as the `#[retry]`'s first retry does). Which deposit is made is
//! the call's ([`CallCtx::claim_deposit`]), not the hedge run's: a `#[retry]` above runs the
//! hedge again without a second deposit, and a gate of the name installed below after the
//! hedge deposited (an extra attempt due before the first reached the gate) makes none.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use super::HedgeSite;
use crate::coordinator::{self, Coordinator};
use crate::ctx::{CallCtx, Gated, Taken};
use crate::error::Error;
use crate::identity::{PolicyKind, Scope};
use crate::policy::retry_budget::{self, RetryBudgetSite};
use crate::sync::lock;

/// How long a failed look-up is kept at first.
const RETRY_FIRST: Duration = Duration::from_secs(1);
/// How long a failed look-up is kept at most, however many failed before it.
const RETRY_MOST: Duration = Duration::from_secs(60);

/// What a hedge site's budget name resolved to, kept so that calls do not look again.
#[derive(Debug)]
pub(super) struct Resolved {
    found: OnceLock<&'static RetryBudgetSite>,
    failed: Mutex<Option<Failed>>,
}

/// The last failed look-up of a name.
#[derive(Debug, Clone, Copy)]
struct Failed {
    /// Whether the name was found nowhere (else the registry could not be read).
    nowhere: bool,
    /// Not looked for in the registry again before this.
    until: Instant,
    /// The back-off that led to `until`.
    backoff: Duration,
}

impl Resolved {
    pub(super) const fn new() -> Self {
        Resolved {
            found: OnceLock::new(),
            failed: Mutex::new(None),
        }
    }

    /// The budget named `name`: this process's own at once, else the look-up kept, else a
    /// fresh one (see the module docs).
    async fn get(&self, name: &'static str) -> Result<&'static RetryBudgetSite, Unresolved> {
        let found = self.found.get().copied();
        if let Some(site) = found.filter(|site| !site.is_adopted()) {
            return Ok(site);
        }
        // A budget of the name this process uses supersedes a stand-in adopted before it.
        if let Some(site) = retry_budget::named(name) {
            // Kept unless a stand-in is (then looked up by name each call, with no round trip).
            let _ = self.found.set(site);
            return Ok(site);
        }
        if let Some(site) = found {
            return Ok(site);
        }
        let now = Instant::now();
        let last = *lock(&self.failed);
        if let Some(last) = last.filter(|last| now < last.until) {
            return Err(Unresolved::of(name, last.nowhere));
        }
        let (nowhere, error) = match find(name).await {
            Ok(site) => return Ok(self.found.get_or_init(|| site)),
            Err(Found::Nowhere) => (true, Unresolved::of(name, true)),
            Err(Found::Unreachable(error)) => (false, Unresolved::Unavailable(Some(error))),
        };
        let backoff = last.map_or(RETRY_FIRST, |last| (last.backoff * 2).min(RETRY_MOST));
        *lock(&self.failed) = Some(Failed {
            nowhere,
            until: now + backoff,
            backoff,
        });
        Err(error)
    }
}

/// Why a call's budget could not be had.
#[derive(Debug)]
enum Unresolved {
    /// Found nowhere, or unusable: `Error::InvalidConfig`.
    Invalid(Error),
    /// Not resolvable now (the registry could not be read, lately): extra attempts are refused.
    Unavailable(Option<Error>),
}

impl Unresolved {
    fn of(name: &str, nowhere: bool) -> Self {
        if nowhere {
            Unresolved::Invalid(Error::config(format!(
                "`#[hedge(budget = \"{name}\")]`: no `#[retry_budget]` named \"{name}\" in this \
                 process, in its configuration or in the fleet's registry"
            )))
        } else {
            Unresolved::Unavailable(None)
        }
    }
}

/// Why [`find`] found nothing.
enum Found {
    Nowhere,
    Unreachable(Error),
}

/// One call's budget.
#[derive(Debug)]
pub(super) struct Budget<'a> {
    hedge: &'static HedgeSite,
    scope: &'a Scope,
    /// The budget at the call's scope, once the hedge counted in it itself.
    own: Option<Gated>,
}

impl<'a> Budget<'a> {
    /// The budget of `hedge`'s call at `scope`. Its budget is looked for when first needed:
    /// by then a `#[retry_budget]` of the name below the hedge has run, and gates the call.
    pub(super) fn of(hedge: &'static HedgeSite, scope: &'a Scope) -> Self {
        Budget {
            hedge,
            scope,
            own: None,
        }
    }

    /// Whether another attempt may be sent: always without a budget; else withdrawn from
    /// it, the call's deposit counted first.
    pub(super) async fn allows_another(&mut self, ctx: &CallCtx) -> Result<bool, Error> {
        let Some(name) = self.hedge.config.budget else {
            return Ok(true);
        };
        if self.own.is_none() && ctx.gated_by(name) {
            // A `#[retry_budget]` of the name gates the call: its gate counts the deposit,
            // once per call, before the withdrawal.
            return Ok(ctx.another_attempt());
        }
        let own = match self.own().await {
            Ok(own) => own,
            Err(Unresolved::Invalid(error)) => return Err(error),
            Err(Unresolved::Unavailable(error)) => {
                // The extra attempt is refused; the call's deposit is left undone, as `settle`
                // would leave it.
                if let Some(error) = error {
                    tracing::debug!(budget = name, %error, "hedge budget not resolvable now");
                }
                return Ok(false);
            }
        };
        if ctx.claim_deposit() {
            own.deposit();
        }
        Ok(own.another())
    }

    /// Settles the call's deposit when it ends, `last` the rejection that ended it if any:
    /// made here unless a gate of the name makes it, and only if the call reached the
    /// downstream. Never fails the call: a budget that cannot be had misses this deposit.
    pub(super) async fn settle(&mut self, ctx: &CallCtx, last: Option<&Taken>) {
        let Some(name) = self.hedge.config.budget else {
            return;
        };
        if ctx.gated_by(name) || !Taken::reached(last) || !ctx.claim_deposit() {
            return;
        }
        if let Ok(own) = self.own().await {
            own.deposit();
        }
    }

    /// The budget at the call's scope that the hedge counts in itself.
    async fn own(&mut self) -> Result<&Gated, Unresolved> {
        if self.own.is_none() {
            let name = self.hedge.config.budget.expect("asked with a budget");
            let site = self.hedge.budget.get(name).await?;
            self.own = Some(site.budget(self.scope).map_err(Unresolved::Invalid)?);
        }
        Ok(self.own.as_ref().expect("set above"))
    }
}

/// The budget named `name` outside this process's own (see the module docs).
async fn find(name: &str) -> Result<&'static RetryBudgetSite, Found> {
    let coordinator = coordinator::with_current(Coordinator::clone).map_err(Found::Unreachable)?;
    if coordinator.configures(PolicyKind::RetryBudget, name) {
        return Ok(retry_budget::adopted(name, None));
    }
    let registered = coordinator
        .registry_read()
        .await
        .map_err(Found::Unreachable)?;
    let reported = registered.iter().find(|known| {
        known.kind == PolicyKind::RetryBudget && known.name == name && known.reported()
    });
    match reported {
        Some(reported) => Ok(retry_budget::adopted(name, Some(reported))),
        None => Err(Found::Nowhere),
    }
}
