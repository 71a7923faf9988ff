//! `#[bulkhead]`: its settings, and the admission it wraps around each attempt.

use std::time::Duration;

use caracal_spec::bulkhead as spec;
use caracal_spec::{Human, Key};
use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::Expr;

use crate::args::{Args, Convert};
use crate::durations::{self, duration};
use crate::identity::Identity;
use crate::layer::{Frame, Kind, Layer, Place, Written, pinned};
use crate::names::hygienic;
use crate::priority::{Priority, Thresholds};
use crate::values::{Value, boolean, integer};

/// `limit = N`, or `limit = adaptive(min = …, initial = …, max = …)`.
enum Limit {
    Fixed(Value<u32>),
    /// min, initial, max.
    Adaptive([Value<u32>; 3]),
}

const BOUNDS: [&str; 3] = ["min", "initial", "max"];

/// Reads `limit`: a count, or an adaptive limit's bounds, each a count in the key's range,
/// written as literals in order when they are literals (constants are checked in order where
/// the site is compiled).
fn limit(key: &'static Key) -> impl Convert<Limit> {
    move |name, value| {
        let Expr::Call(call) = value else {
            return integer(key)(name, value).map(Limit::Fixed);
        };
        let Expr::Path(function) = &*call.func else {
            return integer(key)(name, value).map(Limit::Fixed);
        };
        if !function.path.is_ident("adaptive") {
            return Err(syn::Error::new_spanned(
                &call.func,
                "`limit` is a count (`limit = 20`) or `adaptive(min = 2, initial = 20, max = 400)`",
            ));
        }
        let mut bounds: [Option<Value<u32>>; 3] = [None, None, None];
        for arg in &call.args {
            let named = match arg {
                Expr::Assign(assign) => match &*assign.left {
                    Expr::Path(left) => BOUNDS
                        .iter()
                        .position(|bound| left.path.is_ident(bound))
                        .map(|at| (at, &*assign.right)),
                    _ => None,
                },
                _ => None,
            };
            let Some((at, right)) = named else {
                return Err(syn::Error::new_spanned(
                    arg,
                    "`adaptive` takes `min = …`, `initial = …` and `max = …`",
                ));
            };
            if bounds[at].is_some() {
                return Err(syn::Error::new_spanned(
                    arg,
                    format!("`{}` is given twice", BOUNDS[at]),
                ));
            }
            bounds[at] = Some(integer(key)(BOUNDS[at], right)?);
        }
        let [Some(min), Some(initial), Some(max)] = bounds else {
            let missing: Vec<_> = BOUNDS
                .iter()
                .zip(&bounds)
                .filter(|(_, bound)| bound.is_none())
                .map(|(name, _)| format!("`{name}`"))
                .collect();
            return Err(syn::Error::new_spanned(
                call,
                format!(
                    "`adaptive` needs {}: `adaptive(min = 2, initial = 20, max = 400)`",
                    missing.join(" and ")
                ),
            ));
        };
        if let [
            Value::Literal(low),
            Value::Literal(start),
            Value::Literal(high),
        ] = [&min, &initial, &max]
            && !(low <= start && start <= high)
        {
            return Err(syn::Error::new_spanned(
                call,
                format!("`adaptive` needs min ≤ initial ≤ max, not {low}, {start}, {high}"),
            ));
        }
        Ok(Limit::Adaptive([min, initial, max]))
    }
}

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
    limit: Limit,
    lease: Duration,
    max_wait: Option<Duration>,
    keep: Option<Duration>,
    shadow: bool,
    thresholds: Thresholds,
    priority: Priority,
}

