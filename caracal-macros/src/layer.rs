//! The six attributes as layers of one pipeline: recognising them, parsing their settings, and
//! the runtime call each one wraps around the layers inside it.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::{Path, Type};

use crate::args::Args;
use crate::breaker::{self, Breaker};
use crate::bulkhead::{self, Bulkhead};
use crate::fallback::Fallback;
use crate::identity::Identity;
use crate::rate_limit::{self, RateLimit};
use crate::retry::{self, Retry};
use crate::timeout::Timeout;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Bulkhead,
    CircuitBreaker,
    RateLimit,
    Retry,
    Timeout,
    Fallback,
}

impl Kind {
    const ALL: [Kind; 6] = [
        Kind::Bulkhead,
        Kind::CircuitBreaker,
        Kind::RateLimit,
        Kind::Retry,
        Kind::Timeout,
        Kind::Fallback,
    ];

    /// The attribute's name, as the user writes it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Bulkhead => "bulkhead",
            Kind::CircuitBreaker => "circuit_breaker",
            Kind::RateLimit => "rate_limit",
            Kind::Retry => "retry",
            Kind::Timeout => "timeout",
            Kind::Fallback => "fallback",
        }
    }

    /// The attribute `path` names, if it is one of ours: `retry`, `caracal::retry` or
    /// `::caracal::retry`.
    pub(crate) fn of(path: &Path) -> Option<Kind> {
        let segments: Vec<_> = path.segments.iter().collect();
        let last = match segments.as_slice() {
            [last] if path.leading_colon.is_none() => last,
            [krate, last] if krate.ident == "caracal" && krate.arguments.is_none() => last,
            _ => return None,
        };
        if !last.arguments.is_none() {
            return None;
        }
        Kind::ALL.into_iter().find(|kind| last.ident == kind.name())
    }
}

/// One caracal attribute as written on the function.
pub(crate) struct Written {
    pub(crate) kind: Kind,
    /// The whole attribute, for errors about something missing from it. Empty for the
    /// attribute being expanded, whose own tokens a macro does not see: such an error then
    /// lands on the macro's call site, which is that attribute.
    pub(crate) anchor: TokenStream,
    /// Where diagnostics about the attribute's run-time shape point: its name.
    pub(crate) span: Span,
    /// What is inside its parentheses.
    pub(crate) args: TokenStream,
}

/// One attribute's validated settings.
pub(crate) enum Layer {
    Bulkhead(Bulkhead),
    // Boxed: the breaker's settings are several times any other's.
    Breaker(Box<Breaker>),
    RateLimit(RateLimit),
    Retry(Retry, Span),
    Timeout(Timeout),
    Fallback(Fallback, Span),
}

/// What every layer's code may refer to besides its own settings.
pub(crate) struct Frame<'a> {
    /// The function's return type.
    pub(crate) output: &'a Type,
    /// The function's arguments as a fallback handler receives them, if there is a fallback.
    pub(crate) arguments: &'a [TokenStream],
    /// The function's identity as the layers that guard the whole call report it (a
    /// `FunctionIdentity` expression).
    pub(crate) identity: TokenStream,
    /// The variable holding the scope of that identity, evaluated once per call.
    pub(crate) scope: syn::Ident,
}

impl Layer {
    /// Parses one attribute's settings; `function` is the annotated function's name.
    pub(crate) fn parse(written: Written, function: &str) -> syn::Result<Self> {
        let Written {
            kind,
            anchor,
            span,
            args,
        } = written;
        let name = kind.name();
        Ok(match kind {
            Kind::Bulkhead => Layer::Bulkhead(Bulkhead::parse(
                Args::parse(name, bulkhead::ARGS, anchor, args)?,
                function,
            )?),
            Kind::CircuitBreaker => Layer::Breaker(Box::new(Breaker::parse(
                Args::parse(name, breaker::ARGS, anchor, args)?,
                function,
            )?)),
            Kind::RateLimit => Layer::RateLimit(RateLimit::parse(
                Args::parse(name, rate_limit::ARGS, anchor, args)?,
                function,
            )?),
            Kind::Retry => Layer::Retry(
                Retry::parse(Args::parse(name, retry::ARGS, anchor, args)?)?,
                span,
            ),
            Kind::Timeout => Layer::Timeout(Timeout::parse(anchor, args)?),
            Kind::Fallback => Layer::Fallback(Fallback::parse(anchor, args)?, span),
        })
    }

    /// Whether the layer guards each attempt (innermost, wherever it is written) rather than
    /// the part of the pipeline its position gives it.
    pub(crate) fn per_attempt(&self) -> bool {
        matches!(self, Layer::Bulkhead(_) | Layer::RateLimit(_))
    }

    /// The identity of a coordinated policy.
    pub(crate) fn identity(&self) -> Option<&Identity> {
        match self {
            Layer::Bulkhead(settings) => Some(&settings.identity),
            Layer::Breaker(settings) => Some(&settings.identity),
            Layer::RateLimit(settings) => Some(&settings.identity),
            Layer::Retry(..) | Layer::Timeout(_) | Layer::Fallback(..) => None,
        }
    }

