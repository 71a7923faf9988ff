//! Redis Sentinel: connecting through the sentinels, following a failover under load, and
//! what a master demoted to a replica costs (connections counted at the server).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use caracal::{Coordinator, bulkhead};
use caracal_tests::ledger::{AsyncLedger, Ledger};
use caracal_tests::sentinel::connections_received;
use caracal_tests::{RedisSentinel, RedisServer};

use crate::common::{TestError, code, failure_kind, unique};

const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);
/// Longer than any call may take (the command timeout, twice, and a margin for a loaded
/// machine): a call still running then hangs.
const HUNG: Duration = Duration::from_secs(5);
/// How long the sentinels and the process get to serve again after a failover.
const RECOVERY: Duration = Duration::from_secs(30);

/// A short lease: after the failover (a data loss), admissions pause for one lease.
#[bulkhead(name = "sentinel-load", limit = 50, lease = "1s", scope = scope)]
async fn call(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// The load's bulkhead: fewer slots than load tasks, so that callers admitted over holders
/// the switch did not end would show in the ledger; the default 30 s lease, which outlives the
/// switch (a holder's trust does not end before the process notices the new master).
#[bulkhead(name = "sentinel-ledgered", limit = 2, scope = scope)]
async fn ledgered(scope: &str, ledger: &AsyncLedger, id: &str) -> Result<(), TestError> {
    let entered = ledger.enter(id);
    tokio::time::sleep(Duration::from_millis(20)).await;
    entered.leave();
    Ok(())
}

async fn connect(url: &str) -> Coordinator {
    Coordinator::redis(url)
        .namespace(unique("sentinel"))
        .command_timeout(COMMAND_TIMEOUT)
        .pool_size(2)
        .connect()
        .await
        .expect("connect")
}

/// Whether `server` holds a subscription to a namespace's breaker-transition channel.
fn subscribed(server: &RedisServer) -> bool {
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("caracal:v1:breaker-transitions:*")
        .query(&mut server.connection())
        .expect("PUBSUB CHANNELS");
    !channels.is_empty()
}

/// How many scripts clients ran on `server` (a replica runs none: it applies their effects).
fn scripts_run(server: &RedisServer) -> u64 {
    caracal_tests::CommandStats::read(&mut server.connection()).calls("evalsha")
}

/// Whether `server` holds any of caracal's keys.
fn has_keys(server: &RedisServer) -> bool {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("caracal:v1:*")
        .query(&mut server.connection())
        .expect("KEYS");
    !keys.is_empty()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_through_the_sentinels_and_serves_the_master() {
    let deployment = RedisSentinel::start(1);
    let coordinator = connect(&deployment.url()).await;
    let scope = unique("through");
    assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");
    let master = deployment.master();
    assert!(has_keys(master), "the call's keys are on the master");
    crate::common::eventually("the pub/sub connection on the master", || {
        subscribed(master)
    })
    .await;
    coordinator.shutdown().await;
}

/// The URL's credentials are the master's, and the sentinels are offered them too: a sentinel
/// without a password takes any for its `default` user, and one that refuses a user name it
/// does not have is asked again without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_urls_credentials_reach_the_master_through_sentinels_without_any() {
    let deployment = RedisSentinel::start(0);
    let master = deployment.master();
    crate::connect::acl_user(master, "app", caracal::REDIS_ACL_RULES);
    let hosts = deployment.url().replace("redis-sentinel://", "");
    for (credentials, user) in [("app:pw", "app"), (":any-password", "default")] {
        let url = format!("redis-sentinel://{credentials}@{hosts}");
        let coordinator = connect(&url).await;
        let scope = unique("credentials");
        assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query(&mut master.connection())
            .expect("CLIENT LIST");
        assert!(clients.contains(&format!(" user={user} ")), "{clients}");
        coordinator.shutdown().await;
    }
}

/// What the load tasks saw.
#[derive(Default)]
struct Seen {
    codes: Mutex<Vec<&'static str>>,
    kinds: Mutex<Vec<Option<caracal::FailureKind>>>,
    hung: AtomicU64,
}

/// How the master goes in [`a_switch_under_load_is_followed`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Switch {
    /// `SENTINEL FAILOVER`: the old master stays up, demoted.
    Graceful,
    /// SIGKILL: the sentinels find it down and fail it over.
    Killed,
}

