//! The embedded backend: the same semantics as the Lua scripts, in process memory, on tokio's
//! clock (so tests can pause and advance time).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

use super::{BreakerTarget, LeaseAction, LeaseCommand, LeaseReply, RateCommand};
use crate::Error;
use crate::error::FailureKind;
use crate::identity::KeyBase;
use crate::policy::breaker::kernel::{
    AdmitReply, MsClock, ObserveReply, ProbeOutcome, Seen, SettleReply, Store,
};
use crate::policy::rate_limit::gcra_admit;
use crate::sync::lock;

/// Sweep breakers and rate cells that can no longer matter once every this many commands.
const SWEEP_EVERY: u32 = 1024;

#[derive(Debug)]
pub(super) struct MemoryBackend {
    /// Live leases per lease set: token and deadline. A set is removed once empty, as the Redis
    /// key expires at its latest deadline.
    leases: Mutex<HashMap<KeyBase, Vec<(Uuid, Instant)>>>,
    /// Rate-limit cells: the theoretical arrival time of each.
    rates: Mutex<HashMap<KeyBase, Instant>>,
    /// Breaker stores, with the time (ms) after which nothing in each can matter any more.
    breakers: Mutex<HashMap<KeyBase, (Store, u64)>>,
    commands: AtomicU32,
    clock: MsClock,
    closed: AtomicBool,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend {
            leases: Mutex::default(),
            rates: Mutex::default(),
            breakers: Mutex::default(),
            commands: AtomicU32::new(0),
            clock: MsClock::start(),
            closed: AtomicBool::new(false),
        }
    }
}

impl MemoryBackend {
    fn check_open(&self) -> Result<(), Error> {
        if self.closed.load(Ordering::Acquire) {
            Err(Error::unavailable(
                FailureKind::ShutDown,
                "coordinator shut down",
            ))
        } else {
            Ok(())
        }
    }

    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    pub(super) fn lease(&self, command: LeaseCommand<'_>) -> Result<LeaseReply, Error> {
        self.check_open()?;
        let now = Instant::now();
        let mut sets = lock(&self.leases);
        let set = sets.entry(command.key.clone()).or_default();
        set.retain(|&(_, deadline)| deadline > now);
        let held = set.iter().position(|&(token, _)| token == command.token);
        let occupancy = |set: &Vec<_>| u32::try_from(set.len()).unwrap_or(u32::MAX);
        let reply = match (command.action, held) {
            (LeaseAction::Renew, Some(index)) => {
                set[index].1 = now + command.ttl;
                LeaseReply {
                    allowed: true,
                    occupancy: occupancy(set),
                }
            }
            (LeaseAction::Acquire, Some(_)) => LeaseReply {
                allowed: true,
                occupancy: occupancy(set),
            },
            (LeaseAction::Renew, None) => LeaseReply {
                allowed: false,
                occupancy: occupancy(set),
            },
            (LeaseAction::Acquire, None) if occupancy(set) >= command.limit => LeaseReply {
                allowed: false,
                occupancy: occupancy(set),
            },
            (LeaseAction::Acquire, None) => {
                set.push((command.token, now + command.ttl));
                LeaseReply {
                    allowed: true,
                    occupancy: occupancy(set),
                }
            }
        };
        if set.is_empty() {
            sets.remove(command.key);
        }
        Ok(reply)
    }

    pub(super) fn rate_limit(
        &self,
        command: RateCommand<'_>,
    ) -> Result<Result<(), Duration>, Error> {
        self.check_open()?;
        let now = Instant::now();
        let mut rates = lock(&self.rates);
        if self
            .commands
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(SWEEP_EVERY)
        {
            rates.retain(|_, tat| *tat > now);
        }
        let tat = rates.get(command.key).copied();
        Ok(
            gcra_admit(tat, now, command.interval, command.burst).map(|next| {
                rates.insert(command.key.clone(), next);
            }),
        )
    }

    /// Runs one kernel step on `target`'s store.
    fn breaker<R>(
        &self,
        target: &BreakerTarget,
        step: impl FnOnce(&mut Store, u64) -> R,
    ) -> Result<R, Error> {
        self.check_open()?;
        let now = self.clock.now();
        let mut breakers = lock(&self.breakers);
        if self
            .commands
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(SWEEP_EVERY)
        {
            breakers.retain(|_, (_, matters_until)| *matters_until > now);
        }
        let (store, matters_until) = breakers.entry(target.key.clone()).or_default();
        let reply = step(store, now);
        *matters_until = store.matters_until(&target.settings);
        Ok(reply)
    }

    pub(super) fn breaker_admit(
        &self,
        target: &BreakerTarget,
        token: Uuid,
    ) -> Result<AdmitReply, Error> {
        self.breaker(target, |store, now| {
            store.admit(now, token.as_u128(), &target.settings, &mut Seen::default())
        })
    }

