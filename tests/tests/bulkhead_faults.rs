//! The distributed bulkhead when things go wrong, and what it costs the server: Redis cut off
//! or blackholed by a real TCP proxy, restarted, or stripped of its scripts; commands counted
//! at the server.

mod common;

use std::time::{Duration, Instant};

use caracal::bulkhead;
use caracal_tests::{CommandStats, FaultProxy, RedisServer};
use common::{TestError, code, unique};

const COMMAND_TIMEOUT: Duration = Duration::from_millis(300);

#[bulkhead(name = "faults", limit = 5, scope = scope)]
async fn call(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// While the proxy is faulty, calls fail closed within the command timeout (plus 100 ms);
/// once restored, calls succeed again within a second, in the same process.
async fn fails_closed_then_recovers(proxy: &FaultProxy, fault: impl Fn(&FaultProxy)) {
    let coordinator = common::connect(&proxy.url(), COMMAND_TIMEOUT).await;
    let scope = unique("outage");
    assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");

    fault(proxy);
    for _ in 0..5 {
        let start = Instant::now();
        let result = coordinator.scoped(call(&scope)).await;
        let took = start.elapsed();
        assert_eq!(code(&result), "coordinator_unavailable", "{result:?}");
        assert!(
            took <= COMMAND_TIMEOUT + Duration::from_millis(100),
            "a failed call took {took:?}"
        );
    }

    proxy.restore();
    let restored = Instant::now();
    loop {
        if coordinator.scoped(call(&scope)).await.is_ok() {
            break;
        }
        assert!(
            restored.elapsed() < Duration::from_secs(1),
            "not recovered 1 s after restore"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for _ in 0..20 {
        assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_fails_closed_and_recovers() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    fails_closed_then_recovers(&proxy, FaultProxy::cut).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_connection_fails_closed_and_recovers() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    fails_closed_then_recovers(&proxy, FaultProxy::blackhole).await;
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
    // emptied script cache is refilled, without a caller ever seeing NOSCRIPT.
    server.restart();
    let restarted = Instant::now();
    let mut errors = Vec::new();
    loop {
        match coordinator.scoped(call(&scope)).await {
            Ok(()) => break,
            Err(error) => errors.push(format!("{error:?}")),
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(1),
            "stuck after restart: {errors:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        errors
            .iter()
            .all(|e| !e.contains("NOSCRIPT") && e.contains("CoordinatorUnavailable")),
        "a caller saw NOSCRIPT or something other than a fail-closed rejection: {errors:?}"
    );
    let after_recovery = errors.len();
    for _ in 0..20 {
        assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");
    }
    assert!(
        after_recovery < 100,
        "{after_recovery} failed calls while reconnecting"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_acquire_and_one_release_per_call_counted_at_the_server() {
    let server = RedisServer::start();
    let coordinator = common::redis(&server.url()).await;
    let scope = unique("count");
    // Warm up: the first call may load the script.
    assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");
    let mut conn = server.connection();
    let before = CommandStats::read(&mut conn);
    for _ in 0..50 {
        assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");
    }
    coordinator.shutdown().await;
    // Commands run inside the lease script count in commandstats too: leave them out, and
    // what remains is what the coordinator sent.
    let inside_the_script = [
        "time",
        "zremrangebyscore",
        "zscore",
        "zcard",
        "zadd",
        "zrange",
        "pexpireat",
    ];
    let delta = CommandStats::read(&mut conn)
        .delta(&before)
        .without(&["info"]);
    let sent = delta.without(&inside_the_script);
    assert_eq!(
        sent.calls("evalsha"),
        50,
        "acquires: {:?}",
        delta.calls_map()
    );
    assert_eq!(sent.calls("zrem"), 50, "releases: {:?}", delta.calls_map());
    assert_eq!(
        sent.total_calls(),
        100,
        "nothing else was sent: {:?}",
        delta.calls_map()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_caller_waits_for_the_acquire_only() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let coordinator = common::connect(&proxy.url(), Duration::from_secs(5)).await;
    let scope = unique("latency");
    assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");

    // Every round trip now takes at least 2 × 100 ms; one awaited round trip per call means
    // well under two of them.
    let mut ping = common::ping_connection(&proxy.url()).await;
    proxy.delay(Duration::from_millis(100));
    let round_trip = common::round_trip(&mut ping).await;
    let start = Instant::now();
    assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");
    let guarded = start.elapsed();
    assert!(
        guarded < round_trip.mul_f64(1.5),
        "a guarded call took {guarded:?}, one round trip {round_trip:?}: the caller waited for more than the acquire"
    );
    proxy.restore();
    coordinator.shutdown().await;
}
