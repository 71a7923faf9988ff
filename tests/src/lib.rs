//! Shared harness for the integration suites: real Redis servers, clusters and Sentinel
//! deployments on free loopback ports, a TCP fault proxy, server-side command counters,
//! capture of caracal's `tracing` events, a `metrics` recorder to read back, a cross-process
//! concurrency witness, and a ledger of which bodies ran at once (for the chaos soak).
//!
//! Everything here is safe to use from tests running in parallel threads of one binary:
//! each server gets its own port and temp dir, each proxy its own port and threads. Every
//! wait is bounded and panics with a message saying what it expected.

pub mod cluster;
pub mod events;
pub mod fenced;
pub mod ledger;
pub mod metrics;
pub mod sentinel;
pub mod stats;
pub mod tls;
pub mod wait;
pub mod witness;

// The servers and the fault proxy live in a crate of their own, which the benchmarks take too.
pub use caracal_harness::{proxy, server};

pub use cluster::RedisCluster;
pub use events::{CapturedEvent, EventLog};
pub use metrics::MetricsLog;
pub use proxy::{FaultProxy, ProxyMode};
pub use sentinel::RedisSentinel;
pub use server::{RedisServer, ensure_redis_installed};
pub use stats::{CommandLog, CommandStats, background_scripts, script_source};
pub use tls::TlsRedisServer;
pub use witness::{AsyncWitness, Witness, WitnessReport};
