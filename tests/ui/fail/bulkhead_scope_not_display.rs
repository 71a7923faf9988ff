//! A scope expression must implement `Display`: the error points at it.
use caracal::bulkhead;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[bulkhead(limit = 1, scope = ids)]
async fn f(ids: Vec<u32>) -> Result<(), ApiError> {
    let _ = ids;
    Ok(())
}

fn main() {
    drop(f(Vec::new()));
}
