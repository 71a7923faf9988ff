//! The bulkhead's lease set: at most `limit` live leases per identity, each a token with a
//! deadline, taken, renewed and released by its holder, and a fencing token for every lease
//! granted. Pure; `now` and deadlines are milliseconds.
//!
//! `lease.lua` beside this file implements the same steps on a Redis sorted set (token → deadline)
//! whose layout and meaning are @gkoos/caracal's, so Rust and TypeScript replicas share one
//! budget; a release is a bare `ZREM` of the token there and [`LeaseSet::release`] here.
//!
//! # Steps
//!
//! | command | condition | branch | reply |
//! |---------|-----------|--------|-------|
//! | acquire | the set looks full for the token's class (`len ≥ cap`) | [`Pruned`](Branch::Pruned) | expired leases (deadline ≤ now) are dropped first |
//! | acquire | still `len ≥ limit` after pruning, token not held | [`Full`](Branch::Full) | not allowed |
//! | acquire | still `cap ≤ len < limit` after pruning, token not held | [`AboveShare`](Branch::AboveShare) | not allowed: the rest is kept for higher classes |
//! | acquire | still full for its class after pruning, token held | [`FullButHeld`](Branch::FullButHeld) | allowed, deadline unchanged |
//! | acquire | token absent | [`Admitted`](Branch::Admitted) | allowed, deadline `now + ttl` |
//! | acquire | token held and live | [`AlreadyHeld`](Branch::AlreadyHeld) | allowed, deadline unchanged (idempotent) |
//! | acquire | token held but expired, unpruned | [`Relet`](Branch::Relet) | allowed, deadline `now + ttl` |
//! | renew | token held and live | [`Renewed`](Branch::Renewed) | allowed, deadline `now + ttl` |
//! | renew | token absent | [`RenewGone`](Branch::RenewGone) | not allowed |
//! | renew | token held but expired | [`RenewExpired`](Branch::RenewExpired) | not allowed; the lease is dropped |
//! | release | token held (live or not) | [`Released`](Branch::Released) | removed |
//! | release | token absent | [`ReleaseFoundNothing`](Branch::ReleaseFoundNothing) | nothing |
//! | acquire, renew | counter below `known` | [`Lost`](Branch::Lost) | refused whole, nothing changed |
//! | acquire | counter + tokens past [`MAX_FENCE`] | [`Exhausted`](Branch::Exhausted) | refused whole |
//!
//! Each acquire carries its priority class's share of the limit, in thousandths
//! ([`crate::priority::Thresholds`]); its `cap` is `ceil(limit × share / 1000)`, at least 1
//! ([`crate::priority::cap`]): a token is admitted only while fewer than `cap` leases are live.
//! A share of 1000 (a `Critical` call, or any call without thresholds) has `cap = limit`, the
//! rule as it was before priorities.
//!
//! Expired leases are pruned only when the set looks full for the acquiring class, so the
//! occupancy a reply reports may still count leases that expired but were not in the way.
//!
//! The set itself expires (as its Redis key does) at [`LeaseSet::expires_at`]: set outright to
//! the first lease's deadline, and moved later (never earlier) by every lease taken or renewed,
//! so it never expires while a lease in it is live. An emptied set is gone at once.
//!
//! Every acquire that leaves its token holding a lease grants a fencing token,
//! `max(last + 1, now × 1000)`: strictly increasing per identity, and still so when the counter
//! is lost (a server may restart without its data), because grants never run ahead of the clock
//! by a millisecond's worth. The counter lives at least a lease longer than every lease granted
//! or renewed ([`LeaseSet::fence_expires_at`]). Tokens stop at [`MAX_FENCE`], 2^53 − 1, so that
//! they are exact wherever they go (a Lua number, a JSON number, a JavaScript downstream): a
//! command that would grant past it is refused whole ([`Refusal::Exhausted`]), never wrapped.
//!
//! # Noticing a lost set
//!
//! A command carries the highest fencing token its process knows to be live in the set
//! (`known`: the fence of a lease it still trusts, 0 if none). While such a lease is live the
//! counter is too, so a counter below `known` means the server lost the identity's keys (a
//! `FLUSHALL`, an eviction, a deleted key) without restarting: the command is refused whole
//! ([`Refusal::Lost`], branch [`Lost`](Branch::Lost)) and changes nothing: every other caller
//! that knows a live token of the set is refused the same way until a caller that knows none
//! is granted a lease (the counter then starts again from the clock), so every process whose
//! holders the loss took notices it at its next command. The process then treats it as any
//! data loss.
//!
//! Several tokens acquired in one command are decided one after the other at the same `now`,
//! exactly as the same single acquires would be: the highest share first, and tokens of one
//! share in the command's order (a batch gathers acquires that queued together, so their
//! order is an accident; a `Critical` one should not lose the last slot to a `Normal` one that
//! happened to queue first). Every reply stays at its token's place.

