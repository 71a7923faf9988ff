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
//! # The attributes
//!
//! Each goes on an `async fn` returning `Result<T, E>` with `E: From<caracal::Error>`; the
//! function's own errors pass through untouched. Every argument is checked at compile time.
//!
//! ```
//! use caracal::{bulkhead, circuit_breaker, rate_limit, retry, timeout, Outcome};
//! # #[derive(Debug)] enum ApiError { Resilience(caracal::Error), Partner(u16) }
//! # impl From<caracal::Error> for ApiError {
//! #     fn from(e: caracal::Error) -> Self { ApiError::Resilience(e) }
//! # }
//!
//! // Shared concurrency: at most 10 at once per tenant, waiting up to 50 ms for a slot.
//! #[bulkhead(limit = 10, max_wait = "50ms", scope = format!("tenant:{tenant}"))]
//! async fn export(tenant: u32) -> Result<(), ApiError> { Ok(()) }
//!
//! // A shared breaker; a 404 is the partner answering, not failing.
//! fn classify(result: &Result<u16, ApiError>) -> Outcome {
//!     match result {
//!         Ok(_) | Err(ApiError::Partner(404)) => Outcome::Success,
//!         Err(_) => Outcome::Failure,
//!     }
//! }
//! #[circuit_breaker(name = "partner", open = "30s", classify = classify)]
//! async fn lookup(id: u64) -> Result<u16, ApiError> { Ok(200) }
//!
//! // A shared rate: 700 per second (never more), bursts of 20.
//! #[rate_limit(rate = 700, burst = 20)]
//! async fn notify() -> Result<(), ApiError> { Ok(()) }
//!
//! // Local-only policies never touch the coordinator.
//! #[timeout("2s")]
//! #[retry(max_attempts = 3, backoff = "100ms")]
//! async fn fetch() -> Result<Vec<u8>, ApiError> { Ok(Vec::new()) }
//! ```
//!
//! # Stacking
//!
//! Attributes on one function form one pipeline in the order written, outermost first — except
//! that `#[bulkhead]` and `#[rate_limit]` always wrap each individual attempt, wherever they
//! are written:
//!
//! ```text
//! #[circuit_breaker(…)]   ─┐ breaker: one outcome per call, after retries
//! #[timeout("2s")]         │ ├ timeout: bounds everything below, retries included
//! #[retry(…)]              │ │ ├ retry: attempt 1, 2, 3 …
//! #[rate_limit(…)]         │ │ │ ├ rate limit: charged per attempt     ┐ innermost, in
//! #[bulkhead(…)]           │ │ │ │ ├ bulkhead: a slot per attempt       ┘ the order written
//! async fn f() { body }    │ │ │ │ │ └ body
//! ```
//!
//! So a breaker outside a retry that recovers records one success; a rejection by an inner
//! bulkhead or rate limit is not a failure for the breaker, a timeout is.
//!
//! See the README for each attribute's arguments and defaults, the behaviour when Redis is
//! unreachable, and the events.
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
