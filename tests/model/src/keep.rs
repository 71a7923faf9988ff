//! Kept leases (`#[bulkhead(keep = "…")]`, `caracal/src/policy/bulkhead/keep.rs`): the steps
//! the protocol gains with them.
//!
//! - **Keep**: a body that ends leaves its lease in its process's pool instead of releasing
//!   it, if the lease is *keepable*: trusted with no renewal due yet, every renewal sent
//!   answered, its token unread by the body, the latest reply showing the fleet below its
//!   limit, the pool open. The lease stays in the server's set, owned by the process, not by a
//!   body; it waits at most `keep`, and no longer than it could be handed on.
//! - **Reuse**: a caller of the process takes the most recently kept lease, with no round
//!   trip, if it is *reusable*: the same epoch (no loss noticed since), trusted with no renewal
//!   due, its latest reply younger than `fresh` and showing the fleet below its limit,
//!   confirmed since the latest reconnection, its token not below one a body of the process
//!   read. A lease the rules refuse is returned on the way.
//! - **Return**: a kept lease is released by its timer, at shutdown (the pool closes), when
//!   the process notices a loss, or when a caller finds it unusable; a lease whose latest
//!   reply showed the fleet full is released, not kept.
//!
//! Each rule can be switched off ([`KeepRule`]) to see what the checker finds.

use crate::config::KeepRule;
use crate::model::{LeaseModel, ticks};
use crate::state::{CallerId, Holder, Kept, Phase, ProcId, Seen, State, Tick, Write};

impl LeaseModel {
    /// How much longer a lease trusted for `trust` more has no renewal due (trusted at least
    /// as long as one just granted, less a renewal period): a body started on it is then as
    /// safe from a late renewal as one on a fresh lease.
    fn no_renewal_due_for(&self, trust: Tick) -> Tick {
        let cfg = &self.config;
        trust - (ticks(cfg.ttl) - ticks(cfg.margin) - ticks(cfg.renew_every))
    }

    /// How much longer the latest reply about a lease trusted for `trust` more (to the
    /// request sent `ttl − margin − trust` ago) is younger than `fresh`.
    fn fresh_for(&self, trust: Tick) -> Tick {
        let cfg = &self.config;
        trust - (ticks(cfg.ttl) - ticks(cfg.margin)) + ticks(cfg.fresh)
    }

    /// How much longer a lease trusted for `trust` more could be handed on.
    fn reusable_for(&self, trust: Tick) -> Tick {
        let no_renewal_due = self.no_renewal_due_for(trust);
        if self.config.keeps_by(KeepRule::Occupancy) {
            no_renewal_due.min(self.fresh_for(trust))
        } else {
            no_renewal_due
        }
    }

    /// Whether the lease `h` of process `p` may be kept as its body ends; `Err` with what to
    /// note when the fleet was full.
    fn keepable(&self, s: &State, p: ProcId, h: &Holder) -> Result<(), Option<Seen>> {
        let cfg = &self.config;
        let proc = &s.procs[usize::from(p)];
        let rule = |rule, holds: bool| holds || !cfg.keeps_by(rule);
        if proc.closed || h.epoch != proc.epoch || h.trust <= 0 {
            return Err(None);
        }
        if !rule(KeepRule::Occupancy, h.occupancy < cfg.limit) {
            return Err(Some(Seen::NotKeptFull));
        }
        let kept = rule(KeepRule::Unread, !h.wrote)
            && rule(KeepRule::Answered, !h.unanswered)
            && rule(KeepRule::Trusted, self.no_renewal_due_for(h.trust) >= 0);
        if kept { Ok(()) } else { Err(None) }
    }

    /// Whether a new body of process `p` may start on `kept`.
    fn reusable(&self, s: &State, p: ProcId, kept: &Kept) -> bool {
        let cfg = &self.config;
        let proc = &s.procs[usize::from(p)];
        let h = &kept.lease;
        let rule = |rule, holds: bool| holds || !cfg.keeps_by(rule);
        kept.until > 0
            && h.trust > 0
            && rule(KeepRule::Epoch, h.epoch == proc.epoch)
            && rule(KeepRule::Trusted, self.no_renewal_due_for(h.trust) >= 0)
            && rule(
                KeepRule::Occupancy,
                h.occupancy < cfg.limit && self.fresh_for(h.trust) > 0,
            )
            && rule(KeepRule::Confirmed, h.conn == proc.reconnections)
            && rule(
                KeepRule::HighestRead,
                proc.highest_read.is_none_or(|read| h.fence >= read),
            )
    }

