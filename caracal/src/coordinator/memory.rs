//! The embedded backend: the kernels' states in process memory, on tokio's clock (so tests can
//! pause and advance time). It owns the states and runs the kernels on them; every decision is
//! the kernel's, exactly as every decision in Redis is the corresponding script's.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use uuid::Uuid;

use super::registry::{self, Registered, Report, Snapshot, StatusRead};
use super::{
    BreakerTarget, FleetOverrides, LeaseAnswer, LeaseCommand, RateCommand, Stamped, lease_refused,
};
use crate::Error;
use crate::clock::Clock;
use crate::error::FailureKind;
use crate::identity::{Identity, KeyBase, PolicyKind};
use crate::kernel::Seen;
use crate::kernel::breaker::{
    AdmitReply, Force, ForceReply, Observation, ObserveReply, ProbeOutcome, SettleReply, Store,
};
use crate::kernel::gcra;
use crate::kernel::lease::LeaseSet;
use crate::sync::lock;

/// Forget states that can no longer matter (what key TTLs do in Redis) once every this many
/// commands.
const SWEEP_EVERY: u32 = 1024;

#[derive(Debug)]
pub(super) struct MemoryBackend {
    states: Mutex<States>,
    clock: Clock,
    closed: AtomicBool,
    registry: Mutex<registry::Store>,
    /// The fleet overrides ("<kind>.<name>.<key>" → value) and their version.
    overrides: Mutex<(u64, BTreeMap<String, String>)>,
}

/// Every identity's state, by kind.
#[derive(Debug, Default)]
struct States {
    leases: HashMap<KeyBase, LeaseSet>,
    /// Rate-limit cells: each one's theoretical arrival time (ns).
    rates: HashMap<KeyBase, u64>,
    /// Breaker stores, with the time (ms) after which nothing in each can matter any more.
    breakers: HashMap<KeyBase, (Store, u64)>,
    /// How many breaker decisions were made: each one's stamp.
    breaker_decisions: u64,
    commands: u32,
}

impl States {
    /// Stamps a breaker decision with its place in the order of decisions.
    fn stamp<T>(&mut self, reply: T) -> Stamped<T> {
        self.breaker_decisions += 1;
        Stamped {
            reply,
            stamp: self.breaker_decisions,
        }
    }
}

impl States {
    /// Drops what can no longer matter at `now_ms` / `now_ns`, every [`SWEEP_EVERY`] commands.
    fn sweep(&mut self, now_ms: u64, now_ns: u64) {
        self.commands = self.commands.wrapping_add(1);
        if !self.commands.is_multiple_of(SWEEP_EVERY) {
            return;
        }
        self.leases.retain(|_, set| {
            set.expire(now_ms);
            !set.forgettable(now_ms)
        });
        self.rates.retain(|_, tat| *tat > now_ns);
        self.breakers
            .retain(|_, (_, matters_until)| *matters_until > now_ms);
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend {
            states: Mutex::default(),
            clock: Clock::start(),
            closed: AtomicBool::new(false),
            registry: Mutex::default(),
            overrides: Mutex::default(),
        }
    }
}

