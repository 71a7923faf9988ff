//! `#[bulkhead]`: its settings, and the admission it wraps around each attempt.

use std::time::Duration;

use caracal_spec::bulkhead as spec;
use proc_macro2::TokenStream;
use quote::quote;

use crate::args::Args;
use crate::durations::{self, duration};
use crate::identity::Identity;
use crate::layer::{Frame, Kind, Layer, Place, Written, pinned};
use crate::values::{Value, integer};

/// The attribute.
pub(crate) const KIND: Kind = Kind {
    name: spec::KIND.name,
    parse,
};

fn parse(written: Written, function: &str) -> syn::Result<Box<dyn Layer>> {
    let args = Args::parse(&spec::KIND, written.anchor, written.args)?;
    Ok(Box::new(Bulkhead::parse(args, function)?))
}

struct Bulkhead {
    identity: Identity,
    limit: Value<u32>,
    lease: Duration,
    max_wait: Option<Duration>,
}

impl Bulkhead {
    fn parse(mut args: Args, function: &str) -> syn::Result<Self> {
        let identity = Identity::parse(&mut args, function);
        let limit = args.required(&spec::LIMIT, integer);
        let lease = args.setting(&spec::LEASE, duration);
        let max_wait = args.setting(&spec::MAX_WAIT, duration);
        if identity.local && args.has("lease") {
            args.conflict(
                "lease",
                "`lease` has no effect on a `local` bulkhead: a local holder cannot outlive its process",
            );
        }
        args.finish(|| {
            Some(Bulkhead {
                identity,
                limit: limit?,
                lease: lease.unwrap_or(spec::LEASE.default.duration()),
                max_wait,
            })
        })
    }
}

impl Layer for Bulkhead {
    fn per_attempt(&self) -> bool {
        true
    }

    fn identity(&self) -> Option<&Identity> {
        Some(&self.identity)
    }

    fn site(&self, _: &Frame<'_>) -> (TokenStream, TokenStream) {
        let identity = self.identity.fields();
        let limit = self.limit.tokens();
        let lease = durations::tokens(self.lease);
        let max_wait = durations::optional_tokens(self.max_wait);
        (
            quote!(::caracal::__private::BulkheadSite),
            quote!(::caracal::__private::BulkheadSite::new(::caracal::__private::BulkheadConfig {
                #identity
                limit: #limit,
                lease: #lease,
                max_wait: #max_wait,
            })),
        )
    }

    fn wrap(&self, place: &Place, _: &Frame<'_>, inner: TokenStream) -> TokenStream {
        let Place { site, scope, ctx } = place;
        let inner = pinned(inner);
        quote!(::caracal::__private::bulkhead(&#site, &#ctx, &#scope, #inner))
    }
}
