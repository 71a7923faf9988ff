//! Cancellation and runtime edges: a call dropped while its acquire is in flight or still
//! queued, a lease dropped outside any runtime (standalone and cluster), a connection whose
//! reconnection task died with its runtime; a lone caller's release carried by its next
//! acquire (the task that dropped a lease polls the `ZREM`'s reply with its own acquire's)
//! when that call is no longer polled, when runtimes die, across runtimes; and work in flight
//! (an acquire, a release) when the runtime carrying it is dropped, standalone and cluster.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use caracal::{Coordinator, bulkhead, rate_limit};
use caracal_tests::{FaultProxy, RedisCluster, RedisServer};

use crate::common::{self, Leases, PATIENCE, TestError, code, unique, until_ok};

#[bulkhead(name = "edges", limit = 1, scope = scope)]
async fn hold(
    scope: &str,
    entered: Option<tokio::sync::oneshot::Sender<()>>,
) -> Result<(), TestError> {
    body(entered).await
}

/// Returns at once, or (told whom to tell it entered) never.
async fn body(entered: Option<tokio::sync::oneshot::Sender<()>>) -> Result<(), TestError> {
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

/// The acquire reaches the server and takes a lease, but its reply is held at the proxy until
/// the caller has given up: the lease (30 s) is released at once all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_during_its_acquire_leaves_no_lease_behind() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let coordinator = common::connect(&proxy.url(), Duration::from_secs(60)).await;
    let mut leases = Leases::on(&server);
    let scope = unique("dropped-acquire");
    // The script is cached, so the acquire below takes a lease as soon as the server gets it.
    assert_eq!(code(&coordinator.scoped(hold(&scope, None)).await), "ok");
    common::eventually("the first call's release", || leases.live() == 0).await;

    proxy.wait_idle(PATIENCE).await;
    proxy.hold_replies();
    let mut call = Box::pin(coordinator.scoped(hold(&scope, None)));
    let held = async {
        common::eventually("the acquire's reply to be held", || {
            proxy.held_replies() == 1
        })
        .await;
    };
    tokio::select! {
        result = &mut call => panic!("admitted without the acquire's reply: {result:?}"),
        () = held => {}
    }
    assert_eq!(leases.live(), 1, "the acquire took a lease at the server");
    drop(call);
    proxy.restore();
    common::eventually("the abandoned lease to be released", || leases.live() == 0).await;
    assert_eq!(code(&coordinator.scoped(hold(&scope, None)).await), "ok");
}

/// Room for two: a second caller's acquire would be granted while the first holds its lease,
/// so one that nobody receives shows up as a live lease.
#[bulkhead(name = "edges-pair", limit = 2, scope = scope)]
async fn pair(
    scope: &str,
    entered: Option<tokio::sync::oneshot::Sender<()>>,
) -> Result<(), TestError> {
    body(entered).await
}

/// A coordinator through a proxy whose `scope` has been used once (its script is cached) and
/// whose traffic has settled, with no live lease.
async fn settled(proxy: &FaultProxy, leases: &mut Leases, scope: &str) -> Coordinator {
    let coordinator = common::connect(&proxy.url(), Duration::from_secs(60)).await;
    assert_eq!(code(&coordinator.scoped(pair(scope, None)).await), "ok");
    common::eventually("the first call's release", || leases.live() == 0).await;
    proxy.wait_idle(PATIENCE).await;
    coordinator
}

