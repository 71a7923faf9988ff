//! Operating a fleet: list every identity in use, force a breaker open or closed, change a
//! value for every process at once. The `caracal` command (crate `caracal-cli`) is a thin
//! layer over this.
//!
//! ```no_run
//! use std::time::Duration;
//! use caracal::admin::{BreakerCommand, Operator, StatusValue};
//!
//! # async fn drill() -> Result<(), caracal::Error> {
//! let coordinator = caracal::Coordinator::redis("redis://127.0.0.1:6379").connect().await?;
//! let admin = coordinator.admin();
//! for identity in admin.status().await? {
//!     if let Some(StatusValue::Text(state)) = identity.state.get("state") {
//!         println!("{} {} {}: {state}", identity.kind, identity.name, identity.scope);
//!     }
//! }
//! // Every process rejects calls to partner-api for a minute, then probes it; `status` (and
//! // the events of the change) say who did it, and why.
//! let breaker = caracal::admin::BreakerId::new("partner-api");
//! let operator = Operator::from_env().with_reason("partner-api incident 4711");
//! let open = BreakerCommand::Open { lasts: Some(Duration::from_secs(60)) };
//! admin.breaker_by(&breaker, open, &operator).await?;
//! // Every process runs partner-api's bulkhead with a limit of 40 within a second.
//! admin.set_override_by("bulkhead.partner-api.limit", "40", &operator).await?;
//! # Ok(()) }
//! ```
//!
//! Each command that steers the fleet has a form that records no operator
//! ([`Admin::breaker`], [`Admin::set_override`], [`Admin::unset_override`]) and one that
//! records who gave it and why (the same, `_by` an [`Operator`]). Either replaces the record
//! of an earlier command on the same breaker or setting.
//!
//! Identities appear once a process has used them, and stay while their state lives (at least
//! a few seconds after the last use). Policies marked `local` have no shared state and are not
//! listed.

use std::time::Duration;

use self::breaker::forcing;
pub use self::breaker::{BreakerChanged, BreakerCommand, BreakerId, BreakerState};
use crate::config::OverrideKey;
use crate::config::overrides::text;
pub use crate::coordinator::Check;
use crate::coordinator::Coordinator;
use crate::coordinator::registry::{Registered, Snapshot};
pub use crate::coordinator::url::redacted as redacted_url;
use crate::error::Error;
use crate::identity::{KeyBase, PolicyKind};
pub use crate::operator::Operator;
use crate::policy::breaker::kernel::{Force, Phase};
use crate::policy::breaker::views::{self, Views};
pub use crate::policy::descriptor::StatusValue;
use crate::policy::{
    self,
    descriptor::{self, Descriptor, Field},
};
pub use checks::Refusal;

pub use crate::coordinator::registry::{Process, Rates};

/// The operations of [`Coordinator::admin`].
#[derive(Debug, Clone)]
pub struct Admin {
    coordinator: Coordinator,
}

/// One identity in use, and its state now.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct IdentityStatus {
    /// Its policy kind.
    pub kind: PolicyKind,
    /// The policy name.
    pub name: String,
    /// The operation.
    pub operation: String,
    /// The scope.
    pub scope: String,
    /// Whether processes use it with different values.
    pub drift: bool,
    /// Whether it is in shadow mode (`shadow = true`) in a process that uses it: what it would
    /// refuse runs, counted as `would_reject`.
    pub shadow: bool,
    /// Whether a process uses it now (reported it within the last 15 s; a process reports
    /// every identity it uses every 5 s). One no process uses is listed while it holds a
    /// state an operator stored there (a forced breaker), or until the registry forgets a
    /// process's last report of it.
    pub in_use: bool,
    /// What its state holds.
    pub state: PolicyState,
    /// Who forced it (a circuit breaker) into the state it is in, and why: only while that
    /// forced state lasts, and only when the command was given with an [`Operator`]
    /// ([`Admin::breaker_by`]).
    pub operator: Option<Operator>,
    /// Its decisions per second across the fleet (`caracal top`).
    pub rates: Rates,
}

