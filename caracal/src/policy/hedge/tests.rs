//! The hedge's attempts on paused time: when each starts, which result is the call's, what
//! the budget allows. The stacking with the other attributes and the fleet's budget are
//! exercised in the `caracal-tests` suite (`hedge`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use super::*;
use crate::__private::GLOBAL_SCOPE;
use crate::coordinator::Coordinator;
use crate::policy::retry_budget::{RetryBudgetConfig, RetryBudgetSite, retry_budget};

const DELAY: Duration = Duration::from_millis(50);

const fn config(name: &'static str, max_extra: u32, budget: Option<&'static str>) -> HedgeConfig {
    HedgeConfig {
        identity: FunctionIdentity {
            function: name,
            name,
            operation: name,
        },
        delay: Delay::Fixed(DELAY),
        max_extra,
        budget,
        local: false,
    }
}

static ONE: HedgeSite = HedgeSite::new(config("unit-hedge", 1, None));
static THREE: HedgeSite = HedgeSite::new(config("unit-hedge-3", 3, None));

/// What each attempt does, by its index: sleep this long, then answer.
type Script = fn(u32) -> (Duration, Result<u32, Error>);

/// Runs a hedged call whose attempts follow `script`; the result, and how many attempts
/// started.
async fn call(
    site: &'static HedgeSite,
    ctx: &CallCtx,
    script: Script,
) -> (Result<u32, Error>, u32) {
    let started = AtomicU32::new(0);
    let result = hedge(site, ctx, &GLOBAL_SCOPE, || {
        let index = started.fetch_add(1, Ordering::SeqCst);
        async move {
            let (after, answer) = script(index);
            tokio::time::sleep(after).await;
            answer
        }
    })
    .await;
    (result, started.load(Ordering::SeqCst))
}

fn failure(index: u32) -> Result<u32, Error> {
    Err(Error::config(format!("attempt {index} failed")))
}

#[tokio::test(start_paused = true)]
async fn a_slow_first_attempt_is_hedged_and_the_fast_one_wins() {
    let (result, started) = call(&ONE, &CallCtx::new(), |index| match index {
        0 => (Duration::from_secs(10), Ok(0)),
        _ => (Duration::from_millis(1), Ok(index)),
    })
    .await;
    assert_eq!(result.unwrap(), 1);
    assert_eq!(started, 2);
}

#[tokio::test(start_paused = true)]
async fn an_answer_before_the_delay_sends_no_hedge() {
    let (result, started) = call(&THREE, &CallCtx::new(), |index| {
        (DELAY - Duration::from_millis(1), Ok(index))
    })
    .await;
    assert_eq!(result.unwrap(), 0);
    assert_eq!(started, 1);
}

#[tokio::test(start_paused = true)]
async fn an_error_waits_for_the_other_attempt() {
    let (result, started) = call(&ONE, &CallCtx::new(), |index| match index {
        0 => (DELAY * 2, failure(0)),
        _ => (DELAY * 4, Ok(index)),
    })
    .await;
    assert_eq!(result.unwrap(), 1);
    assert_eq!(started, 2);
}

#[tokio::test(start_paused = true)]
async fn when_every_attempt_fails_the_last_error_is_the_call_s() {
    let (result, started) = call(&ONE, &CallCtx::new(), |index| match index {
        0 => (DELAY * 2, failure(0)),
        _ => (DELAY * 4, failure(1)),
    })
    .await;
    assert_eq!(
        result.unwrap_err().to_string(),
        failure(1).unwrap_err().to_string()
    );
    assert_eq!(started, 2);
}

#[tokio::test(start_paused = true)]
async fn a_fast_failure_is_not_hedged() {
    let (result, started) = call(&THREE, &CallCtx::new(), |index| {
        (Duration::ZERO, failure(index))
    })
    .await;
    assert!(result.is_err());
    assert_eq!(started, 1);
}