    /// Caller `c`'s body ends: its lease is kept for the next caller of its process if the
    /// rules allow, else released.
    pub(crate) fn finish(&self, s: &mut State, c: CallerId) {
        let p = self.proc_of(c);
        let Phase::Holding(h) = &s.callers[usize::from(c)].phase else {
            return;
        };
        if self.config.keep == 0 {
            return self.cancel(s, c);
        }
        if let Err(seen) = self.keepable(s, p, h) {
            if let Some(seen) = seen {
                s.saw(seen);
            }
            return self.cancel(s, c);
        }
        // Kept no longer than it could be handed on: past that it would hold a slot for nothing.
        let until = ticks(self.config.keep).min(self.reusable_for(h.trust));
        if until <= 0 {
            return self.cancel(s, c);
        }
        let mut lease = h.clone();
        lease.read_before |= lease.wrote;
        lease.wrote = false;
        // Without the rule that every renewal be answered, the one in flight dies with its
        // body's renewal loop, and what it would have said with it.
        lease.renewing = None;
        s.callers[usize::from(c)].phase = Phase::Idle;
        if !self.config.keeps_by(KeepRule::InSet) {
            s.server.leases.retain(|&(token, _)| token != lease.token);
        }
        s.procs[usize::from(p)].kept.push(Kept { lease, until });
        s.saw(Seen::Kept);
    }

    /// Caller `c` starts on a lease its process kept, if one is reusable (the most recently
    /// kept first; those the rules refuse are returned on the way). Whether it did.
    pub(crate) fn reuse(&self, s: &mut State, c: CallerId) -> bool {
        let p = self.proc_of(c);
        if self.config.keep == 0 || s.procs[usize::from(p)].closed {
            return false;
        }
        while let Some(kept) = s.procs[usize::from(p)].kept.pop() {
            if !self.reusable(s, p, &kept) {
                Self::give_back(s, p, &kept.lease, Seen::ReturnedUnusable);
                continue;
            }
            let mut lease = kept.lease;
            // Without the epoch rule, a lease of an epoch gone serves a body of this one.
            lease.epoch = s.procs[usize::from(p)].epoch;
            s.callers[usize::from(c)].phase = Phase::Holding(lease);
            s.saw(Seen::Reused);
            self.renew_if_due(s, p, c);
            return true;
        }
        false
    }

    /// Process `p` releases its kept `lease` (`why`): at once, or not at all when cut off
    /// from the server (the lease then expires there; a later release could only free the
    /// slot sooner, which a caller asking later already covers).
    fn give_back(s: &mut State, p: ProcId, lease: &Holder, why: Seen) {
        if !s.procs[usize::from(p)].partitioned {
            s.server.leases.retain(|&(token, _)| token != lease.token);
        }
        s.saw(why);
    }

    /// Process `p`'s pool timers: a kept lease whose time ran out is returned.
    pub(crate) fn kept_timers(&self, s: &mut State, p: ProcId) {
        let (out, kept): (Vec<Kept>, Vec<Kept>) = std::mem::take(&mut s.procs[usize::from(p)].kept)
            .into_iter()
            .partition(|kept| kept.until <= 0);
        s.procs[usize::from(p)].kept = kept;
        for kept in out {
            Self::give_back(s, p, &kept.lease, Seen::ReturnedByTimer);
        }
    }

    /// Process `p` noticed a loss: its kept leases belong to an epoch gone, and are returned
    /// (without the epoch rule they stay, to be handed on).
    pub(crate) fn forget_kept(&self, s: &mut State, p: ProcId) {
        if self.config.keeps_by(KeepRule::Epoch) {
            for kept in std::mem::take(&mut s.procs[usize::from(p)].kept) {
                Self::give_back(s, p, &kept.lease, Seen::ReturnedUnusable);
            }
        }
    }

    /// Process `p` shuts down: its pool closes, every kept lease is returned.
    pub(crate) fn close(&self, s: &mut State, p: ProcId) {
        s.faults.closes -= 1;
        s.procs[usize::from(p)].closed = true;
        for kept in std::mem::take(&mut s.procs[usize::from(p)].kept) {
            Self::give_back(s, p, &kept.lease, Seen::ReturnedAtClose);
        }
    }

    /// Caller `c`'s body reads its fencing token and writes with it to the downstream; with
    /// `keep`, its process notes the highest token read.
    pub(crate) fn write(&self, s: &mut State, c: CallerId) {
        let p = self.proc_of(c);
        let caller = &mut s.callers[usize::from(c)];
        let Phase::Holding(h) = &mut caller.phase else {
            return;
        };
        h.wrote = true;
        let (fence, reread) = (h.fence, h.read_before);
        caller.write = Some(Write {
            fence,
            order: h.order,
            by: ticks(self.config.net_delay),
        });
        if reread {
            s.saw(Seen::TokenReread);
        }
        if self.config.keep > 0 {
            let proc = &mut s.procs[usize::from(p)];
            proc.highest_read = proc.highest_read.max(Some(fence));
        }
    }
}
