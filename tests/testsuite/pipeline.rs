//! Stacked attributes as one pipeline: timeout, retry, and all five together against Redis.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use caracal::{Coordinator, bulkhead, circuit_breaker, rate_limit, retry, timeout};
use caracal_tests::{CommandLog, EventLog, RedisServer, script_source};

use crate::common::{self, TestError, code, ends, unique, until_code, until_ok};

/// A simulated downstream: it answers each call with the next scripted behaviour, then with
/// the last one forever.
#[derive(Default)]
struct Downstream {
    script: Mutex<Vec<Behaviour>>,
    calls: AtomicU32,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Behaviour {
    Ok,
    Fail,
    Hang,
}

impl Downstream {
    fn scripted(script: &[Behaviour]) -> Self {
        let mut script = script.to_vec();
        script.reverse();
        Downstream {
            script: Mutex::new(script),
            calls: AtomicU32::new(0),
        }
    }

    fn set(&self, behaviour: Behaviour) {
        *self.script.lock().expect("script") = vec![behaviour];
    }

    async fn call(&self) -> Result<u32, TestError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let behaviour = {
            let mut script = self.script.lock().expect("script");
            if script.len() > 1 {
                script.pop()
            } else {
                script.last().copied()
            }
        };
        match behaviour.unwrap_or(Behaviour::Ok) {
            Behaviour::Ok => Ok(n),
            Behaviour::Fail => Err(TestError::Body("downstream failed")),
            // Far longer than any deadline of the suites: only a timeout ends it.
            Behaviour::Hang => {
                tokio::time::sleep(Duration::from_secs(600)).await;
                Ok(n)
            }
        }
    }

    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

#[timeout("100ms")]
#[bulkhead(name = "timeout-slot", limit = 1, scope = scope)]
async fn sleepy(scope: &str, downstream: &Downstream) -> Result<u32, TestError> {
    downstream.call().await
}

/// A hanging body ends with `Timeout` (the body never returns by itself, so the timeout ended
/// it) and its slot is free at once.
async fn a_timeout_ends_the_call_and_frees_the_slot(coordinator: &Coordinator) {
    let scope = unique("timeout");
    let downstream = Downstream::scripted(&[Behaviour::Hang, Behaviour::Ok]);
    let result = ends(
        "a timed-out call",
        coordinator.scoped(sleepy(&scope, &downstream)),
    )
    .await;
    assert_eq!(code(&result), "timeout", "{result:?}");
    // The bulkhead's only slot is free right away: dropping the body released it.
    assert_eq!(
        code(&coordinator.scoped(sleepy(&scope, &downstream)).await),
        "ok"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_in_memory() {
    a_timeout_ends_the_call_and_frees_the_slot(&Coordinator::in_memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_on_redis() {
    let server = RedisServer::start();
    a_timeout_ends_the_call_and_frees_the_slot(&common::redis(&server.url()).await).await;
}

#[retry(max_attempts = 3)]
#[bulkhead(name = "retry-slot", limit = 1)]
async fn three_tries(downstream: &Downstream) -> Result<u32, TestError> {
    downstream.call().await
}

#[retry(max_attempts = 2)]
async fn two_tries(downstream: &Downstream) -> Result<u32, TestError> {
    downstream.call().await
}

#[tokio::test(flavor = "current_thread")]
async fn retry_runs_each_attempt_through_the_inner_bulkhead() {
    let (log, _guard) = EventLog::capture_thread_default();
    let coordinator = Coordinator::in_memory();
    let flaky = Downstream::scripted(&[Behaviour::Fail, Behaviour::Fail, Behaviour::Ok]);
    let result = coordinator.scoped(three_tries(&flaky)).await;
    assert_eq!(result.ok(), Some(3), "succeeded on the third attempt");
    assert_eq!(
        log.count("bulkhead.admitted"),
        3,
        "each attempt admitted on its own"
    );
    assert_eq!(log.count("bulkhead.released"), 3);
    assert_eq!(log.count("retry.scheduled"), 2);

    let failing = Downstream::scripted(&[Behaviour::Fail]);
    match coordinator.scoped(two_tries(&failing)).await {
        Err(TestError::Body(message)) => assert_eq!(message, "downstream failed"),
        other => panic!("expected the body's own error, got {other:?}"),
    }
    assert_eq!(failing.calls(), 2);
    assert_eq!(log.count("retry.exhausted"), 1);
}

#[circuit_breaker(
    name = "outer-breaker",
    minimum_throughput = 1,
    failure_threshold = 0.5
)]
#[retry(max_attempts = 3)]
async fn recovers(downstream: &Downstream) -> Result<u32, TestError> {
    downstream.call().await
}

#[tokio::test(flavor = "current_thread")]
async fn a_breaker_outside_a_retry_records_the_recovery_as_a_success() {
    let (log, _guard) = EventLog::capture_thread_default();
    let coordinator = Coordinator::in_memory();
    let flaky = Downstream::scripted(&[Behaviour::Fail, Behaviour::Ok]);
    assert!(coordinator.scoped(recovers(&flaky)).await.is_ok());
    coordinator.shutdown().await;
    let observation = log.wait_for("circuit_breaker.observation", Duration::from_secs(1));
    assert_eq!(
        (
            observation.field("window_total"),
            observation.field("window_failures")
        ),
        (Some("1"), Some("0")),
        "one outcome, a success: {observation:?}"
    );
    assert_eq!(
        log.count("circuit_breaker.state_changed"),
        0,
        "a single failure would have opened it"
    );
}

#[circuit_breaker(name = "stack", scope = tenant, minimum_throughput = 4, failure_threshold = 0.5,
                  open = "2s", half_open_probes = 1, half_open_successes = 1)]
#[timeout("400ms")]
#[retry(max_attempts = 3, backoff = "5ms")]
#[rate_limit(name = "stack", rate = 1000, burst = 20, scope = tenant)]
#[bulkhead(name = "stack", limit = 2, scope = tenant)]
async fn stacked(tenant: &str, downstream: &Downstream) -> Result<u32, TestError> {
    downstream.call().await
}

fn ignored(_: &Result<(), TestError>) -> caracal::Outcome {
    caracal::Outcome::Ignored
}

/// `stacked`'s breaker, for looking at its state: no attempts, no outcome recorded.
#[circuit_breaker(name = "stack", scope = tenant, minimum_throughput = 4, failure_threshold = 0.5,
                  open = "2s", half_open_probes = 1, half_open_successes = 1, classify = ignored)]
