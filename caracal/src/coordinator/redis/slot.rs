//! One pooled connection and its reconnection: each slot reconnects on its own, in the
//! background, with bounded backoff; a server that answered with a refusal (a replica now,
//! `maxclients` reached) backs it off whatever waits, and calls finding the slot down are told
//! that refusal.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::connector::{Conn, Connected, Connector};
use super::failure;
use crate::coordinator::incarnation::Incarnation;
use crate::coordinator::runtimes::Running;
use crate::error::Error;
use crate::error::FailureKind;
use crate::events;
use crate::sync::lock;

/// Consecutive timeouts after which a connection is presumed dead and replaced.
const TIMEOUTS_BEFORE_RECONNECT: u32 = 2;
/// The longest pause between two reconnection attempts.
const MAX_RECONNECT_BACKOFF: Duration = Duration::from_millis(500);
/// The shortest: while calls are waiting on a down connection, the backoff shrinks to this,
/// so service resumes within this long of the server's return without a connect storm.
pub(crate) const MIN_RECONNECT_INTERVAL: Duration = Duration::from_millis(50);

/// What a cluster's slot tells the check of the cluster's primaries. The check reconnects the
/// slots it holds, so it sits above them, and a slot knows it only through this.
pub(super) trait PrimariesCheck: Send + Sync {
    /// A command for `key_slot`, sent through pool slot `probe`, failed in a way that may mean
    /// its primary restarted or was replaced.
    fn suspect(&self, key_slot: u16, probe: usize);
    /// The slot reconnected: check now.
    fn nudge(&self);
}

/// One pooled connection and its reconnection state.
pub(crate) struct Slot {
    /// Its place in the pool.
    pub(super) index: usize,
    /// Which pool of the process it belongs to: what its connection events are said per.
    pool: u64,
    state: Mutex<SlotState>,
    /// Nudged by calls that found the connection down: the reconnect loop stops backing off.
    demand: tokio::sync::Notify,
    /// Told when a reconnection ends, made or not: what calls waiting for an orphaned
    /// connection's replacement wait on.
    changed: tokio::sync::Notify,
    closed: Arc<AtomicBool>,
    connector: Arc<Connector>,
    incarnation: Arc<Incarnation>,
    /// A cluster's: what checks its primaries.
    cluster_check: Option<Box<dyn PrimariesCheck>>,
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
    /// The master the connection reaches, when the sentinels named it.
    master: Option<String>,
    /// While down: why the server would not have the connection (a replica now, `maxclients`
    /// reached, …), which calls finding it down are told. `None` when it could not be reached.
    refusal: Option<Error>,
    /// The runtime the connection's driver task was spawned on: the connection dies with it.
    home: Option<Running>,
    /// Down because the runtime its connection lived on shut down, not because the server went
    /// away, and not yet found unreachable by a reconnection attempt since.
    orphaned: bool,
}

impl Slot {
    /// Slot `index` of a pool, not connected yet.
    pub(super) fn new(
        (pool, index): (u64, usize),
        closed: Arc<AtomicBool>,
        connector: Arc<Connector>,
        incarnation: Arc<Incarnation>,
        cluster_check: Option<Box<dyn PrimariesCheck>>,
        timeout: Duration,
    ) -> Self {
        Slot {
            index,
            pool,
            state: Mutex::new(SlotState {
                conn: None,
                generation: 0,
                timeouts: 0,
                reconnecting: false,
                master: None,
                refusal: None,
                home: None,
                orphaned: false,
            }),
            demand: tokio::sync::Notify::new(),
            changed: tokio::sync::Notify::new(),
            closed,
            connector,
            incarnation,
            cluster_check,
            timeout,
        }
    }

    /// Drops the connection for good (the pool is closed).
    pub(super) fn close(&self) {
        lock(&self.state).conn = None;
    }

    /// Why the server would not have the connection, while it is down because of that.
    pub(super) fn refusal(&self) -> Option<Error> {
        lock(&self.state).refusal.clone()
    }

    /// A cluster command for `key_slot` failed in a way that may mean its primary restarted or
    /// was replaced: that primary serves nothing until checked again.
    pub(super) fn suspect(&self, key_slot: u16) {
        if let Some(check) = &self.cluster_check {
            check.suspect(key_slot, self.index);
        }
    }

    /// Reconnected: a cluster's primaries were suspected when it went down, and each serves
    /// once checked (the check wakes the holders); otherwise the holders are woken now.
    fn restored(&self) {
        match &self.cluster_check {
            Some(check) => check.nudge(),
            None => self.incarnation.reconnected(),
        }
    }

