//! The retry budget a hedge's extra attempts withdraw from, and the deposit of its calls.
//!
//! **Which budget.** `budget = "name"` names a `#[retry_budget]` identity of that name (its
//! operation the name, the hedge's scope). It is found, at the call site's first use, in
//! this order: a `#[retry_budget]` (or tower `RetryBudget`) of that name this process has
//! used, whose values it takes; a `[retry_budget.name]` table of the configuration or the
//! fleet's overrides, over the attribute's defaults; a use of that name the fleet's registry
//! lists, with the values reported there (one round trip, the first time only). A name found
//! nowhere is `Error::InvalidConfig`: a typo would otherwise be a budget of its own, and the
//! hedges it allows would be none of the retries' business.
//!
//! **One deposit per call.** A `#[retry_budget]` of the same name on the function, above the
//! hedge or below it, gates the call already: the hedge withdraws through that gate, and the
//! budget's layer makes the call's one deposit. Otherwise the hedge deposits itself, once per
//! call that reached the downstream (the first extra attempt's withdrawal counts the first
//! attempt, still in flight, as the `#[retry]`'s first retry does).

use super::HedgeSite;
use crate::coordinator::{self, Coordinator};
use crate::ctx::{CallCtx, Gated, Taken};
use crate::error::Error;
use crate::identity::{PolicyKind, Scope};
use crate::policy::retry_budget::{self, RetryBudgetSite};

/// One call's budget.
#[derive(Debug)]
pub(super) struct Budget<'a> {
    hedge: &'static HedgeSite,
    scope: &'a Scope,
    /// The budget at the call's scope, once the hedge counted in it itself.
    own: Option<Gated>,
    /// Whether the call's deposit is settled (made by the hedge, or left to the gate).
    settled: bool,
}

impl<'a> Budget<'a> {
    /// The budget of `hedge`'s call at `scope`. Its budget is looked for when first needed:
    /// by then a `#[retry_budget]` of the name below the hedge has run, and gates the call.
    pub(super) fn of(hedge: &'static HedgeSite, scope: &'a Scope) -> Self {
        Budget {
            hedge,
            scope,
            own: None,
            settled: false,
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
            self.settled = true;
            return Ok(ctx.another_attempt());
        }
        let settled = std::mem::replace(&mut self.settled, true);
        let own = self.own().await?;
        if !settled {
            own.deposit();
        }
        Ok(own.another())
    }

    /// Settles the call's deposit when it ends, `last` the rejection that ended it if any:
    /// made here unless a gate of the name makes it, and only if the call reached the
    /// downstream.
    pub(super) async fn settle(
        &mut self,
        ctx: &CallCtx,
        last: Option<&Taken>,
    ) -> Result<(), Error> {
        let Some(name) = self.hedge.config.budget else {
            return Ok(());
        };
        if self.settled || ctx.gated_by(name) || !Taken::reached(last) {
            return Ok(());
        }
        self.settled = true;
        self.own().await?.deposit();
        Ok(())
    }

    /// The budget at the call's scope that the hedge counts in itself.
    async fn own(&mut self) -> Result<&Gated, Error> {
        if self.own.is_none() {
            let name = self.hedge.config.budget.expect("asked with a budget");
            let site = match self.hedge.budget.get() {
                Some(site) => *site,
                None => {
                    let found = find(name).await?;
                    *self.hedge.budget.get_or_init(|| found)
                }
            };
            self.own = Some(site.budget(self.scope)?);
        }
        Ok(self.own.as_ref().expect("set above"))
    }
}

/// The budget named `name`, wherever it is (see the module docs).
async fn find(name: &str) -> Result<&'static RetryBudgetSite, Error> {
    if let Some(site) = retry_budget::named(name) {
        return Ok(site);
    }
    let coordinator = coordinator::with_current(Coordinator::clone)?;
    if coordinator.configures(PolicyKind::RetryBudget, name) {
        return Ok(retry_budget::adopted(name, None));
    }
    let registered = coordinator.registry_read().await?;
    let reported = registered.iter().find(|known| {
        known.kind == PolicyKind::RetryBudget && known.name == name && known.reported()
    });
    match reported {
        Some(reported) => Ok(retry_budget::adopted(name, Some(reported))),
        None => Err(Error::config(format!(
            "`#[hedge(budget = \"{name}\")]`: no `#[retry_budget]` named \"{name}\" in this \
             process, in its configuration or in the fleet's registry"
        ))),
    }
}
