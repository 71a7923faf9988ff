//! The handler is an `async fn`.
use caracal::fallback;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

fn handler(id: u64, _: caracal::Error) -> Result<u64, ApiError> {
    Ok(id)
}

#[fallback(handler)]
async fn f(id: u64) -> Result<u64, ApiError> {
    Ok(id)
}

fn main() {
    drop(f(1));
}
