//! `E` must implement `From<caracal::Error>`.
use caracal::bulkhead;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

struct Plain;

#[bulkhead(limit = 1)]
async fn f() -> Result<(), Plain> {
    Ok(())
}

fn main() {
    drop(f());
}
