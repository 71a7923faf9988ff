//! The metrics (feature `metrics`), read back from a recorder: one decision per admission with
//! its reason, for each policy kind; the admission histogram; the bulkhead occupancy back to 0
//! however calls end; the breaker state in a process that did not change it; the coordinator's
//! connectivity; the limit in force, the breaker's rates, the retry, timeout and fallback
//! counters, the coordinator's round trips and the kept leases of a bulkhead with `keep`.
//!
//! The suites share one recorder ([`MetricsLog::global`]): each test reads only the series of
//! policy names its own functions use. Label-less series (`caracal_coordinator_up`) and
//! cross-process views are read in worker processes, each with a recorder of its own.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use caracal::admin::{BreakerCommand, BreakerId};
use caracal::metrics::{
    ADMISSION_SECONDS, BULKHEAD_IN_FLIGHT, BULKHEAD_KEPT_LEASES_TOTAL, BULKHEAD_LIMIT,
    CIRCUIT_BREAKER_FAILURE_RATE, CIRCUIT_BREAKER_FORCED_UNTIL, CIRCUIT_BREAKER_SLOW_CALL_RATE,
    CIRCUIT_BREAKER_STATE, COORDINATOR_SECONDS, DECISIONS_TOTAL, FALLBACKS_TOTAL, LABELLED_SCOPES,
    OTHER_SCOPES, RETRIES_TOTAL, TIMEOUTS_TOTAL,
};
use caracal::{Coordinator, bulkhead, circuit_breaker, fallback, rate_limit, retry, timeout};
use caracal_tests::{FaultProxy, MetricsLog, RedisServer};
use tokio::sync::{oneshot, watch};

use crate::common::worker::Worker;
use crate::common::{PATIENCE, TestError, code, eventually, unique};

/// How many decisions `name`'s policy took with this `decision` and, if given, `reason`.
fn decisions(name: &str, decision: &str, reason: Option<&str>) -> u64 {
    let mut labels = vec![("name", name), ("decision", decision)];
    labels.extend(reason.map(|reason| ("reason", reason)));
    MetricsLog::global().counter(DECISIONS_TOTAL, &labels)
}

/// `name`'s decisions, as (admitted, rejected, degraded).
fn totals(name: &str) -> (u64, u64, u64) {
    (
        decisions(name, "admitted", None),
        decisions(name, "rejected", None),
        decisions(name, "degraded", None),
    )
}

/// How many admissions of `policy`'s `name` the histogram holds.
fn timed_admissions(policy: &str, name: &str) -> usize {
    MetricsLog::global()
        .histogram(
            ADMISSION_SECONDS,
            &[("policy", policy), ("name", name), ("operation", name)],
        )
        .len()
}

