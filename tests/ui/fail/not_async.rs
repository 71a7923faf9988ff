//! The function must be `async`.
use caracal::bulkhead;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[bulkhead(limit = 1)]
fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    let _ = f();
}
