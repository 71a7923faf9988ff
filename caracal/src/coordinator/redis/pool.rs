//! The connection pool: a few multiplexed connections, each reconnecting on its own.
//!
//! Rules every command follows here:
//! - a deadline bounds it (the command timeout); nothing waits longer;
//! - nothing is queued while a connection is down: the command fails at once and the slot
//!   reconnects in the background with bounded backoff;
//! - nothing is replayed: a command whose outcome is unknown (timeout, broken connection) is
//!   reported as such, never sent again;
//! - a connection that keeps timing out, reports its disconnection, or answers READONLY (it now
//!   talks to a replica) is dropped and replaced;
//! - on a cluster, one node's failure is that node's: the cluster connection repairs its link to
//!   it, and only the identities that node serves wait, until its `run_id` has been checked
//!   again (see [`shards`](super::shards)). A cluster connection is replaced when no node at
//!   all answers through it, or when it is older than a slot map naming a primary it sends
//!   nothing to (its replacement is made before it is dropped).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::Poll;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, IntoConnectionInfo, PushKind, RedisError, ServerErrorKind, Value};
use tokio::time::Instant;

use super::server::{self, ServerInfo};
use super::shards::{self, Answer, CHECK_PERIOD, Shards};
use crate::Error;
use crate::coordinator::incarnation::Incarnation;
use crate::error::FailureKind;
use crate::events;
use crate::identity::KeyBase;
use crate::sync::lock;

/// Where the coordinator's state lives.
#[derive(Debug, Clone)]
pub(crate) enum Topology {
    Standalone(String),
    Cluster(Vec<String>),
}

/// The certificates (PEM) a `rediss://` connection trusts instead of the system's; `None`: the
/// system's. Only with the `tls` feature; without it, a `rediss://` URL is refused.
#[derive(Debug, Clone, Default)]
pub(crate) struct Trust {
    #[cfg(feature = "tls")]
    pub(crate) roots: Option<Vec<u8>>,
}

impl Trust {
    /// A client for `info` that trusts these certificates.
    fn client(&self, info: redis::ConnectionInfo) -> redis::RedisResult<redis::Client> {
        #[cfg(feature = "tls")]
        if let Some(roots) = &self.roots {
            return redis::Client::build_with_tls(info, self.certificates(roots));
        }
        redis::Client::open(info)
    }

    #[cfg(feature = "tls")]
    fn certificates(&self, roots: &[u8]) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(roots.to_vec()),
        }
    }
}

/// Consecutive timeouts after which a connection is presumed dead and replaced.
const TIMEOUTS_BEFORE_RECONNECT: u32 = 2;
/// The longest pause between two reconnection attempts.
const MAX_RECONNECT_BACKOFF: Duration = Duration::from_millis(500);
/// The shortest: while calls are waiting on a down connection, the backoff shrinks to this,
/// so service resumes within this long of the server's return without a connect storm.
pub(crate) const MIN_RECONNECT_INTERVAL: Duration = Duration::from_millis(50);

pub(crate) enum Connector {
    Standalone(redis::Client),
    Cluster(Box<redis::cluster::ClusterClient>, Vec<String>, Trust),
}

