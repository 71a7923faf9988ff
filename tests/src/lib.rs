//! Shared harness for the integration suites: real Redis servers and clusters on free
//! loopback ports, a TCP fault proxy, server-side command counters, capture of caracal's
//! `tracing` events, and a cross-process concurrency witness.
//!
//! Everything here is safe to use from tests running in parallel threads of one binary:
//! each server gets its own port and temp dir, each proxy its own port and threads. Every
//! wait is bounded and panics with a message saying what it expected.

pub mod cluster;
pub mod events;
pub mod proxy;
pub mod server;
pub mod stats;
pub mod wait;
pub mod witness;

pub use cluster::RedisCluster;
pub use events::{CapturedEvent, EventLog};
pub use proxy::{FaultProxy, ProxyMode};
pub use server::{RedisServer, ensure_redis_installed};
pub use stats::CommandStats;
pub use witness::{AsyncWitness, Witness, WitnessReport};