/// What an identity's state holds: its kind's status fields, by name, in the order the kind
/// declares them (`caracal status --json` prints them so).
///
/// A bulkhead has `limit` (as reported; under drift the smallest in use), `occupancy` (bodies
/// running now, across the fleet), `limits` (under drift, each limit in use with the number
/// of processes using it), and for an adaptive limit `latency_us` and `base_latency_us` (the
/// fleet's mean latency the limit was computed from, and its recent minimum); a circuit breaker `state` (see [`BreakerState::as_str`]), `generation`,
/// `window_total`, `window_failures`, `retry_after_ms` (while open, until a probe may be
/// admitted) and `window_slow`; a rate limit `rate` and `burst` (the last reported).
#[derive(Debug, Clone)]
pub struct PolicyState {
    kind: &'static Descriptor,
    values: Vec<StatusValue>,
}

impl PolicyState {
    /// Each field that `caracal status --json` prints, and its value, in order.
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, &StatusValue)> {
        self.kind
            .fields
            .iter()
            .zip(&self.values)
            .map(|(field, value)| (field.name, value))
    }

    /// The value of the field `name` (`None`: the kind has no such field).
    pub fn get(&self, name: &str) -> Option<&StatusValue> {
        self.field(name).map(|(_, value)| value)
    }

    fn field(&self, name: &str) -> Option<(&'static Field, &StatusValue)> {
        let at = self
            .kind
            .fields
            .iter()
            .position(|field| field.name == name)?;
        Some((&self.kind.fields[at], self.values.get(at)?))
    }

    /// The STATE and DETAIL cells of the `caracal status` table (`3/5 in use`; `open`,
    /// `generation 4, 3 of 10 failed, 1 slow, probe in 4s 120ms`).
    pub fn summary(&self) -> [String; 2] {
        self.kind
            .table
            .map(|template| descriptor::render(template, |name| self.field(name)))
    }
}

impl PartialEq for PolicyState {
    fn eq(&self, other: &Self) -> bool {
        self.kind.kind == other.kind.kind && self.values == other.values
    }
}

/// One value in force, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigValue {
    /// `<kind>.<name>.<key>`, as `config set` takes it.
    pub setting: String,
    /// The value (`none` for an optional value not set).
    pub value: String,
    /// `fleet` (a fleet-wide override), `config` (a process's [`Config`](crate::Config)) or
    /// `attribute`.
    pub source: String,
    /// Who set a fleet-wide override to this value, and why, when it was set with an
    /// [`Operator`] ([`Admin::set_override_by`]).
    pub operator: Option<Operator>,
    /// For a fleet override: how many processes ignore it, because the values of a call site
    /// of theirs cannot take it (each says why with `config.ignored`).
    pub ignored_by: u64,
    /// The processes that use this value from this source now (their ids, as
    /// [`Admin::processes`] lists them), sorted: a process whose own [`Config`](crate::Config)
    /// gives another value is listed under that one. Empty for a value no process reported
    /// within the last 15 s (a fleet override no process uses, an identity's last report).
    pub processes: Vec<String>,
    /// Whether the processes using this setting disagree on it: another value of it is in
    /// force elsewhere ([`IdentityStatus::drift`] of an identity it is a value of).
    pub drift: bool,
}

/// How long a breaker forced until a reset stays listed when no process uses it: as long as
/// its state, which never expires (a century, in the registry's expiry).
const UNTIL_RESET_MS: u64 = 100 * 365 * 24 * 60 * 60 * 1000;

impl Coordinator {
    /// The fleet's operations, on this coordinator's namespace.
    pub fn admin(&self) -> Admin {
        Admin {
            coordinator: self.clone(),
        }
    }
}

impl Admin {
    /// `caracal doctor`: what caracal relies on, checked on the server this coordinator
    /// connected to (see [`RedisBuilder::doctor`](crate::RedisBuilder::doctor), which also
    /// reports a server `connect` refuses). For the in-memory coordinator, one check that says
    /// there is nothing to check.
    pub async fn doctor(&self) -> Vec<Check> {
        self.coordinator.doctor().await
    }

