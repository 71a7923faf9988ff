//! Only functions can be guarded.
use caracal::bulkhead;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[bulkhead(limit = 1)]
struct Order;

fn main() {
    let _ = Order;
}