use crate::kernel::{
    Fence, Kernel, Malformed, Now, Plain, Resent, Script, Scripted, Seen, Sink, State, Undo, Wire,
};
use crate::priority;

pub(crate) mod adaptive;

/// A lease's token (a UUID).
pub(crate) type Token = u128;

/// The highest fencing token ever granted: 2^53 − 1, the largest integer every consumer of a
/// token represents exactly (the script's Lua numbers among them).
pub(crate) const MAX_FENCE: u64 = (1 << 53) - 1;

/// Why a whole lease command was refused, before it changed anything but the counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The counter was below the fencing token the caller knows to be live: the set was lost.
    Lost,
    /// Granting would take the counter past [`MAX_FENCE`].
    Exhausted,
}

/// What a lease command asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseAction {
    /// Take a new lease if fewer than `limit` are live.
    Acquire,
    /// Push an existing lease's deadline to now + ttl; fails if it is gone.
    Renew,
}

impl LeaseAction {
    /// The action as the script's first argument names it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LeaseAction::Acquire => "acquire",
            LeaseAction::Renew => "renew",
        }
    }
}

/// The answer to an acquire or a renewal, for one token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LeaseReply {
    /// Whether the token holds a lease afterwards.
    pub(crate) allowed: bool,
    /// Leases in the set afterwards (expired ones not yet pruned included).
    pub(crate) occupancy: u32,
    /// The fencing token of the lease an acquire granted; 0 otherwise.
    pub(crate) fence: u64,
}

/// What every token of one lease command is decided under: the lease's time to live (ms), the
/// identity's limit, and the highest fencing token the caller knows to be live in the set
/// (0 when it knows none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Terms {
    pub(crate) ttl: u64,
    pub(crate) limit: u32,
    pub(crate) known: u64,
}

/// The branches of the table above, in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Branch {
    Pruned,
    Full,
    AboveShare,
    FullButHeld,
    Admitted,
    AlreadyHeld,
    Relet,
    Renewed,
    RenewGone,
    RenewExpired,
    Released,
    ReleaseFoundNothing,
    Lost,
    Exhausted,
}

impl Branch {
    /// Every branch, indexed as [`Seen`] records them.
    #[cfg(test)]
    pub(crate) const ALL: [Branch; 14] = [
        Branch::Pruned,
        Branch::Full,
        Branch::AboveShare,
        Branch::FullButHeld,
        Branch::Admitted,
        Branch::AlreadyHeld,
        Branch::Relet,
        Branch::Renewed,
        Branch::RenewGone,
        Branch::RenewExpired,
        Branch::Released,
        Branch::ReleaseFoundNothing,
        Branch::Lost,
        Branch::Exhausted,
    ];

    fn reach(self, seen: &mut Seen) {
        seen.record(self as usize);
    }
}

/// One identity's lease set: token and deadline of every lease, in no particular order, and
/// when the set expires (an empty set does not exist); and its fencing counter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LeaseSet {
    pub(crate) leases: Vec<(Token, u64)>,
    /// When the whole set expires (absolute ms; meaningful while it holds a lease).
    pub(crate) expires_at: u64,
    /// The last fencing token granted (0: no counter), and when the counter expires: a lease
    /// past the latest deadline it was granted or renewed with, never earlier than before.
    pub(crate) fence: u64,
    pub(crate) fence_expires_at: u64,
}

impl LeaseSet {
    /// Drops at `now` what the Redis key TTLs would have: every lease once the set expired,
    /// the fencing counter once it expired (Redis: a key expires strictly after its time).
    pub(crate) fn expire(&mut self, now: u64) {
        if now > self.expires_at {
            self.leases.clear();
        }
        if now > self.fence_expires_at {
            self.fence = 0;
        }
    }

