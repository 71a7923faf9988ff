//! What the attribute macros expand to, run against the in-memory coordinator: the body's own
//! values and errors pass through unchanged, rejections arrive as `E::from(caracal::Error)`,
//! every kind of function compiles and runs, and stacked attributes nest in the documented
//! order.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use caracal::{bulkhead, circuit_breaker, rate_limit, retry, timeout};
use tokio::sync::Notify;

use crate::common::TestError;

/// Runs `future` with a fresh in-memory coordinator, so no test sees another's state.
async fn isolated<F: Future>(future: F) -> F::Output {
    caracal::Coordinator::in_memory().scoped(future).await
}

fn assert_send<F: Send>(future: F) -> F {
    future
}

fn parse(text: &str) -> Result<u32, TestError> {
    text.parse().map_err(|_| TestError::Body("not a number"))
}

#[bulkhead(limit = 2)]
async fn guarded(text: &str) -> Result<u32, TestError> {
    if text.is_empty() {
        return Err(TestError::Body("empty"));
    }
    let number = parse(text)?;
    Ok(number * 2)
}

#[tokio::test]
async fn the_body_value_and_error_pass_through_unchanged() {
    isolated(async {
        assert!(matches!(guarded("21").await, Ok(42)));
        assert!(matches!(guarded("").await, Err(TestError::Body("empty"))));
        assert!(matches!(
            guarded("x").await,
            Err(TestError::Body("not a number"))
        ));
    })
    .await;
}

#[bulkhead(name = "held", limit = 1)]
async fn hold(entered: &Notify, release: &Notify) -> Result<&'static str, TestError> {
    entered.notify_one();
    release.notified().await;
    Ok("held")
}

#[tokio::test]
async fn a_full_bulkhead_reaches_the_caller_as_its_error_type() {
    isolated(async {
        let (entered, release) = (Notify::new(), Notify::new());
        let (first, second) = tokio::join!(hold(&entered, &release), async {
            entered.notified().await;
            let second = hold(&entered, &release).await;
            release.notify_one();
            second
        });
        assert!(matches!(first, Ok("held")));
        assert!(
            matches!(
                second,
                Err(TestError::Caracal(caracal::Error::BulkheadFull {
                    policy: "held",
                    limit: 1,
                    ..
                }))
            ),
            "{second:?}"
        );
    })
    .await;
}

#[bulkhead(limit = 1, local)]
async fn local_hold(entered: &Notify, release: &Notify) -> Result<(), TestError> {
    entered.notify_one();
    release.notified().await;
    Ok(())
}

#[tokio::test]
async fn a_local_bulkhead_rejects_too() {
    let (entered, release) = (Notify::new(), Notify::new());
    let (first, second) = tokio::join!(local_hold(&entered, &release), async {
        entered.notified().await;
        let second = local_hold(&entered, &release).await;
        release.notify_one();
        second
    });
    assert!(first.is_ok());
    assert!(matches!(
        second,
        Err(TestError::Caracal(caracal::Error::BulkheadFull { .. }))
    ));
}

#[bulkhead(name = "local-line", limit = 1, max_wait = "30s", local)]
async fn local_in_line(entered: &Notify, release: &Notify) -> Result<u32, TestError> {
    entered.notify_one();
    release.notified().await;
    Ok(7)
}

/// A local bulkhead alone on its function decides in the function's own future; a call that
/// finds no slot free and may wait still waits in line, and gets the slot when it is freed.
#[tokio::test]
async fn a_local_bulkhead_lets_a_caller_wait_in_line_for_the_slot() {
    let (entered, release) = (Notify::new(), Notify::new());
    let (second_entered, second_release) = (Notify::new(), Notify::new());
    let (first, second) = tokio::join!(local_in_line(&entered, &release), async {
        entered.notified().await;
        let second = local_in_line(&second_entered, &second_release);
        tokio::pin!(second);
        // Not admitted while the first call holds the only slot.
        tokio::select! {
            biased;
            _ = second_entered.notified() => panic!("admitted past the limit"),
            _ = &mut second => panic!("refused rather than waiting in line"),
            _ = tokio::task::yield_now() => {}
        }
        release.notify_one();
        second_release.notify_one();
        second.await
    });
    assert!(matches!(first, Ok(7)), "{first:?}");
    assert!(matches!(second, Ok(7)), "{second:?}");
    // Both slots were given back: a third call is admitted at once.
    let third = Notify::new();
    third.notify_one();
    let third = local_in_line(&Notify::new(), &third).await;
    assert!(matches!(third, Ok(7)), "{third:?}");
}

#[bulkhead(name = "fenced-outer", limit = 1)]
async fn fenced_outer() -> Result<(Option<u64>, Option<u64>), TestError> {
    let inner = local_inside().await?;
    Ok((caracal::fencing_token(), inner))
}

