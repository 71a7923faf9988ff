//! `#[retry_budget]`: a fleet-wide retry budget.

// Used by the kind's entry, which the next commit adds.
#[cfg_attr(not(test), expect(dead_code))]
pub(crate) mod kernel;
