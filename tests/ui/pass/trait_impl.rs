//! Methods of trait impls, generic and not.
#![deny(warnings)]

use caracal::{bulkhead, retry};

#[derive(Debug)]
struct ApiError(#[allow(dead_code)] caracal::Error);

impl From<caracal::Error> for ApiError {
    fn from(error: caracal::Error) -> Self {
        ApiError(error)
    }
}

trait Store {
    async fn get(&self, key: &str) -> Result<Option<String>, ApiError>;
    async fn put(&mut self, key: String, value: String) -> Result<(), ApiError>;
}

struct Memory(Vec<(String, String)>);

impl Store for Memory {
    #[bulkhead(limit = 4, scope = key)]
    async fn get(&self, key: &str) -> Result<Option<String>, ApiError> {
        Ok(self
            .0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone()))
    }

    #[retry(max_attempts = 2)]
    async fn put(&mut self, key: String, value: String) -> Result<(), ApiError> {
        self.0.push((key.clone(), value.clone()));
        Ok(())
    }
}

trait Fetch<T> {
    async fn fetch(&self, item: T) -> Result<T, ApiError>;
}

impl<T: Clone + std::fmt::Display> Fetch<T> for Memory {
    #[bulkhead(limit = 4, scope = &item)]
    async fn fetch(&self, item: T) -> Result<T, ApiError> {
        Ok(item)
    }
}

fn main() {
    let mut store = Memory(Vec::new());
    drop(store.get("k"));
    drop(store.put("k".to_owned(), "v".to_owned()));
    drop(store.fetch(1u8));
}