    /// Connection `conn` serves now (reaching `master`, when the sentinels named it), unless
    /// the pool was closed meanwhile.
    ///
    /// Called on the runtime the connection was made on, which its driver task runs on.
    pub(super) fn up(&self, conn: Conn, master: Option<String>) {
        {
            let mut state = lock(&self.state);
            state.reconnecting = false;
            state.orphaned = false;
            // A reconnection that finishes after `close` leaves the slot closed.
            if !self.closed.load(Ordering::Acquire) {
                state.conn = Some(conn);
                state.home = Running::here();
                state.master = master;
                state.timeouts = 0;
                state.refusal = None;
            }
        }
        self.changed.notify_waiters();
    }

    /// Whether the slot is down because the runtime its connection lived on shut down, no
    /// reconnection has found the server unreachable since, and one is under way (one that
    /// could not start, its runtime shutting down too, is not worth waiting for).
    pub(super) fn being_replaced(&self) -> bool {
        let state = lock(&self.state);
        state.reconnecting && (state.orphaned || state.home.as_ref().is_some_and(Running::closing))
    }

    /// Completes when a reconnection of this slot ends, made or not (enabled at once, so a
    /// reconnection ending between this call and the first poll is not missed).
    pub(super) fn reconnection_ends(&self) -> impl Future<Output = ()> + '_ {
        let mut ends = Box::pin(self.changed.notified());
        ends.as_mut().enable();
        ends
    }

    /// Tells the connection's end to slot `weak`, if connection `generation` is still its.
    pub(super) fn on_closed(
        weak: Weak<Slot>,
        generation: u64,
    ) -> impl Fn() + Send + Sync + 'static {
        move || {
            if let Some(slot) = weak.upgrade() {
                slot.mark_down(generation, "connection closed");
            }
        }
    }

    /// Counts a timeout of connection `generation`; enough in a row take it down.
    pub(super) fn timed_out(self: &Arc<Self>, generation: u64) {
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

    /// Connection `generation` answered: its timeouts so far were not in a row.
    pub(super) fn answered(&self, generation: u64) {
        let mut state = lock(&self.state);
        if state.generation == generation {
            state.timeouts = 0;
        }
    }

    /// Drops connection `generation` (if still current) and starts reconnecting.
    pub(super) fn mark_down(self: &Arc<Self>, generation: u64, reason: &'static str) {
        self.take_down(generation, reason, None);
    }

    /// [`mark_down`](Self::mark_down) for a server that is a replica now (of `primary`, when
    /// known): calls are told so until the slot reconnects.
    pub(super) fn demoted(self: &Arc<Self>, generation: u64, primary: Option<&str>) {
        let refusal = failure::replica(primary);
        self.take_down(generation, "server is a read-only replica", Some(refusal));
    }

    /// What names this slot's pool in the summaries of connection events: the coordinator's
    /// connector, shared by its slots (each coordinator's outages are said on their own).
    /// A number, never reused in the process: an address would be, by the next pool, and
    /// the summary of the earlier one's events would swallow the later one's.
    fn pool_name(&self) -> String {
        self.pool.to_string()
    }

    fn take_down(self: &Arc<Self>, generation: u64, reason: &'static str, refusal: Option<Error>) {
        {
            let mut state = lock(&self.state);
            if state.generation != generation || state.conn.is_none() {
                return;
            }
            state.conn = None;
            state.reconnecting = true;
            state.generation += 1;
            state.refusal = refusal;
            // Its runtime's watcher may not have been dropped yet: whether it is closing is
            // asked again by calls that find the slot down.
            state.orphaned = state.home.as_ref().is_some_and(|home| !home.still());
        }
        events::connection_lost(reason, &self.pool_name());
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
                let on_closed = Slot::on_closed(weak.clone(), generation);
                let result = connector.connect(on_closed, timeout, false).await;
                let Some(slot) = weak.upgrade() else { return };
                match result {
                    Ok(Connected { conn, info, master }) => {
                        // Before the connection serves a call: a server that lost its data
                        // must end every lease held there first.
                        if let Some(info) = info {
                            slot.incarnation.observe(&info.primaries(), &info.run_ids);
                        }
                        slot.up(conn, master);
                        slot.restored();
                        events::connection_restored(failures + 1, &slot.pool_name());
                        return;
                    }
                    Err(error) => {
                        failures += 1;
                        {
                            let mut state = lock(&slot.state);
                            state.refusal = refusal(error);
                            // The server is what is down now, whatever became of the runtime.
                            state.orphaned = false;
                            state.home = None;
                        }
                        slot.changed.notify_waiters();
                    }
                }
                let attempted = tokio::time::Instant::now();
                let backoff = reconnect_backoff(failures);
                // A server that answered, and refused (a replica, `maxclients` reached), will
                // not change its mind within a few milliseconds: waiting calls do not cut the
                // pause short, so each pooled connection costs it a few attempts a second.
                let refused = lock(&slot.state).refusal.is_some();
                drop(slot);
                if refused {
                    tokio::time::sleep(backoff).await;
                    continue;
                }
                let Some(slot) = weak.upgrade() else { return };
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = slot.demand.notified() => {
                        tokio::time::sleep_until(attempted + MIN_RECONNECT_INTERVAL).await;
                    }
                }
            }
        });
    }

    /// A new connection to take the place of connection `generation` (see
    /// [`replace`](Self::replace)), made while the old one serves on.
    pub(super) async fn connect_replacement(
        self: &Arc<Self>,
        generation: u64,
        timeout: Duration,
    ) -> Result<Connected, Error> {
        let on_closed = Slot::on_closed(Arc::downgrade(self), generation + 1);
        self.connector.connect(on_closed, timeout, false).await
    }

    /// Puts `conn` in the place of connection `generation`, if that is still the one in use:
    /// the old one finishes what was sent through it, and takes nothing more. The new
    /// connection's generation, if it took the place.
    pub(super) fn replace(&self, generation: u64, conn: Conn) -> Option<u64> {
        let mut state = lock(&self.state);
        if state.generation != generation
            || state.conn.is_none()
            || self.closed.load(Ordering::Acquire)
        {
            return None;
        }
        state.generation += 1;
        state.conn = Some(conn);
        state.home = Running::here();
        state.timeouts = 0;
        Some(state.generation)
    }

    /// The connection, if up, without starting a reconnection.
    pub(super) fn current(&self) -> Option<(Conn, u64)> {
        let state = lock(&self.state);
        state.conn.clone().map(|conn| (conn, state.generation))
    }

    /// Replaces the connection if it reaches a master other than `master` (the sentinels name
    /// another now).
    pub(super) fn follow(self: &Arc<Self>, master: &str) {
        let moved = {
            let state = lock(&self.state);
            let moved =
                state.conn.is_some() && state.master.as_deref().is_some_and(|m| m != master);
            moved.then_some(state.generation)
        };
        if let Some(generation) = moved {
            self.mark_down(generation, "the sentinels named another master");
        }
    }

    /// The connection and its generation, if up; if down, hurries its reconnection along
    /// (starting one if none runs).
    pub(super) fn checkout(self: &Arc<Self>) -> Option<(Conn, u64)> {
        let mut state = lock(&self.state);
        if state.conn.is_some() && state.home.as_ref().is_some_and(|home| !home.still()) {
            // Its driver task died with its runtime: every command sent through it would fail.
            let generation = state.generation;
            drop(state);
            self.take_down(generation, "the runtime it ran on shut down", None);
            state = lock(&self.state);
        }
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

/// What calls are told about a failed reconnection attempt: the server's refusal, if it
/// answered with one (an error about the server at this point, say a `run_id` it would not
/// tell, is its refusal too), else nothing beyond that the connection is down.
fn refusal(error: Error) -> Option<Error> {
    match error {
        Error::InvalidConfig { reason } => Some(Error::unavailable(FailureKind::Server, reason)),
        error if error.failure_kind() == Some(FailureKind::Server) => Some(error),
        _ => None,
    }
}

/// The pause after `failures` failed reconnection attempts in a row when no call is waiting:
/// growing by [`MIN_RECONNECT_INTERVAL`] per failure up to [`MAX_RECONNECT_BACKOFF`]. (A call
/// finding the connection down cuts it short, to `MIN_RECONNECT_INTERVAL` after the attempt.)
pub(super) fn reconnect_backoff(failures: u32) -> Duration {
    MAX_RECONNECT_BACKOFF.min(MIN_RECONNECT_INTERVAL.saturating_mul(failures))
}

/// Clears a slot's `reconnecting` flag when its reconnect loop ends, for whatever reason.
struct ReconnectDone(Weak<Slot>);

impl Drop for ReconnectDone {
    fn drop(&mut self) {
        if let Some(slot) = self.0.upgrade() {
            lock(&slot.state).reconnecting = false;
            // A call waiting for it starts another, on its own runtime.
            slot.changed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
