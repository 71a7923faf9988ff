//! Methods of `#[async_trait]` impls: `#[async_trait]` on the impl expands first and rewrites
//! each method into a `fn` returning a boxed future; the caracal attributes then guard the
//! body inside it.
#![deny(warnings)]

use async_trait::async_trait;
use caracal::{bulkhead, circuit_breaker, fallback, rate_limit, retry, timeout};

#[derive(Debug)]
struct ApiError(#[allow(dead_code)] caracal::Error);

impl From<caracal::Error> for ApiError {
    fn from(error: caracal::Error) -> Self {
        ApiError(error)
    }
}

#[async_trait]
trait Store {
    async fn get(&self, key: &str) -> Result<Option<String>, ApiError>;
    async fn put(&mut self, key: String, value: String) -> Result<(), ApiError>;
    async fn size(self) -> Result<usize, ApiError>;
}

struct Memory {
    tenant: String,
    entries: Vec<(String, String)>,
}

#[async_trait]
impl Store for Memory {
    #[fallback(Self::missing)]
    #[circuit_breaker(scope = &self.tenant)]
    #[timeout("1s")]
    #[bulkhead(limit = 4, scope = key)]
    async fn get(&self, key: &str) -> Result<Option<String>, ApiError> {
        Ok(self
            .entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone()))
    }

    #[retry(max_attempts = 2)]
    #[rate_limit(rate = 10, scope = format!("{}/{key}", self.tenant))]
    async fn put(&mut self, key: String, value: String) -> Result<(), ApiError> {
        self.entries.push((key.clone(), value.clone()));
        Ok(())
    }

    #[bulkhead(limit = 1, scope = &self.tenant)]
    async fn size(self) -> Result<usize, ApiError> {
        Ok(self.entries.len())
    }
}

impl Memory {
    async fn missing(&self, _: &str, _: caracal::Error) -> Result<Option<String>, ApiError> {
        Ok(None)
    }
}

// `?Send`: the boxed future is not `Send`.
#[async_trait(?Send)]
trait Local {
    async fn call(&self, id: u64) -> Result<u64, ApiError>;
}

#[async_trait(?Send)]
impl Local for std::rc::Rc<u64> {
    #[retry(max_attempts = 2)]
    async fn call(&self, id: u64) -> Result<u64, ApiError> {
        Ok(**self + id)
    }
}

fn assert_send<F: Send>(future: F) -> F {
    future
}

fn main() {
    let mut store = Memory {
        tenant: "t".to_owned(),
        entries: Vec::new(),
    };
    drop(assert_send(store.get("k")));
    drop(assert_send(store.put("k".to_owned(), "v".to_owned())));
    drop(assert_send(store.size()));
    drop(std::rc::Rc::new(1).call(1));
}
