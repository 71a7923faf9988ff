//! Batching: while a script call for an identity is in flight, the acquires (and rate-limit
//! arrivals) of that identity that queue behind it go out together as one script call, each
//! caller answered on its own, and its releases go out together as one `ZREM`. What that
//! promises, checked against real servers: fewer script calls than guarded calls (counted at
//! the server), every reply reaching its own caller, the limit held across processes, a failed
//! batch of releases sent again, and no task turned away by its own release.
//!
//! A lone caller still goes out at once, one script call per call:
//! `bulkhead_faults::one_acquire_and_one_release_per_call_counted_at_the_server` counts it and
//! `bulkhead_faults::the_caller_waits_for_the_acquire_only` counts its awaited round trips.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use caracal::{Coordinator, bulkhead, circuit_breaker, rate_limit};
use caracal_tests::{CommandLog, FaultProxy, RedisServer, script_source};

use crate::bulkhead_fleet::fleet;
use crate::common::{self, Gate, Leases, TestError, code, ends, eventually, unique};

/// Tasks calling one identity at once: far more than a round trip's worth of callers.
const TASKS: usize = 64;
/// Calls each of them makes, one after another.
const CALLS_PER_TASK: usize = 50;
/// A command timeout no reply misses on a loaded machine: these tests are about batching, and
/// a slow reply must not turn into a rejection.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// How many bodies of a bulkhead run in this process right now, and the most there ever were.
#[derive(Default)]
struct Inside {
    now: AtomicU32,
    most: AtomicU32,
}

impl Inside {
    async fn run<T>(&self, body: impl Future<Output = T>) -> T {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        let output = body.await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        output
    }

    fn most(&self) -> u32 {
        self.most.load(Ordering::SeqCst)
    }
}

/// A short body that reports its fencing token.
#[bulkhead(name = "batch-lease", limit = 8, scope = scope)]
async fn fenced(scope: &str, inside: &Inside) -> Result<u64, TestError> {
    inside
        .run(async {
            tokio::task::yield_now().await;
            Ok(caracal::fencing_token().expect("a fencing token inside the body"))
        })
        .await
}

#[bulkhead(name = "batch-short", limit = 8, scope = scope)]
async fn short(scope: &str) -> Result<(), TestError> {
    tokio::task::yield_now().await;
    Ok(())
}

#[circuit_breaker(name = "batch-stack", scope = scope)]
#[bulkhead(name = "batch-stack", limit = 8, scope = scope)]
async fn stacked(scope: &str) -> Result<(), TestError> {
    tokio::task::yield_now().await;
    Ok(())
}

#[rate_limit(name = "batch-rate", rate = 1000, burst = 10, scope = scope)]
async fn arrival(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// Runs `tasks` tasks at once, each making `calls` calls of `call` one after another; every
/// result. Every call must end within [`common::PATIENCE`], the check that none hangs; the
/// calls together take as long as the machine needs (thousands of them, on a loaded machine
/// with two cores, take longer than one patience).
async fn hammer<T, F, Fut>(
    coordinator: &Coordinator,
    tasks: usize,
    calls: usize,
    call: F,
) -> Vec<Result<T, TestError>>
where
    T: Send + 'static,
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, TestError>> + Send,
{
    let call = Arc::new(call);
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let call = Arc::clone(&call);
            tokio::spawn(coordinator.scoped(async move {
                let mut results = Vec::with_capacity(calls);
                for _ in 0..calls {
                    results.push(ends("a call", call()).await);
                }
                results
            }))
        })
        .collect();
    let mut results = Vec::with_capacity(tasks * calls);
    for handle in handles {
        results.extend(handle.await.expect("task"));
    }
    results
}

/// [`hammer`] on a coordinator of `server` with every command the server runs logged; the
/// results and the log. The coordinator is shut down at the end: every release and
/// observation it held back has been sent.
async fn hammer_logged<T, F, Fut>(
    server: &RedisServer,
    (tasks, calls): (usize, usize),
    call: F,
) -> (Vec<Result<T, TestError>>, CommandLog)
where
    T: Send + 'static,
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, TestError>> + Send,
{
    let coordinator = common::connect(&server.url(), COMMAND_TIMEOUT).await;
    let mut conn = server.connection();
    CommandLog::start(&mut conn);
    let results = hammer(&coordinator, tasks, calls, call).await;
    coordinator.shutdown().await;
    (results, CommandLog::read(&mut conn))
}

