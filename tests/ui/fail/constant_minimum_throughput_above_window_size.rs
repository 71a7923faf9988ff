//! A constant `minimum_throughput` larger than the (default) `window_size`.
use caracal::circuit_breaker;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

const MINIMUM: u32 = 200;

#[circuit_breaker(minimum_throughput = MINIMUM)]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
