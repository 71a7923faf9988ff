//! A `window` under a second: it slides by tenths.
use caracal::{retry, retry_budget};

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[retry_budget(window = "500ms")]
#[retry(max_attempts = 3)]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
