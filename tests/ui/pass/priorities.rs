//! `thresholds(…)` and `priority = expr` on the attributes that take them, with constants,
//! methods of the arguments and `self`.
#![deny(warnings)]

use caracal::{Priority, bulkhead, rate_limit, retry};

#[derive(Debug)]
struct ApiError(#[allow(dead_code)] caracal::Error);

impl From<caracal::Error> for ApiError {
    fn from(error: caracal::Error) -> Self {
        ApiError(error)
    }
}

const CHECKOUT: Priority = Priority::Critical;

fn class(tenant: &str) -> Priority {
    if tenant == "checkout" {
        CHECKOUT
    } else {
        Priority::Sheddable
    }
}

#[retry(max_attempts = 3)]
#[rate_limit(rate = 100, burst = 20, thresholds(sheddable = 0.25), priority = class(tenant))]
#[bulkhead(
    limit = 30,
    scope = tenant,
    thresholds(normal = 0.8, sheddable = 0.5),
    priority = class(tenant)
)]
async fn both(tenant: &str) -> Result<(), ApiError> {
    Ok(())
}

#[bulkhead(limit = 2, local, thresholds(normal = 1), priority = CHECKOUT)]
async fn local() -> Result<(), ApiError> {
    Ok(())
}

// `sheddable` left out: it has `normal`'s share.
#[rate_limit(rate = 10, burst = 5, thresholds(normal = 0.8))]
async fn normal_alone() -> Result<(), ApiError> {
    Ok(())
}

struct Client {
    class: Priority,
}

impl Client {
    #[bulkhead(limit = 4, priority = self.class)]
    async fn call(&self) -> Result<(), ApiError> {
        Ok(())
    }
}

fn main() {
    drop(both("checkout"));
    drop(local());
    drop(normal_alone());
    drop(Client { class: Priority::Normal }.call());
}
