//! The expansion uses absolute paths and names of its own: it works next to a user's `Result`
//! alias, `Option`, `Duration`, a module named `core`, and arguments or locals named like the
//! expansion's variables.
#![deny(warnings)]
#![allow(non_camel_case_types, non_upper_case_globals, dead_code)]

use caracal::{bulkhead, circuit_breaker, retry, timeout};

#[derive(Debug)]
pub struct ApiError(caracal::Error);

impl From<caracal::Error> for ApiError {
    fn from(error: caracal::Error) -> Self {
        ApiError(error)
    }
}

type Result<T> = std::result::Result<T, ApiError>;

mod core {
    pub mod option {
        pub enum Option {
            None,
        }
    }
}

enum Option {
    Nothing,
}

struct Duration;

struct CallCtx;

mod api {
    pub type Result<T> = std::result::Result<T, super::ApiError>;
}

#[circuit_breaker]
#[timeout("1s")]
#[retry(max_attempts = 2)]
#[bulkhead(limit = 1, max_wait = "1s", scope = __caracal_scope_0)]
async fn shadowed(__caracal_ctx: u8, __caracal_scope_0: &str, __caracal_retry: u8) -> Result<u8> {
    static __CARACAL_0: u8 = 7;
    let __caracal_outcome = __caracal_ctx + __caracal_retry + __CARACAL_0;
    let _ = (
        Option::Nothing,
        Duration,
        CallCtx,
        core::option::Option::None,
    );
    let _ = __caracal_scope_0;
    Ok(__caracal_outcome)
}

#[bulkhead(limit = 1)]
async fn aliased() -> api::Result<()> {
    Ok(())
}

#[bulkhead(limit = 1)]
async fn r#type(r#match: u8) -> Result<u8> {
    Ok(r#match)
}

fn main() {
    drop(shadowed(1, "s", 2));
    drop(aliased());
    drop(r#type(1));
}
