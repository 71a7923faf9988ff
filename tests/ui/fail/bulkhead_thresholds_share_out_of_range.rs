//! A share is in (0, 1]: zero and more than the whole limit are refused, each on its value.
use caracal::bulkhead;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[bulkhead(limit = 30, thresholds(normal = 1.2, sheddable = 0))]
async fn f(_tenant: &str) -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f("acme"));
}
