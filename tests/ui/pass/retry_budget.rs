//! A budget over a retry, with every argument, a constant and a dynamic scope.
use caracal::{retry, retry_budget};

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

const PERCENT: u32 = 25;

#[retry_budget(name = "partner-api", operation = "get", percent = PERCENT, min_per_second = 5,
               window = "30s", scope = region)]
#[retry(max_attempts = 4, backoff = "10ms")]
async fn f(region: &str) -> Result<(), ApiError> {
    Ok(())
}

#[retry_budget(local)]
#[retry(max_attempts = 2)]
async fn g() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f("eu"));
    drop(g());
}
