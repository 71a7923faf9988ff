//! Lanes: the order and the batching of one identity's commands.
//!
//! Every command about an identity goes out on the same pooled connection (chosen by the
//! identity's key), and a connection keeps order: so a release sent before an acquire is
//! applied before it, whichever tasks sent them.
//!
//! While a script call for an identity is in flight, further calls of the same kind queue in
//! the identity's lane; when it is answered, everything queued goes out as **one** script call
//! (one `TIME`, one count, N tokens), each caller answered on its own. A lone caller still goes
//! out at once and pays one round trip: nothing ever waits on a timer. Plain commands sent
//! until a deadline batch and go out ahead of the next script call of their identity in
//! [`until`](super::until), not here.
//!
//! A caller may give up at any moment (cancellation is normal). While its request waits in the
//! lane, giving up withdraws it: it is never sent. Once sent, it runs; what it was granted
//! after its caller left is undone when the reply arrives, if its kernel says how.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use crate::coordinator::background::Background;
use crate::error::Error;
use crate::identity::KeyBase;
use crate::sync::lock;

/// The most requests one script call carries: a script blocks the server while it runs, so
/// a backlog of thousands goes out as several calls, the oldest first.
pub(super) const MAX_BATCH: usize = 256;

/// A request that can share one script call with others of its lane.
pub(super) trait Request: Send + 'static {
    type Reply: Send + 'static;

    /// Whether the two can go out in one call (they carry the same settings).
    fn batches_with(&self, other: &Self) -> bool;
}

/// One queued request and where its answer goes.
pub(super) struct Queued<R: Request> {
    pub(super) request: R,
    pub(super) answer: oneshot::Sender<Result<R::Reply, Error>>,
}

/// A lane for one kind of request: whether a call is in flight, and what waits for it.
pub(super) struct Lane<R: Request> {
    busy: bool,
    waiting: Vec<Queued<R>>,
}

impl<R: Request> Default for Lane<R> {
    fn default() -> Self {
        Lane {
            busy: false,
            waiting: Vec::new(),
        }
    }
}

/// The lanes of one kind of request, by identity.
pub(super) struct Lanes<R: Request> {
    lanes: Mutex<HashMap<KeyBase, Lane<R>>>,
}

impl<R: Request> Default for Lanes<R> {
    fn default() -> Self {
        Lanes {
            lanes: Mutex::default(),
        }
    }
}

/// What to do with a request: send it now as a batch of its own (the lane was idle), or wait.
pub(super) enum Admitted<R: Request> {
    Send(Vec<Queued<R>>),
    Wait,
}

impl<R: Request> Lanes<R> {
    /// Enters `queued` in `key`'s lane: it goes out now if the lane is idle, else with the
    /// next batch.
    pub(super) fn enter(&self, key: &KeyBase, queued: Queued<R>) -> Admitted<R> {
        let mut lanes = lock(&self.lanes);
        let lane = lanes.entry(key.clone()).or_default();
        if lane.busy {
            lane.waiting.push(queued);
            Admitted::Wait
        } else {
            lane.busy = true;
            Admitted::Send(vec![queued])
        }
    }

    /// After a call of `key`'s lane was answered: the next batch (the oldest waiting request
    /// and every other that can go with it), or `None` when the lane is idle again.
    /// Requests whose callers have given up are dropped here, unsent: one sent now would act
    /// for nobody (take a lease after the caller's release already ran, charge a rate).
    pub(super) fn next(&self, key: &KeyBase) -> Option<Vec<Queued<R>>> {
        let mut lanes = lock(&self.lanes);
        let lane = lanes.get_mut(key)?;
        lane.waiting.retain(|queued| !queued.answer.is_closed());
        if lane.waiting.is_empty() {
            lanes.remove(key);
            return None;
        }
        // One pass in arrival order, so what stays keeps its place: the oldest request left,
        // whatever its settings, leads the next batch.
        let mut waiting = std::mem::take(&mut lane.waiting).into_iter();
        let mut batch = Vec::from_iter(waiting.next());
        for queued in waiting {
            if batch.len() < MAX_BATCH && queued.request.batches_with(&batch[0].request) {
                batch.push(queued);
            } else {
                lane.waiting.push(queued);
            }
        }
        Some(batch)
    }
}

/// Hands each queued request its own answer; a failed call fails every one of them. Returns
/// the requests whose callers stopped listening before their answer came, with the answer
/// they missed: what it granted is nobody's now.
pub(super) fn answer<R: Request>(
    batch: Vec<Queued<R>>,
    replies: Result<Vec<R::Reply>, Error>,
) -> Vec<(R, R::Reply)> {
    match replies {
        Ok(replies) => batch
            .into_iter()
            .zip(replies)
            .filter_map(|(queued, reply)| {
                let unheard = queued.answer.send(Ok(reply)).err()?;
                Some((queued.request, unheard.ok()?))
            })
            .collect(),
        Err(error) => {
            for queued in batch {
                let _ = queued.answer.send(Err(error.clone()));
            }
            Vec::new()
        }
    }
}

/// A batch being driven by the caller that started it. Dropped before it is done (the caller
/// was cancelled), it finishes in the background: the callers queued behind it must still be
/// answered and the lane moved on.
pub(super) struct Driven {
    batch: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    background: Background,
}

impl Driven {
    pub(super) fn new(
        batch: impl Future<Output = ()> + Send + 'static,
        background: &Background,
    ) -> Self {
        Driven {
            batch: Some(Box::pin(batch)),
            background: background.clone(),
        }
    }
}