#[tokio::test(start_paused = true)]
async fn at_most_max_extra_attempts_are_added_each_a_delay_after_the_last() {
    let begun = Instant::now();
    let (result, started) = call(&THREE, &CallCtx::new(), |index| {
        (Duration::from_secs(10), Ok(index))
    })
    .await;
    assert_eq!(started, 4, "the first and three extra");
    // The first attempt answers first, at 10 s: the extras started at 50, 100 and 150 ms.
    assert_eq!(result.unwrap(), 0);
    assert_eq!(begun.elapsed(), Duration::from_secs(10));
    let (_, started) = call(&ONE, &CallCtx::new(), |index| {
        (Duration::from_secs(10), Ok(index))
    })
    .await;
    assert_eq!(started, 2);
}

/// Drops to `true` when the attempt's future is dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn the_losers_are_dropped_when_one_wins() {
    let dropped = Arc::new(AtomicBool::new(false));
    let started = AtomicU32::new(0);
    let result: Result<u32, Error> = hedge(&ONE, &CallCtx::new(), &GLOBAL_SCOPE, || {
        let index = started.fetch_add(1, Ordering::SeqCst);
        let flag = DropFlag(Arc::clone(&dropped));
        async move {
            let _flag = flag;
            if index == 0 {
                std::future::pending::<()>().await;
            }
            Ok(index)
        }
    })
    .await;
    assert_eq!(result.unwrap(), 1);
    assert!(
        dropped.load(Ordering::SeqCst),
        "the first attempt was dropped"
    );
}

#[tokio::test(start_paused = true)]
async fn the_rejection_of_the_last_error_is_the_call_s() {
    let ctx = CallCtx::new();
    let started = AtomicU32::new(0);
    let result: Result<u32, Error> = hedge(&ONE, &ctx, &GLOBAL_SCOPE, || {
        let index = started.fetch_add(1, Ordering::SeqCst);
        let ctx = &ctx;
        async move {
            if index == 0 {
                // Rejected by a policy below, after the second attempt started.
                tokio::time::sleep(DELAY * 2).await;
                return Err(ctx.reject(Error::Timeout { after: DELAY }));
            }
            tokio::time::sleep(DELAY * 4).await;
            failure(index)
        }
    })
    .await;
    assert!(result.is_err());
    assert_eq!(ctx.rejection(), None, "the last error was the body's");

    let started = AtomicU32::new(0);
    let result: Result<u32, Error> = hedge(&ONE, &ctx, &GLOBAL_SCOPE, || {
        let index = started.fetch_add(1, Ordering::SeqCst);
        let ctx = &ctx;
        async move {
            tokio::time::sleep(DELAY * (2 + index * 2)).await;
            if index == 0 {
                return failure(index);
            }
            Err(ctx.reject(Error::Timeout { after: DELAY }))
        }
    })
    .await;
    assert_eq!(result.unwrap_err().code(), "timeout");
    assert_eq!(ctx.rejection(), Some(crate::ctx::Rejection::Cut));
}

#[tokio::test(start_paused = true)]
async fn the_downstream_s_failure_outranks_a_later_refusal() {
    let ctx = CallCtx::new();
    let started = AtomicU32::new(0);
    let result: Result<u32, Error> = hedge(&ONE, &ctx, &GLOBAL_SCOPE, || {
        let index = started.fetch_add(1, Ordering::SeqCst);
        let ctx = &ctx;
        async move {
            // The first fails at the downstream; the extra, refused by a policy below,
            // finishes last.
            tokio::time::sleep(DELAY * (2 + index * 2)).await;
            if index == 0 {
                return failure(index);
            }
            let refused = Error::config("refused below");
            Err(ctx.reject_as(refused, crate::ctx::Rejection::Admission))
        }
    })
    .await;
    assert!(
        result.unwrap_err().to_string().contains("attempt 0 failed"),
        "the downstream's failure is the call's"
    );
    assert_eq!(ctx.rejection(), None, "and no rejection of caracal's");
}

