//! Shadow mode (`shadow = true`): a policy decides every call as the enforcing one would and
//! its shared state evolves as if the refused calls had been refused, but every call runs; what
//! it would have refused is counted as `would_reject` and said as `<kind>.would_reject`. Against
//! the in-memory coordinator and a real `redis-server`, and a fleet override that turns a shadow
//! policy into an enforcing one.

use std::sync::atomic::{AtomicU32, Ordering};

use caracal::metrics::DECISIONS_TOTAL;
use caracal::{Coordinator, bulkhead, circuit_breaker, rate_limit, retry, retry_budget};
use caracal_examples_metrics::{Planned, seeded};
use caracal_tests::{EventLog, MetricsLog, RedisServer};

use crate::common::{self, Gate, PATIENCE, TestError, code, unique};

/// How many decisions `name`'s policy took with this `decision` and `reason`.
fn decisions(name: &str, decision: &str, reason: &str) -> u64 {
    MetricsLog::global().counter(
        DECISIONS_TOTAL,
        &[("name", name), ("decision", decision), ("reason", reason)],
    )
}

#[bulkhead(name = "shadow-bulkhead", limit = 1, scope = scope, shadow = true)]
async fn shadow_bulkhead(scope: String, gate: Option<Gate>) -> Result<(), TestError> {
    if let Some(gate) = gate {
        gate.pass().await;
    }
    Ok(())
}

/// One holder fills the limit of 1; three more calls come while it runs. Enforcing, they would
/// be refused: shadowed, they run, counted as `would_reject`. They took no slot: once the
/// holder has ended, while those three still run, a call is admitted again.
async fn a_shadow_bulkhead_runs_every_call_and_takes_no_slot_for_the_refused(
    coordinator: &Coordinator,
) {
    let name = "shadow-bulkhead";
    let scope = unique("bulkhead");
    let counts = || {
        (
            decisions(name, "admitted", "admitted"),
            decisions(name, "would_reject", "capacity"),
            decisions(name, "rejected", "capacity"),
        )
    };
    let before = counts();
    let call = |gate: Option<&Gate>| {
        tokio::spawn(coordinator.scoped(shadow_bulkhead(scope.clone(), gate.cloned())))
    };
    let (holder_gate, overflow_gate) = (Gate::closed(), Gate::closed());
    let holder = call(Some(&holder_gate));
    holder_gate.entered(1).await;
    let overflow: Vec<_> = (0..3).map(|_| call(Some(&overflow_gate))).collect();
    common::ends("the calls over the limit to run", overflow_gate.entered(3)).await;
    assert_eq!(
        counts().1 - before.1,
        3,
        "each counted: {before:?} → {:?}",
        counts()
    );
    holder_gate.open(1);
    assert_eq!(code(&holder.await.expect("holder")), "ok");
    // The holder's release is sent in the background: its slot is free soon, and then the next
    // call is admitted (no call over the limit holds it: the 30 s lease outlasts the patience).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while counts().0 - before.0 < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no call admitted after the holder ended: {before:?} → {:?}",
            counts()
        );
        assert_eq!(code(&call(None).await.expect("call")), "ok");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    overflow_gate.open(3);
    for call in overflow {
        assert_eq!(code(&call.await.expect("overflow")), "ok");
    }
    assert_eq!(counts().2, before.2, "nothing rejected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_bulkhead_in_memory() {
    MetricsLog::global();
    a_shadow_bulkhead_runs_every_call_and_takes_no_slot_for_the_refused(&Coordinator::in_memory())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_bulkhead_on_redis() {
    MetricsLog::global();
    let server = RedisServer::start();
    let coordinator = common::redis(&server.url()).await;
    a_shadow_bulkhead_runs_every_call_and_takes_no_slot_for_the_refused(&coordinator).await;
    // No refused call left a lease behind.
    let mut leases = common::Leases::on(&server);
    common::eventually("every lease released", || leases.live() == 0).await;
}

#[circuit_breaker(name = "shadow-breaker", scope = scope, minimum_throughput = 2,
                  failure_threshold = 0.5, open = "60s", shadow = true)]
