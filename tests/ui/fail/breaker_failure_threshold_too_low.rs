//! `failure_threshold` below 0.001.
use caracal::circuit_breaker;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[circuit_breaker(failure_threshold = 0.0)]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
