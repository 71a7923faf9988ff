//! The circuit breaker across real OS processes: one window and one state for the fleet, a
//! fleet-wide probe bound witnessed from outside the processes, and how fast an open reaches
//! another process.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use caracal::circuit_breaker;
use caracal_tests::{RedisCluster, RedisServer, Witness};
use common::worker::Worker;
use common::{TestError, unique};

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

/// Process A's failures open the breaker; process B is rejected without running its body;
/// after `open`, probes close it; a failing probe re-opens it.
fn open_probe_close_reopen(fleet: &Fleet) {
    let failing = fleet.result("breaker-fail", &["calls=10"]);
    assert!(field(&failing, "ran") >= 5, "A's failures ran: {failing}");

    let blocked = fleet.result("breaker-once", &[]);
    assert_eq!(
        (field(&blocked, "rejected"), field(&blocked, "ran")),
        (1, 0),
        "B: {blocked}"
    );

    std::thread::sleep(OPEN + Duration::from_millis(100));
    // Three probe successes are needed; two tasks probing then calling on.
    let probing = fleet.result("breaker-probes", &["tasks=2", "millis=800"]);
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
    let failed_probe = fleet.result("breaker-once", &["fail=true"]);
    assert_eq!(
        field(&failed_probe, "ran"),
        1,
        "the probe ran and failed: {failed_probe}"
    );
    let reopened = fleet.result("breaker-once", &[]);
    assert_eq!(
        (field(&reopened, "rejected"), field(&reopened, "ran")),
        (1, 0),
        "re-opened: {reopened}"
    );
}

/// After `open`, 4 processes × 10 tasks call at once: never more than `half_open_probes` (2)
/// bodies at the same moment, witnessed on a separate server.
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
        "millis=1500",
        "limit=2",
        witness_url.as_str(),
        witness_key_arg.as_str(),
    ];
    let workers: Vec<_> = (0..4).map(|_| fleet.run("breaker-probes", &args)).collect();
    let mut ran = 0;
    for worker in &workers {
        let line = worker.expect_line("result", Duration::from_secs(60));
        assert_eq!(field(&line, "errors"), 0, "{line}");
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
const STALENESS_BOUND_MS: u64 = 250;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_sees_an_open_within_the_staleness_bound() {
    let server = RedisServer::start();
    let fleet = Fleet::new(server.url());
    let watcher = fleet.run("breaker-watch", &["millis=10000"]);
    watcher.expect_line("ready", Duration::from_secs(30));
    // Let the watcher call a while: its view of the breaker is fresh and closed.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let coordinator = caracal::Coordinator::redis(server.url())
        .namespace(fleet.namespace.clone())
        .connect()
        .await
        .expect("connect");
    for _ in 0..10 {
        let _ = coordinator.scoped(fail(&fleet.scope)).await;
    }
    coordinator.shutdown().await;

    let line = watcher.expect_line("result", Duration::from_secs(15));
    let rejected_at = field(&line, "rejected_at_ms");
    assert!(rejected_at > 0, "the watcher was never rejected: {line}");
    let mut conn = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("caracal:v1:*:brk:state")
        .query(&mut conn)
        .expect("KEYS");
    let opened_at: u64 = redis::cmd("HGET")
        .arg(&keys[0])
        .arg("opened_at")
        .query(&mut conn)
        .expect("opened_at");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    assert!(opened_at > 0 && opened_at <= now, "opened at {opened_at}");
    let lag = rejected_at.saturating_sub(opened_at);
    eprintln!("an open reached the other process {lag} ms after it happened");
    assert!(
        lag <= STALENESS_BOUND_MS,
        "the other process kept admitting for {lag} ms after the breaker opened"
    );
}
