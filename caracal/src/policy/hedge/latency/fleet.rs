//! Two processes (coordinators) on one harness `redis-server`, on real time: each observes
//! its own distribution, and both converge on the quantiles of the merged one.

use std::time::Duration;

use tokio::time::Instant;

use super::fleet_latency;
use super::kernel::buckets;
use crate::coordinator::Coordinator;
use crate::identity::{PolicyKind, Scope};

/// What a quantile reads for latencies of `ms`: the upper bound of their bucket.
fn read_as(ms: u64) -> Option<Duration> {
    let bucket = buckets::bucket(ms * 1000);
    Some(Duration::from_micros(buckets::bounds(bucket).1))
}

#[tokio::test]
async fn two_processes_converge_on_the_fleets_quantiles() {
    let server = caracal_tests::RedisServer::start();
    let connect = || async {
        Coordinator::redis(server.url())
            .namespace("latency-fleet")
            .connect()
            .await
            .expect("connected")
    };
    let (a, b) = (connect().await, connect().await);
    let identity =
        |c: &Coordinator| c.identity(PolicyKind::Bulkhead, "partner", "get", &Scope::GLOBAL);
    let fast = fleet_latency(&a, &identity(&a));
    let slow = fleet_latency(&b, &identity(&b));
    // Alone, the slow process reads 500 ms at p85 and the fast one 5 ms at p95: converging
    // means each heard the other. Generous: the machine is loaded; convergence takes a batch period or two.
    let deadline = Instant::now() + Duration::from_secs(60);
    let converged = || {
        [&fast, &slow]
            .iter()
            .all(|view| view.quantile(950) == read_as(500) && view.quantile(850) == read_as(5))
    };
    while !converged() {
        assert!(
            Instant::now() < deadline,
            "not converged: fast {:?}/{:?}, slow {:?}/{:?}",
            fast.quantile(950),
            fast.quantile(850),
            slow.quantile(950),
            slow.quantile(850)
        );
        // Nine fast samples for one slow: the slow tenth is the fleet's p95, not its p85.
        for _ in 0..9 {
            fast.observe(Duration::from_millis(5));
        }
        slow.observe(Duration::from_millis(500));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.shutdown().await;
    b.shutdown().await;
}
