//! Sheddable calls may not use more of the limit than normal ones.
use caracal::bulkhead;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[bulkhead(limit = 30, thresholds(normal = 0.5, sheddable = 0.8))]
async fn f(_tenant: &str) -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f("acme"));
}
