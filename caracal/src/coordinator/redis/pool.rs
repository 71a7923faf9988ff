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
//!   again (see [`cluster_check`](super::cluster_check)). A cluster connection is replaced when
//!   no node at all answers through it, or when it is older than a slot map naming a primary it
//!   sends nothing to (its replacement is made before it is dropped).

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use redis::{Cmd, ServerErrorKind, Value};
use tokio::time::Instant;

use super::cluster_check::ClusterCheck;
use super::connector::{Conn, Connected, Connector, Topology};
use super::failure::{RedisFailure, node_in_doubt};
use super::node::Trust;
use super::primary::PrimaryCheck;
use super::slot::{PrimariesCheck, Slot};
use crate::coordinator::background;
use crate::coordinator::incarnation::Incarnation;
use crate::coordinator::timer;
use crate::error::Error;
use crate::error::FailureKind;
use crate::identity::KeyBase;

/// Here, not in `slot`, as a [`Checkout`]'s fields are the pool's.
impl Slot {
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
    cluster_check: Option<Arc<ClusterCheck>>,
    /// Otherwise: what checks the primary every period.
    primary: Option<Arc<PrimaryCheck>>,
    closed: Arc<AtomicBool>,
    timeout: Duration,
}

impl Pool {
    /// Connects `size` connections to `topology` (trusting `trust`'s certificates), each
    /// command within `timeout`, and checks the server (or, on a cluster, each primary) before
    /// anything is served: a replica, or a cluster where no primary answers, fails it.
    /// `incarnation` hears every `run_id` read, then and later.
    pub(crate) async fn connect(
        topology: &Topology,
        trust: &Trust,
        timeout: Duration,
        size: usize,
        incarnation: Arc<Incarnation>,
    ) -> Result<Self, Error> {
        static POOLS: AtomicU64 = AtomicU64::new(0);
        let pool = POOLS.fetch_add(1, Ordering::Relaxed);
        let connector = Arc::new(Connector::new(topology, trust, timeout)?);
        let closed = Arc::new(AtomicBool::new(false));
        let cluster_check = matches!(topology, Topology::Cluster(_)).then(|| {
            Arc::new(ClusterCheck::new(
                Arc::clone(&incarnation),
                timeout,
                Arc::clone(&closed),
            ))
        });
        let slots: Arc<[Arc<Slot>]> = (0..size)
            .map(|index| {
                Arc::new(Slot::new(
                    (pool, index),
                    Arc::clone(&closed),
                    Arc::clone(&connector),
                    Arc::clone(&incarnation),
                    cluster_check
                        .clone()
                        .map(|check| Box::new(check) as Box<dyn PrimariesCheck>),
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
        if let Some(check) = &cluster_check {
            let _ = check.slots.set(Arc::downgrade(&slots));
            check.first_check().await?;
            check.nudge();
        }
        let primary = cluster_check.is_none().then(|| {
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
            cluster_check,
            primary,
            closed,
            timeout,
        })
    }

    /// How long one command may take.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Drops every connection for good: checkouts fail from now on, as shut down.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        for slot in self.slots.iter() {
            slot.close();
        }
    }

    /// How the pool connects: for the connections made beside it (pub/sub).
    pub(crate) fn connector(&self) -> Arc<Connector> {
        Arc::clone(&self.connector)
    }

    /// Set once the pool is closed: what runs beside it stops with it.
    pub(crate) fn closed_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.closed)
    }

    /// The connection of `key`'s identity: every command about one identity takes the same
    /// slot while it is up (else the next one that is), so the connection keeps them in order.
    pub(crate) fn checkout(&self, key: &KeyBase) -> Result<Checkout, Error> {
        self.checkout_from(start(key), key)
    }

    /// [`checkout`](Self::checkout), but a connection that went down with the runtime its
    /// tasks ran on (the caller's runtime outlived the one that connected) is waited for,
    /// until `deadline`, while it is made again on the caller's runtime: the server is not
    /// known to be down, and failing at once would fail every call made meanwhile. Any other
    /// connection that is down fails the call at once, as ever.
    pub(crate) async fn ready(&self, key: &KeyBase, deadline: Instant) -> Result<Checkout, Error> {
        let start = start(key);
        let own = &self.slots[start % self.slots.len()];
        loop {
            let ends = own.reconnection_ends();
            match self.checkout_from(start, key) {
                Err(error) if own.being_replaced() && background::on_own_runtime() => {
                    if timer::timeout_at(deadline, ends).await.is_none() {
                        return Err(error);
                    }
                }
                result => return result,
            }
        }
    }

    fn checkout_from(&self, start: usize, key: &KeyBase) -> Result<Checkout, Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::unavailable(
                FailureKind::ShutDown,
                "coordinator shut down",
            ));
        }
        let shard = match &self.cluster_check {
            Some(check) => Some(check.admit(key)?),
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

/// Where `key`'s identity starts looking for a slot: its own, while up.
fn start(key: &KeyBase) -> usize {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(key) as usize
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
        let mut send = pin!(self.conn.send(cmd));
        let reply = if background::on_own_runtime() {
            timer::timeout_at(deadline, send).await
        } else {
            // A first poll on a borrowed runtime (a release from a guard dropped outside any
            // runtime) or none only queues the request: the deadline's timer is armed at the
            // next poll, on the runtime the work then runs on. (It yields for that, and a task
            // that yields wakes a second worker: on a runtime of its own it arms the timer at
            // once.)
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
            match early {
                Some(reply) => Some(reply),
                None => timer::timeout_at(deadline, send).await,
            }
        };
        // Server errors can come back as an `Ok` holding an error value; either way they are
        // errors here.
        match reply.map(|reply| reply.and_then(Value::extract_error)) {
            Some(Ok(value)) => {
                self.slot.answered(self.generation);
                Ok(value)
            }
            Some(Err(error)) => {
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
            None => {
                match self.shard {
                    Some(shard) => self.slot.suspect(shard),
                    None => self.slot.timed_out(self.generation),
                }
                Err(RedisFailure::Timeout)
            }
        }
    }
}
