//! Error types the one-time `From<caracal::Error>` check accepts: a generic parameter bounded by
//! it, an associated type, and and a boxed `dyn Error`.
#![deny(warnings)]

use caracal::{bulkhead, circuit_breaker, fallback, retry};

#[bulkhead(limit = 1)]
async fn generic<E: From<caracal::Error>>() -> Result<(), E> {
    Ok(())
}

#[retry(max_attempts = 2)]
async fn where_clause<E>() -> Result<u8, E>
where
    E: From<caracal::Error> + std::fmt::Debug,
{
    Ok(1)
}

trait Service {
    type Error: From<caracal::Error>;
    async fn call(&self) -> Result<(), Self::Error>;
}

struct Boxed;

impl Service for Boxed {
    type Error = Box<dyn std::error::Error + Send + Sync>;

    #[fallback(Self::answer)]
    #[circuit_breaker]
    async fn call(&self) -> Result<(), Self::Error> {
        Ok(())
    }
}

impl Boxed {
    async fn answer(
        &self,
        rejection: caracal::Error,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        Err(rejection.into())
    }
}

fn main() {
    drop(generic::<caracal::Error>());
    drop(where_clause::<caracal::Error>());
    drop(Boxed.call());
}
