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
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ServerErrorKind, Value};
use tokio::time::Instant;

use super::connector::{Conn, Connected, Connector, Topology, Trust};
use super::failure::{RedisFailure, node_in_doubt};
use super::primary::PrimaryCheck;
use super::server::ServerInfo;
use super::shards::{self, Answer, CHECK_PERIOD, Shards};
use super::slot::{MIN_RECONNECT_INTERVAL, Slot, reconnect_backoff};
use crate::Error;
use crate::coordinator::incarnation::Incarnation;
use crate::error::FailureKind;
use crate::identity::KeyBase;
use crate::sync::lock;

/// What of a slot is about the pool's checks and checkouts.
impl Slot {
    /// A cluster command for `key_slot` failed in a way that may mean its primary restarted or
    /// was replaced: that primary serves nothing until checked again.
    fn suspect(&self, key_slot: u16) {
        if let Some(checker) = &self.checker {
            checker.shards.suspect(key_slot, self.index);
            checker.nudge();
        }
    }

    /// Reconnected: a cluster's primaries were suspected when it went down, and each serves
    /// once checked (the check wakes the holders); otherwise the holders are woken now.
    pub(super) fn restored(&self) {
        match &self.checker {
            Some(checker) => checker.nudge(),
            None => self.incarnation.reconnected(),
        }
    }

    /// The connection for a check of the server, if up (without starting a reconnection).
    pub(super) fn checkout_up(self: &Arc<Self>) -> Option<Checkout> {
        let (conn, generation) = self.current()?;
        Some(Checkout {
            slot: Arc::clone(self),
            conn,
            generation,
            shard: None,
        })
    }
}

/// The pool: commands of one identity always use the same slot (while it is up), so a release
/// can never be overtaken by a later acquire of the same identity.
pub(crate) struct Pool {
    slots: Arc<[Arc<Slot>]>,
    connector: Arc<Connector>,
    /// A cluster's: what checks its primaries, and keeps identities off those in doubt.
    checker: Option<Arc<Checker>>,
    /// Otherwise: what checks the primary every period.
    primary: Option<Arc<PrimaryCheck>>,
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
                Arc::new(Slot::new(
                    index,
                    Arc::clone(&closed),
                    Arc::clone(&connector),
                    Arc::clone(&incarnation),
                    checker.clone(),
                    timeout,
                ))
            })
            .collect();
        let conns = futures_util::future::join_all(slots.iter().map(|slot| {
            connector.connect(Slot::on_closed(Arc::downgrade(slot), 0), timeout, true)
        }))
        .await;
        let mut infos = Vec::with_capacity(conns.len());
        for (slot, conn) in slots.iter().zip(conns) {
            let Connected { conn, info, master } = conn?;
            slot.up(conn, master);
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
        let primary = checker.is_none().then(|| {
            let primary = Arc::new(PrimaryCheck::new(
                Arc::clone(&connector),
                incarnation,
                timeout,
                Arc::clone(&closed),
            ));
            let _ = primary.slots.set(Arc::downgrade(&slots));
            primary.ensure_running();
            primary
        });
        Ok(Pool {
            slots,
            connector,
            checker,
            primary,
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
            slot.close();
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
        if let Some(primary) = &self.primary {
            primary.ensure_running();
        }
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
        let own = &self.slots[start % n];
        Err(own.refusal().unwrap_or_else(|| {
            Error::unavailable(
                FailureKind::Disconnected,
                "no connection to Redis; reconnecting",
            )
        }))
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
    /// The server is a replica now (of `primary`, when known): the connection is replaced
    /// (through the sentinels, where there are), and calls are told why meanwhile.
    pub(super) fn demoted(&self, primary: Option<&str>) {
        self.slot.demoted(self.generation, primary);
    }

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
                        self.slot.demoted(self.generation, None);
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
            slot.connect_replacement(generation, self.timeout)
        }))
        .await;
        let mut renewed = false;
        for ((slot, generation), made) in old.into_iter().zip(made) {
            if let Ok(Connected { conn, .. }) = made
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
