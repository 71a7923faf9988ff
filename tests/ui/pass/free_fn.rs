//! A free function: `?`, early `return`, every bulkhead argument, a literal scope.
#![deny(warnings)]

use caracal::bulkhead;

#[derive(Debug)]
enum ApiError {
    Resilience(caracal::Error),
    Parse(std::num::ParseIntError),
    Empty,
}

impl From<caracal::Error> for ApiError {
    fn from(error: caracal::Error) -> Self {
        ApiError::Resilience(error)
    }
}

impl From<std::num::ParseIntError> for ApiError {
    fn from(error: std::num::ParseIntError) -> Self {
        ApiError::Parse(error)
    }
}

/// Doc comments and other attributes stay on the function.
#[must_use]
#[bulkhead(
    name = "parser",
    operation = "parse",
    limit = 20,
    lease = "10s",
    max_wait = "250ms",
    scope = "tenant:1"
)]
#[inline]
pub async fn parse(text: &str) -> Result<u32, ApiError> {
    #![allow(clippy::needless_return)]
    if text.is_empty() {
        return Err(ApiError::Empty);
    }
    let number: u32 = text.trim().parse()?;
    Ok(number)
}

fn main() {
    let future = parse("42");
    drop(future);
    let _ = ApiError::Resilience(caracal::Error::NotInstalled);
}
