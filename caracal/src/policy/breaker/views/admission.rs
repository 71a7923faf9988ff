//! A call's admission through a breaker: from the view when it can, else with one round trip;
//! and a probe's settlement.

use std::future::Future;

use tokio::time::Instant;
use uuid::Uuid;

use super::view::Tells;
use super::{Admission, BreakerTarget, ViewDecision, Views, listen};
use crate::coordinator::{Stamped, WeakCoordinator};
use crate::error::Error;
use crate::identity::Identity;
use crate::policy::breaker::events;
use crate::policy::breaker::kernel::{
    Admit, AdmitCommand, AdmitReply, Force, ForceReply, Forcing, Phase, ProbeOutcome, Settle,
    SettleCommand, SettleReply,
};

impl Views<'_> {
    /// Decides how a call passes `target`'s breaker: from this process's view when it can, else
    /// with one round trip.
    pub(crate) async fn admission(&self, target: &BreakerTarget) -> Result<Admission, Error> {
        let breakers = self.state();
        listen(self.coordinator);
        // The batches waited for, and until when.
        let mut waiting: Option<(u64, Instant)> = None;
        loop {
            let waited_for = waiting.map(|(until, _)| until);
            match breakers.decide_locally(target, Instant::now(), waited_for) {
                ViewDecision::Decided(admission) => return Ok(admission),
                ViewDecision::Ask => break,
                // Every reply wakes every waiter, so each waits on until the batches in flight
                // when it began are answered: asking the coordinator sooner could overtake the
                // batch that carries its verdict. Bounded by the command timeout: a verdict
                // that never comes (its task dropped with a runtime) must not hold admissions
                // forever; the coordinator decides after that.
                ViewDecision::AwaitVerdict { verdict, until } => {
                    let (_, deadline) = *waiting.get_or_insert_with(|| {
                        (until, Instant::now() + self.coordinator.command_timeout())
                    });
                    if tokio::time::timeout_at(deadline, verdict).await.is_err() {
                        break;
                    }
                }
            }
        }
        let token = crate::token::fresh();
        // If this call is dropped (or the reply lost) after the script took a probe slot, the
        // slot is handed back rather than held until its lease ends.
        let mut unclaimed = UnclaimedProbe {
            views: self,
            target,
            token,
            armed: true,
        };
        let asked = Instant::now();
        let admit = AdmitCommand {
            token: token.as_u128(),
            settings: target.settings,
        };
        let Stamped { reply, stamp } = self
            .coordinator
            .run::<Admit>(&target.identity, admit)
            .await?;
        let told = reply.told(&target.settings);
        let admission = match reply {
            AdmitReply::Closed { generation, .. } => Admission::Closed { generation },
            AdmitReply::ForcedClosed { generation, .. } => Admission::Unrecorded { generation },
            AdmitReply::Open { generation, .. } | AdmitReply::ForcedOpen { generation, .. } => {
                Admission::Open {
                    phase: told.phase,
                    generation,
                    retry_after: told.probe_due_in,
                }
            }
            AdmitReply::ProbeLimit { generation } => Admission::ProbeLimit { generation },
            AdmitReply::Probe { generation, .. } => Admission::Probe { generation, token },
        };
        self.announce(breakers.learn(target, told.learned(asked, stamp), told.maker));
        unclaimed.armed = false;
        Ok(admission)
    }

    /// What this process last saw of `target`'s breaker, within the last-known age bound.
    pub(crate) fn last_known(&self, target: &BreakerTarget) -> Option<Phase> {
        self.state().last_known(&target.identity.key)
    }

    /// Settles the probe `token` admitted under `generation`. The request is sent at the first
    /// poll; the future owns everything it needs.
    fn settle(
        &self,
        target: BreakerTarget,
        token: Uuid,
        outcome: ProbeOutcome,
        generation: u64,
    ) -> impl Future<Output = Result<Stamped<SettleReply>, Error>> + Send + 'static {
        let coordinator = self.coordinator.clone();
        let settle = SettleCommand {
            token: token.as_u128(),
            outcome,
            generation,
            settings: target.settings,
        };
        async move { coordinator.run::<Settle>(&target.identity, settle).await }
    }

    /// Settles a probe without waiting; the reply refreshes the view.
    pub(crate) fn settle_later(
        &self,
        target: &BreakerTarget,
        token: Uuid,
        outcome: ProbeOutcome,
        generation: u64,
    ) {
        let asked = Instant::now();
        let settle = self.settle(target.clone(), token, outcome, generation);
        let weak = WeakCoordinator::of(self.coordinator);
        let target = target.clone();
        self.coordinator.in_background(async move {
            let reply = settle.await;
            let Some(coordinator) = weak.upgrade() else {
                return;
            };
            match reply {
                Ok(Stamped { reply, stamp }) => {
                    events::settled(&target.identity.at(), generation, &reply);
                    let told = reply.told(&target.settings);
                    let learned = told.learned(asked, stamp);
                    let views = Views::of(&coordinator);
                    views.announce(views.state().learn(&target, learned, told.maker));
                }
                Err(error) => events::coordinator_error(&target.identity.at(), "settle", &error),
            }
        });
    }

    /// Carries out an operator's command on the breaker of `identity`, and applies it to this
    /// process's own view at once.
    pub(crate) async fn force(
        &self,
        identity: &Identity,
        force: Force,
    ) -> Result<Stamped<ForceReply>, Error> {
        let asked = tokio::time::Instant::now();
        let forced = self.coordinator.run::<Forcing>(identity, force).await?;
        self.announce(self.state().on_forced(&identity.key, force, forced, asked));
        Ok(forced)
    }
}

/// A probe slot the admission script may have taken for a call that never learned of it.
struct UnclaimedProbe<'a> {
    views: &'a Views<'a>,
    target: &'a BreakerTarget,
    token: Uuid,
    armed: bool,
}

impl Drop for UnclaimedProbe<'_> {
    fn drop(&mut self) {
        if self.armed {
            let settle =
                self.views
                    .settle(self.target.clone(), self.token, ProbeOutcome::Ignored, 0);
            self.views.coordinator.in_background(async move {
                let _ = settle.await;
            });
        }
    }
}
