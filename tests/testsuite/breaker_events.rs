//! The breaker's `tracing` events: stable names, generations and window counts.

use std::time::Duration;

use crate::common::{TestError, code};
use caracal::{Coordinator, circuit_breaker};
use caracal_tests::{CapturedEvent, EventLog};

#[circuit_breaker(
    name = "events",
    minimum_throughput = 4,
    open = "1s",
    half_open_probes = 1,
    half_open_successes = 1
)]
async fn call(fail: bool, pause: Duration) -> Result<(), TestError> {
    tokio::time::sleep(pause).await;
    if fail {
        Err(TestError::Body("downstream failed"))
    } else {
        Ok(())
    }
}

fn field<'a>(event: &'a CapturedEvent, name: &str) -> &'a str {
    event
        .field(name)
        .unwrap_or_else(|| panic!("{name} missing from {event:?}"))
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_breaker_lifecycle_in_events() {
    let (log, _guard) = EventLog::capture_thread_default();
    let coordinator = Coordinator::in_memory();
    let wait = Duration::from_secs(1);
    coordinator
        .scoped(async {
            // A slow success admitted under generation 0 finishes after the breaker opened.
            let slow = call(false, Duration::from_millis(500));
            let failures = async {
                for _ in 0..4 {
                    let _ = call(true, Duration::ZERO).await;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let (slow, ()) = tokio::join!(slow, failures);
            assert_eq!(code(&slow), "ok");
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(code(&call(false, Duration::ZERO).await), "circuit_open");
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(code(&call(false, Duration::ZERO).await), "ok");
            tokio::time::sleep(Duration::from_millis(20)).await;
        })
        .await;

    let admitted = log.wait_for("circuit_breaker.admitted", wait);
    assert_eq!(admitted.level, tracing::Level::DEBUG);
    assert_eq!(
        (field(&admitted, "state"), field(&admitted, "generation")),
        ("closed", "0")
    );
    let observation = log.wait_for("circuit_breaker.observation", wait);
    assert_eq!(field(&observation, "policy"), "circuit_breaker");
    assert_eq!(field(&observation, "coordination"), "distributed");
    assert!(field(&observation, "window_total").parse::<u32>().is_ok());
    let opened = log.wait_for_where("circuit_breaker.state_changed", wait, |f| {
        f.get("to").map(String::as_str) == Some("open")
    });
    assert_eq!(
        (field(&opened, "from"), field(&opened, "generation")),
        ("closed", "1")
    );
    assert_eq!(
        (
            field(&opened, "window_total"),
            field(&opened, "window_failures")
        ),
        ("4", "4")
    );
    let stale = log.wait_for("circuit_breaker.observation_stale", wait);
    assert_eq!(
        (
            field(&stale, "attempt_generation"),
            field(&stale, "current_generation")
        ),
        ("0", "1")
    );
    let rejected = log.wait_for("circuit_breaker.rejected", wait);
    assert_eq!(
        rejected.level,
        tracing::Level::DEBUG,
        "per call: an outage must not flood the logs"
    );
    assert_eq!(
        (field(&rejected, "state"), field(&rejected, "generation")),
        ("open", "1")
    );
    assert!(
        field(&rejected, "retry_after_ms")
            .parse::<u64>()
            .is_ok_and(|ms| ms <= 1000)
    );
    let half_open = log.wait_for_where("circuit_breaker.state_changed", wait, |f| {
        f.get("to").map(String::as_str) == Some("half_open")
    });
    assert_eq!(field(&half_open, "from"), "open");
    let probe = log.wait_for("circuit_breaker.probe_started", wait);
    assert_eq!(field(&probe, "generation"), "1");
    let closed = log.wait_for_where("circuit_breaker.state_changed", wait, |f| {
        f.get("to").map(String::as_str) == Some("closed")
    });
    assert_eq!(
        (field(&closed, "from"), field(&closed, "generation")),
        ("half_open", "2")
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn coordinator_errors_and_degraded_decisions() {
    let (log, _guard) = EventLog::capture_thread_default();
    let coordinator = Coordinator::in_memory();
    coordinator.shutdown().await;
    let result = coordinator.scoped(call(false, Duration::ZERO)).await;
    assert_eq!(code(&result), "ok", "fail_open ran the body");
    let error = log.wait_for("circuit_breaker.coordinator_error", Duration::from_secs(1));
    assert_eq!(
        (field(&error, "command"), field(&error, "error")),
        ("admit", "coordinator_unavailable")
    );
    assert_eq!(
        field(&error, "operation"),
        field(&error, "name"),
        "the identity's operation, not the command's name"
    );
    let degraded = log.wait_for("circuit_breaker.degraded", Duration::from_secs(1));
    assert_eq!(field(&degraded, "behaviour"), "fail_open");
}

/// An operator's command carried out by this process (through its own admin API) takes effect
/// at this process's very next call, and is announced here, though the process skips its own
/// messages: before, its view still said closed until it went stale.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_operators_command_made_here_is_in_force_here_at_once() {
    use caracal::admin::{BreakerCommand, BreakerId};
    let (log, _guard) = EventLog::capture_thread_default();
    let coordinator = Coordinator::in_memory();
    let breaker = BreakerId::new("events");
    coordinator
        .scoped(async {
            assert_eq!(code(&call(false, Duration::ZERO).await), "ok");
            let admin = coordinator.admin();
            let opened = admin.breaker(&breaker, BreakerCommand::Open { lasts: None });
            opened.await.expect("forced open");
            assert_eq!(code(&call(false, Duration::ZERO).await), "circuit_open");
            let reset = admin.breaker(&breaker, BreakerCommand::Reset);
            reset.await.expect("reset");
            assert_eq!(code(&call(false, Duration::ZERO).await), "ok");
        })
        .await;
    let forced = log.wait_for_where(
        "circuit_breaker.state_changed",
        Duration::from_secs(1),
        |f| f.get("to").map(String::as_str) == Some("forced_open"),
    );
    assert_eq!(field(&forced, "origin"), "operator");
}
