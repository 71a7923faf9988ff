//! What the checker verifies in every reachable state (`always`), and what must be reachable
//! at all (`sometimes`: a model whose properties hold because nothing happens proves nothing).
//!
//! # The limit, and its exceptions
//!
//! A holder *believes it holds* its lease while its body has not been cancelled: it was
//! granted, its body has not ended, and its process's epoch has not moved on since it asked. A
//! running process cancels a holder the moment its trust deadline passes, before the body can
//! take another step; a frozen one cannot, so its holders go on believing until it resumes.
//! [`LIMIT`] counts the believers, less three named exceptions:
//!
//! - **(a) frozen past its trust deadline**: its process is stopped and the deadline has
//!   passed. It takes no step before it resumes, and then none at all: the check before every
//!   step cancels it first. What it sent before the freeze can still land after another
//!   holder's: that is what the fencing token is for ([`FENCING`]).
//! - **(b) cut off through a loss**: its lease was granted by an earlier incarnation of the
//!   server, its process has not noticed the loss yet, and the process was frozen or cut off
//!   from the server at some moment since the loss. Such a process cannot learn of the loss
//!   (no check, no published notice reaches it) before its trust deadline or its reconnection:
//!   the grace of the others cannot wait for it. Fencing closes it.
//! - **(c) admitted blind** ([`crate::Config::excuse_blind`]): the holder was granted on a
//!   command served after a loss its process had not noticed yet (a failover or a flush: the
//!   connections stay, the command runs on the emptied set as on an idle one), and the token
//!   its process trusted, carried, would not have revealed the loss (it trusted none, or the
//!   counter had been rebuilt at or above it). No grace applies: its process did not know. A
//!   grant the carried token would have refused is no exception: with the token not carried
//!   ([`crate::Config::carry_known`] off) the checker finds a process admitting over its own
//!   holder. Until the holders of the lost leases notice (within the check
//!   period, or at their next lease command), both hold: the "flush between two commands" of
//!   `caracal/docs/leases.md`. Not inherent: only a check the acquire itself made (of a marker
//!   the loss removes) would close it.
//!
//! # Fencing
//!
//! [`FENCING`]: a downstream that remembers the highest token it accepted never accepts a write
//! of a lease granted before one whose write it already accepted; except once the server
//! granted a token not above an earlier one ([`TOKENS_INCREASE`] broken): a loss that turned
//! the server clock back, or erased a counter that had run ahead of the clock, before any
//! command carrying a token its process trusted (which puts the counter back) reached it.
//!
//! [`TOKEN_READ_ONCE`], with kept leases ([`crate::Config::keep`]): a body never reads a fencing
//! token an earlier body read (a lease whose token was read is not kept).
//!
//! # Availability
//!
//! [`NOTICED_IN_TIME`]: a process that could run and reach the server all along since a loss
//! notices it within the check period; [`NO_FALSE_NOTICE`]: a process notices only a loss
//! that happened, and each loss once; [`GRACE_ENDS_IN_TIME`], checked at every refusal: such
//! a process refuses no caller for the grace after *loss + check period + grace*, so
//! admissions resume within the grace of the latest a process can notice.

use stateright::Property;

use crate::model::LeaseModel;
use crate::state::{Phase, Seen, State};

/// At most `limit` holders believe they hold, except the named exceptions.
pub const LIMIT: &str = "at most limit holders believe they hold (but frozen past the deadline, cut off through a loss, admitted blind)";
/// The downstream never takes a stale holder's write after a newer one's.
pub const FENCING: &str =
    "the downstream never accepts a stale holder after a newer one (but once tokens went back)";
/// Every grant's token is above every token granted before.
pub const TOKENS_INCREASE: &str = "every grant's fencing token is above every one before";
/// Every process that could reach the server notices a loss within the check period.
pub const NOTICED_IN_TIME: &str =
    "a process that could reach the server notices a loss within the check period";
/// Admissions resume in time: no process that could reach the server all along refuses a
/// caller for the grace later than the loss + the check period + the grace.
pub const GRACE_ENDS_IN_TIME: &str =
    "a process that could reach the server refuses no caller past loss + check period + grace";
/// A process whose renewal was denied for a lease it still trusted (which only a loss does)
/// keeps no holder of a lease granted before that loss.
pub const TOLD_HOLDERS_STOP: &str =
    "a process a denied renewal told of a loss keeps no holder of the lost leases";
/// No body reads a fencing token an earlier body read (kept leases hand tokens on).
pub const TOKEN_READ_ONCE: &str = "no body reads a fencing token an earlier body read";
/// No process takes for a loss something that was none (or a loss it had noticed).
pub const NO_FALSE_NOTICE: &str = "a process notices only a loss that happened, once";

