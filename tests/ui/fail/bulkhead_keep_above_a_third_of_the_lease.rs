//! A lease is kept no longer than its first renewal is due: `keep` above a third of the lease
//! would hold a slot for nothing.
use caracal::bulkhead;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[bulkhead(limit = 4, lease = "3s", keep = "1500ms")]
async fn f() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    drop(f());
}
