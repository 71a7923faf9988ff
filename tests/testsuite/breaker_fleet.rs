//! The circuit breaker across real OS processes: one window and one state for the fleet, a
//! fleet-wide probe bound witnessed from outside the processes, and how soon an open stops
//! another process.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use caracal::circuit_breaker;
use caracal_tests::{RedisCluster, RedisServer, Witness};

use crate::common::worker::Worker;
use crate::common::{TestError, unique, until_code};

/// The workers' breakers open for this long.
const OPEN: Duration = Duration::from_secs(1);

/// One fleet: where it coordinates, its namespace and the scope its breakers use.
struct Fleet {
    url: String,
    namespace: String,
    scope: String,
}

impl Fleet {
    fn new(url: String) -> Self {
        Fleet {
            url,
            namespace: unique("breaker-fleet"),
            scope: unique("breaker-fleet"),
        }
    }

    fn run(&self, scenario: &str, args: &[&str]) -> Worker {
        let mut all = vec![format!("scope={}", self.scope)];
        all.extend(args.iter().map(|a| (*a).to_owned()));
        Worker::spawn(&self.url, &self.namespace, scenario, &all)
    }

    /// Runs a worker to completion and returns its result line.
    fn result(&self, scenario: &str, args: &[&str]) -> String {
        self.run(scenario, args)
            .expect_line("result", Duration::from_secs(60))
    }
}

fn field(line: &str, name: &str) -> u64 {
    Worker::field(line, name)
}

/// Starts a `breaker-once` worker that calls when told to ([`Worker::go`]): a process start can
/// take longer than the breaker stays open on a loaded machine, a line on stdin cannot.
fn ready_once(fleet: &Fleet) -> Worker {
    let worker = fleet.run("breaker-once", &["start=on-go"]);
    worker.expect_line("ready", Duration::from_secs(60));
    worker
}

/// Runs a worker from [`ready_once`] and returns its result line.
fn go(mut worker: Worker) -> String {
    worker.go();
    worker.expect_line("result", Duration::from_secs(60))
}

/// Process A's failures open the breaker; process B is rejected without running its body;
/// after `open`, probes close it; a failing probe re-opens it.
fn open_probe_close_reopen(fleet: &Fleet) {
    let b = ready_once(fleet);
    let failing = fleet.result("breaker-fail", &["calls=10"]);
    assert!(field(&failing, "ran") >= 5, "A's failures ran: {failing}");

    let blocked = go(b);
    assert_eq!(
        (field(&blocked, "rejected"), field(&blocked, "ran")),
        (1, 0),
        "B: {blocked}"
    );

    std::thread::sleep(OPEN + Duration::from_millis(100));
    // Three probe successes are needed; two tasks probing until three bodies ran.
    let probing = fleet.result("breaker-probes", &["tasks=2", "runs=3"]);
    assert!(field(&probing, "ran") >= 3, "probes ran: {probing}");
    let closed = fleet.result("breaker-once", &[]);
    assert_eq!(
        (field(&closed, "admitted"), field(&closed, "ran")),
        (1, 1),
        "closed again: {closed}"
    );

    // The probing worker left the window full of successes: outweigh them.
    fleet.result("breaker-fail", &["calls=150"]);
    std::thread::sleep(OPEN + Duration::from_millis(100));
    let next = ready_once(fleet);
    let failed_probe = fleet.result("breaker-once", &["fail=true"]);
    assert_eq!(
        field(&failed_probe, "ran"),
        1,
        "the probe ran and failed: {failed_probe}"
    );
    let reopened = go(next);
    assert_eq!(
        (field(&reopened, "rejected"), field(&reopened, "ran")),
        (1, 0),
        "re-opened: {reopened}"
    );
}

