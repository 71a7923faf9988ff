//! The bulkhead across real OS processes: a fleet of workers sharing one budget, witnessed
//! from outside the processes, and a holder killed with SIGKILL.

use std::time::Duration;

use caracal::bulkhead;
use caracal_tests::{RedisCluster, RedisServer, Witness};

use crate::common::worker::Worker;
use crate::common::{Leases, PATIENCE, TestError, code, server_time_ms, unique};

/// Admissions each worker of the fleet waits for before it stops.
const ADMISSIONS_PER_WORKER: u64 = 250;

/// 4 processes × `tasks` tasks on `limit = 3`, each process until its bodies have run
/// [`ADMISSIONS_PER_WORKER`] times: never more than 3 bodies at once, witnessed on a separate
/// server; no live lease left at the end. Returns how many calls the fleet made, admitted or
/// rejected.
pub(crate) fn fleet(redis_url: &str, mut leases: Leases, tasks: u64) -> u64 {
    let witness_server = RedisServer::start();
    let witness_key = unique("witness");
    let witness = Witness::new(&witness_server.url(), &witness_key, 3);
    let namespace = unique("fleet");
    let args = [
        format!("scope={}", unique("fleet")),
        format!("tasks={tasks}"),
        format!("admissions={ADMISSIONS_PER_WORKER}"),
        format!("witness={}", witness_server.url()),
        format!("witness_key={witness_key}"),
        "limit=3".to_owned(),
    ];
    // Each process's tasks retry a refused call at once: on a starved host (other builds
    // running) a command could wait past the default second for its answer, and the call
    // fail closed, correctly but beside what this checks.
    let env = [("CARACAL_COMMAND_TIMEOUT", "10s")];
    let workers: Vec<_> = (0..4)
        .map(|_| Worker::spawn_with_env(redis_url, &namespace, "bulkhead-load", &args, &env))
        .collect();
    let mut calls = 0;
    for worker in &workers {
        let line = worker.expect_line("result", Duration::from_secs(120));
        assert_eq!(Worker::field(&line, "errors"), 0, "{line}");
        let admitted = Worker::field(&line, "admitted");
        assert!(
            admitted >= ADMISSIONS_PER_WORKER,
            "a worker stopped short of its admissions: {line}"
        );
        calls += admitted + Worker::field(&line, "rejected");
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
    assert_eq!(leases.live(), 0, "live leases after every worker finished");
    calls
}

#[test]
fn a_fleet_of_processes_shares_one_budget() {
    let server = RedisServer::start();
    fleet(&server.url(), Leases::on(&server), 16);
}

#[test]
fn a_fleet_of_processes_shares_one_budget_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    fleet(
        &cluster.seed_urls().join(","),
        Leases::on_cluster(&cluster),
        16,
    );
}

/// The worker's `bulkhead-hold` lease.
const HOLD_LEASE_MS: u64 = 2000;

/// The same identity as the worker's `bulkhead-hold` (name, limit and lease).
#[bulkhead(name = "mp-hold", limit = 1, lease = "2s", scope = scope)]
async fn contend(scope: &str) -> Result<(), TestError> {
    Ok(())
}

/// Ordered by server time: the killed holder's lease ends no later than a lease after the kill,
/// no call is admitted before it ends, and the first call after it is.
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
    let killed = server_time_ms(&mut conn);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("caracal:v1:*:leases")
        .query(&mut conn)
        .expect("KEYS");
    let deadline = {
        let leases: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(&keys[0])
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(&mut conn)
            .expect("ZRANGE");
        assert_eq!(leases.len(), 1, "the killed holder's lease is still there");
        // Deadlines are whole milliseconds, exact in an f64 score.
        leases[0].1 as u64
    };
    assert!(
        deadline <= killed + HOLD_LEASE_MS,
        "the lease outlives its holder by {} ms, more than the lease",
        deadline - killed
    );
    let patience = killed + PATIENCE.as_millis() as u64;
    loop {
        let before = server_time_ms(&mut conn);
        let result = coordinator.scoped(contend(&scope)).await;
        let after = server_time_ms(&mut conn);
        match code(&result) {
            // The script prunes a lease once server time reaches its deadline.
            "bulkhead_full" => assert!(
                before < deadline,
                "still full {} ms after the deadline",
                before - deadline
            ),
            "ok" => {
                assert!(
                    after >= deadline,
                    "admitted {} ms before the dead lease expired",
                    deadline - after
                );
                break;
            }
            other => panic!("unexpected {other}"),
        }
        assert!(before < patience, "still full {PATIENCE:?} after the kill");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    coordinator.shutdown().await;
}

/// Calls the steady process makes on each identity: a call every ~12 ms, ~5 s in all.
const STEADY_CALLS: u64 = 400;

/// Fairness with kept leases: a process bursting 4 calls at once (2 ms bodies, bursts 4 ms
/// apart, so its kept leases would pass from burst to burst) under a limit of 8 of its own, so
/// it is never refused itself and only a message from the fleet makes it return its kept
/// leases, and a steady process (a 2 ms call every 10 ms) under the limit of 4, on a plain
/// identity and on one with `keep = "5ms"` at once (the worker's `bulkhead-fair`), so both
/// counts come from the same run under the same load. The steady process's refusals with kept
/// leases stay within 10 % of those without, plus a slack of 20 (about two standard deviations
/// of the difference of two such counts). Without the steady process's refusal message on the
/// feed, the burster's kept leases hold the 4 slots between its bursts and the steady process
/// is refused nearly every call.
#[test]
fn a_steady_process_is_refused_no_more_beside_a_burster_that_keeps_leases() {
    let server = RedisServer::start();
    let namespace = unique("fair");
    let scope = unique("fair");
    let spawn = |role: &str, tasks: u64, gap_ms: u64, limit: u64| {
        let args = [
            format!("limit={limit}"),
            format!("scope={scope}"),
            format!("role={role}"),
            format!("tasks={tasks}"),
            format!("calls={STEADY_CALLS}"),
            "hold_ms=2".to_owned(),
            format!("gap_ms={gap_ms}"),
            "start=on-go".to_owned(),
        ];
        let worker = Worker::spawn(&server.url(), &namespace, "bulkhead-fair", &args);
        worker.expect_line("ready", PATIENCE);
        worker
    };
    let mut burst = spawn("burst", 4, 4, 8);
    let mut steady = spawn("steady", 1, 10, 4);
    burst.go();
    steady.go();
    let line = steady.expect_line("result", Duration::from_secs(120));
    burst.send("stop");
    let bursts = burst.expect_line("result", Duration::from_secs(120));
    eprintln!("steady: {line}\nburst: {bursts}");
    for line in [&line, &bursts] {
        assert_eq!(Worker::field(line, "errors"), 0, "{line}");
    }
    for side in ["plain_rejected", "kept_rejected"] {
        assert_eq!(
            Worker::field(&bursts, side),
            0,
            "the burster was refused: {bursts}"
        );
    }
    let plain = Worker::field(&line, "plain_rejected");
    let kept = Worker::field(&line, "kept_rejected");
    assert!(plain > 0, "the burster never filled the bulkhead: {line}");
    assert!(
        kept * 10 <= plain * 11 + 200,
        "the steady process was refused {kept} times beside kept leases, {plain} without: \
         {line}"
    );
}
