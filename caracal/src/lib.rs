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
//! See the README for every attribute, its arguments and defaults, how stacked attributes
//! compose, what happens when Redis is unreachable, and the events caracal emits.
#![forbid(unsafe_code)]

mod coordinator;
mod ctx;
mod error;
mod events;
mod identity;
mod outcome;
mod policy;
mod sync;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

pub use caracal_macros::{bulkhead, circuit_breaker, rate_limit, retry, timeout};
pub use coordinator::{Coordinator, RedisBuilder, install};
pub use error::{CoordinatorFailure, Error, FailureKind};
pub use outcome::Outcome;
