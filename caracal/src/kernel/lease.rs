//! The bulkhead's lease set: at most `limit` live leases per identity, each a token with a
//! deadline, taken, renewed and released by its holder, and a fencing token for every lease
//! granted. Pure; `now` and deadlines are milliseconds.
//!
//! `lua/bulkhead_lease.lua` implements the same steps on a Redis sorted set (token → deadline)
//! whose layout and meaning are @gkoos/caracal's, so Rust and TypeScript replicas share one
//! budget; a release is a bare `ZREM` of the token there and [`LeaseSet::release`] here.
//!
//! # Steps
//!
//! | command | condition | branch | reply |
//! |---------|-----------|--------|-------|
//! | acquire | the set looks full (`len ≥ limit`) | [`Pruned`](Branch::Pruned) | expired leases (deadline ≤ now) are dropped first |
//! | acquire | still full after pruning, token not held | [`Full`](Branch::Full) | not allowed |
//! | acquire | still full after pruning, token held | [`FullButHeld`](Branch::FullButHeld) | allowed, deadline unchanged |
//! | acquire | token absent | [`Admitted`](Branch::Admitted) | allowed, deadline `now + ttl` |
//! | acquire | token held and live | [`AlreadyHeld`](Branch::AlreadyHeld) | allowed, deadline unchanged (idempotent) |
//! | acquire | token held but expired, unpruned | [`Relet`](Branch::Relet) | allowed, deadline `now + ttl` |
//! | renew | token held and live | [`Renewed`](Branch::Renewed) | allowed, deadline `now + ttl` |
//! | renew | token absent | [`RenewGone`](Branch::RenewGone) | not allowed |
//! | renew | token held but expired | [`RenewExpired`](Branch::RenewExpired) | not allowed; the lease is dropped |
//! | release | token held (live or not) | [`Released`](Branch::Released) | removed |
//! | release | token absent | [`ReleaseFoundNothing`](Branch::ReleaseFoundNothing) | nothing |
//!
//! Expired leases are pruned only when the set looks full, so the occupancy a reply reports may
//! still count leases that expired but were not in the way.
//!
//! The set itself expires (as its Redis key does) at [`LeaseSet::expires_at`]: set outright to
//! the first lease's deadline, and moved later (never earlier) by every lease taken or renewed,
//! so it never expires while a lease in it is live. An emptied set is gone at once.
//!
//! Every acquire that leaves its token holding a lease grants a fencing token,
//! `max(last + 1, now × 1000)`: strictly increasing per identity, and still so when the counter
//! is lost (it expires with the last grant's lease; a server may restart without its data),
//! because grants never run ahead of the clock by a millisecond's worth.
//!
//! Several tokens acquired in one command are decided one after the other at the same `now`,
//! exactly as the same single acquires would be.

use super::Seen;

/// A lease's token (a UUID).
pub(crate) type Token = u128;

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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseReply {
    /// Whether the token holds a lease afterwards.
    pub(crate) allowed: bool,
    /// Leases in the set afterwards (expired ones not yet pruned included).
    pub(crate) occupancy: u32,
    /// The fencing token of the lease an acquire granted; 0 otherwise.
    pub(crate) fence: u64,
}

/// The branches of the table above, in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Branch {
    Pruned,
    Full,
    FullButHeld,
    Admitted,
    AlreadyHeld,
    Relet,
    Renewed,
    RenewGone,
    RenewExpired,
    Released,
    ReleaseFoundNothing,
}

impl Branch {
    /// Every branch, indexed as [`Seen`] records them.
    #[cfg(test)]
    pub(crate) const ALL: [Branch; 11] = [
        Branch::Pruned,
        Branch::Full,
        Branch::FullButHeld,
        Branch::Admitted,
        Branch::AlreadyHeld,
        Branch::Relet,
        Branch::Renewed,
        Branch::RenewGone,
        Branch::RenewExpired,
        Branch::Released,
        Branch::ReleaseFoundNothing,
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
    /// The last fencing token granted (0: none yet), and when the counter expires.
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

    /// Whether nothing is left that Redis would still hold: no lease, no live counter.
    pub(crate) fn forgettable(&self, now: u64) -> bool {
        self.leases.is_empty() && now > self.fence_expires_at
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

    /// Runs `action` for `token` at `now`: see the module's table.
    pub(crate) fn apply(
        &mut self,
        action: LeaseAction,
        now: u64,
        token: Token,
        ttl: u64,
        limit: u32,
        seen: &mut Seen,
    ) -> LeaseReply {
        match action {
            LeaseAction::Acquire => self.acquire(now, token, ttl, limit, seen),
            LeaseAction::Renew => self.renew(now, token, ttl, seen),
        }
    }

    /// Grants a fencing token for a lease ending at `deadline`.
    fn grant(&mut self, now: u64, deadline: u64) -> u64 {
        self.fence = (self.fence + 1).max(now.saturating_mul(1000));
        self.fence_expires_at = deadline;
        self.fence
    }

    /// Acquires a lease for `token`: see the module's table.
    pub(crate) fn acquire(
        &mut self,
        now: u64,
        token: Token,
        ttl: u64,
        limit: u32,
        seen: &mut Seen,
    ) -> LeaseReply {
        let deadline = now.saturating_add(ttl);
        if self.occupancy() >= limit {
            Branch::Pruned.reach(seen);
            self.leases.retain(|&(_, held_until)| held_until > now);
            if self.occupancy() >= limit {
                let held = self.position(token).is_some();
                let branch = if held {
                    Branch::FullButHeld
                } else {
                    Branch::Full
                };
                branch.reach(seen);
                return LeaseReply {
                    allowed: held,
                    occupancy: self.occupancy(),
                    fence: if held { self.grant(now, deadline) } else { 0 },
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
            fence: self.grant(now, deadline),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn acquire(set: &mut LeaseSet, now: u64, token: Token) -> (bool, u32) {
        let reply = set.apply(
            LeaseAction::Acquire,
            now,
            token,
            1000,
            2,
            &mut Seen::default(),
        );
        (reply.allowed, reply.occupancy)
    }

    fn renew(set: &mut LeaseSet, now: u64, token: Token) -> (bool, u32) {
        let reply = set.apply(
            LeaseAction::Renew,
            now,
            token,
            1000,
            2,
            &mut Seen::default(),
        );
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
            set.apply(
                LeaseAction::Acquire,
                now,
                token,
                1000,
                2,
                &mut Seen::default(),
            )
            .fence
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
