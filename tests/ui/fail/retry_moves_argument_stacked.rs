//! The same, with `#[retry]` below another attribute: the loop is its own.
use caracal::{retry, timeout};

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[timeout("1s")]
#[retry(max_attempts = 3)]
async fn f(name: String) -> Result<(), ApiError> {
    drop(name);
    Ok(())
}

fn main() {
    drop(f(String::new()));
}
