//! A function returning `()` cannot return a rejection.
use caracal::timeout;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[timeout("1s")]
async fn f() {}

fn main() {
    drop(f());
}
