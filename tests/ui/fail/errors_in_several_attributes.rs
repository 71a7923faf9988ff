//! Errors of every stacked attribute are reported together.
use caracal::{circuit_breaker, retry};

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[circuit_breaker(open = "forever")]
#[retry(max_attempts = 0)]
#[caracal::bulkhead(limit = 0)]
#[::caracal::timeout]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
