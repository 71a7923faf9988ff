//! `max_backoff` shorter than `backoff`.
use caracal::retry;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[retry(max_attempts = 3, backoff = "2s", max_backoff = "1s")]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