impl Bulkhead {
    fn parse(mut args: Args, function: &str) -> syn::Result<Self> {
        let identity = Identity::parse(&mut args, function);
        let limit = args.required(&spec::LIMIT, limit);
        let lease = args.setting(&spec::LEASE, duration);
        let max_wait = args.setting(&spec::MAX_WAIT, duration);
        let keep = args.setting(&spec::KEEP, duration);
        let shadow = args
            .setting(&spec::SHADOW, boolean)
            .unwrap_or(spec::SHADOW.default.flag());
        let thresholds = Thresholds::parse(&mut args);
        let priority = Priority::parse(&mut args);
        if identity.local && matches!(limit, Some(Limit::Adaptive(..))) {
            args.conflict(
                "limit",
                "an adaptive limit is the fleet's, computed from every process's calls: a `local` \
                 bulkhead takes a number (`limit = 20`)",
            );
        }
        if identity.local && args.has("keep") {
            args.conflict(
                "keep",
                "`keep` has no effect on a `local` bulkhead: a local slot costs no round trip",
            );
        }
        if identity.local && args.has("lease") {
            args.conflict(
                "lease",
                "`lease` has no effect on a `local` bulkhead: a local holder cannot outlive its process",
            );
        }
        let lease = lease.unwrap_or(spec::LEASE.default.duration());
        if let Some(keep) = keep
            && args.all_valid()
            && keep > lease / 3
        {
            args.conflict(
                "keep",
                format!(
                    "`keep` ({}) is more than a third of the lease ({}): a kept lease is handed on \
                     only until its first renewal is due, a third of the lease after the server \
                     last confirmed it, so the rest of `keep` would hold a slot for nothing",
                    Human(keep),
                    Human(lease)
                ),
            );
        }
        args.finish(|| {
            Some(Bulkhead {
                identity,
                limit: limit?,
                lease,
                max_wait,
                keep,
                shadow,
                thresholds,
                priority,
            })
        })
    }
}

impl Layer for Bulkhead {
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
        let (limit, adaptive) = match &self.limit {
            Limit::Fixed(limit) => (limit.tokens(), quote!(::core::option::Option::None)),
            Limit::Adaptive(bounds) => {
                let [min, initial, max] = bounds.each_ref().map(Value::tokens);
                (
                    initial.clone(),
                    quote!(::core::option::Option::Some(
                        ::caracal::__private::AdaptiveLimit::new(#min, #initial, #max)
                    )),
                )
            }
        };
        let lease = durations::tokens(self.lease);
        let max_wait = durations::optional_tokens(self.max_wait);
        let keep = durations::optional_tokens(self.keep);
        let shadow = self.shadow;
        let thresholds = self.thresholds.tokens();
        (
            quote!(::caracal::__private::BulkheadSite),
            quote!(::caracal::__private::BulkheadSite::new(::caracal::__private::BulkheadConfig {
                #identity
                limit: #limit,
                adaptive: #adaptive,
                lease: #lease,
                max_wait: #max_wait,
                keep: #keep,
                shadow: #shadow,
                thresholds: #thresholds,
            })),
        )
    }

    fn per_call(&self, place: &Place) -> TokenStream {
        self.priority.per_call(place)
    }

    /// A local bulkhead without a priority of its own decides at once, in the function's
    /// future, and awaits the body there; a caller that waits in line (rare) waits in a boxed
    /// future of its own.
    fn inline(&self, place: &Place, inner: &syn::Ident) -> Option<TokenStream> {
        if !self.identity.local || self.priority.is_given() {
            return None;
        }
        let Place {
            site, scope, ctx, ..
        } = place;
        let [slot, line, fenced, body, error] = [
            "__caracal_slot",
            "__caracal_line",
            "__caracal_fenced",
            "__caracal_body",
            "__caracal_error",
        ]
        .map(hygienic);
        let decided = syn::Lifetime::new("'__caracal_decided", Span::mixed_site());
        // The decision is taken apart in a statement of its own, so that it is gone before the
        // body is awaited: matched around the await, it (and the error it may hold) would be kept
        // in the function's future and written and read there on every call.
        Some(quote!(#decided: {
            let mut #slot = ::caracal::__private::LocalSlot::new();
            match ::caracal::__private::local_bulkhead(&#site, #ctx, #scope, &mut #slot) {
                ::caracal::__private::AtOnce::Admitted => {}
                ::caracal::__private::AtOnce::Wait(#line) => {
                    break #decided ::caracal::__private::wait_in_line(#line, #ctx, &mut #slot, #inner).await
                }
                ::caracal::__private::AtOnce::Refused(#error) => {
                    break #decided ::core::result::Result::Err(#error)
                }
            }
            match ::caracal::__private::fenced_off(#inner) {
                ::core::result::Result::Ok(#fenced) => #fenced.await,
                ::core::result::Result::Err(#body) => #body.await,
            }
        }))
    }

    fn wrap(&self, place: &Place, _: &Frame<'_>, inner: TokenStream) -> TokenStream {
        let Place {
            site, scope, ctx, ..
        } = place;
        let inner = pinned(inner);
        let admission = quote!(::caracal::__private::bulkhead(&#site, #ctx, #scope, #inner));
        self.priority.wrap(place, admission)
    }
}
