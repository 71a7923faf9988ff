//! `#[fallback]` on every kind of function: borrowed and owned arguments, methods taking
//! `&self`, `&mut self` and `self` (with `Self::handler` or a free function), generics, and in
//! every position of a pipeline.
#![deny(warnings)]

use caracal::{bulkhead, circuit_breaker, fallback, rate_limit, retry, timeout};

#[derive(Debug)]
struct ApiError(#[allow(dead_code)] caracal::Error);

impl From<caracal::Error> for ApiError {
    fn from(error: caracal::Error) -> Self {
        ApiError(error)
    }
}

async fn cached(region: &str, id: u64, _: caracal::Error) -> Result<String, ApiError> {
    Ok(format!("cached {id} in {region}"))
}

#[fallback(cached)]
#[circuit_breaker(scope = region)]
#[timeout("1s")]
#[retry(max_attempts = 3)]
#[bulkhead(limit = 2, scope = region)]
async fn get_order(region: &str, id: u64) -> Result<String, ApiError> {
    Ok(format!("order {id} in {region}"))
}

async fn queued(message: String, _: caracal::Error) -> Result<usize, ApiError> {
    Ok(message.len())
}

// Owned arguments: the body borrows, the handler gets them afterwards.
#[fallback(queued)]
#[rate_limit(rate = 5)]
async fn send(message: String) -> Result<usize, ApiError> {
    Ok(message.len() + 1)
}

// Inside a retry the handler may run once per attempt: its by-value arguments are `Copy`.
#[retry(max_attempts = 3)]
#[fallback(default_count)]
#[circuit_breaker]
async fn count(key: &str, seed: u64) -> Result<u64, ApiError> {
    Ok(key.len() as u64 + seed)
}

async fn default_count(_: &str, seed: u64, _: caracal::Error) -> Result<u64, ApiError> {
    Ok(seed)
}

struct Client {
    sent: u64,
    name: String,
}

impl Client {
    #[fallback(Self::stale)]
    #[timeout("1s")]
    async fn by_ref(&self, id: u64) -> Result<u64, ApiError> {
        Ok(id + self.sent)
    }

    async fn stale(&self, id: u64, _: caracal::Error) -> Result<u64, ApiError> {
        Ok(id)
    }

    #[fallback(Self::skip)]
    #[retry(max_attempts = 2)]
    #[bulkhead(limit = 1, scope = &self.name)]
    async fn by_mut(&mut self, id: u64) -> Result<u64, ApiError> {
        self.sent += id;
        Ok(self.sent)
    }

    async fn skip(&mut self, _: u64, _: caracal::Error) -> Result<u64, ApiError> {
        Ok(self.sent)
    }

    #[fallback(by_value_fallback)]
    #[circuit_breaker(scope = &self.name)]
    async fn by_value(self) -> Result<String, ApiError> {
        Ok(self.name.clone())
    }
}

// A free function can answer for a method: its first parameter takes what `self` is.
async fn by_value_fallback(client: Client, _: caracal::Error) -> Result<String, ApiError> {
    Ok(client.name)
}

async fn fallback_generic<T: Clone>(value: T, _: caracal::Error) -> Result<T, ApiError> {
    Ok(value)
}

#[fallback(fallback_generic)]
#[bulkhead(limit = 1, local)]
async fn generic<T: Clone>(value: T) -> Result<T, ApiError> {
    Ok(value.clone())
}

fn main() {
    drop(get_order("eu", 1));
    drop(send(String::new()));
    drop(count("k", 1));
    let mut client = Client {
        sent: 0,
        name: "c".to_owned(),
    };
    drop(client.by_ref(1));
    drop(client.by_mut(1));
    drop(client.by_value());
    drop(generic(1u8));
}
