//! `backoff` above 24h.
use caracal::retry;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[retry(max_attempts = 3, backoff = "25h", max_backoff = "25h")]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
