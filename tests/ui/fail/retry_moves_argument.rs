//! A body that moves an argument out cannot run once per attempt.
use caracal::retry;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[retry(max_attempts = 3)]
async fn f(name: String) -> Result<(), ApiError> {
    drop(name);
    Ok(())
}

fn main() {
    drop(f(String::new()));
}
