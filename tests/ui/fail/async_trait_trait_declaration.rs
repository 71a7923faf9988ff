//! On an `#[async_trait]` trait, a declaration has no body to guard.
use async_trait::async_trait;
use caracal::retry;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[async_trait]
trait Api {
    #[retry(max_attempts = 3)]
    async fn get(&self) -> Result<(), ApiError>;
}

fn main() {}