#[bulkhead(name = "fenced-inner", limit = 1, local)]
async fn local_inside() -> Result<Option<u64>, TestError> {
    Ok(caracal::fencing_token())
}

/// A body guarded by a local bulkhead carries no fencing token, even inside a distributed
/// bulkhead's body whose lease has one: a local slot is no lease.
#[tokio::test]
async fn a_local_bulkhead_inside_a_fenced_body_shows_no_token() {
    let (outer, inner) = isolated(fenced_outer()).await.expect("admitted");
    assert!(
        outer.is_some(),
        "the distributed bulkhead's body has its token"
    );
    assert_eq!(inner, None, "the local bulkhead's body shows none");
}

/// Items of the user's named like the expansion's bindings (which a pattern would take for
/// constants) leave it alone.
mod names_in_scope {
    #![allow(non_upper_case_globals)]

    use caracal::bulkhead;

    use crate::common::TestError;

    const error: u32 = 1;
    const body: u32 = 2;
    const fenced_off: u32 = 4;

    #[bulkhead(limit = 1, scope = "tenant", local)]
    pub(super) async fn guarded() -> Result<u32, TestError> {
        Ok(error + body + fenced_off)
    }
}

#[tokio::test]
async fn the_expansions_bindings_leave_the_users_items_alone() {
    assert!(matches!(names_in_scope::guarded().await, Ok(7)));
}

struct Client {
    tenant: String,
    calls: u32,
}

impl Client {
    #[bulkhead(limit = 4, scope = &self.tenant)]
    async fn by_ref(&self, n: u32) -> Result<u32, TestError> {
        Ok(n + self.calls)
    }

    #[retry(max_attempts = 5)]
    #[bulkhead(limit = 4, scope = format!("{}:{n}", self.tenant))]
    async fn by_mut(&mut self, n: u32) -> Result<u32, TestError> {
        self.calls += 1;
        if self.calls < 3 {
            return Err(TestError::Body("flaky"));
        }
        Ok(n + self.calls)
    }

    #[timeout("1s")]
    async fn by_value(self) -> Result<String, TestError> {
        Ok(self.tenant)
    }
}

trait Fetch {
    async fn fetch(&self, id: u64) -> Result<u64, TestError>;
}

impl Fetch for Client {
    #[circuit_breaker(scope = &self.tenant)]
    #[rate_limit(rate = 1000, burst = 10, scope = &self.tenant)]
    async fn fetch(&self, id: u64) -> Result<u64, TestError> {
        Ok(id + 1)
    }
}

#[bulkhead(limit = 3, scope = "generic")]
async fn generic<'a, T, U>(items: &'a [T], extra: U) -> Result<Vec<String>, TestError>
where
    T: std::fmt::Display + Sync,
    U: Into<u32> + Send,
{
    let extra = extra.into();
    Ok(items.iter().map(|item| format!("{item}+{extra}")).collect())
}

#[tokio::test]
async fn methods_trait_methods_and_generic_functions_run() {
    isolated(async {
        let mut client = Client {
            tenant: "t1".to_owned(),
            calls: 0,
        };
        assert!(matches!(client.by_ref(1).await, Ok(1)));
        // The `&mut self` body runs once per attempt: two failures, then a success.
        assert!(matches!(client.by_mut(10).await, Ok(13)));
        assert_eq!(client.calls, 3);
        assert!(matches!(client.fetch(41).await, Ok(42)));
        assert_eq!(client.by_value().await.unwrap(), "t1");
        let items = generic(&[1, 2], 7u8).await.unwrap();
        assert_eq!(items, ["1+7", "2+7"]);
    })
    .await;
}

/// The retry predicate of the stacking tests: every error, caracal's timeouts included.
fn always(_: &TestError) -> bool {
    true
}