/// A caller queued behind an acquire in flight for its identity is cancelled before its own
/// acquire goes out. Its acquire used to go out all the same, after the release its drop sent
/// (which found nothing), and take a lease nobody held until the lease expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cancelled_while_queued_behind_an_acquire_leaves_no_lease_behind() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let mut leases = Leases::on(&server);
    let scope = unique("cancelled-queued");
    let coordinator = settled(&proxy, &mut leases, &scope).await;

    proxy.hold_replies();
    let first = tokio::spawn({
        let (coordinator, scope) = (coordinator.clone(), scope.clone());
        async move { coordinator.scoped(pair(&scope, None)).await }
    });
    common::eventually("the first acquire's reply to be held", || {
        proxy.held_replies() == 1
    })
    .await;
    // Polled once, the second call joins the lane behind the first acquire, then is dropped.
    let mut second = Box::pin(coordinator.scoped(pair(&scope, None)));
    tokio::select! {
        biased;
        result = &mut second => panic!("admitted while every reply is held: {result:?}"),
        () = std::future::ready(()) => {}
    }
    drop(second);
    common::eventually("the cancelled call's release to be answered", || {
        proxy.held_replies() == 2
    })
    .await;
    proxy.restore();
    assert_eq!(code(&first.await.expect("first call")), "ok");
    proxy.wait_idle(PATIENCE).await;
    assert_eq!(leases.live(), 0, "a lease nobody holds is left behind");
}

/// Two admissions per 100 s: a third arrival charged within the test would be refused.
#[rate_limit(name = "edges-rate", rate = 0.01, burst = 2, scope = scope)]
async fn scarce(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// The rate limit's lane: an arrival cancelled while queued behind one in flight used to be
/// sent and charged all the same, spending the burst of callers still waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arrival_cancelled_while_queued_is_not_charged() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let coordinator = common::connect(&proxy.url(), Duration::from_secs(60)).await;
    // Another scope's arrival loads the script, so each arrival below is one request.
    assert_eq!(
        code(&coordinator.scoped(scarce(&unique("warm"))).await),
        "ok"
    );
    proxy.wait_idle(PATIENCE).await;
    let scope = unique("cancelled-arrival");

    proxy.hold_replies();
    let first = tokio::spawn({
        let (coordinator, scope) = (coordinator.clone(), scope.clone());
        async move { coordinator.scoped(scarce(&scope)).await }
    });
    common::eventually("the first arrival's reply to be held", || {
        proxy.held_replies() == 1
    })
    .await;
    let mut cancelled = Box::pin(coordinator.scoped(scarce(&scope)));
    tokio::select! {
        biased;
        result = &mut cancelled => panic!("decided while every reply is held: {result:?}"),
        () = std::future::ready(()) => {}
    }
    drop(cancelled);
    proxy.restore();
    assert_eq!(code(&first.await.expect("first call")), "ok");
    proxy.wait_idle(PATIENCE).await;
    assert_eq!(
        code(&coordinator.scoped(scarce(&scope)).await),
        "ok",
        "the cancelled arrival spent the second admission of the burst"
    );
}

/// After `SCRIPT FLUSH`, the acquire's `EVALSHA` is answered `NOSCRIPT` and sent again as
/// `EVAL`. A caller cancelled between the two used to have its release run first, then the
/// `EVAL` (sent in the background) took a lease nobody held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cancelled_during_the_noscript_fallback_leaves_no_lease_behind() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let mut leases = Leases::on(&server);
    let scope = unique("cancelled-noscript");
    let coordinator = settled(&proxy, &mut leases, &scope).await;
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .exec(&mut server.connection())
        .expect("SCRIPT FLUSH");

    proxy.hold_replies();
    let mut call = Box::pin(coordinator.scoped(pair(&scope, None)));
    let noscript_held = async {
        common::eventually("the NOSCRIPT reply to be held", || {
            proxy.held_replies() == 1
        })
        .await;
    };
    tokio::select! {
        result = &mut call => panic!("admitted while every reply is held: {result:?}"),
        () = noscript_held => {}
    }
    drop(call);
    common::eventually("the cancelled call's release to be answered", || {
        proxy.held_replies() == 2
    })
    .await;
    proxy.restore();
    proxy.wait_idle(PATIENCE).await;
    assert_eq!(
        leases.live(),
        0,
        "the EVAL fallback took a lease nobody holds"
    );
}

