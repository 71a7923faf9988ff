//! [`tower`] layers: the bulkhead, circuit breaker and rate limit as middleware for axum,
//! tonic, hyper and any other `tower::Service`, on the same runtime and identities as the
//! attributes — a layer and an attribute with the same kind, name, operation and scope share one
//! budget, breaker or rate.
//!
//! Each layer is built at run time with `::new(name)` and methods named like the attribute's
//! arguments, with the attribute's defaults (operation = name, scope `global`). The scope can
//! come from the request. The services' error is [`tower::BoxError`]; a rejection is a boxed
//! [`caracal::Error`](crate::Error) (downcast it to tell which).
//!
//! Every layer wraps its service in one [`Guarded`] service, generic over the kind's policy
//! ([`Admit`]); each kind's layer, policy and permit live with the kind itself. A `local`
//! layer decides in the call to the service and answers with the inner service's own future
//! (no allocation per request); a decision that waits on the coordinator or in a line is a
//! boxed future.
//!
//! ```
//! use std::time::Duration;
//! use caracal::tower::{BulkheadLayer, CircuitBreakerLayer};
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//!
//! struct Request {
//!     tenant: String,
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower::BoxError> {
//! caracal::install(caracal::Coordinator::in_memory())?;
//! let mut service = ServiceBuilder::new()
//!     .layer(CircuitBreakerLayer::new("partner-api").failure_threshold(0.25).open(Duration::from_secs(10)))
//!     .layer(BulkheadLayer::new("partner-api").limit(20).scope(|req: &Request| req.tenant.clone()))
//!     .service(service_fn(|req: Request| async move {
//!         Ok::<_, std::io::Error>(format!("hello, {}", req.tenant))
//!     }));
//! let request = Request { tenant: "acme".to_owned() };
//! assert_eq!(service.ready().await?.call(request).await?, "hello, acme");
//! # Ok(())
//! # }
//! ```
//!
//! # Panics
//!
//! The setters panic on a value the attribute would reject at compile time (`limit(0)`, a
//! `failure_threshold` of 50): layers are built once, at start-up, from values in the code or
//! checked configuration. A layer used without its required value (`limit`, `rate`) panics when
//! it wraps a service.

pub use crate::guard::{
    Admission, Admit, BoxCall, Guarded, Permit, Prioritized, PriorityLayer, ResponseFuture,
};
// Each kind's layer, service, policy and permit, from the kind's own module.
pub use crate::policy::layers::*;
