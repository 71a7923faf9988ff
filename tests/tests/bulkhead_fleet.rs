//! The bulkhead across real OS processes: a fleet of workers sharing one budget, witnessed
//! from outside the processes, and a holder killed with SIGKILL.

mod common;

use std::time::Duration;

use caracal::bulkhead;
use caracal_tests::{RedisCluster, RedisServer, Witness};
use common::worker::Worker;
use common::{TestError, code, unique};

/// Live leases in every lease set of the server (`caracal:v1:*:leases`).
fn live_leases(conn: &mut redis::Connection) -> u64 {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("caracal:v1:*:leases")
        .query(conn)
        .expect("KEYS");
    let (now, _): (u64, u64) = redis::cmd("TIME").query(conn).expect("TIME");
    keys.iter()
        .map(|key| {
            redis::cmd("ZCOUNT")
                .arg(key)
                .arg(format!("({}", now * 1000))
                .arg("+inf")
                .query::<u64>(conn)
                .expect("ZCOUNT")
        })
        .sum()
}

/// 4 processes × 16 tasks on `limit = 3` for 5 s: never more than 3 bodies at once, witnessed
/// on a separate server; no live lease left at the end.
fn fleet(redis_url: &str, mut lease_connections: Vec<redis::Connection>) {
    let witness_server = RedisServer::start();
    let witness_key = unique("witness");
    let witness = Witness::new(&witness_server.url(), &witness_key, 3);
    let namespace = unique("fleet");
    let args = [
        format!("scope={}", unique("fleet")),
        "tasks=16".to_owned(),
        "millis=5000".to_owned(),
        format!("witness={}", witness_server.url()),
        format!("witness_key={witness_key}"),
        "limit=3".to_owned(),
    ];
    let workers: Vec<_> = (0..4)
        .map(|_| Worker::spawn(redis_url, &namespace, "bulkhead-load", &args))
        .collect();
    let mut admitted = 0;
    for worker in &workers {
        let line = worker.expect_line("result", Duration::from_secs(60));
        assert_eq!(Worker::field(&line, "errors"), 0, "{line}");
        admitted += Worker::field(&line, "admitted");
    }
    let report = witness.report();
    assert_eq!(
        report.violations, 0,
        "more than 3 bodies at once: {report:?}"
    );
    assert_eq!(
        report.max_seen, 3,
        "the budget was contended and fully used: {report:?}"
    );
    assert!(
        admitted > 100,
        "the fleet made progress: {admitted} admitted"
    );
    let live: u64 = lease_connections.iter_mut().map(live_leases).sum();
    assert_eq!(live, 0, "live leases after every worker finished");
}

#[test]
fn a_fleet_of_processes_shares_one_budget() {
    let server = RedisServer::start();
    fleet(&server.url(), vec![server.connection()]);
}

#[test]
fn a_fleet_of_processes_shares_one_budget_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    let connections = cluster
        .nodes()
        .iter()
        .map(RedisServer::connection)
        .collect();
    fleet(&cluster.seed_urls().join(","), connections);
}

/// The same identity as the worker's `bulkhead-hold` (name, limit and lease).
#[bulkhead(name = "mp-hold", limit = 1, lease = "1s", scope = scope)]
async fn contend(scope: &str) -> Result<(), TestError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_frees_its_slot_when_its_lease_expires_and_not_before() {
    let server = RedisServer::start();
    let namespace = unique("killed");
    let scope = unique("killed");
    let mut holder = Worker::spawn(
        &server.url(),
        &namespace,
        "bulkhead-hold",
        &[format!("scope={scope}")],
    );
    holder.expect_line("admitted", Duration::from_secs(30));
    let coordinator = caracal::Coordinator::redis(server.url())
        .namespace(namespace)
        .connect()
        .await
        .expect("connect");
    assert_eq!(
        code(&coordinator.scoped(contend(&scope)).await),
        "bulkhead_full"
    );

    holder.child.kill().expect("SIGKILL the holder");
    holder.child.wait().expect("reap the holder");
    let mut conn = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("caracal:v1:*:leases")
        .query(&mut conn)
        .expect("KEYS");
    let deadline: f64 = {
        let leases: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(&keys[0])
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(&mut conn)
            .expect("ZRANGE");
        assert_eq!(leases.len(), 1, "the killed holder's lease is still there");
        leases[0].1
    };
    let server_now = |conn: &mut redis::Connection| {
        let (s, us): (u64, u64) = redis::cmd("TIME").query(conn).expect("TIME");
        (s * 1000 + us / 1000) as f64
    };
    loop {
        let before = server_now(&mut conn);
        let result = coordinator.scoped(contend(&scope)).await;
        let after = server_now(&mut conn);
        match code(&result) {
            "bulkhead_full" => assert!(
                before <= deadline,
                "still full {} ms after the deadline",
                before - deadline
            ),
            "ok" => {
                assert!(
                    after > deadline,
                    "admitted {} ms before the dead lease expired",
                    deadline - after
                );
                assert!(
                    after - deadline < 300.0,
                    "freed {} ms after the deadline",
                    after - deadline
                );
                break;
            }
            other => panic!("unexpected {other}"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    coordinator.shutdown().await;
}
