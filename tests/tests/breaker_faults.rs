//! The distributed circuit breaker when the coordinator is unreachable, when a probe is
//! dropped, and what its closed path costs in awaited round trips.

mod common;

use std::time::{Duration, Instant};

use caracal::{Coordinator, bulkhead, circuit_breaker};
use caracal_tests::{CommandStats, FaultProxy, RedisCluster, RedisServer};
use common::{TestError, code, unique};

const COMMAND_TIMEOUT: Duration = Duration::from_millis(300);
/// Past this, a process's closed view of a breaker needs confirming (the staleness bound).
const VIEW_MAX_AGE: Duration = Duration::from_millis(250);

#[circuit_breaker(name = "fail-open", scope = scope, minimum_throughput = 5, open = "500ms")]
async fn fail_open(scope: &str, fail: bool) -> Result<(), TestError> {
    if fail {
        Err(TestError::Body("downstream failed"))
    } else {
        Ok(())
    }
}

#[circuit_breaker(name = "fail-closed", scope = scope, minimum_throughput = 5, open = "500ms",
                  on_coordinator_error = "fail_closed")]
async fn fail_closed(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// Runs `call`, checks it ends within the command timeout plus 100 ms, returns its code.
async fn timed<F: Future<Output = Result<(), TestError>>>(call: F) -> &'static str {
    let start = Instant::now();
    let result = call.await;
    let took = start.elapsed();
    assert!(
        took <= COMMAND_TIMEOUT + Duration::from_millis(100),
        "a call took {took:?}: {result:?}"
    );
    code(&result)
}

