//! `#[hedge]` on something that is no `async fn` with a body.
use caracal::hedge;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[hedge(delay = "50ms")]
struct Client;

#[hedge(delay = "50ms")]
fn not_async() -> Result<(), ApiError> {
    Ok(())
}

fn main() {
    let _ = Client;
    let _ = not_async();
}
