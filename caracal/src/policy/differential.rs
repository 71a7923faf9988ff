//! Every kind's differential test on one cluster (it is the slowest thing to start); each kind
//! also runs its own on a standalone server, in its folder.

use super::{breaker, bulkhead, hedge, rate_limit, retry_budget};

#[test]
fn every_script_agrees_with_its_kernel_on_a_cluster() {
    let cluster = caracal_tests::RedisCluster::start(3);
    let connection = || {
        Box::new(
            cluster
                .client()
                .get_connection()
                .expect("cluster connection"),
        )
    };
    bulkhead::differential::lease::run(connection(), 100);
    rate_limit::differential::run(connection(), 100);
    breaker::differential::run(connection(), 150);
    retry_budget::differential::run(connection(), 100);
    bulkhead::differential::adaptive::run(connection(), 300);
    hedge::latency::differential::run(connection(), 100);
}
