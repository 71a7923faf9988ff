//! The distributed circuit breaker when the coordinator is unreachable, when a probe is
//! dropped, and what its closed path costs in round trips, counted at the proxy and the server.

use std::time::Duration;

use caracal::{Coordinator, FailureKind, bulkhead, circuit_breaker};
use caracal_tests::{CommandLog, EventLog, FaultProxy, RedisCluster, RedisServer, script_source};
use tokio::sync::oneshot;

use crate::common::{
    self, Fault, PATIENCE, TestError, code, ends, failure_kind, unique, until_code,
};

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

/// While the proxy is faulty, every call ends (no hang) with the documented decision, and the
/// coordinator failure behind it is of the kind the fault explains (the command timeout fired,
/// or the connection is gone); once restored, the coordinator answers again in the same
/// process.
async fn unreachable(fault: Fault) {
    let events = EventLog::global();
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
    // Open one scope: this process has seen it open once the batch of failures is answered.
    for _ in 0..5 {
        let _ = coordinator.scoped(fail_open(&open_scope, true)).await;
    }
    until_code("circuit_open", || {
        coordinator.scoped(fail_open(&open_scope, false))
    })
    .await;

    fault.apply(&proxy);
    // Past the staleness bound (and the open time), admission needs the coordinator.
    tokio::time::sleep(VIEW_MAX_AGE.max(Duration::from_millis(500)) + Duration::from_millis(50))
        .await;
    let mut kinds = Vec::new();
    for _ in 0..3 {
        let result = ends(
            "a fail_open call",
            coordinator.scoped(fail_open(&closed_scope, false)),
        )
        .await;
        assert_eq!(code(&result), "ok", "fail_open runs the body");
        let result = ends(
            "a fail_closed call",
            coordinator.scoped(fail_closed(&closed_scope)),
        )
        .await;
        assert_eq!(code(&result), "coordinator_unavailable", "{result:?}");
        kinds.push(failure_kind(&result).map(FailureKind::as_str));
        let result = ends(
            "a call on an open scope",
            coordinator.scoped(fail_open(&open_scope, false)),
        )
        .await;
        assert_eq!(
            code(&result),
            "circuit_open",
            "a scope last seen open fails closed whatever on_coordinator_error says"
        );
    }
    fault.check(&kinds);
    // The fail_open calls ran their bodies because the admission failed, for the same reasons:
    // said once per reason for the three, as a condition that repeats per call is (the next
    // line about it is a summary, ten seconds on).
    let admissions = events.matching("circuit_breaker.coordinator_error", |f| {
        f.get("name").map(String::as_str) == Some("fail-open")
            && f.get("scope").map(String::as_str) == Some(closed_scope.as_str())
            && f.get("command").map(String::as_str) == Some("admit")
    });
    let failures: Vec<_> = admissions.iter().map(|e| e.field("failure")).collect();
    let reasons: std::collections::BTreeSet<_> = failures.iter().collect();
    assert!(
        !failures.is_empty() && reasons.len() == failures.len(),
        "one line per reason: {admissions:?}"
    );
    assert!(
        admissions
            .iter()
            .all(|e| e.field("suppressed") == Some("0")),
        "{admissions:?}"
    );
    fault.check(&failures);

    proxy.restore();
    common::until_ok(|| coordinator.scoped(fail_closed(&closed_scope))).await;
    coordinator.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_redis_cut() {
    unreachable(Fault::Cut).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_redis_blackholed() {
    unreachable(Fault::Blackhole).await;
}

/// A probe slot is held for `probe_lease` (a minute) unless the probe gives it back: freed
/// within [`PATIENCE`], it was given back.
#[circuit_breaker(name = "probe-drop", scope = scope, minimum_throughput = 5, open = "1s",
                  half_open_probes = 1, half_open_successes = 5, probe_lease = "60s")]
async fn probe(
    scope: &str,
    entered: Option<oneshot::Sender<()>>,
    fail: bool,
) -> Result<(), TestError> {
    if let Some(entered) = entered {
        let _ = entered.send(());
        std::future::pending::<()>().await;
    }
    if fail {
        Err(TestError::Body("downstream failed"))
    } else {
        Ok(())
    }
}

