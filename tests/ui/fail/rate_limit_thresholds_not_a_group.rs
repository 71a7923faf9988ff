//! `thresholds` lists its classes in parentheses.
use caracal::rate_limit;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[rate_limit(rate = 10, thresholds = 0.8)]
async fn f(_tenant: &str) -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f("acme"));
}
