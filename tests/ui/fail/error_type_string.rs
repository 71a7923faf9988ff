//! An error type without `From<caracal::Error>` is one error, saying what to write, on the return type, however many attributes.
use caracal::{circuit_breaker, retry, timeout};

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[circuit_breaker]
#[timeout("1s")]
#[retry(max_attempts = 2)]
async fn f(fail: bool) -> Result<(), String> {
    if fail {
        return Err("failed".to_owned());
    }
    Ok(())
}

fn main() {
    drop(f(true));
}
