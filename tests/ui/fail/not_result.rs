//! The function must return a `Result`.
use caracal::retry;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[retry(max_attempts = 2)]
async fn f() -> Option<u32> {
    Some(1)
}

fn main() {
    drop(f());
}