#[bulkhead(name = "metrics-bulkhead", limit = 1)]
async fn bulkheaded(gate: Option<oneshot::Receiver<()>>) -> Result<(), TestError> {
    if let Some(gate) = gate {
        let _ = gate.await;
    }
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn a_bulkhead_counts_each_decision_once_with_its_reason() {
    let name = "metrics-bulkhead";
    let metrics = MetricsLog::global();
    let coordinator = Coordinator::in_memory();
    let (open, gate) = oneshot::channel();
    let holder = coordinator.scoped(bulkheaded(Some(gate)));
    let second = async {
        tokio::task::yield_now().await;
        let result = coordinator.scoped(bulkheaded(None)).await;
        let _ = open.send(());
        result
    };
    let (held, refused) = tokio::join!(holder, second);
    assert_eq!((code(&held), code(&refused)), ("ok", "bulkhead_full"));
    assert_eq!(decisions(name, "admitted", Some("admitted")), 1);
    assert_eq!(decisions(name, "rejected", Some("capacity")), 1);
    assert_eq!(timed_admissions("bulkhead", name), 1, "{metrics:?}");

    // The coordinator cannot answer: the admission fails closed, a degraded decision.
    coordinator.shutdown().await;
    let unavailable = coordinator.scoped(bulkheaded(None)).await;
    assert_eq!(code(&unavailable), "coordinator_unavailable");
    assert_eq!(decisions(name, "degraded", Some("fail_closed")), 1);
    assert_eq!(totals(name), (1, 1, 1), "{metrics:?}");
    assert_eq!(
        timed_admissions("bulkhead", name),
        1,
        "only admissions are timed"
    );
    assert_eq!(
        metrics.counter(DECISIONS_TOTAL, &[("policy", "bulkhead"), ("name", name)]),
        3
    );
}

#[rate_limit(name = "metrics-rate", rate = 0.001)]
async fn limited() -> Result<(), TestError> {
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn a_rate_limit_counts_each_decision_once_with_its_reason() {
    let name = "metrics-rate";
    MetricsLog::global();
    let coordinator = Coordinator::in_memory();
    assert_eq!(code(&coordinator.scoped(limited()).await), "ok");
    assert_eq!(code(&coordinator.scoped(limited()).await), "rate_limited");
    assert_eq!(decisions(name, "admitted", Some("admitted")), 1);
    assert_eq!(decisions(name, "rejected", Some("rate_exceeded")), 1);
    assert_eq!(timed_admissions("rate_limit", name), 1);

    coordinator.shutdown().await;
    let unavailable = coordinator.scoped(limited()).await;
    assert_eq!(code(&unavailable), "coordinator_unavailable");
    assert_eq!(decisions(name, "degraded", Some("fail_closed")), 1);
    assert_eq!(totals(name), (1, 1, 1), "{:?}", MetricsLog::global());
}

#[circuit_breaker(name = "metrics-breaker", scope = scope, minimum_throughput = 2,
                  failure_threshold = 0.6, open = "1s", half_open_probes = 1,
                  half_open_successes = 1)]
async fn breakered(scope: &str, fail: bool) -> Result<(), TestError> {
    if fail {
        Err(TestError::Body("downstream failed"))
    } else {
        Ok(())
    }
}

