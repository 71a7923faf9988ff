//! What the attribute macros expand to. Not a public API: names here change without notice.

use std::fmt::Display;

pub use crate::ctx::{CallCtx, Rejection};
pub use crate::identity::Scope;
pub use crate::policy::breaker::{
    BreakerConfig, BreakerSite, Classify, ClassifyByResult, OnCoordinatorError, circuit_breaker,
};
pub use crate::policy::bulkhead::{BulkheadConfig, BulkheadSite, bulkhead};
pub use crate::policy::rate_limit::{RateLimitConfig, RateLimitSite, rate_limit};
pub use crate::policy::retry::{Retry, RetryBodyErrors, RetryConfig, RetryWhen};
pub use crate::policy::timeout::{TimeoutConfig, timeout};
pub use core::ops::ControlFlow;
pub use core::time::Duration;

use crate::Error;

/// Evaluates a `scope = <expr>` value once per call.
pub fn scope<S: Display + ?Sized>(value: &S) -> Result<Scope, Error> {
    Scope::new(value.to_string())
}

/// The default scope, `"global"`.
pub const fn global_scope() -> Result<Scope, Error> {
    Ok(Scope::GLOBAL)
}

/// A `scope = "literal"`, validated by the macro at compile time.
pub const fn static_scope(value: &'static str) -> Result<Scope, Error> {
    Ok(Scope::from_static(value))
}
