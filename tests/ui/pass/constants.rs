//! Constant expressions for numeric arguments, and paths to a `const &str` for `name` and
//! `operation`: checked at compile time like literals.
#![deny(warnings)]

use caracal::{bulkhead, circuit_breaker, rate_limit, retry};

#[derive(Debug)]
struct ApiError(#[allow(dead_code)] caracal::Error);

impl From<caracal::Error> for ApiError {
    fn from(error: caracal::Error) -> Self {
        ApiError(error)
    }
}

const MAX_PARTNER_CALLS: u32 = 20;
const PARTNER: &str = "partner-api";
const THRESHOLD: f64 = 0.25;
const PER_SECOND: f64 = 2.5;

mod limits {
    pub const ATTEMPTS: u32 = 3;
    pub const OPERATION: &str = "get-order";
    pub const WINDOW: u32 = 200;
}

const fn doubled(n: u32) -> u32 {
    n * 2
}

#[bulkhead(name = PARTNER, operation = limits::OPERATION, limit = MAX_PARTNER_CALLS)]
#[circuit_breaker(
    name = PARTNER,
    minimum_throughput = MAX_PARTNER_CALLS * 5,
    window_size = limits::WINDOW,
    failure_threshold = THRESHOLD,
    slow_call = "2s",
    slow_call_threshold = THRESHOLD * 2.0,
    half_open_probes = doubled(2),
    half_open_successes = (MAX_PARTNER_CALLS / 10),
)]
#[retry(max_attempts = limits::ATTEMPTS)]
async fn get_order(id: u64) -> Result<u64, ApiError> {
    Ok(id)
}

// Integer literals in an arithmetic `rate` count as floats; a float constant mixes in.
#[rate_limit(rate = 10 * 60, burst = MAX_PARTNER_CALLS + 1)]
async fn per_hour() -> Result<(), ApiError> {
    Ok(())
}

#[rate_limit(rate = PER_SECOND * 2, burst = 1)]
async fn mixed() -> Result<(), ApiError> {
    Ok(())
}

// A constant `minimum_throughput` checked against the default `window_size` (100), and a
// constant `window_size` against the default `minimum_throughput` (20).
#[circuit_breaker(minimum_throughput = MAX_PARTNER_CALLS)]
async fn default_window() -> Result<(), ApiError> {
    Ok(())
}

#[circuit_breaker(window_size = MAX_PARTNER_CALLS)]
async fn default_minimum() -> Result<(), ApiError> {
    Ok(())
}

struct Client;

impl Client {
    const LIMIT: u32 = 4;

    // An associated constant, named through the type.
    #[bulkhead(limit = Client::LIMIT)]
    async fn call(&self) -> Result<(), ApiError> {
        Ok(())
    }
}

fn main() {
    drop(get_order(1));
    drop(per_hour());
    drop(mixed());
    drop(default_window());
    drop(default_minimum());
    drop(Client.call());
}
