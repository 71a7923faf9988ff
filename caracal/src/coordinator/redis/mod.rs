//! The Redis backend: policy state in Redis, changed only by atomic Lua scripts.

mod admin;
mod cluster_check;
mod connector;
#[cfg(test)]
pub(crate) mod differential;
mod doctor;
mod failure;
mod kernels;
mod lanes;
mod link;
mod node;
mod pool;
mod primary;
mod reply;
mod route;
mod scripts;
mod sentinel;
mod server;
mod shards;
mod slot;
mod status_reads;
mod until;
mod writer;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

pub(crate) use self::connector::Topology;
pub(crate) use self::doctor::examine;
use self::link::Link;
pub(crate) use self::node::Trust;
use self::pool::Pool;
pub(crate) use self::sentinel::SentinelUrl;
use super::background::Background;
use super::doctor::Check;
use super::feed;
use super::incarnation::Incarnation;
use crate::error::Error;
use crate::identity::KeyBase;
use crate::kernel::{Resent, Scripted};

pub(super) struct RedisBackend {
    link: Arc<Link>,
    cluster: bool,
    /// Where it connected, for the doctor's connections of its own.
    origin: (Topology, Trust, Duration),
}

impl RedisBackend {
    pub(super) async fn connect(
        (topology, trust): (Topology, Trust),
        timeout: Duration,
        pool_size: usize,
        namespace: &str,
        (incarnation, background): (Arc<Incarnation>, Background),
    ) -> Result<Self, Error> {
        let cluster = matches!(topology, Topology::Cluster(_));
        let origin = (topology.clone(), trust.clone(), timeout);
        let pool = Pool::connect(
            &topology,
            &trust,
            timeout,
            pool_size,
            Arc::clone(&incarnation),
        )
        .await
        .map_err(credentials_refused)?;
        let link = Link::new(
            pool,
            Arc::clone(&incarnation),
            background,
            transitions_channel(namespace),
        );
        let backend = RedisBackend {
            link: Arc::new(link),
            cluster,
            origin,
        };
        backend.check_grants().await?;
        let link = Arc::downgrade(&backend.link);
        let (channel, announcement) = (backend.channel().to_owned(), feed::lost_message());
        let namespace = KeyBase::namespace(namespace);
        incarnation.announce_with(move || {
            if let Some(link) = link.upgrade() {
                // A message lost with a broken connection matters little here: those who
                // would hear it notice the same loss on their own connections.
                link.publish(&namespace, &channel, &announcement, |_| ());
            }
        });
        Ok(backend)
    }