    /// Moves the set's expiry to `deadline`, outright for a set that was empty (a new key),
    /// else only later (`PEXPIREAT … GT`).
    fn extend(&mut self, deadline: u64, was_empty: bool) {
        self.expires_at = if was_empty {
            deadline
        } else {
            self.expires_at.max(deadline)
        };
    }

    fn occupancy(&self) -> u32 {
        u32::try_from(self.leases.len()).unwrap_or(u32::MAX)
    }

    fn position(&self, token: Token) -> Option<usize> {
        self.leases.iter().position(|&(held, _)| held == token)
    }

    /// Runs `action` at `now` for `tokens`, each with its class's share of the limit in
    /// thousandths (an acquire takes several, decided one after the other, the highest share
    /// first; a renewal exactly one, whose share is not read), for a caller that knows fencing
    /// token `known` to be live: one reply per token, in their order, or the refusal of the
    /// whole command. See the module's table.
    pub(crate) fn command(
        &mut self,
        action: LeaseAction,
        now: u64,
        tokens: &[(Token, u16)],
        lease: Terms,
        seen: &mut Seen,
    ) -> Result<Vec<LeaseReply>, Refusal> {
        if lease.known > self.fence {
            Branch::Lost.reach(seen);
            return Err(Refusal::Lost);
        }
        match action {
            LeaseAction::Acquire => {
                let grants = u64::try_from(tokens.len()).unwrap_or(u64::MAX);
                if self
                    .fence
                    .max(now.saturating_mul(1000))
                    .saturating_add(grants)
                    > MAX_FENCE
                {
                    Branch::Exhausted.reach(seen);
                    return Err(Refusal::Exhausted);
                }
                let mut replies = vec![LeaseReply::default(); tokens.len()];
                for index in priority::highest_share_first(tokens.iter().map(|&(_, share)| share)) {
                    let (token, share) = tokens[index];
                    let cap = priority::cap(lease.limit, share);
                    replies[index] = self.acquire(now, token, lease.ttl, (cap, lease.limit), seen);
                }
                Ok(replies)
            }
            LeaseAction::Renew => Ok(tokens
                .iter()
                .map(|&(token, _)| self.renew(now, token, lease.ttl, seen))
                .collect()),
        }
    }

    /// Keeps the counter until a lease after `deadline` (outright for a new counter, else
    /// never earlier): while a lease granted or renewed up to `deadline` may be live, and
    /// for a renewal that arrives late, the counter is there to compare a caller's `known`
    /// token with.
    fn keep_fence(&mut self, existed: bool, deadline: u64, ttl: u64) {
        let until = deadline.saturating_add(ttl);
        self.fence_expires_at = if existed {
            self.fence_expires_at.max(until)
        } else {
            until
        };
    }

    /// Grants a fencing token for a lease of `ttl` ending at `deadline`.
    fn grant(&mut self, now: u64, deadline: u64, ttl: u64) -> u64 {
        let existed = self.fence > 0;
        self.fence = (self.fence + 1).max(now.saturating_mul(1000));
        self.keep_fence(existed, deadline, ttl);
        self.fence
    }

    /// Acquires a lease for `token`, of a class that may find at most `cap` of `limit` in use:
    /// see the module's table.
    fn acquire(
        &mut self,
        now: u64,
        token: Token,
        ttl: u64,
        (cap, limit): (u32, u32),
        seen: &mut Seen,
    ) -> LeaseReply {
        let deadline = now.saturating_add(ttl);
        if self.occupancy() >= cap {
            Branch::Pruned.reach(seen);
            self.leases.retain(|&(_, held_until)| held_until > now);
            if self.occupancy() >= cap {
                let held = self.position(token).is_some();
                let branch = if held {
                    Branch::FullButHeld
                } else if self.occupancy() >= limit {
                    Branch::Full
                } else {
                    Branch::AboveShare
                };
                branch.reach(seen);
                return LeaseReply {
                    allowed: held,
                    occupancy: self.occupancy(),
                    fence: if held {
                        self.grant(now, deadline, ttl)
                    } else {
                        0
                    },
                };
            }
        }
        match self.position(token) {
            None => {
                Branch::Admitted.reach(seen);
                let was_empty = self.leases.is_empty();
                self.leases.push((token, deadline));
                self.extend(deadline, was_empty);
            }
            Some(index) if self.leases[index].1 > now => Branch::AlreadyHeld.reach(seen),
            Some(index) => {
                Branch::Relet.reach(seen);
                self.leases[index].1 = deadline;
                self.extend(deadline, false);
            }
        }
        LeaseReply {
            allowed: true,
            occupancy: self.occupancy(),
            fence: self.grant(now, deadline, ttl),
        }
    }