    /// Every identity in use in the namespace, and every one that holds a state an operator
    /// stored there though no process uses it ([`IdentityStatus::in_use`]), by kind, name,
    /// operation and scope, with its state now.
    pub async fn status(&self) -> Result<Vec<IdentityStatus>, Error> {
        let registered = self.coordinator.registry_read().await?;
        let mut listed = Vec::with_capacity(registered.len());
        // Read once, when the first forced breaker is met.
        let mut records = None;
        let snapshots = self.snapshots(&registered).await?;
        for (identity, snapshot) in registered.into_iter().zip(snapshots) {
            let kind = policy::descriptor(identity.kind);
            let state = PolicyState {
                kind,
                values: (kind.status)(&identity, &snapshot)?,
            };
            let operator = match forced_now(&state, snapshot.now_ms) {
                Some(phase) => {
                    let records = match &mut records {
                        Some(records) => records,
                        None => records.insert(self.coordinator.operator_records().await?),
                    };
                    records.steered(identity.kind, &identity.key, phase.as_str())?
                }
                None => None,
            };
            let rates = identity.rates();
            let in_use = identity.used();
            let shadow = identity.value("shadow") == Some("true")
                || identity
                    .in_use("shadow")
                    .iter()
                    .any(|(value, _)| value == "true");
            listed.push(IdentityStatus {
                rates,
                kind: identity.kind,
                name: identity.name,
                operation: identity.operation,
                in_use,
                scope: identity.scope,
                drift: identity.drift,
                shadow,
                state,
                operator,
            });
        }
        listed.sort_by(|a, b| {
            (a.kind, &a.name, &a.operation, &a.scope).cmp(&(
                b.kind,
                &b.name,
                &b.operation,
                &b.scope,
            ))
        });
        Ok(listed)
    }

    /// Each identity's state now, as its kind's status read answers ([`Snapshot::NOTHING`]
    /// for a kind without one), in order: each kind's identities read together, many to a
    /// script (one script per identity took a round trip each, 10 000 at the registry's
    /// bound).
    async fn snapshots(&self, registered: &[Registered]) -> Result<Vec<Snapshot>, Error> {
        let mut snapshots = vec![Snapshot::NOTHING; registered.len()];
        let mut kinds: Vec<PolicyKind> = Vec::new();
        for identity in registered {
            if !kinds.contains(&identity.kind) {
                kinds.push(identity.kind);
            }
        }
        for kind in kinds {
            let Some(read) = &policy::descriptor(kind).read else {
                continue;
            };
            let (at, keys): (Vec<usize>, Vec<KeyBase>) = registered
                .iter()
                .enumerate()
                .filter(|(_, identity)| identity.kind == kind)
                .map(|(at, identity)| (at, identity.key.clone()))
                .unzip();
            let read = self.coordinator.identity_reads(read, &keys).await?;
            for (at, snapshot) in at.into_iter().zip(read) {
                snapshots[at] = snapshot;
            }
        }
        Ok(snapshots)
    }

    /// Carries out an operator's command on a breaker. Every process using it follows within
    /// one pub/sub delivery (a process that misses the message, within 250 ms). Records no
    /// operator (and forgets the one of an earlier command): see
    /// [`breaker_by`](Self::breaker_by).
    pub async fn breaker(
        &self,
        breaker: &BreakerId,
        command: BreakerCommand,
    ) -> Result<BreakerChanged, Error> {
        self.steer_breaker(breaker, command, None).await
    }

    /// [`breaker`](Self::breaker), given by `operator`: [`status`](Self::status) shows who
    /// forced the breaker and why for as long as the forced state lasts, and the
    /// `circuit_breaker.state_changed` event of every process that learns of the change (a
    /// reset's too) carries `who` and `reason`. The time recorded is the coordinator's.
    ///
    /// ```no_run
    /// use caracal::admin::{BreakerCommand, BreakerId, Operator};
    ///
    /// # async fn drill(admin: caracal::admin::Admin) -> Result<(), caracal::Error> {
    /// let operator = Operator::new("alice@ops-1").with_reason("partner-api incident 4711");
    /// let breaker = BreakerId::new("partner-api").scope("region:eu");
    /// admin.breaker_by(&breaker, BreakerCommand::Open { lasts: None }, &operator).await?;
    /// # Ok(()) }
    /// ```
    pub async fn breaker_by(
        &self,
        breaker: &BreakerId,
        command: BreakerCommand,
        operator: &Operator,
    ) -> Result<BreakerChanged, Error> {
        operator.check()?;
        self.steer_breaker(breaker, command, Some(operator)).await
    }