static EMPTY_BUDGET: RetryBudgetSite = RetryBudgetSite::new(RetryBudgetConfig {
    name: "unit-hedge-empty",
    operation: "unit-hedge-empty",
    percent: 0,
    min_per_second: 0,
    window: Duration::from_secs(10),
    local: true,
    shadow: false,
});
static ON_EMPTY: HedgeSite =
    HedgeSite::new(config("unit-hedge-empty", 3, Some("unit-hedge-empty")));

#[tokio::test(start_paused = true)]
async fn a_budget_that_refuses_stops_the_hedges() {
    // The budget is used in this process, so the hedge finds it by name.
    let used: Result<(), Error> =
        retry_budget(&EMPTY_BUDGET, &CallCtx::new(), &GLOBAL_SCOPE, async {
            Ok(())
        })
        .await;
    used.unwrap();
    let (result, started) = call(&ON_EMPTY, &CallCtx::new(), |index| {
        (Duration::from_secs(1), Ok(index))
    })
    .await;
    assert_eq!(result.unwrap(), 0);
    assert_eq!(started, 1, "no extra attempt without the budget's leave");
}

static FLOOR_BUDGET: RetryBudgetSite = RetryBudgetSite::new(RetryBudgetConfig {
    name: "unit-hedge-floor",
    operation: "unit-hedge-floor",
    percent: 0,
    // One withdrawal in the window: 1 per second over 1 s.
    min_per_second: 1,
    window: Duration::from_secs(1),
    local: true,
    shadow: false,
});
static ON_FLOOR: HedgeSite =
    HedgeSite::new(config("unit-hedge-floor", 3, Some("unit-hedge-floor")));

#[tokio::test(start_paused = true)]
async fn each_extra_attempt_withdraws_from_the_budget() {
    let used: Result<(), Error> =
        retry_budget(&FLOOR_BUDGET, &CallCtx::new(), &GLOBAL_SCOPE, async {
            Ok(())
        })
        .await;
    used.unwrap();
    let (_, started) = call(&ON_FLOOR, &CallCtx::new(), |index| {
        (Duration::from_millis(500), Ok(index))
    })
    .await;
    assert_eq!(
        started, 2,
        "the floor allowed one extra attempt, then refused"
    );
}

static SHARE_BUDGET: RetryBudgetSite = RetryBudgetSite::new(RetryBudgetConfig {
    name: "unit-hedge-share",
    operation: "unit-hedge-share",
    // One withdrawal per deposit, no floor.
    percent: 100,
    min_per_second: 0,
    window: Duration::from_secs(60),
    local: true,
    shadow: false,
});
static ON_SHARE: HedgeSite =
    HedgeSite::new(config("unit-hedge-share", 3, Some("unit-hedge-share")));

#[tokio::test(start_paused = true)]
async fn a_hedge_run_again_by_a_retry_above_makes_no_second_deposit() {
    let used: Result<(), Error> =
        retry_budget(&SHARE_BUDGET, &CallCtx::new(), &GLOBAL_SCOPE, async {
            Ok(())
        })
        .await;
    used.unwrap();
    let slow = |index| (Duration::from_secs(1), Ok(index));
    // One call's context, its hedge run twice, as a `#[retry]` above would.
    let ctx = CallCtx::new();
    let (_, first) = call(&ON_SHARE, &ctx, slow).await;
    assert_eq!(
        first, 3,
        "two deposits (the use above and this call's) allow two extras"
    );
    let (_, again) = call(&ON_SHARE, &ctx, slow).await;
    assert_eq!(
        again, 1,
        "the call deposited once: no leave for another extra"
    );
}

/// A gate that counts the deposits it is told of.
#[derive(Debug, Default)]
struct Counting(AtomicU32);

