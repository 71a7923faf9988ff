//! A constant `failure_threshold` written as a percentage.
use caracal::circuit_breaker;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

const THRESHOLD: f64 = 50.0;

#[circuit_breaker(failure_threshold = THRESHOLD)]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
