//! A class given twice inside `thresholds`, and `thresholds` given twice.
use caracal::rate_limit;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[rate_limit(rate = 10, thresholds(normal = 0.8, normal = 0.7), thresholds(sheddable = 0.5))]
async fn f(_tenant: &str) -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f("acme"));
}
