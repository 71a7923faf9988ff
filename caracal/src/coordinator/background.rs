//! Commands the caller does not wait for (lease releases, batched observations), tracked so
//! shutdown can flush them.
//!
//! Background work is not given a task of its own when it starts: it is polled once where it
//! starts, then left on a shelf until it wakes (its reply came, its timer fired), and only then
//! spawned. Meanwhile the task that started it, about to wait on the same connection anyway,
//! may carry it ([`Parked::adopt`], [`Background::alongside`]): a lone caller's release then
//! rides along with its next acquire, and the reply to both wakes one task. On a multi-thread
//! runtime each extra task woken in the same turn as another wakes a second worker thread;
//! that, not the `ZREM` on the wire, was most of what a release cost a lone caller.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tokio::runtime::{self, Handle};
use tokio_util::task::TaskTracker;

use super::runtimes::Running;
use crate::sync::lock;

/// Background work, boxed.
type Work = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Background commands in flight. Clones track the same work.
#[derive(Debug, Default, Clone)]
pub(crate) struct Background {
    tracker: TaskTracker,
    /// Where work started outside any runtime finishes.
    homes: Homes,
    /// Work being carried, for a flush to take back from a carrier that stopped polling.
    carried: Arc<Mutex<Vec<Weak<Shelf>>>>,
}

thread_local! {
    /// Whether the work polled here runs on a runtime borrowed for its first poll.
    static BORROWED: Cell<bool> = const { Cell::new(false) };
    /// Work handed on while this thread is starting handed-on work already (see
    /// [`Background::hand_on`]), in order; `None` while it is not.
    static HANDED_ON: RefCell<Option<VecDeque<(Background, Work)>>> = const { RefCell::new(None) };
}

/// Whether what is polled here runs on a runtime of its own, where a timer may be armed at
/// once. Not so for the first poll of work started outside any runtime, on the coordinator's
/// borrowed (it may be shutting down: a timer armed there panics), nor outside any runtime.
pub(crate) fn on_own_runtime() -> bool {
    !BORROWED.get() && Handle::try_current().is_ok()
}

impl Background {
    /// Background work for a coordinator built here: on the current runtime, if any.
    pub(super) fn here() -> Self {
        let background = Background::default();
        if let Ok(current) = Handle::try_current() {
            background.homes.note(&current);
        }
        background
    }

    /// Starts `work` now and lets it finish on the runtime.
    ///
    /// `work` is polled once right here, so whatever it does before its first real wait (for a
    /// Redis command: queueing the request on its connection) has happened when this returns.
    /// That is what keeps a task's next command from overtaking its own release. The returned
    /// handle lets the task that started it carry it (see [`Parked::adopt`]); dropping it
    /// leaves the work to finish on its own.
    pub(crate) fn start(&self, work: impl Future<Output = ()> + Send + 'static) -> Parked {
        // Tracked from before the first poll, so a concurrent flush sees it; work that
        // panics, is never spawned, or finds no runtime left to finish on stops being tracked
        // when dropped, so it cannot leave a flush waiting.
        let mut work: Work = Box::pin(tokio::task::unconstrained(self.tracker.track_future(work)));
        // Outside a runtime (a guard dropped on a plain thread) the work belongs to one that
        // runs, from its first poll: what it awaits (a connection's reply, its own timer) must
        // be polled by one.
        let current = Handle::try_current().ok();
        let home = match &current {
            Some(current) => {
                self.homes.note(current);
                None
            }
            None => self.homes.running(),
        };
        // It must live on, as a request whose caller is gone is never sent; without any
        // runtime to finish it, nothing would, and it is dropped after this poll.
        let Some(runtime) = current.clone().or_else(|| home.clone()) else {
            let _ = catch_unwind(AssertUnwindSafe(|| {
                work.as_mut().poll(&mut Context::from_waker(Waker::noop()))
            }));
            return Parked(None);
        };
        let shelf = Arc::new(Shelf {
            state: Mutex::new(State::Polling {
                woken: false,
                taken_back: false,
            }),
            runtime,
            homes: self.homes.clone(),
            task: current.and(tokio::task::try_id()),
        });
        let _entered = home.as_ref().map(|home| (home.enter(), Borrowed::set()));
        match shelf.poll(work, None) {
            Poll::Ready(()) => Parked(None),
            Poll::Pending => Parked(Some(shelf)),
        }
    }