async fn unreachable(fault: impl Fn(&FaultProxy)) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let coordinator = common::connect(&proxy.url(), COMMAND_TIMEOUT).await;
    let (closed_scope, open_scope) = (unique("closed"), unique("open"));
    assert_eq!(
        code(&coordinator.scoped(fail_open(&closed_scope, false)).await),
        "ok"
    );
    assert_eq!(
        code(&coordinator.scoped(fail_closed(&closed_scope)).await),
        "ok"
    );
    // Open one scope: this process has seen it open.
    for _ in 0..5 {
        let _ = coordinator.scoped(fail_open(&open_scope, true)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        code(&coordinator.scoped(fail_open(&open_scope, false)).await),
        "circuit_open"
    );

    fault(&proxy);
    // Past the staleness bound (and the open time), admission needs the coordinator.
    tokio::time::sleep(VIEW_MAX_AGE.max(Duration::from_millis(500)) + Duration::from_millis(50))
        .await;
    for _ in 0..3 {
        assert_eq!(
            timed(coordinator.scoped(fail_open(&closed_scope, false))).await,
            "ok",
            "fail_open runs the body"
        );
        assert_eq!(
            timed(coordinator.scoped(fail_closed(&closed_scope))).await,
            "coordinator_unavailable"
        );
        assert_eq!(
            timed(coordinator.scoped(fail_open(&open_scope, false))).await,
            "circuit_open",
            "a scope last seen open fails closed whatever on_coordinator_error says"
        );
    }

    proxy.restore();
    let restored = Instant::now();
    while code(&coordinator.scoped(fail_closed(&closed_scope)).await) != "ok" {
        assert!(
            restored.elapsed() < Duration::from_secs(1),
            "not recovered 1 s after restore"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    coordinator.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_redis_cut() {
    unreachable(FaultProxy::cut).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_redis_blackholed() {
    unreachable(FaultProxy::blackhole).await;
}

#[circuit_breaker(name = "probe-drop", scope = scope, minimum_throughput = 5, open = "300ms",
                  half_open_probes = 1, half_open_successes = 5)]
async fn probe(scope: &str, fail: bool, hang: bool) -> Result<(), TestError> {
    if hang {
        std::future::pending::<()>().await;
    }
    if fail {
        Err(TestError::Body("downstream failed"))
    } else {
        Ok(())
    }
}

async fn a_dropped_probe_frees_its_slot(coordinator: Coordinator) {
    let scope = unique("probe-drop");
    for _ in 0..5 {
        let _ = coordinator.scoped(probe(&scope, true, false)).await;
    }
    tokio::time::sleep(Duration::from_millis(350)).await;
    // The only probe slot is taken by a hanging probe, which is then dropped.
    let hanging = tokio::spawn(coordinator.scoped({
        let scope = scope.clone();
        async move { probe(&scope, false, true).await }
    }));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        code(&coordinator.scoped(probe(&scope, false, false)).await),
        "circuit_open"
    );
    hanging.abort();
    let _ = hanging.await;
    let dropped = Instant::now();
    while code(&coordinator.scoped(probe(&scope, false, false)).await) != "ok" {
        assert!(
            dropped.elapsed() < Duration::from_secs(2),
            "the slot never came back"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let waited = dropped.elapsed();
    assert!(
        waited < Duration::from_millis(100),
        "the slot came back {waited:?} after the drop"
    );
    coordinator.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_probe_frees_its_slot_on_redis() {
    let server = RedisServer::start();
    a_dropped_probe_frees_its_slot(common::redis(&server.url()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_probe_frees_its_slot_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    a_dropped_probe_frees_its_slot(common::cluster(cluster.seed_urls()).await).await;
}

#[circuit_breaker(name = "closed-path", scope = scope)]
async fn closed_path(scope: &str) -> Result<(), TestError> {
    Ok(())
}

#[circuit_breaker(name = "both", scope = scope)]
#[bulkhead(name = "both", limit = 10, scope = scope)]
async fn breaker_and_bulkhead(scope: &str) -> Result<(), TestError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_closed_path_awaits_no_round_trip() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let coordinator = common::connect(&proxy.url(), Duration::from_secs(5)).await;
    let scope = unique("round-trips");

    // Counted at the server: 200 calls while the view is fresh cost one admission (the first
    // call's) and a few batched observations, not 200 of anything.
    let mut conn = server.connection();
    let before = CommandStats::read(&mut conn);
    let start = Instant::now();
    for _ in 0..200 {
        assert_eq!(code(&coordinator.scoped(closed_path(&scope)).await), "ok");
    }
    assert!(
        start.elapsed() < VIEW_MAX_AGE,
        "the loop outlived one view; counts would be off"
    );
    coordinator.shutdown().await;
    let scripts = CommandStats::read(&mut conn)
        .delta(&before)
        .calls("evalsha");
    assert!(
        scripts <= 10,
        "{scripts} script calls for 200 closed-path calls"
    );

    // Timed through a 2 × 40 ms round trip: a closed-path call waits for none, once a fresh
    // view exists (the call before refreshes it; a view's age counts from when it was asked).
    let coordinator = common::connect(&proxy.url(), Duration::from_secs(5)).await;
    let mut ping = common::ping_connection(&proxy.url()).await;
    assert_eq!(
        code(&coordinator.scoped(breaker_and_bulkhead(&scope)).await),
        "ok"
    );
    proxy.delay(Duration::from_millis(40));
    let round_trip = common::round_trip(&mut ping).await;
    assert_eq!(code(&coordinator.scoped(closed_path(&scope)).await), "ok");
    let start = Instant::now();
    assert_eq!(code(&coordinator.scoped(closed_path(&scope)).await), "ok");
    let closed = start.elapsed();
    assert!(
        closed < round_trip / 2,
        "a closed-path call took {closed:?}; a round trip {round_trip:?}"
    );
    // Breaker and bulkhead together: the bulkhead's acquire is the only awaited round trip
    // (the breaker's view refreshed by the call before).
    assert_eq!(
        code(&coordinator.scoped(breaker_and_bulkhead(&scope)).await),
        "ok"
    );
    let start = Instant::now();
    assert_eq!(
        code(&coordinator.scoped(breaker_and_bulkhead(&scope)).await),
        "ok"
    );
    let both = start.elapsed();
    assert!(
        both < round_trip.mul_f64(1.5),
        "breaker + bulkhead took {both:?}; a round trip {round_trip:?}"
    );
    proxy.restore();
    coordinator.shutdown().await;
}
