//! `#[fallback(handler)]` settings: one positional path, like `#[timeout]`'s one duration.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, Path, Token};

pub(crate) struct Fallback {
    handler: Path,
}

impl Fallback {
    /// Parses the attribute's arguments; `anchor` is the attribute, for a missing handler.
    pub(crate) fn parse(anchor: TokenStream, tokens: TokenStream) -> syn::Result<Self> {
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
        })
    }

    /// The call site's `static`: its type and initializer; `identity` is what its events
    /// report.
    pub(crate) fn site(&self, identity: &TokenStream) -> (TokenStream, TokenStream) {
        (
            quote!(::caracal::__private::FallbackConfig),
            quote!(::caracal::__private::FallbackConfig {
                identity: #identity,
            }),
        )
    }

    pub(crate) fn handler(&self) -> &Path {
        &self.handler
    }

    /// Where errors about the handler's shape point: its path.
    pub(crate) fn span(&self) -> Span {
        self.handler.span()
    }
}