    /// [`start`](Self::start) for work that work ending hands on (a lane's next batch, as
    /// the call before it ends): started here and now, unless this thread is already starting
    /// handed-on work, and then as soon as that start returns. Each start polls its work in
    /// place, so a chain of work that ends within its first poll and hands on to the next
    /// would otherwise nest a start in the one before for every link: a lane whose backlog
    /// failed at once (no connection to check out) overflowed a thread's stack.
    pub(crate) fn hand_on(&self, work: impl Future<Output = ()> + Send + 'static) {
        // Tracked while it waits its turn: the work it follows may stop being tracked first,
        // and a flush must not find nothing in flight meanwhile.
        let work: Work = Box::pin(self.tracker.track_future(work));
        let mut first = Some((self.clone(), work));
        // A thread whose locals are being torn down starts it here and now, as `start` would.
        let _ = HANDED_ON.try_with(|queue| match &mut *queue.borrow_mut() {
            Some(queue) => queue.extend(first.take()),
            none => *none = Some(VecDeque::new()),
        });
        let Some(first) = first else {
            return;
        };
        let _handing_on = HandingOn;
        let mut next = Some(first);
        while let Some((background, work)) = next {
            background.start(work);
            next = HANDED_ON
                .try_with(|queue| queue.borrow_mut().as_mut().and_then(VecDeque::pop_front))
                .ok()
                .flatten();
        }
    }

    /// Runs `main`, polling `carried` work alongside it in the same task until `main` ends;
    /// what is still pending then (or when this is dropped) goes back to its shelf.
    pub(crate) async fn alongside<T>(
        &self,
        main: impl Future<Output = T>,
        mut carried: Vec<Carry>,
    ) -> T {
        if !carried.is_empty() {
            let mut registered = lock(&self.carried);
            registered.retain(|shelf| shelf.upgrade().is_some_and(|shelf| shelf.carried()));
            registered.extend(carried.iter().map(|carry| Arc::downgrade(&carry.0)));
        }
        let mut main = pin!(main);
        poll_fn(|cx| {
            carried.retain(|carry| carry.poll(cx).is_pending());
            main.as_mut().poll(cx)
        })
        .await
    }

    /// Waits until nothing is in flight, or `limit` has passed. Work started meanwhile is
    /// waited for too.
    pub(super) async fn flush(&self, limit: Duration) {
        // What a task carries finishes only as fast as that task polls it: taken back, it
        // finishes on its own.
        let carried = std::mem::take(&mut *lock(&self.carried));
        for shelf in carried.iter().filter_map(Weak::upgrade) {
            shelf.take_back();
        }
        // A tracker's `wait` ends once it is closed and empty; reopened at once, so the
        // coordinator stays usable.
        self.tracker.close();
        let _ = tokio::time::timeout(limit, self.tracker.wait()).await;
        self.tracker.reopen();
    }
}

/// The runtimes work was started on, the newest last, each with whether it still runs: work
/// started outside any runtime finishes on the newest still running, and so does work whose
/// runtime stopped before it was done (see [`spawn`]). Not always the coordinator's own, which
/// may have stopped while the coordinator serves on; nor merely the latest, which may be a
/// short-lived one.
#[derive(Debug, Default, Clone)]
struct Homes(Arc<Known>);

