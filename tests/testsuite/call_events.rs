//! The events of the attributes that guard the whole call — `timeout.elapsed`,
//! `retry.scheduled`, `retry.exhausted`, `fallback.invoked` — carry the function's identity
//! like every policy event: that of the first coordinated attribute written on the function,
//! else the defaults every attribute takes (name = the function's, operation = name, scope
//! `global`).

use std::time::Duration;

use caracal::{Coordinator, bulkhead, circuit_breaker, fallback, rate_limit, retry, timeout};
use caracal_tests::{CapturedEvent, EventLog};

use crate::common::{TestError, code};

/// Checks an event's identity fields: `scope` `None` means the field is absent.
fn assert_identity(
    event: &CapturedEvent,
    (policy, function): (&str, &str),
    (name, operation, scope): (&str, &str, Option<&str>),
) {
    assert_eq!(event.field("policy"), Some(policy), "{event:?}");
    assert_eq!(event.field("function"), Some(function), "{event:?}");
    assert_eq!(event.field("name"), Some(name), "{event:?}");
    assert_eq!(event.field("operation"), Some(operation), "{event:?}");
    assert_eq!(event.field("scope"), scope, "{event:?}");
    assert_eq!(event.field("coordination"), Some("local"), "{event:?}");
}

#[timeout("10ms")]
async fn slow() -> Result<(), TestError> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(())
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_function_without_coordinated_attributes_reports_its_default_identity() {
    let (log, _guard) = EventLog::capture_thread_default();
    assert_eq!(code(&slow().await), "timeout");
    let elapsed = log.wait_for("timeout.elapsed", Duration::from_secs(1));
    assert_identity(
        &elapsed,
        ("timeout", "slow"),
        ("slow", "slow", Some("global")),
    );
    assert_eq!(elapsed.field("after_ms"), Some("10"));
    assert_eq!(
        elapsed.level,
        tracing::Level::DEBUG,
        "per call: an outage must not flood the logs"
    );
}

#[retry(max_attempts = 2)]
#[bulkhead(name = "call-events", operation = "export", limit = 1, scope = format!("tenant:{tenant}"))]
async fn export(tenant: u32) -> Result<(), TestError> {
    Err(TestError::Body("downstream failed"))
}

#[tokio::test(flavor = "current_thread")]
async fn retry_events_carry_the_identity_of_the_coordinated_attribute() {
    let (log, _guard) = EventLog::capture_thread_default();
    let result = Coordinator::in_memory().scoped(export(7)).await;
    assert_eq!(code(&result), "body");
    let identity = ("call-events", "export", Some("tenant:7"));
    let scheduled = log.wait_for("retry.scheduled", Duration::from_secs(1));
    assert_identity(&scheduled, ("retry", "export"), identity);
    assert_eq!(scheduled.field("next_attempt"), Some("2"));
    let exhausted = log.wait_for("retry.exhausted", Duration::from_secs(1));
    assert_identity(&exhausted, ("retry", "export"), identity);
    assert_eq!(exhausted.field("attempts"), Some("2"));
}

async fn queued(rejection: caracal::Error) -> Result<&'static str, TestError> {
    assert_eq!(rejection.code(), "rate_limited");
    Ok("queued")
}

// Written first, the rate limit names the function, though the breaker is outermost.
#[fallback(queued)]
#[rate_limit(name = "call-events-rate", rate = 0.001, scope = "s1")]
#[circuit_breaker(name = "call-events-breaker")]
async fn notify() -> Result<&'static str, TestError> {
    Ok("sent")
}

#[tokio::test(flavor = "current_thread")]
async fn the_first_coordinated_attribute_written_names_the_function() {
    let (log, _guard) = EventLog::capture_thread_default();
    let coordinator = Coordinator::in_memory();
    assert_eq!(coordinator.scoped(notify()).await.ok(), Some("sent"));
    assert_eq!(coordinator.scoped(notify()).await.ok(), Some("queued"));
    let rejected = log.wait_for("rate_limit.rejected", Duration::from_secs(1));
    assert_eq!(
        rejected.level,
        tracing::Level::DEBUG,
        "per call: an outage must not flood the logs"
    );
    let invoked = log.wait_for("fallback.invoked", Duration::from_secs(1));
    assert_identity(
        &invoked,
        ("fallback", "notify"),
        ("call-events-rate", "call-events-rate", Some("s1")),
    );
    assert_eq!(invoked.field("rejection"), Some("rate_limited"));
}

fn always(_: &TestError) -> bool {
    true
}

#[retry(max_attempts = 2, when = always)]
#[bulkhead(name = "call-events-scope", limit = 1, scope = tenant)]
async fn blank_scope(tenant: &str) -> Result<(), TestError> {
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn an_invalid_scope_is_left_out() {
    let (log, _guard) = EventLog::capture_thread_default();
    let result = Coordinator::in_memory().scoped(blank_scope(" ")).await;
    assert_eq!(code(&result), "invalid_scope");
    let scheduled = log.wait_for("retry.scheduled", Duration::from_secs(1));
    assert_identity(
        &scheduled,
        ("retry", "blank_scope"),
        ("call-events-scope", "call-events-scope", None),
    );
}
