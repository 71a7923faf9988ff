//! The handler returns the function's own `Result`.
use caracal::fallback;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

async fn handler(_: u64, _: caracal::Error) -> Result<String, ApiError> {
    Ok(String::new())
}

#[fallback(handler)]
async fn f(id: u64) -> Result<u64, ApiError> {
    Ok(id)
}

fn main() {
    drop(f(1));
}
