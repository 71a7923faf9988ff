//! The connection pool: a few multiplexed connections, each reconnecting on its own.
//!
//! Rules every command follows here:
//! - a deadline bounds it (the command timeout); nothing waits longer;
//! - nothing is queued while a connection is down: the command fails at once and the slot
//!   reconnects in the background with bounded backoff;
//! - nothing is replayed: a command whose outcome is unknown (timeout, broken connection) is
//!   reported as such, never sent again;
//! - a connection that keeps timing out, reports its disconnection, or answers READONLY (it now
//!   talks to a replica) is dropped and replaced.

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::Poll;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, IntoConnectionInfo, PushKind, RedisError, ServerErrorKind, Value};
use tokio::time::Instant;

use crate::Error;
use crate::error::FailureKind;
use crate::events;
use crate::sync::lock;

/// Where the coordinator's state lives.
#[derive(Debug, Clone)]
pub(crate) enum Topology {
    Standalone(String),
    Cluster(Vec<String>),
}

/// Consecutive timeouts after which a connection is presumed dead and replaced.
const TIMEOUTS_BEFORE_RECONNECT: u32 = 2;
/// The longest pause between two reconnection attempts.
const MAX_RECONNECT_BACKOFF: Duration = Duration::from_millis(500);
/// The shortest: while calls are waiting on a down connection, the backoff shrinks to this,
/// so service resumes within this long of the server's return without a connect storm.
const MIN_RECONNECT_INTERVAL: Duration = Duration::from_millis(50);

pub(crate) enum Connector {
    Standalone(redis::Client),
    Cluster(Box<redis::cluster::ClusterClient>, Vec<String>),
}

impl Connector {
    fn new(topology: &Topology, timeout: Duration) -> Result<Self, Error> {
        let tcp = redis::io::tcp::TcpSettings::default().set_nodelay(true);
        let invalid = |e: RedisError| Error::config(format!("invalid Redis URL: {e}"));
        match topology {
            Topology::Standalone(url) => {
                let info = url.as_str().into_connection_info().map_err(invalid)?;
                let redis = info
                    .redis_settings()
                    .clone()
                    .set_protocol(redis::ProtocolVersion::RESP3);
                let info = info.set_tcp_settings(tcp).set_redis_settings(redis);
                Ok(Connector::Standalone(
                    redis::Client::open(info).map_err(invalid)?,
                ))
            }
            Topology::Cluster(seeds) => {
                let client =
                    redis::cluster::ClusterClientBuilder::new(seeds.iter().map(String::as_str))
                        // Retries would replay commands whose outcome is unknown; redirections are
                        // followed on the next call, once the slot map is refreshed.
                        .retries(0)
                        .connection_timeout(timeout)
                        .response_timeout(timeout)
                        .tcp_settings(tcp)
                        .build()
                        .map_err(invalid)?;
                Ok(Connector::Cluster(Box::new(client), seeds.clone()))
            }
        }
    }

    /// A dedicated pub/sub connection (for cluster: to the first seed that answers; classic
    /// pub/sub messages reach every node).
    pub(crate) async fn pubsub(&self, timeout: Duration) -> Result<redis::aio::PubSub, Error> {
        let attempt = async {
            match self {
                Connector::Standalone(client) => {
                    client.get_async_pubsub().await.map_err(|e| failure(&e))
                }
                Connector::Cluster(_, seeds) => {
                    let mut last =
                        Error::unavailable(FailureKind::Disconnected, "no seed answered");
                    for seed in seeds {
                        let conn = redis::Client::open(seed.as_str()).map_err(|e| failure(&e))?;
                        match conn.get_async_pubsub().await {
                            Ok(pubsub) => return Ok(pubsub),
                            Err(e) => last = failure(&e),
                        }
                    }
                    Err(last)
                }
            }
        };
        tokio::time::timeout(timeout, attempt)
            .await
            .unwrap_or_else(|_| {
                Err(Error::unavailable(
                    FailureKind::Timeout,
                    "pub/sub connection timed out",
                ))
            })
    }

    async fn connect(
        &self,
        slot: Weak<Slot>,
        generation: u64,
        timeout: Duration,
    ) -> Result<Conn, Error> {
        let attempt = async {
            match self {
                Connector::Standalone(client) => {
                    // The connection reports its own end, so a restarted server is reconnected
                    // before the next command has to fail on the dead socket.
                    let on_push = move |push: redis::PushInfo| {
                        if push.kind == PushKind::Disconnection
                            && let Some(slot) = slot.upgrade()
                        {
                            slot.mark_down(generation, "connection closed");
                        }
                        Ok::<(), std::convert::Infallible>(())
                    };
                    let config = redis::AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(timeout))
                        .set_response_timeout(None)
                        .set_push_sender(on_push);
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                        .map(Conn::Single)
                }
                Connector::Cluster(client, _) => {
                    client.get_async_connection().await.map(Conn::Cluster)
                }
            }
        };
        match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(failure(&e)),
            Err(_) => Err(Error::unavailable(
                FailureKind::Timeout,
                "connecting took longer than the command timeout",
            )),
        }
    }
}

