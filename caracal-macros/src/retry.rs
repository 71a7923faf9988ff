//! `#[retry]`: its settings, and the loop it runs the layers inside it in.

use std::time::Duration;

use caracal_spec::Human;
use caracal_spec::retry as spec;
use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::Path;

use crate::args::Args;
use crate::durations::{self, duration};
use crate::layer::{Frame, Kind, Layer, Place, Written, typed_fn};
use crate::names::hygienic;
use crate::values::{Value, integer};

/// The attribute.
pub(crate) const KIND: Kind = Kind {
    name: spec::KIND.name,
    parse,
};

fn parse(written: Written, _: &str) -> syn::Result<Box<dyn Layer>> {
    let args = Args::parse(&spec::KIND, written.anchor, written.args)?;
    Ok(Box::new(Retry::parse(args, written.span)?))
}

struct Retry {
    max_attempts: Value<u32>,
    backoff: Duration,
    max_backoff: Duration,
    when: Option<Path>,
    /// The attribute's name: where a retry re-runs the body from.
    span: Span,
}

impl Retry {
    fn parse(mut args: Args, span: Span) -> syn::Result<Self> {
        let max_attempts = args.required(&spec::MAX_ATTEMPTS, integer);
        let backoff = args
            .setting(&spec::BACKOFF, duration)
            .unwrap_or(spec::BACKOFF.default.duration());
        let max_backoff = args
            .setting(&spec::MAX_BACKOFF, duration)
            .unwrap_or(spec::MAX_BACKOFF.default.duration());
        let when = args.function(&spec::WHEN);
        if args.all_valid() && max_backoff < backoff {
            if args.has("max_backoff") {
                args.conflict(
                    "max_backoff",
                    "`max_backoff` must not be shorter than `backoff`",
                );
            } else {
                args.conflict(
                    "backoff",
                    format!(
                        "`backoff` is longer than `max_backoff` ({} by default); raise `max_backoff` too",
                        Human(spec::MAX_BACKOFF.default.duration())
                    ),
                );
            }
        }
        args.finish(|| {
            Some(Retry {
                max_attempts: max_attempts?,
                backoff,
                max_backoff,
                when,
                span,
            })
        })
    }
}

impl Layer for Retry {
    fn site(&self, frame: &Frame<'_>) -> (TokenStream, TokenStream) {
        let identity = &frame.identity;
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

    fn wrap(&self, place: &Place, frame: &Frame<'_>, inner: TokenStream) -> TokenStream {
        let Place { site, ctx, .. } = place;
        let call_scope = &frame.scope;
        let when = match &self.when {
            Some(path) => typed_fn(path, frame.output, quote!(E), quote!(bool)),
            None => quote!(::caracal::__private::RetryBodyErrors),
        };
        let state = hygienic("__caracal_retry");
        let outcome = hygienic("__caracal_outcome");
        let result = hygienic("__caracal_result");
        // A loop, not a closure, so a body borrowing `&mut self` can run once per attempt.
        quote!(async {
            let mut #state =
                ::caracal::__private::Retry::new(&#site, #ctx, #call_scope, #when);
            loop {
                let #outcome = #inner.await;
                if let ::caracal::__private::ControlFlow::Break(#result) =
                    #state.settle(#outcome).await
                {
                    break #result;
                }
            }
        })
    }

    fn retry_span(&self) -> Option<Span> {
        Some(self.span)
    }
}