/// Whether holder `c` (believing it holds) is one of the named exceptions.
fn excused(model: &LeaseModel, s: &State, c: usize) -> bool {
    let Phase::Holding(h) = &s.callers[c].phase else {
        return false;
    };
    let proc = &s.procs[usize::from(model.config.callers[c])];
    let frozen_past = proc.frozen && h.trust == 0;
    let cut_off = h.incarnation < s.server.incarnation && proc.cut_off;
    let blind = model.config.excuse_blind && h.blind;
    frozen_past || cut_off || blind
}

/// How many holders believe they hold and are no exception.
pub fn believers(model: &LeaseModel, s: &State) -> usize {
    (0..s.callers.len())
        .filter(|&c| match &s.callers[c].phase {
            Phase::Holding(h) => {
                h.epoch == s.procs[usize::from(model.config.callers[c])].epoch
                    && !excused(model, s, c)
            }
            _ => false,
        })
        .count()
}

fn limit(model: &LeaseModel, s: &State) -> bool {
    believers(model, s) <= usize::from(model.config.limit)
}

fn told_holders_stop(model: &LeaseModel, s: &State) -> bool {
    s.callers
        .iter()
        .enumerate()
        .all(|(c, caller)| match &caller.phase {
            Phase::Holding(h) => {
                let proc = &s.procs[usize::from(model.config.callers[c])];
                h.epoch != proc.epoch || h.incarnation >= proc.told
            }
            _ => true,
        })
}

fn noticed_in_time(model: &LeaseModel, s: &State) -> bool {
    let bound = i8::try_from(model.config.notice_bound()).unwrap_or(i8::MAX);
    let Some(at) = s.server.lost_at else {
        return true;
    };
    !s.has_broken(Seen::LateNotice)
        && s.procs
            .iter()
            .all(|p| p.knows == s.server.incarnation || p.cut_off || at >= -bound)
}

/// A `sometimes` property: `fact` is reachable.
macro_rules! sometimes {
    ($name:literal, $fact:ident) => {
        Property::sometimes($name, |_: &LeaseModel, s: &State| s.has_seen(Seen::$fact))
    };
}

/// Every property of the model.
pub fn all() -> Vec<Property<LeaseModel>> {
    vec![
        Property::always(LIMIT, limit),
        Property::always(FENCING, |_: &LeaseModel, s: &State| {
            !s.downstream.stale_accepted || s.server.forgot
        }),
        Property::always(TOKENS_INCREASE, |_: &LeaseModel, s: &State| {
            !s.server.forgot
        }),
        Property::always(NOTICED_IN_TIME, noticed_in_time),
        Property::always(NO_FALSE_NOTICE, |_: &LeaseModel, s: &State| {
            !s.has_broken(Seen::FalseNotice)
        }),
        Property::always(GRACE_ENDS_IN_TIME, |_: &LeaseModel, s: &State| {
            !s.has_broken(Seen::LateRefusal)
        }),
        Property::always(TOLD_HOLDERS_STOP, told_holders_stop),
        Property::always(TOKEN_READ_ONCE, |_: &LeaseModel, s: &State| {
            !s.has_broken(Seen::TokenReread)
        }),
        sometimes!("a loss is noticed", LossNoticed),
        sometimes!("a holder is cancelled by a loss", CancelledByLoss),
        sometimes!("a caller is refused for the grace", RefusedForGrace),
        sometimes!("a caller is admitted after the grace", AdmittedAfterGrace),
        sometimes!("a frozen holder is caught when it resumes", FrozenCaught),
        sometimes!(
            "a command finds the counter below a live token",
            CounterBelowKnown
        ),
        sometimes!("the downstream refuses a stale write", StaleWriteRefused),
        sometimes!("a caller is admitted blind after a loss", AdmittedBlind),
        sometimes!("a release is retried", ReleaseRetried),
        sometimes!(
            "an acquire waits in its lane behind a call in flight",
            Queued
        ),
        sometimes!("two acquires go out as one batch", Batched),
        sometimes!("a denied renewal reveals a loss", DeniedRenewalNoticed),
        sometimes!(
            "a holder gives up a lease the server still holds, with no fault",
            NeedlessLoss
        ),
        sometimes!(
            "an acquire is answered past its trust deadline",
            AdmissionExpired
        ),
        sometimes!("a finished body's lease is kept", Kept),
        sometimes!("a new body starts on a kept lease", Reused),
        sometimes!("a kept lease is returned by its timer", ReturnedByTimer),
        sometimes!("a kept lease is returned at shutdown", ReturnedAtClose),
        sometimes!(
            "a kept lease the rules refuse is returned",
            ReturnedUnusable
        ),
        sometimes!(
            "a lease is released, not kept: the fleet was full",
            NotKeptFull
        ),
    ]
}