#[derive(Debug, Default)]
struct Known {
    /// A digest of the newest one's id (0 for none): most starts are on it, and need no lock.
    newest: AtomicU64,
    runtimes: Mutex<Vec<Home>>,
}

#[derive(Debug)]
struct Home {
    handle: Handle,
    /// Cleared when the runtime drops its tasks: as it drops its watcher, or one of its tasks
    /// unfinished (see [`Homes::stopping`]).
    running: Running,
}

impl Homes {
    /// Notes that work starts on `current`.
    fn note(&self, current: &Handle) {
        let digest = BuildHasherDefault::<DefaultHasher>::default()
            .hash_one(current.id())
            .max(1);
        if self.0.newest.load(Ordering::Relaxed) == digest {
            return;
        }
        let mut runtimes = lock(&self.0.runtimes);
        runtimes.retain(|home| home.running.still());
        // Noted before, it is the newest again, still watched by its first watcher.
        let home = match runtimes
            .iter()
            .position(|home| home.handle.id() == current.id())
        {
            Some(at) => runtimes.remove(at),
            None => Home {
                handle: current.clone(),
                running: Running::of(current),
            },
        };
        runtimes.push(home);
        self.0.newest.store(digest, Ordering::Relaxed);
    }

    /// The newest runtime still running.
    fn running(&self) -> Option<Handle> {
        lock(&self.0.runtimes)
            .iter()
            .rev()
            .find(|home| home.running.still())
            .map(|home| home.handle.clone())
    }

    /// Notes that `runtime` is shutting down (it dropped a task unfinished), before its
    /// watcher may have been dropped: runtimes shutting down together must not pass work back
    /// and forth.
    fn stopping(&self, runtime: runtime::Id) {
        for home in lock(&self.0.runtimes).iter() {
            if home.handle.id() == runtime {
                home.running.stopped();
            }
        }
    }
}

/// How many times work moves to another runtime at most: a runtime noted as running may
/// already be shutting down too.
const MOVES: u8 = 3;

/// Spawns `work` as a task of its own on `runtime`. Tokio drops a task unfinished only when
/// its runtime shuts down (none of these is ever aborted): the work then moves on to the
/// newest runtime still running, its timers armed again there (see [`timer`](super::timer)),
/// rather than vanish with its runtime, which would leave what it was to do next (move its
/// lane on, send a release queued behind it) undone for good.
fn spawn(runtime: &Handle, homes: &Homes, work: Work) {
    spawn_moved(runtime, homes, work, 0);
}

fn spawn_moved(runtime: &Handle, homes: &Homes, work: Work, moves: u8) {
    runtime.spawn(Homed {
        work: Some(work),
        homes: homes.clone(),
        runtime: runtime.id(),
        moves,
    });
}

/// Work in a task of its own (see [`spawn`]).
struct Homed {
    /// `None` once finished, or dropped after a panic (as its own task would be).
    work: Option<Work>,
    homes: Homes,
    runtime: runtime::Id,
    moves: u8,
}

impl Future for Homed {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(work) = self.work.as_mut() else {
            return Poll::Ready(());
        };
        match catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            _ => {
                self.work = None;
                Poll::Ready(())
            }
        }
    }
}

impl Drop for Homed {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        self.homes.stopping(self.runtime);
        if self.moves < MOVES
            && let Some(next) = self.homes.running()
        {
            spawn_moved(&next, &self.homes, work, self.moves + 1);
        }
    }
}

/// Ends the outermost [`Background::hand_on`] of this thread, however it ends.
struct HandingOn;

impl Drop for HandingOn {
    fn drop(&mut self) {
        // What is left (only after a panic) is taken out first: its drop may hand on again.
        let left = HANDED_ON.try_with(RefCell::take);
        drop(left);
    }
}

/// Marks this thread's pollings as on a borrowed runtime while it lives.
struct Borrowed;

impl Borrowed {
    fn set() -> Self {
        BORROWED.set(true);
        Borrowed
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        BORROWED.set(false);
    }
}

