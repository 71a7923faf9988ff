//! `#[retry]` settings.

use std::time::Duration;

use proc_macro2::TokenStream;
use quote::quote;
use syn::Path;

use crate::args::{Args, path};
use crate::durations::{self, DAY, duration};
use crate::values::{Value, integer};

pub(crate) const ARGS: &[&[&str]] = &[&["max_attempts", "backoff", "max_backoff", "when"]];

const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(10);

pub(crate) struct Retry {
    max_attempts: Value<u32>,
    backoff: Duration,
    max_backoff: Duration,
    when: Option<Path>,
}

impl Retry {
    pub(crate) fn parse(mut args: Args) -> syn::Result<Self> {
        let max_attempts = args.require("max_attempts", "max_attempts = 3", integer(1..=1000));
        let backoff = args
            .get("backoff", duration(Duration::ZERO, DAY))
            .unwrap_or_default();
        let max_backoff = args
            .get("max_backoff", duration(Duration::ZERO, DAY))
            .unwrap_or(DEFAULT_MAX_BACKOFF);
        let when = args.get("when", path("fn(&E) -> bool"));
        if args.all_valid() && max_backoff < backoff {
            if args.has("max_backoff") {
                args.conflict(
                    "max_backoff",
                    "`max_backoff` must not be shorter than `backoff`",
                );
            } else {
                args.conflict(
                    "backoff",
                    "`backoff` is longer than `max_backoff` (10s by default); raise `max_backoff` too",
                );
            }
        }
        args.finish(|| {
            Some(Retry {
                max_attempts: max_attempts?,
                backoff,
                max_backoff,
                when,
            })
        })
    }

    /// The call site's `static`: its type and initializer; `identity` is what its events
    /// report.
    pub(crate) fn site(&self, identity: &TokenStream) -> (TokenStream, TokenStream) {
        let max_attempts = self.max_attempts.tokens();
        let backoff = durations::tokens(self.backoff);
        let max_backoff = durations::tokens(self.max_backoff);
        (
            quote!(::caracal::__private::RetryConfig),
            quote!(::caracal::__private::RetryConfig {
                identity: #identity,
                max_attempts: #max_attempts,
                backoff: #backoff,
                max_backoff: #max_backoff,
            }),
        )
    }

    /// The `when` function, if one was given.
    pub(crate) fn when(&self) -> Option<&Path> {
        self.when.as_ref()
    }
}
