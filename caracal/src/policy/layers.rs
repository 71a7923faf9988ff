//! Each kind's tower layer, its service, and the policy and permit that service applies:
//! re-exported as [`caracal::tower`](crate::tower).

pub use super::breaker::tower::{CircuitBreaker, CircuitBreakerLayer, CircuitBreakerPolicy};
pub use super::bulkhead::tower::{Bulkhead, BulkheadLayer, BulkheadPermit, BulkheadPolicy};
pub use super::rate_limit::tower::{RateLimit, RateLimitLayer, RateLimitPolicy};