    /// Fails with [`Error::InvalidConfig`] naming what is missing when the server does not know
    /// a command caracal needs (renamed away), or the Redis user may not run one on its keys
    /// and channel; and naming why when the server cannot run caracal's scripts: it answers a
    /// script with an error (scripting disabled, as Garnet without `--lua`; `EVAL` unknown), or
    /// its scripts cannot read `TIME`. One script, sent once: the doctor's atomicity probe
    /// spins the server for tens of milliseconds, which no process start may cost a
    /// production server (see `Admin::doctor`).
    async fn check_grants(&self) -> Result<(), Error> {
        let script = &scripts::ACL_CHECK;
        let denied = |what: String| {
            Error::config(format!(
                "the Redis user lacks permissions caracal needs: {what}; grant it at least \
                 `{REDIS_ACL_RULES}`"
            ))
        };
        let probe = KeyBase::from_tag(&"0".repeat(64)).unwrap_or_else(|| unreachable!());
        let keys = [probe.key("acl-check")];
        let value = match self.link.eval(script, &probe, &keys, self.channel()).await {
            Ok(value) => value,
            Err(error) => {
                return Err(match redis_cause(&error).map(|e| (e.code(), e)) {
                    Some((Some("NOPERM"), refusal)) => denied(format!(
                        "running caracal's scripts on its keys `caracal:v1:*` ({refusal})"
                    )),
                    // A generic error to a script as small as this one: the server runs none.
                    Some((Some("ERR"), refusal)) => Error::config(format!(
                        "the Redis server does not run caracal's scripts ({refusal}); every \
                         decision caracal takes is one atomic Lua script: enable scripting, or \
                         use a server that runs Lua scripts atomically (Redis 7, Valkey)"
                    )),
                    _ => error,
                });
            }
        };
        let Value::Array(lists) = value else {
            return Err(reply::malformed(script.name, "not an array"));
        };
        let Ok([refused, unknown, clock]) = <[Value; 3]>::try_from(lists) else {
            return Err(reply::malformed(script.name, "not two lists and the clock"));
        };
        let unknown = reply::strings(script.name, unknown)?;
        if !unknown.is_empty() {
            return Err(Error::config(format!(
                "the Redis server does not know {} (renamed or disabled with `rename-command`), \
                 and caracal's scripts need it: restore it under its own name",
                unknown.join(", ")
            )));
        }
        let commands = reply::strings(script.name, refused)?;
        if !commands.is_empty() {
            return Err(denied(format!("{} on `caracal:v1:*`", commands.join(", "))));
        }
        match reply::strings(script.name, Value::Array(vec![clock]))?.pop() {
            Some(clock) if clock.is_empty() => Ok(()),
            clock => Err(Error::config(format!(
                "the Redis server's scripts cannot read TIME ({}): every caracal script decides \
                 on the server's clock",
                clock.unwrap_or_default()
            ))),
        }
    }

    fn channel(&self) -> &str {
        self.link.channel()
    }

    /// Publishes `payload` about `key`'s identity on the namespace's feed, as a call's, in the
    /// background and once; `sent` hears whether it went out (see [`Link::publish`]).
    pub(super) fn publish(
        &self,
        key: &KeyBase,
        payload: &str,
        sent: impl FnOnce(bool) + Send + 'static,
    ) {
        let message = format!("{}:{payload}", feed::prefix(feed::Origin::Call, key));
        self.link.publish(key, self.channel(), &message, sent);
    }

    /// `caracal doctor`'s checks of the server this backend connected to.
    pub(super) async fn doctor(&self) -> Vec<Check> {
        let (topology, trust, timeout) = &self.origin;
        doctor::examine(topology, trust, *timeout).await
    }

    pub(super) fn is_cluster(&self) -> bool {
        self.cluster
    }

    pub(super) fn command_timeout(&self) -> Duration {
        self.link.pool.timeout()
    }

    pub(super) fn close(&self) {
        self.link.pool.close();
    }

