//! Attributes in the forms added after literals on plain `async fn`s, run against the
//! in-memory coordinator: constant arguments take effect as their values, and methods of
//! `#[async_trait]` impls are guarded like any other.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::common::{TestError, code, unique};
use async_trait::async_trait;
use caracal::{Coordinator, bulkhead, fallback, rate_limit, retry};
use tokio::sync::Notify;

const PARTNER: &str = "partner-api";
const ONE_AT_A_TIME: u32 = 1;
const TWO_AT_A_TIME: u32 = 2;

#[bulkhead(name = PARTNER, limit = TWO_AT_A_TIME - 1, scope = scope)]
async fn hold(scope: &str, entered: &Notify, release: &Notify) -> Result<(), TestError> {
    entered.notify_one();
    release.notified().await;
    Ok(())
}

#[tokio::test]
async fn constant_arguments_take_effect() {
    let scope = unique("constants");
    let (entered, release) = (Notify::new(), Notify::new());
    let (first, second) = Coordinator::in_memory()
        .scoped(async {
            tokio::join!(hold(&scope, &entered, &release), async {
                entered.notified().await;
                let second = hold(&scope, &entered, &release).await;
                release.notify_one();
                second
            })
        })
        .await;
    assert!(first.is_ok());
    match second {
        Err(TestError::Caracal(caracal::Error::BulkheadFull { policy, limit, .. })) => {
            assert_eq!((policy, limit), (PARTNER, 1));
        }
        other => panic!("expected a full bulkhead, got {other:?}"),
    }
}

const ATTEMPTS: u32 = 2 + 1;
const RATE: f64 = 0.0005;

#[retry(max_attempts = ATTEMPTS)]
async fn always_fails(attempts: &AtomicU32) -> Result<(), TestError> {
    attempts.fetch_add(1, Ordering::SeqCst);
    Err(TestError::Body("failed"))
}

#[rate_limit(rate = RATE * 2, burst = ONE_AT_A_TIME, scope = scope)]
async fn limited(scope: &str) -> Result<(), TestError> {
    Ok(())
}

#[tokio::test]
async fn constant_counts_and_rates_take_effect() {
    let attempts = AtomicU32::new(0);
    assert_eq!(code(&always_fails(&attempts).await), "body");
    assert_eq!(attempts.load(Ordering::SeqCst), 3);

    let scope = unique("rate");
    Coordinator::in_memory()
        .scoped(async {
            assert_eq!(code(&limited(&scope).await), "ok");
            match limited(&scope).await {
                Err(TestError::Caracal(caracal::Error::RateLimited { retry_after, .. })) => {
                    // One admission every 1000 s: the next is most of that away.
                    assert!(retry_after.as_secs() > 900, "{retry_after:?}");
                }
                other => panic!("expected a rate limit, got {other:?}"),
            }
        })
        .await;
}

#[async_trait]
trait Partner {
    async fn get(&self, id: u64, entered: &Notify, release: &Notify) -> Result<u64, TestError>;
    async fn put(&mut self, id: u64) -> Result<u64, TestError>;
}

struct Client {
    tenant: String,
    attempts: u32,
}

#[async_trait]
impl Partner for Client {
    #[fallback(Self::cached)]
    #[bulkhead(limit = 1, scope = &self.tenant)]
    async fn get(&self, id: u64, entered: &Notify, release: &Notify) -> Result<u64, TestError> {
        entered.notify_one();
        release.notified().await;
        Ok(id)
    }

    #[retry(max_attempts = 3)]
    #[bulkhead(limit = 1, scope = &self.tenant)]
    async fn put(&mut self, id: u64) -> Result<u64, TestError> {
        self.attempts += 1;
        if self.attempts < 3 {
            return Err(TestError::Body("flaky"));
        }
        Ok(id + u64::from(self.attempts))
    }
}

impl Client {
    async fn cached(
        &self,
        id: u64,
        _: &Notify,
        _: &Notify,
        rejection: caracal::Error,
    ) -> Result<u64, TestError> {
        assert_eq!(rejection.code(), "bulkhead_full");
        Ok(id * 100)
    }
}

#[tokio::test]
async fn async_trait_methods_are_guarded() {
    let client = Client {
        tenant: unique("tenant"),
        attempts: 0,
    };
    let (entered, release) = (Notify::new(), Notify::new());
    let coordinator = Coordinator::in_memory();
    let (first, second) = coordinator
        .scoped(async {
            tokio::join!(client.get(1, &entered, &release), async {
                entered.notified().await;
                let second = client.get(2, &entered, &release).await;
                release.notify_one();
                second
            })
        })
        .await;
    assert_eq!(first.ok(), Some(1));
    assert_eq!(second.ok(), Some(200), "the full bulkhead was answered");

    let mut client = client;
    let result = coordinator.scoped(client.put(7)).await;
    assert_eq!(result.ok(), Some(10), "succeeded on the third attempt");
    assert_eq!(client.attempts, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_trait_futures_stay_send() {
    let client = std::sync::Arc::new(Client {
        tenant: unique("send"),
        attempts: 0,
    });
    let coordinator = Coordinator::in_memory();
    let task = tokio::spawn(coordinator.scoped(async move {
        let (entered, release) = (Notify::new(), Notify::new());
        release.notify_one();
        client.get(5, &entered, &release).await
    }));
    assert_eq!(task.await.expect("task").ok(), Some(5));
}
