//! Inherent methods taking `&self`, `&mut self` and `self`, with scopes over `self`.
#![deny(warnings)]

use caracal::{bulkhead, circuit_breaker, rate_limit, retry, timeout};

#[derive(Debug)]
struct ApiError(#[allow(dead_code)] caracal::Error);

impl From<caracal::Error> for ApiError {
    fn from(error: caracal::Error) -> Self {
        ApiError(error)
    }
}

struct Client {
    tenant: String,
    region: &'static str,
    sent: u64,
}

impl Client {
    #[bulkhead(limit = 10, scope = &self.tenant)]
    async fn by_ref(&self, id: u64) -> Result<u64, ApiError> {
        Ok(id + self.sent)
    }

    #[retry(max_attempts = 3, backoff = "10ms")]
    #[rate_limit(rate = 5, scope = format!("{}/{}", self.region, self.tenant))]
    async fn by_mut(&mut self, id: u64) -> Result<u64, ApiError> {
        self.sent += 1;
        Ok(id)
    }

    #[circuit_breaker(scope = self.region)]
    #[timeout("1s")]
    async fn by_value(self) -> Result<String, ApiError> {
        Ok(self.tenant)
    }

    #[bulkhead(limit = 1)]
    async fn associated(id: u64) -> Result<u64, ApiError> {
        Ok(id)
    }

    #[bulkhead(limit = 1)]
    async fn boxed(self: Box<Self>) -> Result<u64, ApiError> {
        Ok(self.sent)
    }
}

fn main() {
    let mut client = Client {
        tenant: "t".to_owned(),
        region: "eu",
        sent: 0,
    };
    drop(client.by_ref(1));
    drop(client.by_mut(1));
    drop(client.by_value());
    drop(Client::associated(1));
    let client = Client {
        tenant: "t".to_owned(),
        region: "eu",
        sent: 0,
    };
    drop(Box::new(client).boxed());
}