    async fn steer_breaker(
        &self,
        breaker: &BreakerId,
        command: BreakerCommand,
        operator: Option<&Operator>,
    ) -> Result<BreakerChanged, Error> {
        let identity = breaker.identity(&self.coordinator)?;
        let (force, to) = forcing(command)?;
        // Before the command, like its operator: `status` lists the state it stores, whether
        // or not a process uses the breaker.
        let held_ms = match force {
            Force::Open { lasts_ms } | Force::Closed { lasts_ms } if lasts_ms > 0 => lasts_ms,
            Force::Open { .. } | Force::Closed { .. } => UNTIL_RESET_MS,
            Force::Reset { closed_ttl_ms } => closed_ttl_ms,
        };
        self.coordinator.registry_hold(&identity, held_ms).await?;
        // Before the command: a process that learns of the change reads who made it.
        let (kind, state) = (PolicyKind::CircuitBreaker, to.phase().as_str());
        self.coordinator
            .record_steering(kind, &identity.key, state, operator)
            .await?;
        let reply = Views::of(&self.coordinator)
            .force(&identity, force)
            .await?
            .reply;
        Ok(BreakerChanged {
            from: BreakerState::of(reply.from),
            to,
            generation: reply.generation,
        })
    }

    /// The values in force: for each identity in use, every value, where it came from and
    /// the processes using it (under drift, each value in force with its own); and every
    /// fleet override, used or not. With `setting`, only those of that `<kind>.<name>.<key>`
    /// (or, without the key, `<kind>.<name>`).
    pub async fn config(&self, setting: Option<&str>) -> Result<Vec<ConfigValue>, Error> {
        self.coordinator.fleet().sync().await?;
        let registered = self.coordinator.registry_read().await?;
        let mut values: Vec<ConfigValue> = Vec::new();
        // One line per setting, value and source, with every process using it.
        let mut push = |value: ConfigValue| {
            let same = values.iter_mut().find(|known| {
                (&known.setting, &known.value, &known.source)
                    == (&value.setting, &value.value, &value.source)
            });
            match same {
                Some(known) => {
                    known.processes.extend(value.processes);
                    known.processes.sort_unstable();
                    known.processes.dedup();
                    known.ignored_by = known.ignored_by.max(value.ignored_by);
                    known.drift |= value.drift;
                }
                None => values.push(value),
            }
        };
        for identity in &registered {
            let setting = |key: &str| format!("{}.{}.{key}", identity.kind, identity.name);
            // Drift as `status` tells it, on the keys whose values differ.
            let drift = |key: &str| identity.drift && identity.in_use(key).len() > 1;
            if identity.used() {
                for used in identity.in_force() {
                    push(ConfigValue {
                        setting: setting(used.key),
                        value: used.value.to_owned(),
                        source: used.source.to_owned(),
                        operator: None,
                        ignored_by: 0,
                        processes: vec![used.process.to_owned()],
                        drift: drift(used.key),
                    });
                }
                continue;
            }
            for (key, value, source) in identity.entries() {
                push(ConfigValue {
                    setting: setting(key),
                    value: value.to_owned(),
                    source: source.to_owned(),
                    operator: None,
                    ignored_by: 0,
                    processes: Vec::new(),
                    drift: false,
                });
            }
        }
        for (kind, policies) in self.coordinator.fleet_overrides() {
            for (name, table) in policies {
                for (key, value) in table {
                    let mut ignoring: Vec<&str> = registered
                        .iter()
                        .filter(|identity| identity.kind == kind && identity.name == *name)
                        .flat_map(|identity| identity.ignoring(key))
                        .collect();
                    ignoring.sort_unstable();
                    ignoring.dedup();
                    push(ConfigValue {
                        setting: format!("{kind}.{name}.{key}"),
                        value: text(Some(value)),
                        source: FLEET.to_owned(),
                        operator: None,
                        ignored_by: u64::try_from(ignoring.len()).unwrap_or(u64::MAX),
                        processes: Vec::new(),
                        drift: false,
                    });
                }
            }
        }
        if let Some(wanted) = setting {
            // A policy's settings are those whose name is `wanted`'s: names and keys may both
            // hold dots (`bulkhead.a.b.thresholds.normal` is the policy `a.b`'s).
            values.retain(|value| {
                value.setting == wanted
                    || OverrideKey::parse(&value.setting)
                        .is_ok_and(|key| format!("{}.{}", key.kind, key.name) == wanted)
            });
        }
        if values.iter().any(|value| value.source == FLEET) {
            let records = self.coordinator.operator_records().await?;
            for value in values.iter_mut().filter(|value| value.source == FLEET) {
                value.operator = records.setting(&value.setting, &value.value)?;
            }
        }
        values.sort_by(|a, b| (&a.setting, &a.source).cmp(&(&b.setting, &b.source)));
        Ok(values)
    }