/// Starts a probe that hangs in its body once admitted, retrying while the breaker is still
/// open; returns its task once it holds the probe slot.
async fn hanging_probe(
    coordinator: &Coordinator,
    scope: &str,
) -> tokio::task::JoinHandle<Result<(), TestError>> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (entered, inside) = oneshot::channel();
        let scope = scope.to_owned();
        let mut task = tokio::spawn(
            coordinator.scoped(async move { probe(&scope, Some(entered), false).await }),
        );
        tokio::select! {
            Ok(()) = inside => return task,
            result = &mut task => {
                let result = result.expect("probe task");
                assert_eq!(code(&result), "circuit_open", "before half-open: {result:?}");
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no probe admitted within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn a_dropped_probe_frees_its_slot(coordinator: Coordinator) {
    let scope = unique("probe-drop");
    for _ in 0..5 {
        let _ = coordinator.scoped(probe(&scope, None, true)).await;
    }
    until_code("circuit_open", || {
        coordinator.scoped(probe(&scope, None, false))
    })
    .await;
    // The only probe slot is taken by a hanging probe, which is then dropped.
    let hanging = hanging_probe(&coordinator, &scope).await;
    assert_eq!(
        code(&coordinator.scoped(probe(&scope, None, false)).await),
        "circuit_open"
    );
    hanging.abort();
    let _ = hanging.await;
    common::until_ok(|| coordinator.scoped(probe(&scope, None, false))).await;
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

/// Fails closed, so a call that does not get the reply it waits for cannot end well.
#[circuit_breaker(name = "closed-path-strict", scope = scope, on_coordinator_error = "fail_closed")]
async fn strict_closed_path(scope: &str) -> Result<(), TestError> {
    Ok(())
}

#[circuit_breaker(name = "both", scope = scope, on_coordinator_error = "fail_closed")]
#[bulkhead(name = "both", limit = 10, scope = scope)]
async fn breaker_and_bulkhead(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// Counted at the server: 200 closed-path calls in a row cost one admission (the first
/// call's) and a few batched observations, not 200 of anything.
///
/// On a current-thread runtime the batching timer cannot fire while the loop runs without
/// yielding, so the count does not depend on how fast the machine gets through the loop.
#[tokio::test(flavor = "current_thread")]
async fn closed_path_calls_cost_a_few_scripts_between_them() {
    let server = RedisServer::start();
    let coordinator = common::connect(&server.url(), Duration::from_secs(5)).await;
    let scope = unique("scripts");
    let mut conn = server.connection();
    CommandLog::start(&mut conn);
    for _ in 0..200 {
        assert_eq!(code(&coordinator.scoped(closed_path(&scope)).await), "ok");
    }
    coordinator.shutdown().await;
    let log = CommandLog::read(&mut conn);
    let scripts: usize = ["breaker_admit", "breaker_observe", "breaker_settle"]
        .map(|name| log.script_calls(&script_source(name)))
        .iter()
        .sum();
    assert!(
        scripts <= 10,
        "{scripts} script calls for 200 closed-path calls"
    );
}

/// A coordinator behind `proxy` whose commands never time out during a round-trip count, so a
/// call waiting for a held reply stays pending.
async fn patient_coordinator(proxy: &FaultProxy) -> Coordinator {
    common::connect(&proxy.url(), Duration::from_secs(60)).await
}

/// Counted at the proxy: once the call before it has refreshed this process's view, a
/// closed-path call completes with every reply held, so it waited for no round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_path_call_awaits_no_round_trip() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let coordinator = patient_coordinator(&proxy).await;
    let scope = unique("no-round-trip");
    let call = || coordinator.scoped(strict_closed_path(&scope));
    let (result, awaited) = common::awaited_replies(&proxy, 0, call, call).await;
    assert_eq!((code(&result), awaited), ("ok", 0), "{result:?}");
    coordinator.shutdown().await;
}

/// Counted at the proxy: with the breaker's view fresh, breaker and bulkhead together wait for
/// one reply, the bulkhead's acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_and_bulkhead_call_awaits_one_round_trip() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let coordinator = patient_coordinator(&proxy).await;
    let scope = unique("one-round-trip");
    let call = || coordinator.scoped(breaker_and_bulkhead(&scope));
    let (result, awaited) = common::awaited_replies(&proxy, 1, call, call).await;
    assert_eq!(
        (code(&result), awaited),
        ("ok", 1),
        "admitted without the acquire's reply? {result:?}"
    );
    coordinator.shutdown().await;
}
