//! `#[timeout("2s")]`: one positional duration, unlike the other attributes, and the deadline
//! it puts on the layers inside it.

use std::time::Duration;

use caracal_spec::timeout as spec;
use proc_macro2::TokenStream;
use quote::quote;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, Lit, Token};

use crate::durations;
use crate::layer::{Frame, Kind, Layer, Place, Written, pinned};

/// The attribute.
pub(crate) const KIND: Kind = Kind {
    name: spec::KIND.name,
    parse,
};

fn parse(written: Written, _: &str) -> syn::Result<Box<dyn Layer>> {
    Ok(Box::new(Timeout::parse(written.anchor, written.args)?))
}

struct Timeout {
    after: Duration,
}

impl Timeout {
    /// Parses the attribute's arguments; `anchor` is the attribute, for a missing duration.
    fn parse(anchor: TokenStream, tokens: TokenStream) -> syn::Result<Self> {
        let usage =
            r#"`#[timeout]` takes one duration string with a unit, like `#[timeout("2s")]`"#;
        let args = Punctuated::<Expr, Token![,]>::parse_terminated.parse2(tokens)?;
        let mut args = args.iter();
        let literal = match args.next() {
            Some(Expr::Lit(ExprLit {
                lit: Lit::Str(literal),
                ..
            })) => literal,
            Some(other) => return Err(syn::Error::new_spanned(other, usage)),
            None => return Err(syn::Error::new_spanned(anchor, usage)),
        };
        if let Some(extra) = args.next() {
            return Err(syn::Error::new_spanned(extra, usage));
        }
        let (min, max) = durations::bounds(&spec::AFTER);
        let after = durations::parse(literal, "the timeout", min, max)?;
        Ok(Timeout { after })
    }
}

impl Layer for Timeout {
    fn reads_ctx_alone(&self) -> bool {
        false
    }

    fn site(&self, frame: &Frame<'_>) -> (TokenStream, TokenStream) {
        let identity = &frame.identity;
        let after = durations::tokens(self.after);
        (
            quote!(::caracal::__private::TimeoutConfig),
            quote!(::caracal::__private::TimeoutConfig {
                identity: #identity,
                after: #after,
            }),
        )
    }

    fn wrap(&self, place: &Place, frame: &Frame<'_>, inner: TokenStream) -> TokenStream {
        let Place { site, ctx, .. } = place;
        let call_scope = &frame.scope;
        let inner = pinned(inner);
        quote!(::caracal::__private::timeout(&#site, #ctx, #call_scope, #inner))
    }
}
