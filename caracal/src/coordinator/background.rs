//! Commands the caller does not wait for (lease releases), tracked so shutdown can flush them.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Waker};
use std::time::Duration;

use tokio::sync::Notify;

/// Background commands in flight.
#[derive(Debug, Default)]
pub(super) struct Background {
    state: Arc<State>,
    /// The runtime the coordinator was built on (its connections live there): where work
    /// started outside any runtime finishes.
    home: Option<tokio::runtime::Handle>,
}

#[derive(Debug, Default)]
struct State {
    in_flight: AtomicUsize,
    idle: Notify,
}

impl Background {
    /// Starts `work` now and lets it finish on the runtime.
    ///
    /// `work` is polled once right here, so whatever it does before its first real wait (for a
    /// Redis command: queueing the request on its connection) has happened when this returns.
    /// That is what keeps a task's next command from overtaking its own release.
    pub(super) fn start(&self, work: impl Future<Output = ()> + Send + 'static) {
        // Counted before the first poll, so a concurrent flush sees it; uncounted by a guard,
        // so work that panics, is never spawned, or dies with its runtime cannot leave a flush
        // waiting for it.
        self.state.in_flight.fetch_add(1, Ordering::AcqRel);
        let in_flight = InFlight(Arc::clone(&self.state));
        let mut work = Box::pin(tokio::task::unconstrained(async move {
            let _in_flight = in_flight;
            work.await;
        }));
        if work
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_ready()
        {
            return;
        }
        // Outside a runtime (a guard dropped on a plain thread) the work goes to the
        // coordinator's own: it must live on, as a request whose caller is gone is never sent.
        if let Some(runtime) = tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| self.home.clone())
        {
            runtime.spawn(work);
        }
    }

    /// Background work for a coordinator built on `home` (if built in a runtime).
    pub(super) fn new(home: Option<tokio::runtime::Handle>) -> Self {
        Background {
            state: Arc::default(),
            home,
        }
    }

    /// Waits until nothing is in flight, or `limit` has passed.
    pub(super) async fn flush(&self, limit: Duration) {
        let idle = async {
            loop {
                let mut notified = pin!(self.state.idle.notified());
                notified.as_mut().enable();
                if self.state.in_flight.load(Ordering::Acquire) == 0 {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(limit, idle).await;
    }
}

/// One unit of background work in flight, for as long as it lives.
struct InFlight(Arc<State>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
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
        assert_eq!(background.state.in_flight.load(Ordering::SeqCst), 0);
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
