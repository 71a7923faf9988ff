//! Generic functions with where-clauses, lifetimes in arguments and in the result, `impl Trait`
//! arguments and const generics.
#![deny(warnings)]

use std::fmt::Display;

use caracal::{bulkhead, retry, timeout};

#[derive(Debug)]
struct ApiError(#[allow(dead_code)] caracal::Error);

impl From<caracal::Error> for ApiError {
    fn from(error: caracal::Error) -> Self {
        ApiError(error)
    }
}

#[bulkhead(limit = 2, scope = key)]
async fn generic<K, V>(key: K, values: &[V]) -> Result<Vec<String>, ApiError>
where
    K: Display,
    V: Display + Sync,
{
    Ok(values
        .iter()
        .map(|value| format!("{key}={value}"))
        .collect())
}

#[retry(max_attempts = 3)]
async fn borrowed<'a, 'b: 'a>(first: &'a str, _second: &'b str) -> Result<&'a str, ApiError> {
    Ok(first)
}

#[timeout("5s")]
async fn elided(text: &str) -> Result<&str, ApiError> {
    Ok(text.trim())
}

#[bulkhead(limit = 1, scope = tenant)]
async fn impl_trait(
    tenant: impl Display,
    items: impl IntoIterator<Item = u8>,
) -> Result<u32, ApiError> {
    Ok(items.into_iter().map(u32::from).sum())
}

#[bulkhead(limit = 1)]
async fn const_generic<const N: usize>(values: [u8; N]) -> Result<usize, ApiError> {
    Ok(values.len() + N)
}

struct Holder<'a>(&'a str);

impl<'a> Holder<'a> {
    #[retry(max_attempts = 2)]
    async fn get(&self) -> Result<&'a str, ApiError> {
        Ok(self.0)
    }
}

fn main() {
    drop(generic("k", &[1, 2]));
    drop(borrowed("a", "b"));
    drop(elided(" a "));
    drop(impl_trait("t", [1u8, 2]));
    drop(const_generic([1, 2, 3]));
    drop(Holder("x").get());
}
