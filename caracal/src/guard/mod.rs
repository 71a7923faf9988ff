//! The one `tower::Service` every kind's layer wraps its service in ([`Guarded`], generic over
//! the kind's policy, [`Admit`]), its future and the permit the future releases: below the
//! kinds, which each bring a layer, a policy and a permit of their own. Public as
//! [`caracal::tower`](crate::tower), with the [`PriorityLayer`] that classes requests for them.

mod future;
pub(crate) mod layer;
mod priority;
mod service;

pub use future::{BoxCall, Permit, ResponseFuture};
pub use priority::{Prioritized, PriorityLayer};
pub use service::{Admission, Admit, Guarded};

#[cfg(test)]
pub(crate) mod tests;