/// Holds a lease of `coordinator` (built on `runtime`), drops it on this thread, outside any
/// runtime, then waits for the slot to come back: the guard must still send its release,
/// without panicking. The lease is 30 s, so a slot back within the wait was released.
fn lease_dropped_outside_any_runtime(runtime: &tokio::runtime::Runtime, coordinator: &Coordinator) {
    let scope = unique("outside");
    let (entered, inside) = tokio::sync::oneshot::channel();
    let mut holding = Box::pin(coordinator.scoped(hold(&scope, Some(entered))));
    runtime.block_on(async {
        tokio::select! {
            _ = &mut holding => unreachable!("the body never returns"),
            _ = inside => {}
        }
    });
    drop(holding);
    runtime.block_on(until_ok(|| coordinator.scoped(hold(&scope, None))));
}

#[test]
fn a_lease_dropped_outside_any_runtime_is_released() {
    let server = RedisServer::start();
    let runtime = runtime();
    let coordinator = runtime.block_on(common::redis(&server.url()));
    lease_dropped_outside_any_runtime(&runtime, &coordinator);
}

/// The cluster client arms a timer (its response timeout) when a command is first polled,
/// which needs a runtime: the release of a lease dropped outside one used to panic in `Drop`.
#[test]
fn a_lease_dropped_outside_any_runtime_is_released_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    let runtime = runtime();
    let coordinator = runtime.block_on(common::cluster(cluster.seed_urls()));
    lease_dropped_outside_any_runtime(&runtime, &coordinator);
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
        assert_eq!(code(&coordinator.scoped(short_lease(&scope)).await), "ok");
        coordinator
    });
    server.stop();
    // The lost connection is noticed and a reconnection starts on the first runtime...
    std::thread::sleep(Duration::from_millis(200));
    // ...which then goes away with it.
    drop(first);
    server.restart();
    let second = runtime();
    // The restarted server lost its leases: admissions resume one (short) lease later.
    second.block_on(until_ok(|| coordinator.scoped(short_lease(&scope))));
}

#[bulkhead(name = "edges-restart", limit = 1, lease = "300ms", scope = scope)]
async fn short_lease(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// The task drops a lease (its `ZREM`'s reply held at the proxy), starts its next call of the
/// identity, polls it once (it carries the release) and then holds it unpolled, as any future
/// may be. Shutdown's flush takes the release back and lets it finish, rather than waiting
/// its whole limit (the command timeout, a minute here) for a poll that never comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_carried_by_a_call_no_longer_polled_does_not_hold_up_shutdown() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let mut leases = Leases::on(&server);
    let scope = unique("carried-unpolled");
    let coordinator = settled(&proxy, &mut leases, &scope).await;

    let (entered, inside) = tokio::sync::oneshot::channel();
    let mut holding = Box::pin(coordinator.scoped(pair(&scope, Some(entered))));
    tokio::select! {
        _ = &mut holding => unreachable!("the body never returns"),
        _ = inside => {}
    }
    proxy.hold_replies();
    drop(holding);
    common::eventually("the ZREM's reply held", || proxy.held_replies() == 1).await;
    let mut next = Box::pin(coordinator.scoped(pair(&scope, None)));
    tokio::select! {
        biased;
        result = &mut next => panic!("admitted while every reply is held: {result:?}"),
        () = std::future::ready(()) => {}
    }
    common::eventually("the acquire's reply held", || proxy.held_replies() == 2).await;
    proxy.restore();
    proxy.wait_idle(PATIENCE).await;
    tokio::time::timeout(PATIENCE, coordinator.shutdown())
        .await
        .expect("shutdown took the carried release back instead of waiting for its carrier");
    drop(next);
}

/// The coordinator outlives the runtime it was built on and serves on a second one; a guard
/// is then dropped on a plain thread. Its release finishes on the runtime still running (it
/// used to be handed to the dead one and lost), and dropping it never panics.
#[test]
fn a_guard_dropped_outside_any_runtime_after_the_first_runtime_died_is_released() {
    let server = RedisServer::start();
    let scope = unique("dead-home");
    let first = runtime();
    let coordinator = first.block_on(common::redis(&server.url()));
    drop(first);
    let second = runtime();
    second.block_on(until_ok(|| coordinator.scoped(pair(&scope, None))));
    let (entered, inside) = tokio::sync::oneshot::channel();
    let mut holding = Box::pin(coordinator.scoped(pair(&scope, Some(entered))));
    second.block_on(async {
        tokio::select! {
            _ = &mut holding => unreachable!("the body never returns"),
            _ = inside => {}
        }
    });
    let mut leases = Leases::on(&server);
    assert_eq!(leases.live(), 1);
    let dropped = std::panic::catch_unwind(AssertUnwindSafe(|| drop(holding)));
    assert!(
        dropped.is_ok(),
        "dropping the guard outside any runtime panicked"
    );
    second.block_on(common::eventually("the release", || leases.live() == 0));
}

