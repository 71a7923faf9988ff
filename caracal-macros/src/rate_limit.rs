//! `#[rate_limit]` settings.

use proc_macro2::TokenStream;
use quote::quote;

use crate::args::Args;
use crate::identity::{self, Identity};
use crate::values::{Value, integer, number};

pub(crate) const ARGS: &[&[&str]] = &[&["rate", "burst"], identity::ARGS];

pub(crate) struct RateLimit {
    pub(crate) identity: Identity,
    rate: Value<f64>,
    burst: Value<u32>,
}

impl RateLimit {
    pub(crate) fn parse(mut args: Args, function: &str) -> syn::Result<Self> {
        let identity = Identity::parse(&mut args, function);
        // Below a millionth per second (one admission every ~11.6 days) a rate is a typo.
        let rate = args.require("rate", "rate = 10", number(0.000_001, 1_000_000.0, ""));
        let burst = args.get("burst", integer(1..=1_000_000));
        args.finish(|| {
            Some(RateLimit {
                identity,
                rate: rate?,
                burst: burst.unwrap_or(Value::Literal(1)),
            })
        })
    }

    /// The call site's `static`: its type and initializer.
    pub(crate) fn site(&self) -> (TokenStream, TokenStream) {
        let identity = self.identity.fields();
        let rate = self.rate.tokens();
        let burst = self.burst.tokens();
        (
            quote!(::caracal::__private::RateLimitSite),
            quote!(::caracal::__private::RateLimitSite::new(::caracal::__private::RateLimitConfig {
                #identity
                rate: #rate,
                burst: #burst,
            })),
        )
    }
}