impl MemoryBackend {
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Runs `step` on the states at the current time (ms, ns), unless the backend is closed.
    fn with<R>(&self, step: impl FnOnce(&mut States, u64, u64) -> R) -> Result<R, Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::unavailable(
                FailureKind::ShutDown,
                "coordinator shut down",
            ));
        }
        let (now_ms, now_ns) = (self.clock.ms(), self.clock.ns());
        let mut states = lock(&self.states);
        states.sweep(now_ms, now_ns);
        Ok(step(&mut states, now_ms, now_ns))
    }

    /// Runs `step` on `key`'s lease set, after expiring what Redis would have expired; a set
    /// left with nothing Redis would still hold is forgotten.
    fn lease_set<R>(
        &self,
        key: &KeyBase,
        step: impl FnOnce(&mut LeaseSet, u64) -> R,
    ) -> Result<R, Error> {
        self.with(|states, now, _| {
            let set = states.leases.entry(key.clone()).or_default();
            set.expire(now);
            let reply = step(set, now);
            if set.forgettable(now) {
                states.leases.remove(key);
            }
            reply
        })
    }

    /// Runs one lease command. Nothing is ever lost here, so the command knows no live token
    /// to compare the counter with.
    pub(super) fn lease(&self, command: LeaseCommand<'_>) -> Result<LeaseAnswer, Error> {
        let sent = tokio::time::Instant::now();
        let replies = self.lease_set(&command.identity.key, |set, now| {
            set.command(
                command.action,
                now,
                &[command.token.as_u128()],
                command.terms(0),
                &mut Seen::default(),
            )
        })?;
        let reply = replies.map_err(lease_refused)?[0];
        Ok(LeaseAnswer { reply, sent })
    }

    /// Removes `token`'s lease; `true` if there was one.
    pub(super) fn release(&self, key: &KeyBase, token: Uuid) -> Result<bool, Error> {
        self.lease_set(key, |set, _| {
            set.release(token.as_u128(), &mut Seen::default())
        })
    }

    pub(super) fn rate_limit(
        &self,
        command: RateCommand<'_>,
    ) -> Result<Result<(), Duration>, Error> {
        self.with(|states, _, now| {
            let key = &command.identity.key;
            let tat = states.rates.get(key).copied();
            gcra::admit(
                tat,
                now,
                command.interval,
                command.burst,
                &mut Seen::default(),
            )
            .map(|next| {
                states.rates.insert(key.clone(), next);
            })
            .map_err(Duration::from_nanos)
        })
    }

    /// Runs one kernel step on `target`'s store.
    fn breaker<R>(
        &self,
        target: &BreakerTarget,
        step: impl FnOnce(&mut Store, u64) -> R,
    ) -> Result<Stamped<R>, Error> {
        self.with(|states, now, _| {
            let (store, matters_until) = states
                .breakers
                .entry(target.identity.key.clone())
                .or_default();
            let reply = step(store, now);
            *matters_until = store.matters_until(&target.settings);
            states.stamp(reply)
        })
    }

    pub(super) fn breaker_force(
        &self,
        identity: &Identity,
        force: Force,
    ) -> Result<Stamped<ForceReply>, Error> {
        self.with(|states, now, _| {
            let (store, matters_until) = states.breakers.entry(identity.key.clone()).or_default();
            let reply = store.force(now, force, &mut Seen::default());
            // A forced state matters until a reset; a reset's closed state until it expires.
            *matters_until = match force {
                Force::Reset { closed_ttl_ms } => now.saturating_add(closed_ttl_ms),
                Force::Open { .. } | Force::Closed { .. } => u64::MAX,
            };
            states.stamp(reply)
        })
    }

    pub(super) fn breaker_admit(
        &self,
        target: &BreakerTarget,
        token: Uuid,
    ) -> Result<Stamped<AdmitReply>, Error> {
        self.breaker(target, |store, now| {
            store.admit(now, token.as_u128(), &target.settings, &mut Seen::default())
        })
    }

    pub(super) fn breaker_observe(
        &self,
        target: &BreakerTarget,
        generation: u64,
        observations: &[Observation],
        mint: u64,
    ) -> Result<Stamped<ObserveReply>, Error> {
        self.breaker(target, |store, now| {
            store.observe(
                now,
                generation,
                observations,
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
    ) -> Result<Stamped<SettleReply>, Error> {
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
}

/// The registry, fleet overrides and state reads, by the same rules as their scripts.
impl MemoryBackend {
    pub(super) fn registry_report(&self, reports: &[Report]) -> Result<Vec<bool>, Error> {
        self.with(|_, now, _| lock(&self.registry).report(now, reports))
    }

    pub(super) fn registry_read(&self) -> Result<Vec<Registered>, Error> {
        self.with(|_, now, _| lock(&self.registry).read(now))
    }

    pub(super) fn overrides_read(&self, known: Option<u64>) -> Result<FleetOverrides, Error> {
        self.with(|_, _, _| {
            let overrides = lock(&self.overrides);
            let version = overrides.0;
            let pairs = (known != Some(version)).then(|| {
                overrides
                    .1
                    .iter()
                    .map(|(setting, value)| (setting.clone(), value.clone()))
                    .collect()
            });
            (version, pairs)
        })
    }

    pub(super) fn overrides_write(
        &self,
        setting: &str,
        value: Option<&str>,
    ) -> Result<bool, Error> {
        self.with(|_, _, _| {
            let mut overrides = lock(&self.overrides);
            let changed = match value {
                Some(value) => {
                    overrides
                        .1
                        .insert(setting.to_owned(), value.to_owned())
                        .as_deref()
                        != Some(value)
                }
                None => overrides.1.remove(setting).is_some(),
            };
            if changed {
                overrides.0 += 1;
            }
            changed
        })
    }

    /// What `kind`'s status script (`read`) would answer: the same figures, from this
    /// backend's state.
    pub(super) fn identity_read(
        &self,
        kind: PolicyKind,
        read: &StatusRead,
        key: &KeyBase,
    ) -> Result<Snapshot, Error> {
        self.with(|states, now, _| {
            let figures = match kind {
                PolicyKind::Bulkhead => {
                    let live = states.leases.get(key).map_or(0, |set| {
                        let live = set.leases.iter().filter(|&&(_, deadline)| deadline > now);
                        i64::try_from(live.count()).unwrap_or(i64::MAX)
                    });
                    vec![live]
                }
                PolicyKind::CircuitBreaker => {
                    let state = states
                        .breakers
                        .get(key)
                        .and_then(|(store, _)| store.live_state(now));
                    match state {
                        None => vec![-1; 8],
                        Some(state) => {
                            let figure = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                            vec![
                                i64::from(state.phase.code()),
                                figure(state.generation),
                                figure(state.opened_at),
                                i64::from(state.counts.total),
                                i64::from(state.counts.failures),
                                i64::from(state.counts.slow),
                                figure(state.closed_until),
                                figure(state.forced_until),
                            ]
                        }
                    }
                }
                // The other kinds read nothing live.
                _ => Vec::new(),
            };
            Snapshot {
                script: read.script,
                now_ms: now,
                figures,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::identity::{Identity, Kind, Scope};
    use crate::kernel::lease::{LeaseAction, LeaseReply};

    fn identity() -> Identity {
        Identity::new("ns", Kind::Bulkhead, "p", "op", &Scope::GLOBAL)
    }

    fn acquire(
        memory: &MemoryBackend,
        identity: &Identity,
        token: Uuid,
    ) -> Result<LeaseReply, Error> {
        memory
            .lease(LeaseCommand {
                identity,
                action: LeaseAction::Acquire,
                token,
                ttl: Duration::from_secs(1),
                limit: 2,
            })
            .map(|answer| answer.reply)
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_lease_set_is_gone() {
        let memory = MemoryBackend::default();
        let identity = identity();
        acquire(&memory, &identity, Uuid::new_v4()).expect("acquire");
        tokio::time::advance(Duration::from_secs(2)).await;
        // Not full, so nothing would prune the expired lease; but Redis would have expired the
        // key, and the reply counts nothing left over.
        let reply = acquire(&memory, &identity, Uuid::new_v4()).expect("acquire");
        assert_eq!((reply.allowed, reply.occupancy), (true, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn an_emptied_lease_set_keeps_its_fencing_counter_until_it_expires() {
        let memory = MemoryBackend::default();
        let identity = identity();
        let token = Uuid::new_v4();
        let first = acquire(&memory, &identity, token).expect("acquire").fence;
        assert_eq!(memory.release(&identity.key, token).ok(), Some(true));
        let second = acquire(&memory, &identity, Uuid::new_v4())
            .expect("acquire")
            .fence;
        assert!(
            second > first,
            "{second} after {first} in the same millisecond"
        );
        // The counter outlives the last lease by one ttl.
        tokio::time::advance(Duration::from_secs(3)).await;
        memory
            .release(&identity.key, Uuid::new_v4())
            .expect("release");
        assert!(
            lock(&memory.states).leases.is_empty(),
            "forgotten once expired"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_backend_refuses_commands() {
        let memory = MemoryBackend::default();
        memory.close();
        let err = acquire(&memory, &identity(), Uuid::new_v4()).expect_err("closed");
        assert_eq!(err.failure_kind(), Some(FailureKind::ShutDown));
    }
}
