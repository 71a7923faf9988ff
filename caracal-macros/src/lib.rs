//! Attribute macros behind `caracal`. Use them through the `caracal` crate.
#![forbid(unsafe_code)]

use proc_macro::TokenStream;

macro_rules! passthrough {
    ($($name:ident),*) => {$(
        #[doc = concat!("`#[", stringify!($name), "]`: see the `caracal` crate.")]
        #[proc_macro_attribute]
        pub fn $name(_args: TokenStream, item: TokenStream) -> TokenStream {
            item
        }
    )*};
}

passthrough!(bulkhead, circuit_breaker, rate_limit, retry, timeout);
