//! An out-of-process concurrency witness: counts how many holders are inside a section at
//! once, in Redis, so worker processes and the test see the same numbers.
//!
//! Keys, for a witness named `key`: `key` (current occupancy), `key:max` (a sorted set whose
//! one member `max` scores the highest occupancy seen), `key:violations` (how many entries
//! found occupancy above the limit) and `key:violation_values` (a set of those occupancies).
//!
//! Point it at a Redis of its own (a separate [`RedisServer`](crate::server::RedisServer)):
//! its commands would otherwise show up in the command statistics and keyspace of the
//! server under test. Every method panics, naming the key and the failing command, when
//! Redis fails.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The key names of one witness.
#[derive(Debug, Clone)]
struct Keys {
    url: String,
    current: String,
    max: String,
    violations: String,
    values: String,
    limit: u64,
}

impl Keys {
    fn new(url: &str, key: &str, limit: u64) -> Self {
        Self {
            url: url.to_owned(),
            current: key.to_owned(),
            max: format!("{key}:max"),
            violations: format!("{key}:violations"),
            values: format!("{key}:violation_values"),
            limit,
        }
    }

    fn fail(&self, what: &str, e: &redis::RedisError) -> ! {
        panic!(
            "witness `{}` on {}: {what} failed: {e}",
            self.current, self.url
        )
    }

    /// The commands recording a violation of occupancy `value`, if it is one, and the max.
    fn after_enter(&self, value: u64) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        pipe.cmd("ZADD")
            .arg(&self.max)
            .arg("GT")
            .arg(value)
            .arg("max")
            .ignore();
        if value > self.limit {
            pipe.cmd("INCR").arg(&self.violations).ignore();
            pipe.cmd("SADD").arg(&self.values).arg(value).ignore();
        }
        pipe
    }

    fn read_all(&self) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        pipe.cmd("ZSCORE").arg(&self.max).arg("max");
        pipe.cmd("GET").arg(&self.violations);
        pipe.cmd("SMEMBERS").arg(&self.values);
        pipe
    }

    fn clear(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(&self.current)
            .arg(&self.max)
            .arg(&self.violations)
            .arg(&self.values);
        cmd
    }
}

/// What a witness has recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WitnessReport {
    /// Highest occupancy seen by an `enter`.
    pub max_seen: u64,
    /// Number of `enter`s that found occupancy above the limit.
    pub violations: u64,
    /// The distinct occupancies above the limit, sorted.
    pub violation_values: Vec<u64>,
}

fn report((max, violations, mut values): (Option<f64>, Option<u64>, Vec<u64>)) -> WitnessReport {
    values.sort_unstable();
    WitnessReport {
        // Occupancies are small integers, exact in an f64 score.
        max_seen: max.map_or(0, |m| m as u64),
        violations: violations.unwrap_or(0),
        violation_values: values,
    }
}

/// A synchronous witness; shareable between threads.
pub struct Witness {
    keys: Keys,
    conn: Mutex<redis::Connection>,
}

