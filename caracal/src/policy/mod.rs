//! The policies: what each attribute does to a call.

pub(crate) mod breaker;
pub(crate) mod bulkhead;
pub(crate) mod descriptor;
pub(crate) mod fallback;
#[cfg(feature = "tower")]
pub(crate) mod layers;
pub(crate) mod rate_limit;
mod registry;
pub(crate) mod retry;
pub(crate) mod timeout;

use self::descriptor::Descriptor;
use crate::identity::PolicyKind;

/// Every kind with shared state, in [`PolicyKind`]'s order: what status, the metrics' docs and
/// the event tests go through.
pub(crate) const POLICIES: [&Descriptor; 3] = [
    &bulkhead::descriptor::DESCRIPTOR,
    &breaker::descriptor::DESCRIPTOR,
    &rate_limit::DESCRIPTOR,
];

/// The descriptor of `kind`.
pub(crate) fn descriptor(kind: PolicyKind) -> &'static Descriptor {
    // POLICIES is in the kinds' declaration order (a test of `descriptor` checks it).
    POLICIES[kind as usize]
}