#[derive(Clone)]
enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn send(&mut self, cmd: &Cmd) -> redis::RedisResult<Value> {
        match self {
            Conn::Single(conn) => conn.send_packed_command(cmd).await,
            Conn::Cluster(conn) => conn.req_packed_command(cmd).await,
        }
    }
}

/// One pooled connection and its reconnection state.
pub(crate) struct Slot {
    state: Mutex<SlotState>,
    /// Nudged by calls that found the connection down: the reconnect loop stops backing off.
    demand: tokio::sync::Notify,
    closed: Arc<AtomicBool>,
    connector: Arc<Connector>,
    timeout: Duration,
}

struct SlotState {
    conn: Option<Conn>,
    /// Bumped on every (re)connection, so a late failure report about an old connection
    /// cannot take down its replacement.
    generation: u64,
    /// Consecutive timeouts of the current connection.
    timeouts: u32,
    reconnecting: bool,
}

impl Slot {
    fn up(&self, conn: Conn) {
        let mut state = lock(&self.state);
        state.reconnecting = false;
        // A reconnection that finishes after `close` leaves the slot closed.
        if !self.closed.load(Ordering::Acquire) {
            state.conn = Some(conn);
            state.timeouts = 0;
        }
    }

    /// Counts a timeout of connection `generation`; enough in a row take it down.
    fn timed_out(self: &Arc<Self>, generation: u64) {
        let give_up = {
            let mut state = lock(&self.state);
            if state.generation != generation {
                return;
            }
            state.timeouts += 1;
            state.timeouts >= TIMEOUTS_BEFORE_RECONNECT
        };
        if give_up {
            self.mark_down(generation, "repeated timeouts");
        }
    }

    fn answered(&self, generation: u64) {
        let mut state = lock(&self.state);
        if state.generation == generation {
            state.timeouts = 0;
        }
    }

    /// Drops connection `generation` (if still current) and starts reconnecting.
    fn mark_down(self: &Arc<Self>, generation: u64, reason: &'static str) {
        {
            let mut state = lock(&self.state);
            if state.generation != generation || state.conn.is_none() {
                return;
            }
            state.conn = None;
            state.reconnecting = true;
            state.generation += 1;
        }
        events::connection_lost(reason);
        self.reconnect();
    }

    /// Reconnects in the background until it succeeds or the pool is gone.
    fn reconnect(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            lock(&self.state).reconnecting = false;
            return;
        };
        let weak = Arc::downgrade(self);
        // However the loop ends — reconnected, pool gone, or its runtime shut down — the next
        // call that finds the slot down must be able to start another.
        let done = ReconnectDone(weak.clone());
        runtime.spawn(async move {
            let _done = done;
            let mut failures = 0u32;
            loop {
                let Some(slot) = weak.upgrade() else { return };
                if slot.closed.load(Ordering::Acquire) {
                    return;
                }
                let generation = lock(&slot.state).generation;
                let connector = Arc::clone(&slot.connector);
                let timeout = slot.timeout;
                drop(slot);
                let result = connector.connect(weak.clone(), generation, timeout).await;
                let Some(slot) = weak.upgrade() else { return };
                match result {
                    Ok(conn) => {
                        slot.up(conn);
                        events::connection_restored(failures + 1);
                        return;
                    }
                    Err(_) => failures += 1,
                }
                let attempted = tokio::time::Instant::now();
                let backoff = MAX_RECONNECT_BACKOFF.min(MIN_RECONNECT_INTERVAL * failures);
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = slot.demand.notified() => {
                        tokio::time::sleep_until(attempted + MIN_RECONNECT_INTERVAL).await;
                    }
                }
            }
        });
    }

    fn checkout(self: &Arc<Self>) -> Option<(Conn, u64)> {
        let mut state = lock(&self.state);
        match &state.conn {
            Some(conn) => Some((conn.clone(), state.generation)),
            None => {
                if !state.reconnecting && !self.closed.load(Ordering::Acquire) {
                    state.reconnecting = true;
                    drop(state);
                    self.reconnect();
                } else {
                    self.demand.notify_one();
                }
                None
            }
        }
    }
}

/// Clears a slot's `reconnecting` flag when its reconnect loop ends, for whatever reason.
struct ReconnectDone(Weak<Slot>);

impl Drop for ReconnectDone {
    fn drop(&mut self) {
        if let Some(slot) = self.0.upgrade() {
            lock(&slot.state).reconnecting = false;
        }
    }
}

/// The pool: commands of one task always use the same slot (while it is up), so a task's
/// release can never be overtaken by its own next acquire.
pub(crate) struct Pool {
    slots: Box<[Arc<Slot>]>,
    connector: Arc<Connector>,
    closed: Arc<AtomicBool>,
    timeout: Duration,
}

