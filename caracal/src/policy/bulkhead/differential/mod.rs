//! The bulkhead's scripts against its kernels: the lease set and the adaptive estimate.

pub(crate) mod adaptive;
pub(crate) mod lease;
