//! Policy-level checks that need paused time or internals; the behaviour shared by every
//! backend is exercised against memory, Redis and a cluster in the `caracal-tests` suites.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::*;
use crate::__private::{global_scope, static_scope};
use crate::Coordinator;

const LEASE: Duration = Duration::from_secs(3);

static DISTRIBUTED: BulkheadSite = BulkheadSite::new(BulkheadConfig {
    name: "unit",
    operation: "unit",
    limit: 1,
    lease: LEASE,
    max_wait: None,
    local: false,
});

static WAITING: BulkheadSite = BulkheadSite::new(BulkheadConfig {
    name: "unit-wait",
    operation: "unit-wait",
    limit: 1,
    lease: LEASE,
    max_wait: Some(Duration::from_secs(10)),
    local: false,
});

static LOCAL_FIFO: BulkheadSite = BulkheadSite::new(BulkheadConfig {
    name: "unit-fifo",
    operation: "unit-fifo",
    limit: 1,
    lease: LEASE,
    max_wait: Some(Duration::from_secs(10)),
    local: true,
});

async fn guarded<F, T>(site: &'static BulkheadSite, body: F) -> Result<T, Error>
where
    F: Future<Output = Result<T, Error>>,
{
    bulkhead(site, &CallCtx::new(), &global_scope(), body).await
}

/// Drops to `true` when the body's future is dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn renewals_keep_a_long_body_admitted() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            let long = guarded(&DISTRIBUTED, async {
                tokio::time::sleep(LEASE * 5).await;
                Ok(())
            });
            let result = long.await;
            assert!(result.is_ok(), "{result:?}");
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_lease_that_cannot_be_renewed_cancels_the_body() {
    let coordinator = Coordinator::in_memory();
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = DropFlag(Arc::clone(&dropped));
    let started = tokio::time::Instant::now();
    let result = coordinator
        .scoped(async {
            guarded(&DISTRIBUTED, async {
                let _flag = flag;
                // Renewals start failing from here on; the body would outlive the lease.
                coordinator.shutdown().await;
                tokio::time::sleep(LEASE * 10).await;
                Ok(())
            })
            .await
        })
        .await;
    assert!(matches!(result, Err(Error::LeaseLost { .. })), "{result:?}");
    assert!(dropped.load(Ordering::SeqCst), "the body was dropped");
    // Lost at the deadline (renewals were retried until then), not at the first failure.
    let elapsed = started.elapsed();
    assert!(
        elapsed >= LEASE && elapsed < LEASE + Duration::from_millis(100),
        "{elapsed:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_admitted_as_soon_as_the_holder_releases() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            let (release, released) = tokio::sync::oneshot::channel::<()>();
            let holder = guarded(&WAITING, async {
                let _ = released.await;
                Ok(tokio::time::Instant::now())
            });
            let waiter = async {
                tokio::task::yield_now().await;
                guarded(&WAITING, async { Ok(tokio::time::Instant::now()) }).await
            };
            // Released once the waiter has backed off to its longest pause.
            let releaser = async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let _ = release.send(());
            };
            let (held_until, admitted_at, ()) = tokio::join!(holder, waiter, releaser);
            let (held_until, admitted_at) =
                (held_until.expect("holder"), admitted_at.expect("waiter"));
            assert!(admitted_at >= held_until);
            assert!(admitted_at - held_until < Duration::from_millis(5));
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn local_waiters_are_served_in_arrival_order() {
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let holder = tokio::spawn(guarded(&LOCAL_FIFO, async {
        let _ = released.await;
        Ok(())
    }));
    tokio::task::yield_now().await;
    let mut waiters = Vec::new();
    for i in 0..3 {
        let order = Arc::clone(&order);
        waiters.push(tokio::spawn(guarded(&LOCAL_FIFO, async move {
            order.lock().expect("order").push(i);
            Ok(())
        })));
        tokio::task::yield_now().await;
    }
    let _ = release.send(());
    holder.await.expect("holder").expect("admitted");
    for waiter in waiters {
        waiter.await.expect("waiter").expect("admitted");
    }
    assert_eq!(*order.lock().expect("order"), [0, 1, 2]);
}

#[tokio::test]
async fn without_a_coordinator_a_distributed_bulkhead_refuses() {
    let result = guarded(&DISTRIBUTED, async { Ok(()) }).await;
    assert!(matches!(result, Err(Error::NotInstalled)), "{result:?}");
}

#[tokio::test]
async fn a_rejection_names_the_policy_and_scope() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            let (release, released) = tokio::sync::oneshot::channel::<()>();
            let scope = static_scope("tenant-7");
            let ctx = CallCtx::new();
            let holder = bulkhead(&DISTRIBUTED, &ctx, &scope, async {
                let _ = released.await;
                Ok::<_, Error>(())
            });
            let rejected = async {
                tokio::task::yield_now().await;
                let result =
                    bulkhead(&DISTRIBUTED, &CallCtx::new(), &scope, async { Ok(()) }).await;
                let _ = release.send(());
                result
            };
            let (held, rejected) = tokio::join!(holder, rejected);
            assert!(held.is_ok());
            match rejected {
                Err(Error::BulkheadFull {
                    policy,
                    scope,
                    limit,
                }) => {
                    assert_eq!((policy, scope.as_str(), limit), ("unit", "tenant-7", 1));
                }
                other => panic!("expected BulkheadFull, got {other:?}"),
            }
        })
        .await;
}
