//! Attribute macros behind [caracal](https://docs.rs/caracal). Use them through the `caracal`
//! crate, which re-exports them (`caracal::bulkhead`, …); its guide is their reference:
//! [the attributes](https://docs.rs/caracal/latest/caracal/guide/attributes/index.html), their
//! arguments and defaults, and [stacking](https://docs.rs/caracal/latest/caracal/guide/stacking/index.html),
//! how several on one function form one pipeline. The examples here are compiled against
//! `caracal` (a dev-dependency).
#![forbid(unsafe_code)]

mod args;
mod breaker;
mod bulkhead;
mod durations;
mod errors;
mod expand;
mod fallback;
mod hedge;
mod identity;
mod layer;
mod names;
mod priority;
mod rate_limit;
mod retry;
mod retry_budget;
mod timeout;
mod values;

use proc_macro::TokenStream;

use crate::layer::Kind;

/// Registers the attributes, one line each (`name => module::KIND;`, after its documentation):
/// the `#[proc_macro_attribute]` entry points, and [`KINDS`], which the pipeline recognises on
/// a function.
macro_rules! attributes {
    ($($(#[$doc:meta])* $name:ident => $kind:path;)*) => {
        $(
            $(#[$doc])*
            #[proc_macro_attribute]
            pub fn $name(args: TokenStream, item: TokenStream) -> TokenStream {
                expand::attribute(&$kind, KINDS, args.into(), item.into()).into()
            }
        )*

        /// Every attribute.
        const KINDS: &[&Kind] = &[$(&$kind),*];

        #[cfg(test)]
        #[test]
        fn each_entry_point_is_named_as_its_kind() {
            $(assert_eq!($kind.name, stringify!($name));)*
        }
    };
}

attributes! {

    /// A concurrency limit shared by every process using the coordinator: at most `limit`
    /// bodies run at once per identity (name, operation, scope). Arguments, defaults and
    /// rejections: [`#[bulkhead]`](https://docs.rs/caracal/latest/caracal/guide/attributes/index.html#bulkhead--at-most-limit-bodies-at-once); what its lease
    /// promises: [leases](https://docs.rs/caracal/latest/caracal/guide/leases/index.html).
    ///
    /// ```
    /// use caracal::bulkhead;
    /// # #[derive(Debug, thiserror::Error)]
    /// # #[error(transparent)]
    /// # struct ApiError(#[from] caracal::Error);
    ///
    /// #[bulkhead(name = "partner-api", limit = 20, scope = format!("region:{region}"))]
    /// async fn get_order(region: &str, id: u64) -> Result<String, ApiError> {
    ///     Ok(format!("order {id} from {region}"))
    /// }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// # let order = caracal::Coordinator::in_memory().scoped(get_order("eu", 7)).await;
    /// # assert_eq!(order.unwrap(), "order 7 from eu");
    /// # }
    /// ```
    ///
    /// `limit = adaptive(min = 2, initial = 20, max = 400)` lets the fleet find the limit from
    /// the downstream's latency instead: [adaptive limits](https://docs.rs/caracal/latest/caracal/guide/attributes/index.html#adaptive-limits).
    bulkhead => bulkhead::KIND;

    /// A circuit breaker whose failure window is shared by every process using the coordinator.
    /// Arguments, defaults and rejections:
    /// [`#[circuit_breaker]`](https://docs.rs/caracal/latest/caracal/guide/attributes/index.html#circuit_breaker--one-failure-window-per-identity-fleet-wide).
    ///
    /// ```
    /// use caracal::circuit_breaker;
    /// # #[derive(Debug, thiserror::Error)]
    /// # #[error(transparent)]
    /// # struct ApiError(#[from] caracal::Error);
    ///
    /// #[circuit_breaker(name = "partner-api", failure_threshold = 0.25, open = "10s")]
    /// async fn get_order(id: u64) -> Result<u64, ApiError> {
    ///     Ok(id)
    /// }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// # let order = caracal::Coordinator::in_memory().scoped(get_order(7)).await;
    /// # assert_eq!(order.unwrap(), 7);
    /// # }
    /// ```
    circuit_breaker => breaker::KIND;

    /// A rate limit (GCRA) shared by every process using the coordinator. Arguments, defaults
    /// and rejections: [`#[rate_limit]`](https://docs.rs/caracal/latest/caracal/guide/attributes/index.html#rate_limit--a-shared-gcra-rate).
    ///
    /// ```
    /// use caracal::rate_limit;
    /// # #[derive(Debug, thiserror::Error)]
    /// # #[error(transparent)]
    /// # struct ApiError(#[from] caracal::Error);
    ///
    /// #[rate_limit(rate = 50, burst = 10, scope = tenant)]
    /// async fn send(tenant: &str, message: String) -> Result<(), ApiError> {
    ///     Ok(())
    /// }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// # let sent = caracal::Coordinator::in_memory().scoped(send("acme", "hi".into())).await;
    /// # assert!(sent.is_ok());
    /// # }
    /// ```
    rate_limit => rate_limit::KIND;

    /// Runs the layers inside it again when an attempt fails, with exponential backoff and full
    /// jitter. Arguments and defaults: [`#[retry]`](https://docs.rs/caracal/latest/caracal/guide/attributes/index.html#retry).
    ///
    /// ```
    /// use caracal::retry;
    /// # #[derive(Debug, thiserror::Error)]
    /// # enum ApiError {
    /// #     #[error(transparent)]
    /// #     Resilience(#[from] caracal::Error),
    /// #     #[error("partner unavailable")]
    /// #     Unavailable,
    /// # }
    ///
    /// fn is_transient(error: &ApiError) -> bool {
    ///     matches!(error, ApiError::Unavailable)
    /// }
    ///
    /// #[retry(max_attempts = 3, backoff = "100ms", when = is_transient)]
    /// async fn get_order(id: u64) -> Result<u64, ApiError> {
    ///     Ok(id)
    /// }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// # assert_eq!(get_order(7).await.unwrap(), 7);
    /// # }
    /// ```
    retry => retry::KIND;

    /// A retry budget shared by every process using the coordinator, stacked outside a
    /// `#[retry]`: first attempts deposit, retries withdraw, and a retry the budget refuses is
    /// not made. Arguments and defaults: [`#[retry_budget]`](https://docs.rs/caracal/latest/caracal/guide/attributes/index.html#retry_budget--a-fleet-wide-retry-budget).
    ///
    /// ```
    /// use caracal::{retry, retry_budget};
    /// # #[derive(Debug, thiserror::Error)]
    /// # #[error(transparent)]
    /// # struct ApiError(#[from] caracal::Error);
    ///
    /// #[retry_budget(name = "partner-api", percent = 20, min_per_second = 10, window = "10s")]
    /// #[retry(max_attempts = 4)]
    /// async fn get_order(id: u64) -> Result<u64, ApiError> {
    ///     Ok(id)
    /// }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// # let order = caracal::Coordinator::in_memory().scoped(get_order(7)).await;
    /// # assert_eq!(order.unwrap(), 7);
    /// # }
    /// ```
    retry_budget => retry_budget::KIND;

    /// Answers caracal's own rejections from the layers inside it with a handler, an `async fn`
    /// taking the function's arguments and then the `caracal::Error`. Which rejections, and
    /// the handler's shape: [`#[fallback]`](https://docs.rs/caracal/latest/caracal/guide/attributes/index.html#fallbackhandler).
    ///
    /// ```
    /// use caracal::{circuit_breaker, fallback};
    /// # #[derive(Debug, thiserror::Error)]
    /// # #[error(transparent)]
    /// # struct ApiError(#[from] caracal::Error);
    ///
    /// #[fallback(cached_order)]
    /// #[circuit_breaker(name = "partner-api")]
    /// async fn get_order(id: u64) -> Result<String, ApiError> {
    ///     Ok(format!("order {id}"))
    /// }
    ///
    /// async fn cached_order(id: u64, rejection: caracal::Error) -> Result<String, ApiError> {
    ///     Ok(format!("order {id} from the cache"))
    /// }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// # let order = caracal::Coordinator::in_memory().scoped(get_order(7)).await;
    /// # assert_eq!(order.unwrap(), "order 7");
    /// # }
    /// ```
    fallback => fallback::KIND;

    /// Hedges a slow call: after `delay` without an answer, another attempt of the layers
    /// inside it starts beside the first (up to `max_extra`), and the first `Ok` is the
    /// call's; `budget` names the `#[retry_budget]` each extra attempt withdraws from.
    /// Arguments, defaults and the rule for `delay = p95`:
    /// [`#[hedge]`](https://docs.rs/caracal/latest/caracal/guide/attributes/index.html#hedge--another-attempt-beside-a-slow-one).
    ///
    /// ```
    /// use caracal::{bulkhead, hedge, retry_budget};
    /// # #[derive(Debug, thiserror::Error)]
    /// # #[error(transparent)]
    /// # struct ApiError(#[from] caracal::Error);
    ///
    /// #[retry_budget(name = "partner-api", percent = 10)]
    /// #[hedge(delay = "50ms", max_extra = 1, budget = "partner-api")]
    /// #[bulkhead(name = "partner-api", limit = 20)]
    /// async fn get_order(id: u64) -> Result<u64, ApiError> {
    ///     Ok(id)
    /// }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// # let order = caracal::Coordinator::in_memory().scoped(get_order(7)).await;
    /// # assert_eq!(order.unwrap(), 7);
    /// # }
    /// ```
    hedge => hedge::KIND;

    /// A deadline on the layers inside it. What happens when it elapses:
    /// [`#[timeout]`](https://docs.rs/caracal/latest/caracal/guide/attributes/index.html#timeout2s).
    ///
    /// ```
    /// use caracal::timeout;
    /// # #[derive(Debug, thiserror::Error)]
    /// # #[error(transparent)]
    /// # struct ApiError(#[from] caracal::Error);
    ///
    /// #[timeout("10ms")]
    /// async fn get_order(id: u64) -> Result<u64, ApiError> {
    ///     std::future::pending().await
    /// }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// # let ApiError(error) = get_order(7).await.unwrap_err();
    /// # assert_eq!(error.code(), "timeout");
    /// # }
    /// ```
    timeout => timeout::KIND;
}