impl crate::ctx::Gate for Counting {
    fn deposit(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn another(&self) -> bool {
        true
    }
    fn budget(&self) -> &str {
        "unit-hedge-gated"
    }
}

static COUNTING: Counting = Counting(AtomicU32::new(0));
static GATED_BUDGET: RetryBudgetSite = RetryBudgetSite::new(RetryBudgetConfig {
    name: "unit-hedge-gated",
    operation: "unit-hedge-gated",
    percent: 100,
    min_per_second: 0,
    window: Duration::from_secs(60),
    local: true,
    shadow: false,
});
static ON_GATED: HedgeSite =
    HedgeSite::new(config("unit-hedge-gated", 1, Some("unit-hedge-gated")));

#[tokio::test(start_paused = true)]
async fn a_gate_below_installed_after_the_hedge_deposited_makes_no_second_deposit() {
    let used: Result<(), Error> =
        retry_budget(&GATED_BUDGET, &CallCtx::new(), &GLOBAL_SCOPE, async {
            Ok(())
        })
        .await;
    used.unwrap();
    let ctx = CallCtx::new();
    let result: Result<u32, Error> = hedge(&ON_GATED, &ctx, &GLOBAL_SCOPE, || {
        let ctx = &ctx;
        async move {
            // A layer above the budget's awaited past the first extra's due time; then the
            // budget below installs its gate.
            tokio::time::sleep(DELAY * 2).await;
            ctx.gate(crate::ctx::Gated::Kept(&COUNTING));
            Ok(0)
        }
    })
    .await;
    result.unwrap();
    // The budget's layer settles its deposit when the call ends.
    ctx.deposit_first();
    assert_eq!(
        COUNTING.0.load(Ordering::SeqCst),
        0,
        "the hedge deposited for the call already"
    );
}

static ADOPTING: HedgeSite =
    HedgeSite::new(config("unit-hedge-adopting", 1, Some("unit-hedge-adopted")));
static ADOPTED_LATER: RetryBudgetSite = RetryBudgetSite::new(RetryBudgetConfig {
    name: "unit-hedge-adopted",
    operation: "unit-hedge-adopted",
    // Refuses every extra attempt.
    percent: 0,
    min_per_second: 0,
    window: Duration::from_secs(10),
    local: true,
    shadow: false,
});

#[tokio::test(start_paused = true)]
async fn a_budget_the_process_uses_supersedes_one_adopted_before_it() {
    let coordinator = Coordinator::in_memory();
    // Named, with the attribute's defaults (a floor of 10 per second).
    let text = "[retry_budget.unit-hedge-adopted]\nwindow = \"10s\"";
    coordinator.set_config(crate::Config::from_toml_str(text).expect("valid"));
    let slow = |index| (Duration::from_secs(1), Ok(index));
    let (_, started) = coordinator
        .scoped(call(&ADOPTING, &CallCtx::new(), slow))
        .await;
    assert_eq!(
        started, 2,
        "the configured budget, adopted, allowed the extra"
    );
    assert!(
        crate::policy::retry_budget::named("unit-hedge-adopted").is_none(),
        "a stand-in is not listed among the process's budgets"
    );
    let used: Result<(), Error> =
        retry_budget(&ADOPTED_LATER, &CallCtx::new(), &GLOBAL_SCOPE, async {
            Ok(())
        })
        .await;
    used.unwrap();
    let (_, started) = coordinator
        .scoped(call(&ADOPTING, &CallCtx::new(), slow))
        .await;
    assert_eq!(
        started, 1,
        "the attribute's budget, which refuses, is the name's now"
    );
}

static NOWHERE: HedgeSite = HedgeSite::new(config("unit-hedge-nowhere", 1, Some("no-such-budget")));

#[tokio::test(start_paused = true)]
async fn a_budget_found_nowhere_is_invalid_config_for_an_extra_attempt() {
    let coordinator = Coordinator::in_memory();
    let slow = |index| (DELAY * 2, Ok(index));
    let (result, started) = coordinator
        .scoped(call(&NOWHERE, &CallCtx::new(), slow))
        .await;
    let error = result.unwrap_err();
    assert_eq!(error.code(), "invalid_config");
    assert!(error.to_string().contains("no-such-budget"), "{error}");
    assert_eq!(started, 1, "found missing when the extra attempt was due");
}

static NOWHERE_ANSWERED: HedgeSite = HedgeSite::new(config(
    "unit-hedge-nowhere-answered",
    1,
    Some("no-such-budget-answered"),
));

#[tokio::test(start_paused = true)]
async fn a_call_that_answered_is_not_failed_by_its_budget() {
    let coordinator = Coordinator::in_memory();
    let (result, started) = coordinator
        .scoped(call(&NOWHERE_ANSWERED, &CallCtx::new(), |index| {
            (Duration::ZERO, Ok(index))
        }))
        .await;
    assert_eq!(
        result.unwrap(),
        0,
        "the deposit is skipped, the answer kept"
    );
    assert_eq!(started, 1);
}

static LATER: HedgeSite = HedgeSite::new(config(
    "unit-hedge-later",
    1,
    Some("budget-configured-later"),
));

#[tokio::test(start_paused = true)]
async fn a_budget_found_nowhere_is_not_looked_for_again_before_its_back_off() {
    let coordinator = Coordinator::in_memory();
    let code = || async {
        let slow = |index| (DELAY * 2, Ok(index));
        let (result, _) = coordinator
            .scoped(call(&LATER, &CallCtx::new(), slow))
            .await;
        result.map_err(|error| error.code())
    };
    assert_eq!(code().await, Err("invalid_config"));
    let text = "[retry_budget.budget-configured-later]\npercent = 100";
    coordinator.set_config(crate::Config::from_toml_str(text).expect("valid"));
    assert_eq!(
        code().await,
        Err("invalid_config"),
        "the failed look-up is kept for a second"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        code().await,
        Ok(0),
        "looked for again, found in the configuration"
    );
}

#[test]
fn a_percentile_delay_is_the_ceiling_until_known_and_clamped_after() {
    #[derive(Debug)]
    struct Known(Option<Duration>);
    impl delay::Latency for Known {
        fn observe(&self, _: Duration) {}
        fn quantile(&self, _: u16) -> Option<Duration> {
            self.0
        }
    }
    let delay = Delay::Percentile {
        per_mille: 950,
        floor: Duration::from_millis(5),
        ceiling: Duration::from_millis(500),
    };
    let ms = Duration::from_millis;
    assert_eq!(delay.now(None), ms(500));
    assert_eq!(delay.now(Some(&Known(None))), ms(500));
    assert_eq!(delay.now(Some(&Known(Some(ms(40))))), ms(40));
    assert_eq!(delay.now(Some(&Known(Some(ms(1))))), ms(5));
    assert_eq!(delay.now(Some(&Known(Some(ms(900))))), ms(500));
    assert_eq!(Delay::Fixed(ms(7)).now(Some(&Known(Some(ms(1))))), ms(7));
}

static LEARNT: HedgeSite = HedgeSite::new(HedgeConfig {
    delay: Delay::Percentile {
        per_mille: 950,
        floor: Duration::from_millis(1),
        ceiling: DELAY,
    },
    ..config("unit-hedge-learnt", 1, None)
});

#[tokio::test(start_paused = true)]
async fn the_attempts_a_hedge_outran_still_count_in_the_fleets_latency() {
    let coordinator = Coordinator::in_memory();
    for _ in 0..100 {
        let (result, _) = coordinator
            .scoped(call(&LEARNT, &CallCtx::new(), |index| match index {
                0 => (Duration::from_secs(10), Ok(0)),
                _ => (Duration::from_millis(1), Ok(index)),
            }))
            .await;
        assert_eq!(result.unwrap(), 1);
    }
    let identity = delay::identity(
        &coordinator,
        &LEARNT,
        GLOBAL_SCOPE.clone().as_ref().unwrap(),
    );
    let median = latency::fleet_latency(&coordinator, &identity).quantile(500);
    // Each call's winner took 1 ms, the attempt it outran at least the delay (50 ms): left
    // out, the fleet would read only the winners, and hedge ever sooner.
    assert!(
        median.is_some_and(|median| median >= Duration::from_millis(1) && median < DELAY),
        "{median:?}"
    );
    let tail = latency::fleet_latency(&coordinator, &identity).quantile(750);
    assert!(tail.is_some_and(|tail| tail >= DELAY), "{tail:?}");
}