impl Future for Driven {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(batch) = self.batch.as_mut() else {
            return Poll::Ready(());
        };
        let done = batch.as_mut().poll(cx);
        if done.is_ready() {
            self.batch = None;
        }
        done
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        if let Some(batch) = self.batch.take() {
            self.background.start(batch);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request by its number; those with the same settings (the second field) batch.
    struct Ask(u32, u8);

    impl Request for Ask {
        type Reply = u32;

        fn batches_with(&self, other: &Self) -> bool {
            self.1 == other.1
        }
    }

    fn queued(n: u32) -> (Queued<Ask>, oneshot::Receiver<Result<u32, Error>>) {
        queued_with(n, 0)
    }

    fn queued_with(n: u32, settings: u8) -> (Queued<Ask>, oneshot::Receiver<Result<u32, Error>>) {
        let (answer, answered) = oneshot::channel();
        (
            Queued {
                request: Ask(n, settings),
                answer,
            },
            answered,
        )
    }

    fn numbers(batch: &[Queued<Ask>]) -> Vec<u32> {
        batch.iter().map(|queued| queued.request.0).collect()
    }

    #[test]
    fn a_waiter_that_gave_up_is_never_sent() {
        let lanes = Lanes::default();
        let key = KeyBase::from_tag(&"a".repeat(64)).expect("a tag");
        let (driver, _driver) = queued(0);
        assert!(matches!(lanes.enter(&key, driver), Admitted::Send(_)));
        let (gone, gone_answer) = queued(1);
        let (waiting, _waiting) = queued(2);
        assert!(matches!(lanes.enter(&key, gone), Admitted::Wait));
        assert!(matches!(lanes.enter(&key, waiting), Admitted::Wait));
        drop(gone_answer);
        assert_eq!(lanes.next(&key).map(|batch| numbers(&batch)), Some(vec![2]));

        let (gone, gone_answer) = queued(3);
        assert!(matches!(lanes.enter(&key, gone), Admitted::Wait));
        drop(gone_answer);
        assert!(lanes.next(&key).is_none(), "nothing is left to send");
        let (next, _next) = queued(4);
        assert!(
            matches!(lanes.enter(&key, next), Admitted::Send(_)),
            "the lane is idle again"
        );
    }

    #[test]
    fn a_backlog_goes_out_in_bounded_batches_oldest_first() {
        let lanes = Lanes::default();
        let key = KeyBase::from_tag(&"b".repeat(64)).expect("a tag");
        let (driver, _driver) = queued(0);
        assert!(matches!(lanes.enter(&key, driver), Admitted::Send(_)));
        let total = u32::try_from(MAX_BATCH * 2 + 1).expect("small");
        let mut listening = Vec::new();
        for n in 1..=total {
            let (waiting, answer) = queued(n);
            listening.push(answer);
            assert!(matches!(lanes.enter(&key, waiting), Admitted::Wait));
        }
        let mut sent = Vec::new();
        while let Some(batch) = lanes.next(&key) {
            assert!(batch.len() <= MAX_BATCH, "a batch of {}", batch.len());
            sent.extend(numbers(&batch));
        }
        assert_eq!(sent, (1..=total).collect::<Vec<_>>());
    }

    /// A request with other settings behind a backlog larger than a batch still goes out
    /// once the requests that came before it have: batches start with the oldest request.
    #[test]
    fn a_request_with_other_settings_is_not_starved_by_a_backlog() {
        let lanes = Lanes::default();
        let key = KeyBase::from_tag(&"c".repeat(64)).expect("a tag");
        let (driver, _driver) = queued(0);
        assert!(matches!(lanes.enter(&key, driver), Admitted::Send(_)));
        let backlog = u32::try_from(MAX_BATCH + 44).expect("small");
        let mut listening = Vec::new();
        let mut enter = |n: u32, settings: u8| {
            let (waiting, answer) = queued_with(n, settings);
            listening.push(answer);
            assert!(matches!(lanes.enter(&key, waiting), Admitted::Wait));
        };
        for n in 1..=backlog {
            enter(n, 0);
        }
        enter(backlog + 1, 1);
        for n in backlog + 2..=backlog * 3 {
            enter(n, 0);
        }
        let mut batches = Vec::new();
        while let Some(batch) = lanes.next(&key) {
            batches.push(numbers(&batch));
        }
        let other = batches
            .iter()
            .position(|batch| batch == &[backlog + 1])
            .expect("the request with other settings went out on its own");
        assert_eq!(
            other, 2,
            "after the two batches holding what came before it"
        );
        let mut sent: Vec<u32> = batches.concat();
        sent.sort_unstable();
        assert_eq!(
            sent,
            (1..=backlog * 3).collect::<Vec<_>>(),
            "every request once"
        );
    }

    #[test]
    fn answers_nobody_heard_are_handed_back() {
        let (heard, mut heard_answer) = queued(1);
        let (unheard, unheard_answer) = queued(2);
        drop(unheard_answer);
        let missed = answer(vec![heard, unheard], Ok(vec![10, 20]));
        assert_eq!(
            missed
                .iter()
                .map(|(ask, reply)| (ask.0, *reply))
                .collect::<Vec<_>>(),
            [(2, 20)]
        );
        assert_eq!(heard_answer.try_recv().expect("answered").ok(), Some(10));
    }
}