impl Connector {
    fn new(topology: &Topology, trust: &Trust, timeout: Duration) -> Result<Self, Error> {
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
                Ok(Connector::Standalone(trust.client(info).map_err(invalid)?))
            }
            Topology::Cluster(seeds) => {
                let builder =
                    redis::cluster::ClusterClientBuilder::new(seeds.iter().map(String::as_str))
                        // Retries would replay commands whose outcome is unknown; redirections are
                        // followed on the next call, once the slot map is refreshed.
                        .retries(0)
                        .connection_timeout(timeout)
                        .response_timeout(timeout)
                        .tcp_settings(tcp);
                #[cfg(feature = "tls")]
                let builder = match &trust.roots {
                    Some(roots) => builder.certs(trust.certificates(roots)),
                    None => builder,
                };
                let client = builder.build().map_err(invalid)?;
                Ok(Connector::Cluster(
                    Box::new(client),
                    seeds.clone(),
                    trust.clone(),
                ))
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
                Connector::Cluster(_, seeds, trust) => {
                    let mut last =
                        Error::unavailable(FailureKind::Disconnected, "no seed answered");
                    for seed in seeds {
                        let conn = seed
                            .as_str()
                            .into_connection_info()
                            .and_then(|info| trust.client(info))
                            .map_err(|e| failure(&e))?;
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

    /// A new connection, and what a standalone server told about itself on it (asked before
    /// the connection serves anything, all within `timeout`). A cluster's primaries are
    /// checked one by one instead, by its [`Checker`].
    async fn connect(
        &self,
        slot: Weak<Slot>,
        generation: u64,
        timeout: Duration,
    ) -> Result<(Conn, Option<ServerInfo>), Error> {
        let attempt = async {
            let mut conn = match self {
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
                        .map(Conn::Single)?
                }
                Connector::Cluster(client, ..) => {
                    let conn = client.get_async_connection().await.map(Conn::Cluster)?;
                    return Ok((conn, None));
                }
            };
            let info = conn.send(&server::info_command()).await?;
            Ok::<_, RedisError>((conn, Some(info)))
        };
        // A cluster node that takes connections but never answers costs the client one
        // connection timeout when it links to the seeds, and another when it links to the
        // primaries of the slot map; it must not keep the others from being reached.
        let budget = match self {
            Connector::Standalone(_) => timeout,
            Connector::Cluster(..) => timeout * 3,
        };
        match tokio::time::timeout(budget, attempt).await {
            Ok(Ok((conn, None))) => Ok((conn, None)),
            Ok(Ok((conn, Some(info)))) => Ok((conn, Some(ServerInfo::parse("", &info)?))),
            Ok(Err(e)) => Err(failure(&e)),
            Err(_) => Err(Error::unavailable(
                FailureKind::Timeout,
                "connecting took too long",
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
    /// Its place in the pool.
    index: usize,
    state: Mutex<SlotState>,
    /// Nudged by calls that found the connection down: the reconnect loop stops backing off.
    demand: tokio::sync::Notify,
    closed: Arc<AtomicBool>,
    connector: Arc<Connector>,
    incarnation: Arc<Incarnation>,
    /// A cluster's: what checks its primaries.
    checker: Option<Arc<Checker>>,
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

    /// A cluster command for `key_slot` failed in a way that may mean its primary restarted or
    /// was replaced: that primary serves nothing until checked again.
    fn suspect(&self, key_slot: u16) {
        if let Some(checker) = &self.checker {
            checker.shards.suspect(key_slot, self.index);
            checker.nudge();
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
                    Ok((conn, info)) => {
                        // Before the connection serves a call: a server that lost its data
                        // must end every lease held there first.
                        if let Some(info) = info {
                            slot.incarnation.observe(&info.primaries(), &info.run_ids);
                        }
                        slot.up(conn);
                        match &slot.checker {
                            // Its primaries were suspected when it went down: each serves once
                            // checked, and the check wakes the holders.
                            Some(checker) => checker.nudge(),
                            None => slot.incarnation.reconnected(),
                        }
                        events::connection_restored(failures + 1);
                        return;
                    }
                    Err(_) => failures += 1,
                }
                let attempted = tokio::time::Instant::now();
                let backoff = reconnect_backoff(failures);
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = slot.demand.notified() => {
                        tokio::time::sleep_until(attempted + MIN_RECONNECT_INTERVAL).await;
                    }
                }
            }
        });
    }

    /// Puts `conn` in the place of connection `generation`, if that is still the one in use:
    /// the old one finishes what was sent through it, and takes nothing more. The new
    /// connection's generation, if it took the place.
    fn replace(&self, generation: u64, conn: Conn) -> Option<u64> {
        let mut state = lock(&self.state);
        if state.generation != generation
            || state.conn.is_none()
            || self.closed.load(Ordering::Acquire)
        {
            return None;
        }
        state.generation += 1;
        state.conn = Some(conn);
        state.timeouts = 0;
        Some(state.generation)
    }

    /// The connection, if up, without starting a reconnection.
    fn current(&self) -> Option<(Conn, u64)> {
        let state = lock(&self.state);
        state.conn.clone().map(|conn| (conn, state.generation))
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

/// The pause after `failures` failed reconnection attempts in a row when no call is waiting:
/// growing by [`MIN_RECONNECT_INTERVAL`] per failure up to [`MAX_RECONNECT_BACKOFF`]. (A call
/// finding the connection down cuts it short, to `MIN_RECONNECT_INTERVAL` after the attempt.)
fn reconnect_backoff(failures: u32) -> Duration {
    MAX_RECONNECT_BACKOFF.min(MIN_RECONNECT_INTERVAL.saturating_mul(failures))
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

/// The pool: commands of one identity always use the same slot (while it is up), so a release
/// can never be overtaken by a later acquire of the same identity.
pub(crate) struct Pool {
    slots: Arc<[Arc<Slot>]>,
    connector: Arc<Connector>,
    /// A cluster's: what checks its primaries, and keeps identities off those in doubt.
    checker: Option<Arc<Checker>>,
    closed: Arc<AtomicBool>,
    timeout: Duration,
}

impl Pool {
    pub(crate) async fn connect(
        (topology, trust): (&Topology, &Trust),
        timeout: Duration,
        size: usize,
        incarnation: Arc<Incarnation>,
    ) -> Result<Self, Error> {
        let connector = Arc::new(Connector::new(topology, trust, timeout)?);
        let closed = Arc::new(AtomicBool::new(false));
        let checker = matches!(topology, Topology::Cluster(_)).then(|| {
            Arc::new(Checker {
                shards: Shards::default(),
                wake: tokio::sync::Notify::new(),
                running: AtomicBool::new(false),
                slots: OnceLock::new(),
                made: Mutex::new(HashMap::new()),
                incarnation: Arc::clone(&incarnation),
                timeout,
                closed: Arc::clone(&closed),
            })
        });
        let slots: Arc<[Arc<Slot>]> = (0..size)
            .map(|index| {
                Arc::new(Slot {
                    index,
                    state: Mutex::new(SlotState {
                        conn: None,
                        generation: 0,
                        timeouts: 0,
                        reconnecting: false,
                    }),
                    demand: tokio::sync::Notify::new(),
                    closed: Arc::clone(&closed),
                    connector: Arc::clone(&connector),
                    incarnation: Arc::clone(&incarnation),
                    checker: checker.clone(),
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
        let mut infos = Vec::with_capacity(conns.len());
        for (slot, conn) in slots.iter().zip(conns) {
            let (conn, info) = conn?;
            slot.up(conn);
            infos.extend(info);
        }
        for info in infos {
            info.check()?;
            incarnation.observe(&info.primaries(), &info.run_ids);
        }
        if let Some(checker) = &checker {
            let _ = checker.slots.set(Arc::downgrade(&slots));
            checker.first_check().await?;
            checker.nudge();
        }
        Ok(Pool {
            slots,
            connector,
            checker,
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

    /// The connection of `key`'s identity: every command about one identity takes the same
    /// slot while it is up (else the next one that is), so the connection keeps them in order.
    pub(crate) fn checkout(&self, key: &KeyBase) -> Result<Checkout, Error> {
        let start = BuildHasherDefault::<DefaultHasher>::default().hash_one(key) as usize;
        self.checkout_from(start, key)
    }

    fn checkout_from(&self, start: usize, key: &KeyBase) -> Result<Checkout, Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::unavailable(
                FailureKind::ShutDown,
                "coordinator shut down",
            ));
        }
        let shard = match &self.checker {
            Some(checker) => Some(checker.admit(key)?),
            None => None,
        };
        let n = self.slots.len();
        for offset in 0..n {
            let slot = &self.slots[(start + offset) % n];
            if let Some((conn, generation)) = slot.checkout() {
                return Ok(Checkout {
                    slot: Arc::clone(slot),
                    conn,
                    generation,
                    shard,
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
    /// On a cluster: the slot of the command's key.
    shard: Option<u16>,
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
                match self.shard {
                    Some(shard) if node_in_doubt(&error) => self.slot.suspect(shard),
                    Some(_) => {}
                    None if error.is_unrecoverable_error() || error.is_connection_dropped() => {
                        self.slot.mark_down(self.generation, "connection broken");
                    }
                    None if error.kind() == redis::ErrorKind::Server(ServerErrorKind::ReadOnly) => {
                        self.slot
                            .mark_down(self.generation, "server is a read-only replica");
                    }
                    None => {}
                }
                Err(RedisFailure::Redis(error))
            }
            Err(_) => {
                match self.shard {
                    Some(shard) => self.slot.suspect(shard),
                    None => self.slot.timed_out(self.generation),
                }
                Err(RedisFailure::Timeout)
            }
        }
    }
}

/// Whether a cluster command's failure may mean that the primary serving its slot restarted
/// or was replaced: it timed out, its link broke, the primary is loading its data, or the
/// slot is served elsewhere now (a failover, a replica answering).
fn node_in_doubt(error: &RedisError) -> bool {
    error.is_timeout()
        || error.is_connection_dropped()
        || error.is_unrecoverable_error()
        || matches!(
            error.kind(),
            redis::ErrorKind::Server(
                ServerErrorKind::Moved
                    | ServerErrorKind::Ask
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::BusyLoading
            )
        )
}

/// Checks a cluster's primaries in the background (see [`shards`](super::shards)): one check
/// at a time, at once when nudged, again and again while a primary is in doubt, and every
/// [`CHECK_PERIOD`] anyway.
pub(crate) struct Checker {
    shards: Shards,
    /// Nudged by a suspicion, a call turned away, a reconnection: check now.
    wake: tokio::sync::Notify,
    /// Whether a check loop runs: it dies with its runtime, and the next nudge starts another.
    running: AtomicBool,
    slots: OnceLock<Weak<[Arc<Slot>]>>,
    /// For each pool slot whose connection this checker made: its generation, and the
    /// [version](Shards::version) of the slot map when it was made.
    made: Mutex<HashMap<usize, (u64, u64)>>,
    incarnation: Arc<Incarnation>,
    timeout: Duration,
    closed: Arc<AtomicBool>,
}

impl Checker {
    /// The slot of `key`, if the primary serving it may serve now; else nudges a check.
    fn admit(self: &Arc<Self>, key: &KeyBase) -> Result<u16, Error> {
        let shard = shards::key_slot(&key.key(""));
        if self.shards.serves(shard) {
            return Ok(shard);
        }
        self.nudge();
        Err(Error::unavailable(
            FailureKind::Disconnected,
            "the cluster node serving this identity is being checked after a failure",
        ))
    }

    fn nudge(self: &Arc<Self>) {
        self.wake.notify_one();
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(check_loop(Arc::downgrade(self)));
            }
            Err(_) => self.running.store(false, Ordering::Release),
        }
    }

    /// The first check, at `connect`: a primary answering with an error fails it, and so does
    /// a cluster where none answers; one that does not answer in time is checked later.
    async fn first_check(&self) -> Result<(), Error> {
        let checked = self.check().await;
        if let Some(refused) = checked.refused {
            return Err(refused);
        }
        if checked.info.run_ids.is_empty() {
            return Err(Error::unavailable(
                FailureKind::Timeout,
                "no primary of the cluster answered `INFO` within the command timeout",
            ));
        }
        checked.info.check()
    }

    /// Checks the primaries once, through the connection that saw the last suspicion if it is
    /// up (else any that is).
    async fn check(&self) -> Checked {
        let begun = self.shards.begin();
        let mut checked = Checked::default();
        let Some((slot, conn, generation)) = self.connection(begun.probe) else {
            return checked;
        };
        let ranges = shards::read_map(&conn, &begun.known, self.timeout).await;
        checked.reached = ranges.is_some();
        let routes = shards::primaries(ranges.as_deref().unwrap_or(&begun.known));
        let primaries: BTreeSet<String> = routes.keys().cloned().collect();
        if ranges.is_some() {
            // A primary gone from the map (failed over) is lost, whatever the others answer.
            self.incarnation.observe(&primaries, &BTreeMap::new());
            self.shards.record(begun.start, ranges, []);
        }
        // Each primary serves again as soon as it has answered: one that does not answer
        // holds up no other.
        let mut elsewhere = false;
        let mut answers = std::pin::pin!(shards::ask_info(&conn, &routes, self.timeout));
        while let Some((primary, answer)) = answers.next().await {
            match answer {
                Answer::Info(info) => {
                    checked.reached = true;
                    self.incarnation.observe(&primaries, &info.run_ids);
                    if self.shards.record(begun.start, None, [&primary]) {
                        self.incarnation.reconnected();
                    }
                    checked.info.merge(info);
                }
                Answer::Refused(error) => {
                    checked.reached = true;
                    checked.refused.get_or_insert(error);
                }
                Answer::Elsewhere => {
                    checked.reached = true;
                    elsewhere = true;
                }
                Answer::Silent => {}
            }
        }
        if elsewhere && self.made_at(&slot, generation) < self.shards.version() {
            // This connection may not know the primary that the map names (a replica promoted
            // in the place of a dead one): no command of its would ever reach it.
            checked.renewed = self.renew().await;
        }
        if !checked.reached {
            // Nothing answers through this connection: it may be dead (its runtime gone), or
            // every node may be. A new one is the cure either way, and whatever it reaches is
            // checked before it serves.
            self.shards.suspect_all();
            slot.mark_down(generation, "no node of the cluster answered");
        }
        checked
    }

    /// The [version](Shards::version) of the slot map when connection `generation` of `slot`
    /// was made: the pool's first connections are as new as the first map (read right after
    /// them); one this checker did not make counts as older than any.
    fn made_at(&self, slot: &Slot, generation: u64) -> u64 {
        match lock(&self.made).get(&slot.index) {
            Some(&(made, version)) if made == generation => version,
            _ if generation == 0 => 1,
            _ => 0,
        }
    }

    /// Replaces every connection of the pool older than the slot map with a new one, which
    /// links to the nodes of the map as it is now; each old one serves until its replacement
    /// is up. Whether any was replaced.
    async fn renew(&self) -> bool {
        let version = self.shards.version();
        let Some(slots) = self.slots.get().and_then(Weak::upgrade) else {
            return false;
        };
        let old: Vec<(&Arc<Slot>, u64)> = slots
            .iter()
            .filter_map(|slot| {
                let (_, generation) = slot.current()?;
                (self.made_at(slot, generation) < version).then_some((slot, generation))
            })
            .collect();
        let made = futures_util::future::join_all(old.iter().map(|&(slot, generation)| {
            slot.connector
                .connect(Arc::downgrade(slot), generation, self.timeout)
        }))
        .await;
        let mut renewed = false;
        for ((slot, generation), made) in old.into_iter().zip(made) {
            if let Ok((conn, _)) = made
                && let Some(generation) = slot.replace(generation, conn)
            {
                lock(&self.made).insert(slot.index, (generation, version));
                renewed = true;
            }
        }
        renewed
    }

    /// A cluster connection that is up: pool slot `probe`'s if it is, else the first.
    fn connection(&self, probe: Option<usize>) -> Option<(Arc<Slot>, ClusterConnection, u64)> {
        let slots = self.slots.get()?.upgrade()?;
        probe
            .into_iter()
            .chain(0..slots.len())
            .filter_map(|index| slots.get(index))
            .find_map(|slot| match slot.current()? {
                (Conn::Cluster(conn), generation) => Some((Arc::clone(slot), conn, generation)),
                (Conn::Single(_), _) => None,
            })
    }
}

/// What one check found.
#[derive(Default)]
struct Checked {
    /// Whether any node answered anything.
    reached: bool,
    /// Whether it replaced connections of the pool older than the slot map: the next check
    /// goes through a new one at once.
    renewed: bool,
    /// The first error a primary answered to `INFO`.
    refused: Option<Error>,
    /// What the primaries that answered told.
    info: ServerInfo,
}

/// Checks until the pool is gone: again soon while a primary is in doubt (sooner when calls
/// are turned away), every [`CHECK_PERIOD`] otherwise.
async fn check_loop(checker: Weak<Checker>) {
    let _running = CheckDone(checker.clone());
    let mut failures = 0u32;
    loop {
        let Some(this) = checker.upgrade() else {
            return;
        };
        let pool_gone = this
            .slots
            .get()
            .is_none_or(|slots| slots.strong_count() == 0);
        if pool_gone || this.closed.load(Ordering::Acquire) {
            return;
        }
        let mut nudged = std::pin::pin!(this.wake.notified());
        nudged.as_mut().enable();
        let attempted = tokio::time::Instant::now();
        if this.check().await.renewed {
            continue;
        }
        let pause = if this.shards.settled() {
            failures = 0;
            CHECK_PERIOD
        } else {
            failures += 1;
            reconnect_backoff(failures)
        };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = nudged => {
                tokio::time::sleep_until(attempted + MIN_RECONNECT_INTERVAL).await;
            }
        }
    }
}

/// Clears a checker's `running` flag when its loop ends, for whatever reason.
struct CheckDone(Weak<Checker>);

impl Drop for CheckDone {
    fn drop(&mut self) {
        if let Some(checker) = self.0.upgrade() {
            checker.running.store(false, Ordering::Release);
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
    use redis::ErrorKind;
    let (kind, detail) = if error.is_timeout() {
        (FailureKind::Timeout, "the Redis client timed out")
    } else if error.code().is_some()
        || matches!(
            error.kind(),
            ErrorKind::Server(_) | ErrorKind::Extension | ErrorKind::AuthenticationFailed
        )
    {
        // Every error the server itself answered — WRONGTYPE, OOM, NOPERM, NOAUTH, WRONGPASS
        // included — not only those the client has a name for.
        (FailureKind::Server, "Redis answered with an error")
    } else if matches!(
        error.kind(),
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType
    ) {
        (
            FailureKind::MalformedReply,
            "Redis replied something unreadable",
        )
    } else {
        (FailureKind::Disconnected, "the connection to Redis failed")
    };
    Error::unavailable_because(kind, detail, error.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_the_server_answers_is_a_server_error() {
        for reply in [
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "NOAUTH Authentication required.",
            "WRONGPASS invalid username-password pair or user is disabled.",
            "NOPERM this user has no permissions to run the 'zrem' command",
            "ERR unknown command",
        ] {
            let parsed = redis::parse_redis_value(format!("-{reply}\r\n").as_bytes())
                .and_then(|value| value.extract_error());
            let error = parsed.expect_err("an error reply");
            assert_eq!(
                failure(&error).failure_kind(),
                Some(FailureKind::Server),
                "{reply}"
            );
        }
        let dropped = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(
            failure(&dropped).failure_kind(),
            Some(FailureKind::Disconnected)
        );
    }

    /// Service resumes within a second of the server's return: no pause between attempts is
    /// ever longer than half of that, however long the outage.
    #[test]
    fn reconnect_backoff_grows_to_a_bound() {
        assert_eq!(reconnect_backoff(1), MIN_RECONNECT_INTERVAL);
        assert!(reconnect_backoff(2) > reconnect_backoff(1));
        for failures in [10, 1_000, u32::MAX] {
            assert_eq!(reconnect_backoff(failures), MAX_RECONNECT_BACKOFF);
        }
        assert!(MAX_RECONNECT_BACKOFF <= Duration::from_millis(500));
    }
}
