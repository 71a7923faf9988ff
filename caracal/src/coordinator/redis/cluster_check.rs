//! The background check of a cluster's primaries (see [`shards`](super::shards) for what it
//! keeps and why): one check at a time, at once when nudged, again and again while a primary
//! is in doubt, and every [`CHECK_PERIOD`] anyway. A standalone primary has its own, simpler
//! check ([`PrimaryCheck`](super::primary::PrimaryCheck)).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::cluster_async::ClusterConnection;

use super::connector::{Conn, Connected};
use super::server::ServerInfo;
use super::shards::{self, Answer, CHECK_PERIOD, Shards};
use super::slot::{MIN_RECONNECT_INTERVAL, PrimariesCheck, Slot, reconnect_backoff};
use crate::coordinator::incarnation::Incarnation;
use crate::error::Error;
use crate::error::FailureKind;
use crate::identity::KeyBase;
use crate::sync::lock;

/// Checks a cluster's primaries in the background, and keeps calls off those in doubt.
pub(crate) struct ClusterCheck {
    shards: Shards,
    /// Nudged by a suspicion, a call turned away, a reconnection: check now.
    wake: tokio::sync::Notify,
    /// Whether a check loop runs: it dies with its runtime, and the next nudge starts another.
    running: AtomicBool,
    /// The pool's connections, set once the pool exists.
    pub(super) slots: OnceLock<Weak<[Arc<Slot>]>>,
    /// For each pool slot whose connection this check made: its generation, and the
    /// [version](Shards::version) of the slot map when it was made.
    made: Mutex<HashMap<usize, (u64, u64)>>,
    incarnation: Arc<Incarnation>,
    timeout: Duration,
    closed: Arc<AtomicBool>,
}

impl ClusterCheck {
    /// The check of a pool not connected yet: no primary serves before it has been checked.
    pub(super) fn new(
        incarnation: Arc<Incarnation>,
        timeout: Duration,
        closed: Arc<AtomicBool>,
    ) -> Self {
        ClusterCheck {
            shards: Shards::default(),
            wake: tokio::sync::Notify::new(),
            running: AtomicBool::new(false),
            slots: OnceLock::new(),
            made: Mutex::new(HashMap::new()),
            incarnation,
            timeout,
            closed,
        }
    }

    /// The slot of `key`, if the primary serving it may serve now; else nudges a check.
    pub(super) fn admit(self: &Arc<Self>, key: &KeyBase) -> Result<u16, Error> {
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

    /// A command for `key_slot`, sent through pool slot `probe`, failed in a way that may mean
    /// its primary restarted or was replaced: that primary serves nothing until checked again.
    pub(super) fn suspect(self: &Arc<Self>, key_slot: u16, probe: usize) {
        self.shards.suspect(key_slot, probe);
        self.nudge();
    }

    /// Checks now, starting the check loop if none runs (outside a runtime, the next nudge
    /// inside one does).
    pub(super) fn nudge(self: &Arc<Self>) {
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
    pub(super) async fn first_check(&self) -> Result<(), Error> {
        let outcome = self.check().await;
        if let Some(refused) = outcome.refused {
            return Err(refused);
        }
        if outcome.info.run_ids.is_empty() {
            return Err(Error::unavailable(
                FailureKind::Timeout,
                "no primary of the cluster answered `INFO` within the command timeout",
            ));
        }
        outcome.info.check()
    }

    /// Checks the primaries once, through the connection that saw the last suspicion if it is
    /// up (else any that is).
    async fn check(&self) -> CheckOutcome {
        let begun = self.shards.begin();
        let mut outcome = CheckOutcome::default();
        let Some((slot, conn, generation)) = self.connection(begun.probe) else {
            return outcome;
        };
        let ranges = shards::read_map(&conn, &begun.known, self.timeout).await;
        outcome.reached = ranges.is_some();
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
                    outcome.reached = true;
                    self.incarnation.observe(&primaries, &info.run_ids);
                    if self.shards.record(begun.start, None, [&primary]) {
                        self.incarnation.reconnected();
                    }
                    outcome.info.merge(info);
                }
                Answer::Refused(error) => {
                    outcome.reached = true;
                    outcome.refused.get_or_insert(error);
                }
                Answer::Elsewhere => {
                    outcome.reached = true;
                    elsewhere = true;
                }
                Answer::Silent => {}
            }
        }
        if elsewhere && self.made_at(&slot, generation) < self.shards.version() {
            // This connection may not know the primary that the map names (a replica promoted
            // in the place of a dead one): no command of its would ever reach it.
            outcome.renewed = self.renew().await;
        }
        if !outcome.reached {
            // Nothing answers through this connection: it may be dead (its runtime gone), or
            // every node may be. A new one is the cure either way, and whatever it reaches is
            // checked before it serves.
            self.shards.suspect_all();
            slot.mark_down(generation, "no node of the cluster answered");
        }
        outcome
    }

    /// The [version](Shards::version) of the slot map when connection `generation` of `slot`
    /// was made: the pool's first connections are as new as the first map (read right after
    /// them); one this check did not make counts as older than any.
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
        let made = futures_util::future::join_all(
            old.iter()
                .map(|&(slot, generation)| slot.connect_replacement(generation, self.timeout)),
        )
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

impl PrimariesCheck for Arc<ClusterCheck> {
    fn suspect(&self, key_slot: u16, probe: usize) {
        ClusterCheck::suspect(self, key_slot, probe);
    }

    fn nudge(&self) {
        ClusterCheck::nudge(self);
    }
}

/// What one check found.
#[derive(Default)]
struct CheckOutcome {
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
async fn check_loop(check: Weak<ClusterCheck>) {
    let _running = CheckDone(check.clone());
    let mut failures = 0u32;
    loop {
        let Some(this) = check.upgrade() else {
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

/// Clears a cluster check's `running` flag when its loop ends, for whatever reason.
struct CheckDone(Weak<ClusterCheck>);

impl Drop for CheckDone {
    fn drop(&mut self) {
        if let Some(check) = self.0.upgrade() {
            check.running.store(false, Ordering::Release);
        }
    }
}
