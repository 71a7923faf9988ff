//! Policy-level checks on paused time, for both coordinations; Redis and multi-process
//! behaviour is exercised in the `caracal-tests` suites.

use std::time::Duration;

use super::*;
use crate::__private::GLOBAL_SCOPE;
use crate::coordinator::Coordinator;

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
        slow_call: None,
        on_coordinator_error: OnCoordinatorError::FailOpen,
        local,
        shadow: false,
    }
}

static LOCAL: BreakerSite = BreakerSite::new(config("unit-local", true));
static SHARED: BreakerSite = BreakerSite::new(config("unit-shared", false));
static PANICS: BreakerSite = BreakerSite::new(config("unit-panics", true));
static DROPS: BreakerSite = BreakerSite::new(config("unit-drops", false));
static STORM: BreakerSite = BreakerSite::new(config("unit-storm", false));

const SLOW_CALL: Duration = Duration::from_secs(1);

const fn slow_config(name: &'static str, local: bool) -> BreakerConfig {
    let mut config = config(name, local);
    // Failures alone would need 4 of 4 here (0.999); slow calls need half.
    config.failure_threshold = 0.999;
    config.slow_call = Some(SlowCall {
        after: SLOW_CALL,
        threshold: 0.5,
    });
    config
}

static SLOW_LOCAL: BreakerSite = BreakerSite::new(slow_config("unit-slow-local", true));
static SLOW_SHARED: BreakerSite = BreakerSite::new(slow_config("unit-slow-shared", false));

async fn call(site: &'static BreakerSite, fail: bool) -> Result<(), Error> {
    call_taking(site, fail, Duration::ZERO).await
}

