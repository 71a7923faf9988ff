//! The generated future is `Send` whenever the body is, so guarded functions can be spawned.
#![deny(warnings)]

use std::sync::Arc;

use caracal::{bulkhead, circuit_breaker, rate_limit, retry, timeout};

#[derive(Debug)]
struct ApiError(#[allow(dead_code)] caracal::Error);

impl From<caracal::Error> for ApiError {
    fn from(error: caracal::Error) -> Self {
        ApiError(error)
    }
}

fn assert_send<F: Send>(_: F) {}

struct Client {
    tenant: Arc<str>,
}

impl Client {
    #[circuit_breaker(scope = self.tenant.clone())]
    #[timeout("2s")]
    #[retry(max_attempts = 3, backoff = "100ms")]
    #[bulkhead(limit = 20, scope = &self.tenant)]
    #[rate_limit(rate = 10, scope = "fixed")]
    async fn call(&mut self, id: u64) -> Result<u64, ApiError> {
        tokio::task::yield_now().await;
        Ok(id)
    }
}

#[bulkhead(limit = 1, scope = format!("region:{region}"))]
async fn free(region: &str) -> Result<(), ApiError> {
    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    Ok(())
}

fn main() {
    let mut client = Client {
        tenant: Arc::from("t"),
    };
    assert_send(client.call(1));
    assert_send(free("eu"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let handle = tokio::spawn(free("eu"));
        // No coordinator is installed: the bulkhead's rejection arrives as the function's error.
        assert!(matches!(
            handle.await.unwrap(),
            Err(ApiError(caracal::Error::NotInstalled))
        ));
    });
}
