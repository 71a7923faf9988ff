//! `shadow = true` and `shadow = false` on every kind that can refuse a call, local or not.
#![deny(warnings)]

use caracal::{bulkhead, circuit_breaker};

#[derive(Debug)]
struct ApiError(#[allow(dead_code)] caracal::Error);

impl From<caracal::Error> for ApiError {
    fn from(error: caracal::Error) -> Self {
        ApiError(error)
    }
}

#[circuit_breaker(name = "shadowed", shadow = true)]
#[bulkhead(name = "shadowed", limit = 2, shadow = true)]
async fn shadowed() -> Result<(), ApiError> {
    Ok(())
}

#[circuit_breaker(local, shadow = false)]
#[bulkhead(limit = 2, local, shadow = true)]
async fn local() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(shadowed());
    drop(local());
}