impl std::fmt::Debug for Witness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Witness")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl Witness {
    /// Connects to `url` (5 s timeout) for a witness of occupancy at most `limit` on `key`.
    pub fn new(url: &str, key: &str, limit: u64) -> Self {
        let keys = Keys::new(url, key, limit);
        let conn = redis::Client::open(url)
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
            .unwrap_or_else(|e| keys.fail("connect", &e));
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap_or_else(|e| keys.fail("set read timeout", &e));
        Self {
            keys,
            conn: Mutex::new(conn),
        }
    }

    /// Records one holder entering; returns the occupancy including it.
    pub fn enter(&self) -> u64 {
        let mut conn = self.lock();
        let value: u64 = redis::cmd("INCR")
            .arg(&self.keys.current)
            .query(&mut *conn)
            .unwrap_or_else(|e| self.keys.fail("INCR", &e));
        self.keys
            .after_enter(value)
            .query::<()>(&mut *conn)
            .unwrap_or_else(|e| self.keys.fail("recording max/violation", &e));
        value
    }

    /// Records one holder leaving; returns the occupancy left.
    pub fn exit(&self) -> i64 {
        redis::cmd("DECR")
            .arg(&self.keys.current)
            .query(&mut *self.lock())
            .unwrap_or_else(|e| self.keys.fail("DECR", &e))
    }

    /// Current occupancy.
    pub fn current(&self) -> i64 {
        redis::cmd("GET")
            .arg(&self.keys.current)
            .query::<Option<i64>>(&mut *self.lock())
            .unwrap_or_else(|e| self.keys.fail("GET", &e))
            .unwrap_or(0)
    }

    /// Highest occupancy seen by an `enter`.
    pub fn max_seen(&self) -> u64 {
        self.report().max_seen
    }

    /// Number of `enter`s that found occupancy above the limit.
    pub fn violations(&self) -> u64 {
        self.report().violations
    }

    /// Everything recorded.
    pub fn report(&self) -> WitnessReport {
        report(
            self.keys
                .read_all()
                .query(&mut *self.lock())
                .unwrap_or_else(|e| self.keys.fail("reading the report", &e)),
        )
    }

    /// Deletes every key of this witness.
    pub fn reset(&self) {
        self.keys
            .clear()
            .query::<()>(&mut *self.lock())
            .unwrap_or_else(|e| self.keys.fail("DEL", &e));
    }

    fn lock(&self) -> MutexGuard<'_, redis::Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The async witness for tokio workers, on a cloneable multiplexed connection.
#[derive(Clone)]
pub struct AsyncWitness {
    keys: Keys,
    conn: redis::aio::MultiplexedConnection,
}

impl std::fmt::Debug for AsyncWitness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncWitness")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl AsyncWitness {
    /// Connects to `url` for a witness of occupancy at most `limit` on `key`.
    pub async fn connect(url: &str, key: &str, limit: u64) -> Self {
        let keys = Keys::new(url, key, limit);
        let client = redis::Client::open(url).unwrap_or_else(|e| keys.fail("open", &e));
        let mut conn = tokio::time::timeout(
            Duration::from_secs(5),
            client.get_multiplexed_async_connection(),
        )
        .await
        .unwrap_or_else(|_| panic!("witness `{key}` on {url}: connect timed out after 5s"))
        .unwrap_or_else(|e| keys.fail("connect", &e));
        // The client's 500 ms default is too short for a machine loaded by a whole fleet.
        conn.set_response_timeout(Duration::from_secs(10));
        Self { keys, conn }
    }

    /// Records one holder entering; returns the occupancy including it.
    pub async fn enter(&self) -> u64 {
        let mut conn = self.conn.clone();
        let value: u64 = redis::cmd("INCR")
            .arg(&self.keys.current)
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| self.keys.fail("INCR", &e));
        self.keys
            .after_enter(value)
            .query_async::<()>(&mut conn)
            .await
            .unwrap_or_else(|e| self.keys.fail("recording max/violation", &e));
        value
    }

    /// Records one holder leaving; returns the occupancy left.
    pub async fn exit(&self) -> i64 {
        redis::cmd("DECR")
            .arg(&self.keys.current)
            .query_async(&mut self.conn.clone())
            .await
            .unwrap_or_else(|e| self.keys.fail("DECR", &e))
    }

    /// Highest occupancy seen by an `enter`.
    pub async fn max_seen(&self) -> u64 {
        self.report().await.max_seen
    }

    /// Number of `enter`s that found occupancy above the limit.
    pub async fn violations(&self) -> u64 {
        self.report().await.violations
    }

    /// Everything recorded.
    pub async fn report(&self) -> WitnessReport {
        report(
            self.keys
                .read_all()
                .query_async(&mut self.conn.clone())
                .await
                .unwrap_or_else(|e| self.keys.fail("reading the report", &e)),
        )
    }

    /// Deletes every key of this witness.
    pub async fn reset(&self) {
        self.keys
            .clear()
            .query_async::<()>(&mut self.conn.clone())
            .await
            .unwrap_or_else(|e| self.keys.fail("DEL", &e));
    }
}
