//! An adaptive limit, with literal and constant bounds.
use caracal::bulkhead;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

const MOST: u32 = 400;

#[bulkhead(name = "partner-api", limit = adaptive(min = 2, initial = 20, max = MOST),
           scope = format!("region:{region}"))]
async fn f(region: &str) -> Result<(), ApiError> {
    let _ = region;
    Ok(())
}

fn main() {
    drop(f("eu"));
}
