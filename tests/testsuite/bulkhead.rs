//! The distributed bulkhead's promises, one suite run against every backend: the in-memory
//! coordinator, a real standalone `redis-server`, and a real three-master cluster.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use caracal::{Coordinator, bulkhead};
use caracal_tests::{RedisCluster, RedisServer};

use crate::common::{self, Gate, Leases, TestError, code, unique};

#[bulkhead(name = "suite-hold", limit = 2, scope = scope)]
async fn hold(scope: &str, gate: Gate) -> Result<(), TestError> {
    gate.pass().await;
    Ok(())
}

#[bulkhead(name = "suite-one", limit = 1, scope = scope)]
pub(crate) async fn one(scope: &str) -> Result<(), TestError> {
    Ok(())
}

#[bulkhead(name = "suite-panic", limit = 1, scope = scope)]
async fn maybe_panics(scope: &str, gate: Gate, panic: bool) -> Result<(), TestError> {
    gate.pass().await;
    assert!(!panic, "the body panicked");
    Ok(())
}

#[bulkhead(name = "suite-renew", limit = 1, lease = "2s", scope = scope)]
async fn long_body(scope: &str, how_long: Duration) -> Result<(), TestError> {
    tokio::time::sleep(how_long).await;
    Ok(())
}

/// Returns the order in which it ran its body, from `order`.
#[bulkhead(name = "suite-wait", limit = 1, max_wait = "10s", scope = scope)]
async fn patient(scope: &str, gate: Gate, order: Arc<AtomicU64>) -> Result<u64, TestError> {
    gate.pass().await;
    Ok(order.fetch_add(1, Ordering::SeqCst))
}

/// Spawns `future` on its own task, under `coordinator`.
fn spawn<F>(coordinator: &Coordinator, future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    tokio::spawn(coordinator.scoped(future))
}

/// What the suite can see of a backend: its coordinator and, on Redis, its lease sets.
struct Backend {
    coordinator: Coordinator,
    leases: Option<Leases>,
}

impl Backend {
    /// Waits until no lease is left at the server (where there is one to look at): the 30 s
    /// lease of a dropped holder was released, not left to expire.
    async fn no_lease_left(&mut self) {
        if let Some(leases) = &mut self.leases {
            common::eventually("the lease to be released at the server", || {
                leases.live() == 0
            })
            .await;
        }
    }
}

/// All in one task: a task's release is queued before its next acquire, so its completed
/// calls' slots are free again at once. (A release made by another task may still be on its way
/// when this task acquires; that only frees the slot soon.)
async fn admits_up_to_the_limit_then_rejects(coordinator: &Coordinator) {
    let scope = unique("limit");
    let gate = Gate::closed();
    let third = async {
        // Both holders admitted (they wait inside the body) before the third call comes.
        gate.entered(2).await;
        let probe = Gate::closed();
        probe.open(1);
        let third = coordinator.scoped(hold(&scope, probe)).await;
        gate.open(2);
        third
    };
    let (first, second, third) = tokio::join!(
        coordinator.scoped(hold(&scope, gate.clone())),
        coordinator.scoped(hold(&scope, gate.clone())),
        third
    );
    assert_eq!((code(&first), code(&second)), ("ok", "ok"));
    match third {
        Err(TestError::Caracal(caracal::Error::BulkheadFull {
            policy,
            scope: s,
            limit,
            ..
        })) => {
            assert_eq!(
                (policy, s.as_str(), limit),
                ("suite-hold", scope.as_str(), 2)
            );
        }
        other => panic!("expected BulkheadFull, got {other:?}"),
    }
    // Completed calls released their slots: both are free again at once.
    let again = Gate::closed();
    again.open(2);
    let (a, b) = tokio::join!(
        coordinator.scoped(hold(&scope, again.clone())),
        coordinator.scoped(hold(&scope, again.clone()))
    );
    assert_eq!((code(&a), code(&b)), ("ok", "ok"));
}

async fn a_dropped_call_frees_its_slot_at_once(backend: &mut Backend) {
    let coordinator = &backend.coordinator;
    let scope = unique("drop");
    let gate = Gate::closed();
    let holder = spawn(coordinator, drop_holder_owned(scope.clone(), gate.clone()));
    gate.entered(1).await;
    assert_eq!(
        code(&coordinator.scoped(one_like_hold(&scope)).await),
        "bulkhead_full"
    );
    holder.abort();
    let _ = holder.await;
    // The lease is 30 s; the slot comes back well before because the drop released it.
    backend.no_lease_left().await;
    let coordinator = &backend.coordinator;
    common::until_ok(|| coordinator.scoped(one_like_hold(&scope))).await;
}