    /// Every process reporting to the namespace, by id.
    ///
    /// ```no_run
    /// # async fn list(admin: caracal::admin::Admin) -> Result<(), caracal::Error> {
    /// for process in admin.processes().await? {
    ///     println!("{} on {} (pid {}): {} identities", process.id, process.host, process.pid,
    ///              process.identities);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn processes(&self) -> Result<Vec<Process>, Error> {
        self.coordinator.processes().await
    }

    /// Sets a fleet-wide override (`bulkhead.partner-api.limit`, `"40"`): every connected
    /// process applies it within a second, to calls admitted from then on. The value is
    /// checked as the attribute would check it. Records no operator: see
    /// [`set_override_by`](Self::set_override_by).
    pub async fn set_override(&self, setting: &str, value: &str) -> Result<(), Error> {
        self.write_override(setting, Some(value), None).await?;
        Ok(())
    }

    /// [`set_override`](Self::set_override), given by `operator`: [`config`](Self::config)
    /// shows who set the value and why while it holds, and the `config.applied` event of
    /// every process that applies it carries `who` and `reason`.
    ///
    /// ```no_run
    /// use caracal::admin::Operator;
    ///
    /// # async fn drill(admin: caracal::admin::Admin) -> Result<(), caracal::Error> {
    /// let operator = Operator::from_env().with_reason("partner-api asked us to slow down");
    /// admin.set_override_by("bulkhead.partner-api.limit", "10", &operator).await?;
    /// # Ok(()) }
    /// ```
    pub async fn set_override_by(
        &self,
        setting: &str,
        value: &str,
        operator: &Operator,
    ) -> Result<(), Error> {
        operator.check()?;
        self.write_override(setting, Some(value), Some(operator))
            .await?;
        Ok(())
    }

    /// Removes a fleet-wide override; answers whether there was one.
    pub async fn unset_override(&self, setting: &str) -> Result<bool, Error> {
        self.write_override(setting, None, None).await
    }

    /// [`unset_override`](Self::unset_override), given by `operator`: the `config.applied`
    /// event of every process that applies the change carries `who` and `reason`.
    pub async fn unset_override_by(
        &self,
        setting: &str,
        operator: &Operator,
    ) -> Result<bool, Error> {
        operator.check()?;
        self.write_override(setting, None, Some(operator)).await
    }

    async fn write_override(
        &self,
        setting: &str,
        value: Option<&str>,
        operator: Option<&Operator>,
    ) -> Result<bool, Error> {
        let key = OverrideKey::parse(setting)?;
        let fleet = self.coordinator.fleet();
        fleet.write_override(&key, value, operator).await
    }

    /// Completes at the next change an operator would see: a breaker's state anywhere in the
    /// namespace, an override (or, at the latest, after `at_most`). `caracal watch` redraws
    /// the status each time.
    pub async fn changed(&self, at_most: Duration) {
        views::listen(&self.coordinator);
        let mut changes = self.coordinator.subscribe_changes();
        let _ = tokio::time::timeout(at_most, changes.recv()).await;
    }
}

/// The forced state `state` (a breaker's) is in at `now_ms`, if any: one forced for a time
/// that has passed is over (the next call moves it on), whatever the stored phase still says.
fn forced_now(state: &PolicyState, now_ms: u64) -> Option<Phase> {
    let StatusValue::Text(shown) = state.get("state")? else {
        return None;
    };
    let phase = [Phase::ForcedOpen, Phase::ForcedClosed]
        .into_iter()
        .find(|phase| phase.as_str() == *shown)?;
    match state.get("forced_until_ms") {
        Some(StatusValue::Count(until)) if *until <= now_ms => None,
        _ => Some(phase),
    }
}

/// The source of a fleet-wide override's values.
const FLEET: &str = "fleet";

mod breaker;
mod checks;
#[cfg(feature = "serde")]
mod serialize;
#[cfg(test)]
mod tests;
