//! `prefetch` takes at least the call's own emission: 0 is out of range.
use caracal::rate_limit;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[rate_limit(rate = 1, burst = 4, prefetch = 0)]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
