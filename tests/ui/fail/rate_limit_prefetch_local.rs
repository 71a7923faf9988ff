//! `prefetch` has no effect on a `local` rate limit: an error, spanned on the argument.
use caracal::rate_limit;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[rate_limit(rate = 1, burst = 4, prefetch = 4, local)]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
