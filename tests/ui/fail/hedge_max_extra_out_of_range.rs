//! At most three extra attempts, at least one.
use caracal::hedge;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[hedge(delay = "50ms", max_extra = 4)]
async fn four() -> Result<(), ApiError> {
    Ok(())
}

#[hedge(delay = "50ms", max_extra = 0)]
async fn none() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(four());
    drop(none());
}
