//! Two `#[timeout]`s on one function.
use caracal::{bulkhead, timeout};

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[timeout("1s")]
#[bulkhead(limit = 1)]
#[caracal::timeout("2s")]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