/// A lease dropped by a task of one runtime while its `ZREM`'s reply is held; the next call of
/// the identity runs on another runtime, and the first runtime is then dropped. The release is
/// not carried across runtimes (its timer would die with its runtime, and the carrier with a
/// panic), so the call on the second runtime simply completes.
#[test]
fn a_release_is_never_carried_by_a_call_on_another_runtime() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let mut leases = Leases::on(&server);
    let scope = unique("carried-dead-timer");
    let home = runtime();
    let coordinator = home.block_on(settled(&proxy, &mut leases, &scope));
    let first = runtime();
    let (entered, inside) = tokio::sync::oneshot::channel();
    let task = first.spawn({
        let (coordinator, scope) = (coordinator.clone(), scope.clone());
        async move { coordinator.scoped(pair(&scope, Some(entered))).await }
    });
    first.block_on(async { inside.await.expect("entered") });
    proxy.hold_replies();
    // The guard drops on the first runtime: its `ZREM` and its timer start there.
    task.abort();
    first.block_on(async {
        let _ = task.await;
        common::eventually("the ZREM's reply held", || proxy.held_replies() == 1).await;
    });
    let second = runtime();
    let next = second.spawn({
        let (coordinator, scope) = (coordinator.clone(), scope.clone());
        async move { coordinator.scoped(pair(&scope, None)).await }
    });
    home.block_on(common::eventually("the acquire's reply held", || {
        proxy.held_replies() == 2
    }));
    drop(first);
    // Its timers fire as it shuts down: a carrier on the second runtime would be woken and
    // poll them now, while the replies are still held.
    std::thread::sleep(Duration::from_millis(100));
    proxy.restore();
    let outcome = second.block_on(next);
    assert!(outcome.is_ok(), "the call on the second runtime panicked");
}

/// The coordinator serves on a long-lived runtime; a short-lived one makes a call and is
/// dropped; a guard is then dropped on a plain thread. Its release finishes on the runtime
/// still running, not on the one that started work last.
#[test]
fn a_guard_dropped_outside_any_runtime_after_a_later_runtime_died_is_released() {
    let server = RedisServer::start();
    let scope = unique("dead-latest");
    let main = runtime();
    let coordinator = main.block_on(common::redis(&server.url()));
    main.block_on(until_ok(|| coordinator.scoped(pair(&scope, None))));
    let (entered, inside) = tokio::sync::oneshot::channel();
    let mut holding = Box::pin(coordinator.scoped(pair(&scope, Some(entered))));
    main.block_on(async {
        tokio::select! {
            _ = &mut holding => unreachable!("the body never returns"),
            _ = inside => {}
        }
    });
    let mut leases = Leases::on(&server);
    assert_eq!(leases.live(), 1);
    let brief = runtime();
    brief.block_on(async {
        assert_eq!(code(&coordinator.scoped(pair(&scope, None)).await), "ok");
    });
    drop(brief);
    drop(holding);
    main.block_on(common::eventually("the release", || leases.live() == 0));
}