async fn peek(tenant: &str) -> Result<(), TestError> {
    Ok(())
}

/// The five attributes on one function, against Redis:
/// 1. a downstream failing twice then answering: one call, three attempts, each admitted by the
///    bulkhead and charged by the rate limit (counted at the server), one success for the breaker;
/// 2. a failing downstream: each call retries 3 times, the breaker sees one failure per call
///    and opens after 4 calls; the 5th is rejected before any attempt;
/// 3. after `open`, a probe against a healthy downstream closes the breaker;
/// 4. a hanging downstream: the timeout ends the call (retries included) and frees the slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_five_stacked_on_redis() {
    let server = RedisServer::start();
    let coordinator = common::redis(&server.url()).await;
    let tenant = unique("tenant");
    let mut conn = server.connection();

    let flaky = Downstream::scripted(&[Behaviour::Fail, Behaviour::Fail, Behaviour::Ok]);
    CommandLog::start(&mut conn);
    assert_eq!(
        coordinator.scoped(stacked(&tenant, &flaky)).await.ok(),
        Some(3)
    );
    coordinator.shutdown().await;
    // Counted at the server: per attempt one lease taken and released, and one rate-limit
    // charge.
    let log = CommandLog::read(&mut conn);
    let per_attempt = (
        log.script_calls(&script_source("bulkhead_lease")),
        log.calls("zrem"),
        log.script_calls(&script_source("rate_limit")),
    );
    assert_eq!(per_attempt, (3, 3, 3), "{log:?}");

    let coordinator = common::redis(&server.url()).await;
    let failing = Downstream::scripted(&[Behaviour::Fail]);
    for _ in 0..4 {
        assert_eq!(
            code(&coordinator.scoped(stacked(&tenant, &failing)).await),
            "body"
        );
    }
    assert_eq!(failing.calls(), 12, "3 attempts per call");
    // The failures are recorded in the background; this process sees the breaker open once
    // their batch is answered.
    until_code("circuit_open", || coordinator.scoped(peek(&tenant))).await;
    assert_eq!(
        code(&coordinator.scoped(stacked(&tenant, &failing)).await),
        "circuit_open"
    );
    assert_eq!(failing.calls(), 12, "no attempt while open");

    // Past `open` (2 s: long enough that the checks above cannot outlast it on a slow machine).
    tokio::time::sleep(Duration::from_millis(2050)).await;
    failing.set(Behaviour::Ok);
    assert_eq!(
        code(&coordinator.scoped(stacked(&tenant, &failing)).await),
        "ok",
        "the probe"
    );
    // The probe's success is settled in the background: closed once that is answered.
    until_ok(|| coordinator.scoped(peek(&tenant))).await;
    assert_eq!(
        code(&coordinator.scoped(stacked(&tenant, &failing)).await),
        "ok",
        "closed again"
    );

    let hanging = Downstream::scripted(&[Behaviour::Hang]);
    let result = ends(
        "a hanging call",
        coordinator.scoped(stacked(&tenant, &hanging)),
    )
    .await;
    assert_eq!(
        code(&result),
        "timeout",
        "the timeout bounds the retries: {result:?}"
    );
    assert_eq!(hanging.calls(), 1, "one attempt began and was cut off");
    let healthy = Downstream::scripted(&[Behaviour::Ok]);
    assert_eq!(
        code(&coordinator.scoped(stacked(&tenant, &healthy)).await),
        "ok",
        "slots were freed"
    );
    coordinator.shutdown().await;
}