/// The most the process may take to serve again on the new master once the sentinels agree
/// on it: its check notices the new master's lost state (1 s), the grace (a lease, 1 s), and
/// 3 s for a loaded machine. Measured here: 1.5–2.5 s.
const SERVING_AGAIN: Duration = Duration::from_secs(1 + 1 + 3);

/// A Sentinel switch under load: calls during the switch fail fast with
/// `CoordinatorUnavailable`, none hangs, calls succeed again on the new master within
/// [`SERVING_AGAIN`] of the sentinels agreeing on it (on this process's clock: it is the
/// worker), no more bodies than the limit ran at once (in a ledger on a server of its own), and
/// a demoted master is not hammered with reconnections (counted at it). Before,
/// a process pointed at the master never followed it: `READONLY` to the end of the run, and
/// thousands of connections to the demoted master.
async fn a_switch_under_load_is_followed(how: Switch) {
    let mut deployment = RedisSentinel::start(1);
    let old = deployment.master().port();
    let coordinator = connect(&deployment.url()).await;
    let scope = unique("failover");
    assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");

    let ledger_server = RedisServer::start();
    let name = unique("sentinel-ledger");
    let ledger = AsyncLedger::connect(&ledger_server.url(), &name, 2);
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Seen::default());
    let tasks: Vec<_> = (0..4)
        .map(|task| {
            let (coordinator, scope, ledger) = (coordinator.clone(), scope.clone(), ledger.clone());
            let (stop, seen) = (Arc::clone(&stop), Arc::clone(&seen));
            tokio::spawn(async move {
                for n in 0.. {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    // Ids are `<pid>-…` in a ledger: one process here, its tasks apart.
                    let id = format!("{}-{task}-{n}", std::process::id());
                    let body = coordinator.scoped(ledgered(&scope, &ledger, &id));
                    match tokio::time::timeout(HUNG, body).await {
                        Ok(result) => {
                            seen.codes.lock().expect("codes").push(code(&result));
                            seen.kinds
                                .lock()
                                .expect("kinds")
                                .push(failure_kind(&result));
                        }
                        Err(_) => {
                            seen.hung.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let switch = Instant::now();
    let new = tokio::task::block_in_place(|| match how {
        Switch::Graceful => deployment.failover().port(),
        Switch::Killed => deployment.kill_master().port(),
    });
    let switched = switch.elapsed();
    let server = |port: u16| {
        deployment
            .servers()
            .iter()
            .find(|s| s.port() == port)
            .expect("a server of the deployment")
    };
    // From here on, only this process and the sentinels connect to a demoted master (the
    // harness polled it with fresh connections while it waited); a killed one takes none.
    let before = (how == Switch::Graceful).then(|| connections_received(server(old)));
    let started = Instant::now();
    // The old master answers as one for seconds more: serving again means serving on the
    // new one, which ran no script while it was a replica.
    let deadline = tokio::time::Instant::now() + RECOVERY;
    while scripts_run(server(new)) == 0 || code(&coordinator.scoped(call(&scope)).await) != "ok" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no call succeeded on the new master within {RECOVERY:?} of the failover"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recovered = started.elapsed();
    // Serving again, and on the new master; the load goes on a while, to see that nothing
    // keeps reconnecting to the demoted one.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let received = before.map_or(0, |before| connections_received(server(old)) - before);
    let seconds = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Release);
    for task in tasks {
        task.await.expect("a load task");
    }

    crate::common::eventually("the pub/sub connection to follow the master", || {
        subscribed(server(new))
    })
    .await;
    assert_eq!(seen.hung.load(Ordering::Relaxed), 0, "calls that hung");
    let codes = seen.codes.lock().expect("codes").clone();
    let kinds = seen.kinds.lock().expect("kinds").clone();
    let failed = codes
        .iter()
        .filter(|&&code| code != "ok" && code != "bulkhead_full")
        .count();
    // A call admitted before the switch and still running when its process notices the new
    // master's lost state is cancelled (`lease_lost`), as after any data loss; the others end
    // fast with `coordinator_unavailable`, or find the bulkhead full as at any time.
    let expected = [
        "ok",
        "coordinator_unavailable",
        "lease_lost",
        "bulkhead_full",
    ];
    assert!(
        codes.iter().all(|code| expected.contains(code)),
        "codes during the failover: {codes:?}"
    );
    assert!(failed > 0, "the switch cost no call: {codes:?}");
    let mut ledger = Ledger::new(&ledger_server.url(), &name);
    assert!(ledger.max_open() == 2, "the load never filled the bulkhead");
    assert_eq!(
        ledger.violations(),
        [],
        "more bodies at once than the limit of 2 through the switch"
    );
    let per_second = received as f64 / seconds;
    eprintln!(
        "failover ({}): {switched:?} for the sentinels to switch, serving again {recovered:?} \
         after; {} calls, {failed} failed ({:?}), {received} connections to the demoted \
         master in {seconds:.1} s ({per_second:.1}/s)",
        if how == Switch::Killed {
            "killed"
        } else {
            "graceful"
        },
        codes.len(),
        kinds
            .iter()
            .flatten()
            .map(|kind| kind.as_str())
            .collect::<std::collections::BTreeSet<_>>()
    );
    assert!(
        recovered <= SERVING_AGAIN,
        "serving again {recovered:?} after the sentinels agreed, past {SERVING_AGAIN:?}"
    );
    // The sentinels and this test connect to it too: a handful a second between them.
    assert!(
        per_second <= 10.0,
        "{received} connections to the demoted master in {seconds:.1} s"
    );
    coordinator.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_load_is_followed() {
    a_switch_under_load_is_followed(Switch::Graceful).await;
}

/// The master SIGKILLed under load (`down-after-milliseconds` 1000): the sentinels' own
/// failover is followed as a requested one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sentinel_master_is_followed() {
    a_switch_under_load_is_followed(Switch::Killed).await;
}

/// A master turned into a replica under a connected coordinator (`REPLICAOF`, connections left
/// open): every write answers `READONLY`. Each pooled connection reconnects, finds the same
/// replica, and backs off: a few connections a second per pooled connection, where the pool
/// used to reconnect hundreds of times a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_master_costs_a_bounded_number_of_connections() {
    let server = RedisServer::start();
    let other = RedisServer::start();
    let coordinator = connect(&server.url()).await;
    let scope = unique("readonly");
    assert_eq!(code(&coordinator.scoped(call(&scope)).await), "ok");
    redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(other.port())
        .exec(&mut server.connection())
        .expect("REPLICAOF");

    let before = connections_received(&server);
    let started = Instant::now();
    let mut results = Vec::new();
    while started.elapsed() < Duration::from_secs(3) {
        let result = tokio::time::timeout(HUNG, coordinator.scoped(call(&scope)))
            .await
            .expect("a call hung");
        results.push(failure_kind(&result));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let received = connections_received(&server) - before;
    let per_second = received as f64 / started.elapsed().as_secs_f64();
    eprintln!(
        "READONLY storm: {} calls, {received} connections in {:.1} s ({per_second:.1}/s)",
        results.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        results
            .iter()
            .all(|kind| matches!(kind, Some(caracal::FailureKind::Server))),
        "calls are refused as the server's: {results:?}"
    );
    // Two pooled connections (and the test's reads).
    assert!(
        per_second <= 2.0 * 6.0,
        "{received} connections to the replica in {:?}",
        started.elapsed()
    );
    coordinator.shutdown().await;
}
