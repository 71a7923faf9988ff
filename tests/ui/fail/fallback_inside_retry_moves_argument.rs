//! Inside a retry the handler may run once per attempt: it cannot take a `String` twice.
use caracal::{fallback, retry};

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

async fn handler(name: String, _: caracal::Error) -> Result<usize, ApiError> {
    Ok(name.len())
}

#[retry(max_attempts = 3)]
#[fallback(handler)]
async fn f(name: String) -> Result<usize, ApiError> {
    Ok(name.len())
}

fn main() {
    drop(f(String::new()));
}
