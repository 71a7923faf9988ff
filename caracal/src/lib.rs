//! Distributed resilience for `async fn`s.
//!
//! Annotate a function, install one coordinator at start-up, and every replica of your service
//! shares one concurrency budget, one circuit breaker and one rate per scope, coordinated
//! through Redis with atomic Lua scripts — or within the process by the in-memory coordinator,
//! which needs nothing installed.
//!
//! ```
//! use caracal::bulkhead;
//!
//! #[derive(Debug)]
//! enum ApiError {
//!     Resilience(caracal::Error),
//!     Partner(u16),
//! }
//!
//! impl From<caracal::Error> for ApiError {
//!     fn from(error: caracal::Error) -> Self {
//!         ApiError::Resilience(error)
//!     }
//! }
//!
//! // At most 20 calls at once per region, across every process sharing the coordinator.
//! #[bulkhead(limit = 20, scope = format!("region:{region}"))]
//! async fn get_order(region: &str, id: u64) -> Result<String, ApiError> {
//!     if id == 0 {
//!         return Err(ApiError::Partner(404));
//!     }
//!     Ok(format!("order {id} from {region}"))
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), caracal::Error> {
//! caracal::install(caracal::Coordinator::in_memory())?;
//! assert_eq!(get_order("eu", 7).await.unwrap(), "order 7 from eu");
//! # Ok(())
//! # }
//! ```
//!
//! # Start-up
//!
//! One coordinator per process, given to [`install`]: [`Coordinator::in_memory`] (the embedded
//! default), [`Coordinator::redis`] or [`Coordinator::redis_cluster`] (a [`RedisBuilder`] to
//! `connect`), or [`Coordinator::from_env`].
//!
//! # Guide
//!
//! The reference, one page per topic (the modules of [`guide`], which hold no items):
//!
//! - [The attributes](guide::attributes): each attribute's arguments, defaults and rejections,
//!   constants as arguments, `#[async_trait]` impls.
//! - [Stacking](guide::stacking): how several attributes on one function form one pipeline.
//! - [Leases](guide::leases): what a bulkhead's lease promises, and its inherent limits.
//! - [When Redis is unreachable](guide::failures): the decision each policy takes, and how
//!   connections recover.
//! - [Events](guide::events): every `tracing` event, its level and its fields.
//! - [Errors](guide::errors): the stable error codes and the kinds of coordinator failure.
//! - [Operations](guide::operations): what `connect` checks, the minimal ACL grant, eviction,
//!   and the `caracal` command (status, forcing a breaker, fleet-wide values).
//! - [Configuration](guide::configuration): [`Config`] from TOML, fleet-wide overrides, the
//!   identity registry and drift.
//! - [Tower](guide::tower): the layers of [`caracal::tower`](crate::tower) (feature `tower`).
//!
//! Operating a fleet from code: [`admin`].
//!
//! # Features
//!
//! - `tower`: a layer for each attribute that guards an identity (see
//!   [`caracal::tower`](crate::tower)), for axum, tonic and hyper.
//! - `tls`: `rediss://` URLs, through rustls
//!   (`RedisBuilder::tls_root_certificates` for a CA of your own).
//! - `metrics`: decisions, breaker states, bulkhead occupancy, admission latency and
//!   coordinator connectivity through the `metrics` facade: see [`metrics`] for the names,
//!   labels and what each means.
#![forbid(unsafe_code)]

pub mod admin;
mod clock;
mod config;
mod coordinator;
mod ctx;
mod error;
mod events;
mod fencing;
#[cfg(feature = "tower")]
mod guard;
pub mod guide;
mod identity;
mod kernel;
mod labels;
#[cfg(test)]
mod layers;
pub mod metrics;
mod operator;
mod outcome;
mod policy;
mod priority;
mod script;
mod summary;
mod sync;
mod tally;
mod token;
#[cfg(feature = "tower")]
pub mod tower;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

pub use caracal_macros::*;
pub use config::Config;
pub use coordinator::{
    Coordinator, DataLoss, FORGET_IDLE_AFTER, REDIS_ACL_RULES, RedisBuilder, install,
};
pub use error::{CoordinatorFailure, Error, FailureKind};
pub use fencing::fencing_token;
pub use identity::PolicyKind;
pub use outcome::Outcome;
pub use priority::{Priority, Thresholds, UnknownPriority, with_priority};