    /// The call site's `static` holding the layer's settings.
    pub(crate) fn site(&self, index: usize, frame: &Frame<'_>) -> TokenStream {
        let (ty, init) = match self {
            Layer::Bulkhead(settings) => settings.site(),
            Layer::Breaker(settings) => settings.site(),
            Layer::RateLimit(settings) => settings.site(),
            Layer::Retry(settings, _) => settings.site(&frame.identity),
            Layer::Timeout(settings) => settings.site(&frame.identity),
            Layer::Fallback(settings, _) => settings.site(&frame.identity),
        };
        let name = site_name(index);
        quote!(static #name: #ty = #init;)
    }

    /// The future that runs `inner` (a future) under this layer; `index` is the layer's
    /// position in the pipeline.
    pub(crate) fn wrap(&self, index: usize, frame: &Frame<'_>, inner: TokenStream) -> TokenStream {
        let output = frame.output;
        let site = site_name(index);
        let scope = scope_name(index);
        let call_scope = &frame.scope;
        let ctx = ctx_name();
        // The runtime gets the inner future pinned where it is created, as a temporary of the
        // statement that awaits the pipeline. Passed by value, each layer's future would hold
        // it twice (its argument, and the future it awaits): the size doubles per layer.
        let pinned = quote!(::core::pin::pin!(#inner));
        match self {
            Layer::Bulkhead(_) => {
                quote!(::caracal::__private::bulkhead(&#site, &#ctx, &#scope, #pinned))
            }
            Layer::RateLimit(_) => {
                quote!(::caracal::__private::rate_limit(&#site, &#ctx, &#scope, #pinned))
            }
            Layer::Breaker(settings) => {
                let classify = match settings.classify() {
                    Some(path) => typed_fn(
                        path,
                        output,
                        quote!(::core::result::Result<T, E>),
                        quote!(::caracal::Outcome),
                    ),
                    None => quote!(::caracal::__private::ClassifyByResult),
                };
                quote!(::caracal::__private::circuit_breaker(&#site, &#ctx, &#scope, #classify, #pinned))
            }
            Layer::Timeout(_) => {
                quote!(::caracal::__private::timeout(&#site, &#ctx, &#call_scope, #pinned))
            }
            Layer::Retry(settings, _) => {
                let when = match settings.when() {
                    Some(path) => typed_fn(path, output, quote!(E), quote!(bool)),
                    None => quote!(::caracal::__private::RetryBodyErrors),
                };
                let state = hygienic("__caracal_retry");
                let outcome = hygienic("__caracal_outcome");
                let result = hygienic("__caracal_result");
                // A loop, not a closure, so a body borrowing `&mut self` can run once per attempt.
                quote!(async {
                    let mut #state =
                        ::caracal::__private::Retry::new(&#site, &#ctx, &#call_scope, #when);
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
            Layer::Fallback(settings, span) => {
                let result = hygienic("__caracal_result");
                let rejection = hygienic("__caracal_rejection");
                let witness = witness_name();
                let handler = settings.handler();
                let arguments = frame.arguments;
                // Spanned on the handler's path, `.await` included: a handler of the wrong
                // shape (arguments, result, not `async`) is reported there, once.
                let call = quote_spanned! {settings.span()=>
                    ::caracal::__private::enter(&#witness, #handler(#(#arguments,)* #rejection)).await
                };
                // The handler takes the arguments after the layers inside have finished with
                // them; the block is spanned on the attribute, where a move "in a previous
                // iteration of loop" (a fallback inside a retry) is then reported.
                quote_spanned! {*span=> async {
                    let #result = #inner.await;
                    match ::caracal::__private::fallback(&#site, &#ctx, &#call_scope, #result) {
                        ::caracal::__private::ControlFlow::Break(#result) => #result,
                        ::caracal::__private::ControlFlow::Continue(#rejection) => #call,
                    }
                }}
            }
        }
    }

    /// Where errors about a fallback handler's shape point, if this is a fallback.
    pub(crate) fn fallback_span(&self) -> Option<Span> {
        match self {
            Layer::Fallback(settings, _) => Some(settings.span()),
            _ => None,
        }
    }

    /// Where a retry re-runs the body from: the attribute of the innermost `#[retry]`.
    pub(crate) fn retry_span(&self) -> Option<Span> {
        match self {
            Layer::Retry(_, span) => Some(*span),
            _ => None,
        }
    }
}

/// The user's function `path` as a `fn(&param) -> ret` pointer, where `param` may name the
/// `T` and `E` of the function's return type `output`.
///
/// Fixing `T` and `E` from the return type before `path` is used means a function of the wrong
/// type is one "expected fn pointer" error on the path, instead of a cascade of inference
/// errors from the runtime call that first meets it.
fn typed_fn(path: &Path, output: &Type, param: TokenStream, ret: TokenStream) -> TokenStream {
    let check = hygienic("__caracal_typed");
    quote!({
        fn #check<T, E>(
            _: ::core::marker::PhantomData<::core::result::Result<T, E>>,
            function: fn(&#param) -> #ret,
        ) -> fn(&#param) -> #ret {
            function
        }
        #check(::core::marker::PhantomData::<#output>, #path)
    })
}

/// A name of the expansion's own, invisible to the user's code (mixed-site hygiene), so it can
/// neither shadow nor be shadowed by an argument or a local of the same name.
pub(crate) fn hygienic(name: &str) -> syn::Ident {
    syn::Ident::new(name, Span::mixed_site())
}

fn site_name(index: usize) -> syn::Ident {
    format_ident!("__CARACAL_{}", index, span = Span::mixed_site())
}

/// The variable holding the scope of the coordinated layer at `index`, evaluated up front.
pub(crate) fn scope_name(index: usize) -> syn::Ident {
    format_ident!("__caracal_scope_{}", index, span = Span::mixed_site())
}

/// The variable holding the scope of the function's identity when none of its layers has an
/// identity of its own (else that layer's [`scope_name`] holds it).
pub(crate) fn function_scope_name() -> syn::Ident {
    hygienic("__caracal_function_scope")
}

/// The variable holding the call's `CallCtx`.
pub(crate) fn ctx_name() -> syn::Ident {
    hygienic("__caracal_ctx")
}

/// The variable holding the witness that the function's error type takes rejections (see
/// `caracal::__private::Probe`).
pub(crate) fn witness_name() -> syn::Ident {
    hygienic("__caracal_witness")
}