async fn shadow_breaker(scope: &str, fail: bool) -> Result<(), TestError> {
    if fail {
        Err(TestError::Body("downstream failed"))
    } else {
        Ok(())
    }
}

#[circuit_breaker(name = "enforcing-breaker", scope = scope, minimum_throughput = 2,
                  failure_threshold = 0.5, open = "60s")]
async fn enforcing_breaker(scope: &str, fail: bool) -> Result<(), TestError> {
    if fail {
        Err(TestError::Body("downstream failed"))
    } else {
        Ok(())
    }
}

/// The same calls through an enforcing and a shadow breaker: two failures open both; then the
/// enforcing one refuses the next calls where the shadow one runs them, counting each as
/// `would_reject` (reason `open`), and stays open — the calls it let run are not recorded, so
/// the successes among them cannot close it.
async fn a_shadow_breaker_opens_as_the_enforcing_one_and_runs_what_it_refuses(
    coordinator: &Coordinator,
) {
    let scope = unique("breaker");
    let scope = scope.as_str();
    for fail in [true, true] {
        let enforcing = coordinator.scoped(enforcing_breaker(scope, fail)).await;
        let shadow = coordinator.scoped(shadow_breaker(scope, fail)).await;
        assert_eq!((code(&enforcing), code(&shadow)), ("body", "body"));
    }
    let before = (
        decisions("shadow-breaker", "would_reject", "open"),
        decisions("shadow-breaker", "rejected", "open"),
    );
    // Failures and successes alike: the enforcing breaker refuses them all, open for 60 s.
    for fail in [false, true, false, false, false] {
        let enforcing = coordinator.scoped(enforcing_breaker(scope, fail)).await;
        let shadow = coordinator.scoped(shadow_breaker(scope, fail)).await;
        let ran = if fail { "body" } else { "ok" };
        assert_eq!((code(&enforcing), code(&shadow)), ("circuit_open", ran));
    }
    let after = (
        decisions("shadow-breaker", "would_reject", "open"),
        decisions("shadow-breaker", "rejected", "open"),
    );
    assert_eq!(
        after.0 - before.0,
        5,
        "each refusal counted: {before:?} → {after:?}"
    );
    assert_eq!(after.1, before.1, "nothing rejected");
}

