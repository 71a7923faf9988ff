//! Timers for background work, which may move between runtimes.
//!
//! Background work whose runtime shuts down before it is done moves to a runtime still running
//! (see [`background`](super::background)). A tokio timer belongs to the runtime it was first
//! polled on, and panics when polled after that runtime stopped: the timers here are armed
//! again, for the same instant, whenever they are polled on another runtime.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::task::{Context, Poll};

use tokio::runtime::{self, Handle};
use tokio::time::{Instant, Sleep};

/// Ends at `deadline`, on whichever runtime polls it.
#[derive(Debug)]
pub(crate) struct Timer {
    deadline: Instant,
    /// The runtime the timer is armed on, and the timer.
    armed: Option<(runtime::Id, Pin<Box<Sleep>>)>,
}

/// A timer ending at `deadline`.
pub(crate) fn sleep_until(deadline: Instant) -> Timer {
    Timer {
        deadline,
        armed: None,
    }
}

impl Future for Timer {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // Outside any runtime tokio's own timer would panic as well.
        let here = Handle::current().id();
        let deadline = self.deadline;
        let sleep = match &mut self.armed {
            Some((armed_on, sleep)) if *armed_on == here => sleep,
            armed => {
                &mut armed
                    .insert((here, Box::pin(tokio::time::sleep_until(deadline))))
                    .1
            }
        };
        sleep.as_mut().poll(cx)
    }
}

/// `future`'s output, or `None` if `deadline` came first.
pub(crate) async fn timeout_at<F: Future>(deadline: Instant, future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    let mut timer = sleep_until(deadline);
    poll_fn(|cx| {
        if let Poll::Ready(output) = future.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        Pin::new(&mut timer).poll(cx).map(|()| None)
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// First polled on a runtime that is then dropped, the timer still ends on the next
    /// (tokio's own panics there: "A Tokio 1.x context was found, but it is being shutdown").
    #[test]
    fn a_timer_polled_after_its_runtime_stopped_ends_on_the_next() {
        let first = runtime();
        let mut timer = sleep_until(Instant::now() + Duration::from_millis(20));
        first.block_on(async { assert!(futures_poll(&mut timer).is_pending()) });
        drop(first);
        runtime().block_on(async {
            tokio::time::timeout(Duration::from_secs(30), &mut timer)
                .await
                .expect("the timer ended");
        });
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_ends_at_its_deadline_or_with_its_future() {
        let deadline = Instant::now() + Duration::from_secs(5);
        assert_eq!(
            timeout_at(deadline, std::future::pending::<()>()).await,
            None
        );
        assert_eq!(Instant::now(), deadline);
        assert_eq!(timeout_at(deadline, async { 7 }).await, Some(7));
    }

    fn futures_poll(timer: &mut Timer) -> Poll<()> {
        Pin::new(timer).poll(&mut Context::from_waker(std::task::Waker::noop()))
    }
}
