//! Reported once, by the topmost attribute.
use caracal::{bulkhead, retry};

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[retry(max_attempts = 2)]
#[bulkhead(limit = 1)]
fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    let _ = f();
}
