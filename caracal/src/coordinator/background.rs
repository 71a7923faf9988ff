//! Commands the caller does not wait for (lease releases, batched observations), tracked so
//! shutdown can flush them.

use std::future::Future;
use std::task::{Context, Waker};
use std::time::Duration;

use tokio_util::task::TaskTracker;

/// Background commands in flight. Clones track the same work.
#[derive(Debug, Default, Clone)]
pub(crate) struct Background {
    tracker: TaskTracker,
    /// The runtime the coordinator was built on (its connections live there): where work
    /// started outside any runtime finishes.
    home: Option<tokio::runtime::Handle>,
}

impl Background {
    /// Background work for a coordinator built here: on the current runtime, if any.
    pub(super) fn here() -> Self {
        Background {
            tracker: TaskTracker::new(),
            home: tokio::runtime::Handle::try_current().ok(),
        }
    }

    /// Starts `work` now and lets it finish on the runtime.
    ///
    /// `work` is polled once right here, so whatever it does before its first real wait (for a
    /// Redis command: queueing the request on its connection) has happened when this returns.
    /// That is what keeps a task's next command from overtaking its own release.
    pub(crate) fn start(&self, work: impl Future<Output = ()> + Send + 'static) {
        // Tracked from before the first poll, so a concurrent flush sees it; work that
        // panics, is never spawned, or dies with its runtime stops being tracked when dropped,
        // so it cannot leave a flush waiting.
        let mut work = Box::pin(tokio::task::unconstrained(self.tracker.track_future(work)));
        // Outside a runtime (a guard dropped on a plain thread) the work belongs to the
        // coordinator's own, from its first poll: the cluster client arms a timer there.
        let runtime = tokio::runtime::Handle::try_current().ok();
        let home = runtime.is_none().then_some(self.home.as_ref()).flatten();
        let entered = home.map(tokio::runtime::Handle::enter);
        if work
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_ready()
        {
            return;
        }
        drop(entered);
        // It must live on, as a request whose caller is gone is never sent.
        if let Some(runtime) = runtime.or_else(|| home.cloned()) {
            runtime.spawn(work);
        }
    }

    /// Waits until nothing is in flight, or `limit` has passed. Work started meanwhile is
    /// waited for too.
    pub(super) async fn flush(&self, limit: Duration) {
        // A tracker's `wait` ends once it is closed and empty; reopened at once, so the
        // coordinator stays usable.
        self.tracker.close();
        let _ = tokio::time::timeout(limit, self.tracker.wait()).await;
        self.tracker.reopen();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn flush_waits_for_background_work() {
        let background = Background::default();
        let done = Arc::new(AtomicUsize::new(0));
        for _ in 0..3 {
            let done = Arc::clone(&done);
            background.start(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                done.fetch_add(1, Ordering::SeqCst);
            });
        }
        background.flush(Duration::from_secs(5)).await;
        assert_eq!(done.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn work_that_cannot_be_spawned_is_not_waited_for() {
        let background = Background::default();
        // No runtime here: the work is polled once, then dropped.
        background.start(std::future::pending());
        assert!(background.tracker.is_empty());
    }

    #[test]
    fn work_started_outside_any_runtime_runs_in_the_coordinators() {
        let home = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let background = Background {
            tracker: TaskTracker::new(),
            home: Some(home.handle().clone()),
        };
        let (done, finished) = tokio::sync::oneshot::channel();
        // Armed at the first poll, as the cluster client's response timeout is: it needs a
        // runtime there already.
        background.start(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            let _ = done.send(());
        });
        home.block_on(finished).expect("the work finished");
    }

    #[tokio::test]
    async fn work_runs_up_to_its_first_wait_before_start_returns() {
        let background = Background::default();
        let reached = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&reached);
        background.start(async move {
            seen.store(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
        });
        assert_eq!(reached.load(Ordering::SeqCst), 1);
    }
}