#[tokio::test(flavor = "current_thread")]
async fn a_shadow_breaker_in_memory() {
    MetricsLog::global();
    let (log, _guard) = EventLog::capture_thread_default();
    a_shadow_breaker_opens_as_the_enforcing_one_and_runs_what_it_refuses(&Coordinator::in_memory())
        .await;
    let said = log.wait_for("circuit_breaker.would_reject", PATIENCE);
    assert_eq!(said.field("reason"), Some("open"));
    assert_eq!(said.level, tracing::Level::DEBUG);
    assert_eq!(
        log.count("circuit_breaker.would_reject"),
        1,
        "summarised like rejections: said once when it starts"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_breaker_on_redis() {
    MetricsLog::global();
    let server = RedisServer::start();
    let coordinator = common::redis(&server.url()).await;
    a_shadow_breaker_opens_as_the_enforcing_one_and_runs_what_it_refuses(&coordinator).await;
}

#[bulkhead(name = "shadow-switch", limit = 1, scope = scope, shadow = true)]
async fn switched(scope: &str, gate: Option<Gate>) -> Result<(), TestError> {
    if let Some(gate) = gate {
        gate.pass().await;
    }
    Ok(())
}

/// `config set bulkhead.shadow-switch.shadow false` from another process (another coordinator
/// on the same server and namespace): the shadow bulkhead starts refusing. Prints how long the
/// switch took in server time (the figure; the check only waits with patience).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_override_turns_a_shadow_bulkhead_into_an_enforcing_one() {
    let server = RedisServer::start();
    let namespace = unique("shadow-switch");
    let connect = || async {
        Coordinator::redis(server.url())
            .namespace(namespace.clone())
            .connect()
            .await
            .expect("connect to the test server")
    };
    let (process, operator) = (connect().await, connect().await);
    let scope: &'static str = Box::leak(unique("switch").into_boxed_str());
    let gate = Gate::closed();
    let holder = tokio::spawn(process.scoped(switched(scope, Some(gate.clone()))));
    gate.entered(1).await;
    assert_eq!(
        code(&process.scoped(switched(scope, None)).await),
        "ok",
        "shadowed: a call over the limit runs"
    );
    // `status` shows the identity in shadow mode, from the process's report.
    let shadow_shown = |shadow: bool| {
        let admin = operator.admin();
        async move {
            let deadline = tokio::time::Instant::now() + PATIENCE;
            loop {
                let listed = admin.status().await.expect("status");
                let shown = listed
                    .iter()
                    .find(|identity| identity.name == "shadow-switch" && identity.scope == scope);
                if shown.is_some_and(|identity| identity.shadow == shadow) {
                    return;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "status never showed shadow = {shadow}: {listed:?}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    };
    shadow_shown(true).await;
    let mut conn = server.connection();
    let set_at = common::server_time_ms(&mut conn);
    operator
        .admin()
        .set_override("bulkhead.shadow-switch.shadow", "false")
        .await
        .expect("set the override");
    common::until_code("bulkhead_full", || process.scoped(switched(scope, None))).await;
    let enforcing_at = common::server_time_ms(&mut conn);
    println!(
        "{{\"figure\":\"shadow_to_enforcing_ms\",\"server_ms\":{}}}",
        enforcing_at - set_at
    );
    // Reported by the process's next call after the switch.
    let _ = process.scoped(switched(scope, None)).await;
    shadow_shown(false).await;
    gate.open(1);
    assert_eq!(code(&holder.await.expect("holder")), "ok");
}

#[rate_limit(name = "shadow-rate", rate = 0.001, scope = scope, shadow = true)]
async fn shadow_rate(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// One admission per 1000 s: the first call is admitted, the next four would be refused and
/// run, each counted as `would_reject` (reason `rate_exceeded`).
async fn a_shadow_rate_limit_runs_what_it_would_refuse(coordinator: &Coordinator) {
    let name = "shadow-rate";
    let scope = unique("rate");
    let counts = || {
        (
            decisions(name, "admitted", "admitted"),
            decisions(name, "would_reject", "rate_exceeded"),
            decisions(name, "rejected", "rate_exceeded"),
        )
    };
    let before = counts();
    for _ in 0..5 {
        assert_eq!(code(&coordinator.scoped(shadow_rate(&scope)).await), "ok");
    }
    let after = counts();
    assert_eq!(
        (after.0 - before.0, after.1 - before.1, after.2 - before.2),
        (1, 4, 0),
        "{before:?} → {after:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_shadow_rate_limit_in_memory() {
    MetricsLog::global();
    a_shadow_rate_limit_runs_what_it_would_refuse(&Coordinator::in_memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_rate_limit_on_redis() {
    MetricsLog::global();
    let server = RedisServer::start();
    let coordinator = common::redis(&server.url()).await;
    a_shadow_rate_limit_runs_what_it_would_refuse(&coordinator).await;
}

/// A budget of no retry at all, in shadow mode: every retry is made, and counted.
#[retry_budget(name = "shadow-budget", percent = 0, min_per_second = 0, scope = scope,
               shadow = true)]
#[retry(max_attempts = 3)]
async fn shadow_budget(scope: &str, attempts: &AtomicU32) -> Result<(), TestError> {
    attempts.fetch_add(1, Ordering::SeqCst);
    Err(TestError::Body("downstream failed"))
}

/// The same budget enforcing: the first attempt only.
#[retry_budget(name = "enforcing-budget", percent = 0, min_per_second = 0, scope = scope)]
#[retry(max_attempts = 3)]
async fn enforcing_budget(scope: &str, attempts: &AtomicU32) -> Result<(), TestError> {
    attempts.fetch_add(1, Ordering::SeqCst);
    Err(TestError::Body("downstream failed"))
}

async fn a_shadow_retry_budget_makes_the_retries_it_would_refuse(coordinator: &Coordinator) {
    let scope = unique("budget");
    let (shadowed, enforced) = (AtomicU32::new(0), AtomicU32::new(0));
    let before = decisions("shadow-budget", "would_reject", "budget_exhausted");
    let shadow = coordinator.scoped(shadow_budget(&scope, &shadowed)).await;
    let enforcing = coordinator
        .scoped(enforcing_budget(&scope, &enforced))
        .await;
    assert_eq!((code(&shadow), code(&enforcing)), ("body", "body"));
    assert_eq!(
        (
            shadowed.load(Ordering::SeqCst),
            enforced.load(Ordering::SeqCst)
        ),
        (3, 1),
        "shadowed, both retries made; enforcing, none"
    );
    assert_eq!(
        decisions("shadow-budget", "would_reject", "budget_exhausted") - before,
        2
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_shadow_retry_budget_in_memory() {
    MetricsLog::global();
    a_shadow_retry_budget_makes_the_retries_it_would_refuse(&Coordinator::in_memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_retry_budget_on_redis() {
    MetricsLog::global();
    let server = RedisServer::start();
    let coordinator = common::redis(&server.url()).await;
    a_shadow_retry_budget_makes_the_retries_it_would_refuse(&coordinator).await;
}

/// Runs `plan` through `call`, each call spawned at its arrival, and counts the calls a policy
/// refused.
async fn drive<Fut>(
    coordinator: &Coordinator,
    plan: &[Planned],
    call: impl Fn(String, Planned) -> Fut,
) -> u64
where
    Fut: Future<Output = Result<(), TestError>> + Send + 'static,
{
    let scope = unique("seeded");
    let start = tokio::time::Instant::now();
    let mut running = Vec::new();
    for planned in plan {
        tokio::time::sleep_until(start + planned.at).await;
        running.push(tokio::spawn(
            coordinator.scoped(call(scope.clone(), *planned)),
        ));
    }
    let mut refused = 0;
    for call in running {
        if !matches!(code(&call.await.expect("a call")), "ok" | "body") {
            refused += 1;
        }
    }
    refused
}

/// The same seeded schedule through an enforcing policy and its shadow twin (named `shadow`):
/// the shadow counts as `would_reject` what the enforcing one refused (within 2 %, and more
/// than nothing), and refuses nothing.
async fn same_decisions<E, S, FutE, FutS>(
    coordinator: &Coordinator,
    (enforcing, shadow): (E, S),
    shadow_name: &str,
) where
    E: Fn(String, Planned) -> FutE,
    S: Fn(String, Planned) -> FutS,
    FutE: Future<Output = Result<(), TestError>> + Send + 'static,
    FutS: Future<Output = Result<(), TestError>> + Send + 'static,
{
    let plan = seeded(31, 1_000);
    let rejected = drive(coordinator, &plan, enforcing).await;
    let before = decisions_of(shadow_name, "would_reject");
    let refused = drive(coordinator, &plan, shadow).await;
    let would_reject = decisions_of(shadow_name, "would_reject") - before;
    println!("{shadow_name}: rejected {rejected}, would_reject {would_reject}, refused {refused}");
    assert!(
        rejected >= 50,
        "{shadow_name}: the load refuses too little: {rejected}"
    );
    assert!(
        rejected.abs_diff(would_reject) * 50 <= rejected,
        "{shadow_name}: the shadow counted {would_reject} where the enforcing one refused \
         {rejected}"
    );
    assert_eq!(refused, 0, "{shadow_name}: the shadow refused calls");
}

/// `name`'s decisions of `decision`, whatever the reason.
fn decisions_of(name: &str, decision: &str) -> u64 {
    MetricsLog::global().counter(DECISIONS_TOTAL, &[("name", name), ("decision", decision)])
}

/// An enforcing policy and its shadow twin, `$kind($($arg)*)` on both, for [`same_decisions`].
macro_rules! twins {
    ($enforcing:ident = $e_name:tt, $shadow:ident = $s_name:tt,
     $kind:ident($($arg:tt)*)) => {
        #[$kind(name = $e_name, scope = scope, $($arg)*)]
        async fn $enforcing(scope: String, planned: Planned) -> Result<(), TestError> {
            planned.run(|| TestError::Body("downstream failed")).await
        }

        #[$kind(name = $s_name, scope = scope, shadow = true, $($arg)*)]
        async fn $shadow(scope: String, planned: Planned) -> Result<(), TestError> {
            planned.run(|| TestError::Body("downstream failed")).await
        }
    };
}

// Limits the seeded load exceeds often: 5 calls of 10 ms in flight on average, 500 arrivals a
// second, stretches where most calls fail.
twins!(
    seeded_bulkhead = "seeded-bulkhead",
    seeded_bulkhead_shadow = "seeded-bulkhead-shadow",
    bulkhead(limit = 4)
);
twins!(
    seeded_local_bulkhead = "seeded-local-bulkhead",
    seeded_local_bulkhead_shadow = "seeded-local-bulkhead-shadow",
    bulkhead(limit = 4, local)
);
twins!(
    seeded_breaker = "seeded-breaker",
    seeded_breaker_shadow = "seeded-breaker-shadow",
    circuit_breaker(
        minimum_throughput = 10,
        window_size = 20,
        open = "100ms",
        half_open_probes = 2
    )
);
twins!(
    seeded_local_breaker = "seeded-local-breaker",
    seeded_local_breaker_shadow = "seeded-local-breaker-shadow",
    circuit_breaker(
        minimum_throughput = 10,
        window_size = 20,
        open = "100ms",
        half_open_probes = 2,
        local
    )
);
twins!(
    seeded_rate = "seeded-rate",
    seeded_rate_shadow = "seeded-rate-shadow",
    rate_limit(rate = 150, burst = 5)
);
twins!(
    seeded_local_rate = "seeded-local-rate",
    seeded_local_rate_shadow = "seeded-local-rate-shadow",
    rate_limit(rate = 150, burst = 5, local)
);

/// The claim of shadow mode, on a paused clock: the same seeded load (same arrivals, bodies and
/// failures) through an enforcing and a shadow bulkhead, breaker and rate limit, coordinated
/// (in memory) and `local`.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_shadow_policy_counts_what_the_enforcing_one_refuses_on_the_same_load() {
    MetricsLog::global();
    let coordinator = Coordinator::in_memory();
    let c = &coordinator;
    same_decisions(
        c,
        (seeded_bulkhead, seeded_bulkhead_shadow),
        "seeded-bulkhead-shadow",
    )
    .await;
    same_decisions(
        c,
        (seeded_breaker, seeded_breaker_shadow),
        "seeded-breaker-shadow",
    )
    .await;
    same_decisions(c, (seeded_rate, seeded_rate_shadow), "seeded-rate-shadow").await;
}

/// [`a_shadow_policy_counts_what_the_enforcing_one_refuses_on_the_same_load`] on `local`
/// policies, which decide in the process without the coordinator.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_local_shadow_policy_counts_what_the_enforcing_one_refuses_on_the_same_load() {
    MetricsLog::global();
    let coordinator = Coordinator::in_memory();
    let c = &coordinator;
    same_decisions(
        c,
        (seeded_local_bulkhead, seeded_local_bulkhead_shadow),
        "seeded-local-bulkhead-shadow",
    )
    .await;
    same_decisions(
        c,
        (seeded_local_breaker, seeded_local_breaker_shadow),
        "seeded-local-breaker-shadow",
    )
    .await;
    same_decisions(
        c,
        (seeded_local_rate, seeded_local_rate_shadow),
        "seeded-local-rate-shadow",
    )
    .await;
}
