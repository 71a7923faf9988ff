//! Throwaway `redis-server` processes on free loopback ports and a TCP fault proxy: what the
//! integration suites (`caracal-tests`, which re-exports both) and the outage benchmarks share.
//!
//! Safe to use from tests running in parallel threads of one binary: each server gets its own
//! port and temp dir, each proxy its own port and threads. Every wait is bounded and panics with
//! a message saying what it expected.

pub mod proxy;
pub mod server;

pub use proxy::{FaultProxy, ProxyMode};
pub use server::{RedisServer, ensure_redis_installed};
