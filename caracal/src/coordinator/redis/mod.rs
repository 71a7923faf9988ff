//! The Redis backend: policy state in Redis, changed only by atomic Lua scripts.

mod breaker;
#[cfg(test)]
mod differential;
mod pool;
mod reply;
mod scripts;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::{ToRedisArgs, Value};
use tokio::time::Instant;
use uuid::Uuid;

use self::pool::Pool;
pub(crate) use self::pool::Topology;
use self::scripts::Script;
use super::{LeaseCommand, LeaseReply, RateCommand};
use crate::Error;
use crate::identity::KeyBase;

pub(super) struct RedisBackend {
    pool: Pool,
    cluster: bool,
    /// Where breaker scripts publish transitions, one channel per namespace.
    channel: String,
}

impl RedisBackend {
    pub(super) async fn connect(
        topology: Topology,
        timeout: Duration,
        pool_size: usize,
        namespace: &str,
    ) -> Result<Self, Error> {
        let cluster = matches!(topology, Topology::Cluster(_));
        Ok(RedisBackend {
            pool: Pool::connect(&topology, timeout, pool_size).await?,
            cluster,
            channel: transitions_channel(namespace),
        })
    }

    fn channel(&self) -> &str {
        &self.channel
    }

    pub(super) fn is_cluster(&self) -> bool {
        self.cluster
    }

    pub(super) fn command_timeout(&self) -> Duration {
        self.pool.timeout()
    }

    pub(super) fn close(&self) {
        self.pool.close();
    }

    /// Listens on the namespace's transition channel until the pool closes or `deliver`
    /// returns `false`. `deliver(None)` is a periodic liveness check; `deliver(Some(message))`
    /// hands over a message. Reconnects with bounded backoff. `running` is cleared when the
    /// listener ends for any reason (its runtime shutting down included). Returns whether a
    /// listener was started (it needs a runtime).
    pub(super) fn subscribe_transitions(
        &self,
        running: Arc<AtomicBool>,
        deliver: impl Fn(Option<&str>) -> bool + Send + Sync + 'static,
    ) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let running = ClearOnDrop(running);
        let connector = self.pool.connector();
        let closed = self.pool.closed_flag();
        let channel = self.channel.clone();
        let timeout = self.pool.timeout();
        runtime.spawn(async move {
            let _running = running;
            use futures_util::StreamExt;
            let mut failures = 0u32;
            while !closed.load(Ordering::Acquire) && deliver(None) {
                if let Ok(mut pubsub) = connector.pubsub(timeout).await {
                    let subscribed =
                        tokio::time::timeout(timeout, pubsub.subscribe(&channel)).await;
                    if matches!(subscribed, Ok(Ok(()))) {
                        failures = 0;
                        let mut messages = pubsub.on_message();
                        let mut liveness = tokio::time::interval(Duration::from_secs(1));
                        loop {
                            tokio::select! {
                                message = messages.next() => {
                                    let Some(message) = message else { break };
                                    if let Ok(text) = message.get_payload::<String>()
                                        && !deliver(Some(&text))
                                    {
                                        return;
                                    }
                                }
                                _ = liveness.tick() => {
                                    if closed.load(Ordering::Acquire) || !deliver(None) {
                                        return;
                                    }
                                }
                            }
                        }
                    }
                }
                failures += 1;
                tokio::time::sleep(Duration::from_millis(50 * u64::from(failures.min(10)))).await;
            }
        });
        true
    }

    /// Runs `script` with `EVALSHA`, falling back once to `EVAL` when the server does not have
    /// it (restart, `SCRIPT FLUSH`, eviction) — safe, as the server ran nothing. Both share one
    /// deadline.
    async fn eval(
        &self,
        script: &Script,
        keys: &[String],
        args: impl ToRedisArgs,
    ) -> Result<Value, Error> {
        let deadline = Instant::now() + self.pool.timeout();
        let mut conn = self.pool.checkout()?;
        let call = |verb: &str, target: &str| {
            let mut cmd = redis::cmd(verb);
            cmd.arg(target).arg(keys.len()).arg(keys).arg(&args);
            cmd
        };
        match conn.send(&call("EVALSHA", &script.sha), deadline).await {
            Err(failure) if failure.is_noscript() => conn
                .send(&call("EVAL", script.body), deadline)
                .await
                .map_err(pool::RedisFailure::into_error),
            result => result.map_err(pool::RedisFailure::into_error),
        }
    }

    pub(super) async fn lease(&self, command: LeaseCommand<'_>) -> Result<LeaseReply, Error> {
        let script = &*scripts::BULKHEAD_LEASE;
        let key = command.key.key("leases");
        let ttl = u64::try_from(command.ttl.as_millis()).unwrap_or(u64::MAX);
        let reply = self
            .eval(
                script,
                &[key],
                (
                    command.action.as_str(),
                    token_text(command.token),
                    ttl,
                    command.limit,
                ),
            )
            .await?;
        let [allowed, occupancy] = reply::integers::<2>(script.name, reply)?;
        Ok(LeaseReply {
            allowed: reply::flag(script.name, allowed)?,
            occupancy: reply::to_u32(script.name, occupancy)?,
        })
    }

    pub(super) async fn rate_limit(
        &self,
        command: RateCommand<'_>,
    ) -> Result<Result<(), Duration>, Error> {
        let script = &*scripts::RATE_LIMIT;
        let interval = u64::try_from(command.interval.as_nanos()).unwrap_or(u64::MAX);
        let value = self
            .eval(
                script,
                &[command.key.key("rate:ns")],
                (interval, command.burst),
            )
            .await?;
        let [allowed, wait] = reply::integers::<2>(script.name, value)?;
        match (reply::flag(script.name, allowed)?, u64::try_from(wait)) {
            (true, Ok(0)) => Ok(Ok(())),
            (false, Ok(wait)) if wait > 0 => Ok(Err(Duration::from_nanos(wait))),
            _ => Err(reply::malformed(
                script.name,
                format_args!("{{{allowed}, {wait}}}"),
            )),
        }
    }

    /// A release of `token`'s lease (a bare `ZREM`: the member is the token, so only the holder
    /// can free its own slot). The returned future owns everything it needs; the request is
    /// queued on the connection at its first poll.
    pub(super) fn release(
        &self,
        key: &KeyBase,
        token: Uuid,
    ) -> impl Future<Output = Result<bool, Error>> + Send + 'static {
        let checkout = self.pool.checkout();
        let deadline = Instant::now() + self.pool.timeout();
        let mut cmd = redis::cmd("ZREM");
        cmd.arg(key.key("leases")).arg(token_text(token));
        async move {
            let value = checkout?
                .send(&cmd, deadline)
                .await
                .map_err(pool::RedisFailure::into_error)?;
            reply::integer_in("ZREM", value, 0..=1).map(|n| n == 1)
        }
    }
}

/// A token as @gkoos/caracal writes it: a hyphenated lowercase UUID.
fn token_text(token: Uuid) -> String {
    token.hyphenated().to_string()
}

/// Clears its flag when dropped.
struct ClearOnDrop(Arc<AtomicBool>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The pub/sub channel of a namespace's breaker transitions.
fn transitions_channel(namespace: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(namespace.as_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("caracal:v1:breaker-transitions:{hex}")
}
