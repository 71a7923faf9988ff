//! The distributed bulkhead when things go wrong, and what it costs: Redis cut off or
//! blackholed by a real TCP proxy, restarted, or stripped of its scripts; commands counted at
//! the server, awaited round trips at the proxy.

use std::time::Duration;

use caracal::{FailureKind, bulkhead};
use caracal_tests::{CommandLog, FaultProxy, RedisServer, background_scripts, script_source};
use tokio::sync::oneshot;

use crate::common::{self, Fault, Leases, TestError, code, ends, failure_kind, unique};

const COMMAND_TIMEOUT: Duration = Duration::from_millis(300);

#[bulkhead(name = "faults", limit = 5, scope = scope)]
async fn call(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// While the proxy is faulty, calls fail closed: each ends (no hang) as
/// `CoordinatorUnavailable`, of the kind the fault explains (the command timeout fired, or the
/// connection is gone). Once restored, calls succeed again in the same process.
async fn fails_closed_then_recovers(proxy: &FaultProxy, fault: Fault) {
    let coordinator = common::connect(&proxy.url(), COMMAND_TIMEOUT).await;
    let scope = unique("outage");
    assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");

    fault.apply(proxy);
    let mut kinds = Vec::new();
    for _ in 0..5 {
        let result = ends("a call under the fault", coordinator.scoped(call(&scope))).await;
        assert_eq!(code(&result), "coordinator_unavailable", "{result:?}");
        kinds.push(failure_kind(&result).map(FailureKind::as_str));
    }
    fault.check(&kinds);

    proxy.restore();
    common::until_ok(|| coordinator.scoped(call(&scope))).await;
    for _ in 0..20 {
        assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_fails_closed_and_recovers() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    fails_closed_then_recovers(&proxy, Fault::Cut).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_connection_fails_closed_and_recovers() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    fails_closed_then_recovers(&proxy, Fault::Blackhole).await;
}

/// A bulkhead whose lease is short: after a restart, admissions resume one lease later.
#[bulkhead(name = "faults-restart", limit = 5, lease = "300ms", scope = scope)]
async fn short_lease(scope: &str) -> Result<(), TestError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_or_script_flush_never_surfaces_noscript() {
    let mut server = RedisServer::start();
    let coordinator = common::redis(&server.url()).await;
    let scope = unique("restart");
    assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");

    // Scripts flushed between calls: the EVALSHA miss falls back to EVAL, invisibly.
    for _ in 0..5 {
        redis::cmd("SCRIPT")
            .arg("FLUSH")
            .exec(&mut server.connection())
            .expect("SCRIPT FLUSH");
        assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");
    }

    // A restart on the same port: the dead connection is noticed and replaced, and the
    // emptied script cache is refilled, without a caller ever seeing NOSCRIPT. The server
    // lost its leases, so admissions pause for one lease (every lease granted before has
    // expired at its holder by then): meanwhile calls fail closed, saying why.
    assert_eq!(code(&coordinator.scoped(short_lease(&scope)).await), "ok");
    server.restart();
    let failed = common::until_ok(|| coordinator.scoped(short_lease(&scope))).await;
    let errors: Vec<String> = failed.iter().map(|e| format!("{e:?}")).collect();
    assert!(
        errors
            .iter()
            .all(|e| !e.contains("NOSCRIPT") && e.contains("CoordinatorUnavailable")),
        "a caller saw NOSCRIPT or something other than a fail-closed rejection: {errors:?}"
    );
    assert!(
        failed
            .iter()
            .any(|result| failure_kind(result) == Some(FailureKind::DataLost)),
        "admissions did not pause after the server lost its leases: {errors:?}"
    );
    for _ in 0..20 {
        assert_eq!(code(&coordinator.scoped(short_lease(&scope)).await), "ok");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_acquire_and_one_release_per_call_counted_at_the_server() {
    let server = RedisServer::start();
    let coordinator = common::redis(&server.url()).await;
    let scope = unique("count");
    // Warm up: the first call may load the script. Its release is sent in the background:
    // counted before, once it has landed.
    assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");
    let mut leases = Leases::on(&server);
    common::eventually("the warm-up call's release", || leases.live() == 0).await;
    let mut conn = server.connection();
    CommandLog::start(&mut conn);
    for _ in 0..50 {
        assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");
    }
    coordinator.shutdown().await;
    let log = CommandLog::read(&mut conn);
    let lease = script_source("bulkhead_lease");
    assert_eq!(log.script_calls(&lease), 50, "acquires");
    // The release is the one ZREM sent outside a script.
    assert_eq!(log.calls("zrem"), 50, "releases");
    let mut expected: Vec<String> = background_scripts();
    expected.push(lease);
    let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
    // Inside the scripts: the lease script's commands, and the background scripts'.
    let inside = [
        "time",
        "zremrangebyscore",
        "zscore",
        "zmscore",
        "zcard",
        "zadd",
        "zrange",
        "pexpireat",
        "get",
        "set",
        "hmget",
        "hset",
        "hdel",
        "hgetall",
        "zrem",
        "info",
        // The registry report's forgetting (its two-field layout).
        "zcount",
        "zremrangebyrank",
        "hget",
    ];
    let others = log.others(&expected, &inside);
    assert!(others.is_empty(), "nothing else was sent: {others:?}");
}

/// Counted at the proxy: a call completes once the acquire's reply is let through, with the
/// release's reply (and everything after) still held: the caller waits for the acquire only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_caller_waits_for_the_acquire_only() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let coordinator = common::connect(&proxy.url(), Duration::from_secs(60)).await;
    let scope = unique("latency");
    let guarded = || coordinator.scoped(call(&scope));
    let (result, awaited) = common::awaited_replies(&proxy, 1, guarded, guarded).await;
    assert_eq!(
        (code(&result), awaited),
        ("ok", 1),
        "admitted without the acquire's reply? {result:?}"
    );
    coordinator.shutdown().await;
}

/// The lone-call path, seen at the proxy: a lone caller's release is queued on the
/// connection before its call returns and left there, so the same task's next acquire goes
/// out in the same write. Of 500 sequential calls, the `ZREM` of call n reaches the proxy in
/// the same read as call n + 1's `EVALSHA`, ahead of it, in at least 90 % of them. A release
/// given a task of its own, or a yield once it is queued, lets the connection write it alone
/// (or after the acquire).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_callers_release_rides_with_its_next_acquire() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let coordinator = common::redis(&proxy.url()).await;
    let scope = unique("lone");
    // Warm up: the first call may load the script.
    assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");
    proxy.record_reads();
    const CALLS: usize = 500;
    // From a task of the runtime, as a request handler calls: the test's own thread, which
    // `block_on`s, is none of the runtime's workers, and every wake-up from it crosses
    // threads.
    tokio::spawn({
        let (coordinator, scope) = (coordinator.clone(), scope.clone());
        async move {
            for _ in 0..CALLS {
                assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");
            }
        }
    })
    .await
    .expect("the calls");
    let reads = proxy.recorded_reads();
    let riding = reads
        .iter()
        .filter(|read| {
            read.iter()
                .position(|name| name == "ZREM")
                .is_some_and(|at| read[at..].iter().any(|name| name == "EVALSHA"))
        })
        .count();
    let zrems = reads
        .iter()
        .flatten()
        .filter(|name| *name == "ZREM")
        .count();
    println!("{riding} of {zrems} releases went out with the next acquire");
    assert!(
        riding * 10 >= CALLS * 9,
        "{riding} of {CALLS} releases went out with the next acquire: {:?}",
        &reads[..reads.len().min(20)]
    );
    coordinator.shutdown().await;
}

/// A lone call's release is shelved, not spawned: when the call returns, its `ZREM` is on the
/// connection and its work waits on a shelf for the next acquire to carry it, so the runtime
/// has no more tasks than before the call. Checked on a runtime of one thread, where nothing
/// else runs while the call does.
#[tokio::test(flavor = "current_thread")]
async fn a_lone_calls_release_is_shelved_not_spawned() {
    let server = RedisServer::start();
    let coordinator = common::redis(&server.url()).await;
    let scope = unique("shelved");
    assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");
    let mut leases = Leases::on(&server);
    common::eventually("the warm-up call's release", || leases.live() == 0).await;
    let metrics = tokio::runtime::Handle::current().metrics();
    for n in 0..20 {
        let before = metrics.num_alive_tasks();
        assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");
        assert_eq!(
            metrics.num_alive_tasks(),
            before,
            "call {n}: a task more when it returned"
        );
    }
    coordinator.shutdown().await;
}

/// Room for one: a caller's own earlier lease, still in the set, turns it away.
#[bulkhead(name = "faults-own-release", limit = 1, scope = scope)]
async fn alone(
    scope: &str,
    hold: Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>,
) -> Result<(), TestError> {
    if let Some((entered, leave)) = hold {
        let _ = entered.send(());
        let _ = leave.await;
    }
    Ok(())
}

/// A release whose connection broke under it was sent again after a pause, on any connection:
/// the same task's next acquire, once the connection was back, could go out first and find
/// the task's own lease still held. A release whose outcome is unknown now waits in its
/// identity's queue and goes out just before that identity's next acquire, on its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_failed_is_not_overtaken_by_the_next_acquire() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let coordinator = common::redis(&proxy.url()).await;
    let scope = unique("own-release");
    assert_eq!(code(&coordinator.scoped(alone(&scope, None)).await), "ok");
    let (entered, inside) = oneshot::channel();
    let (leave, left) = oneshot::channel();
    let holder = tokio::spawn({
        let (coordinator, scope) = (coordinator.clone(), scope.clone());
        async move {
            coordinator
                .scoped(alone(&scope, Some((entered, left))))
                .await
        }
    });
    inside.await.expect("the holder entered");
    proxy.cut();
    leave.send(()).expect("the holder waits");
    // Its lease was taken before the cut, so the body's end counts; its release fails.
    assert_eq!(code(&holder.await.expect("holder")), "ok");
    proxy.restore();
    let before = common::until_ok(|| coordinator.scoped(alone(&scope, None))).await;
    let codes: Vec<&str> = before.iter().map(code).collect();
    assert!(
        !codes.contains(&"bulkhead_full"),
        "turned away by its own lease: {codes:?}"
    );
}
