//! Cancellation and runtime edges: a call dropped while its acquire is in flight, a lease
//! dropped outside any runtime, a connection whose reconnection task died with its runtime.

mod common;

use std::time::{Duration, Instant};

use caracal::{Coordinator, bulkhead};
use caracal_tests::RedisServer;
use common::{TestError, code, unique};

#[bulkhead(name = "edges", limit = 1, scope = scope)]
async fn hold(
    scope: &str,
    entered: Option<tokio::sync::oneshot::Sender<()>>,
) -> Result<(), TestError> {
    if let Some(entered) = entered {
        let _ = entered.send(());
        std::future::pending::<()>().await;
    }
    Ok(())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Polls `call` until it succeeds; how long that took.
async fn until_ok<F: Future<Output = Result<(), TestError>>>(
    mut call: impl FnMut() -> F,
) -> Duration {
    let start = Instant::now();
    loop {
        let result = call().await;
        if result.is_ok() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "still failing: {result:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_during_its_acquire_leaves_no_lease_behind() {
    let server = RedisServer::start();
    let coordinator = common::redis(&server.url()).await;
    let scope = unique("dropped-acquire");
    // The script is cached, so the acquire below takes a lease as soon as the server resumes.
    assert_eq!(code(&coordinator.scoped(hold(&scope, None)).await), "ok");
    // The server stalls 300 ms, so the acquire below is sent, then its caller gives up.
    let mut stall = server.connection();
    let stalled =
        std::thread::spawn(move || redis::cmd("DEBUG").arg("SLEEP").arg(0.3).exec(&mut stall));
    std::thread::sleep(Duration::from_millis(50));
    let abandoned = tokio::time::timeout(
        Duration::from_millis(50),
        coordinator.scoped(hold(&scope, None)),
    )
    .await;
    assert!(
        abandoned.is_err(),
        "the call was dropped while its acquire was in flight"
    );
    stalled.join().expect("stall thread").expect("DEBUG SLEEP");
    // The lease is 30 s; the slot is back as soon as the queued release lands.
    let waited = until_ok(|| coordinator.scoped(hold(&scope, None))).await;
    assert!(
        waited < Duration::from_millis(500),
        "slot back after {waited:?}"
    );
}

#[test]
fn a_lease_dropped_outside_any_runtime_is_released() {
    let server = RedisServer::start();
    let runtime = runtime();
    let coordinator = runtime.block_on(common::redis(&server.url()));
    let scope = unique("outside");
    let (entered, inside) = tokio::sync::oneshot::channel();
    let mut holding = Box::pin(coordinator.scoped(hold(&scope, Some(entered))));
    runtime.block_on(async {
        tokio::select! {
            _ = &mut holding => unreachable!("the body never returns"),
            _ = inside => {}
        }
    });
    // Not inside the runtime now: the guard must still queue its release, without panicking.
    drop(holding);
    let waited = runtime.block_on(until_ok(|| coordinator.scoped(hold(&scope, None))));
    assert!(
        waited < Duration::from_millis(500),
        "slot back after {waited:?}"
    );
}

#[test]
fn a_connection_outlives_the_runtime_that_was_reconnecting_it() {
    let mut server = RedisServer::start();
    let scope = unique("reconnect");
    let first = runtime();
    let coordinator: Coordinator = first.block_on(async {
        let coordinator = Coordinator::redis(server.url())
            .namespace(unique("reconnect"))
            .pool_size(1)
            .command_timeout(Duration::from_millis(300))
            .connect()
            .await
            .expect("connect");
        assert_eq!(code(&coordinator.scoped(hold(&scope, None)).await), "ok");
        coordinator
    });
    server.stop();
    // The lost connection is noticed and a reconnection starts on the first runtime...
    std::thread::sleep(Duration::from_millis(200));
    // ...which then goes away with it.
    drop(first);
    server.restart();
    let second = runtime();
    let waited = second.block_on(until_ok(|| coordinator.scoped(hold(&scope, None))));
    assert!(
        waited < Duration::from_secs(2),
        "reconnected after {waited:?}"
    );
}