    pub(super) fn breaker_observe(
        &self,
        target: &BreakerTarget,
        generation: u64,
        failures: &[bool],
        mint: u64,
    ) -> Result<ObserveReply, Error> {
        self.breaker(target, |store, now| {
            store.observe(
                now,
                generation,
                failures,
                mint,
                &target.settings,
                &mut Seen::default(),
            )
        })
    }

    pub(super) fn breaker_settle(
        &self,
        target: &BreakerTarget,
        token: Uuid,
        outcome: ProbeOutcome,
        generation: u64,
    ) -> Result<SettleReply, Error> {
        self.breaker(target, |store, now| {
            store.settle(
                now,
                token.as_u128(),
                outcome,
                generation,
                &target.settings,
                &mut Seen::default(),
            )
        })
    }

    /// Removes `token`'s lease; `true` if it was live.
    pub(super) fn release(&self, key: &KeyBase, token: Uuid) -> Result<bool, Error> {
        self.check_open()?;
        let now = Instant::now();
        let mut sets = lock(&self.leases);
        let Some(set) = sets.get_mut(key) else {
            return Ok(false);
        };
        let removed = set
            .iter()
            .any(|&(held, deadline)| held == token && deadline > now);
        set.retain(|&(held, deadline)| held != token && deadline > now);
        if set.is_empty() {
            sets.remove(key);
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::identity::{Kind, Scope};

    fn key() -> KeyBase {
        KeyBase::derive("ns", Kind::Bulkhead, "p", "op", &Scope::GLOBAL)
    }

    fn command(key: &KeyBase, action: LeaseAction, token: Uuid, ttl_ms: u64) -> LeaseCommand<'_> {
        LeaseCommand {
            key,
            action,
            token,
            ttl: Duration::from_millis(ttl_ms),
            limit: 2,
        }
    }

    fn reply(allowed: bool, occupancy: u32) -> LeaseReply {
        LeaseReply { allowed, occupancy }
    }

    #[tokio::test(start_paused = true)]
    async fn admits_up_to_the_limit_and_is_idempotent_per_token() {
        let memory = MemoryBackend::default();
        let key = key();
        let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let acquire = |t| memory.lease(command(&key, LeaseAction::Acquire, t, 1000));
        assert_eq!(acquire(a).ok(), Some(reply(true, 1)));
        assert_eq!(acquire(b).ok(), Some(reply(true, 2)));
        assert_eq!(acquire(c).ok(), Some(reply(false, 2)));
        assert_eq!(acquire(a).ok(), Some(reply(true, 2)));
    }

    #[tokio::test(start_paused = true)]
    async fn renewal_extends_and_expiry_prunes() {
        let memory = MemoryBackend::default();
        let key = key();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        memory
            .lease(command(&key, LeaseAction::Acquire, a, 1000))
            .expect("acquire");
        memory
            .lease(command(&key, LeaseAction::Acquire, b, 1000))
            .expect("acquire");
        tokio::time::advance(Duration::from_millis(600)).await;
        let renewed = memory.lease(command(&key, LeaseAction::Renew, a, 1000));
        assert_eq!(renewed.ok(), Some(reply(true, 2)));
        // b's deadline (1000 ms) passes, a's (1600 ms) does not: exactly at a deadline the
        // lease counts as expired.
        tokio::time::advance(Duration::from_millis(400)).await;
        let c = Uuid::new_v4();
        let taken = memory.lease(command(&key, LeaseAction::Acquire, c, 1000));
        assert_eq!(taken.ok(), Some(reply(true, 2)));
        let renew_b = memory.lease(command(&key, LeaseAction::Renew, b, 1000));
        assert_eq!(renew_b.ok(), Some(reply(false, 2)));
    }

    #[tokio::test(start_paused = true)]
    async fn release_frees_only_its_own_token() {
        let memory = MemoryBackend::default();
        let key = key();
        let a = Uuid::new_v4();
        memory
            .lease(command(&key, LeaseAction::Acquire, a, 1000))
            .expect("acquire");
        assert_eq!(memory.release(&key, Uuid::new_v4()).ok(), Some(false));
        assert_eq!(memory.release(&key, a).ok(), Some(true));
        assert_eq!(memory.release(&key, a).ok(), Some(false));
        assert!(
            lock(&memory.leases).is_empty(),
            "an empty lease set is dropped"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_backend_refuses_commands() {
        let memory = MemoryBackend::default();
        memory.close();
        let err = memory
            .lease(command(&key(), LeaseAction::Acquire, Uuid::new_v4(), 1000))
            .expect_err("closed");
        assert_eq!(err.failure_kind(), Some(FailureKind::ShutDown));
    }
}
