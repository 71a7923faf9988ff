//! Every integration suite of caracal, as modules of one test binary (like cargo's own
//! `tests/testsuite/`): each integration binary would link tokio and redis again, and on two
//! cores the links cost more than the tests.
//!
//! Suites run against real `redis-server` processes and clusters the harness spawns on free
//! ports, through a fault proxy where they need one, and across real worker processes
//! (`caracal-worker`). Run one suite with `cargo test -p caracal-tests --test testsuite
//! bulkhead_faults::`.
//!
//! The process-wide coordinator belongs to [`install`]: every other test passes its
//! coordinator with `Coordinator::scoped`, and none may call `caracal::install`.

mod common;

mod adaptive;
mod attribute_forms;
mod availability;
mod batching;
mod breaker_events;
mod breaker_faults;
mod breaker_fleet;
mod bulkhead;
mod bulkhead_contention;
mod bulkhead_events;
mod bulkhead_faults;
mod bulkhead_fleet;
mod call_events;
mod cli;
mod cluster_faults;
mod connect;
mod dashboards;
mod doctor;
mod event_volume;
mod fallback;
mod fleet_ops;
mod fleet_truth;
mod harness;
mod hedge;
mod hedge_latency;
mod install;
mod lease_safety;
mod lease_script;
mod macro_expansion;
mod metrics;
mod operator_audit;
mod pipeline;
mod priorities;
mod rate_limit_fleet;
mod registry_layout;
mod retry_budget;
mod runtime_edges;
mod secrets;
mod sentinel;
mod shadow;
mod top;
mod tower;
mod ui;
