//! A budget written below the `#[retry]`: it would see one attempt per call.
use caracal::{retry, retry_budget};

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[retry(max_attempts = 3)]
#[retry_budget(name = "partner-api")]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
