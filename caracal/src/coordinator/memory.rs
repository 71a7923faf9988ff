//! The embedded backend: the kernels' states in process memory, on tokio's clock (so tests can
//! pause and advance time). It owns the states and runs the kernels on them; every decision is
//! the kernel's, exactly as every decision in Redis is the corresponding script's.

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::operators;
use super::protocol::FleetOverrides;
use super::registry::{self, Process, Registered, Report, Reporting, Snapshot, StatusRead};
use crate::clock::Clock;
use crate::error::Error;
use crate::error::FailureKind;
use crate::identity::KeyBase;
use crate::kernel::{Kernel, Now, Seen, State};
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
    /// The operator records (field → JSON record; see `coordinator::operators`).
    operators: Mutex<BTreeMap<String, String>>,
    /// How long after a kernel command is decided its caller hears the reply: a slow link's
    /// return leg, for tests of what counts from a command's send.
    #[cfg(test)]
    reply_delay: Mutex<std::time::Duration>,
}

/// Every identity's state: one map per state type (the commands of a kind share one).
#[derive(Debug, Default)]
struct States {
    maps: HashMap<TypeId, Box<dyn Map>>,
    /// How many steps were taken: each one's [`Now::order`].
    steps: u64,
    commands: u32,
    /// How many kernel commands ran: the script calls a Redis backend would have made.
    runs: u64,
}

/// One state type's identities, whatever the type.
trait Map: Any + Send + std::fmt::Debug {
    /// Drops what can no longer matter at `now`.
    fn sweep(&mut self, now: Now);
    fn as_any(&mut self) -> &mut dyn Any;
    /// `key`'s state, if it has one.
    fn state(&self, key: &KeyBase) -> Option<&dyn Any>;
    /// How many identities hold a state.
    #[cfg(test)]
    fn len(&self) -> usize;
}

impl<S: State + std::fmt::Debug> Map for HashMap<KeyBase, S> {
    fn sweep(&mut self, now: Now) {
        self.retain(|_, state| !state.forgettable(now));
        crate::sync::shrink(self);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        HashMap::len(self)
    }

    fn as_any(&mut self) -> &mut dyn Any {
        self
    }

    fn state(&self, key: &KeyBase) -> Option<&dyn Any> {
        self.get(key).map(|state| state as &dyn Any)
    }
}

impl States {
    /// The identities holding an `S`.
    fn map<S: State + std::fmt::Debug>(&mut self) -> &mut HashMap<KeyBase, S> {
        self.maps
            .entry(TypeId::of::<S>())
            .or_insert_with(|| Box::new(HashMap::<KeyBase, S>::new()))
            .as_any()
            .downcast_mut()
            .unwrap_or_else(|| unreachable!("filed under its own type"))
    }

    /// Drops what can no longer matter at `now`, every [`SWEEP_EVERY`] commands.
    fn sweep(&mut self, now: Now) {
        self.commands = self.commands.wrapping_add(1);
        if self.commands.is_multiple_of(SWEEP_EVERY) {
            self.sweep_all(now);
        }
    }

    /// Drops what can no longer matter at `now`: what Redis would have expired.
    fn sweep_all(&mut self, now: Now) {
        for map in self.maps.values_mut() {
            map.sweep(now);
        }
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
            operators: Mutex::default(),
            #[cfg(test)]
            reply_delay: Mutex::default(),
        }
    }
}

impl MemoryBackend {
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Runs `step` on the states at the current time, unless the backend is closed.
    fn with<R>(&self, step: impl FnOnce(&mut States, Now) -> R) -> Result<R, Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::unavailable(
                FailureKind::ShutDown,
                "coordinator shut down",
            ));
        }
        let mut states = lock(&self.states);
        states.steps += 1;
        let now = Now {
            ms: self.clock.ms(),
            ns: self.clock.ns(),
            order: states.steps,
        };
        states.sweep(now);
        Ok(step(&mut states, now))
    }

    /// Runs `K`'s step on `key`'s state; a state left with nothing Redis would still hold is
    /// forgotten at once.
    pub(super) fn run<K: Kernel>(
        &self,
        key: &KeyBase,
        command: &K::Command,
    ) -> Result<K::Reply, Error>
    where
        K::State: std::fmt::Debug,
    {
        self.with(|states, now| {
            states.runs += 1;
            let map = states.map::<K::State>();
            let state = map.entry(key.clone()).or_default();
            let reply = K::step(state, command, now, &mut Seen::default());
            if state.forgettable(now) {
                map.remove(key);
            }
            reply
        })
    }

    /// Delays every later kernel command's reply by `delay` (zero: none).
    #[cfg(test)]
    pub(super) fn delay_replies(&self, delay: std::time::Duration) {
        *lock(&self.reply_delay) = delay;
    }

    /// Waits as long as a reply is delayed, if it is.
    #[cfg(test)]
    pub(super) async fn reply_delayed(&self) {
        let delay = *lock(&self.reply_delay);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }
}

