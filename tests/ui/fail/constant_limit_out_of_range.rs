//! A constant `limit` out of range is a compile error naming the argument and the range.
use caracal::bulkhead;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

const MAX_PARTNER_CALLS: u32 = 0;

#[bulkhead(limit = MAX_PARTNER_CALLS)]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
