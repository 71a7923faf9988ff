//! `#[hedge]` through the macro: a slow attempt is hedged and the fast one wins, on a method
//! borrowing `&self`; a bulkhead below counts every attempt and the dropped losers release
//! their leases; the named budget is the fleet's, shared with the retries of another
//! coordinator, and counted honestly (one deposit per call, one withdrawal per extra attempt)
//! whether a `#[retry_budget]` of the name sits above the hedge or below it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use caracal::admin::StatusValue;
use caracal::{Coordinator, PolicyKind, bulkhead, hedge, retry, retry_budget};
use caracal_tests::{MetricsLog, RedisServer};

use crate::common::{self, Leases, PATIENCE, TestError, code, unique};

struct Downstream {
    attempts: AtomicU32,
}

impl Downstream {
    fn new() -> Self {
        Downstream {
            attempts: AtomicU32::new(0),
        }
    }

    /// The first attempt never answers; the others answer at once.
    #[hedge(name = "hedge-method", delay = "50ms")]
    async fn get(&self, id: u64) -> Result<(u64, u32), TestError> {
        let attempt = self.attempts.fetch_add(1, Ordering::SeqCst);
        if attempt == 0 {
            std::future::pending::<()>().await;
        }
        Ok((id, attempt))
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_slow_first_attempt_is_hedged_and_the_fast_one_wins() {
    let metrics = MetricsLog::global();
    let labels = |outcome| [("name", "hedge-method"), ("outcome", outcome)];
    let before = |outcome| metrics.counter("caracal_hedges_total", &labels(outcome));
    let (sent, won) = (before("sent"), before("won"));
    let downstream = Downstream::new();
    let answer = downstream.get(7).await;
    assert_eq!(answer.unwrap(), (7, 1), "the second attempt's answer");
    assert_eq!(downstream.attempts.load(Ordering::SeqCst), 2);
    assert_eq!(before("sent") - sent, 1);
    assert_eq!(before("won") - won, 1);
}

/// Three attempts at most; the first two never answer.
#[hedge(delay = "20ms", max_extra = 2)]
#[bulkhead(name = "hedge-leases", limit = 3, scope = scope)]
async fn third_answers(scope: &str, attempts: &AtomicU32) -> Result<u32, TestError> {
    let attempt = attempts.fetch_add(1, Ordering::SeqCst);
    if attempt < 2 {
        std::future::pending::<()>().await;
    }
    Ok(attempt)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dropped_attempts_release_their_leases() {
    let server = RedisServer::start();
    let coordinator = common::redis(&server.url()).await;
    let mut leases = Leases::on(&server);
    let scope = unique("losers");
    let attempts = AtomicU32::new(0);
    let answer = common::ends(
        "the hedged call",
        coordinator.scoped(third_answers(&scope, &attempts)),
    )
    .await;
    assert_eq!(answer.unwrap(), 2);
    // Each attempt held a lease of its own; the two dropped ones are released, not left to
    // expire (the leases last 30 s, far past the patience).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while leases.live() > 0 {
        assert!(tokio::time::Instant::now() < deadline, "leases left behind");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A bulkhead of one below the hedge: the extra attempt is refused while the first holds
/// the slot, and the call waits for the first.
#[hedge(delay = "20ms")]
#[bulkhead(name = "hedge-counted", limit = 1, local)]
async fn held(entered: &AtomicU32) -> Result<u32, TestError> {
    entered.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(0)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_bulkhead_below_counts_each_attempt() {
    let entered = AtomicU32::new(0);
    let answer = held(&entered).await;
    assert_eq!(answer.unwrap(), 0, "the first attempt's answer");
    assert_eq!(
        entered.load(Ordering::SeqCst),
        1,
        "the extra was refused a slot"
    );
}

/// Spends the budget's floor (60 in the window) on retries of a failing call.
#[retry_budget(name = "hedge-fleet", percent = 0, min_per_second = 1, window = "60s",
               scope = scope)]
#[retry(max_attempts = 100)]
async fn spend_the_floor(scope: &str, attempts: &AtomicU32) -> Result<(), TestError> {
    attempts.fetch_add(1, Ordering::SeqCst);
    Err(TestError::Body("down"))
}

/// A slow first attempt, and extras that answer at once.
#[hedge(delay = "10ms", budget = "hedge-fleet", scope = scope)]
async fn hedged_on_the_fleet(scope: &str, attempts: &AtomicU32) -> Result<u32, TestError> {
    let attempt = attempts.fetch_add(1, Ordering::SeqCst);
    if attempt == 0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(attempt)
}

/// The retry budget's deposits and withdrawals at `scope`, once the window holds `deposits`.
async fn window(coordinator: &Coordinator, scope: &str, deposits: u64) -> (u64, u64) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let rows = coordinator.admin().status().await.expect("status");
        let count = |row: &caracal::admin::IdentityStatus, field| match row.state.get(field) {
            Some(StatusValue::Count(n)) => *n,
            other => panic!("{field}: {other:?}"),
        };
        let seen = rows
            .iter()
            .find(|row| row.kind == PolicyKind::RetryBudget && row.scope == scope)
            .map(|row| (count(row, "deposits"), count(row, "withdrawals")));
        if let Some(seen) = seen
            && seen.0 >= deposits
        {
            return seen;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the window at {scope} never held {deposits} deposits: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedges_withdraw_from_the_fleet_budget_the_retries_spent() {
    let server = RedisServer::start();
    let namespace = unique("ns");
    let connect = || {
        Coordinator::redis(server.url())
            .namespace(namespace.clone())
            .connect()
    };
    let (retrier, hedger) = (connect().await.unwrap(), connect().await.unwrap());
    let scope = unique("fleet");
    // One coordinator's retries spend the fleet's floor.
    let attempts = AtomicU32::new(0);
    let spent = retrier.scoped(spend_the_floor(&scope, &attempts)).await;
    assert_eq!(code(&spent), "body");
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        61,
        "the first and the floor's 60"
    );
    assert_eq!(window(&retrier, &scope, 1).await, (1, 60));
    // The other's hedges are refused once its view of that window is refreshed (by its first
    // calls' deposits): a budget of its own would allow it 60.
    let metrics = MetricsLog::global();
    let refusals = || {
        let labels = [
            ("name", "hedged_on_the_fleet"),
            ("outcome", "refused_by_budget"),
        ];
        metrics.counter("caracal_hedges_total", &labels)
    };
    let refused = refusals();
    let (mut calls, mut sent) = (0, 0);
    while refusals() == refused {
        assert!(
            calls < 60,
            "still hedging after {calls} calls ({sent} extra attempts)"
        );
        let attempts = AtomicU32::new(0);
        let answer = hedger.scoped(hedged_on_the_fleet(&scope, &attempts)).await;
        assert!(answer.is_ok());
        calls += 1;
        sent += u64::from(attempts.load(Ordering::SeqCst) - 1);
    }
    // One deposit per call, one withdrawal per extra attempt sent.
    assert_eq!(
        window(&retrier, &scope, 1 + calls).await,
        (1 + calls, 60 + sent)
    );
}

/// A budget above the hedge, of the name it draws from.
#[retry_budget(name = "hedge-above", percent = 100, min_per_second = 0, window = "60s",
               scope = scope)]
#[hedge(delay = "10ms", budget = "hedge-above", scope = scope)]
async fn budget_above(scope: &str, attempts: &AtomicU32) -> Result<u32, TestError> {
    slow_first(attempts).await
}

/// The same, with the budget below the hedge (over a `#[retry]` it gates).
#[hedge(delay = "10ms", budget = "hedge-below", scope = scope)]
#[retry_budget(name = "hedge-below", percent = 100, min_per_second = 0, window = "60s",
               scope = scope)]
