//! Fleet-wide overrides: stored in the coordinator under the namespace (`caracal config set`),
//! applied by every connected process. A change is published on the namespace's feed, so
//! processes usually apply it within one pub/sub delivery; each also checks the version every
//! [`CHECK_EVERY`], so one that missed the message (its subscription reconnecting) is right
//! again within that bound.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use super::Coordinator;
use super::operators::{self, Record};
use crate::config::{OverrideKey, Tables};
use crate::error::Error;
use crate::events;
use crate::operator::Operator;

/// The longest a process goes without checking the fleet's overrides.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(1);

/// What this process knows of the fleet's overrides.
#[derive(Debug, Default)]
pub(super) struct Fleet {
    /// The version applied; `u64::MAX` before the first read.
    version: AtomicU64,
    /// Wakes the check at once (a feed message said the version moved).
    changed: Arc<Notify>,
    running: AtomicBool,
}

impl Fleet {
    pub(super) fn new() -> Self {
        Fleet {
            version: AtomicU64::new(u64::MAX),
            ..Fleet::default()
        }
    }

    /// The version of the overrides this process applies (`u64::MAX` before the first read).
    pub(super) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// A feed message announced `version`.
    pub(super) fn announced(&self, version: u64) {
        if self.version.load(Ordering::Acquire) != version {
            self.changed.notify_one();
        }
    }
}

/// Reads stored overrides; one that does not read (written by another version, or by hand) is
/// skipped with an event rather than failing the rest.
fn tables(pairs: Vec<(String, String)>) -> Tables {
    let mut tables = Tables::new();
    for (setting, value) in pairs {
        let read = OverrideKey::parse(&setting).and_then(|key| {
            let value = key.value(&value)?;
            Ok((key, value))
        });
        match read {
            Ok((key, value)) => {
                let table = tables
                    .entry(key.kind)
                    .or_default()
                    .entry(key.name)
                    .or_default();
                table.insert(key.key.name, value);
            }
            Err(error) => events::config_override_ignored(&setting, &error),
        }
    }
    // A pair that breaks its table as a whole (a minimum throughput above the window) is
    // ignored alone, by each site that resolves it (see `Overrides::resolve`).
    tables
}

/// The operator who made `version` of the overrides, from the record of the last change: none
/// when that record is another version's (a process of a version that keeps no records made a
/// change since), or does not read (the overrides are applied all the same).
fn maker(last: Option<String>, version: u64) -> Option<Operator> {
    let record = Record::read(operators::LAST_OVERRIDE_FIELD, &last?).ok()?;
    (record.count("version") == Some(version)).then_some(record.operator)
}

/// The fleet's overrides, kept in sync with the coordinator: the part of a coordinator that
/// [`Coordinator::fleet`] hands out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FleetSync<'a> {
    pub(super) coordinator: &'a Coordinator,
}

impl FleetSync<'_> {
    /// Reads the fleet's overrides if their version moved, and applies them.
    pub(crate) async fn sync(&self) -> Result<(), Error> {
        let fleet = &self.coordinator.inner.fleet;
        let known = fleet.version.load(Ordering::Acquire);
        let known = (known != u64::MAX).then_some(known);
        let namespace = self.coordinator.namespace_base();
        let read = self
            .coordinator
            .inner
            .backend
            .overrides_read(&namespace, known)
            .await?;
        if let Some((pairs, last)) = read.changed {
            let count = pairs.len();
            self.coordinator.inner.overrides.set_fleet(tables(pairs));
            fleet.version.store(read.version, Ordering::Release);
            // Only once they are in force: a call that starts after the event uses them.
            events::config_applied(read.version, count, maker(last, read.version).as_ref());
            self.coordinator.changed();
        }
        Ok(())
    }

    /// Keeps this process's copy of the fleet's overrides current, from now until the
    /// coordinator shuts down or is dropped. Needs a runtime; without one it starts with the
    /// first call that has one.
    pub(super) fn start(&self) {
        self.coordinator
            .start_once(&self.coordinator.inner.fleet.running, |weak| async move {
                while let Some(coordinator) = super::live(&weak) {
                    // A failed check is retried at the next; the overrides in force stay.
                    let _ = coordinator.fleet().sync().await;
                    let changed = Arc::clone(&coordinator.inner.fleet.changed);
                    drop(coordinator);
                    let _ = tokio::time::timeout(CHECK_EVERY, changed.notified()).await;
                }
            });
    }

    /// Sets (`Some(value)`) or removes one fleet override, made by `operator`, and applies it
    /// here at once; answers whether it changed anything.
    pub(crate) async fn write_override(
        &self,
        key: &OverrideKey,
        value: Option<&str>,
        operator: Option<&Operator>,
    ) -> Result<bool, Error> {
        let setting = key.to_string();
        let canonical = value.map(|value| key.value(value)).transpose()?;
        let canonical = canonical.map(|value| value.to_string());
        let namespace = self.coordinator.namespace_base();
        let changed = self
            .coordinator
            .inner
            .backend
            .overrides_write(
                &namespace,
                &setting,
                canonical.as_deref(),
                operator.map(|operator| operator.unstamped(&[])).as_deref(),
            )
            .await?;
        self.sync().await?;
        Ok(changed)
    }
}