/// A lease dropped by a task of a runtime that is then dropped while the `ZREM`'s reply is
/// held; a guard of the same identity is dropped on a plain thread meanwhile (its release
/// waits behind the one in flight). The first release's work wakes after its runtime died (its
/// timer fires as the runtime shuts down): it finishes on the runtime still running, and so
/// does the release queued behind it. Both used to be lost with the dead runtime, and every
/// later release of the identity queued behind them.
#[test]
fn a_release_whose_runtime_died_while_it_was_in_flight_still_finishes() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let mut leases = Leases::on(&server);
    let scope = unique("release-orphaned");
    let main = runtime();
    let coordinator = main.block_on(settled(&proxy, &mut leases, &scope));
    let (entered, inside) = tokio::sync::oneshot::channel();
    let mut holding = Box::pin(coordinator.scoped(pair(&scope, Some(entered))));
    main.block_on(async {
        tokio::select! {
            _ = &mut holding => unreachable!("the body never returns"),
            _ = inside => {}
        }
    });
    let brief = runtime();
    let (entered, inside) = tokio::sync::oneshot::channel();
    let task = brief.spawn({
        let (coordinator, scope) = (coordinator.clone(), scope.clone());
        async move { coordinator.scoped(pair(&scope, Some(entered))).await }
    });
    brief.block_on(async { inside.await.expect("entered") });
    assert_eq!(leases.live(), 2);
    proxy.hold_replies();
    task.abort();
    brief.block_on(async {
        let _ = task.await;
        common::eventually("the ZREM's reply held", || proxy.held_replies() == 1).await;
    });
    drop(brief);
    drop(holding);
    proxy.restore();
    main.block_on(common::eventually("both releases", || leases.live() == 0));
    main.block_on(async {
        assert_eq!(code(&coordinator.scoped(pair(&scope, None)).await), "ok");
    });
}

/// A call whose acquire is in flight (its reply held) when the runtime of its task is dropped.
/// Its identity's lane was left busy with no one to move it on: every later call of the
/// identity queued behind it and timed out. Now the batch finishes on the runtime still
/// running, and the next call goes out.
#[test]
fn a_call_in_flight_when_its_runtime_dies_does_not_wedge_its_identity() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let mut leases = Leases::on(&server);
    let scope = unique("acquire-orphaned");
    let main = runtime();
    let coordinator = main.block_on(settled(&proxy, &mut leases, &scope));
    let brief = runtime();
    proxy.hold_replies();
    let _task = brief.spawn({
        let (coordinator, scope) = (coordinator.clone(), scope.clone());
        async move { coordinator.scoped(pair(&scope, None)).await }
    });
    main.block_on(common::eventually("the acquire's reply held", || {
        proxy.held_replies() == 1
    }));
    drop(brief);
    proxy.restore();
    main.block_on(async {
        let next = common::ends("the next call", coordinator.scoped(pair(&scope, None))).await;
        assert_eq!(code(&next), "ok");
        common::eventually("the orphaned lease released", || leases.live() == 0).await;
    });
}

/// On a cluster: a call in flight (every node frozen) when the runtime of its task is dropped.
/// The cluster client's own overall timer, armed in the caller's future, used to panic when
/// the batch was polled on the runtime still running, so the batch was lost and its lane stayed
/// busy; now the client arms none (each call is bounded by caracal's own deadline), and the
/// batch finishes there.
#[test]
fn a_cluster_call_in_flight_when_its_runtime_dies_does_not_wedge_its_identity() {
    let mut cluster = RedisCluster::start(3);
    let scope = unique("cluster-orphaned");
    let main = runtime();
    let coordinator = main.block_on(common::cluster(cluster.seed_urls()));
    main.block_on(until_ok(|| coordinator.scoped(pair(&scope, None))));
    let brief = runtime();
    for node in cluster.nodes_mut() {
        node.pause();
    }
    let _task = brief.spawn({
        let (coordinator, scope) = (coordinator.clone(), scope.clone());
        async move { coordinator.scoped(pair(&scope, None)).await }
    });
    // Time for the acquire to reach a frozen node; were it not sent yet, this would test less,
    // not fail.
    std::thread::sleep(Duration::from_millis(100));
    drop(brief);
    for node in cluster.nodes_mut() {
        node.resume();
    }
    main.block_on(until_ok(|| coordinator.scoped(pair(&scope, None))));
}