/// Started background work that may still be on its shelf (see [`Background::start`]).
#[derive(Clone, Default)]
pub(crate) struct Parked(Option<Arc<Shelf>>);

impl Parked {
    /// Takes the work off its shelf, if it is still there, for the caller to carry (see
    /// [`Background::alongside`]). Only the task that started it may, on the runtime it
    /// belongs to: another task might stop polling it, and another runtime's timers die with
    /// that runtime.
    pub(crate) fn adopt(&self) -> Option<Carry> {
        let shelf = self.0.as_ref()?;
        let here = Handle::try_current().ok()?;
        if shelf.task.is_none()
            || tokio::task::try_id() != shelf.task
            || here.id() != shelf.runtime.id()
        {
            return None;
        }
        let mut state = lock(&shelf.state);
        match std::mem::replace(&mut *state, State::Gone) {
            State::Shelved(work) => {
                *state = State::Carried {
                    work,
                    carrier: Waker::noop().clone(),
                    woken: false,
                };
                Some(Carry(Arc::clone(shelf)))
            }
            other => {
                *state = other;
                None
            }
        }
    }

    /// Whether the work is on its shelf.
    pub(crate) fn shelved(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|shelf| matches!(*lock(&shelf.state), State::Shelved(_)))
    }
}

/// Work a task carries: polled in that task, still owned by its shelf, so that a flush can take
/// it back; dropped, it goes back to its shelf.
pub(crate) struct Carry(Arc<Shelf>);

impl Carry {
    fn poll(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = lock(&self.0.state);
        match std::mem::replace(
            &mut *state,
            State::Polling {
                woken: false,
                taken_back: false,
            },
        ) {
            State::Carried { work, .. } => {
                drop(state);
                self.0.poll(work, Some(cx.waker()))
            }
            // Taken back: no longer this carrier's.
            other => {
                *state = other;
                Poll::Ready(())
            }
        }
    }
}

impl Drop for Carry {
    fn drop(&mut self) {
        self.0.take_back();
    }
}

/// Where started work waits between its pollings.
struct Shelf {
    state: Mutex<State>,
    runtime: Handle,
    /// Where the work moves if `runtime` stops before it is done.
    homes: Homes,
    /// The task that started the work, the only one that may carry it.
    task: Option<tokio::task::Id>,
}

enum State {
    /// Being polled; whether it woke meanwhile, and whether a flush took it back from its
    /// carrier meanwhile (it is then not put back as carried).
    Polling { woken: bool, taken_back: bool },
    /// Waiting for a wake-up, which spawns it.
    Shelved(Work),
    /// Carried by a task: a wake-up wakes the carrier, and is remembered until it polls.
    Carried {
        work: Work,
        carrier: Waker,
        woken: bool,
    },
    /// Done, or spawned.
    Gone,
}

impl Shelf {
    /// Polls `work` (taken out of the state, now `Polling`) with the shelf's own waker, so
    /// every wake-up comes here first, then puts it back: shelved, or carried by `carrier`.
    /// A panic drops the work, as its own task would.
    fn poll(self: &Arc<Self>, mut work: Work, carrier: Option<&Waker>) -> Poll<()> {
        let waker = Waker::from(Arc::clone(self));
        let polled = catch_unwind(AssertUnwindSafe(|| {
            work.as_mut().poll(&mut Context::from_waker(&waker))
        }));
        let mut state = lock(&self.state);
        let (woken, taken_back) = match *state {
            State::Polling { woken, taken_back } => (woken, taken_back),
            _ => unreachable!("only its poller changes a polling state"),
        };
        let carrier = carrier.filter(|_| !taken_back);
        if !matches!(polled, Ok(Poll::Pending)) {
            *state = State::Gone;
            return Poll::Ready(());
        }
        match carrier {
            Some(carrier) => {
                *state = State::Carried {
                    work,
                    carrier: carrier.clone(),
                    woken,
                };
                drop(state);
                if woken {
                    carrier.wake_by_ref();
                }
            }
            None if woken => {
                // Nothing would wake it again.
                *state = State::Gone;
                drop(state);
                spawn(&self.runtime, &self.homes, work);
            }
            None => *state = State::Shelved(work),
        }
        Poll::Pending
    }

