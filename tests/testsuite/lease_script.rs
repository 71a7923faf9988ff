//! The lease script (`caracal/src/policy/bulkhead/kernel/lease.lua`) on its own, against a real standalone server and a real
//! three-master cluster: the lease-set semantics @gkoos/caracal replicas rely on.

use std::thread::sleep;
use std::time::{Duration, Instant};

use caracal_tests::{RedisCluster, RedisServer};
use redis::ConnectionLike;

use crate::common::PATIENCE;

const SCRIPT: &str = include_str!("../../caracal/src/policy/bulkhead/kernel/lease.lua");

struct Lease<'a, C> {
    conn: &'a mut C,
    key: String,
}

impl<C: ConnectionLike> Lease<'_, C> {
    /// Runs the script for one token: `(allowed, occupancy)`. An acquire that leaves the token
    /// holding a lease also carries a fencing token; nothing else does.
    fn call(&mut self, action: &str, token: &str, ttl_ms: u64, limit: u32) -> (i64, i64) {
        let (allowed, occupancy, fence): (i64, i64, i64) = redis::Script::new(SCRIPT)
            .key(&self.key)
            .key(format!("{}:fence", self.key))
            .arg(action)
            .arg(ttl_ms)
            .arg(limit)
            // No live fencing token known: the lease set's own semantics, as upstream's.
            .arg(0)
            .arg(token)
            // Its share of the limit: the whole of it, as without thresholds.
            .arg(1000)
            .invoke(self.conn)
            .expect("lease script");
        assert_eq!(
            fence > 0,
            action == "acquire" && allowed == 1,
            "fence {fence} for {action} of {token}"
        );
        (allowed, occupancy)
    }

    fn acquire(&mut self, token: &str, ttl_ms: u64, limit: u32) -> (i64, i64) {
        self.call("acquire", token, ttl_ms, limit)
    }

    fn deadline(&mut self, token: &str) -> Option<f64> {
        redis::cmd("ZSCORE")
            .arg(&self.key)
            .arg(token)
            .query(self.conn)
            .expect("ZSCORE")
    }

    fn release(&mut self, token: &str) -> i64 {
        redis::cmd("ZREM")
            .arg(&self.key)
            .arg(token)
            .query(self.conn)
            .expect("ZREM")
    }

    fn expire_time(&mut self) -> i64 {
        redis::cmd("PEXPIRETIME")
            .arg(&self.key)
            .query(self.conn)
            .expect("PEXPIRETIME")
    }

    /// The server's clock in whole milliseconds, the unit of deadlines.
    fn now(&mut self) -> u64 {
        let (seconds, micros): (u64, u64) = redis::cmd("TIME").query(self.conn).expect("TIME");
        seconds * 1000 + micros / 1000
    }

    fn latest_deadline(&mut self) -> i64 {
        let latest: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(&self.key)
            .arg(0)
            .arg(0)
            .arg("REV")
            .arg("WITHSCORES")
            .query(self.conn)
            .expect("ZRANGE");
        latest[0].1 as i64
    }
}

fn semantics<C: ConnectionLike>(conn: &mut C, tag: &str) {
    let mut lease = Lease {
        conn,
        key: format!("caracal:v1:{{{tag}}}:leases"),
    };

    // Admits up to the limit, then rejects, reporting the occupancy either way.
    assert_eq!(lease.acquire("a", 10_000, 2), (1, 1));
    assert_eq!(lease.acquire("b", 20_000, 2), (1, 2));
    assert_eq!(lease.acquire("c", 10_000, 2), (0, 2));
    // An acquisition already held is admitted again without moving its deadline.
    let before = lease.deadline("a");
    assert_eq!(lease.acquire("a", 60_000, 2), (1, 2));
    assert_eq!(lease.deadline("a"), before);

    // The key expires exactly at its latest deadline, and a release never shortens it.
    assert_eq!(lease.expire_time(), lease.latest_deadline());
    assert_eq!(
        lease.deadline("b").map(|d| d as i64),
        Some(lease.expire_time())
    );

    // Renewal pushes the deadline to now + ttl (and the key's expiry with it).
    assert_eq!(lease.call("renew", "a", 30_000, 2), (1, 2));
    let renewed = lease.deadline("a").expect("renewed lease");
    assert!(
        renewed > before.expect("lease a"),
        "renewal moved the deadline"
    );
    assert_eq!(lease.expire_time(), renewed as i64);
    // Renewing a lease that does not exist fails and takes nothing.
    assert_eq!(lease.call("renew", "ghost", 30_000, 2), (0, 2));

    // Release is by token: another token frees nothing; the holder's own frees its slot.
    assert_eq!(lease.release("c"), 0);
    assert_eq!(lease.release("b"), 1);
    assert_eq!(lease.release("b"), 0);
    assert_eq!(lease.acquire("c", 10_000, 2), (1, 2));

    // An expired lease is pruned by the next command and its slot reused. Ordered by server
    // time: while "short" is live, "d" is refused; from its deadline on, "d" is admitted.
    assert_eq!(lease.release("a"), 1);
    let asked = lease.now();
    assert_eq!(lease.acquire("short", 300, 2), (1, 2));
    let answered = lease.now();
    let short = lease.deadline("short").expect("short lease") as u64;
    assert!(
        (asked + 300..=answered + 300).contains(&short),
        "deadline {short} is not the script's now + 300 ms (asked at {asked}, answered at {answered})"
    );
    let asked = lease.now();
    let refused = lease.acquire("d", 10_000, 2);
    let answered = lease.now();
    if answered < short {
        assert_eq!(refused, (0, 2), "admitted while the short lease was live");
    } else if asked >= short {
        assert_eq!(refused, (1, 2), "refused after the short lease's deadline");
    }
    let patience = Instant::now() + PATIENCE;
    while lease.now() < short {
        assert!(Instant::now() < patience, "the server clock stands still");
        sleep(Duration::from_millis(20));
    }
    assert_eq!(lease.acquire("d", 10_000, 2), (1, 2));
    assert_eq!(lease.deadline("short"), None);
    assert_eq!(lease.call("renew", "short", 10_000, 2), (0, 2));
}

#[test]
fn the_lease_script_on_a_standalone_server() {
    let server = RedisServer::start();
    semantics(&mut server.connection(), "standalone");
}

#[test]
fn the_lease_script_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    let mut conn = cluster
        .client()
        .get_connection()
        .expect("cluster connection");
    // Tags landing on different masters: the script works wherever its key lives.
    for tag in ["alpha", "beta", "gamma", "delta"] {
        semantics(&mut conn, tag);
    }
}
