//! On an `#[async_trait]` impl, the attribute goes on the method, not on the impl.
use async_trait::async_trait;
use caracal::retry;

struct ApiError;

impl From<caracal::Error> for ApiError {
    fn from(_: caracal::Error) -> Self {
        ApiError
    }
}

#[async_trait]
trait Api {
    async fn get(&self) -> Result<(), ApiError>;
}

struct Client;

#[retry(max_attempts = 3)]
#[async_trait]
impl Api for Client {
    async fn get(&self) -> Result<(), ApiError> {
        Ok(())
    }
}

fn main() {
    drop(Client.get());
}
