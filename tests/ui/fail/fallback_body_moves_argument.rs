//! The handler gets the arguments after the body: the body may not move one out.
use caracal::fallback;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

async fn handler(name: String, _: caracal::Error) -> Result<String, ApiError> {
    Ok(name)
}

#[fallback(handler)]
async fn f(name: String) -> Result<String, ApiError> {
    Ok(name)
}

fn main() {
    drop(f(String::new()));
}
