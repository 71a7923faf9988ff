//! Two `#[hedge]`s would nest, the outer one hedging the inner one's hedges.
use caracal::hedge;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[hedge(delay = "50ms")]
#[hedge(delay = "20ms")]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
