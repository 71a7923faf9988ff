//! Commands the caller does not wait for (lease releases, batched observations), tracked so
//! shutdown can flush them.
//!
//! Background work is not given a task of its own when it starts: it is polled once where it
//! starts, then left on a shelf until it wakes (its reply came, its timer fired), and only then
//! spawned. Meanwhile a caller about to wait on the same connection may carry it instead
//! ([`Parked::adopt`], [`Background::alongside`]): a lone caller's release then rides along
//! with its next acquire, and the reply to both wakes one task. On a multi-thread runtime each
//! extra task woken in the same turn as another wakes a second worker thread; that, not the
//! `ZREM` on the wire, was most of what a release cost a lone caller.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio_util::task::TaskTracker;

use crate::sync::lock;

/// Background work, boxed.
pub(crate) type Work = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Background commands in flight. Clones track the same work.
#[derive(Debug, Default, Clone)]
pub(crate) struct Background {
    tracker: TaskTracker,
    /// The runtime the coordinator was built on (its connections live there): where work
    /// started outside any runtime finishes.
    home: Option<Handle>,
}

impl Background {
    /// Background work for a coordinator built here: on the current runtime, if any.
    pub(super) fn here() -> Self {
        Background {
            tracker: TaskTracker::new(),
            home: Handle::try_current().ok(),
        }
    }

    /// Starts `work` now and lets it finish on the runtime.
    ///
    /// `work` is polled once right here, so whatever it does before its first real wait (for a
    /// Redis command: queueing the request on its connection) has happened when this returns.
    /// That is what keeps a task's next command from overtaking its own release. The returned
    /// handle lets a caller carry the work until it is done (see [`Parked::adopt`]); dropping
    /// it leaves the work to finish on its own.
    pub(crate) fn start(&self, work: impl Future<Output = ()> + Send + 'static) -> Parked {
        // Tracked from before the first poll, so a concurrent flush sees it; work that
        // panics, is never spawned, or dies with its runtime stops being tracked when dropped,
        // so it cannot leave a flush waiting.
        self.resume(Box::pin(tokio::task::unconstrained(
            self.tracker.track_future(work),
        )))
    }

    /// Polls `work` (tracked already) once here and shelves it if it is not done.
    fn resume(&self, mut work: Work) -> Parked {
        // Outside a runtime (a guard dropped on a plain thread) the work belongs to the
        // coordinator's own, from its first poll: the cluster client arms a timer there.
        let current = Handle::try_current().ok();
        let home = current.is_none().then_some(self.home.as_ref()).flatten();
        let _entered = home.map(Handle::enter);
        // It must live on, as a request whose caller is gone is never sent; without any
        // runtime to finish it, nothing would, and it is dropped after this poll.
        let Some(runtime) = current.or_else(|| home.cloned()) else {
            let _ = work.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            return Parked(None);
        };
        let shelf = Arc::new(Shelf {
            state: Mutex::new(State::Polling { woken: false }),
            runtime,
        });
        let waker = Waker::from(Arc::clone(&shelf));
        if work
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_ready()
        {
            *lock(&shelf.state) = State::Gone;
            return Parked(None);
        }
        let mut state = lock(&shelf.state);
        if let State::Polling { woken: false } = *state {
            *state = State::Shelved(work);
            drop(state);
            return Parked(Some(shelf));
        }
        // It woke while polled: nothing would wake it again.
        *state = State::Gone;
        drop(state);
        shelf.runtime.spawn(work);
        Parked(None)
    }

    /// Runs `main`, polling `carried` work alongside it in the same task until `main` ends;
    /// what is still pending then (or when this is dropped) goes back to the background.
    pub(crate) async fn alongside<T>(
        &self,
        main: impl Future<Output = T>,
        carried: Vec<Work>,
    ) -> T {
        let mut main = pin!(main);
        let mut carried = Carried {
            works: carried,
            background: self,
        };
        poll_fn(|cx| {
            carried
                .works
                .retain_mut(|work| work.as_mut().poll(cx).is_pending());
            main.as_mut().poll(cx)
        })
        .await
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

/// Work carried by a caller's task; what is left of it when the carrier ends goes back to the
/// background.
struct Carried<'a> {
    works: Vec<Work>,
    background: &'a Background,
}

impl Drop for Carried<'_> {
    fn drop(&mut self) {
        for work in self.works.drain(..) {
            // Its own pollings re-register its wakers with the shelf.
            let _ = self.background.resume(work);
        }
    }
}

/// Started background work that may still be on its shelf (see [`Background::start`]).
#[derive(Clone, Default)]
pub(crate) struct Parked(Option<Arc<Shelf>>);

impl Parked {
    /// Takes the work off its shelf, if it is still there, for the caller to poll to its end
    /// (see [`Background::alongside`]): it has not woken since it was shelved.
    pub(crate) fn adopt(&self) -> Option<Work> {
        let shelf = self.0.as_ref()?;
        let mut state = lock(&shelf.state);
        match std::mem::replace(&mut *state, State::Gone) {
            State::Shelved(work) => Some(work),
            other => {
                *state = other;
                None
            }
        }
    }

    /// Whether the work may still be on its shelf.
    pub(crate) fn shelved(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|shelf| matches!(*lock(&shelf.state), State::Shelved(_)))
    }
}

/// Where started work waits for its next wake-up.
struct Shelf {
    state: Mutex<State>,
    runtime: Handle,
}

enum State {
    /// Being polled where it started; whether it woke meanwhile.
    Polling {
        woken: bool,
    },
    Shelved(Work),
    /// Done, spawned or adopted: its wakers now belong to whoever polls it.
    Gone,
}

impl Wake for Shelf {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut state = lock(&self.state);
        match &mut *state {
            State::Polling { woken } => *woken = true,
            State::Shelved(_) => {
                let State::Shelved(work) = std::mem::replace(&mut *state, State::Gone) else {
                    unreachable!("matched as shelved");
                };
                drop(state);
                self.runtime.spawn(work);
            }
            State::Gone => {}
        }
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
