//! Attribute macros behind `caracal`. Use them through the `caracal` crate, which re-exports
//! them; the examples here are `ignore`d because this crate cannot depend on `caracal`, and are
//! compiled in `caracal`'s own documentation instead.
//!
//! Every attribute goes on an `async fn` returning `Result<T, E>` (any path ending in
//! `Result`, such as `io::Result<T>`) with `E: From<caracal::Error>`, and keeps its signature.
//! The topmost caracal attribute expands all of them at once into one pipeline: in the order
//! written, outermost first, except that `#[bulkhead]` and `#[rate_limit]` always wrap each
//! attempt (innermost). Arguments are checked at compile time; durations are strings with a
//! unit (`"250ms"`, `"2s"`, `"1m"`, `"1h"`) of at most 24 hours.
//!
//! `#[bulkhead]`, `#[circuit_breaker]` and `#[rate_limit]` also take:
//!
//! | argument | default | |
//! |---|---|---|
//! | `name = "…"` | the function's name | non-blank, at most 1024 bytes |
//! | `operation = "…"` | `name` | non-blank, at most 1024 bytes |
//! | `scope = <expr>` | `"global"` | any `Display` expression over the arguments (and `self`), evaluated once per call; a blank value is `Error::InvalidScope` |
//! | `local` | off | a bare flag: the policy is per-process and never touches the coordinator |
#![forbid(unsafe_code)]

mod args;
mod breaker;
mod bulkhead;
mod durations;
mod errors;
mod expand;
mod identity;
mod layer;
mod rate_limit;
mod retry;
mod timeout;

use proc_macro::TokenStream;

use crate::layer::Kind;

macro_rules! attribute {
    ($(#[$doc:meta])* $name:ident => $kind:ident) => {
        $(#[$doc])*
        #[proc_macro_attribute]
        pub fn $name(args: TokenStream, item: TokenStream) -> TokenStream {
            expand::attribute(Kind::$kind, args.into(), item.into()).into()
        }
    };
}

attribute! {
    /// A concurrency limit shared by every process using the coordinator: at most `limit`
    /// bodies run at once per identity (name, operation, scope).
    ///
    /// | argument | default | |
    /// |---|---|---|
    /// | `limit` | required | an integer from 1 to 1000000 |
    /// | `lease` | `"30s"` | from 100ms to 24h; how long a crashed holder keeps its slot. Not with `local` |
    /// | `max_wait` | none: reject at once | from 1ms to 24h; how long to wait for a slot |
    /// | `name`, `operation`, `scope`, `local` | | see the crate docs |
    ///
    /// A call that finds no slot returns `Err(E::from(caracal::Error::BulkheadFull { .. }))`.
    ///
    /// ```ignore
    /// #[bulkhead(name = "partner-api", limit = 20, scope = format!("region:{region}"))]
    /// async fn get_order(region: &str, id: u64) -> Result<Order, ApiError> { /* … */ }
    /// ```
    bulkhead => Bulkhead
}

attribute! {
    /// A circuit breaker whose failure window is shared by every process using the coordinator.
    ///
    /// | argument | default | |
    /// |---|---|---|
    /// | `minimum_throughput` | `20` | an integer ≥ 1, at most `window_size`: observations needed before it may open |
    /// | `failure_threshold` | `0.5` | a number from 0.001 to 0.999: opens when failures / observations reach it |
    /// | `window_size` | `100` | an integer from 1 to 1000000: the window's latest observations |
    /// | `window` | `max(3 × open, 60s)` | from 1ms to 24h: observations older than this leave the window |
    /// | `open` | `"30s"` | from 1ms to 24h: how long it stays open before probing |
    /// | `half_open_probes` | `3` | an integer from 1 to 10000: concurrent probes while half-open |
    /// | `half_open_successes` | `2` | an integer from 1 to 10000: probe successes needed to close |
    /// | `probe_lease` | `2 × open` | from 1ms to 24h: a probe that never settles frees its slot after this |
    /// | `on_coordinator_error` | `"fail_open"` | or `"fail_closed"`: what to do when the coordinator cannot answer |
    /// | `classify` | `Ok` success, `Err` failure | a path to a `fn(&Result<T, E>) -> caracal::Outcome` |
    /// | `name`, `operation`, `scope`, `local` | | see the crate docs |
    ///
    /// A call refused by the breaker returns `Err(E::from(caracal::Error::CircuitOpen { .. }))`.
    ///
    /// ```ignore
    /// #[circuit_breaker(name = "partner-api", failure_threshold = 0.25, open = "10s")]
    /// async fn get_order(id: u64) -> Result<Order, ApiError> { /* … */ }
    /// ```
    circuit_breaker => CircuitBreaker
}

attribute! {
    /// A rate limit (GCRA) shared by every process using the coordinator.
    ///
    /// | argument | default | |
    /// |---|---|---|
    /// | `rate` | required | admissions per second, a number from 0.000001 to 1000000 (`0.5` is one every 2 s) |
    /// | `burst` | `1` | an integer from 1 to 1000000: how many may be admitted at once after idle time |
    /// | `name`, `operation`, `scope`, `local` | | see the crate docs |
    ///
    /// A call over the rate returns `Err(E::from(caracal::Error::RateLimited { .. }))`.
    ///
    /// ```ignore
    /// #[rate_limit(rate = 50, burst = 10, scope = tenant)]
    /// async fn send(tenant: &str, message: Message) -> Result<(), ApiError> { /* … */ }
    /// ```
    rate_limit => RateLimit
}

attribute! {
    /// Runs the layers inside it again when an attempt fails, with exponential backoff and full
    /// jitter.
    ///
    /// | argument | default | |
    /// |---|---|---|
    /// | `max_attempts` | required | an integer from 1 to 1000, counting the first attempt |
    /// | `backoff` | `"0ms"` | up to 24h: the delay before the 2nd attempt, doubling after |
    /// | `max_backoff` | `"10s"` | up to 24h and at least `backoff`: the cap on one delay |
    /// | `when` | every `Err` but caracal's own rejections | a path to a `fn(&E) -> bool`: retry this error? |
    ///
    /// The body runs once per attempt, so it may borrow `&mut self` but not move a captured
    /// value out.
    ///
    /// ```ignore
    /// #[retry(max_attempts = 3, backoff = "100ms", when = is_transient)]
    /// async fn get_order(id: u64) -> Result<Order, ApiError> { /* … */ }
    /// ```
    retry => Retry
}

attribute! {
    /// A deadline: once the duration (greater than 0, at most 24h) elapses, what the attribute
    /// wraps is dropped and the call returns `Err(E::from(caracal::Error::Timeout { .. }))`.
    ///
    /// ```ignore
    /// #[timeout("2s")]
    /// async fn get_order(id: u64) -> Result<Order, ApiError> { /* … */ }
    /// ```
    timeout => Timeout
}
