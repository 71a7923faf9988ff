//! `#[fallback(handler)]` against the in-memory coordinator: which outcomes reach the handler
//! (each of caracal's six protective rejections) and which do not (the body's own errors, mistakes
//! in the program), with which error, and how the handler's answer takes its place in the
//! pipeline (one final outcome outside a retry; judged like the body's inside a breaker or a
//! retry).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::common::{TestError, code, unique};
use caracal::{Coordinator, bulkhead, circuit_breaker, fallback, rate_limit, retry, timeout};
use tokio::sync::Notify;

/// Counts calls of a body or a handler.
#[derive(Default)]
struct Calls(AtomicU32);

impl Calls {
    fn count(&self) -> u32 {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn get(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Answers with the code of the rejection it was handed.
async fn answer(
    scope: &str,
    _: &Notify,
    _: &Notify,
    rejection: caracal::Error,
) -> Result<String, TestError> {
    assert!(!scope.is_empty());
    Ok(format!("fallback: {}", rejection.code()))
}

#[fallback(answer)]
#[bulkhead(limit = 1, scope = scope)]
async fn hold(scope: &str, entered: &Notify, release: &Notify) -> Result<String, TestError> {
    entered.notify_one();
    release.notified().await;
    Ok("body".to_owned())
}

#[tokio::test]
async fn a_full_bulkhead_is_answered_by_the_handler() {
    let scope = unique("full");
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
    assert_eq!(first.ok().as_deref(), Some("body"));
    assert_eq!(second.ok().as_deref(), Some("fallback: bulkhead_full"));
}

async fn cached(fail: bool, calls: &Calls, rejection: caracal::Error) -> Result<String, TestError> {
    calls.count();
    Ok(format!("fallback after {fail}: {}", rejection.code()))
}

#[fallback(cached)]
#[circuit_breaker(minimum_throughput = 1, window_size = 1, open = "1h")]
async fn flaky(fail: bool, calls: &Calls) -> Result<String, TestError> {
    if fail {
        return Err(TestError::Body("downstream failed"));
    }
    Ok("body".to_owned())
}

#[tokio::test]
async fn an_open_circuit_is_answered_but_the_body_s_own_error_is_not() {
    let handler = Calls::default();
    Coordinator::in_memory()
        .scoped(async {
            assert_eq!(code(&flaky(true, &handler).await), "body", "passed through");
            assert_eq!(
                handler.get(),
                0,
                "the body's own error never reaches the handler"
            );
            assert_eq!(
                flaky(false, &handler).await.ok().as_deref(),
                Some("fallback after false: circuit_open")
            );
            assert_eq!(handler.get(), 1);
        })
        .await;
}

async fn later(_: &str, rejection: caracal::Error) -> Result<String, TestError> {
    match rejection {
        caracal::Error::RateLimited { retry_after, .. } => {
            assert!(retry_after > Duration::ZERO);
            Ok(format!("fallback: {}", rejection.code()))
        }
        other => panic!("expected the rate limit's own error, got {other:?}"),
    }
}

#[fallback(later)]
#[rate_limit(rate = 0.001, scope = scope)]
async fn limited(scope: &str) -> Result<String, TestError> {
    Ok("body".to_owned())
}

#[tokio::test]
async fn a_rate_limit_is_answered_with_its_own_error() {
    let scope = unique("rate");
    Coordinator::in_memory()
        .scoped(async {
            assert_eq!(limited(&scope).await.ok().as_deref(), Some("body"));
            assert_eq!(
                limited(&scope).await.ok().as_deref(),
                Some("fallback: rate_limited")
            );
        })
        .await;
}

async fn too_slow(label: String, rejection: caracal::Error) -> Result<String, TestError> {
    Ok(format!("fallback for {label}: {}", rejection.code()))
}

// An owned argument: the body borrows it, the handler gets it afterwards.
#[fallback(too_slow)]
#[timeout("50ms")]
async fn hangs(label: String) -> Result<String, TestError> {
    tokio::time::sleep(Duration::from_secs(3600)).await;
    Ok(label.clone())
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_timeout_is_answered_and_the_handler_gets_owned_arguments() {
    assert_eq!(
        hangs("report".to_owned()).await.ok().as_deref(),
        Some("fallback for report: timeout")
    );
}

// Also called uninstalled by `install`'s test (the only one calling outside `scoped`): a
// missing coordinator is a mistake in the program, which the handler never hides.
async fn degraded(rejection: caracal::Error) -> Result<String, TestError> {
    Ok(format!("fallback: {}", rejection.code()))
}

#[fallback(degraded)]
#[bulkhead(limit = 5)]
pub(crate) async fn needs_coordinator() -> Result<String, TestError> {
    Ok("body".to_owned())
}

#[tokio::test]
async fn a_coordinator_outage_is_answered() {
    let coordinator = Coordinator::in_memory();
    coordinator.shutdown().await;
    assert_eq!(
        coordinator
            .scoped(needs_coordinator())
            .await
            .ok()
            .as_deref(),
        Some("fallback: coordinator_unavailable")
    );
}

async fn blank_scope(_: &str, _: caracal::Error) -> Result<String, TestError> {
    panic!("an invalid scope is the program's mistake, not a rejection to answer")
}

#[fallback(blank_scope)]
#[rate_limit(rate = 10, scope = scope)]
async fn scoped_by(scope: &str) -> Result<String, TestError> {
    Ok("body".to_owned())
}

#[tokio::test]
async fn an_invalid_scope_reaches_the_caller() {
    let result = Coordinator::in_memory().scoped(scoped_by(" ")).await;
    assert_eq!(code(&result), "invalid_scope");
}

fn every_error(_: &TestError) -> bool {
    true
}

async fn after_retries(
    body: &Calls,
    handler: &Calls,
    rejection: caracal::Error,
) -> Result<String, TestError> {
    handler.count();
    Ok(format!(
        "fallback after {}: {}",
        body.get(),
        rejection.code()
    ))
}

// Outside the retry: one answer, for the last attempt's outcome.
#[fallback(after_retries)]
#[retry(max_attempts = 3, when = every_error)]
#[timeout("50ms")]
async fn slow_every_time(body: &Calls, handler: &Calls) -> Result<String, TestError> {
    body.count();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    Ok("body".to_owned())
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn outside_a_retry_the_handler_answers_once_after_the_last_attempt() {
    let (body, handler) = (Calls::default(), Calls::default());
    assert_eq!(
        slow_every_time(&body, &handler).await.ok().as_deref(),
        Some("fallback after 3: timeout")
    );
    assert_eq!((body.get(), handler.get()), (3, 1));
}

async fn failing_answer(
    body: &Calls,
    handler: &Calls,
    _: caracal::Error,
) -> Result<String, TestError> {
    handler.count();
    assert!(body.get() > 0);
    Err(TestError::Body("no cached answer"))
}

// Inside the retry: the handler's answer is the attempt's outcome, an error of its own that
// the retry takes like the body's (a rejection it would not retry).
#[retry(max_attempts = 3)]
#[fallback(failing_answer)]
#[timeout("50ms")]
async fn retried_answers(body: &Calls, handler: &Calls) -> Result<String, TestError> {
    body.count();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    Ok("body".to_owned())
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn inside_a_retry_the_handler_s_error_is_retried_like_the_body_s() {
    let (body, handler) = (Calls::default(), Calls::default());
    let result = retried_answers(&body, &handler).await;
    assert_eq!(code(&result), "body");
    assert_eq!((body.get(), handler.get()), (3, 3));
}

async fn recovered(
    answers: &Calls,
    fail: bool,
    _: &str,
    _: caracal::Error,
) -> Result<String, TestError> {
    answers.count();
    if fail {
        return Err(TestError::Body("no cached answer"));
    }
    Ok("fallback".to_owned())
}

// Inside the breaker: the breaker judges the handler's answer, not the rejection it replaced
// (which, from a rate limit, the breaker would ignore). Local, so that it opens on the very
// call that tips the window.
#[circuit_breaker(minimum_throughput = 2, window_size = 2, open = "1h", scope = scope, local)]
#[fallback(recovered)]
#[rate_limit(rate = 0.001, scope = scope)]
async fn judged(answers: &Calls, fail: bool, scope: &str) -> Result<String, TestError> {
    Ok("body".to_owned())
}

#[tokio::test]
async fn inside_a_breaker_the_breaker_judges_the_handler_s_answer() {
    let answers = Calls::default();
    let scope = unique("judged");
    Coordinator::in_memory()
        .scoped(async {
            assert_eq!(code(&judged(&answers, false, &scope).await), "ok");
            // Rate limited from now on, but answered successfully: the breaker stays closed.
            for _ in 0..4 {
                assert_eq!(code(&judged(&answers, false, &scope).await), "ok");
            }
            // Answered with an error, it opens (one failure in a window of two is half);
            // then the breaker (outside) rejects without asking the handler (inside).
            assert_eq!(code(&judged(&answers, true, &scope).await), "body");
            assert_eq!(code(&judged(&answers, false, &scope).await), "circuit_open");
        })
        .await;
    assert_eq!(answers.get(), 5);
}

struct Client {
    name: String,
    sent: u32,
}

impl Client {
    #[fallback(Self::unsent)]
    #[rate_limit(rate = 0.001, scope = &self.name)]
    async fn send(&mut self, message: &str) -> Result<String, TestError> {
        self.sent += 1;
        Ok(format!("sent {message}"))
    }

    async fn unsent(
        &mut self,
        message: &str,
        rejection: caracal::Error,
    ) -> Result<String, TestError> {
        Ok(format!(
            "kept {message} after {} sent: {}",
            self.sent,
            rejection.code()
        ))
    }
}

#[tokio::test]
async fn a_method_s_handler_gets_the_receiver_back() {
    let mut client = Client {
        name: unique("client"),
        sent: 0,
    };
    Coordinator::in_memory()
        .scoped(async {
            assert_eq!(client.send("a").await.ok().as_deref(), Some("sent a"));
            assert_eq!(
                client.send("b").await.ok().as_deref(),
                Some("kept b after 1 sent: rate_limited")
            );
        })
        .await;
}

async fn lost(_: &Coordinator, rejection: caracal::Error) -> Result<String, TestError> {
    Ok(format!("fallback: {}", rejection.code()))
}

// The coordinator goes away while the body holds its lease: renewals fail, and the lease is
// given up before the server could have expired it.
#[fallback(lost)]
#[bulkhead(limit = 1, lease = "100ms")]
async fn outlives(coordinator: &Coordinator) -> Result<String, TestError> {
    coordinator.shutdown().await;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    Ok("body".to_owned())
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_lost_lease_is_answered() {
    let coordinator = Coordinator::in_memory();
    assert_eq!(
        coordinator
            .scoped(outlives(&coordinator))
            .await
            .ok()
            .as_deref(),
        Some("fallback: lease_lost")
    );
}