/// The registry, fleet overrides, operator records and state reads, by the same rules as their
/// scripts.
impl MemoryBackend {
    /// Drops every state and registry entry that Redis would have expired by now. Commands
    /// sweep only every [`SWEEP_EVERY`] of them, so without this, once calls stop, the
    /// identities of the last burst would stay in memory for good; the coordinator runs it
    /// with its sweep of idle identities.
    pub(super) fn forget_expired(&self) {
        // A closed backend keeps nothing anyone reads again: nothing to sweep.
        let _closed = self.with(|states, now| {
            states.sweep_all(now);
            lock(&self.registry).forget_expired(now.ms);
        });
    }

    /// How many kernel commands ran: the round trips a Redis backend would have made for them.
    #[cfg(test)]
    pub(super) fn runs(&self) -> u64 {
        lock(&self.states).runs
    }

    /// How many identities hold a state or a registry entry.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        let states = lock(&self.states);
        let held: usize = states.maps.values().map(|map| map.len()).sum();
        held + lock(&self.registry).len()
    }

    pub(super) fn registry_report(
        &self,
        process: &Reporting,
        reports: &[Report],
    ) -> Result<Vec<bool>, Error> {
        self.with(|_, now| lock(&self.registry).report(now.ms, process, reports))
    }

    pub(super) fn processes(&self) -> Result<Vec<Process>, Error> {
        self.with(|_, now| lock(&self.registry).processes(now.ms))
    }

    pub(super) fn registry_hold(
        &self,
        key: &KeyBase,
        description: &str,
        lasts_ms: u64,
    ) -> Result<(), Error> {
        self.with(|_, now| lock(&self.registry).hold(now.ms, key, description, lasts_ms))
    }

    pub(super) fn registry_read(&self) -> Result<Vec<Registered>, Error> {
        self.with(|_, now| lock(&self.registry).read(now.ms))
    }

    pub(super) fn overrides_read(&self, known: Option<u64>) -> Result<FleetOverrides, Error> {
        self.with(|_, _| {
            let overrides = lock(&self.overrides);
            let version = overrides.0;
            let changed = (known != Some(version)).then(|| {
                let pairs = overrides
                    .1
                    .iter()
                    .map(|(setting, value)| (setting.clone(), value.clone()))
                    .collect();
                let last = lock(&self.operators)
                    .get(operators::LAST_OVERRIDE_FIELD)
                    .cloned();
                (pairs, last)
            });
            FleetOverrides { version, changed }
        })
    }

    pub(super) fn overrides_write(
        &self,
        setting: &str,
        value: Option<&str>,
        operator: Option<&str>,
    ) -> Result<bool, Error> {
        self.with(|_, _| {
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
                let mut records = lock(&self.operators);
                let field = operators::override_field(setting);
                let last = operators::LAST_OVERRIDE_FIELD.to_owned();
                match operator {
                    None => {
                        records.remove(&field);
                        records.remove(&last);
                    }
                    Some(operator) => {
                        let at = epoch_ms();
                        match value {
                            Some(value) => {
                                let extra = [("value", value.into())];
                                records.insert(field, operators::stamp(operator, at, &extra));
                            }
                            None => {
                                records.remove(&field);
                            }
                        }
                        let extra = [("setting", setting.into()), ("version", overrides.0.into())];
                        records.insert(last, operators::stamp(operator, at, &extra));
                    }
                }
            }
            changed
        })
    }

    /// The records of `fields` that exist (of every field, for none).
    pub(super) fn operators_read(&self, fields: &[String]) -> Result<Vec<(String, String)>, Error> {
        self.with(|_, _| {
            let records = lock(&self.operators);
            let wanted = |field: &String| fields.is_empty() || fields.contains(field);
            records
                .iter()
                .filter(|(field, _)| wanted(field))
                .map(|(field, record)| (field.clone(), record.clone()))
                .collect()
        })
    }

    /// Stores `record` (stamped now) under `field`, or removes it.
    pub(super) fn operator_write(&self, field: &str, record: Option<&str>) -> Result<(), Error> {
        self.with(|_, _| {
            let mut records = lock(&self.operators);
            match record {
                Some(record) => {
                    records.insert(field.to_owned(), operators::stamp(record, epoch_ms(), &[]));
                }
                None => {
                    records.remove(field);
                }
            }
        })
    }

    /// What `read`'s status script would answer: the same figures, from this backend's
    /// state.
    pub(super) fn identity_read(
        &self,
        read: &StatusRead,
        key: &KeyBase,
    ) -> Result<Snapshot, Error> {
        self.with(|states, now| {
            let found: Vec<Option<&dyn Any>> = read
                .memory
                .states
                .iter()
                .map(|state| states.maps.get(&state()).and_then(|map| map.state(key)))
                .collect();
            Snapshot {
                script: read.script.name,
                now_ms: now.ms,
                figures: (read.memory.figures)(&found, now.ms),
            }
        })
    }
}

/// The time an operator record is stamped with: the wall clock, as the Redis scripts stamp
/// theirs with the server's. A record is only shown, never decided on, so the paused clock
/// of a test has no say in it.
fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}
