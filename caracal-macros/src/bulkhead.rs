//! `#[bulkhead]` settings.

use std::time::Duration;

use proc_macro2::TokenStream;
use quote::quote;

use crate::args::Args;
use crate::durations::{self, DAY, MILLISECOND, duration};
use crate::identity::{self, Identity};
use crate::values::{Value, integer};

pub(crate) const ARGS: &[&[&str]] = &[&["limit", "lease", "max_wait"], identity::ARGS];

const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Renewal runs every `lease / 3`: below this a lease is mostly renewal traffic.
const MIN_LEASE: Duration = Duration::from_millis(100);

pub(crate) struct Bulkhead {
    pub(crate) identity: Identity,
    limit: Value<u32>,
    lease: Duration,
    max_wait: Option<Duration>,
}

impl Bulkhead {
    pub(crate) fn parse(mut args: Args, function: &str) -> syn::Result<Self> {
        let identity = Identity::parse(&mut args, function);
        let limit = args.require("limit", "limit = 20", integer(1..=1_000_000));
        let lease = args.get("lease", duration(MIN_LEASE, DAY));
        let max_wait = args.get("max_wait", duration(MILLISECOND, DAY));
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
                lease: lease.unwrap_or(DEFAULT_LEASE),
                max_wait,
            })
        })
    }

    /// The call site's `static`: its type and initializer.
    pub(crate) fn site(&self) -> (TokenStream, TokenStream) {
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
}
