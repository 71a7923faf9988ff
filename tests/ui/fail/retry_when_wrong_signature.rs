//! A `when` function of the wrong type.
use caracal::retry;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

fn is_transient(_: &str) -> bool {
    true
}

#[retry(max_attempts = 3, when = is_transient)]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
