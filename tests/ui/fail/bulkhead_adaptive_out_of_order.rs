//! Bounds out of order are reported on the whole `adaptive(…)`.
use caracal::bulkhead;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[bulkhead(limit = adaptive(min = 10, initial = 5, max = 400))]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
