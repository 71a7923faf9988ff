//! Counts are `u32`: a `usize` constant is a type error on it.
use caracal::retry;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

const ATTEMPTS: usize = 3;

#[retry(max_attempts = ATTEMPTS)]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
