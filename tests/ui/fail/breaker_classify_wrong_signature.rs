//! A `classify` function of the wrong type.
use caracal::circuit_breaker;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

fn classify(_: &ApiError) -> bool {
    true
}

#[circuit_breaker(classify = classify)]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
