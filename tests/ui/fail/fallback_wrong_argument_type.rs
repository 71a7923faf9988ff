//! The handler takes the arguments with their types.
use caracal::fallback;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

async fn handler(_: &str, _: caracal::Error) -> Result<u64, ApiError> {
    Ok(0)
}

#[fallback(handler)]
async fn f(id: u64) -> Result<u64, ApiError> {
    Ok(id)
}

fn main() {
    drop(f(1));
}