/// Checks that `calls` guarded calls cost fewer than half as many calls of the scripts named
/// `scripts` at the server: with one call each, as without batching, it is at least as many.
fn assert_batched(log: &CommandLog, scripts: &[&str], calls: usize) {
    let sent: usize = scripts
        .iter()
        .map(|name| log.script_calls(&script_source(name)))
        .sum();
    eprintln!("{sent} calls of {scripts:?} for {calls} guarded calls");
    assert!(
        2 * sent < calls,
        "{sent} calls of {scripts:?} for {calls} guarded calls: not batched"
    );
}

/// The releases in `log` (`ZREM`s of lease sets): how many tokens each carried.
fn lease_releases(log: &CommandLog) -> Vec<usize> {
    log.calls_of("zrem")
        .filter(|args| args.first().is_some_and(|key| key.ends_with(":leases")))
        .map(|args| args.len() - 1)
        .collect()
}

/// How many calls ended with each code.
fn codes<T>(results: &[Result<T, TestError>]) -> BTreeMap<&'static str, usize> {
    let mut codes = BTreeMap::new();
    for result in results {
        *codes.entry(code(result)).or_default() += 1;
    }
    codes
}

/// Checks that every call ended with one of the codes `allowed`.
fn assert_ended_as<T>(results: &[Result<T, TestError>], allowed: &[&str]) {
    let ended = codes(results);
    assert!(
        ended.keys().all(|code| allowed.contains(code)),
        "calls ended as {ended:?}, expected only {allowed:?}"
    );
}

/// Counted at the server: 64 tasks on one bulkhead identity make fewer than half as many lease
/// script calls as guarded calls (admitted or rejected), because the acquires that queue
/// while one is in flight share the next script call. Without batching it is one per call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_of_one_identity_share_script_calls() {
    let server = RedisServer::start();
    let scope = unique("batched");
    let (results, log) = hammer_logged(&server, (TASKS, CALLS_PER_TASK), move || {
        let scope = scope.clone();
        async move { short(&scope).await }
    })
    .await;
    assert_ended_as(&results, &["ok", "bulkhead_full"]);
    assert_batched(&log, &["bulkhead_lease"], results.len());
}

/// Counted at the server: a breaker around a bulkhead, 64 tasks on one identity, costs fewer
/// than half a script call per guarded call, all the breaker's and the bulkhead's scripts
/// together: the breaker decides from its cached view and batches its outcomes, the lease
/// acquires share script calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_around_a_bulkhead_shares_script_calls() {
    let server = RedisServer::start();
    let scope = unique("stacked");
    let (results, log) = hammer_logged(&server, (TASKS, CALLS_PER_TASK), move || {
        let scope = scope.clone();
        async move { stacked(&scope).await }
    })
    .await;
    assert_ended_as(&results, &["ok", "bulkhead_full"]);
    assert_batched(
        &log,
        &[
            "bulkhead_lease",
            "breaker_admit",
            "breaker_observe",
            "breaker_settle",
        ],
        results.len(),
    );
}

/// Counted at the server: 64 tasks arriving at one rate limit make fewer than half as many
/// rate-limit script calls as arrivals: arrivals that queue while one is in flight are
/// decided together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_arrivals_of_one_identity_share_script_calls() {
    let server = RedisServer::start();
    let scope = unique("arrivals");
    let (results, log) = hammer_logged(&server, (TASKS, CALLS_PER_TASK), move || {
        let scope = scope.clone();
        async move { arrival(&scope).await }
    })
    .await;
    assert_ended_as(&results, &["ok", "rate_limited"]);
    assert_batched(&log, &["rate_limit"], results.len());
}

/// Each caller of a batch gets its own token's answer. With 64 tasks on one identity (limit
/// 8): every admitted body holds a fencing token no other body held (a reply handed to two
/// callers repeats one); never more than 8 bodies run at once (a grant handed to more callers
/// than it was made for lets too many in); and once every call has ended, no lease is left at
/// the server (30 s leases: none expired meanwhile), whereas a grant handed to a caller whose
/// own token was refused leaves the granted token's lease behind, with nobody to release it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_caller_of_a_batch_gets_its_own_answer() {
    let server = RedisServer::start();
    let coordinator = common::connect(&server.url(), COMMAND_TIMEOUT).await;
    let scope = unique("own-answer");
    let inside = Arc::new(Inside::default());
    let results = hammer(&coordinator, TASKS, CALLS_PER_TASK, {
        let inside = Arc::clone(&inside);
        move || {
            let (scope, inside) = (scope.clone(), Arc::clone(&inside));
            async move { fenced(&scope, &inside).await }
        }
    })
    .await;
    let fences: Vec<u64> = results
        .iter()
        .filter_map(|result| result.as_ref().ok().copied())
        .collect();
    let distinct: HashSet<u64> = fences.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        fences.len(),
        "a fencing token was handed to two bodies ({:?})",
        codes(&results)
    );
    assert!(
        fences.len() >= 8 && fences.len() < results.len(),
        "the budget was used and contended: {:?}",
        codes(&results)
    );
    assert!(
        inside.most() <= 8,
        "{} bodies ran at once on limit 8",
        inside.most()
    );
    let mut leases = Leases::on(&server);
    eventually("every lease to be released", || leases.live() == 0).await;
    coordinator.shutdown().await;
}