    /// Whether it is carried, or being polled (maybe by its carrier).
    fn carried(&self) -> bool {
        matches!(
            *lock(&self.state),
            State::Carried { .. } | State::Polling { .. }
        )
    }

    /// Takes carried work back from its carrier: shelved again, or spawned if it woke since it
    /// was last polled. Work being polled is taken back as its poll ends.
    fn take_back(&self) {
        let mut state = lock(&self.state);
        if let State::Polling { taken_back, .. } = &mut *state {
            *taken_back = true;
            return;
        }
        if !matches!(*state, State::Carried { .. }) {
            return;
        }
        let State::Carried { work, woken, .. } = std::mem::replace(&mut *state, State::Gone) else {
            unreachable!("matched as carried");
        };
        if woken {
            drop(state);
            spawn(&self.runtime, &self.homes, work);
        } else {
            *state = State::Shelved(work);
        }
    }
}

impl Wake for Shelf {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut state = lock(&self.state);
        match &mut *state {
            State::Polling { woken, .. } => *woken = true,
            State::Carried { carrier, woken, .. } => {
                *woken = true;
                let carrier = carrier.clone();
                drop(state);
                carrier.wake();
            }
            State::Shelved(_) => {
                let State::Shelved(work) = std::mem::replace(&mut *state, State::Gone) else {
                    unreachable!("matched as shelved");
                };
                drop(state);
                spawn(&self.runtime, &self.homes, work);
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
        let background = Background::default();
        background.homes.note(home.handle());
        let (done, finished) = tokio::sync::oneshot::channel();
        // Armed at the first poll, as the cluster client's response timeout is: it needs a
        // runtime there already.
        background.start(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            let _ = done.send(());
        });
        home.block_on(finished).expect("the work finished");
    }

