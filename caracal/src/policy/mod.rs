//! The policies: what each attribute does to a call.

pub(crate) mod breaker;
pub(crate) mod bulkhead;
pub(crate) mod fallback;
#[cfg(feature = "tower")]
pub(crate) mod layers;
pub(crate) mod rate_limit;
mod registry;
pub(crate) mod retry;
pub(crate) mod timeout;
