//! What several suites share: coordinators for each backend, unique scopes, an error type.

// Each suite uses only part of this module.
#![allow(dead_code, unreachable_pub)]

pub mod worker;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use caracal::Coordinator;

/// The error type of the guarded functions in the suites.
#[derive(Debug)]
pub enum TestError {
    Caracal(caracal::Error),
    Body(&'static str),
}

impl From<caracal::Error> for TestError {
    fn from(error: caracal::Error) -> Self {
        TestError::Caracal(error)
    }
}

impl TestError {
    /// The caracal error inside, if this is one.
    pub fn caracal(&self) -> Option<&caracal::Error> {
        match self {
            TestError::Caracal(error) => Some(error),
            TestError::Body(_) => None,
        }
    }

    /// The caracal error code inside, if any.
    pub fn code(&self) -> Option<&'static str> {
        self.caracal().map(caracal::Error::code)
    }
}

/// The code of a result's caracal error, `"ok"` for success, `"body"` for the body's own.
pub fn code<T>(result: &Result<T, TestError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(TestError::Caracal(error)) => error.code(),
        Err(TestError::Body(_)) => "body",
    }
}

/// A scope no other test uses.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A coordinator on `url` (a server or a fault proxy) in a namespace of its own.
pub async fn connect(url: &str, command_timeout: Duration) -> Coordinator {
    Coordinator::redis(url)
        .namespace(unique("ns"))
        .command_timeout(command_timeout)
        .connect()
        .await
        .expect("connect to the test server")
}

pub async fn redis(url: &str) -> Coordinator {
    connect(url, Duration::from_millis(500)).await
}

/// A connection for timing round trips with [`round_trip`] (open it before slowing the link).
pub async fn ping_connection(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("ping connection")
}

/// One `PING` round trip on `conn`.
pub async fn round_trip(conn: &mut redis::aio::MultiplexedConnection) -> Duration {
    let start = std::time::Instant::now();
    let _: String = redis::cmd("PING").query_async(conn).await.expect("PING");
    start.elapsed()
}

pub async fn cluster(seeds: Vec<String>) -> Coordinator {
    Coordinator::redis_cluster(seeds)
        .namespace(unique("ns"))
        .command_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect to the test cluster")
}
