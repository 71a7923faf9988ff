//! A trait's method declaration has no body to guard.
use caracal::bulkhead;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

trait Api {
    #[bulkhead(limit = 1)]
    async fn f(&self) -> Result<(), ApiError>;
}

fn main() {
    let _ = ApiError;
}