impl Pool {
    pub(crate) async fn connect(
        topology: &Topology,
        timeout: Duration,
        size: usize,
    ) -> Result<Self, Error> {
        let connector = Arc::new(Connector::new(topology, timeout)?);
        let closed = Arc::new(AtomicBool::new(false));
        let slots: Box<[Arc<Slot>]> = (0..size)
            .map(|_| {
                Arc::new(Slot {
                    state: Mutex::new(SlotState {
                        conn: None,
                        generation: 0,
                        timeouts: 0,
                        reconnecting: false,
                    }),
                    demand: tokio::sync::Notify::new(),
                    closed: Arc::clone(&closed),
                    connector: Arc::clone(&connector),
                    timeout,
                })
            })
            .collect();
        let conns = futures_util::future::join_all(
            slots
                .iter()
                .map(|slot| connector.connect(Arc::downgrade(slot), 0, timeout)),
        )
        .await;
        for (slot, conn) in slots.iter().zip(conns) {
            slot.up(conn?);
        }
        Ok(Pool {
            slots,
            connector,
            closed,
            timeout,
        })
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        for slot in self.slots.iter() {
            lock(&slot.state).conn = None;
        }
    }

    pub(crate) fn connector(&self) -> Arc<Connector> {
        Arc::clone(&self.connector)
    }

    pub(crate) fn closed_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.closed)
    }

    /// A connection for the current task: its own slot if that is up, else any slot that is.
    pub(crate) fn checkout(&self) -> Result<Checkout, Error> {
        let start = match tokio::task::try_id() {
            Some(id) => BuildHasherDefault::<DefaultHasher>::default().hash_one(id) as usize,
            None => 0,
        };
        let n = self.slots.len();
        for offset in 0..n {
            let slot = &self.slots[(start + offset) % n];
            if slot.closed.load(Ordering::Acquire) {
                return Err(Error::unavailable(
                    FailureKind::ShutDown,
                    "coordinator shut down",
                ));
            }
            if let Some((conn, generation)) = slot.checkout() {
                return Ok(Checkout {
                    slot: Arc::clone(slot),
                    conn,
                    generation,
                });
            }
        }
        Err(Error::unavailable(
            FailureKind::Disconnected,
            "no connection to Redis; reconnecting",
        ))
    }
}

/// A connection taken from the pool for one command (or a NOSCRIPT fallback pair).
pub(crate) struct Checkout {
    slot: Arc<Slot>,
    conn: Conn,
    generation: u64,
}

impl Checkout {
    /// Sends `cmd`, giving up at `deadline`. Failures are classified and, when they say the
    /// connection is no good, the slot is replaced.
    pub(crate) async fn send(
        &mut self,
        cmd: &Cmd,
        deadline: Instant,
    ) -> Result<Value, RedisFailure> {
        // The first poll queues the request on the connection and yields; the deadline's timer
        // is armed only at the next poll. So a release sent from a guard dropped outside any
        // runtime is still queued, and needs no timer (which would need a runtime).
        let mut send = pin!(self.conn.send(cmd));
        let mut queued = false;
        let early = std::future::poll_fn(|cx| {
            if queued {
                return Poll::Ready(None);
            }
            match send.as_mut().poll(cx) {
                Poll::Ready(reply) => Poll::Ready(Some(reply)),
                Poll::Pending => {
                    queued = true;
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
            }
        })
        .await;
        let reply = match early {
            Some(reply) => Ok(reply),
            None => tokio::time::timeout_at(deadline, send).await,
        };
        // Server errors can come back as an `Ok` holding an error value; either way they are
        // errors here.
        match reply.map(|reply| reply.and_then(Value::extract_error)) {
            Ok(Ok(value)) => {
                self.slot.answered(self.generation);
                Ok(value)
            }
            Ok(Err(error)) => {
                if error.is_unrecoverable_error() || error.is_connection_dropped() {
                    self.slot.mark_down(self.generation, "connection broken");
                } else if error.kind() == redis::ErrorKind::Server(ServerErrorKind::ReadOnly) {
                    self.slot
                        .mark_down(self.generation, "server is a read-only replica");
                }
                Err(RedisFailure::Redis(error))
            }
            Err(_) => {
                self.slot.timed_out(self.generation);
                Err(RedisFailure::Timeout)
            }
        }
    }
}

/// How one command failed.
#[derive(Debug)]
pub(crate) enum RedisFailure {
    Timeout,
    Redis(RedisError),
}

impl RedisFailure {
    pub(crate) fn is_noscript(&self) -> bool {
        matches!(self, RedisFailure::Redis(e) if e.code() == Some("NOSCRIPT"))
    }

    pub(crate) fn into_error(self) -> Error {
        match self {
            RedisFailure::Timeout => Error::unavailable(
                FailureKind::Timeout,
                "no reply within the command timeout; the outcome is unknown",
            ),
            RedisFailure::Redis(e) => failure(&e),
        }
    }
}

fn failure(error: &RedisError) -> Error {
    let kind = if error.is_timeout() {
        FailureKind::Timeout
    } else if matches!(error.kind(), redis::ErrorKind::Server(_)) {
        FailureKind::Server
    } else {
        FailureKind::Disconnected
    };
    Error::unavailable(kind, error.to_string())
}
