//! `#[fallback(handler)]`: one positional path, like `#[timeout]`'s one duration, and the
//! handler it answers the rejections of the layers inside it with.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, Path, Token};

use crate::layer::{Frame, Kind, Layer, Place, Written};
use crate::names::{hygienic, witness_name};

/// The attribute.
pub(crate) const KIND: Kind = Kind {
    name: "fallback",
    parse,
};

fn parse(written: Written, _: &str) -> syn::Result<Box<dyn Layer>> {
    Ok(Box::new(Fallback::parse(
        written.anchor,
        written.args,
        written.span,
    )?))
}

struct Fallback {
    handler: Path,
    /// The attribute's name.
    span: Span,
}

impl Fallback {
    /// Parses the attribute's arguments; `anchor` is the attribute, for a missing handler,
    /// and `span` its name.
    fn parse(anchor: TokenStream, tokens: TokenStream, span: Span) -> syn::Result<Self> {
        let usage = "`#[fallback]` takes the path of an `async fn` that answers a rejection, \
                     like `#[fallback(cached_order)]` or `#[fallback(Self::cached_order)]`";
        let args = Punctuated::<Expr, Token![,]>::parse_terminated.parse2(tokens)?;
        let mut args = args.iter();
        let handler = match args.next() {
            Some(Expr::Path(path)) if path.qself.is_none() && path.attrs.is_empty() => &path.path,
            Some(other) => return Err(syn::Error::new_spanned(other, usage)),
            None => return Err(syn::Error::new_spanned(anchor, usage)),
        };
        if let Some(extra) = args.next() {
            return Err(syn::Error::new_spanned(extra, usage));
        }
        Ok(Fallback {
            handler: handler.clone(),
            span,
        })
    }
}

impl Layer for Fallback {
    fn site(&self, frame: &Frame<'_>) -> (TokenStream, TokenStream) {
        let identity = &frame.identity;
        (
            quote!(::caracal::__private::FallbackConfig),
            quote!(::caracal::__private::FallbackConfig {
                identity: #identity,
            }),
        )
    }

    fn wrap(&self, place: &Place, frame: &Frame<'_>, inner: TokenStream) -> TokenStream {
        let Place { site, ctx, .. } = place;
        let call_scope = &frame.scope;
        let result = hygienic("__caracal_result");
        let rejection = hygienic("__caracal_rejection");
        let witness = witness_name();
        let handler = &self.handler;
        let arguments = frame.arguments;
        // Spanned on the handler's path, `.await` included: a handler of the wrong shape
        // (arguments, result, not `async`) is reported there, once.
        let call = quote_spanned! {handler.span()=>
            ::caracal::__private::enter(&#witness, #handler(#(#arguments,)* #rejection)).await
        };
        // The handler takes the arguments after the layers inside have finished with them; the
        // block is spanned on the attribute, where a move "in a previous iteration of loop" (a
        // fallback inside a retry) is then reported.
        quote_spanned! {self.span=> async {
            let #result = #inner.await;
            match ::caracal::__private::fallback(&#site, #ctx, #call_scope, #result) {
                ::caracal::__private::ControlFlow::Break(#result) => #result,
                ::caracal::__private::ControlFlow::Continue(#rejection) => #call,
            }
        }}
    }

    /// Where errors about the handler's shape point: its path.
    fn fallback_span(&self) -> Option<Span> {
        Some(self.handler.span())
    }
}
