//! `#[retry = …]` is not an attribute form caracal takes.
use caracal::{bulkhead, retry};

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[bulkhead(limit = 1)]
#[retry = 3]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