    fn renew(&mut self, now: u64, token: Token, ttl: u64, seen: &mut Seen) -> LeaseReply {
        let allowed = match self.position(token) {
            None => {
                Branch::RenewGone.reach(seen);
                false
            }
            Some(index) if self.leases[index].1 <= now => {
                Branch::RenewExpired.reach(seen);
                self.leases.swap_remove(index);
                false
            }
            Some(index) => {
                Branch::Renewed.reach(seen);
                let deadline = now.saturating_add(ttl);
                self.leases[index].1 = deadline;
                self.extend(deadline, false);
                if self.fence > 0 {
                    self.keep_fence(true, deadline, ttl);
                }
                true
            }
        };
        LeaseReply {
            allowed,
            occupancy: self.occupancy(),
            fence: 0,
        }
    }

    /// Removes `token`'s lease; whether there was one (expired or not), as `ZREM` answers.
    pub(crate) fn release(&mut self, token: Token, seen: &mut Seen) -> bool {
        match self.position(token) {
            Some(index) => {
                Branch::Released.reach(seen);
                self.leases.swap_remove(index);
                true
            }
            None => {
                Branch::ReleaseFoundNothing.reach(seen);
                false
            }
        }
    }
}

impl State for LeaseSet {
    fn forgettable(&self, now: Now) -> bool {
        (self.leases.is_empty() || now.ms > self.expires_at) && now.ms > self.fence_expires_at
    }
}

/// An acquire or a renewal as a coordinator command.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lease;

/// One token's acquire or renewal, under its call site's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseStep {
    pub(crate) action: LeaseAction,
    pub(crate) token: Token,
    /// The lease's time to live, in milliseconds.
    pub(crate) ttl: u64,
    pub(crate) limit: u32,
    /// The highest fencing token the caller knows to be live in the set (0: none). On Redis
    /// the backend sends what it knows when the call goes out ([`Wire::known`]).
    pub(crate) known: u64,
    /// The caller's class's share of the limit, in thousandths (1000: the whole limit). An
    /// acquire's own: acquires of different classes share a batch.
    pub(crate) share: u16,
}

impl Kernel for Lease {
    type State = LeaseSet;
    type Command = LeaseStep;
    type Reply = Result<LeaseReply, Refusal>;

    fn step(set: &mut LeaseSet, step: &LeaseStep, now: Now, seen: &mut Seen) -> Self::Reply {
        set.expire(now.ms);
        let terms = Terms {
            ttl: step.ttl,
            limit: step.limit,
            known: step.known,
        };
        set.command(
            step.action,
            now.ms,
            &[(step.token, step.share)],
            terms,
            seen,
        )
        .map(|replies| replies[0])
    }
}

static SCRIPT: Script = Script::new("bulkhead_lease", &[include_str!("lease.lua")]);

