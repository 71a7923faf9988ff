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
        let mut work = Box::pin(tokio::task::unconstrained(work));
        if work
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_ready()
        {
            return;
        }
        // Outside a runtime (a guard dropped after shutdown) the request is already queued;
        // only its answer goes unobserved.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let state = Arc::clone(&self.state);
        state.in_flight.fetch_add(1, Ordering::AcqRel);
        runtime.spawn(async move {
            work.await;
            if state.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
                state.idle.notify_waiters();
            }
        });
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