async fn call_taking(site: &'static BreakerSite, fail: bool, takes: Duration) -> Result<(), Error> {
    circuit_breaker(
        site,
        &CallCtx::new(),
        &GLOBAL_SCOPE,
        ClassifyByResult,
        async move {
            tokio::time::sleep(takes).await;
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
            circuit_breaker(&PANICS, &ctx, &GLOBAL_SCOPE, ClassifyByResult, async {
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
            let (ctx, scope) = (CallCtx::new(), GLOBAL_SCOPE.clone());
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

static TALLIED: BreakerSite = BreakerSite::new(config("unit-tallied", true));
static DILUTED: BreakerSite = BreakerSite::new(config("unit-diluted", true));

/// Whether `site`'s next call is refused (the call made to find out is a success).
async fn refused(site: &'static BreakerSite) -> bool {
    matches!(call(site, false).await, Err(Error::CircuitOpen { .. }))
}

/// The local breaker counts a closed breaker's successes without its lock (the clock never
/// moves here, so all in one millisecond): every one of them still dilutes the window. Six
/// successes take six failures to reach half; had they been lost, four would open it.
#[tokio::test(start_paused = true)]
async fn successes_counted_without_the_lock_all_reach_the_window() {
    for _ in 0..6 {
        call(&TALLIED, false).await.expect("closed");
    }
    for failure in 1..=6 {
        assert!(
            matches!(call(&TALLIED, true).await, Err(Error::InvalidConfig { .. })),
            "failure {failure} ran its body"
        );
    }
    assert!(refused(&TALLIED).await, "6 failures of 12 open it");
}

const fn wide_config(name: &'static str) -> BreakerConfig {
    let mut config = config(name, true);
    config.window_size = 20_000;
    config
}

static TALLIED_WIDE: BreakerSite = BreakerSite::new(wide_config("unit-tallied-wide"));

/// The tally at its limits: 5 000 successes in one paused millisecond are more than one
/// tally holds (4 095, its 12 bits: the next takes the lock and re-arms it) and are folded
/// in batches of 64. Every one reaches the window: its total is exactly 5 000, and at a
/// threshold of half it opens at exactly the 5 000th failure, not one earlier.
#[tokio::test(start_paused = true)]
async fn five_thousand_successes_in_a_millisecond_all_reach_the_window() {
    let start = tokio::time::Instant::now();
    for _ in 0..5_000 {
        call(&TALLIED_WIDE, false).await.expect("closed");
    }
    assert_eq!(start.elapsed(), Duration::ZERO, "one millisecond");
    let window = local::window(&TALLIED_WIDE).expect("a closed breaker's state");
    assert_eq!((window.total, window.failures), (5_000, 0));
    for failure in 1..5_000 {
        assert!(
            matches!(
                call(&TALLIED_WIDE, true).await,
                Err(Error::InvalidConfig { .. })
            ),
            "failure {failure} ran its body"
        );
    }
    let window = local::window(&TALLIED_WIDE).expect("a closed breaker's state");
    assert_eq!((window.total, window.failures), (9_999, 4_999));
    assert!(
        matches!(
            call(&TALLIED_WIDE, true).await,
            Err(Error::InvalidConfig { .. })
        ),
        "failure 5 000 ran its body"
    );
    assert!(
        refused(&TALLIED_WIDE).await,
        "5 000 failures of 10 000 open it"
    );
}

/// A success can open a breaker: the one that brings the window to `minimum_throughput` with
/// failures already at the threshold. It is never left for later, or the next call would get
/// through.
#[tokio::test(start_paused = true)]
async fn the_success_that_reaches_minimum_throughput_opens_at_once() {
    for _ in 0..3 {
        let _ = call(&DILUTED, true).await;
    }
    call(&DILUTED, false).await.expect("3 observations: closed");
    assert!(refused(&DILUTED).await, "3 failures of 4 open it");
}

const fn mixed_config(minimum_throughput: u32) -> BreakerConfig {
    let mut config = config("unit-mixed", true);
    config.minimum_throughput = minimum_throughput;
    config
}

static MIXED_LAX: BreakerSite = BreakerSite::new(mixed_config(100));
static MIXED_STRICT: BreakerSite = BreakerSite::new(mixed_config(4));

/// Two sites of one identity with different settings: a success counted without the lock
/// after the lax site's step still opens the breaker for the strict site, at once (successes
/// are counted so only over a window without failures, which no settings open).
#[tokio::test(start_paused = true)]
async fn a_success_after_another_sites_step_opens_under_its_own_settings() {
    for _ in 0..3 {
        let _ = call(&MIXED_STRICT, true).await;
    }
    call(&MIXED_LAX, false)
        .await
        .expect("3 failures of 4 under 100 minimum: closed");
    call(&MIXED_STRICT, false)
        .await
        .expect("admitted while closed");
    assert!(
        refused(&MIXED_STRICT).await,
        "3 failures of 5 open it for the strict site"
    );
}

/// A sequential caller of an instantly failing function: its own unflushed failures count, so
/// at most `minimum_throughput` bodies run before the first rejection — no batch delay (the
/// clock never moves here) lets more through.
#[tokio::test(start_paused = true)]
async fn a_failure_storm_is_cut_off_after_minimum_throughput_calls() {
    let coordinator = Coordinator::in_memory();
    let bodies = coordinator
        .scoped(async {
            let mut bodies = 0;
            for _ in 0..100 {
                match call(&STORM, true).await {
                    Err(Error::CircuitOpen { .. }) => break,
                    _ => bodies += 1,
                }
            }
            bodies
        })
        .await;
    assert_eq!(bodies, STORM.config.minimum_throughput);
}

/// Successful calls that take longer than `slow_call` open it once they are half the window;
/// a probe that succeeds slowly reopens it, quick ones close it.
async fn slow_calls_open_it(site: &'static BreakerSite) {
    let slow = SLOW_CALL + Duration::from_millis(1);
    let almost = SLOW_CALL - Duration::from_millis(1);
    // Window after each: (total, slow) = (1, 0), (2, 1), (3, 1), (4, 1), (5, 2).
    for takes in [Duration::ZERO, slow, almost, Duration::ZERO, slow] {
        assert!(call_taking(site, false, takes).await.is_ok());
        settle_background().await;
    }
    // (6, 3): half of them slow.
    assert!(call_taking(site, false, slow).await.is_ok());
    settle_background().await;
    assert!(matches!(
        call(site, false).await,
        Err(Error::CircuitOpen { .. })
    ));
    tokio::time::sleep(OPEN).await;
    assert!(
        call_taking(site, false, slow).await.is_ok(),
        "the probe ran"
    );
    settle_background().await;
    assert!(
        matches!(call(site, false).await, Err(Error::CircuitOpen { .. })),
        "a slow probe reopens it"
    );
    tokio::time::sleep(OPEN).await;
    for _ in 0..2 {
        assert!(call(site, false).await.is_ok());
        settle_background().await;
    }
    for _ in 0..4 {
        assert!(
            call_taking(site, false, almost).await.is_ok(),
            "closed again"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn slow_calls_open_the_local_breaker() {
    slow_calls_open_it(&SLOW_LOCAL).await;
}

#[tokio::test(start_paused = true)]
async fn slow_calls_open_the_distributed_breaker() {
    let coordinator = Coordinator::in_memory();
    coordinator.scoped(slow_calls_open_it(&SLOW_SHARED)).await;
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
        BreakerSite::new(site_config)
            .resolve(None)
            .values
            .settings(true)
            .threshold_permille,
        500
    );
    let mut site_config = config("t", true);
    site_config.failure_threshold = 0.001;
    assert_eq!(
        BreakerSite::new(site_config)
            .resolve(None)
            .values
            .settings(true)
            .threshold_permille,
        1
    );
}

static PER_USER: BreakerSite = BreakerSite::new(config("unit-per-user", false));

/// A scope per user: once the users stop calling, the process forgets them everywhere it
/// noted them (the breaker's views, the registry's uses, the decisions counted for `top`),
/// and remembers those still calling.
#[tokio::test(start_paused = true)]
async fn identities_idle_past_the_forget_time_are_forgotten() {
    const USERS: usize = 200;
    let coordinator = Coordinator::in_memory();
    let user = |n: usize| Scope::new(format!("user-{n}"));
    let call_as = |scope: Result<Scope, Error>| {
        coordinator.scoped(async move {
            circuit_breaker(
                &PER_USER,
                &CallCtx::new(),
                &scope,
                ClassifyByResult,
                async { Ok::<(), Error>(()) },
            )
            .await
        })
    };
    for n in 0..USERS {
        call_as(user(n)).await.expect("closed");
    }
    settle_background().await;
    let remembered = || {
        (
            super::views::Views::of(&coordinator).count(),
            coordinator.uses().count(),
            crate::tally::counted("unit-per-user"),
        )
    };
    assert_eq!(remembered(), (USERS, USERS, USERS), "every user noted");
    // One user goes on calling through the others' idle time.
    let started = tokio::time::Instant::now();
    while started.elapsed()
        < crate::FORGET_IDLE_AFTER + 3 * crate::coordinator::registry::REPORT_EVERY
    {
        call_as(user(0)).await.expect("closed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        remembered(),
        (1, 1, 1),
        "only the user still calling is remembered"
    );
}
