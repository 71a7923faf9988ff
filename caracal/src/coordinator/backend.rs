//! The backend a coordinator owns: the embedded one or Redis. Every command a coordinator runs
//! goes through here, the one place that knows there are two.

use std::time::Duration;

use super::memory::MemoryBackend;
use super::protocol::FleetOverrides;
use super::redis::RedisBackend;
use super::registry::{Process, Registered, Report, Reporting, Snapshot, StatusRead};
use crate::error::Error;
use crate::identity::KeyBase;
use crate::kernel::{Resent, Scripted};

// Few coordinators exist (one per process, usually): boxing either variant would only add an
// indirection to every command.
#[allow(clippy::large_enum_variant)]
pub(super) enum Backend {
    Memory(MemoryBackend),
    Redis(RedisBackend),
}

impl Backend {
    /// `"memory"`, `"redis"` or `"redis-cluster"`.
    pub(super) fn name(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "memory",
            Backend::Redis(redis) if redis.is_cluster() => "redis-cluster",
            Backend::Redis(_) => "redis",
        }
    }

    /// The Redis backend, if this is one.
    pub(super) fn redis(&self) -> Option<&RedisBackend> {
        match self {
            Backend::Memory(_) => None,
            Backend::Redis(redis) => Some(redis),
        }
    }

    /// Refuses further commands.
    pub(super) fn close(&self) {
        match self {
            Backend::Memory(memory) => memory.close(),
            Backend::Redis(redis) => redis.close(),
        }
    }

    /// Drops what the server would have expired by now: the in-memory backend's part of the
    /// coordinator's sweep of idle identities (Redis expires its keys itself).
    pub(super) fn forget_expired(&self) {
        match self {
            Backend::Memory(memory) => memory.forget_expired(),
            Backend::Redis(_) => {}
        }
    }

    /// How many kernel commands the in-memory backend ran (0 for Redis).
    #[cfg(test)]
    pub(super) fn runs(&self) -> u64 {
        match self {
            Backend::Memory(memory) => memory.runs(),
            Backend::Redis(_) => 0,
        }
    }

    /// Delays the in-memory backend's later kernel replies by `delay` (nothing for Redis).
    #[cfg(test)]
    pub(super) fn delay_replies(&self, delay: Duration) {
        if let Backend::Memory(memory) = self {
            memory.delay_replies(delay);
        }
    }

    /// How many identities the in-memory backend holds state or a registry entry for.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        match self {
            Backend::Memory(memory) => memory.held(),
            Backend::Redis(_) => 0,
        }
    }

    /// How long one command may take (for the in-memory backend, the time it gives background
    /// work at shutdown).
    pub(super) fn command_timeout(&self) -> Duration {
        match self {
            Backend::Memory(_) => Duration::from_millis(100),
            Backend::Redis(redis) => redis.command_timeout(),
        }
    }

    /// Runs one command of kernel `K` on the state at `key`.
    pub(super) async fn run<K: Scripted>(
        &self,
        key: &KeyBase,
        command: K::Command,
    ) -> Result<K::Reply, Error>
    where
        K::State: std::fmt::Debug,
    {
        Ok(self.run_sent::<K>(key, command).await?.0)
    }

    /// [`run`](Self::run), with when the command was sent: whatever the command's answer set
    /// on the server, it set it after that.
    pub(super) async fn run_sent<K: Scripted>(
        &self,
        key: &KeyBase,
        command: K::Command,
    ) -> Result<(K::Reply, tokio::time::Instant), Error>
    where
        K::State: std::fmt::Debug,
    {
        match self {
            Backend::Memory(memory) => {
                let sent = tokio::time::Instant::now();
                let ran = memory.run::<K>(key, &command).map(|reply| (reply, sent));
                #[cfg(test)]
                memory.reply_delayed().await;
                ran
            }
            Backend::Redis(redis) => redis.run_sent::<K>(key, command).await,
        }
    }

    /// Sends `command` of `K` at `key` without waiting (see [`Coordinator::send_until`]).
    ///
    /// [`Coordinator::send_until`]: super::Coordinator::send_until
    pub(super) fn send_until<K: Resent>(
        &self,
        key: &KeyBase,
        command: &K::Command,
        until: tokio::time::Instant,
        on_done: impl FnOnce(Result<bool, Error>) + Send + 'static,
    ) where
        K::State: std::fmt::Debug,
    {
        match self {
            Backend::Memory(memory) => on_done(memory.run::<K>(key, command)),
            Backend::Redis(redis) => redis.send_until::<K>(key, command, until, on_done),
        }
    }

    /// Reports `process` and its uses to the namespace's registry: whether each report's
    /// identity drifts.
    pub(super) async fn registry_report(
        &self,
        namespace: &KeyBase,
        process: &Reporting,
        reports: &[Report],
    ) -> Result<Vec<bool>, Error> {
        match self {
            Backend::Memory(memory) => memory.registry_report(process, reports),
            Backend::Redis(redis) => redis.registry_report(namespace, process, reports).await,
        }
    }

    /// Enters the identity at `key` in the namespace's registry for `lasts_ms`, whether or not
    /// a process uses it: an operator stored a state there.
    pub(super) async fn registry_hold(
        &self,
        namespace: &KeyBase,
        key: &KeyBase,
        description: &str,
        lasts_ms: u64,
    ) -> Result<(), Error> {
        match self {
            Backend::Memory(memory) => memory.registry_hold(key, description, lasts_ms),
            Backend::Redis(redis) => {
                redis
                    .registry_hold(namespace, key, description, lasts_ms)
                    .await
            }
        }
    }

    /// Every process reporting to the namespace.
    pub(super) async fn processes(&self, namespace: &KeyBase) -> Result<Vec<Process>, Error> {
        match self {
            Backend::Memory(memory) => memory.processes(),
            Backend::Redis(redis) => redis.processes(namespace).await,
        }
    }

    /// Every identity the namespace's registry holds.
    pub(super) async fn registry_read(
        &self,
        namespace: &KeyBase,
    ) -> Result<Vec<Registered>, Error> {
        match self {
            Backend::Memory(memory) => memory.registry_read(),
            Backend::Redis(redis) => redis.registry_read(namespace).await,
        }
    }

    /// The fleet's overrides, unless their version is `known`.
    pub(super) async fn overrides_read(
        &self,
        namespace: &KeyBase,
        known: Option<u64>,
    ) -> Result<FleetOverrides, Error> {
        match self {
            Backend::Memory(memory) => memory.overrides_read(known),
            Backend::Redis(redis) => redis.overrides_read(namespace, known).await,
        }
    }

    /// Sets (`Some`) or removes one fleet override, recording `operator` (a record without
    /// its time; see `coordinator::operators`) as its maker: whether it changed anything.
    pub(super) async fn overrides_write(
        &self,
        namespace: &KeyBase,
        setting: &str,
        value: Option<&str>,
        operator: Option<&str>,
    ) -> Result<bool, Error> {
        match self {
            Backend::Memory(memory) => memory.overrides_write(setting, value, operator),
            Backend::Redis(redis) => {
                let write = redis.overrides_write(namespace, setting, value, operator);
                write.await
            }
        }
    }

    /// The namespace's operator records of `fields` that exist (of every field, for none).
    pub(super) async fn operators_read(
        &self,
        namespace: &KeyBase,
        fields: &[String],
    ) -> Result<Vec<(String, String)>, Error> {
        match self {
            Backend::Memory(memory) => memory.operators_read(fields),
            Backend::Redis(redis) => redis.operators_read(namespace, fields).await,
        }
    }

    /// Stores an operator record (without its time) under `field`, stamped with the
    /// coordinator's clock, or removes it (`None`).
    pub(super) async fn operator_write(
        &self,
        namespace: &KeyBase,
        field: &str,
        record: Option<&str>,
    ) -> Result<(), Error> {
        match self {
            Backend::Memory(memory) => memory.operator_write(field, record),
            Backend::Redis(redis) => redis.operator_write(namespace, field, record).await,
        }
    }

    /// Runs a kind's status read on the identities at `keys`: one snapshot each, in order.
    pub(super) async fn identity_reads(
        &self,
        read: &StatusRead,
        keys: &[KeyBase],
    ) -> Result<Vec<Snapshot>, Error> {
        match self {
            Backend::Memory(memory) => keys
                .iter()
                .map(|key| memory.identity_read(read, key))
                .collect(),
            Backend::Redis(redis) => redis.identity_reads(read, keys).await,
        }
    }
}
