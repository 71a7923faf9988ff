//! `#[rate_limit]`: its settings, and the admission it wraps around each attempt.

use caracal_spec::rate_limit as spec;
use proc_macro2::TokenStream;
use quote::quote;

use crate::args::Args;
use crate::identity::Identity;
use crate::layer::{Frame, Kind, Layer, Place, Written, pinned};
use crate::priority::{Priority, Thresholds};
use crate::values::{Value, boolean, integer, number};

/// The attribute.
pub(crate) const KIND: Kind = Kind {
    name: spec::KIND.name,
    parse,
};

fn parse(written: Written, function: &str) -> syn::Result<Box<dyn Layer>> {
    let mut args = Args::parse(&spec::KIND, written.anchor, written.args)?;
    let identity = Identity::parse(&mut args, function);
    // The message about a constant out of range says no more than the bounds, as it always has.
    let rate = args.required(&spec::RATE, |key| number(key, ""));
    let burst = args.setting(&spec::BURST, integer);
    let prefetch = args.setting(&spec::PREFETCH, integer);
    let shadow = args
        .setting(&spec::SHADOW, boolean)
        .unwrap_or(spec::SHADOW.default.flag());
    let thresholds = Thresholds::parse(&mut args);
    let priority = Priority::parse(&mut args);
    if identity.local && args.has("prefetch") {
        args.conflict(
            "prefetch",
            "`prefetch` has no effect on a `local` rate limit: a local admission costs no round trip",
        );
    }
    args.finish(|| {
        Some(Box::new(RateLimit {
            identity,
            rate: rate?,
            burst: burst.unwrap_or(Value::Literal(spec::BURST.default.integer())),
            prefetch: prefetch.unwrap_or(Value::Literal(spec::PREFETCH.default.integer())),
            shadow,
            thresholds,
            priority,
        }) as Box<dyn Layer>)
    })
}

struct RateLimit {
    identity: Identity,
    rate: Value<f64>,
    burst: Value<u32>,
    prefetch: Value<u32>,
    shadow: bool,
    thresholds: Thresholds,
    priority: Priority,
}

impl Layer for RateLimit {
    fn per_attempt(&self) -> bool {
        true
    }

    fn reads_ctx_alone(&self) -> bool {
        false
    }

    fn identity(&self) -> Option<&Identity> {
        Some(&self.identity)
    }

    fn site(&self, _: &Frame<'_>) -> (TokenStream, TokenStream) {
        let identity = self.identity.fields();
        let rate = self.rate.tokens();
        let burst = self.burst.tokens();
        let prefetch = self.prefetch.tokens();
        let shadow = self.shadow;
        let thresholds = self.thresholds.tokens();
        (
            quote!(::caracal::__private::RateLimitSite),
            quote!(::caracal::__private::RateLimitSite::new(::caracal::__private::RateLimitConfig {
                #identity
                rate: #rate,
                burst: #burst,
                shadow: #shadow,
                thresholds: #thresholds,
                prefetch: #prefetch,
            })),
        )
    }

    fn per_call(&self, place: &Place) -> TokenStream {
        self.priority.per_call(place)
    }

    fn wrap(&self, place: &Place, _: &Frame<'_>, inner: TokenStream) -> TokenStream {
        let Place {
            site, scope, ctx, ..
        } = place;
        let inner = pinned(inner);
        let admission = quote!(::caracal::__private::rate_limit(&#site, #ctx, #scope, #inner));
        self.priority.wrap(place, admission)
    }
}