    /// Listens on the namespace's transition channel until the pool closes or `deliver`
    /// returns `false`. `deliver(None)` is a periodic liveness check; `deliver(Some(message))`
    /// hands over a message. Reconnects with bounded backoff (the pool's), and to the new master
    /// when the sentinels name another. `running` is cleared when the
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
        let connector = self.link.pool.connector();
        let closed = self.link.pool.closed_flag();
        let channel = self.channel().to_owned();
        let timeout = self.link.pool.timeout();
        runtime.spawn(async move {
            let _running = running;
            use futures_util::StreamExt;
            let mut failures = 0u32;
            while !closed.load(Ordering::Acquire) && deliver(None) {
                if let Ok(mut pubsub) = connector.pubsub(timeout).await {
                    let master = connector.master();
                    let subscribed =
                        tokio::time::timeout(timeout, pubsub.subscribe(&channel)).await;
                    if matches!(subscribed, Ok(Ok(()))) {
                        let mut messages = pubsub.on_message();
                        let mut liveness = tokio::time::interval(Duration::from_secs(1));
                        liveness.tick().await;
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
                                    // Subscribed for a whole tick: the next loss starts again
                                    // from the shortest pause (one that ends sooner backs off).
                                    failures = 0;
                                    if closed.load(Ordering::Acquire) || !deliver(None) {
                                        return;
                                    }
                                    // The sentinels named another master: follow it.
                                    if connector.master() != master {
                                        break;
                                    }
                                }
                            }
                        }
                    }
                }
                failures += 1;
                tokio::time::sleep(slot::reconnect_backoff(failures)).await;
            }
        });
        true
    }

    /// Runs one command of kernel `K` on `key`'s identity: batched with the commands of the
    /// identity that queue while one is in flight, when `K`'s commands batch. With the reply,
    /// when the call that answered it was sent (see [`Link::eval_sent`]): a batched command
    /// may wait in its identity's lane first, so this is later than when its caller asked.
    pub(super) async fn run_sent<K: Scripted>(
        &self,
        key: &KeyBase,
        command: K::Command,
    ) -> Result<(K::Reply, Instant), Error> {
        // Only the lane flushes `AFTER` and undoes unheard replies: a kernel declaring what
        // waits before it must batch, or its commands would overtake what they wait for.
        const {
            assert!(
                K::BATCHES || K::AFTER.is_empty(),
                "a kernel with AFTER must batch"
            );
        }
        if K::BATCHES {
            self.link.batched::<K>(key, command).await
        } else {
            let (mut replies, sent) = self.link.script_sent::<K>(key, &[&command]).await?;
            Ok((replies.remove(0), sent))
        }
    }

    /// Sends `command` of `K` without the caller waiting (see [`Link::send_until`]); `done`
    /// hears whether it took effect, or the failure. Until `until` a command whose outcome is
    /// unknown is sent again.
    pub(super) fn send_until<K: Resent>(
        &self,
        key: &KeyBase,
        command: &K::Command,
        until: Instant,
        done: impl FnOnce(Result<bool, Error>) + Send + 'static,
    ) {
        self.link
            .send_until::<K>(key, command, until, Box::new(done));
    }
}

/// The Redis ACL rules caracal needs, and no more (standalone and cluster alike): every
/// command it sends or its scripts run, on its keys and its pub/sub channels. Give them to the
/// user of the coordinator's connection: `ACL SETUSER <user> on ><password> ` followed by these.
/// [`RedisBuilder::connect`](crate::RedisBuilder::connect) checks them and names any missing
/// (but for `CLUSTER SLOTS` and `CLUSTER MYID`, which only a cluster needs: the client reads
/// the slot map, and caracal asks each primary who it is along with its `INFO`).
///
/// ```
/// assert!(caracal::REDIS_ACL_RULES.starts_with("~caracal:v1:* &caracal:v1:*"));
/// ```
pub const REDIS_ACL_RULES: &str = "~caracal:v1:* &caracal:v1:* +hello +ping \
     +info +evalsha +eval +zrem +subscribe +time +zscore +zmscore +zcard +zadd +zrange \
     +zremrangebyscore +zcount +pexpireat +persist +get +set +del +hmget +hset +hdel +hgetall \
     +lindex +lpop +rpush +lset +llen +publish +cluster|slots +cluster|myid";

/// A connection refused for its credentials is a configuration error, not an outage.
fn credentials_refused(error: Error) -> Error {
    let refusal = redis_cause(&error)
        .filter(|cause| {
            cause.kind() == redis::ErrorKind::AuthenticationFailed
                || matches!(cause.code(), Some("NOAUTH" | "WRONGPASS"))
        })
        .map(ToString::to_string);
    match refusal {
        Some(refusal) => Error::config(format!("Redis refused the credentials: {refusal}")),
        None => error,
    }
}

/// The Redis client's error behind `error`, if that is what caused it.
fn redis_cause(error: &Error) -> Option<&redis::RedisError> {
    use std::error::Error as _;
    let Error::CoordinatorUnavailable { cause } = error else {
        return None;
    };
    cause.source()?.downcast_ref::<redis::RedisError>()
}

/// A token as @gkoos/caracal writes it: a hyphenated lowercase UUID (for the differential
/// tests' own `ZREM`s; a release writes its token through its kernel).
#[cfg(test)]
pub(crate) fn token_text(token: uuid::Uuid) -> String {
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
