//! Policy-level checks on paused time, for both coordinations; Redis and multi-process
//! behaviour is exercised in the `caracal-tests` suites.

use std::time::Duration;

use super::*;
use crate::__private::global_scope;
use crate::Coordinator;

const OPEN: Duration = Duration::from_secs(10);

const fn config(name: &'static str, local: bool) -> BreakerConfig {
    BreakerConfig {
        name,
        operation: name,
        minimum_throughput: 4,
        failure_threshold: 0.5,
        window_size: 100,
        window: Duration::from_secs(60),
        open: OPEN,
        half_open_probes: 1,
        half_open_successes: 2,
        probe_lease: Duration::from_secs(20),
        on_coordinator_error: OnCoordinatorError::FailOpen,
        local,
    }
}

static LOCAL: BreakerSite = BreakerSite::new(config("unit-local", true));
static SHARED: BreakerSite = BreakerSite::new(config("unit-shared", false));
static PANICS: BreakerSite = BreakerSite::new(config("unit-panics", true));
static DROPS: BreakerSite = BreakerSite::new(config("unit-drops", false));

async fn call(site: &'static BreakerSite, fail: bool) -> Result<(), Error> {
    circuit_breaker(
        site,
        &CallCtx::new(),
        &global_scope(),
        ClassifyByResult,
        async move {
            if fail {
                Err(Error::config("downstream failed"))
            } else {
                Ok(())
            }
        },
    )
    .await
}

/// Lets background batches flush (paused time advances on its own while idle).
async fn settle_background() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

async fn open_close_cycle(site: &'static BreakerSite) {
    for _ in 0..4 {
        assert!(call(site, true).await.is_err());
        settle_background().await;
    }
    let rejected = call(site, false).await;
    match rejected {
        Err(Error::CircuitOpen { retry_after, .. }) => {
            assert!(retry_after.is_some_and(|d| d <= OPEN), "{retry_after:?}");
        }
        other => panic!("expected CircuitOpen, got {other:?}"),
    }
    tokio::time::sleep(OPEN).await;
    // One probe at a time: the first success counts, a second probe then closes it.
    assert!(call(site, false).await.is_ok());
    settle_background().await;
    assert!(call(site, false).await.is_ok());
    settle_background().await;
    for _ in 0..10 {
        assert!(call(site, false).await.is_ok());
    }
}

#[tokio::test(start_paused = true)]
async fn the_local_breaker_opens_probes_and_closes() {
    open_close_cycle(&LOCAL).await;
}

#[tokio::test(start_paused = true)]
async fn the_distributed_breaker_opens_probes_and_closes() {
    let coordinator = Coordinator::in_memory();
    coordinator.scoped(open_close_cycle(&SHARED)).await;
}

#[tokio::test(start_paused = true)]
async fn a_panic_counts_as_a_failure_and_still_reaches_the_caller() {
    for _ in 0..4 {
        let task = tokio::spawn(async {
            let ctx = CallCtx::new();
            circuit_breaker(&PANICS, &ctx, &global_scope(), ClassifyByResult, async {
                panic!("body panicked") as Result<(), Error>
            })
            .await
        });
        assert!(task.await.expect_err("the panic propagates").is_panic());
    }
    assert!(matches!(
        call(&PANICS, false).await,
        Err(Error::CircuitOpen { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_probe_frees_its_slot() {
    let coordinator = Coordinator::in_memory();
    coordinator
        .scoped(async {
            for _ in 0..4 {
                let _ = call(&DROPS, true).await;
                settle_background().await;
            }
            tokio::time::sleep(OPEN).await;
            // The probe hangs and is dropped by the timeout; with one probe slot, the next
            // call is admitted only if dropping freed the slot.
            let (ctx, scope) = (CallCtx::new(), global_scope());
            let hung = circuit_breaker(&DROPS, &ctx, &scope, ClassifyByResult, async {
                std::future::pending::<Result<(), Error>>().await
            });
            assert!(
                tokio::time::timeout(Duration::from_millis(10), hung)
                    .await
                    .is_err()
            );
            settle_background().await;
            assert!(call(&DROPS, false).await.is_ok());
        })
        .await;
}

#[test]
fn inner_admission_rejections_are_not_failures() {
    let result: Result<(), Error> = Err(Error::config("x"));
    let classify =
        |rejection| Classify::<(), Error>::classify(&ClassifyByResult, &result, rejection);
    assert_eq!(classify(None), Outcome::Failure);
    assert_eq!(classify(Some(Rejection::Cut)), Outcome::Failure);
    assert_eq!(classify(Some(Rejection::Admission)), Outcome::Ignored);
    assert_eq!(classify(Some(Rejection::Coordinator)), Outcome::Ignored);
    assert_eq!(
        Classify::<(), Error>::classify(&ClassifyByResult, &Ok(()), None),
        Outcome::Success
    );
}

#[test]
fn thresholds_resolve_to_thousandths() {
    let mut site_config = config("t", true);
    site_config.failure_threshold = 0.5004;
    assert_eq!(
        BreakerSite::new(site_config).settings().threshold_permille,
        500
    );
    let mut site_config = config("t", true);
    site_config.failure_threshold = 0.001;
    assert_eq!(
        BreakerSite::new(site_config).settings().threshold_permille,
        1
    );
}
