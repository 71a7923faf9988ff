//! The one `tower::Service` every kind's layer wraps its service in ([`Guarded`], generic over
//! the kind's policy, [`Admit`]), its future and the permit the future releases: below the
//! kinds, which each bring a layer, a policy and a permit of their own. Public as
//! [`caracal::tower`](crate::tower).

mod future;
pub(crate) mod layer;
mod service;

pub use future::{BoxCall, Permit, ResponseFuture};
pub use service::{Admission, Admit, Guarded};

#[cfg(test)]
pub(crate) mod tests;