/// After `open`, 4 processes × 10 tasks call at once, each process until 3 of its probes ran:
/// never more than `half_open_probes` (2) bodies at the same moment, witnessed on a separate
/// server.
fn probes_are_bounded_fleet_wide(fleet: &Fleet) {
    fleet.result("breaker-fail", &["breaker=probes", "calls=10"]);
    std::thread::sleep(OPEN + Duration::from_millis(100));
    let witness_server = RedisServer::start();
    let witness_key = unique("probes");
    let witness = Witness::new(&witness_server.url(), &witness_key, 2);
    let witness_url = format!("witness={}", witness_server.url());
    let witness_key_arg = format!("witness_key={witness_key}");
    let args = [
        "breaker=probes",
        "tasks=10",
        "runs=3",
        "limit=2",
        witness_url.as_str(),
        witness_key_arg.as_str(),
    ];
    let workers: Vec<_> = (0..4).map(|_| fleet.run("breaker-probes", &args)).collect();
    let mut ran = 0;
    for worker in &workers {
        let line = worker.expect_line("result", Duration::from_secs(120));
        assert_eq!(field(&line, "errors"), 0, "{line}");
        assert!(field(&line, "ran") >= 3, "a worker stopped short: {line}");
        ran += field(&line, "ran");
    }
    let report = witness.report();
    assert_eq!(
        report.violations, 0,
        "more than 2 probes at once: {report:?}"
    );
    assert_eq!(report.max_seen, 2, "both probe slots were used: {report:?}");
    assert!(ran >= 10, "probes kept running one after another: {ran}");
}

#[test]
fn one_breaker_for_the_fleet() {
    let server = RedisServer::start();
    open_probe_close_reopen(&Fleet::new(server.url()));
    probes_are_bounded_fleet_wide(&Fleet::new(server.url()));
}

#[test]
fn one_breaker_for_the_fleet_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    let url = cluster.seed_urls().join(",");
    open_probe_close_reopen(&Fleet::new(url.clone()));
    probes_are_bounded_fleet_wide(&Fleet::new(url));
}

/// The worker's `breaker_call` identity and settings, so this process shares its breaker.
#[circuit_breaker(name = "mp-breaker", scope = scope, minimum_throughput = 5, failure_threshold = 0.5,
                  open = "1s", half_open_probes = 2, half_open_successes = 3)]
async fn fail(scope: &str) -> Result<(), TestError> {
    Err(TestError::Body("downstream failed"))
}

/// The documented staleness bound: a closed view is trusted for at most 250 ms.
const STALENESS_BOUND_MS: u128 = 250;

fn wall_clock_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis()
}

/// Ordered by the clock this machine's processes and its Redis share: no call another process
/// started more than the staleness bound after the breaker opened was admitted. However slow
/// the machine, a call that starts that late finds its view expired and asks the coordinator,
/// which says open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_stops_admitting_within_the_staleness_bound() {
    let server = RedisServer::start();
    let fleet = Fleet::new(server.url());
    let watcher = fleet.run("breaker-watch", &[]);
    watcher.expect_line("watching", Duration::from_secs(30));

    let coordinator = caracal::Coordinator::redis(server.url())
        .namespace(fleet.namespace.clone())
        .connect()
        .await
        .expect("connect");
    for _ in 0..10 {
        let _ = coordinator.scoped(fail(&fleet.scope)).await;
    }
    // Once this process is rejected, the breaker is open at the server: it opened no later.
    until_code("circuit_open", || coordinator.scoped(fail(&fleet.scope))).await;
    let opened_by = wall_clock_ms();
    coordinator.shutdown().await;

    let line = watcher.expect_line("result", Duration::from_secs(120));
    assert_eq!(
        field(&line, "rejected"),
        1,
        "the watcher was never rejected: {line}"
    );
    let last_admitted = u128::from(field(&line, "last_admitted_start_ms"));
    // Both clocks are read in whole milliseconds, rounded down.
    assert!(
        last_admitted <= opened_by + STALENESS_BOUND_MS + 1,
        "the other process admitted a call it started {} ms after the breaker opened",
        last_admitted - opened_by
    );
}
