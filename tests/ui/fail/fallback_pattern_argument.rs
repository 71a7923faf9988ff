//! Every argument is handed to the handler, so each needs a name.
use caracal::fallback;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

async fn handler(pair: (u64, u64), _: caracal::Error) -> Result<u64, ApiError> {
    Ok(pair.0)
}

#[fallback(handler)]
async fn f((a, b): (u64, u64)) -> Result<u64, ApiError> {
    Ok(a + b)
}

fn main() {
    drop(f((1, 2)));
}
