//! A local bulkhead cannot take the fleet's adaptive limit.
use caracal::bulkhead;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[bulkhead(limit = adaptive(min = 2, initial = 20, max = 400), local)]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