    fn multi_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// Started on a runtime dropped before it woke, with a timer armed there: the work is
    /// spawned on its runtime as it wakes, dropped there at once, and finishes on the one
    /// still running instead.
    #[test]
    fn work_whose_runtime_stopped_finishes_on_one_still_running() {
        let (main, brief) = (multi_thread(), multi_thread());
        let background = main.block_on(async { Background::here() });
        let (go, went) = tokio::sync::oneshot::channel::<()>();
        let (done, finished) = tokio::sync::oneshot::channel();
        let parked = brief.block_on(async {
            background.start(async move {
                let _ = crate::coordinator::timer::timeout_at(
                    tokio::time::Instant::now() + Duration::from_secs(60),
                    went,
                )
                .await;
                let _ = done.send(());
            })
        });
        assert!(parked.shelved(), "nothing woke it yet");
        drop(brief);
        go.send(()).expect("the work waits");
        main.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), finished)
                .await
                .expect("within the deadline")
                .expect("woken, it ran to its end");
        });
    }

    /// An application whose work starts on two runtimes in turn: each keeps one watcher (one
    /// used to be spawned at every switch and never ended).
    #[test]
    fn runtimes_taking_turns_are_watched_once_each() {
        let (one, two) = (multi_thread(), multi_thread());
        let background = Background::default();
        for _ in 0..50 {
            background.homes.note(one.handle());
            background.homes.note(two.handle());
        }
        for runtime in [&one, &two] {
            assert_eq!(runtime.metrics().num_alive_tasks(), 1);
        }
    }

    #[tokio::test]
    async fn shelved_work_is_spawned_when_it_wakes() {
        let background = Background::here();
        let (go, went) = tokio::sync::oneshot::channel::<()>();
        let (done, finished) = tokio::sync::oneshot::channel();
        let parked = background.start(async move {
            let _ = went.await;
            let _ = done.send(());
        });
        assert!(parked.shelved(), "nothing woke it yet");
        go.send(()).expect("the work waits");
        tokio::time::timeout(Duration::from_secs(30), finished)
            .await
            .expect("within the deadline")
            .expect("woken, it ran to its end");
        assert!(!parked.shelved());
    }

    #[tokio::test]
    async fn work_that_wakes_in_its_first_poll_is_spawned() {
        let background = Background::here();
        let (done, finished) = tokio::sync::oneshot::channel();
        let parked = background.start(async move {
            // Wakes itself at once, as a yield outside tokio's scheduler would.
            let mut woke = false;
            std::future::poll_fn(|cx| {
                if std::mem::replace(&mut woke, true) {
                    return std::task::Poll::Ready(());
                }
                cx.waker().wake_by_ref();
                std::task::Poll::Pending
            })
            .await;
            let _ = done.send(());
        });
        assert!(!parked.shelved(), "spawned at once");
        tokio::time::timeout(Duration::from_secs(30), finished)
            .await
            .expect("within the deadline")
            .expect("its own wake-up was not lost");
    }

    #[tokio::test]
    async fn carried_work_left_unfinished_goes_back_to_its_shelf() {
        let background = Background::here();
        let (go, went) = tokio::sync::oneshot::channel::<()>();
        let (done, finished) = tokio::sync::oneshot::channel();
        let carrier = background.clone();
        tokio::spawn(async move {
            let parked = carrier.start(async move {
                let _ = went.await;
                let _ = done.send(());
            });
            let carry = parked.adopt().expect("its own task carries it");
            assert!(parked.adopt().is_none(), "adopted once");
            // The carrier ends first: the work must still finish, on its own.
            carrier.alongside(async {}, vec![carry]).await;
            assert!(parked.shelved(), "back on its shelf");
        })
        .await
        .expect("the carrier");
        go.send(()).expect("the work waits");
        tokio::time::timeout(Duration::from_secs(30), finished)
            .await
            .expect("within the deadline")
            .expect("finished in the background");
        background.flush(Duration::from_secs(5)).await;
        assert!(background.tracker.is_empty());
    }

    #[tokio::test]
    async fn only_the_task_that_started_work_may_carry_it() {
        let background = Background::here();
        let parked = tokio::spawn({
            let background = background.clone();
            async move { background.start(std::future::pending()) }
        })
        .await
        .expect("the starter");
        assert!(parked.shelved());
        let stranger = tokio::spawn(async move { parked.adopt().is_none() });
        assert!(stranger.await.expect("the stranger"));
    }

    #[tokio::test]
    async fn a_flush_takes_carried_work_back_from_a_carrier_that_stopped_polling() {
        let background = Background::here();
        let (go, went) = tokio::sync::oneshot::channel::<()>();
        let carrier = background.clone();
        let (carrying, carried) = tokio::sync::oneshot::channel();
        // A carrier polled once, then held and never polled again.
        let _held = tokio::spawn(async move {
            let parked = carrier.start(async move {
                let _ = went.await;
            });
            let carry = parked.adopt().expect("its own task carries it");
            let mut stalled =
                Box::pin(carrier.alongside(std::future::pending::<()>(), vec![carry]));
            let _ = futures_poll_once(stalled.as_mut()).await;
            let _ = carrying.send(());
            std::future::pending::<()>().await;
            drop(stalled);
        });
        carried.await.expect("carried");
        go.send(()).expect("the work waits");
        background.flush(Duration::from_secs(30)).await;
        assert!(background.tracker.is_empty(), "taken back, it finished");
    }

    /// The flush comes while the carrier is inside its poll of the work: it is taken back as
    /// that poll ends, not left carried by a carrier that then stops polling.
    #[tokio::test(flavor = "multi_thread", worker_threads = 3)]
    async fn a_flush_during_a_carriers_poll_still_takes_the_work_back() {
        use std::sync::mpsc;
        let background = Background::here();
        let (go, mut went) = tokio::sync::oneshot::channel::<()>();
        let (in_poll, polling) = mpsc::channel::<()>();
        let (resume, resumed) = mpsc::channel::<()>();
        let resumed = Mutex::new(resumed);
        let carrier = background.clone();
        let (handle, parked) = tokio::sync::oneshot::channel();
        let _held = tokio::spawn(async move {
            let mut polls = 0;
            let parked = carrier.start(poll_fn(move |cx| {
                polls += 1;
                if polls == 2 {
                    let _ = in_poll.send(());
                    let _ = lock(&resumed).recv();
                }
                Pin::new(&mut went).poll(cx).map(|_| ())
            }));
            let carry = parked.adopt().expect("its own task carries it");
            let _ = handle.send(parked);
            let mut stalled =
                Box::pin(carrier.alongside(std::future::pending::<()>(), vec![carry]));
            let _ = futures_poll_once(stalled.as_mut()).await;
            std::future::pending::<()>().await;
            drop(stalled);
        });
        let parked = parked.await.expect("the carrier's handle");
        tokio::task::spawn_blocking(move || polling.recv())
            .await
            .expect("the waiter")
            .expect("the carrier polls");
        let mut flush = Box::pin(background.flush(Duration::from_secs(30)));
        assert!(futures_poll_once(flush.as_mut()).await.is_pending());
        resume.send(()).expect("the carrier waits");
        // Its poll over, the work would be carried again by a carrier that no longer polls.
        let shelf = parked.0.clone().expect("shelved work");
        tokio::time::timeout(Duration::from_secs(30), async {
            while matches!(*lock(&shelf.state), State::Polling { .. }) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the carrier's poll ended");
        go.send(()).expect("the work waits");
        flush.await;
        assert!(background.tracker.is_empty(), "taken back, it finished");
    }

    /// Links of a chain that end in their first poll, each handing on to the next (a lane's
    /// backlog failing at once): how deep they nested, and how many ran.
    #[derive(Clone, Default)]
    struct Chain {
        deepest: Arc<AtomicUsize>,
        ran: Arc<AtomicUsize>,
    }

    thread_local! {
        /// How many links of a chain are being polled on this thread, one inside the other.
        static LINKS_POLLED: Cell<usize> = const { Cell::new(0) };
    }

    impl Chain {
        fn link(&self, background: Background, left: usize) -> Work {
            let chain = self.clone();
            Box::pin(async move {
                let depth = LINKS_POLLED.get() + 1;
                LINKS_POLLED.set(depth);
                chain.deepest.fetch_max(depth, Ordering::SeqCst);
                chain.ran.fetch_add(1, Ordering::SeqCst);
                if left > 0 {
                    background.hand_on(chain.link(background.clone(), left - 1));
                }
                LINKS_POLLED.set(depth - 1);
            })
        }
    }

    /// Each link starts once the one before has returned, not inside it: the stack does not
    /// grow with the chain.
    #[tokio::test]
    async fn work_handed_on_starts_after_the_work_that_handed_it_on() {
        let background = Background::here();
        let chain = Chain::default();
        background.hand_on(chain.link(background.clone(), 99));
        assert_eq!(chain.ran.load(Ordering::SeqCst), 100, "every link, by now");
        assert_eq!(
            chain.deepest.load(Ordering::SeqCst),
            1,
            "none inside another"
        );
        assert!(background.tracker.is_empty());
    }

    /// Polls `future` once.
    async fn futures_poll_once<F: Future + Unpin>(mut future: F) -> Poll<F::Output> {
        poll_fn(|cx| Poll::Ready(Pin::new(&mut future).poll(cx))).await
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
