//! In-process wake-ups for tasks waiting on a distributed slot: when this process releases a
//! lease, its own waiters for that identity retry at once instead of at their next poll.
//!
//! Waiters also say their class ([`Waiting`]): a freed slot is for the highest class waiting
//! in this process, so a waiter of a lower class holds back its retries while a higher one
//! waits for the same identity.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;
use tokio::time::Instant;

use crate::identity::KeyBase;
use crate::priority::Priority;
use crate::sync::lock;

#[derive(Debug, Default)]
pub(super) struct Wakeups {
    waiting: Mutex<HashMap<KeyBase, Arc<Notify>>>,
    /// How many identities have waiters; lets a release skip the lock when nobody waits.
    keys: AtomicUsize,
    /// How many calls of each class (indexed as [`Priority::ALL`]) wait per identity; an
    /// identity nobody waits for has no entry.
    classes: Mutex<HashMap<KeyBase, [usize; Priority::ALL.len()]>>,
}

/// Where `priority` is in [`Priority::ALL`] (lowest first).
fn rank(priority: Priority) -> usize {
    Priority::ALL
        .iter()
        .position(|&class| class == priority)
        .unwrap_or(0)
}

impl Wakeups {
    /// A future completing on the next [`wake`](Self::wake) of `key`. It is registered from the
    /// start, so a wake-up between this call and the first poll is not lost.
    pub(super) fn released<'a>(&'a self, key: &KeyBase) -> Released<'a> {
        let notify: Arc<Notify> =
            Arc::clone(lock(&self.waiting).entry(key.clone()).or_insert_with(|| {
                self.keys.fetch_add(1, Ordering::Relaxed);
                Arc::default()
            }));
        let mut notified = Box::pin(notify.notified_owned());
        notified.as_mut().enable();
        Released {
            wakeups: self,
            key: key.clone(),
            notified: Some(notified),
        }
    }

    /// Counts a call of `priority` as waiting for a slot of `key` until the guard is dropped.
    pub(super) fn waiting(&self, key: &KeyBase, priority: Priority) -> Waiting<'_> {
        lock(&self.classes).entry(key.clone()).or_default()[rank(priority)] += 1;
        Waiting {
            wakeups: self,
            key: key.clone(),
            rank: rank(priority),
        }
    }

    /// Whether a call waits for a slot of `key` in this process.
    pub(super) fn anyone_waits(&self, key: &KeyBase) -> bool {
        lock(&self.classes).contains_key(key)
    }

    pub(super) fn wake(&self, key: &KeyBase) {
        if self.keys.load(Ordering::Relaxed) == 0 {
            return;
        }
        if let Some(notify) = lock(&self.waiting).get(key) {
            notify.notify_waiters();
        }
    }
}

/// See [`Wakeups::released`]. Dropping the last one for an identity forgets the identity.
pub(crate) struct Released<'a> {
    wakeups: &'a Wakeups,
    key: KeyBase,
    notified: Option<Pin<Box<OwnedNotified>>>,
}

impl Future for Released<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.notified.as_mut() {
            Some(notified) => notified.as_mut().poll(cx),
            None => Poll::Ready(()),
        }
    }
}

impl Drop for Released<'_> {
    fn drop(&mut self) {
        let mut waiting = lock(&self.wakeups.waiting);
        // This waiter's reference goes under the lock, where others are taken: if the map's
        // is then the last one, nobody else waits for this key.
        self.notified = None;
        if waiting
            .get(&self.key)
            .is_some_and(|notify| Arc::strong_count(notify) == 1)
        {
            waiting.remove(&self.key);
            self.wakeups.keys.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A call waiting for a slot of its identity, as its class; see [`Wakeups::waiting`]. Dropped
/// (admitted, or given up), it wakes the waiters of its identity if a lower class waits.
pub(crate) struct Waiting<'a> {
    wakeups: &'a Wakeups,
    key: KeyBase,
    rank: usize,
}

impl Waiting<'_> {
    /// Whether a call of a higher class waits for the same identity in this process.
    fn outranked(&self) -> bool {
        lock(&self.wakeups.classes)
            .get(&self.key)
            .is_some_and(|counts| counts[self.rank + 1..].iter().any(|&n| n > 0))
    }

    /// Waits while a higher class waits here, until `give_up`: whether the call may try again
    /// (no higher class waits), or must give up (one still does at `give_up`).
    pub(crate) async fn outranked_until(&self, give_up: Instant) -> bool {
        loop {
            // Registered before the check, so a higher waiter leaving in between is not missed.
            let released = self.wakeups.released(&self.key);
            if !self.outranked() {
                return true;
            }
            if tokio::time::timeout_at(give_up, released).await.is_err() {
                return false;
            }
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let held_back = {
            let mut classes = lock(&self.wakeups.classes);
            let Some(counts) = classes.get_mut(&self.key) else {
                return;
            };
            counts[self.rank] -= 1;
            let held_back = counts[..self.rank].iter().any(|&n| n > 0);
            if counts.iter().all(|&n| n == 0) {
                classes.remove(&self.key);
            }
            held_back
        };
        // Only a lower class may have been held back: waking the others would only make them
        // retry for nothing.
        if held_back {
            self.wakeups.wake(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{PolicyKind, Scope};

    fn key(scope: &str) -> KeyBase {
        let scope = Scope::new(scope.to_owned()).expect("scope");
        KeyBase::derive("ns", PolicyKind::Bulkhead, "p", "op", &scope)
    }

    #[tokio::test]
    async fn waiters_dropped_together_forget_their_key() {
        let wakeups = Wakeups::default();
        let first = wakeups.released(&key("a"));
        let second = wakeups.released(&key("a"));
        drop(first);
        drop(second);
        assert!(lock(&wakeups.waiting).is_empty());
        assert_eq!(wakeups.keys.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_wake_reaches_only_waiters_of_that_key() {
        let wakeups = Wakeups::default();
        let a = wakeups.released(&key("a"));
        let b = wakeups.released(&key("b"));
        wakeups.wake(&key("a"));
        a.await;
        let b_done = tokio::time::timeout(std::time::Duration::from_millis(20), b).await;
        assert!(b_done.is_err());
        assert!(lock(&wakeups.waiting).is_empty());
        assert_eq!(wakeups.keys.load(Ordering::Relaxed), 0);
    }

    /// A waiter is held back while a higher class waits for its key (not another key's), and
    /// let go when that one stops waiting.
    #[tokio::test(start_paused = true)]
    async fn a_lower_class_waits_until_no_higher_one_does() {
        let wakeups = Wakeups::default();
        let give_up = Instant::now() + std::time::Duration::from_secs(1);
        let sheddable = wakeups.waiting(&key("a"), Priority::Sheddable);
        let critical = wakeups.waiting(&key("a"), Priority::Critical);
        let _elsewhere = wakeups.waiting(&key("b"), Priority::Critical);
        assert!(critical.outranked_until(give_up).await, "nobody above");
        assert!(!sheddable.outranked_until(give_up).await, "gave up");
        let normal = wakeups.waiting(&key("a"), Priority::Normal);
        let until = Instant::now() + std::time::Duration::from_secs(1);
        let (let_go, ()) = tokio::join!(normal.outranked_until(until), async move {
            tokio::task::yield_now().await;
            drop(critical);
        });
        assert!(let_go, "let go before its deadline");
        assert!(Instant::now() < until);
        drop((normal, sheddable));
        assert_eq!(lock(&wakeups.classes).len(), 1, "b's only");
    }
}
