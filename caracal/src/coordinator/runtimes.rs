//! Which tokio runtimes are still running: one watcher task per runtime, shared by the whole
//! process, whose drop (the runtime dropping its tasks as it shuts down) clears a flag.
//!
//! What a runtime spawned dies with it: background work (see [`background`](super::background))
//! and a connection's driver task alike. Their owners keep the flag of the runtime they live on
//! and look at it before relying on them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::runtime::{self, Handle};

use crate::sync::lock;

/// Whether a runtime runs: cleared as it drops its tasks, for good.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    flag: Arc<AtomicBool>,
    handle: Handle,
}

impl Running {
    /// The flag of the runtime `handle` belongs to, watched from now on if it was not yet.
    pub(crate) fn of(handle: &Handle) -> Self {
        static WATCHED: Mutex<Vec<(runtime::Id, Weak<AtomicBool>)>> = Mutex::new(Vec::new());
        let mut watched = lock(&WATCHED);
        // Runtimes come and go: those whose watcher is gone (with their runtime) and nobody
        // looks at are forgotten, so the list holds the live ones.
        watched.retain(|(_, flag)| flag.strong_count() > 0);
        let id = handle.id();
        if let Some(flag) = watched
            .iter()
            .find(|(watched, _)| *watched == id)
            .and_then(|(_, flag)| flag.upgrade())
            .filter(|flag| flag.load(Ordering::Acquire))
        {
            return Running {
                flag,
                handle: handle.clone(),
            };
        }
        let flag = Arc::new(AtomicBool::new(true));
        let watcher = Watcher(Arc::clone(&flag));
        handle.spawn(async move {
            let _watcher = watcher;
            std::future::pending::<()>().await;
        });
        watched.retain(|(watched, _)| *watched != id);
        watched.push((id, Arc::downgrade(&flag)));
        Running {
            flag,
            handle: handle.clone(),
        }
    }

    /// The current runtime's flag, if there is a current runtime.
    pub(crate) fn here() -> Option<Self> {
        Handle::try_current().ok().map(|handle| Self::of(&handle))
    }

    /// Whether the runtime still runs, as far as its watcher knows: one load.
    pub(crate) fn still(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// Whether the runtime has begun shutting down, though it may not have dropped its
    /// watcher yet: it drops its tasks one by one, and what ran there (a connection's driver)
    /// may be gone while [`still`](Self::still) says it runs. A runtime that has begun drops
    /// what is spawned on it at once, unpolled; one that runs polls it. Costs a spawn.
    pub(crate) fn closing(&self) -> bool {
        if !self.still() {
            return true;
        }
        let polled = Arc::new(AtomicBool::new(false));
        let probe = {
            let polled = Arc::clone(&polled);
            self.handle
                .spawn(async move { polled.store(true, Ordering::Release) })
        };
        let closing = probe.is_finished() && !polled.load(Ordering::Acquire);
        if closing {
            self.stopped();
        }
        closing
    }

    /// Notes that the runtime is shutting down, before its watcher may have been dropped.
    pub(crate) fn stopped(&self) {
        self.flag.store(false, Ordering::Release);
    }
}

/// Clears its runtime's flag when that runtime drops it.
struct Watcher(Arc<AtomicBool>);

impl Drop for Watcher {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
    }

    #[test]
    fn a_runtime_runs_until_it_is_dropped_and_is_watched_once() {
        let first = runtime();
        let running = Running::of(first.handle());
        let again = Running::of(first.handle());
        assert!(
            Arc::ptr_eq(&running.flag, &again.flag),
            "one watcher per runtime"
        );
        let second = runtime();
        let other = Running::of(second.handle());
        assert!(running.still() && other.still());
        assert!(!running.closing() && !other.closing(), "a probe is polled");
        drop(first);
        assert!(!running.still(), "dropped with its runtime");
        assert!(running.closing());
        assert!(other.still() && !other.closing());
    }
}
