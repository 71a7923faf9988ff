//! A breaker that could never open.
use caracal::circuit_breaker;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[circuit_breaker(minimum_throughput = 50, window_size = 40)]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
