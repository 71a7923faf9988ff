//! `lua/bulkhead_lease.lua` on its own, against a real standalone server and a real
//! three-master cluster: the lease-set semantics @gkoos/caracal replicas rely on.

use std::thread::sleep;
use std::time::Duration;

use caracal_tests::{RedisCluster, RedisServer};
use redis::ConnectionLike;

const SCRIPT: &str = include_str!("../../lua/bulkhead_lease.lua");

struct Lease<'a, C> {
    conn: &'a mut C,
    key: String,
}

impl<C: ConnectionLike> Lease<'_, C> {
    fn call(&mut self, action: &str, token: &str, ttl_ms: u64, limit: u32) -> (i64, i64) {
        redis::Script::new(SCRIPT)
            .key(&self.key)
            .arg(action)
            .arg(token)
            .arg(ttl_ms)
            .arg(limit)
            .invoke(self.conn)
            .expect("lease script")
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

    // An expired lease is pruned by the next command and its slot reused.
    assert_eq!(lease.release("a"), 1);
    assert_eq!(lease.acquire("short", 150, 2), (1, 2));
    assert_eq!(lease.acquire("d", 10_000, 2), (0, 2));
    sleep(Duration::from_millis(250));
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
