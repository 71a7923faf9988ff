//! The periodic check of a standalone (or Sentinel-managed) primary: every
//! [`CHECK_PERIOD`], `INFO` on one pooled connection (the next one up, in turn). It finds what
//! no call may have run into:
//! - a new `run_id` (the server restarted without its data, or a replica took its place behind
//!   the same address): a loss, told to [`Incarnation::observe`] before anything else is
//!   served through that connection's answer;
//! - a primary demoted to a replica while its connections stayed open (a failover, `REPLICAOF`):
//!   that connection is replaced, reconnecting through the sentinels where there are, so a
//!   process with no writes in flight still follows the new master within a period;
//! - through Sentinel, a new master that a majority of the sentinels name: every connection to
//!   another is replaced. After a failover the old master answers as a master for seconds more
//!   (until the sentinels convert it), and writes there would be lost; so this process follows
//!   the sentinels, not the old master's word, within a period of their switch.
//!
//! A cluster's primaries are checked by its
//! [`ClusterCheck`](super::cluster_check::ClusterCheck) instead.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::connector::Connector;
use super::server::{self, ServerInfo};
use super::shards::CHECK_PERIOD;
use super::slot::Slot;
use crate::coordinator::incarnation::Incarnation;

/// Checks the primary behind a standalone pool every [`CHECK_PERIOD`].
pub(crate) struct PrimaryCheck {
    connector: Arc<Connector>,
    /// The pool's connections, set once the pool exists.
    pub(super) slots: OnceLock<Weak<[Arc<Slot>]>>,
    /// Whether a check loop runs: it dies with its runtime, and the next call starts another.
    running: AtomicBool,
    /// The pool slot the next check uses (then the next one up).
    next: AtomicUsize,
    incarnation: Arc<Incarnation>,
    timeout: Duration,
    closed: Arc<AtomicBool>,
}

impl PrimaryCheck {
    pub(super) fn new(
        connector: Arc<Connector>,
        incarnation: Arc<Incarnation>,
        timeout: Duration,
        closed: Arc<AtomicBool>,
    ) -> Self {
        PrimaryCheck {
            connector,
            slots: OnceLock::new(),
            running: AtomicBool::new(false),
            next: AtomicUsize::new(0),
            incarnation,
            timeout,
            closed,
        }
    }

    /// Starts the check loop unless one runs (cheap when one does: called on every checkout).
    pub(super) fn ensure_running(self: &Arc<Self>) {
        if self.running.load(Ordering::Acquire) || self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(check_loop(Arc::downgrade(self)));
            }
            Err(_) => self.running.store(false, Ordering::Release),
        }
    }

    /// Whether the pool it checks is still there, and open.
    fn serves(&self) -> bool {
        let alive = self
            .slots
            .get()
            .is_some_and(|slots| slots.strong_count() > 0);
        alive && !self.closed.load(Ordering::Acquire)
    }

    /// One check: of the server, then of whom the sentinels name.
    async fn check(&self) {
        let Some(slots) = self.slots.get().and_then(Weak::upgrade) else {
            return;
        };
        self.check_server(&slots).await;
        self.check_sentinels(&slots).await;
    }

    /// `INFO` through the next pooled connection that is up. A failure to answer is the
    /// connection's, handled as any command's (timeouts counted, a broken one replaced); an
    /// answer that tells nothing is no finding.
    async fn check_server(&self, slots: &[Arc<Slot>]) {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let Some(mut checkout) =
            (0..slots.len()).find_map(|offset| slots[(start + offset) % slots.len()].checkout_up())
        else {
            return;
        };
        let deadline = Instant::now() + self.timeout;
        let Ok(reply) = checkout.send(&server::info_command(), deadline).await else {
            return;
        };
        let Ok(info) = ServerInfo::parse("", &reply) else {
            return;
        };
        match &info.replica_of {
            Some(primary) => checkout.demoted(Some(primary)),
            None => self.incarnation.observe(&info.primaries(), &info.run_ids),
        }
    }

    /// Through Sentinel: replaces every connection to a master other than the one a majority
    /// of the sentinels name.
    async fn check_sentinels(&self, slots: &[Arc<Slot>]) {
        if let Some(master) = self.connector.named_master(self.timeout).await {
            for slot in slots {
                slot.follow(&master);
            }
        }
    }
}

/// Checks every [`CHECK_PERIOD`] until the pool is gone or closed.
async fn check_loop(check: Weak<PrimaryCheck>) {
    let _running = CheckDone(check.clone());
    while let Some(this) = check.upgrade().filter(|this| this.serves()) {
        this.check().await;
        drop(this);
        tokio::time::sleep(CHECK_PERIOD).await;
    }
}

/// Clears a check's `running` flag when its loop ends, for whatever reason.
struct CheckDone(Weak<PrimaryCheck>);

impl Drop for CheckDone {
    fn drop(&mut self) {
        if let Some(check) = self.0.upgrade() {
            check.running.store(false, Ordering::Release);
        }
    }
}
