//! In-process wake-ups for tasks waiting on a distributed slot: when this process releases a
//! lease, its own waiters for that identity retry at once instead of at their next poll.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

use crate::identity::KeyBase;
use crate::sync::lock;

#[derive(Debug, Default)]
pub(super) struct Wakeups {
    waiting: Mutex<HashMap<KeyBase, Arc<Notify>>>,
    /// How many identities have waiters; lets a release skip the lock when nobody waits.
    keys: AtomicUsize,
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
}