/// An acquire: batched with the acquires of its identity that queue while one is in flight,
/// after the identity's waiting releases (the acquire of a task that just released must see
/// its own slot free). A renewal is a [`Renew`]: the coordinator runs only acquires through
/// this kernel (the differential tests drive it with renewals too, on purpose, so the step
/// itself takes both).
impl Scripted for Lease {
    const SCRIPT: &'static Script = &SCRIPT;
    const KEYS: &'static [&'static str] = &["leases", "fence"];
    const WIDTH: usize = 3;
    const BATCHES: bool = true;
    const FENCED: bool = true;
    const AFTER: &'static [Plain] = &[Release::PLAIN];

    /// The batch's shared action and settings, the live token the process knows, then every
    /// token as @gkoos/caracal writes them (hyphenated lowercase UUIDs), then every token's
    /// share in the same order. A refusal of the whole call comes back as a script error
    /// (`CARACAL_LOST`, `CARACAL_FENCE`), not as a reply.
    fn encode(batch: &[&LeaseStep], wire: &Wire<'_>, sink: &mut dyn Sink) {
        let first = batch[0];
        sink.text(first.action.as_str());
        sink.int(first.ttl);
        sink.int(first.limit.into());
        sink.int(wire.known);
        for step in batch {
            write_token(step.token, sink);
        }
        for step in batch {
            sink.int(step.share.into());
        }
    }

    fn decode(reply: &[i64]) -> Result<Self::Reply, Malformed> {
        let allowed = Malformed::flag(reply[0])?;
        let fence = u64::try_from(reply[2])
            .ok()
            .filter(|&fence| fence == 0 || allowed)
            .ok_or_else(|| {
                Malformed::new(format_args!("fence {} (allowed: {allowed})", reply[2]))
            })?;
        Ok(Ok(LeaseReply {
            allowed,
            occupancy: Malformed::count(reply[1])?,
            fence,
        }))
    }

    fn batches_with(first: &LeaseStep, other: &LeaseStep) -> bool {
        (first.action, first.ttl, first.limit) == (other.action, other.ttl, other.limit)
    }

    fn fence(reply: &Self::Reply) -> Fence {
        match reply {
            Ok(reply) if reply.allowed => Fence::Granted(reply.fence),
            _ => Fence::Untouched,
        }
    }

    /// The counter lives a lease past the deadline the server set, after the send.
    fn lasts_ns(step: &LeaseStep) -> u64 {
        step.ttl.saturating_mul(1_000_000)
    }

    /// Released at once: the caller's own release, sent when it gave up, may have reached the
    /// server before this acquire and found nothing. The server set the lease's deadline
    /// before it replied, so the release is worth sending for a lease from now.
    fn unheard(step: &LeaseStep, reply: &Self::Reply, undo: &mut dyn Undo) {
        if matches!(reply, Ok(reply) if reply.allowed) {
            undo.resend::<Release>(&step.token, Self::lasts_ns(step));
        }
    }
}

/// A renewal as a coordinator command: sent at once, never batched, run by the lease script.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renew;

/// A renewal's step, and the lease's exact time to live (nanoseconds): how long past the send
/// the renewal keeps the fencing counter. Built only by [`new`](Self::new), so its step always
/// renews: an acquire run as a `Renew` would grant, but its grant would never be recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Renewal {
    step: LeaseStep,
    ttl_ns: u64,
}

impl Renewal {
    /// The renewal of `token`'s lease under a limit of `limit`, for `ttl_ms` whole milliseconds
    /// on the wire and `ttl_ns` exactly here. Both are kept: the lease set keeps whole
    /// milliseconds, while the trust in the counter has always been the exact ttl.
    pub(crate) fn new(token: Token, ttl_ms: u64, limit: u32, ttl_ns: u64) -> Self {
        let step = LeaseStep {
            action: LeaseAction::Renew,
            token,
            ttl: ttl_ms,
            limit,
            known: 0,
            share: priority::WHOLE,
        };
        Renewal { step, ttl_ns }
    }
}

impl Kernel for Renew {
    type State = LeaseSet;
    type Command = Renewal;
    type Reply = Result<LeaseReply, Refusal>;

    fn step(set: &mut LeaseSet, renewal: &Renewal, now: Now, seen: &mut Seen) -> Self::Reply {
        Lease::step(set, &renewal.step, now, seen)
    }
}

impl Scripted for Renew {
    const SCRIPT: &'static Script = Lease::SCRIPT;
    const KEYS: &'static [&'static str] = Lease::KEYS;
    const WIDTH: usize = Lease::WIDTH;
    const BATCH_REPLY: bool = Lease::BATCH_REPLY;
    const FENCED: bool = true;

    fn encode(batch: &[&Renewal], wire: &Wire<'_>, sink: &mut dyn Sink) {
        let steps: Vec<&LeaseStep> = batch.iter().map(|renewal| &renewal.step).collect();
        Lease::encode(&steps, wire, sink);
    }

    fn decode(reply: &[i64]) -> Result<Self::Reply, Malformed> {
        Lease::decode(reply)
    }

    fn fence(reply: &Self::Reply) -> Fence {
        match reply {
            Ok(reply) if reply.allowed => Fence::Kept,
            _ => Fence::Untouched,
        }
    }

    fn lasts_ns(renewal: &Renewal) -> u64 {
        renewal.ttl_ns
    }
}

