//! A constant cannot be named through `Self`: the settings live outside the impl.
use caracal::bulkhead;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

struct Client;

impl Client {
    const LIMIT: u32 = 4;

    #[bulkhead(limit = Self::LIMIT)]
    async fn call(&self) -> Result<(), ApiError> {
        Ok(())
    }
}

fn main() {
    drop(Client.call());
}