/// On a cluster: a release in flight (every node frozen) when the runtime of the task that
/// dropped its guard is dropped. Its `ZREM` still runs once the nodes wake; its work used to be
/// lost (the client's timer, as above), and the identity's releases stayed counted in flight:
/// every later release waited for the next acquire, and the last call's lease stayed taken for
/// its whole 30 s.
#[test]
fn a_cluster_release_in_flight_when_its_runtime_dies_does_not_hold_up_later_ones() {
    let mut cluster = RedisCluster::start(3);
    let scope = unique("cluster-release-orphaned");
    let main = runtime();
    let coordinator = main.block_on(common::cluster(cluster.seed_urls()));
    main.block_on(until_ok(|| coordinator.scoped(hold(&scope, None))));
    let brief = runtime();
    let (entered, inside) = tokio::sync::oneshot::channel();
    let task = brief.spawn({
        let (coordinator, scope) = (coordinator.clone(), scope.clone());
        async move { coordinator.scoped(hold(&scope, Some(entered))).await }
    });
    brief.block_on(async { inside.await.expect("entered") });
    for node in cluster.nodes_mut() {
        node.pause();
    }
    task.abort();
    // Time for the `ZREM` to reach its frozen node, as above.
    std::thread::sleep(Duration::from_millis(100));
    drop(brief);
    for node in cluster.nodes_mut() {
        node.resume();
    }
    main.block_on(until_ok(|| coordinator.scoped(hold(&scope, None))));
    let mut leases = Leases::on_cluster(&cluster);
    main.block_on(common::eventually("the last call's release", || {
        leases.live() == 0
    }));
}

/// A coordinator whose only runtime is dropped while a call's acquire (`acquire`) or a
/// release (else) is in flight, then used from a new runtime, as a process-wide coordinator
/// is by one `#[tokio::test]` runtime after another. The work cannot finish anywhere, but the
/// identity's lane must not stay busy with it: the new runtime's calls went out behind nothing
/// and timed out, or (a release) every later release waited for the next acquire.
fn orphaned_with_no_runtime_left(acquire: bool) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let mut leases = Leases::on(&server);
    let scope = unique("orphaned-alone");
    let first = runtime();
    let coordinator = first.block_on(async {
        let coordinator = common::connect(&proxy.url(), Duration::from_secs(1)).await;
        assert_eq!(code(&coordinator.scoped(pair(&scope, None)).await), "ok");
        common::eventually("the first call's release", || leases.live() == 0).await;
        proxy.wait_idle(PATIENCE).await;
        coordinator
    });
    let (entered, inside) = tokio::sync::oneshot::channel();
    let task = first.spawn({
        let (coordinator, scope) = (coordinator.clone(), scope.clone());
        let entered = (!acquire).then_some(entered);
        async move { coordinator.scoped(pair(&scope, entered)).await }
    });
    if !acquire {
        first.block_on(async { inside.await.expect("entered") });
    }
    proxy.hold_replies();
    if !acquire {
        task.abort();
    }
    first.block_on(common::eventually("a reply held", || {
        proxy.held_replies() == 1
    }));
    drop(first);
    proxy.restore();
    let second = runtime();
    second.block_on(async {
        until_ok(|| coordinator.scoped(pair(&scope, None))).await;
        // The lease a lost acquire took is released too: its caller's guard queued the release
        // as it was dropped, and the next call sent it.
        common::eventually("every release", || leases.live() == 0).await;
    });
}

#[test]
fn an_acquire_in_flight_when_the_only_runtime_dies_does_not_wedge_the_next_runtimes_calls() {
    orphaned_with_no_runtime_left(true);
}

#[test]
fn a_release_in_flight_when_the_only_runtime_dies_does_not_hold_up_the_next_runtimes() {
    orphaned_with_no_runtime_left(false);
}

