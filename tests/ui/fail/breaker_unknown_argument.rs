//! An unknown argument lists the valid ones.
use caracal::circuit_breaker;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[circuit_breaker(threshold = 0.5)]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
