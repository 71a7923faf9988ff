//! An unknown argument of `adaptive` is reported on itself.
use caracal::bulkhead;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[bulkhead(limit = adaptive(min = 2, start = 20, max = 400))]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