/// The only runtime dies with a `ZREM` in flight; its release is settled as of unknown
/// outcome, and the retry it schedules dies with the runtime too. That retry alone clears the
/// identity's "retry scheduled" mark: left set, no later release of the identity whose outcome
/// is unknown was retried after its pause (it waited for the next acquire, or its lease's 30 s).
#[test]
fn a_release_retry_lost_with_its_runtime_does_not_stop_later_retries() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let mut leases = Leases::on(&server);
    let scope = unique("retry-orphaned");
    let first = runtime();
    let coordinator = first.block_on(async {
        let coordinator = common::connect(&proxy.url(), Duration::from_secs(1)).await;
        assert_eq!(code(&coordinator.scoped(pair(&scope, None)).await), "ok");
        common::eventually("the first call's release", || leases.live() == 0).await;
        proxy.wait_idle(PATIENCE).await;
        coordinator
    });
    let (entered, inside) = tokio::sync::oneshot::channel();
    let task = first.spawn({
        let (coordinator, scope) = (coordinator.clone(), scope.clone());
        async move { coordinator.scoped(pair(&scope, Some(entered))).await }
    });
    first.block_on(async { inside.await.expect("entered") });
    proxy.hold_replies();
    task.abort();
    first.block_on(common::eventually("the ZREM's reply held", || {
        proxy.held_replies() == 1
    }));
    drop(first);
    proxy.restore();
    let second = runtime();
    second.block_on(async {
        until_ok(|| coordinator.scoped(pair(&scope, None))).await;
        common::eventually("every release", || leases.live() == 0).await;
        proxy.wait_idle(PATIENCE).await;
        // A release that fails on a cut connection is retried after its pause, with no
        // acquire of the identity to carry it.
        let (entered, inside) = tokio::sync::oneshot::channel();
        let task = tokio::spawn({
            let (coordinator, scope) = (coordinator.clone(), scope.clone());
            async move { coordinator.scoped(pair(&scope, Some(entered))).await }
        });
        inside.await.expect("entered");
        proxy.cut();
        task.abort();
        let _ = task.await;
        // Time for the `ZREM` to fail on the cut connection (its retry is what is tested).
        tokio::time::sleep(Duration::from_millis(300)).await;
        proxy.restore();
        common::eventually("the release sent again", || leases.live() == 0).await;
    });
}

#[bulkhead(name = "edges-two-runtimes", limit = 1000, scope = scope)]
async fn wide(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// The coordinator connected on one runtime, every call made on another, and the first dropped
/// mid-stream (connected in `main`'s runtime, serving from a second): its connections' driver
/// tasks died with it, and every call made until the connections were made again failed at once
/// (`coordinator_unavailable`, 261 in this run). Now only a call whose command was in flight on
/// a dead connection fails (its outcome is unknown, so it is not sent again): at most one per
/// caller; the others wait for the connection to be made again on their runtime.
#[test]
fn calls_on_one_runtime_survive_the_runtime_that_connected_going_away() {
    const CALLERS: u32 = 8;
    let server = RedisServer::start();
    let scope = unique("two-runtimes");
    let first = runtime();
    let coordinator: Coordinator = first.block_on(async {
        Coordinator::redis(server.url())
            .namespace(unique("two-runtimes"))
            .connect()
            .await
            .expect("connect")
    });
    let second = runtime();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (coordinator, scope, stop) = (coordinator.clone(), scope.clone(), stop.clone());
            second.spawn(async move {
                let mut codes = std::collections::BTreeMap::<String, u32>::new();
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let result = coordinator.scoped(wide(&scope)).await;
                    *codes.entry(code(&result).to_owned()).or_default() += 1;
                }
                codes
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    drop(first);
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut codes = std::collections::BTreeMap::<String, u32>::new();
    for caller in callers {
        for (code, n) in second.block_on(caller).expect("no panic") {
            *codes.entry(code).or_default() += n;
        }
    }
    let failed: u32 = codes
        .iter()
        .filter(|(code, _)| *code != "ok")
        .map(|(_, n)| n)
        .sum();
    assert!(
        failed <= CALLERS
            && codes
                .keys()
                .all(|code| code == "ok" || code == "coordinator_unavailable"),
        "{codes:?}"
    );
    assert!(codes.get("ok").is_some_and(|&ok| ok > CALLERS), "{codes:?}");
}