/// A release as a coordinator command: the token's lease removed (a bare `ZREM` on Redis).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Release;

impl Kernel for Release {
    type State = LeaseSet;
    type Command = Token;
    /// Whether there was a lease to remove.
    type Reply = bool;

    fn step(set: &mut LeaseSet, &token: &Token, now: Now, seen: &mut Seen) -> bool {
        set.expire(now.ms);
        set.release(token, seen)
    }
}

/// A release goes out as a bare `ZREM` of the token, as @gkoos/caracal sends it: removing a
/// unique token twice removes it once.
impl Resent for Release {
    const PLAIN: Plain = Plain {
        verb: "ZREM",
        key: "leases",
    };

    fn encode(&token: &Token, sink: &mut dyn Sink) {
        write_token(token, sink);
    }
}

/// Writes `token` as @gkoos/caracal writes it: a hyphenated lowercase UUID.
fn write_token(token: Token, sink: &mut dyn Sink) {
    let mut text = uuid::Uuid::encode_buffer();
    sink.text(
        uuid::Uuid::from_u128(token)
            .hyphenated()
            .encode_lower(&mut text),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::priority::{Priority, WHOLE};

    const TERMS: Terms = Terms {
        ttl: 1000,
        limit: 2,
        known: 0,
    };

    fn one(set: &mut LeaseSet, action: LeaseAction, now: u64, token: Token) -> LeaseReply {
        let replies = set.command(action, now, &[(token, WHOLE)], TERMS, &mut Seen::default());
        replies.expect("not refused")[0]
    }

    fn acquire(set: &mut LeaseSet, now: u64, token: Token) -> (bool, u32) {
        let reply = one(set, LeaseAction::Acquire, now, token);
        (reply.allowed, reply.occupancy)
    }

    fn renew(set: &mut LeaseSet, now: u64, token: Token) -> (bool, u32) {
        let reply = one(set, LeaseAction::Renew, now, token);
        (reply.allowed, reply.occupancy)
    }

    #[test]
    fn admits_up_to_the_limit_and_is_idempotent_per_token() {
        let mut set = LeaseSet::default();
        assert_eq!(acquire(&mut set, 0, 1), (true, 1));
        assert_eq!(acquire(&mut set, 0, 2), (true, 2));
        assert_eq!(acquire(&mut set, 0, 3), (false, 2));
        assert_eq!(acquire(&mut set, 0, 1), (true, 2), "held: admitted again");
    }

    #[test]
    fn renewal_extends_and_a_full_set_prunes_what_expired() {
        let mut set = LeaseSet::default();
        acquire(&mut set, 0, 1);
        acquire(&mut set, 0, 2);
        assert_eq!(renew(&mut set, 600, 1), (true, 2));
        // Exactly at its deadline a lease counts as expired: 2's ended at 1000, 1's at 1600.
        assert_eq!(acquire(&mut set, 1000, 3), (true, 2));
        assert_eq!(renew(&mut set, 1000, 2), (false, 2));
        assert_eq!(renew(&mut set, 1600, 1), (false, 1), "expired: dropped");
    }

    #[test]
    fn an_expired_lease_is_counted_until_it_is_in_the_way() {
        let mut set = LeaseSet::default();
        acquire(&mut set, 0, 1);
        assert_eq!(
            acquire(&mut set, 1200, 2),
            (true, 2),
            "1 expired, not pruned"
        );
        assert_eq!(acquire(&mut set, 1200, 3), (true, 2), "full: 1 pruned");
        assert_eq!(set.leases, [(2, 2200), (3, 2200)]);
    }

    #[test]
    fn an_expired_lease_is_relet_to_its_holder_and_the_set_expires_last() {
        let mut set = LeaseSet::default();
        acquire(&mut set, 0, 1);
        assert_eq!(set.expires_at, 1000);
        assert_eq!(acquire(&mut set, 1200, 1), (true, 1));
        assert_eq!(acquire(&mut set, 1300, 2), (true, 2));
        assert_eq!(set.leases, [(1, 2200), (2, 2300)]);
        assert_eq!(set.expires_at, 2300);
        set.release(2, &mut Seen::default());
        assert_eq!(set.expires_at, 2300, "a release never moves the expiry");
    }

    #[test]
    fn fencing_tokens_increase_with_every_grant_and_survive_a_lost_counter() {
        let mut set = LeaseSet::default();
        let fence = |set: &mut LeaseSet, now: u64, token: Token| {
            one(set, LeaseAction::Acquire, now, token).fence
        };
        assert_eq!(fence(&mut set, 5, 1), 5000);
        assert_eq!(fence(&mut set, 5, 2), 5001, "same millisecond: one more");
        assert_eq!(fence(&mut set, 5, 3), 0, "full: no grant");
        set.release(1, &mut Seen::default());
        assert_eq!(
            fence(&mut set, 6, 1),
            6000,
            "the clock moved past the counter"
        );
        // The counter is lost (a restart, or it expired): the clock still orders grants.
        set = LeaseSet::default();
        assert_eq!(fence(&mut set, 7, 1), 7000);
        assert_eq!(
            set.fence_expires_at, 2007,
            "a lease past the lease's deadline"
        );
        assert_eq!(renew(&mut set, 500, 1), (true, 1));
        assert_eq!(set.fence_expires_at, 2500, "renewals keep the counter too");
    }

    /// A counter below the token a caller knows to be live: the keys were lost without a
    /// restart. The command is refused whole and changes nothing, so every caller that knows a
    /// live token is refused too; one that knows none starts the counter again.
    #[test]
    fn a_counter_below_a_live_token_is_a_loss_for_every_caller_that_knows_one() {
        let mut set = LeaseSet::default();
        let known = Terms {
            known: 9000,
            ..TERMS
        };
        let mut seen = Seen::default();
        for action in [LeaseAction::Acquire, LeaseAction::Renew] {
            set = LeaseSet::default();
            assert_eq!(
                set.command(action, 5, &[(1, WHOLE)], known, &mut seen),
                Err(Refusal::Lost)
            );
            assert_eq!(set, LeaseSet::default(), "nothing changed");
        }
        let replies = set.command(
            LeaseAction::Acquire,
            6,
            &[(1, WHOLE), (2, WHOLE)],
            TERMS,
            &mut seen,
        );
        let fences: Vec<u64> = replies
            .expect("knows no token")
            .iter()
            .map(|r| r.fence)
            .collect();
        assert_eq!(fences, [6000, 6001], "the clock orders grants again");
    }

    /// Tokens stay exact as doubles: a command that would grant past 2^53 − 1 is refused,
    /// never wrapped or rounded into a repeat.
    #[test]
    fn fencing_tokens_stop_at_two_to_the_fifty_third() {
        let mut set = LeaseSet {
            fence: MAX_FENCE - 2,
            fence_expires_at: u64::MAX,
            ..LeaseSet::default()
        };
        let mut seen = Seen::default();
        assert_eq!(
            set.command(
                LeaseAction::Acquire,
                5,
                &[(1, WHOLE), (2, WHOLE), (3, WHOLE)],
                TERMS,
                &mut seen
            ),
            Err(Refusal::Exhausted)
        );
        let granted = set.command(
            LeaseAction::Acquire,
            5,
            &[(1, WHOLE), (2, WHOLE)],
            TERMS,
            &mut seen,
        );
        let fences: Vec<u64> = granted.expect("two fit").iter().map(|r| r.fence).collect();
        assert_eq!(fences, [MAX_FENCE - 1, MAX_FENCE]);
        assert_eq!(
            set.command(LeaseAction::Acquire, 5, &[(1, WHOLE)], TERMS, &mut seen),
            Err(Refusal::Exhausted),
            "even a token already held is not granted past the bound"
        );
    }

    /// Thresholds `normal = 0.8, sheddable = 0.5` on a limit of 30: a `Normal` call is admitted
    /// while fewer than 24 leases are live, a `Sheddable` one while fewer than 15, a `Critical`
    /// one up to the whole limit.
    #[test]
    fn a_class_is_admitted_only_below_its_share_of_the_limit() {
        let thresholds = crate::priority::Thresholds::new(0.8, 0.5).expect("valid");
        let share = |priority| thresholds.thousandths(priority);
        let terms = Terms { limit: 30, ..TERMS };
        let mut set = LeaseSet::default();
        let mut seen = Seen::default();
        let mut acquire = |set: &mut LeaseSet, token: Token, priority| {
            let replies = set.command(
                LeaseAction::Acquire,
                0,
                &[(token, share(priority))],
                terms,
                &mut seen,
            );
            let reply = replies.expect("not refused")[0];
            (reply.allowed, reply.occupancy)
        };
        for token in 1..=14 {
            assert!(acquire(&mut set, token, Priority::Sheddable).0);
        }
        assert_eq!(acquire(&mut set, 15, Priority::Sheddable), (true, 15));
        assert_eq!(acquire(&mut set, 16, Priority::Sheddable), (false, 15));
        for token in 16..=23 {
            assert!(acquire(&mut set, token, Priority::Normal).0);
        }
        assert_eq!(acquire(&mut set, 24, Priority::Normal), (true, 24), "24th");
        assert_eq!(acquire(&mut set, 25, Priority::Normal), (false, 24), "25th");
        assert_eq!(
            acquire(&mut set, 1, Priority::Sheddable),
            (true, 24),
            "held"
        );
        for token in 25..=30 {
            assert_eq!(
                acquire(&mut set, token, Priority::Critical),
                (true, token as u32)
            );
        }
        assert_eq!(acquire(&mut set, 31, Priority::Critical), (false, 30));
    }

    /// A batch decides its highest shares first, whatever order its acquires queued in, and
    /// answers each at its place; without thresholds (every share whole) it keeps its order.
    #[test]
    fn a_batch_admits_its_highest_classes_first() {
        let terms = Terms { limit: 3, ..TERMS };
        let mut set = LeaseSet::default();
        let mut seen = Seen::default();
        set.command(LeaseAction::Acquire, 0, &[(9, WHOLE)], terms, &mut seen)
            .expect("not refused");
        // Normal's cap is 3 (ceil 2.4): in the batch's order the two would take the last slots.
        let batch = [(1, 800), (2, 800), (3, WHOLE)];
        let replies = set.command(LeaseAction::Acquire, 0, &batch, terms, &mut seen);
        let answers: Vec<(bool, u32)> = replies
            .expect("not refused")
            .iter()
            .map(|reply| (reply.allowed, reply.occupancy))
            .collect();
        assert_eq!(answers, [(true, 3), (false, 3), (true, 2)]);
        let mut set = LeaseSet::default();
        let whole = [(1, WHOLE), (2, WHOLE), (3, WHOLE), (4, WHOLE)];
        let replies = set.command(LeaseAction::Acquire, 0, &whole, terms, &mut seen);
        let allowed: Vec<bool> = replies
            .expect("not refused")
            .iter()
            .map(|reply| reply.allowed)
            .collect();
        assert_eq!(allowed, [true, true, true, false], "in the batch's order");
    }

    /// A release's arguments, after the key: the token as @gkoos/caracal writes it.
    #[test]
    fn a_release_is_sent_as_its_token_text() {
        #[derive(Default)]
        struct Texts(Vec<String>);
        impl Sink for Texts {
            fn int(&mut self, n: u64) {
                self.0.push(n.to_string());
            }
            fn text(&mut self, text: &str) {
                self.0.push(text.to_owned());
            }
        }
        let token = uuid::Uuid::new_v4();
        let mut texts = Texts::default();
        <Release as Resent>::encode(&token.as_u128(), &mut texts);
        assert_eq!(texts.0, [token.hyphenated().to_string()]);
        assert_eq!(
            (Release::PLAIN.verb, Release::PLAIN.key),
            ("ZREM", "leases")
        );
    }

    #[test]
    fn release_removes_only_its_own_token() {
        let mut set = LeaseSet::default();
        acquire(&mut set, 0, 1);
        let mut seen = Seen::default();
        assert!(!set.release(9, &mut seen));
        assert!(set.release(1, &mut seen));
        assert!(!set.release(1, &mut seen));
        assert!(set.leases.is_empty());
    }
}
