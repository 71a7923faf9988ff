//! The rate limit across real OS processes: the fleet together is held to the rate and burst,
//! and gets nearly all of it.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use caracal_tests::{RedisCluster, RedisServer};
use common::unique;
use common::worker::Worker;

/// 3 processes call for 2 s at `rate` (burst `burst`): admitted ≤ burst + rate × elapsed + 1,
/// and ≥ 90 % of that.
fn fleet(url: &str, rate: u64, burst: u64) {
    let namespace = unique("rate-fleet");
    let start_at =
        SystemTime::now().duration_since(UNIX_EPOCH).expect("clock") + Duration::from_millis(1500);
    let args = [
        format!("scope={}", unique("rate")),
        format!("rate={rate}"),
        "tasks=4".to_owned(),
        "millis=2000".to_owned(),
        format!("start_at_ms={}", start_at.as_millis()),
    ];
    let workers: Vec<_> = (0..3)
        .map(|_| Worker::spawn(url, &namespace, "rate-load", &args))
        .collect();
    let (mut admitted, mut first, mut last) = (0, u64::MAX, 0);
    for worker in &workers {
        let line = worker.expect_line("result", Duration::from_secs(60));
        assert_eq!(Worker::field(&line, "errors"), 0, "{line}");
        admitted += Worker::field(&line, "admitted");
        first = first.min(Worker::field(&line, "first_ms"));
        last = last.max(Worker::field(&line, "last_ms"));
    }
    let elapsed = (last - first) as f64 / 1000.0;
    let ceiling = burst as f64 + rate as f64 * elapsed + 1.0;
    eprintln!(
        "{rate}/s, burst {burst}: {admitted} admitted in {elapsed:.3} s, {:.1} % of {ceiling:.1}",
        100.0 * admitted as f64 / ceiling
    );
    assert!(
        admitted as f64 <= ceiling,
        "{admitted} admitted in {elapsed:.3} s at {rate}/s, burst {burst}: more than {ceiling:.1}"
    );
    assert!(
        admitted as f64 >= 0.9 * ceiling,
        "{admitted} admitted in {elapsed:.3} s at {rate}/s, burst {burst}: under 90 % of {ceiling:.1}"
    );
}

#[test]
fn a_fleet_is_held_to_50_per_second_with_a_burst_of_5() {
    let server = RedisServer::start();
    fleet(&server.url(), 50, 5);
}

#[test]
fn a_fleet_is_held_to_700_per_second_with_a_burst_of_5() {
    let server = RedisServer::start();
    fleet(&server.url(), 700, 5);
}

#[test]
fn a_fleet_is_held_to_its_rate_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    fleet(&cluster.seed_urls().join(","), 50, 5);
}