/// The fleet of `bulkhead_fleet` (4 processes sharing `limit = 3`, witnessed outside the
/// processes) with 64 tasks per process, enough that each process admits in batches, which
/// the server's count confirms: still never more than 3 bodies at once, no lease left.
/// (`bulkhead_fleet` runs 16 tasks per process, where batches are small.)
#[test]
fn a_fleet_admitting_in_batches_never_exceeds_the_limit() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    CommandLog::start(&mut conn);
    let calls = fleet(&server.url(), Leases::on(&server), 64);
    let log = CommandLog::read(&mut conn);
    assert_batched(
        &log,
        &["bulkhead_lease"],
        usize::try_from(calls).expect("calls"),
    );
}

#[bulkhead(name = "batch-release", limit = 8, scope = scope)]
async fn held(scope: &str, gate: Gate) -> Result<(), TestError> {
    gate.pass().await;
    Ok(())
}

/// How long the connection stays cut once every release is waiting: many times the pause
/// before a failed release is sent again (50 ms), so the batch of all of them is sent, and
/// fails, several times.
const CUT_WITH_RELEASES_WAITING: Duration = Duration::from_millis(500);

/// A batch of releases whose `ZREM` failed is sent again like a single release. Eight holders
/// of one bulkhead (30 s leases) end together while the connection is cut: their releases queue
/// behind the first, fail, and are sent again as one `ZREM`, failing again while the cut lasts.
/// Once the connection is back, that `ZREM` frees every slot, long before the leases would
/// have expired (no call is made meanwhile: nothing but the retry sends them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_of_releases_is_sent_again() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let coordinator = common::redis(&proxy.url()).await;
    let scope = unique("release-batch");
    let gate = Gate::closed();
    let holders: Vec<_> = (0..8)
        .map(|_| {
            let (scope, gate) = (scope.clone(), gate.clone());
            tokio::spawn(coordinator.scoped(async move { held(&scope, gate).await }))
        })
        .collect();
    gate.entered(8).await;
    let mut conn = server.connection();
    CommandLog::start(&mut conn);
    proxy.cut();
    gate.open(8);
    for holder in holders {
        // Its lease was taken before the cut, so the body's end counts; its release fails.
        assert_eq!(code(&ends("a holder", holder).await.expect("holder")), "ok");
    }
    // Every release is waiting now: the holders' leases were dropped as their calls returned.
    tokio::time::sleep(CUT_WITH_RELEASES_WAITING).await;
    proxy.restore();
    let mut leases = Leases::on(&server);
    eventually("every slot to be released", || leases.live() == 0).await;
    let log = CommandLog::read(&mut conn);
    let batch = lease_releases(&log).into_iter().max();
    assert!(
        batch.is_some_and(|tokens| tokens > 1),
        "the slots were not freed by a batch of releases: {batch:?} tokens at most in one ZREM"
    );
    let again = Gate::closed();
    again.open(1);
    assert_eq!(
        code(&coordinator.scoped(held(&scope, again)).await),
        "ok",
        "admitted again"
    );
    coordinator.shutdown().await;
}

#[bulkhead(name = "batch-loop", limit = 16, scope = scope)]
async fn looping(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// 16 tasks loop call after call (1000 each) on a bulkhead of limit 16, their acquires and
/// releases batched (counted at the server). Each task has at most one lease in the set unless
/// its release was overtaken by its own next acquire, so a full set, and any rejection, means
/// some task's release came after its next acquire. None is rejected: a task's release is on
/// the connection before its next acquire, whichever batch carries either. (A lone task looping
/// on `limit = 1` is `bulkhead::a_task_looping_on_limit_one_is_never_rejected_by_itself`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn looping_tasks_are_never_rejected_by_their_own_releases() {
    let server = RedisServer::start();
    let scope = unique("loop");
    let (results, log) = hammer_logged(&server, (16, 1000), move || {
        let scope = scope.clone();
        async move { looping(&scope).await }
    })
    .await;
    assert_ended_as(&results, &["ok"]);
    assert_batched(&log, &["bulkhead_lease"], results.len());
    let releases = lease_releases(&log).len();
    assert!(
        2 * releases < results.len(),
        "{releases} ZREMs for {} releases: not batched",
        results.len()
    );
}
