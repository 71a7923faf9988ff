//! `priority` is a `caracal::Priority`: another type is reported on the expression.
use caracal::bulkhead;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[bulkhead(limit = 30, priority = tenant)]
async fn f(tenant: &str) -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f("acme"));
}
