//! The distributed bulkhead's promises, one suite run against every backend: the in-memory
//! coordinator, a real standalone `redis-server`, and a real three-master cluster.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use caracal::{Coordinator, bulkhead};
use caracal_tests::{RedisCluster, RedisServer};
use common::{TestError, code, unique};
use tokio::sync::Semaphore;

/// Bodies report that they are in, then wait here until the test lets them go.
#[derive(Clone)]
struct Gate {
    open: Arc<Semaphore>,
    entered: Arc<Semaphore>,
}

impl Gate {
    fn closed() -> Self {
        Gate {
            open: Arc::new(Semaphore::new(0)),
            entered: Arc::new(Semaphore::new(0)),
        }
    }

    async fn pass(&self) {
        self.entered.add_permits(1);
        self.open.acquire().await.expect("gate").forget();
    }

    fn open(&self, bodies: usize) {
        self.open.add_permits(bodies);
    }

    /// Waits until `bodies` bodies are inside.
    async fn entered(&self, bodies: u32) {
        self.entered
            .acquire_many(bodies)
            .await
            .expect("gate")
            .forget();
    }
}

#[bulkhead(name = "suite-hold", limit = 2, scope = scope)]
async fn hold(scope: &str, gate: Gate) -> Result<(), TestError> {
    gate.pass().await;
    Ok(())
}

#[bulkhead(name = "suite-one", limit = 1, scope = scope)]
async fn one(scope: &str) -> Result<(), TestError> {
    Ok(())
}

#[bulkhead(name = "suite-panic", limit = 1, scope = scope)]
async fn maybe_panics(scope: &str, gate: Gate, panic: bool) -> Result<(), TestError> {
    gate.pass().await;
    assert!(!panic, "the body panicked");
    Ok(())
}

#[bulkhead(name = "suite-renew", limit = 1, lease = "300ms", scope = scope)]
async fn long_body(scope: &str, how_long: Duration) -> Result<(), TestError> {
    tokio::time::sleep(how_long).await;
    Ok(())
}

#[bulkhead(name = "suite-wait", limit = 1, max_wait = "3s", scope = scope)]
async fn patient(scope: &str, gate: Gate) -> Result<Instant, TestError> {
    gate.pass().await;
    Ok(Instant::now())
}

/// Spawns `future` on its own task, under `coordinator`.
fn spawn<F>(coordinator: &Coordinator, future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    tokio::spawn(coordinator.scoped(future))
}

/// Polls `call` until it succeeds, returning how long that took.
async fn time_until_admitted<F, Fut>(limit: Duration, mut call: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), TestError>>,
{
    let start = Instant::now();
    loop {
        match call().await {
            Ok(()) => return start.elapsed(),
            Err(error) if start.elapsed() > limit => {
                panic!("still not admitted after {limit:?}: {error:?}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
}

async fn admits_up_to_the_limit_then_rejects(coordinator: &Coordinator) {
    let scope = unique("limit");
    let gate = Gate::closed();
    let holders: Vec<_> = (0..2)
        .map(|_| spawn(coordinator, hold_owned(scope.clone(), gate.clone())))
        .collect();
    // Both holders admitted (they wait inside the body) before the third call comes.
    gate.entered(2).await;
    let probe = Gate::closed();
    probe.open(1);
    match coordinator.scoped(hold(&scope, probe)).await {
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
    gate.open(2);
    for holder in holders {
        holder.await.expect("holder task").expect("holder admitted");
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

async fn hold_owned(scope: String, gate: Gate) -> Result<(), TestError> {
    hold(&scope, gate).await
}

async fn a_dropped_call_frees_its_slot_at_once(coordinator: &Coordinator) {
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
    // The lease is 30 s; the slot must come back because the drop released it.
    let waited = time_until_admitted(Duration::from_secs(5), || {
        coordinator.scoped(one_like_hold(&scope))
    })
    .await;
    assert!(
        waited < Duration::from_millis(100),
        "slot free after {waited:?}"
    );
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

async fn a_panic_releases_the_slot_and_propagates(coordinator: &Coordinator) {
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
    let waited = time_until_admitted(Duration::from_secs(5), || {
        let open = Gate::closed();
        open.open(1);
        coordinator.scoped(maybe_panics(&scope, open, false))
    })
    .await;
    assert!(
        waited < Duration::from_millis(100),
        "slot free after {waited:?}"
    );
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
        .scoped(long_body(&scope, Duration::from_millis(1200)))
        .await;
    assert_eq!(code(&result), "ok");
}

async fn a_waiter_is_admitted_when_the_holder_leaves(coordinator: &Coordinator) {
    let scope = unique("wait");
    let holder_gate = Gate::closed();
    let holder = {
        let (scope, gate) = (scope.clone(), holder_gate.clone());
        spawn(coordinator, async move { patient(&scope, gate).await })
    };
    holder_gate.entered(1).await;
    let waiter_gate = Gate::closed();
    waiter_gate.open(1);
    let waiter = {
        let scope = scope.clone();
        spawn(
            coordinator,
            async move { patient(&scope, waiter_gate).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    holder_gate.open(1);
    let released_at = holder.await.expect("holder").expect("holder admitted");
    let admitted_at = waiter
        .await
        .expect("waiter")
        .expect("waiter admitted within max_wait");
    assert!(admitted_at >= released_at);
}

async fn suite(coordinator: Coordinator) {
    admits_up_to_the_limit_then_rejects(&coordinator).await;
    a_dropped_call_frees_its_slot_at_once(&coordinator).await;
    a_panic_releases_the_slot_and_propagates(&coordinator).await;
    a_task_looping_on_limit_one_is_never_rejected_by_itself(&coordinator).await;
    renewals_keep_a_body_longer_than_its_lease(&coordinator).await;
    a_waiter_is_admitted_when_the_holder_leaves(&coordinator).await;
    coordinator.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory() {
    suite(Coordinator::in_memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_standalone() {
    let server = RedisServer::start();
    suite(common::redis(&server.url()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster() {
    let cluster = RedisCluster::start(3);
    suite(common::cluster(cluster.seed_urls()).await).await;
}
