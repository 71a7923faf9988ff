//! Attributes named by path or by import; an import used only by a stacked attribute still
//! counts as used.
#![deny(warnings)]

use caracal::{bulkhead, rate_limit, timeout};

#[derive(Debug)]
struct ApiError(#[allow(dead_code)] caracal::Error);

impl From<caracal::Error> for ApiError {
    fn from(error: caracal::Error) -> Self {
        ApiError(error)
    }
}

#[caracal::retry(max_attempts = 2)]
#[::caracal::circuit_breaker]
#[timeout("1s")]
#[bulkhead(limit = 3)]
#[rate_limit(rate = 10)]
async fn stacked() -> Result<(), ApiError> {
    Ok(())
}

#[::caracal::bulkhead(limit = 3)]
#[caracal::timeout("1s")]
async fn by_path() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(stacked());
    drop(by_path());
}