/// Shares `drop_holder`'s identity (name, operation, scope): one budget.
#[bulkhead(name = "suite-drop", limit = 1, scope = scope)]
async fn one_like_hold(scope: &str) -> Result<(), TestError> {
    Ok(())
}

#[bulkhead(name = "suite-drop", limit = 1, scope = scope)]
async fn drop_holder(scope: &str, gate: Gate) -> Result<(), TestError> {
    gate.pass().await;
    Ok(())
}

async fn drop_holder_owned(scope: String, gate: Gate) -> Result<(), TestError> {
    drop_holder(&scope, gate).await
}

async fn a_panic_releases_the_slot_and_propagates(backend: &mut Backend) {
    let coordinator = &backend.coordinator;
    let scope = unique("panic");
    let gate = Gate::closed();
    let task = {
        let (scope, gate) = (scope.clone(), gate.clone());
        spawn(coordinator, async move {
            maybe_panics(&scope, gate, true).await
        })
    };
    gate.entered(1).await;
    gate.open(1);
    let joined = task.await;
    assert!(joined.expect_err("the panic reaches the caller").is_panic());
    backend.no_lease_left().await;
    let coordinator = &backend.coordinator;
    common::until_ok(|| {
        let open = Gate::closed();
        open.open(1);
        coordinator.scoped(maybe_panics(&scope, open, false))
    })
    .await;
}

async fn a_task_looping_on_limit_one_is_never_rejected_by_itself(coordinator: &Coordinator) {
    let scope = unique("loop");
    let mut rejected = 0;
    for _ in 0..1000 {
        if coordinator.scoped(one(&scope)).await.is_err() {
            rejected += 1;
        }
    }
    assert_eq!(
        rejected, 0,
        "rejections in 1000 sequential calls on limit = 1"
    );
}

async fn renewals_keep_a_body_longer_than_its_lease(coordinator: &Coordinator) {
    let scope = unique("renew");
    let result = coordinator
        .scoped(long_body(&scope, Duration::from_secs(3)))
        .await;
    assert_eq!(code(&result), "ok");
}

async fn a_waiter_is_admitted_when_the_holder_leaves(coordinator: &Coordinator) {
    let scope = unique("wait");
    let order = Arc::new(AtomicU64::new(0));
    let holder_gate = Gate::closed();
    let holder = {
        let (scope, gate, order) = (scope.clone(), holder_gate.clone(), Arc::clone(&order));
        spawn(
            coordinator,
            async move { patient(&scope, gate, order).await },
        )
    };
    holder_gate.entered(1).await;
    let waiter_gate = Gate::closed();
    waiter_gate.open(1);
    let waiter = {
        let (scope, order) = (scope.clone(), Arc::clone(&order));
        spawn(coordinator, async move {
            patient(&scope, waiter_gate, order).await
        })
    };
    // Let the waiter find the slot taken and start waiting.
    tokio::time::sleep(Duration::from_millis(200)).await;
    holder_gate.open(1);
    let holder_ran = holder.await.expect("holder").expect("holder admitted");
    let waiter_ran = waiter
        .await
        .expect("waiter")
        .expect("waiter admitted within max_wait");
    assert_eq!(
        (holder_ran, waiter_ran),
        (0, 1),
        "the waiter ran after the holder"
    );
}

async fn suite(mut backend: Backend) {
    admits_up_to_the_limit_then_rejects(&backend.coordinator).await;
    a_dropped_call_frees_its_slot_at_once(&mut backend).await;
    a_panic_releases_the_slot_and_propagates(&mut backend).await;
    a_task_looping_on_limit_one_is_never_rejected_by_itself(&backend.coordinator).await;
    renewals_keep_a_body_longer_than_its_lease(&backend.coordinator).await;
    a_waiter_is_admitted_when_the_holder_leaves(&backend.coordinator).await;
    backend.coordinator.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory() {
    suite(Backend {
        coordinator: Coordinator::in_memory(),
        leases: None,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_standalone() {
    let server = RedisServer::start();
    suite(Backend {
        coordinator: common::redis(&server.url()).await,
        leases: Some(Leases::on(&server)),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster() {
    let cluster = RedisCluster::start(3);
    suite(Backend {
        coordinator: common::cluster(cluster.seed_urls()).await,
        leases: Some(Leases::on_cluster(&cluster)),
    })
    .await;
}