/// The state gauge of `name`'s breaker in `scope`.
fn breaker_state(name: &str, scope: &str) -> Option<f64> {
    MetricsLog::global().gauge(
        CIRCUIT_BREAKER_STATE,
        &[("name", name), ("operation", name), ("scope", scope)],
    )
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_circuit_breaker_counts_each_decision_once_with_its_reason() {
    let name = "metrics-breaker";
    // Installed before the first call: a recorder only sees what happens after it.
    MetricsLog::global();
    let coordinator = Coordinator::in_memory();
    let (failing, untouched) = (unique("failing"), unique("untouched"));
    coordinator
        .scoped(async {
            assert_eq!(code(&breakered(&failing, false).await), "ok");
            assert_eq!(
                breaker_state(name, &failing),
                Some(0.0),
                "closed, once used"
            );
            // 1 success, 2 failures: 2/3 of the window failed.
            for _ in 0..2 {
                assert_eq!(code(&breakered(&failing, true).await), "body");
            }
            // Outcomes are sent in batches: wait for the one that opens it.
            until_state(name, &failing, 1.0).await;
            assert_eq!(code(&breakered(&failing, false).await), "circuit_open");
            assert_eq!(decisions(name, "admitted", Some("closed")), 3);
            assert_eq!(decisions(name, "rejected", Some("open")), 1);

            // After `open`, one probe is admitted and its success closes the breaker.
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(code(&breakered(&failing, false).await), "ok");
            assert_eq!(decisions(name, "admitted", Some("half_open")), 1);
            until_state(name, &failing, 0.0).await;

            // Open again, then the coordinator goes away: a scope last seen open fails
            // closed; one never seen fails open (the default), running the body.
            for _ in 0..2 {
                assert_eq!(code(&breakered(&failing, true).await), "body");
            }
            until_state(name, &failing, 1.0).await;
        })
        .await;
    coordinator.shutdown().await;
    // Once a probe is due the view cannot decide alone: the coordinator is asked, and fails.
    tokio::time::sleep(Duration::from_secs(1)).await;
    coordinator
        .scoped(async {
            assert_eq!(code(&breakered(&failing, false).await), "circuit_open");
            assert_eq!(code(&breakered(&untouched, false).await), "ok");
        })
        .await;
    assert_eq!(decisions(name, "degraded", Some("fail_closed")), 1);
    assert_eq!(decisions(name, "degraded", Some("fail_open")), 1);
    assert_eq!(decisions(name, "admitted", Some("closed")), 5);
    assert_eq!(totals(name), (6, 1, 2), "{:?}", MetricsLog::global());
    assert_eq!(timed_admissions("circuit_breaker", name), 6);
}

/// Waits until the state gauge of `name`'s breaker in `scope` reads `state`.
async fn until_state(name: &str, scope: &str, state: f64) {
    let what = format!("{name}'s breaker in {scope} to be in state {state}");
    eventually(&what, || breaker_state(name, scope) == Some(state)).await;
}

#[circuit_breaker(
    name = "metrics-local-breaker",
    local,
    minimum_throughput = 2,
    open = "60s"
)]
async fn local_breakered(fail: bool) -> Result<(), TestError> {
    if fail {
        Err(TestError::Body("downstream failed"))
    } else {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_local_breaker_reports_its_state_and_decisions() {
    let name = "metrics-local-breaker";
    MetricsLog::global();
    assert_eq!(breaker_state(name, "global"), None);
    assert_eq!(code(&local_breakered(true).await), "body");
    assert_eq!(
        breaker_state(name, "global"),
        Some(0.0),
        "closed, once used"
    );
    assert_eq!(code(&local_breakered(true).await), "body");
    assert_eq!(breaker_state(name, "global"), Some(1.0));
    assert_eq!(code(&local_breakered(false).await), "circuit_open");
    assert_eq!(totals(name), (2, 1, 0), "{:?}", MetricsLog::global());
    assert_eq!(decisions(name, "admitted", Some("closed")), 2);
    assert_eq!(decisions(name, "rejected", Some("open")), 1);
}

/// A body that waits for the gate to open, then returns or panics.
async fn wait_then(mut gate: watch::Receiver<bool>, panic: bool) -> Result<(), TestError> {
    let _ = gate.wait_for(|open| *open).await;
    assert!(!panic, "the body panics, as asked");
    Ok(())
}

#[bulkhead(name = "metrics-in-flight", limit = 10)]
async fn occupy(gate: watch::Receiver<bool>, panic: bool) -> Result<(), TestError> {
    wait_then(gate, panic).await
}

#[bulkhead(name = "metrics-in-flight-local", limit = 10, local)]
async fn occupy_locally(gate: watch::Receiver<bool>, panic: bool) -> Result<(), TestError> {
    wait_then(gate, panic).await
}

/// Three bodies of `name`'s bulkhead run at once; one call is cancelled, one returns, one
/// panics: the occupancy gauge counts each while it runs and is back to 0 once all have ended.
async fn occupancy_returns_to_zero<F, Fut>(name: &str, call: F)
where
    F: Fn(watch::Receiver<bool>, bool) -> Fut,
    Fut: Future<Output = Result<(), TestError>> + Send + 'static,
{
    MetricsLog::global();
    let in_flight =
        || MetricsLog::global().gauge(BULKHEAD_IN_FLIGHT, &[("name", name), ("operation", name)]);
    let coordinator = Coordinator::in_memory();
    let (open, gate) = watch::channel(false);
    let returns = tokio::spawn(coordinator.scoped(call(gate.clone(), false)));
    let cancelled = tokio::spawn(coordinator.scoped(call(gate.clone(), false)));
    let panics = tokio::spawn(coordinator.scoped(call(gate, true)));
    eventually("three bodies running", || in_flight() == Some(3.0)).await;

    cancelled.abort();
    assert!(cancelled.await.is_err_and(|e| e.is_cancelled()));
    assert_eq!(in_flight(), Some(2.0), "a cancelled call stops counting");

    open.send(true).expect("the calls listen");
    assert_eq!(code(&returns.await.expect("no panic")), "ok");
    assert!(panics.await.is_err_and(|e| e.is_panic()));
    eventually("no body running", || in_flight() == Some(0.0)).await;
    assert_eq!(
        decisions(name, "admitted", None),
        3,
        "{:?}",
        MetricsLog::global()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn occupancy_returns_to_zero_however_calls_end() {
    occupancy_returns_to_zero("metrics-in-flight", occupy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_occupancy_returns_to_zero_however_calls_end() {
    occupancy_returns_to_zero("metrics-in-flight-local", occupy_locally).await;
}

#[bulkhead(name = "metrics-in-flight-scoped", limit = 10, scope = scope)]
async fn occupy_scope(scope: &str, gate: watch::Receiver<bool>) -> Result<(), TestError> {
    wait_then(gate, false).await
}

/// Occupancy per scope while a bulkhead's scopes are few: each of its first
/// [`LABELLED_SCOPES`] scopes has a series of its own; a scope past them (scopes per user)
/// counts under [`OTHER_SCOPES`], and so does every body of the site after it, a scope that had
/// a series included: a process never reports part of a scope apart from the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn occupancy_carries_the_scope_while_a_bulkheads_scopes_are_few() {
    MetricsLog::global();
    let name = "metrics-in-flight-scoped";
    let in_flight = |scope: &str| {
        MetricsLog::global().gauge(
            BULKHEAD_IN_FLIGHT,
            &[("name", name), ("operation", name), ("scope", scope)],
        )
    };
    let coordinator = Coordinator::in_memory();
    let (open, gate) = watch::channel(false);
    let call = |scope: String| {
        let (coordinator, gate) = (coordinator.clone(), gate.clone());
        tokio::spawn(async move { coordinator.scoped(occupy_scope(&scope, gate)).await })
    };
    let mut calls: Vec<_> = (0..LABELLED_SCOPES)
        .map(|n| call(format!("region-{n}")))
        .collect();
    for n in 0..LABELLED_SCOPES {
        let scope = format!("region-{n}");
        eventually("a series per scope", || in_flight(&scope) == Some(1.0)).await;
    }
    assert_eq!(in_flight(OTHER_SCOPES), None, "{:?}", MetricsLog::global());
    calls.push(call("user-1".to_owned()));
    eventually("the scope past the bound under `other`", || {
        in_flight(OTHER_SCOPES) == Some(1.0)
    })
    .await;
    calls.push(call("region-0".to_owned()));
    eventually("every body of the site under `other` from then on", || {
        in_flight(OTHER_SCOPES) == Some(2.0)
    })
    .await;
    assert_eq!(in_flight("user-1"), None);
    assert_eq!(in_flight("region-0"), Some(1.0));
    open.send(true).expect("the calls listen");
    for call in calls {
        assert_eq!(code(&call.await.expect("no panic")), "ok");
    }
    assert_eq!(in_flight(OTHER_SCOPES), Some(0.0));
    assert_eq!(in_flight("region-0"), Some(0.0));
}

/// The next `gauge value=` a worker prints (see its `*-gauge` scenarios).
fn next_gauge(worker: &Worker) -> String {
    let line = worker.expect_line("gauge", PATIENCE);
    line.trim_start_matches("gauge value=").to_owned()
}

/// Waits until a worker reports the gauge at `value`, and returns the values it reported
/// before.
fn until_gauge(worker: &Worker, value: &str) -> Vec<String> {
    let mut before = Vec::new();
    loop {
        let next = next_gauge(worker);
        if next == value {
            return before;
        }
        before.push(next);
    }
}

/// A worker process that used the breaker once and then only listens reports it opened by
/// another process, then half-open and closed again by a third, then forced open and reset by
/// an operator: all learned from the coordinator's feed.
#[test]
fn the_breaker_state_follows_changes_made_by_other_processes() {
    let server = RedisServer::start();
    let (namespace, scope) = (unique("metrics-fleet"), unique("metrics-fleet"));
    let run = |scenario: &str, args: &[&str]| {
        let mut all = vec![format!("scope={scope}")];
        all.extend(args.iter().map(|arg| (*arg).to_owned()));
        Worker::spawn(&server.url(), &namespace, scenario, &all)
    };
    let listener = run("breaker-gauge", &[]);
    assert_eq!(next_gauge(&listener), "0", "closed, once used");

    let failing = run("breaker-fail", &["calls=10"]).expect_line("result", PATIENCE);
    assert!(Worker::field(&failing, "rejected") > 0, "opened: {failing}");
    assert_eq!(
        next_gauge(&listener),
        "1",
        "open, as another process made it"
    );

    // The workers' breaker opens for 1 s; then probes (three successes) close it.
    std::thread::sleep(Duration::from_millis(1100));
    let probing = run("breaker-probes", &["tasks=1", "runs=3"]).expect_line("result", PATIENCE);
    assert!(Worker::field(&probing, "ran") >= 3, "probes ran: {probing}");
    let before = until_gauge(&listener, "0");
    assert!(
        before.iter().all(|state| state == "2"),
        "only half-open on the way back: {before:?}"
    );

    // An operator (this process, through the admin API) forces it open, then resets it.
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let operator = runtime.block_on(async {
        Coordinator::redis(server.url())
            .namespace(namespace.as_str())
            .connect()
            .await
            .expect("connect")
    });
    let breaker = BreakerId::new("mp-breaker").scope(scope.as_str());
    let command = |command| {
        runtime
            .block_on(operator.admin().breaker(&breaker, command))
            .expect("the operator's command")
    };
    command(BreakerCommand::Open { lasts: None });
    assert_eq!(next_gauge(&listener), "3", "forced open");
    command(BreakerCommand::Reset);
    assert_eq!(next_gauge(&listener), "0", "reset: closed");
}

#[circuit_breaker(name = "metrics-forced-breaker", scope = scope)]
async fn forced_breakered(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// The forced-until gauge of `name`'s breaker in `scope`.
fn forced_until(name: &str, scope: &str) -> Option<f64> {
    MetricsLog::global().gauge(
        CIRCUIT_BREAKER_FORCED_UNTIL,
        &[("name", name), ("operation", name), ("scope", scope)],
    )
}

/// Seconds since the Unix epoch.
fn unix_seconds(at: SystemTime) -> f64 {
    at.duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

/// Calls `name`'s breaker in `scope` until its forced-until gauge satisfies `condition` (the
/// process learns a forced state's end from its admissions' replies), and returns the gauge.
async fn calls_until_forced_until(
    name: &str,
    scope: &str,
    condition: impl Fn(Option<f64>) -> bool,
) -> Option<f64> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let _ = forced_breakered(scope).await;
        let value = forced_until(name, scope);
        if condition(value) {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} in {scope}: forced until {value:?}\n{}",
            MetricsLog::global().dump()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A service process learns from its admissions' replies when a state an operator forced
/// (from another process) lapses: the forced-until gauge shows it in unix seconds, with
/// `--for` open or closed; 0 for a force with no end, after a reset, and once the force lapsed.
/// A breaker never forced has no series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_forced_until_gauge_shows_a_forced_states_end_until_it_ends() {
    let name = "metrics-forced-breaker";
    MetricsLog::global();
    let server = RedisServer::start();
    let namespace = unique("metrics-forced");
    let connect = || async {
        Coordinator::redis(server.url())
            .namespace(namespace.as_str())
            .connect()
            .await
            .expect("connect")
    };
    let (service, operator) = (connect().await, connect().await);
    let (scope, untouched) = (unique("forced"), unique("never-forced"));
    let breaker = BreakerId::new(name).scope(scope.as_str());
    let command = |command| {
        let (admin, breaker) = (operator.admin(), &breaker);
        async move { admin.breaker(breaker, command).await.expect("forced") }
    };
    // The end as the service reports it is the coordinator's, counted from when the service
    // asked: a round trip early at most.
    let lasts = Duration::from_secs(600);
    let ends_as_given = |before: SystemTime| {
        let from = unix_seconds(before + lasts) - PATIENCE.as_secs_f64();
        move |value: Option<f64>| {
            value.is_some_and(|value| {
                from <= value && value <= unix_seconds(SystemTime::now() + lasts)
            })
        }
    };
    service
        .scoped(async {
            for scope in [&scope, &untouched] {
                assert_eq!(code(&forced_breakered(scope).await), "ok");
            }
            assert_eq!(forced_until(name, &scope), None, "not forced yet");

            let before = SystemTime::now();
            command(BreakerCommand::Open { lasts: Some(lasts) }).await;
            calls_until_forced_until(name, &scope, ends_as_given(before)).await;
            command(BreakerCommand::Close { lasts: None }).await;
            calls_until_forced_until(name, &scope, |value| value == Some(0.0)).await;
            let before = SystemTime::now();
            command(BreakerCommand::Close { lasts: Some(lasts) }).await;
            calls_until_forced_until(name, &scope, ends_as_given(before)).await;
            command(BreakerCommand::Reset).await;
            calls_until_forced_until(name, &scope, |value| value == Some(0.0)).await;

            // A force that lapses: a call after its end probes, and the gauge clears.
            command(BreakerCommand::Open {
                lasts: Some(Duration::from_secs(1)),
            })
            .await;
            calls_until_forced_until(name, &scope, |value| value > Some(0.0)).await;
            calls_until_forced_until(name, &scope, |value| value == Some(0.0)).await;
        })
        .await;
    assert_eq!(forced_until(name, &untouched), None, "never forced");
    service.shutdown().await;
    operator.shutdown().await;
}

/// A worker connected through a proxy reports the coordinator up, down while the proxy cuts
/// its connections, and up again once they are restored.
#[test]
fn the_coordinator_gauge_follows_the_connections() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let worker = Worker::spawn(
        &proxy.url(),
        &unique("metrics-up"),
        "coordinator-gauge",
        &[format!("scope={}", unique("metrics-up"))],
    );
    assert_eq!(next_gauge(&worker), "1", "up once connected");
    proxy.cut();
    assert_eq!(until_gauge(&worker, "0"), Vec::<String>::new());
    proxy.restore();
    assert_eq!(until_gauge(&worker, "1"), Vec::<String>::new());
}

#[bulkhead(name = "metrics-limit", limit = 3)]
async fn limited_to_three() -> Result<(), TestError> {
    Ok(())
}

/// The limit gauge of `name`'s bulkhead.
fn limit(name: &str) -> Option<f64> {
    MetricsLog::global().gauge(BULKHEAD_LIMIT, &[("name", name), ("operation", name)])
}

#[tokio::test(flavor = "current_thread")]
async fn the_limit_in_force_follows_the_fleet_override() {
    let name = "metrics-limit";
    MetricsLog::global();
    let coordinator = Coordinator::in_memory();
    assert_eq!(limit(name), None, "no series before the first call");
    assert_eq!(code(&coordinator.scoped(limited_to_three()).await), "ok");
    assert_eq!(limit(name), Some(3.0), "the attribute's limit");

    let admin = coordinator.admin();
    admin
        .set_override("bulkhead.metrics-limit.limit", "7")
        .await
        .expect("the override is stored");
    until_limit(&coordinator, 7.0).await;
    admin
        .unset_override("bulkhead.metrics-limit.limit")
        .await
        .expect("the override is removed");
    until_limit(&coordinator, 3.0).await;
}

/// Calls `metrics-limit`'s bulkhead until its limit gauge reads `value`: overrides apply to
/// calls admitted after they arrive.
async fn until_limit(coordinator: &Coordinator, value: f64) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        assert_eq!(code(&coordinator.scoped(limited_to_three()).await), "ok");
        if limit("metrics-limit") == Some(value) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the limit gauge never read {value}: {:?}",
            MetricsLog::global()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[circuit_breaker(
    name = "metrics-rates",
    local,
    minimum_throughput = 100,
    slow_call = "50ms",
    slow_call_threshold = 0.9
)]
async fn rated(fail: bool, slow: bool) -> Result<(), TestError> {
    if slow {
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    if fail {
        Err(TestError::Body("downstream failed"))
    } else {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_breaker_reports_its_windows_failure_and_slow_call_rates() {
    let name = "metrics-rates";
    MetricsLog::global();
    let rate = |metric| {
        MetricsLog::global().gauge(
            metric,
            &[("name", name), ("operation", name), ("scope", "global")],
        )
    };
    // 4 calls: 1 failed, 2 slow (one of them the failure).
    for (fail, slow) in [(true, true), (false, true), (false, false), (false, false)] {
        let _ = rated(fail, slow).await;
    }
    assert_eq!(rate(CIRCUIT_BREAKER_FAILURE_RATE), Some(0.25));
    assert_eq!(rate(CIRCUIT_BREAKER_SLOW_CALL_RATE), Some(0.5));
}

#[retry(max_attempts = 2)]
async fn metrics_retried() -> Result<(), TestError> {
    Err(TestError::Body("downstream failed"))
}

#[fallback(gave_up)]
#[timeout("10ms")]
async fn metrics_timed() -> Result<&'static str, TestError> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok("answered")
}

async fn gave_up(error: caracal::Error) -> Result<&'static str, TestError> {
    assert_eq!(error.code(), "timeout");
    Ok("gave up")
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn retries_timeouts_and_fallbacks_are_counted() {
    let metrics = MetricsLog::global();
    assert_eq!(code(&metrics_retried().await), "body");
    let retries = |outcome| {
        metrics.counter(
            RETRIES_TOTAL,
            &[("name", "metrics_retried"), ("outcome", outcome)],
        )
    };
    assert_eq!(retries("retried"), 1, "{metrics:?}");
    assert_eq!(retries("exhausted"), 1);
    assert_eq!(retries("budget_exhausted"), 0);

    let name = "metrics_timed";
    assert_eq!(
        metrics_timed().await.expect("the fallback's answer"),
        "gave up"
    );
    assert_eq!(metrics.counter(TIMEOUTS_TOTAL, &[("name", name)]), 1);
    assert_eq!(
        metrics.counter(FALLBACKS_TOTAL, &[("name", name), ("reason", "timeout")]),
        1
    );
}

#[bulkhead(name = "metrics-round-trips", limit = 2)]
async fn through_redis() -> Result<(), TestError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_to_redis_are_timed_by_script() {
    let metrics = MetricsLog::global();
    let server = RedisServer::start();
    let coordinator = Coordinator::redis(server.url())
        .namespace(unique("metrics-round-trips").as_str())
        .connect()
        .await
        .expect("connect");
    let timed = || {
        metrics
            .histogram(COORDINATOR_SECONDS, &[("command", "bulkhead_lease")])
            .len()
    };
    let before = timed();
    assert_eq!(code(&coordinator.scoped(through_redis()).await), "ok");
    let what = format!("the acquire timed: {metrics:?}");
    eventually(&what, || timed() > before).await;
    let seconds = metrics.histogram(COORDINATOR_SECONDS, &[("command", "bulkhead_lease")]);
    assert!(
        seconds.iter().all(|s| (0.0..5.0).contains(s)),
        "{seconds:?}"
    );
    coordinator.shutdown().await;
}

#[rate_limit(name = "metrics-prefetch", rate = 100, burst = 4, prefetch = 4)]
async fn prefetching() -> Result<(), TestError> {
    Ok(())
}

/// A rate limit with `prefetch` counts the emissions it took ahead and what became of them:
/// a call takes 4 (3 beyond its own), the next is handed one with no round trip, and the other
/// 2 go back to the fleet once two intervals pass with no call; nothing is left held.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn prefetched_emissions_are_counted() {
    use caracal::metrics::RATE_LIMIT_PREFETCHED_TOTAL;

    let metrics = MetricsLog::global();
    let name = "metrics-prefetch";
    let emissions = |outcome| {
        metrics.counter(
            RATE_LIMIT_PREFETCHED_TOTAL,
            &[("name", name), ("operation", name), ("outcome", outcome)],
        )
    };
    let coordinator = Coordinator::in_memory();
    for _ in 0..2 {
        assert_eq!(code(&coordinator.scoped(prefetching()).await), "ok");
    }
    assert_eq!(
        (emissions("taken"), emissions("used")),
        (3, 1),
        "{metrics:?}"
    );
    assert_eq!(
        decisions(name, "admitted", None),
        2,
        "a call on an emission taken ahead is admitted too"
    );
    eventually("the rest returned", || emissions("returned") == 2).await;
    assert_eq!(emissions("expired"), 0);
}

#[bulkhead(name = "metrics-priority", limit = 1)]
async fn classed() -> Result<(), TestError> {
    Ok(())
}

#[rate_limit(name = "metrics-priority-rate", rate = 1000, burst = 10)]
async fn classed_rate() -> Result<(), TestError> {
    Ok(())
}

#[circuit_breaker(name = "metrics-priority-breaker")]
async fn classless() -> Result<(), TestError> {
    Ok(())
}

/// The decisions of the kinds that decide by class carry the call's priority; a breaker's,
/// which do not depend on it, have no such label.
#[tokio::test(flavor = "current_thread")]
async fn decisions_by_class_carry_the_calls_priority() {
    use caracal::{Priority, with_priority};

    let metrics = MetricsLog::global();
    let coordinator = Coordinator::in_memory();
    let (sheddable, normal, rate, breaker) = (
        coordinator
            .scoped(with_priority(Priority::Sheddable, classed()))
            .await,
        coordinator.scoped(classed()).await,
        coordinator
            .scoped(with_priority(Priority::Critical, classed_rate()))
            .await,
        coordinator
            .scoped(with_priority(Priority::Critical, classless()))
            .await,
    );
    for result in [sheddable, normal, rate, breaker] {
        assert_eq!(code(&result), "ok");
    }
    let count = |name, priority| {
        metrics.counter(DECISIONS_TOTAL, &[("name", name), ("priority", priority)])
    };
    assert_eq!(count("metrics-priority", "sheddable"), 1, "{metrics:?}");
    assert_eq!(count("metrics-priority", "normal"), 1, "{metrics:?}");
    assert_eq!(count("metrics-priority-rate", "critical"), 1, "{metrics:?}");
    for priority in ["critical", "normal", "sheddable"] {
        assert_eq!(
            count("metrics-priority-breaker", priority),
            0,
            "{metrics:?}"
        );
    }
    assert_eq!(
        metrics.counter(DECISIONS_TOTAL, &[("name", "metrics-priority-breaker")]),
        1
    );
}

#[bulkhead(name = "metrics-kept", limit = 2, keep = "50ms")]
async fn kept() -> Result<(), TestError> {
    Ok(())
}

/// A bulkhead with `keep` counts what it did with its leases: two calls in a row keep a lease
/// each time and the second starts on the first's; the second's lease goes back to the fleet
/// once `keep` passes.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn kept_leases_are_counted() {
    let metrics = MetricsLog::global();
    let name = "metrics-kept";
    let leases = |outcome| {
        metrics.counter(
            BULKHEAD_KEPT_LEASES_TOTAL,
            &[("name", name), ("operation", name), ("outcome", outcome)],
        )
    };
    let coordinator = Coordinator::in_memory();
    for _ in 0..2 {
        assert_eq!(code(&coordinator.scoped(kept()).await), "ok");
    }
    assert_eq!(
        (leases("kept"), leases("reused"), leases("returned")),
        (2, 1, 0),
        "{metrics:?}"
    );
    assert_eq!(
        decisions(name, "admitted", None),
        2,
        "a reused call is admitted too"
    );
    eventually("the kept lease returned", || leases("returned") == 1).await;
    assert_eq!((leases("kept"), leases("reused")), (2, 1));
}
