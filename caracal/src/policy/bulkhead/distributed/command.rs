//! The lease commands a holder sends: acquires (batched per identity) and renewals.

use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

use super::nanos;
use crate::coordinator::Coordinator;
use crate::error::{Error, FailureKind};
use crate::identity::Identity;
use crate::policy::bulkhead::kernel::{self, LeaseAction, LeaseReply, LeaseStep};

/// One lease command: `action` on `token`'s lease in `identity`'s lease set.
#[derive(Debug, Clone, Copy)]
pub(super) struct LeaseCommand<'a> {
    pub(super) identity: &'a Identity,
    pub(super) action: LeaseAction,
    pub(super) token: Uuid,
    pub(super) ttl: Duration,
    pub(super) limit: u32,
    /// The caller's class's share of the limit, in thousandths.
    pub(super) share: u16,
}

impl LeaseCommand<'_> {
    /// The command as the lease kernel takes it. It knows no live fencing token: the Redis
    /// backend sends the one it knows when the command goes out, and nothing is ever lost in
    /// memory.
    fn step(&self) -> LeaseStep {
        LeaseStep {
            action: self.action,
            token: self.token.as_u128(),
            // The ttl as the lease set keeps deadlines: whole milliseconds.
            ttl: u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX),
            limit: self.limit,
            known: 0,
            share: self.share,
        }
    }
}

/// A lease command's answer, and when the command was sent: the server set any deadline it
/// granted after that. An acquire may wait in its identity's lane before its batch is sent, so
/// this is later than when its caller asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LeaseAnswer {
    pub(super) reply: LeaseReply,
    pub(super) sent: Instant,
}

/// Runs one lease command: an acquire joins its identity's lane (batched with the acquires
/// that queue while one is in flight), a renewal goes out at once.
pub(super) async fn lease(
    coordinator: &Coordinator,
    command: LeaseCommand<'_>,
) -> Result<LeaseAnswer, Error> {
    let step = command.step();
    let (reply, sent) = match command.action {
        LeaseAction::Acquire => {
            coordinator
                .run_sent::<kernel::Lease>(command.identity, step)
                .await?
        }
        LeaseAction::Renew => {
            let LeaseStep {
                token, ttl, limit, ..
            } = step;
            let renewal = kernel::Renewal::new(token, ttl, limit, nanos(command.ttl));
            coordinator
                .run_sent::<kernel::Renew>(command.identity, renewal)
                .await?
        }
    };
    Ok(LeaseAnswer {
        reply: reply.map_err(lease_refused)?,
        sent,
    })
}

/// The error a lease command refused whole ends in.
fn lease_refused(refusal: kernel::Refusal) -> Error {
    match refusal {
        kernel::Refusal::Lost => Error::unavailable(
            FailureKind::DataLost,
            "the identity's lease set was lost (flushed, evicted or deleted) while a lease in it \
             was live",
        ),
        kernel::Refusal::Exhausted => Error::unavailable(
            FailureKind::Server,
            "the identity's fencing counter reached 2^53 - 1: no further lease can carry an exact \
             token",
        ),
    }
}
