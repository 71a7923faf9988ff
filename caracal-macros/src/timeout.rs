//! `#[timeout("2s")]` settings: one positional duration, unlike the other attributes.

use std::time::Duration;

use proc_macro2::TokenStream;
use quote::quote;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, Lit, Token};

use crate::durations::{self, DAY};

pub(crate) struct Timeout {
    after: Duration,
}

impl Timeout {
    /// Parses the attribute's arguments; `anchor` is the attribute, for a missing duration.
    pub(crate) fn parse(anchor: TokenStream, tokens: TokenStream) -> syn::Result<Self> {
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
        let after = durations::parse(literal, "the timeout", Duration::from_nanos(1), DAY)?;
        Ok(Timeout { after })
    }

    /// The call site's `static`: its type and initializer; `identity` is what its events
    /// report.
    pub(crate) fn site(&self, identity: &TokenStream) -> (TokenStream, TokenStream) {
        let after = durations::tokens(self.after);
        (
            quote!(::caracal::__private::TimeoutConfig),
            quote!(::caracal::__private::TimeoutConfig {
                identity: #identity,
                after: #after,
            }),
        )
    }
}
