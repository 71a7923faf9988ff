//! The five attributes stacked, every argument given, and repeated attributes.
#![deny(warnings)]

use caracal::{Outcome, bulkhead, circuit_breaker, rate_limit, retry, timeout};

#[derive(Debug)]
enum ApiError {
    Resilience(#[allow(dead_code)] caracal::Error),
    Partner(u16),
}

impl From<caracal::Error> for ApiError {
    fn from(error: caracal::Error) -> Self {
        ApiError::Resilience(error)
    }
}

#[derive(Debug)]
struct Order(#[allow(dead_code)] u64);

fn classify(result: &Result<Order, ApiError>) -> Outcome {
    match result {
        Err(ApiError::Partner(404)) | Ok(_) => Outcome::Success,
        Err(_) => Outcome::Failure,
    }
}

fn is_transient(error: &ApiError) -> bool {
    matches!(error, ApiError::Partner(500..))
}

mod policies {
    pub(crate) fn never(_: &super::ApiError) -> bool {
        false
    }
}

#[circuit_breaker(
    name = "partner-api",
    operation = "get-order",
    scope = format!("region:{region}"),
    minimum_throughput = 20,
    failure_threshold = 0.5,
    window_size = 100,
    window = "2m",
    open = "30s",
    half_open_probes = 3,
    half_open_successes = 2,
    probe_lease = "1m",
    on_coordinator_error = "fail_closed",
    classify = classify,
)]
#[timeout("2s")]
#[retry(max_attempts = 3, backoff = "100ms", max_backoff = "1s", when = is_transient)]
#[bulkhead(name = "partner-api", limit = 20, lease = "30s", scope = format!("region:{region}"))]
#[rate_limit(name = "partner-api", rate = 0.5, burst = 10, scope = region, local)]
async fn get_order(region: &str, id: u64) -> Result<Order, ApiError> {
    if id == 0 {
        return Err(ApiError::Partner(404));
    }
    Ok(Order(id))
}

// Another order, a `when` from another module, an integer threshold and rate.
#[retry(max_attempts = 2, when = policies::never)]
#[bulkhead(name = "per-user", limit = 1, scope = user, local)]
#[timeout("500ms")]
#[circuit_breaker(failure_threshold = 0.25, window_size = 20, minimum_throughput = 20)]
#[rate_limit(rate = 1_000_000)]
async fn nested(user: u64) -> Result<u64, ApiError> {
    Ok(user)
}

fn main() {
    drop(get_order("eu", 1));
    drop(nested(1));
}
