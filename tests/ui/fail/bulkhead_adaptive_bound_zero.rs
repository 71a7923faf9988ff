//! Each bound is a count in the limit's range.
use caracal::bulkhead;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[bulkhead(limit = adaptive(min = 0, initial = 20, max = 400))]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
