//! An argument the budget does not take.
use caracal::{retry, retry_budget};

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[retry_budget(max_attempts = 3)]
#[retry(max_attempts = 3)]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