#[retry(max_attempts = 2)]
async fn budget_below(scope: &str, attempts: &AtomicU32) -> Result<u32, TestError> {
    slow_first(attempts).await
}

/// The first attempt is slow (hedged) unless the task is [`FAST`] (answered before the delay).
async fn slow_first(attempts: &AtomicU32) -> Result<u32, TestError> {
    let attempt = attempts.fetch_add(1, Ordering::SeqCst);
    if attempt == 0 && !FAST.try_with(|fast| *fast).unwrap_or(false) {
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    Ok(attempt)
}

tokio::task_local! {
    /// Whether the calls' first attempts answer before the delay.
    static FAST: bool;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_budget_of_the_name_on_the_function_makes_the_one_deposit() {
    let coordinator = Coordinator::in_memory();
    for (which, scope) in [("above", unique("above")), ("below", unique("below"))] {
        let mut sent = 0;
        // Five calls hedged, five answered before the delay.
        for fast in [false, true] {
            for _ in 0..5 {
                let attempts = AtomicU32::new(0);
                let answer = FAST.scope(fast, async {
                    match which {
                        "above" => coordinator.scoped(budget_above(&scope, &attempts)).await,
                        _ => coordinator.scoped(budget_below(&scope, &attempts)).await,
                    }
                });
                assert!(answer.await.is_ok());
                sent += u64::from(attempts.load(Ordering::SeqCst) - 1);
            }
        }
        assert_eq!(sent, 5, "{which}: the budget allowed the hedges");
        assert_eq!(
            window(&coordinator, &scope, 10).await,
            (10, 5),
            "{which}: one deposit per call"
        );
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_tower_layer_hedges_a_slow_request() {
    use caracal::tower::HedgeLayer;
    use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

    let calls = std::sync::Arc::new(AtomicU32::new(0));
    let counted = std::sync::Arc::clone(&calls);
    let mut service = ServiceBuilder::new()
        .layer(HedgeLayer::new("hedge-tower").delay(Duration::from_millis(50)))
        .service(service_fn(move |id: u64| {
            let call = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if call == 0 {
                    std::future::pending::<()>().await;
                }
                Ok::<_, std::io::Error>((id, call))
            }
        }));
    let answer = service.ready().await.unwrap().call(7).await.unwrap();
    assert_eq!(answer, (7, 1), "the second call's answer");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