/// Sleeps past the 50 ms timeouts below on the first two attempts.
async fn slow_twice(attempts: &AtomicU32) -> Result<u32, TestError> {
    let attempt = attempts.fetch_add(1, Ordering::SeqCst);
    if attempt < 2 {
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    Ok(attempt)
}

#[retry(max_attempts = 3, when = always)]
#[timeout("50ms")]
async fn timeout_per_attempt(attempts: &AtomicU32) -> Result<u32, TestError> {
    slow_twice(attempts).await
}

#[timeout("50ms")]
#[retry(max_attempts = 3, when = always)]
async fn timeout_around_retries(attempts: &AtomicU32) -> Result<u32, TestError> {
    slow_twice(attempts).await
}

#[retry(max_attempts = 3)]
#[timeout("50ms")]
async fn timeout_not_retried_by_default(attempts: &AtomicU32) -> Result<u32, TestError> {
    slow_twice(attempts).await
}

#[tokio::test]
async fn stacked_attributes_nest_in_the_order_written() {
    // Retry outermost: each attempt has its own 50 ms.
    let attempts = AtomicU32::new(0);
    assert!(matches!(timeout_per_attempt(&attempts).await, Ok(2)));
    assert_eq!(attempts.load(Ordering::SeqCst), 3);

    // Timeout outermost: 50 ms for all attempts together.
    let attempts = AtomicU32::new(0);
    let result = timeout_around_retries(&attempts).await;
    assert!(
        matches!(
            result,
            Err(TestError::Caracal(caracal::Error::Timeout { .. }))
        ),
        "{result:?}"
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 1);

    // By default a caracal rejection is not retried: the retry layer sees the timeout's
    // rejection through the call's shared context.
    let attempts = AtomicU32::new(0);
    let result = timeout_not_retried_by_default(&attempts).await;
    assert!(matches!(
        result,
        Err(TestError::Caracal(caracal::Error::Timeout { .. }))
    ));
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
}

fn counted(evaluations: &AtomicU32) -> String {
    evaluations.fetch_add(1, Ordering::SeqCst);
    "tenant".to_owned()
}

#[retry(max_attempts = 3)]
#[bulkhead(limit = 1, scope = counted(evaluations))]
async fn always_fails(evaluations: &AtomicU32, attempts: &AtomicU32) -> Result<(), TestError> {
    attempts.fetch_add(1, Ordering::SeqCst);
    Err(TestError::Body("always"))
}

#[tokio::test]
async fn a_scope_is_evaluated_once_per_call_whatever_the_attempts() {
    isolated(async {
        let (evaluations, attempts) = (AtomicU32::new(0), AtomicU32::new(0));
        let result = always_fails(&evaluations, &attempts).await;
        assert!(matches!(result, Err(TestError::Body("always"))));
        assert_eq!(attempts.load(Ordering::SeqCst), 3);
        assert_eq!(evaluations.load(Ordering::SeqCst), 1);
    })
    .await;
}

#[bulkhead(limit = 1, scope = tenant)]
async fn per_tenant(tenant: String) -> Result<(), TestError> {
    let _ = tenant;
    Ok(())
}

#[bulkhead(limit = 1, scope = String::new())]
async fn blank_scope() -> Result<(), TestError> {
    Ok(())
}

#[tokio::test]
async fn a_blank_scope_is_an_invalid_scope_error() {
    isolated(async {
        assert!(matches!(
            blank_scope().await,
            Err(TestError::Caracal(caracal::Error::InvalidScope { .. }))
        ));
        for blank in [String::new(), " \t".to_owned()] {
            let result = per_tenant(blank).await;
            assert!(
                matches!(
                    result,
                    Err(TestError::Caracal(caracal::Error::InvalidScope { .. }))
                ),
                "{result:?}"
            );
        }
        assert!(per_tenant("t1".to_owned()).await.is_ok());
    })
    .await;
}

#[circuit_breaker(name = "partner-api", scope = format!("region:{region}"), open = "30s")]
#[timeout("2s")]
#[retry(max_attempts = 3, backoff = "1ms")]
#[bulkhead(name = "partner-api", limit = 20, scope = format!("region:{region}"))]
#[rate_limit(rate = 100, burst = 5, local)]
async fn all_five(region: &str, id: u64) -> Result<u64, TestError> {
    if id == 0 {
        return Err(TestError::Body("no such order"));
    }
    Ok(id)
}

#[tokio::test]
async fn all_five_stacked_run_and_the_future_is_send() {
    isolated(async {
        assert!(matches!(assert_send(all_five("eu", 7)).await, Ok(7)));
        assert!(matches!(
            all_five("eu", 0).await,
            Err(TestError::Body("no such order"))
        ));
    })
    .await;
}

#[circuit_breaker]
async fn breaker_only() -> Result<u64, TestError> {
    Ok(1)
}

#[timeout("2s")]
async fn timeout_only() -> Result<u64, TestError> {
    Ok(1)
}

#[retry(max_attempts = 3)]
async fn retry_only() -> Result<u64, TestError> {
    Ok(1)
}

#[bulkhead(limit = 20)]
async fn bulkhead_only() -> Result<u64, TestError> {
    Ok(1)
}

#[rate_limit(rate = 100)]
async fn rate_limit_only() -> Result<u64, TestError> {
    Ok(1)
}

#[test]
fn stacked_layers_add_up_their_future_sizes_rather_than_multiply_them() {
    use std::mem::size_of_val;
    let layers = size_of_val(&breaker_only())
        + size_of_val(&timeout_only())
        + size_of_val(&retry_only())
        + size_of_val(&bulkhead_only())
        + size_of_val(&rate_limit_only());
    let stacked = size_of_val(&all_five("eu", 7));
    println!("five layers: {layers} bytes alone, {stacked} bytes stacked");
    // Each layer holding its inner future by value would double the size per layer.
    assert!(
        stacked <= layers,
        "{stacked} bytes stacked, {layers} bytes alone"
    );
}
